"""Stages and a checkpoint saved by the code of commit 15970eb (tests/data/legacy_15970eb, made
by its make_legacy.py) still load with today's code and score the rows as they did then; the
checkpointed TorchEstimator run resumes (resume='required') to more epochs."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from sparkdist.persist import load_model

LEGACY = Path(__file__).resolve().parents[1] / "data" / "legacy_15970eb"
_spec = importlib.util.spec_from_file_location("sparkdist_tests_make_legacy",
                                               LEGACY / "make_legacy.py")
make_legacy = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(make_legacy)
EXPECTED = json.loads((LEGACY / "expected.json").read_text())


@pytest.fixture(scope="module")
def rows() -> dict:
    return json.loads((LEGACY / "nonlinear.json").read_text())


def assert_scores_as_before(model, df, expected: list[dict]) -> None:
    got = make_legacy.scored(model, df, ("prediction", "probability"))
    assert [row["key"] for row in got] == [row["key"] for row in expected]
    assert [row["prediction"] for row in got] == [row["prediction"] for row in expected]
    for now, then in zip(got, expected):
        assert now["probability"] == pytest.approx(then["probability"], abs=1e-6), now["key"]


def test_torch_model_loads_and_scores_as_before(spark, rows):
    import torch

    from sparkdist.models import TorchModel

    model = load_model(str(LEGACY / "torch_model"))
    assert isinstance(model, TorchModel)
    assert [e["loss"] for e in model.history] == [e["loss"] for e in EXPECTED["torch_history"]]
    assert_scores_as_before(model, make_legacy.nonlinear_frame(spark, rows), EXPECTED["torch"])
    again = TorchModel.load(str(LEGACY / "torch_model")).module().state_dict()
    assert all(torch.equal(again[k], v) for k, v in model.module().state_dict().items())


def test_xgboost_model_loads_and_scores_as_before(spark, rows):
    from sparkdist.models import XGBoostClassificationModel

    model = load_model(str(LEGACY / "xgboost_model"))
    assert isinstance(model, XGBoostClassificationModel)
    assert model.get_booster().num_boosted_rounds() == make_legacy.XGB["n_estimators"]
    assert_scores_as_before(model, make_legacy.nonlinear_frame(spark, rows, vector=True),
                            EXPECTED["xgboost"])


def test_assembler_and_logistic_pipeline_loads_and_scores_as_before(spark):
    import pandas as pd
    from pyspark.sql import functions as F

    model = load_model(str(LEGACY / "lr_pipeline"))
    assert [type(stage).__name__ for stage in model.stages] == [
        "FeatureAssemblerModel", "LogisticRegressionModel"]
    churn = pd.read_json(LEGACY / "churn.json", orient="records", convert_dates=False)
    df = spark.createDataFrame(churn).withColumn("key", F.col("customer_id"))
    assert_scores_as_before(model, df, EXPECTED["lr_pipeline"])


@pytest.mark.slow
def test_checkpointed_run_resumes_to_more_epochs(spark, rows, tmp_path):
    from sparkdist.models import TorchEstimator

    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(LEGACY / "torch_checkpoints", checkpoints)  # the fit writes into it
    settings = {**make_legacy.TORCH, "epochs": 2}
    model = TorchEstimator(checkpointDir=str(checkpoints), runId=make_legacy.RUN_ID,
                           resume="required", **settings).fit(
        make_legacy.nonlinear_frame(spark, rows))
    assert model.trainingSummary["resumed_from_epoch"] == 1
    assert [e["epoch"] for e in model.history] == [1, 2]
    assert model.history[0]["loss"] == EXPECTED["torch_history"][0]["loss"]
    assert model.history[1]["loss"] < model.history[0]["loss"]
