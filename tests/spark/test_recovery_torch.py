"""TorchEstimator under failures: checkpoints, automatic resume on Spark's stage retry, re-runs
by runId (more in test_resume_safety.py), bounded retries, a peer that never arrives, damaged
checkpoints, bad settings."""

from __future__ import annotations

import os
import time

import pytest
import torch

from sparkdist.datasets import make_nonlinear
from sparkdist.exceptions import ClusterConfigError, ParamError, TrainingError
from sparkdist.failpoints import arm
from sparkdist.models import TorchEstimator

SETTINGS = {"progress": False, "batchSize": 200, "learningRate": 0.01, "numWorkers": 2,
            "modelKwargs": {"hidden": [16], "dropout": 0.1}, "seed": 5,
            "rendezvousTimeoutSeconds": 60}


@pytest.fixture(scope="module")
def data(spark, cached):
    with cached(spark.createDataFrame(make_nonlinear(2000, 3)).repartition(2)) as df:
        yield df


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    """4 epochs without a failure: the weights every resumed run must end with."""
    directory = str(tmp_path_factory.mktemp("clean"))
    return TorchEstimator(epochs=4, checkpointDir=directory, **SETTINGS).fit(data)


def _same_weights(a, b) -> bool:
    first, second = a.module().state_dict(), b.module().state_dict()
    return all(torch.equal(first[name], second[name]) for name in first)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["raise", "kill"])
def test_a_failed_rank_resumes_from_the_checkpoint_to_the_same_weights(
        data, uninterrupted, tmp_path, kind):
    estimator = arm(
        TorchEstimator(epochs=4, checkpointDir=str(tmp_path / "ckpt"), **SETTINGS),
        str(tmp_path), rank=1, epoch=3, step=4, action=kind)
    model = estimator.fit(data)
    summary = model.trainingSummary
    assert (tmp_path / "fired-1.pid").exists() and summary["resumed_from_epoch"] == 2
    assert [epoch["epoch"] for epoch in model.history] == [1, 2, 3, 4]
    assert _same_weights(model, uninterrupted)
    assert sorted(name for name in os.listdir(tmp_path / "ckpt" / summary["run_id"])
                  if name.startswith("ckpt-")) == [
        "ckpt-0000000002", "ckpt-0000000003", "ckpt-0000000004"]


@pytest.mark.slow
def test_a_rank_killed_mid_epoch_resumes_at_the_checkpointed_step(data, uninterrupted,
                                                                  tmp_path):
    """checkpointEverySteps=2: a kill before step 3 of epoch 3 resumes after its step 2."""
    estimator = arm(
        TorchEstimator(epochs=4, checkpointDir=str(tmp_path / "ckpt"), checkpointEverySteps=2,
                       **SETTINGS), str(tmp_path), rank=1, epoch=3, step=3, action="kill")
    model = estimator.fit(data)
    summary = model.trainingSummary
    assert (tmp_path / "fired-1.pid").exists()
    assert (summary["resumed_from_epoch"], summary["resumed_from_step"]) == (2, 2)
    assert [epoch["loss"] for epoch in model.history] == pytest.approx(
        [epoch["loss"] for epoch in uninterrupted.history], rel=1e-6)
    assert _same_weights(model, uninterrupted)


@pytest.mark.slow
def test_resume_required_continues_a_completed_run_to_more_epochs(data, uninterrupted,
                                                                  tmp_path):
    first = TorchEstimator(epochs=2, checkpointDir=str(tmp_path), runId="nightly",
                           **SETTINGS).fit(data)
    assert first.trainingSummary["resumed_from_epoch"] is None
    resumed = TorchEstimator(epochs=4, checkpointDir=str(tmp_path), runId="nightly",
                             resume="required", **SETTINGS).fit(data)
    assert resumed.trainingSummary["resumed_from_epoch"] == 2
    assert resumed.history[:2] == first.history
    assert _same_weights(resumed, uninterrupted)


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(data, uninterrupted,
                                                                  tmp_path):
    ckpt = str(tmp_path / "ckpt")
    failing = arm(TorchEstimator(epochs=4, checkpointDir=ckpt, runId="r",
                                          maxRetries=0, **SETTINGS),
                           str(tmp_path), rank=1, epoch=4, step=0)
    with pytest.raises(TrainingError):  # an interrupted run: checkpoints 1-3
        failing.fit(data)
    latest = tmp_path / "ckpt" / "r" / "ckpt-0000000003"
    latest.write_bytes(latest.read_bytes()[:100])  # a torn write
    model = TorchEstimator(epochs=4, checkpointDir=ckpt, runId="r", **SETTINGS).fit(data)
    assert model.trainingSummary["resumed_from_epoch"] == 2
    assert len(model.history) == 4
    assert _same_weights(model, uninterrupted)


@pytest.mark.slow
def test_retries_are_bounded_and_the_last_cause_reaches_the_user(data, tmp_path):
    estimator = arm(
        TorchEstimator(epochs=2, checkpointDir=str(tmp_path / "ckpt"), maxRetries=1,
                       **SETTINGS), str(tmp_path), rank=1, epoch=1, step=0, times=4)
    with pytest.raises(TrainingError) as caught:
        estimator.fit(data)
    message = str(caught.value)
    assert "gave up after 2 failed attempt(s) (maxRetries=1)" in message
    assert "FailpointError: failpoint torch.step fired (2): rank 1, epoch 1, step 0" in message
    assert not (tmp_path / "fired-3.pid").exists()  # no third attempt ran
    assert "output tail of rank 1" in message


@pytest.mark.slow
def test_a_peer_that_never_arrives_ends_within_the_rendezvous_timeout(data, tmp_path):
    marker = tmp_path / "fired-1.pid"
    estimator = arm(
        TorchEstimator(epochs=1, maxRetries=0, **{**SETTINGS, "rendezvousTimeoutSeconds": 8}),
        str(tmp_path), rank=1, epoch=0, action="hang", times=4)
    with pytest.raises(TrainingError, match="reached the rendezvous within 8 s"):
        estimator.fit(data)
    # From the moment rank 1 hung (its marker file: the data checks before the launch and
    # the task start do not count) to the error on the driver.
    assert time.time() - marker.stat().st_mtime < 8 + 5
    pid = int(marker.read_text())
    deadline = time.monotonic() + 15
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(pid), "the hung worker process was left running"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_bad_recovery_settings_fail_before_launch(data, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ParamError, match="checkpointDir=.*not writable"):
        TorchEstimator(checkpointDir=str(blocker / "ckpt"), **SETTINGS).fit(data)
    with pytest.raises(ClusterConfigError, match="spark.stage.maxConsecutiveAttempts=9"):
        TorchEstimator(maxRetries=8, **SETTINGS).fit(data)
    with pytest.raises(ParamError, match="checkpointEvery=0"):
        TorchEstimator(checkpointEvery=0, **SETTINGS).fit(data)
