"""A sharded (fsdp/tensor) checkpoint error reaches the user with its cause (round 3, N4).

DCP raises ``CheckpointException``, a BaseException, which the ranks' failure reports (``except
Exception``) never saw: the fit gave up on Spark's stage attempts alone, with "The last
failure: None"."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import sys

import pytest
import torch
from pyspark import cloudpickle
from torch.distributed.checkpoint.api import CheckpointException

from sparkdist.exceptions import TrainingError
from sparkdist.models import TorchEstimator
from sparkdist.store import Checkpoints
from sparkdist.torchtrain import sharded

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Counted travels by value

SETTINGS = {"progress": False, "batchSize": 100, "numWorkers": 2, "seed": 7,
            "strategy": "fsdp", "rendezvousTimeoutSeconds": 60}


class Counted(torch.nn.Module):
    """A small MLP that notes each build in a task (one per rank and stage attempt) in
    ``log``: how the test counts the attempts that ran."""

    def __init__(self, input_dim: int, output_dim: int, log: str) -> None:
        from pyspark import TaskContext

        super().__init__()
        self.hidden, self.out = torch.nn.Linear(input_dim, 16), torch.nn.Linear(16, output_dim)
        if TaskContext.get() is not None:  # not the driver's own checks
            with open(log, "a") as out:
                out.write(f"{os.getpid()}\n")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def test_dcp_errors_become_training_errors_with_each_ranks_cause():
    failures = {1: (OSError(28, "No space left on device"), None), 0: (ValueError("bad"), None)}
    with pytest.raises(TrainingError) as info, sharded._dcp_errors("writing x", "free space"):
        raise CheckpointException("CheckpointException ranks", failures)
    assert str(info.value) == ("writing x failed: rank 0: ValueError: bad; rank 1: OSError: "
                               "[Errno 28] No space left on device; free space.")
    assert isinstance(info.value.__cause__, CheckpointException)
    with pytest.raises(KeyboardInterrupt), sharded._dcp_errors("writing x", "free space"):
        raise KeyboardInterrupt


def _replace_shard_file(run: str, name: str, data: bytes) -> None:
    """Write ``data`` as ``name`` of the newest checkpoint's shard directory and put its
    SHA-256 into that checkpoint (what an attacker with write access to checkpointDir can do):
    the digest check passes and DCP itself reads the file."""
    checkpoints = Checkpoints(run)
    step = checkpoints.steps()[-1]
    state = torch.load(io.BytesIO(checkpoints.read(step)), weights_only=True)
    saved = state["training_state"]
    with open(os.path.join(saved["sharded"], name), "wb") as out:
        out.write(data)
    saved["files"][name] = hashlib.sha256(data).hexdigest()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    checkpoints.save(step, buffer.getvalue())


@pytest.mark.slow
def test_a_refused_shard_metadata_fails_the_fit_once_with_its_cause(nonlinear, tmp_path):
    train, _ = nonlinear
    builds = tmp_path / "builds.log"
    settings = {**SETTINGS, "model": Counted, "modelKwargs": {"log": str(builds)},
                "checkpointDir": str(tmp_path / "ckpt"), "runId": "r"}
    TorchEstimator(epochs=1, **settings).fit(train)
    _replace_shard_file(str(tmp_path / "ckpt" / "r"), sharded.METADATA, pickle.dumps(os.system))
    builds.write_text("")
    more = TorchEstimator(epochs=2, resume="required", maxRetries=0, **settings)
    with pytest.raises(TrainingError) as info:
        more.fit(train)
    message = str(info.value)
    assert len(builds.read_text().split()) == 2, "not one attempt of 2 ranks"
    # the ranks' report arrived (before: "The last failure: None") and ended the fit at once
    assert "gave up after 1 failed attempt(s) (maxRetries=0)" in message, message
    assert "The last failure: None" not in message
    assert "reading the sharded checkpoint" in message, message
    assert "refused a sharded checkpoint's .metadata: it names posix.system" in message
