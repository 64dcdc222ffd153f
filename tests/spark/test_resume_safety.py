"""Re-fits and concurrent fits of one runId give the right model or a clear error, decided on
the driver before anything is launched. Report cases (../shared/reports/
bad_input_and_security.md, D3 and D16): K1 new data, K1b other epochs, K1c refused before
launch, K1d XGBoost, K4 concurrent fits; plus the three ``resume`` modes and the runId check.
"""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
import torch
from pyspark.sql import functions as F

from sparkdist.exceptions import ParamError, TrainingError
from sparkdist.failpoints import arm
from sparkdist.models import TorchEstimator, XGBoostClassifier

SETTINGS = {"progress": False, "batchSize": 400, "learningRate": 0.05, "numWorkers": 1,
            "modelKwargs": {"hidden": [8]}, "seed": 3, "epochs": 2, "runId": "churn-nightly",
            "rendezvousTimeoutSeconds": 60}
XGB = {"labelCol": "label", "num_workers": 1, "max_depth": 2, "n_estimators": 4,
       "checkpointEvery": 2, "verbose": False, "runId": "churn-nightly"}
RUN = "churn-nightly"


@pytest.fixture(scope="module")
def day1(nonlinear):
    return nonlinear[0]


@pytest.fixture(scope="module")
def day2(day1):
    """The next day's data: the same rows with every label flipped (only the content differs)."""
    return day1.withColumn("label", 1.0 - F.col("label")).cache()


@pytest.fixture(scope="module")
def completed(day1, tmp_path_factory):
    """A finished 2-epoch run on day1: (checkpointDir, its model)."""
    directory = tmp_path_factory.mktemp("completed")
    return directory, TorchEstimator(checkpointDir=str(directory), **SETTINGS).fit(day1)


@pytest.fixture(scope="module")
def interrupted(day1, tmp_path_factory):
    """The same run on day1, failed in epoch 2 (no retries): a checkpoint after epoch 1."""
    directory = tmp_path_factory.mktemp("interrupted")
    estimator = arm(
        TorchEstimator(checkpointDir=str(directory / "ckpt"), maxRetries=0, **SETTINGS),
        str(directory), rank=0, epoch=2, step=0)
    with pytest.raises(TrainingError):
        estimator.fit(day1)
    assert _files(directory / "ckpt" / RUN) == ["ckpt-0000000001", "run.json"]
    return directory / "ckpt"


def _copy(run_dir, tmp_path) -> str:
    """A private copy of a fixture's checkpointDir."""
    shutil.copytree(run_dir, tmp_path / "ckpt")
    return str(tmp_path / "ckpt")


def _files(directory) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def _same_weights(a, b) -> bool:
    first, second = a.module().state_dict(), b.module().state_dict()
    return all(torch.equal(first[name], second[name]) for name in first)


def _unlaunched(estimator, tmp_path, epoch: int = 0):
    """The estimator with a fault at the very start of training: if anything is launched, the
    marker file ``fired-1.pid`` appears."""
    return arm(estimator, str(tmp_path), rank=0, epoch=epoch, step=0)


# ------------------------------------------------------------------------------- K1, K1b
def test_k1_refit_on_new_data_trains_afresh_not_the_old_model(completed, day2, tmp_path):
    old_dir, old = completed
    directory = _copy(old_dir, tmp_path)
    model = TorchEstimator(checkpointDir=directory, **SETTINGS).fit(day2)
    fresh = TorchEstimator(checkpointDir=str(tmp_path / "other"), **SETTINGS).fit(day2)
    assert model.trainingSummary["resumed_from_epoch"] is None
    assert not _same_weights(model, old)
    assert _same_weights(model, fresh)  # exactly what a fit without the earlier run gives
    record = json.loads((tmp_path / "ckpt" / RUN / "run.json").read_text())
    assert record["state"] == "complete" and record["done"] == 2


def test_k1b_fewer_epochs_on_a_completed_run_give_a_model_of_that_many(completed, day1,
                                                                       tmp_path):
    directory = _copy(completed[0], tmp_path)
    model = TorchEstimator(checkpointDir=directory, **{**SETTINGS, "epochs": 1}).fit(day1)
    assert [record["epoch"] for record in model.history] == [1]
    assert model.trainingSummary["resumed_from_epoch"] is None


