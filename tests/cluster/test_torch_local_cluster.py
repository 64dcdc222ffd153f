"""TorchEstimator across separate executor JVMs: local-cluster[2,1,1024], its own driver; it
trains, and a SIGKILLed Python worker resumes from the checkpoint to the same weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("torch_fit.py")


@pytest.mark.slow
@pytest.mark.cluster
def test_two_workers_train_and_resume_in_two_executor_jvms():
    done = subprocess.run([sys.executable, str(SCRIPT), "local-cluster[2,1,1024]"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["block_managers"] == 3 and result["world_size"] == 2
    losses = result["losses"]
    assert len(losses) == 8 and losses[-1] < 0.6 * losses[0]
    assert result["accuracy"] > 0.85 and result["accuracy"] > result["majority"] + 0.2
    assert result["fault_fired"] and result["resumed_from_epoch"] == 2
    assert result["resumed_same_weights"]
