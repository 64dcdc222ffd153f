"""bench/report.py turns the benchmarks' JSON lines into the table, the chart and
docs/performance.md, marking a figure STALE (its measured code changed since its commit, read
from this repository's real git history) or NOISY (a busy machine). No Spark."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.benchscripts import BENCH, load

report = load("report")
import _common  # noqa: E402  (bench/ is on the path now)

#: A commit of this repository's history (the package skeleton) and one path that changed
#: after it.
OLD_COMMIT = "0d5cd13"
needs_git = pytest.mark.skipif(
    shutil.which("git") is None or report.git("cat-file", "-e", OLD_COMMIT)[0] != 0,
    reason="needs git and this repository's history (a full clone)")


def _committed(name: str) -> dict:
    return json.loads((BENCH / "results" / f"{name}.json").read_text())


def _judged(names: tuple[str, ...]) -> list[dict]:
    results = report.stored(names)
    return report.judged(report.table({n: f for n, (f, _) in results.items()}), results)


def test_table_markdown_and_chart_from_measured_figures(tmp_path):
    figures = {"deep": _committed("deep")}
    rows = report.table(figures)
    assert [row["target"] for row in rows] == [
        ">= 0.8", "<= 1.2", ">= 1.5", "-", "<= 0.65", "<= 0.65", "<= 0.35", "<= 0.15",
        "<= 0.35", "<= 0.35", "<= 2", "<= 1.0", ">= 0.9", ">= 0.9", "-", "-"]
    assert rows[0]["ratio"] == figures["deep"]["feed"]["ratio"]
    recovery = next(row for row in rows if row["comparison"].startswith("Recovery"))
    assert recovery["reference"] == figures["deep"]["recovery"]["budget_s"]
    assert {row["benchmark"] for row in rows} == {"deep"}
    judged = _judged(("deep",))
    text = report.markdown(judged)
    assert text.count("\n| ") == len(rows)  # the header, then one line a row
    report.chart(judged, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_figure_is_charted_as_times_better_than_the_reference():
    rows = report.table({name: _committed(name) for name in ("deep", "quantization")})
    by_what = {row["comparison"].split(",")[0]: row for row in rows}
    feed = by_what["TorchEstimator 1-epoch fit vs bare barrier mapInArrow (same vector_to_array"]
    assert feed["better"] == "higher" and report.better(feed, 0.5) == 0.5  # rows/s
    recovery = next(row for row in rows if row["comparison"].startswith("Recovery"))
    assert recovery["better"] == "lower" and report.better(recovery, 0.25) == 4.0  # seconds
    size = next(row for row in rows if "saved network size" in row["comparison"])
    assert size["better"] == "lower"  # bytes, no target: the unit says
    assert [report.met(r) for r in rows[:2]] == [False, True]  # feed 0.442 < 0.8; RSS 0.998


def test_rows_of_the_strategy_communication_and_int8_benchmarks():
    figures = {name: _committed(name) for name in ("parallel", "communication", "quantization")}
    rows = report.table(figures)
    strategies = figures["parallel"]["strategies"]
    state_rows = [row for row in rows if "Adam state on the busiest rank" in row["comparison"]]
    assert [row["ratio"] for row in state_rows] == [
        strategies[name]["state_ratio"] for name in ("fsdp", "pipeline", "tensor")]
    assert all(row["target"] == "<= 0.55" for row in state_rows)
    straggler = [row for row in rows if row["comparison"].startswith("One rank slowed 2x")]
    assert [row["ratio"] for row in straggler] == [
        figures["communication"][key]["best"]["ratio"]
        for key in ("straggler", "straggler_wide_model")]
    int8 = [row for row in rows if "int8 vs float32, test accuracy" in row["comparison"]]
    assert int8[0]["ratio"] == figures["quantization"]["accuracy"]["difference_pp"]


@needs_git
def test_a_figure_is_stale_when_its_measured_code_changed_after_its_commit():
    head = report.git("rev-parse", "HEAD")[1]
    assert report.stale({"commit": OLD_COMMIT}, ("sparkdist/features",)) == (
        f"measured code changed since {OLD_COMMIT}")
    # a path that exists in neither (nothing measured changed) is not stale
    assert report.stale({"commit": OLD_COMMIT}, ("no/such/path",)) is None
    assert report.stale({"commit": "f" * 40}, ("sparkdist",)).endswith("not in this history")
    assert report.stale({}, ("sparkdist",)) == "no commit recorded"
    uncommitted = {"commit": head, "dirty": ["no/such/path/x.py"]}
    assert report.stale(uncommitted, ("no/such/path",)) == (
        "measured with uncommitted changes to no/such/path/x.py")
    assert report.stale({**uncommitted, "dirty": ["README.md"]}, ("no/such/path",)) is None


@needs_git
def test_a_change_to_a_module_only_ps_imports_leaves_the_other_figures_current():
    head = report.git("rev-parse", "HEAD")[1]
    tables = "sparkdist/torchtrain/tables.py"
    assert f":(exclude){tables}" in report.measured_paths("deep")
    assert f":(exclude){tables}" not in report.measured_paths("ps")
    edited = {"commit": head, "dirty": [tables]}
    assert report.stale(edited, report.measured_paths("deep")) is None
    assert report.stale(edited, report.measured_paths("ps")) == (
        f"measured with uncommitted changes to {tables}")
    everything_but = ("sparkdist/features", ":(exclude)sparkdist/features")
    assert report.stale({"commit": OLD_COMMIT}, everything_but) is None


def test_nothing_else_imports_the_modules_only_ps_fits_import():
    """What makes ONLY_FOR true: strategies load by name, and no other module of the package
    imports ps's."""
    root = BENCH.parent
    only = {path: path.removesuffix(".py").replace("/", ".") for path in report.ONLY_FOR["ps"]}
    for source in (root / "sparkdist").rglob("*.py"):
        if str(source.relative_to(root)) in only:
            continue
        for node in ast.walk(ast.parse(source.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else [])
            assert not set(names) & set(only.values()), (source, names)


@needs_git
def test_older_results_get_their_commit_and_load_from_what_they_recorded():
    daemon = report.provenance("daemon_memory", {"commit": "f35ec65", "load_1min": [0.2, 0.8],
                                                 "date": "2026-12-04"}, BENCH / "x.json")
    assert daemon["commit"] == "f35ec65" and daemon["load_1min"]["max"] == 0.8
    legacy = {"machine": "2 cores, master local[2], load avg (1 min) 1.45/6.05"}
    found = report.provenance("deep", legacy, BENCH / "deep.py")
    assert found["load_1min"] == {"start": 1.45, "max": 6.05, "end": 6.05}
    assert found["committed_only"] and len(found["commit"]) == 40  # the file's last commit
    assert report.noisy(found) == "load up to 6.05 > 1.5"


def test_a_run_on_a_busy_machine_is_noisy_and_not_published():
    quiet = {"load_1min": {"start": 0.3, "max": 1.9, "end": 1.8},
             "others_cpu": {"busiest": "java (pid 1)", "share_of_a_core": 0.02}}
    assert report.noisy(quiet) is None  # the benchmark's own load is not noise
    assert report.noisy({**quiet, "load_1min": {"start": 1.6, "max": 1.9, "end": 1.8}}) == (
        "load 1.6 > 1.5 at the start")
    busy = {**quiet, "others_cpu": {"busiest": "java (pid 1)", "share_of_a_core": 0.2}}
    assert report.noisy(busy) == "java (pid 1) used 20% of a core (> 10%)"
    assert report.noisy({}) == "no load recorded"
    rows = [{"benchmark": "b", "comparison": what, "sparkdist": 1, "reference": 2, "unit": "s",
             "ratio": 0.5, "target": "<= 1", "better": "lower", "definition": None, "met": True,
             "commit": "abc", "date": "d", "load": "l", "stale": None, "noisy": why}
            for what, why in (("quiet figure", None), ("loud figure", "load 9 > 1.5"))]
    text = report.page(rows, {})
    results, rest = text.split("## Runs that are not results")
    assert "quiet figure" in results and "loud figure" not in results
    assert "loud figure" in rest and "NOISY" in rest


def test_the_load_monitor_counts_other_processes_and_not_its_own():
    busy = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass\n"
    monitor = _common.LoadMonitor(every=0.25)
    own = subprocess.Popen([sys.executable, "-c", busy])
    # a process outside this one's tree: started by a shell that exits at once
    pid_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"monitor-{os.getpid()}.pid"
    subprocess.run(["sh", "-c", f'{sys.executable} -c "{busy}" & echo $! > {pid_file}'],
                   check=True)
    own.wait()
    time.sleep(2.0)
    result = monitor.result()
    others = {pid: seconds for (pid, _), seconds in monitor._others.items()}
    assert own.pid not in others
    assert others.get(int(pid_file.read_text()), 0) > 0.05  # the machine may be busy
    assert result["load_1min"]["samples"] >= 4 and result["others_cpu"]["share_of_a_core"] > 0
    pid_file.unlink()


def test_every_benchmark_declares_code_that_exists():
    root = BENCH.parent
    for name in report.SCRIPTS:
        paths = [p.removeprefix(":(exclude)") for p in report.measured_paths(name)]
        assert all((root / path).exists() for path in paths), (name, paths)
        assert report.summary(name)


@needs_git
def test_the_performance_page_is_what_the_results_give():
    results = report.stored()
    rows = report.judged(report.table({n: f for n, (f, _) in results.items()}), results)
    assert report.PAGE.read_text() == report.page(rows, results), (
        "docs/performance.md is out of date: run `make docs`")


def test_a_rerun_of_one_benchmark_keeps_the_others_figures(tmp_path, monkeypatch):
    (tmp_path / "deep.json").write_text(json.dumps({"old": 1}) + "\n")
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "LATEST", tmp_path / "latest.json")
    monkeypatch.setattr(report, "run", lambda name: {"new": name})
    published = {}
    monkeypatch.setattr(report, "publish", lambda results: published.update(results) or "")
    monkeypatch.setattr(sys, "argv", ["report.py", "--only", "classical"])
    report.main()
    assert {name: figures for name, (figures, _) in published.items()} == {
        "classical": {"new": "classical"}, "deep": {"old": 1}}