@pytest.mark.parametrize("change, names", [
    ({"epochs": 1}, r"epochs: 2 -> 1"),
    ({"learningRate": 0.1, "batchSize": 200},
     r"batchSize: 400 -> 200; learningRate: 0.05 -> 0.1"),
    ({"modelKwargs": {"hidden": [4]}}, r"modelKwargs: \{'hidden': \[8\]\} -> \{'hidden': \[4\]\}"),
    ({"seed": 4}, r"seed: 3 -> 4"),
    # the held-out rows are part of the data's content hash
    ({"validationFraction": 0.2}, r"data content hash: .*; validationFraction: 0.0 -> 0.2"),
])
def test_k1b_k1c_other_settings_on_an_interrupted_run_are_refused_before_launch(
        interrupted, day1, tmp_path, change, names):
    directory = _copy(interrupted, tmp_path)
    before = _files(tmp_path / "ckpt" / RUN)
    estimator = _unlaunched(TorchEstimator(checkpointDir=directory, **{**SETTINGS, **change}),
                            tmp_path)
    started = time.monotonic()
    with pytest.raises(ParamError, match=f"runId='{RUN}' holds an interrupted run with other "
                                         f"settings or data: {names}.*resume='never'"):
        estimator.fit(day1)
    assert not (tmp_path / "fired-1.pid").exists()  # no barrier stage, so no stage retries
    assert time.monotonic() - started < 20  # one data pass, not 4 failed stage attempts
    assert _files(tmp_path / "ckpt" / RUN) == before  # the run is left as it was


def test_k1_new_data_on_an_interrupted_run_is_refused_then_never_starts_over(
        interrupted, day2, tmp_path):
    directory = _copy(interrupted, tmp_path)
    with pytest.raises(ParamError, match=r"data content hash: '\d+' -> '\d+'"):
        _unlaunched(TorchEstimator(checkpointDir=directory, **SETTINGS), tmp_path).fit(day2)
    assert not (tmp_path / "fired-1.pid").exists()
    model = TorchEstimator(checkpointDir=directory, resume="never", **SETTINGS).fit(day2)
    fresh = TorchEstimator(checkpointDir=str(tmp_path / "other"), **SETTINGS).fit(day2)
    assert model.trainingSummary["resumed_from_epoch"] is None
    assert _same_weights(model, fresh)


# ------------------------------------------------------------------------- resume modes
def test_auto_resumes_an_interrupted_run_to_the_uninterrupted_weights(interrupted, completed,
                                                                      day1, tmp_path):
    directory = _copy(interrupted, tmp_path)
    model = TorchEstimator(checkpointDir=directory, **SETTINGS).fit(day1)
    assert model.trainingSummary["resumed_from_epoch"] == 1
    assert _same_weights(model, completed[1])


def test_required_fails_without_a_run_and_continues_a_completed_one_only_to_more_epochs(
        completed, day1, tmp_path):
    with pytest.raises(ParamError, match=f"resume='required' but runId='{RUN}' has no run"):
        _unlaunched(TorchEstimator(checkpointDir=str(tmp_path / "empty"), resume="required",
                                   **SETTINGS), tmp_path).fit(day1)
    directory = _copy(completed[0], tmp_path)
    with pytest.raises(ParamError, match=r"completed after 2 epochs: nothing to continue"):
        _unlaunched(TorchEstimator(checkpointDir=directory, resume="required", **SETTINGS),
                    tmp_path).fit(day1)
    assert not (tmp_path / "fired-1.pid").exists()
    model = TorchEstimator(checkpointDir=directory, resume="required",
                           **{**SETTINGS, "epochs": 3}).fit(day1)
    assert model.trainingSummary["resumed_from_epoch"] == 2
    assert model.history[:2] == completed[1].history


