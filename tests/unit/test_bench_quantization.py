"""bench/quantization.py: its figures from known inputs, and its --quick mode end to end (a
real local[2] session, fit, warm and cold calls: each part runs and the JSON line holds every
figure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchscripts import load

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "quantization.py"


def load_bench() -> ModuleType:
    return load("quantization")


def test_quick_sizes_are_tiny_and_the_defaults_are_the_large_mlp():
    bench = load_bench()
    _, quick = bench.arguments(["--quick"])
    assert quick.score_rows <= 5_000 and quick.repeats == quick.cold_rounds == 1
    _, full = bench.arguments([])
    assert full.hidden == [1024, 1024] and 64 <= full.features <= 256 and full.repeats == 3


def test_rows_per_second_and_speedup_come_from_the_same_seconds():
    figures = load_bench().side_figures({"fp32": 4.0, "int8": 1.6}, 8_000, "how")
    assert figures["fp32_rows_per_s"] == 2_000 and figures["int8_rows_per_s"] == 5_000
    assert figures["int8_speedup"] == 2.5 and figures["definition"] == "how"


def test_accuracy_difference_is_in_percentage_points_against_the_target():
    bench = load_bench()
    label = [1.0] * 500 + [0.0] * 500
    fp32 = list(label)
    int8 = list(label)
    int8[0] = 0.0  # one row of 1000 wrong: 0.1 points
    figures = bench.accuracy_figures(label, fp32, int8)
    assert figures["difference_pp"] == 0.1 and figures["meets_target"]
    assert figures["agreement"] == 0.999
    int8[1:7] = [0.0] * 6  # seven wrong: 0.7 points, over the 0.5 target
    assert not bench.accuracy_figures(label, fp32, int8)["meets_target"]


def test_size_ratio():
    assert load_bench().size_figures(4_000, 1_000)["int8_to_fp32"] == 0.25


@pytest.mark.slow
def test_quick_mode_runs_every_part(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True,
                          text=True, timeout=1200, cwd=tmp_path,
                          env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
                               "GLOO_SOCKET_IFNAME": "lo"})
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["benchmark"] == "quantization" and line["quick"] is True
    for part in ("warm", "cold"):
        assert line[part]["fp32_rows_per_s"] > 0 and line[part]["int8_rows_per_s"] > 0
    assert len(line["cold"]["int8_runs_s"]) == 1
    assert line["size"]["int8_bytes"] < line["size"]["fp32_bytes"]
    assert line["network"]["linear_share"] == 1.0
    assert line["kernel"]["int8_rows_per_s"] > 0 and line["kernel"]["fp32_rows_per_s"] > 0
    assert line["accuracy"]["rows"] == line["sizes"]["score_rows"]
    assert line["accuracy"]["agreement"] >= 0.95
