"""Launching distributed work: the driver-side checks that run before a barrier stage.

The names below are resolved on first use: importing a module of this package (e.g.
``sparkdist.launch.daemon``, which :mod:`sparkdist.session` names) runs no other.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["check_num_workers", "configured_slots", "task_slots"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'sparkdist.launch' has no attribute {name!r}")
    return getattr(importlib.import_module("sparkdist.launch.preflight"), name)