# ------------------------------------------------------------------------------------ K4
@pytest.mark.slow
def test_k4_a_second_fit_on_a_run_in_use_is_refused(completed, day1, day2, tmp_path):
    directory = _copy(completed[0], tmp_path)
    first = arm(TorchEstimator(checkpointDir=directory, timeoutSeconds=15,
                                        **SETTINGS), str(tmp_path), rank=0, epoch=1,
                         action="hang")
    outcome: list[BaseException] = []

    def fit_first() -> None:
        try:
            first.fit(day1)
        except BaseException as err:  # reported to the test thread
            outcome.append(err)

    thread = threading.Thread(target=fit_first)
    thread.start()
    deadline = time.monotonic() + 60
    while not (tmp_path / "fired-1.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (tmp_path / "fired-1.pid").exists(), "the first fit never started training"
    with pytest.raises(ParamError, match=f"runId='{RUN}' is in use by another fit .*host"):
        TorchEstimator(checkpointDir=directory, **SETTINGS).fit(day2)
    thread.join(120)
    assert outcome and isinstance(outcome[0], TrainingError)  # its timeout, not the refusal
    assert "lock.json" not in _files(tmp_path / "ckpt" / RUN)  # released on failure too


def test_k4_a_dead_drivers_lock_expires_and_a_live_one_is_named(completed, day1, tmp_path):
    directory = _copy(completed[0], tmp_path)
    lock = tmp_path / "ckpt" / RUN / "lock.json"
    lock.write_text(json.dumps({"fit_id": "f00", "host": "gone-host", "pid": 7,
                                "expires": time.time() + 60}))
    with pytest.raises(ParamError, match=r"in use by another fit \(fit f00 on host gone-host"):
        _unlaunched(TorchEstimator(checkpointDir=directory, **SETTINGS), tmp_path).fit(day1)
    lock.write_text(json.dumps({"fit_id": "f00", "host": "gone-host", "pid": 7,
                                "expires": time.time() - 1}))
    model = TorchEstimator(checkpointDir=directory, **SETTINGS).fit(day1)
    assert len(model.history) == 2 and not lock.exists()


# --------------------------------------------------------------------------- cheap checks
@pytest.mark.parametrize("params, names", [
    ({"runId": "../x"}, r"runId='\.\./x' is not a plain name"),
    ({"runId": "a/b"}, r"runId='a/b' is not a plain name"),
    ({"runId": ".hidden"}, r"runId='\.hidden' is not a plain name"),
    ({"resume": "yes"}, r"resume='yes' is not one of \['auto', 'never', 'required'\]"),
])
def test_bad_run_id_or_resume_is_refused_before_anything_is_written(day1, tmp_path, params,
                                                                    names):
    with pytest.raises(ParamError, match=names):
        TorchEstimator(checkpointDir=str(tmp_path / "ckpt"), **{**SETTINGS, **params}).fit(day1)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------- K1d
@pytest.fixture(scope="module")
def xgb_completed(day1, tmp_path_factory):
    directory = tmp_path_factory.mktemp("xgb-completed")
    return directory, XGBoostClassifier(checkpointDir=str(directory), **XGB).fit(day1)


def _booster(model) -> bytes:
    return bytes(model.get_booster().save_raw("json"))


@pytest.mark.slow
def test_k1d_xgboost_refit_on_new_data_boosts_afresh(xgb_completed, day2, tmp_path):
    directory = _copy(xgb_completed[0], tmp_path)
    model = XGBoostClassifier(checkpointDir=directory, **XGB).fit(day2)
    fresh = XGBoostClassifier(checkpointDir=str(tmp_path / "other"), **XGB).fit(day2)
    assert model.trainingSummary["resumed_from_round"] is None
    assert model.get_booster().num_boosted_rounds() == 4
    assert _booster(model) == _booster(fresh) != _booster(xgb_completed[1])


@pytest.mark.slow
def test_k1d_xgboost_interrupted_run_resumes_only_with_the_same_data_and_params(
        xgb_completed, day1, day2, tmp_path):
    failing = arm(XGBoostClassifier(checkpointDir=str(tmp_path / "ckpt"),
                                             maxRetries=0, **XGB),
                           str(tmp_path / "fault"), rank=0, epoch=3)
    (tmp_path / "fault").mkdir()
    with pytest.raises(TrainingError):
        failing.fit(day1)
    for data, params, names in ((day2, {}, r"data content hash"),
                                (day1, {"n_estimators": 6}, r"n_estimators: 4 -> 6"),
                                (day1, {"max_depth": 3}, r"max_depth: 2 -> 3")):
        estimator = XGBoostClassifier(checkpointDir=str(tmp_path / "ckpt"), **{**XGB, **params})
        with pytest.raises(ParamError, match=f"holds an interrupted run .*{names}"):
            _unlaunched(estimator, tmp_path, epoch=1).fit(data)
        assert not (tmp_path / "fired-1.pid").exists()
    model = XGBoostClassifier(checkpointDir=str(tmp_path / "ckpt"), **XGB).fit(day1)
    assert model.trainingSummary["resumed_from_round"] == 2
    assert _booster(model) == _booster(xgb_completed[1])
