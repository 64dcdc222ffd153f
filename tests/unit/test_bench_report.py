"""bench/report.py turns the benchmarks' JSON lines into the table, markdown and chart."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
_spec = importlib.util.spec_from_file_location("sparkdist_bench_report", BENCH / "report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def _committed(name: str) -> dict:
    return json.loads((BENCH / "results" / f"{name}.json").read_text())


def test_table_markdown_and_chart_from_measured_figures(tmp_path):
    figures = {"deep": _committed("deep")}
    rows = report.table(figures)
    assert [row["target"] for row in rows] == [">= 0.8", "<= 1.2", ">= 1.5", "-", "<= 0.65",
                                               "<= 0.35", "<= 0.15", "<= 2", "<= 1.0"]
    assert rows[0]["ratio"] == figures["deep"]["feed"]["ratio"]
    assert rows[-1]["reference"] == figures["deep"]["recovery"]["budget_s"]
    text = report.markdown(rows, "a test machine")
    assert text.count("\n| ") == len(rows) + 1 and "a test machine" in text
    report.chart(rows, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
    assert report.markdown(rows, "m").count("\n| ") == len(rows) + 1


def test_a_rerun_of_one_benchmark_keeps_the_others_figures(tmp_path, monkeypatch):
    latest = tmp_path / "latest.json"
    latest.write_text(json.dumps({"benchmarks": {"deep": {"old": 1}, "classical": {"old": 2}}}))
    monkeypatch.setattr(report, "LATEST", latest)
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "run", lambda name: {"new": name})
    monkeypatch.setattr(report, "table", lambda figures: [])
    monkeypatch.setattr(report, "chart", lambda rows, path: None)
    monkeypatch.setattr(sys, "argv", ["report.py", "--only", "classical"])
    report.main()
    written = json.loads(latest.read_text())
    assert written["benchmarks"] == {"classical": {"new": "classical"}, "deep": {"old": 1}}
    assert written["rerun"] == ["classical"]
    assert "--only classical" in (tmp_path / "latest.md").read_text()
