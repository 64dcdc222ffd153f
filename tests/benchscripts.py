"""The scripts of bench/ as modules, for the unit tests of their pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(name: str) -> ModuleType:
    """bench/<name>.py, loaded once per process (registered in ``sys.modules``, where
    dataclasses look their module up); bench/ on the path for its ``_common``."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    key = f"sparkdist_bench_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module
