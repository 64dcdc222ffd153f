"""What the Python-daemon preload costs a worker (issue 25, N9): a worker forked by
sparkdist's daemon (torch imported once, then frozen out of the garbage collector) against
one forked by pyspark's own daemon (``SPARKDIST_PRELOAD=0``), both from ``get_spark()`` on
local[1].

For each side a fresh process starts its session and runs one task twice (the second task
reuses the worker); the figures are the second task's, read inside the worker:

- ``rss_mb``: VmRSS, what pyspark's spill threshold (``spark.python.worker.memory``) compares;
- ``private_mb``: Private_Clean + Private_Dirty of ``/proc/self/smaps_rollup`` (the pages the
  worker does not share with its daemon);
- ``gc_tracked``: objects the garbage collector tracks, and ``gc_s``: one full ``gc.collect()``.

Prints one JSON line (with the load average, commit and date beside the figures); with
``--save`` also bench/results/daemon_memory.json.

    python bench/daemon_memory.py [--save]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/launch/daemon.py", "sparkdist/session.py")
ROOT = Path(__file__).resolve().parents[1]


def worker_facts(_: Iterator[Any]) -> Iterator[str]:
    """Runs in the worker: its memory and garbage-collector figures, as one JSON string."""
    import gc
    import time

    def fields(path: str, names: tuple[str, ...]) -> dict[str, int]:
        with open(path) as f:
            pairs = (line.split(":", 1) for line in f if ":" in line)
            return {k: int(v.split()[0]) for k, v in pairs if k in names}

    status = fields("/proc/self/status", ("VmRSS",))
    rollup = fields("/proc/self/smaps_rollup", ("Private_Clean", "Private_Dirty"))
    start = time.perf_counter()
    gc.collect()
    yield json.dumps({"rss_mb": round(status["VmRSS"] / 1024, 1),
                      "private_mb": round(sum(rollup.values()) / 1024, 1),
                      "gc_s": round(time.perf_counter() - start, 4),
                      "gc_tracked": len(gc.get_objects()),
                      "torch_loaded": "torch" in sys.modules})


def one_side() -> dict[str, Any]:
    """In a fresh process: the figures of a worker of the daemon ``get_spark()`` picks."""
    sys.path.insert(0, str(ROOT / "bench"))
    from _common import start_spark

    spark = start_spark("sparkdist-bench-daemon", master="local[1]")
    daemon = spark.conf.get("spark.python.daemon.module", "pyspark.daemon")
    rdd = spark.sparkContext.parallelize([0], 1)
    rdd.mapPartitions(worker_facts).collect()  # the first task starts the worker
    figures = json.loads(rdd.mapPartitions(worker_facts).collect()[0])
    spark.stop()
    return {"daemon": daemon, **figures}


def measure(preload: bool) -> dict[str, Any]:
    env = {**os.environ, "SPARKDIST_PRELOAD": "1" if preload else "0"}
    out = subprocess.run([sys.executable, __file__, "--side"], env=env, check=True,
                         capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(one_side()), flush=True)
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    from _common import monitor, write_result

    monitor()  # the load during both sides, for the result's provenance
    load = os.getloadavg()[0]
    sides = {"preload": measure(True), "pyspark": measure(False)}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    write_result("daemon_memory", {
        **sides, "rss_ratio": round(sides["preload"]["rss_mb"] / sides["pyspark"]["rss_mb"], 2),
        "load_1min": [round(load, 2), round(os.getloadavg()[0], 2)], "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, save=args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
