"""XGBoost estimators under failures: checkpoints every few boosting rounds, a failed chunk
retried from the last checkpoint, re-runs by runId, bounded retries, damaged checkpoints, and
settings refused before launch (re-runs of a runId: test_resume_safety.py)."""

from __future__ import annotations

import logging
import os

import pytest

from sparkdist.datasets import churn
from sparkdist.exceptions import ClusterConfigError, ParamError, TrainingError
from sparkdist.failpoints import arm
from sparkdist.features import FeatureAssembler
from sparkdist.models import XGBoostClassifier

LABEL = "cancelled_within_week"
SETTINGS = {"labelCol": LABEL, "num_workers": 2, "max_depth": 3, "verbose": False,
            "checkpointEvery": 2}


@pytest.fixture(scope="module")
def data(spark, cached):
    raw = churn(spark, n=2000, seed=3, partitions=2)
    assembler = FeatureAssembler(numericCols=["month_interaction_count",
                                              "week_interaction_count"],
                                 categoricalCols=["plan", "region"], labelCol=LABEL)
    with cached(assembler.fit(raw).transform(raw).select("features", LABEL)) as df:
        yield df


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    """6 rounds in chunks of 2 without a failure: the booster every resumed run must end with."""
    directory = str(tmp_path_factory.mktemp("clean"))
    return XGBoostClassifier(n_estimators=6, checkpointDir=directory, **SETTINGS).fit(data)


def _booster(model) -> bytes:
    return bytes(model.get_booster().save_raw("json"))


def _checkpoints(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("ckpt-"))


@pytest.mark.slow
def test_a_checkpointed_fit_equals_one_plain_fit(data, uninterrupted):
    plain = {k: v for k, v in SETTINGS.items() if k != "checkpointEvery"}
    model = XGBoostClassifier(n_estimators=6, **plain).fit(data)
    assert model.trainingSummary == {}
    assert _booster(model) == _booster(uninterrupted)
    assert uninterrupted.trainingSummary["resumed_from_round"] is None
    assert uninterrupted.trainingSummary["retries"] == 0
    assert uninterrupted.transform(data).where("prediction IS NULL").count() == 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["raise", "kill"])
def test_a_failed_rank_resumes_from_the_checkpoint_to_the_same_booster(
        data, uninterrupted, tmp_path, kind):
    estimator = arm(
        XGBoostClassifier(n_estimators=6, checkpointDir=str(tmp_path / "ckpt"),
                          keepCheckpoints=2, **SETTINGS),
        str(tmp_path), rank=1, epoch=3, action=kind)  # in the second chunk (rounds 3-4)
    model = estimator.fit(data)
    summary = model.trainingSummary
    assert (tmp_path / "fired-1.pid").exists() and summary["retries"] == 1
    assert summary["resumed_from_round"] is None  # a retry within the fit, not a re-run
    assert _booster(model) == _booster(uninterrupted)
    assert model.get_booster().num_boosted_rounds() == 6
    assert _checkpoints(tmp_path / "ckpt" / summary["run_id"]) == [
        "ckpt-0000000004", "ckpt-0000000006"]


@pytest.mark.slow
def test_resume_required_continues_a_completed_run_to_the_new_total(data, uninterrupted,
                                                                    tmp_path):
    first = XGBoostClassifier(n_estimators=4, checkpointDir=str(tmp_path), runId="nightly",
                              **SETTINGS).fit(data)
    assert first.get_booster().num_boosted_rounds() == 4
    resumed = XGBoostClassifier(n_estimators=6, checkpointDir=str(tmp_path), runId="nightly",
                                resume="required", **SETTINGS).fit(data)
    assert resumed.trainingSummary["resumed_from_round"] == 4
    assert _booster(resumed) == _booster(uninterrupted)
    with pytest.raises(ParamError, match="after 6 rounds, more than n_estimators=2"):
        XGBoostClassifier(n_estimators=2, checkpointDir=str(tmp_path), runId="nightly",
                          resume="required", **SETTINGS).fit(data)


@pytest.mark.slow
def test_retries_are_bounded_and_the_last_cause_reaches_the_user(data, tmp_path):
    estimator = arm(
        XGBoostClassifier(n_estimators=2, checkpointDir=str(tmp_path / "ckpt"), maxRetries=1,
                          **SETTINGS), str(tmp_path), rank=1, epoch=1, times=4)
    with pytest.raises(TrainingError) as caught:
        estimator.fit(data)
    message = str(caught.value)
    assert "gave up after 2 failed attempt(s) (maxRetries=1)" in message
    if "failpoint xgboost.round fired (2): rank 1, epoch 1, step 0" not in message:
        # Spark cancelled the barrier stage on rank 0's lost-peer error and killed rank 1
        # before its own error arrived (it settles that race either way): the user is told so
        assert "rank(s) 0 lost a peer in xgboost's collective" in message
        assert "Spark killed the task(s) of rank(s) 1 before they reported" in message
    assert "/collective/" not in message  # rank 0 only lost its peer: not the root cause
    assert not (tmp_path / "fired-3.pid").exists()  # no third attempt ran


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(data, uninterrupted,
                                                                  tmp_path, caplog):
    ckpt = str(tmp_path / "ckpt")
    failing = arm(XGBoostClassifier(n_estimators=6, checkpointDir=ckpt, runId="r",
                                             maxRetries=0, **SETTINGS),
                           str(tmp_path), rank=1, epoch=5)
    with pytest.raises(TrainingError):  # an interrupted run: checkpoints after 2 and 4
        failing.fit(data)
    latest = tmp_path / "ckpt" / "r" / "ckpt-0000000004"
    latest.write_bytes(latest.read_bytes()[:100])  # a torn write
    with caplog.at_level(logging.WARNING, logger="sparkdist"):
        model = XGBoostClassifier(n_estimators=6, checkpointDir=ckpt, runId="r",
                                  **SETTINGS).fit(data)
    assert "ckpt-0000000004 is damaged" in caplog.text
    assert model.trainingSummary["resumed_from_round"] == 2
    assert _booster(model) == _booster(uninterrupted)


def test_bad_recovery_settings_fail_before_launch(data, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    estimator = arm(
        XGBoostClassifier(n_estimators=2, checkpointDir=str(blocker / "ckpt"), **SETTINGS),
        str(tmp_path), rank=0, epoch=1)
    with pytest.raises(ParamError, match="checkpointDir=.*not writable"):
        estimator.fit(data)
    assert not (tmp_path / "fired-1.pid").exists()  # no training started
    with pytest.raises(ParamError, match="early_stopping_rounds=3 cannot be combined with "
                                         "checkpointDir"):
        XGBoostClassifier(n_estimators=4, early_stopping_rounds=3, checkpointDir=str(tmp_path),
                          validationIndicatorCol="is_validation", **SETTINGS).fit(data)
    with pytest.raises(ParamError, match="checkpointEvery=0"):
        XGBoostClassifier(**{**SETTINGS, "checkpointEvery": 0}).fit(data)


def test_max_retries_is_not_bounded_by_spark_stage_attempts(spark, tmp_path):
    # XGBoost retries on the driver: spark.stage.maxConsecutiveAttempts (4) does not apply.
    estimator = XGBoostClassifier(maxRetries=8, checkpointDir=str(tmp_path), runId="x")
    assert estimator.checkpoint_location(spark, spark_retries=False) == (
        f"{tmp_path}/x", "x")
    with pytest.raises(ClusterConfigError, match="spark.stage.maxConsecutiveAttempts=9"):
        estimator.checkpoint_location(spark)
