"""strategy='pipeline' with 2 stages x 2 data-parallel replicas on 4 workers (local[4], its
own driver: the suite's session has 2 task slots): ddp's curve and accuracy, about half of
ddp's state bytes per rank, and a SIGKILLed rank of the second replica resumes to the
uninterrupted weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("pipeline_fit.py")


@pytest.mark.slow
@pytest.mark.cluster
def test_two_stages_by_two_replicas_train_like_ddp_and_resume():
    done = subprocess.run([sys.executable, str(SCRIPT), "local[4]"], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["world_size"] == 4
    ddp, pipeline = result["ddp_losses"], result["pipeline_losses"]
    assert pipeline[0] == pytest.approx(ddp[0], rel=1e-4) and pipeline[-1] < 0.7 * pipeline[0]
    assert result["pipeline_accuracy"] >= result["ddp_accuracy"] - 0.01 > 0.8
    assert max(result["pipeline_state_mb"]) / max(result["ddp_state_mb"]) <= 0.55
    assert result["fault_fired"] and result["resumed_from"] == [1, 5]
    assert result["resumed_losses"] == pytest.approx(pipeline, rel=1e-6)
    assert result["resumed_same_weights"]
