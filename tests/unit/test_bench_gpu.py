"""bench/gpu.py without a GPU and without Spark: the skip line, and the plain-loop timer on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchscripts import load

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"


def load_bench() -> ModuleType:
    return load("gpu")


def test_without_cuda_it_prints_the_skip_line_and_exits_0():
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # no GPU, even here
    assert done.returncode == 0, done.stderr[-2000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["benchmark"] == "gpu"
    assert line["skipped"].startswith("no CUDA device")


@pytest.mark.parametrize("bf16", [False, True])
def test_plain_loop_runs_on_cpu_and_reports_a_positive_rate(bf16: bool):
    result = load_bench().plain_loop("cpu", rows=300, dim=8, hidden=[16], batch=64, epochs=3,
                                     bf16=bf16)
    assert len(result["epoch_s"]) == 3
    assert result["samples_per_s"] > 0 and result["wall_samples_per_s"] > 0
    assert result["wall_s"] >= sum(result["epoch_s"])
