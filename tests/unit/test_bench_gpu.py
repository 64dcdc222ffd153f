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


def test_plain_scoring_scores_every_row_of_the_arrow_batches_on_cpu():
    import numpy as np
    import pyarrow as pa
    import torch

    from sparkdist.torchtrain.nets import MLP

    x = np.random.default_rng(0).standard_normal((70, 8), dtype=np.float32)
    features = pa.ListArray.from_arrays(np.arange(0, x.size + 1, 8, dtype=np.int32), x.ravel())
    batches = [pa.RecordBatch.from_arrays([features.slice(start, 30)], ["features"])
               for start in (0, 30, 60, 70)]  # the last one empty
    module = MLP(8, 1, [16]).eval()
    calls = []
    module.register_forward_hook(lambda _, args, __: calls.append(len(args[0])))
    assert load_bench().plain_scoring(module, batches, 8, 16, "cpu") == 70
    assert calls == [16, 14, 16, 14, 10]  # batch_size rows at a call, per Arrow batch
    assert torch.is_grad_enabled()


def test_gpu_utilisation_summary_and_no_samples_without_nvidia_smi(monkeypatch):
    bench = load_bench()
    assert bench.utilisation_summary([]) is None
    assert bench.utilisation_summary([50.0, 100.0, 0.0]) == {
        "mean_percent": 50.0, "max_percent": 100.0, "samples": 3}
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    with bench.Utilisation("0") as sampler:
        pass
    assert sampler.samples == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert bench.gpu_index() == "3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert bench.gpu_index() == "0"
