"""bench/report.py turns the benchmarks' JSON lines into the table, markdown and chart."""

from __future__ import annotations

import importlib.util
import json
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
