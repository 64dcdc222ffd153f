"""What every benchmark in bench/ shares: its Spark session, the timing protocol (wall clock
on the driver around the whole call, one untimed warm-up, median of N, two sides
alternating), the one JSON line it prints, and where and when it ran: every result carries a
``provenance`` (commit, uncommitted files, date, the 1-minute load average sampled during the
run and the busiest other process's share of a core), which bench/report.py reads to mark a
figure STALE or NOISY.

Scripts run as ``python bench/<name>.py``, so bench/ is on ``sys.path`` and they import this
as ``from _common import ...``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parents[1]


def start_spark(app_name: str = "sparkdist-bench", conf: Mapping[str, str] | None = None,
                master: str | None = None) -> Any:
    """The benchmark's SparkSession: ``master`` or ``$SPARKDIST_MASTER`` or local[2], UI and
    console progress off, bound to loopback (set before Spark or gloo start)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    monitor()
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
    """Print ``{"benchmark": name, **figures, "provenance": ...}`` as one JSON line (what
    bench/report.py reads); with ``save``, also write it to bench/results/<name>.json.
    Returns the line."""
    line = json.dumps({"benchmark": name, **figures, "provenance": provenance()})
    if save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{name}.json").write_text(line + "\n")
    print(line, flush=True)
    return line


class LoadMonitor:
    """Samples, every ``every`` seconds in a daemon thread, the 1-minute load average and the
    CPU time of every process outside this one's tree (Spark's JVM and Python workers are
    its descendants), so a result says whether the machine was quiet while it ran."""

    def __init__(self, every: float = 2.0) -> None:
        self.every, self.root = every, os.getpid()
        self.started = time.monotonic()
        self.loads = [os.getloadavg()[0]]
        self._ticks = _cpu_ticks()
        self._others: dict[tuple[int, str], float] = {}  # (pid, name) -> seconds of CPU
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="load-monitor")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def sample(self) -> None:
        """One sample: the load, and the CPU each other process used since the last one."""
        self.loads.append(os.getloadavg()[0])
        ticks = _cpu_ticks()
        mine, hertz = _tree(self.root, ticks), os.sysconf("SC_CLK_TCK")
        for key, (_, used) in ticks.items():
            if key[0] not in mine and key in self._ticks:
                spent = (used - self._ticks[key][1]) / hertz
                self._others[key] = self._others.get(key, 0.0) + spent
        self._ticks = ticks

    def result(self) -> dict[str, Any]:
        """The figures so far: load at the start, highest and last; the busiest other
        process and its share of one core over the run."""
        self.sample()
        elapsed = max(time.monotonic() - self.started, 1e-9)
        busiest = max(self._others.items(), key=lambda item: item[1], default=None)
        return {"load_1min": {"start": round(self.loads[0], 2), "max": round(max(self.loads), 2),
                              "end": round(self.loads[-1], 2), "samples": len(self.loads)},
                "others_cpu": {"seconds": round(elapsed, 1),
                               "busiest": f"{busiest[0][1]} (pid {busiest[0][0]})" if busiest
                               else None,
                               "share_of_a_core": round(busiest[1] / elapsed, 3) if busiest
                               else 0.0}}


def _cpu_ticks() -> dict[tuple[int, str], tuple[int, int]]:
    """(pid, name) -> (parent pid, user + system ticks) of every process /proc shows."""
    found: dict[tuple[int, str], tuple[int, int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else ():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        found[(int(entry.name), name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return found


def _tree(root: int, ticks: dict[tuple[int, str], tuple[int, int]]) -> set[int]:
    """``root`` and its descendants among ``ticks``' processes."""
    children: dict[int, list[int]] = {}
    for (pid, _), (ppid, _) in ticks.items():
        children.setdefault(ppid, []).append(pid)
    mine, todo = set(), [root]
    while todo:
        pid = todo.pop()
        mine.add(pid)
        todo.extend(children.get(pid, []))
    return mine


_MONITOR: LoadMonitor | None = None


def monitor() -> LoadMonitor:
    """This process's load monitor, started on first use (start_spark starts it)."""
    global _MONITOR
    if _MONITOR is None:
        _MONITOR = LoadMonitor()
    return _MONITOR


def git(*args: str) -> str:
    """``git args`` in this repository; "" where git or the history is missing."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def provenance() -> dict[str, Any]:
    """Where and when a result was measured: the commit, the tracked files that differed
    from it, the UTC date, and what the load monitor saw."""
    return {"commit": git("rev-parse", "HEAD") or None,
            "dirty": git("diff", "--name-only", "HEAD").splitlines(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "host": f"{os.cpu_count()} cores, Python {platform.python_version()}, "
                    f"{platform.system()} {platform.machine()}",
            **monitor().result()}


def cold_and_warm(sides: dict[str, Any], repeats: int
                  ) -> tuple[dict[str, float], dict[str, list], dict[str, Any]]:
    """Each side's cold seconds (its first call), warm runs (``repeats`` more, the sides
    alternating) and last result."""
    cold: dict[str, float] = {}
    warm: dict[str, list[float]] = {name: [] for name in sides}
    last: dict[str, Any] = {}
    for round_ in range(repeats + 1):
        for name, call in sides.items():
            started = time.perf_counter()
            last[name] = call()
            seconds = time.perf_counter() - started
            if round_:
                warm[name].append(seconds)
            else:
                cold[name] = seconds
    return cold, warm, last
