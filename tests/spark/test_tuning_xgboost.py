"""XGBoost fits for a Tuner's pruner: the per-round validation history on the model (and
through save/load), and a checkpointed fit that reports each round to its observer and stops
when the observer says so, after saving the chunk's checkpoint."""

from __future__ import annotations

import json
import logging
import os
import pathlib

import pytest
from pyspark.sql import functions as F

from sparkdist.datasets import churn
from sparkdist.exceptions import FitStopped, ModelLoadError
from sparkdist.features import FeatureAssembler
from sparkdist.launch import observe
from sparkdist.models import XGBoostClassificationModel, XGBoostClassifier, XGBoostRegressor
from sparkdist.persist import RECORD, STATE_KEY
from sparkdist.store import Checkpoints

LABEL = "cancelled_within_week"
FLAG = "is_validation"
SETTINGS = {"labelCol": LABEL, "num_workers": 2, "max_depth": 3, "verbose": False,
            "validationIndicatorCol": FLAG}


@pytest.fixture(scope="module")
def data(spark, cached):
    """1000 churn rows, a fifth of them flagged as validation rows (a fixed hash)."""
    raw = churn(spark, n=1000, seed=5, partitions=2)
    assembler = FeatureAssembler(numericCols=["month_interaction_count",
                                              "week_interaction_count"],
                                 categoricalCols=["plan", "region"], labelCol=LABEL)
    assembled = assembler.fit(raw).transform(raw).select("features", LABEL)
    flagged = assembled.withColumn(
        FLAG, F.pmod(F.xxhash64("features", LABEL, F.monotonically_increasing_id()), 5) == 0)
    with cached(flagged) as df:
        yield df


def _checkpoint_steps(directory: str) -> list[int]:
    return sorted(int(name.split("-")[1]) for name in os.listdir(directory)
                  if name.startswith("ckpt-"))


@pytest.mark.slow
def test_a_fit_with_validation_rows_has_a_history_per_round_that_survives_save_load(
        data, tmp_path):
    model = XGBoostClassifier(n_estimators=4, **SETTINGS).fit(data)
    history = model.history
    own = model.xgboost_model.training_summary  # xgboost.spark's own account of the fit
    assert [record["epoch"] for record in history] == [1, 2, 3, 4]
    assert [record["val_logloss"] for record in history] == \
        own.validation_objective_history["logloss"]
    assert [record["val_loss"] for record in history] == \
        own.validation_objective_history["logloss"]
    assert [record["logloss"] for record in history] == own.train_objective_history["logloss"]
    assert history[-1]["val_logloss"] < history[0]["val_logloss"]

    model.write().overwrite().save(str(tmp_path / "model"))
    loaded = XGBoostClassificationModel.load(str(tmp_path / "model"))
    assert loaded.history == history

    without = XGBoostClassifier(n_estimators=2, **{k: v for k, v in SETTINGS.items()
                                                   if k != "validationIndicatorCol"}).fit(data)
    assert without.history == []


def test_a_regressor_names_each_eval_metric(data):
    model = XGBoostRegressor(n_estimators=2, eval_metric=["mae", "rmse"], **SETTINGS).fit(data)
    first = model.history[0]
    assert first["epoch"] == 1 and first["val_loss"] == first["val_mae"]
    assert {"val_mae", "val_rmse", "mae", "rmse"} <= set(first)


def test_a_model_saved_before_histories_loads_with_none_and_a_damaged_one_is_refused(
        data, tmp_path):
    path = str(tmp_path / "model")
    XGBoostClassifier(n_estimators=2, **SETTINGS).fit(data).write().save(path)
    record_file = pathlib.Path(path) / RECORD
    record = json.loads(record_file.read_text())
    assert len(record[STATE_KEY]["history"]) == 2
    del record[STATE_KEY]["history"]  # as sparkdist wrote it before this change
    record_file.write_text(json.dumps(record))
    assert XGBoostClassificationModel.load(path).history == []
    record[STATE_KEY]["history"] = [{"epoch": 1, "val_logloss": "0.5"}]
    record_file.write_text(json.dumps(record))
    with pytest.raises(ModelLoadError, match="history is not a list of per-round records"):
        XGBoostClassificationModel.load(path)


def test_a_checkpointed_fit_stops_when_its_observer_says_so(data, tmp_path):
    seen: list[dict] = []

    def observer(record: dict) -> bool:
        seen.append(record)
        return record["epoch"] >= 4

    estimator = XGBoostClassifier(n_estimators=6, checkpointEvery=2, runId="pruned",
                                  checkpointDir=str(tmp_path), **SETTINGS)
    with observe.observing(observer), pytest.raises(FitStopped) as stopped:
        estimator.fit(data)
    assert stopped.value.epoch == 4 and stopped.value.free_seconds == 0.0
    assert "stopped by its observer after round 4" in str(stopped.value)
    assert [record["epoch"] for record in seen] == [1, 2, 3, 4]
    assert all(isinstance(record["val_logloss"], float) for record in seen)
    assert Checkpoints(str(tmp_path / "pruned"), keep=3).latest()[0] == 4
    assert _checkpoint_steps(str(tmp_path / "pruned")) == [2, 4]


@pytest.mark.slow
def test_a_checkpointed_fit_without_an_observer_boosts_every_round(data, tmp_path):
    plain = XGBoostClassifier(n_estimators=6, **SETTINGS).fit(data)
    estimator = XGBoostClassifier(n_estimators=6, checkpointEvery=2, runId="full",
                                  checkpointDir=str(tmp_path), **SETTINGS)
    model = estimator.fit(data)
    assert model.get_booster().num_boosted_rounds() == 6
    assert _checkpoint_steps(str(tmp_path / "full")) == [2, 4, 6]
    # the chunks' histories, rounds numbered from the start of the fit, are the plain fit's
    assert [record["epoch"] for record in model.history] == [1, 2, 3, 4, 5, 6]
    assert [r["val_logloss"] for r in model.history] == \
        pytest.approx([r["val_logloss"] for r in plain.history])
    # a fit that continues the run has records for the rounds it boosted itself
    more = estimator.copy({estimator.getParam("n_estimators"): 8,
                           estimator.getParam("resume"): "required"}).fit(data)
    assert more.trainingSummary["resumed_from_round"] == 6
    assert [record["epoch"] for record in more.history] == [7, 8]


def test_an_observer_that_raises_is_logged_and_the_fit_goes_on(data, tmp_path, caplog):
    def failing(record: dict) -> bool:
        raise RuntimeError("a broken pruner")

    estimator = XGBoostClassifier(n_estimators=4, checkpointEvery=2,
                                  checkpointDir=str(tmp_path), **SETTINGS)
    with observe.observing(failing), caplog.at_level(logging.WARNING):
        model = estimator.fit(data)
    assert model.get_booster().num_boosted_rounds() == 4
    assert len(model.history) == 4
    assert caplog.text.count("a broken pruner") == 4
