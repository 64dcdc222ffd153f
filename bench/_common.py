"""What every benchmark in bench/ shares: its Spark session, the timing protocol (wall clock
on the driver around the whole call, one untimed warm-up, median of N, two sides
alternating) and the one JSON line it prints.

Scripts run as ``python bench/<name>.py``, so bench/ is on ``sys.path`` and they import this
as ``from _common import ...``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def start_spark(app_name: str = "sparkdist-bench", conf: Mapping[str, str] | None = None,
                master: str | None = None) -> Any:
    """The benchmark's SparkSession: ``master`` or ``$SPARKDIST_MASTER`` or local[2], UI and
    console progress off, bound to loopback (set before Spark or gloo start)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    from sparkdist.session import get_spark

    return get_spark(master=master or os.environ.get("SPARKDIST_MASTER", "local[2]"),
                     app_name=app_name,
                     conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                           **(conf or {})})


def timed(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    return statistics.median(timed(fn) for _ in range(repeats))


def alternating(sides: Mapping[str, Callable[[], object]], repeats: int,
                warmup: int = 1) -> dict[str, float]:
    """Median seconds per side, the sides called in turn (so drift in the machine's speed
    hits them alike), after ``warmup`` untimed rounds."""
    for _ in range(warmup):
        for fn in sides.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, fn in sides.items():
            times[name].append(timed(fn))
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def machine(spark: Any) -> str:
    """Cores, Python, Spark version and master, for the result line."""
    return (f"{os.cpu_count()} cores, Python {platform.python_version()}, "
            f"Spark {spark.version}, master {spark.conf.get('spark.master', 'unknown')}")


def write_result(name: str, figures: Mapping[str, Any], save: bool = False) -> str:
    """Print ``{"benchmark": name, **figures}`` as one JSON line (what bench/report.py
    reads); with ``save``, also write it to bench/results/<name>.json. Returns the line."""
    line = json.dumps({"benchmark": name, **figures})
    if save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{name}.json").write_text(line + "\n")
    print(line, flush=True)
    return line
