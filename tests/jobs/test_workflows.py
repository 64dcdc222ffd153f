"""The workflow behind the CLI and jobs: configs end to end, MLflow, saved models, spark-submit.
The make demo's two configs whole (churn's four models, ratings' ALS) are
tests/jobs/test_demo_output.py's: here the CLI runs the parts the tests read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparkdist.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "jobs" / "configs"


def _config(tmp_path: Path, name: str, **changes) -> Path:
    raw = yaml.safe_load((CONFIGS / name).read_text())
    raw["data"] = {"path": str(ROOT / raw["data"]["path"])}
    raw["tracking"] = {**raw.get("tracking", {}), "uri": f"sqlite:///{tmp_path}/mlruns.db"}
    raw["output"] = {"modelDir": str(tmp_path / "models")}
    raw.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _last_json(text: str) -> dict:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


#: The churn.yaml models the tests below read back. The config's four models together are the
#: make demo's first job, run by tests/jobs/test_demo_output.py (metrics, logloss, table).
CHURN_MODELS = ("LogisticRegression", "RandomForestClassifier")


@pytest.fixture(scope="module")
def churn_run(spark, tmp_path_factory):
    """The make demo's churn config with :data:`CHURN_MODELS`, tracked in a temporary sqlite
    store."""
    tmp = tmp_path_factory.mktemp("churn")
    raw = yaml.safe_load((CONFIGS / "churn.yaml").read_text())
    config = _config(tmp, "churn.yaml",
                     models=[m for m in raw["models"] if m["type"] in CHURN_MODELS])
    return tmp, config


@pytest.mark.slow
def test_churn_config_end_to_end(churn_run, capsys):
    tmp, config = churn_run
    assert cli(["train", str(config)]) == 0
    out = capsys.readouterr().out
    report = _last_json(out)
    assert set(report["metrics"]) == set(CHURN_MODELS)
    for name, metrics in report["metrics"].items():
        assert metrics["auc"] > 0.75, name
        assert 0 < metrics["logloss"] < 0.69, name  # better than a coin
        assert name in out  # the comparison table
    assert report["run_id"]
    for name in report["metrics"]:
        assert (tmp / "models" / name / "metadata").is_dir()


@pytest.mark.slow
def test_mlflow_round_trip(churn_run, spark):
    import mlflow

    from sparkdist import tracking
    from sparkdist.persist import load_model

    tmp, _ = churn_run
    uri = f"sqlite:///{tmp}/mlruns.db"
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["sparkdist-churn"], output_format="list")
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId")}
    lr_run = children["LogisticRegression"]
    assert lr_run.data.metrics["auc"] > 0.75
    assert lr_run.data.params["maxIter"] == "10"
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(lr_run.info.run_id, "plots")}
    assert {"plots/roc_curve.png", "plots/precision_recall_curve.png",
            "plots/confusion_matrix.png", "plots/feature_importances.png"} <= artifacts
    # the workflow logs 5 training rows as the input example, in the signature's columns
    model_uri = f"runs:/{lr_run.info.run_id}/model"
    example = mlflow.artifacts.load_dict(f"{model_uri}/input_example.json")
    signature = mlflow.models.get_model_info(model_uri).signature
    assert example["columns"] == signature.inputs.input_names() == [
        "month_interaction_count", "week_interaction_count", "day_interaction_count", "plan",
        "region"]
    assert len(example["data"]) == 5
    logged = tracking.load_model(lr_run.info.run_id, uri=uri)
    saved = load_model(str(tmp / "models" / "LogisticRegression"))
    data = spark.read.parquet(str(ROOT / "data" / "churn_sample.parquet")).limit(200)
    assert (logged.transform(data).select("probability").collect()
            == saved.transform(data).select("probability").collect())


@pytest.mark.slow
def test_evaluate_and_predict_commands(churn_run, capsys, tmp_path):
    tmp, _ = churn_run
    model = str(tmp / "models" / "RandomForestClassifier")
    data = str(ROOT / "data" / "churn_sample.parquet")
    assert cli(["evaluate", model, data]) == 0
    assert _last_json(capsys.readouterr().out)["auc"] > 0.75
    out = str(tmp_path / "predictions")
    assert cli(["predict", model, data, out]) == 0
    import pandas as pd

    predicted = pd.read_parquet(out)
    assert len(predicted) == 5_000 and {"prediction", "probability"} <= set(predicted.columns)
    assert cli(["predict", model, data, out]) == 2  # exists: refused without --overwrite
    assert "--overwrite" in capsys.readouterr().err


def test_existing_model_dir_refused_before_training(tmp_path, capsys, spark):
    config = _config(tmp_path, "churn.yaml")
    (tmp_path / "models" / "LogisticRegression").mkdir(parents=True)
    assert cli(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "output.overwrite" in err


def test_bad_config_exits_2_with_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndata: {path: d}\nmodels: [{type: LogisticRegression, "
                   "params: {maxIters: 3}}]\n")
    assert cli(["train", str(bad)]) == 2
    assert "Did you mean 'maxIter'?" in capsys.readouterr().err


def test_evaluate_refuses_a_non_model_dir(tmp_path, capsys, spark):
    assert cli(["evaluate", str(tmp_path), str(tmp_path)]) == 2
    assert "is not a saved sparkdist model" in capsys.readouterr().err


@pytest.mark.slow
def test_churn_torch_config_logs_both_flavours(tmp_path, capsys, spark):
    import mlflow
    import mlflow.pytorch
    import numpy as np
    import torch

    from sparkdist import tracking

    raw = yaml.safe_load((CONFIGS / "churn_torch.yaml").read_text())
    # the TorchEstimator alone: the config's LogisticRegression is churn.yaml's, tested above
    config = _config(tmp_path, "churn_torch.yaml",
                     models=[m for m in raw["models"] if m["type"] == "TorchEstimator"])
    assert cli(["train", str(config)]) == 0
    report = _last_json(capsys.readouterr().out)
    assert report["metrics"]["TorchEstimator"]["auc"] > 0.75
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["sparkdist-churn-torch"], output_format="list")
    run = next(r for r in runs if r.info.run_name == "TorchEstimator")
    assert run.data.params["epochs"] == "8" and run.data.params["numWorkers"] == "2"
    pipeline = tracking.load_model(run.info.run_id, uri=uri)  # the Spark flavour
    data = spark.read.parquet(str(ROOT / "data" / "churn_sample.parquet")).limit(50)
    spark_probabilities = [row.probability[1] for row in pipeline.transform(data).collect()]
    network = mlflow.pytorch.load_model(f"runs:/{run.info.run_id}/torch_model")
    torch_model = pipeline.stages[-1]
    features = np.zeros((3, torch_model.inputDim), dtype=np.float32)
    with torch.no_grad():
        logged = network(torch.from_numpy(features))
        fitted = torch_model.module()(torch.from_numpy(features))
    assert torch.allclose(logged, fitted)
    assert all(0 < p < 1 for p in spark_probabilities)


@pytest.mark.slow
def test_spark_submit_runs_the_job(tmp_path):
    config = _config(tmp_path, "churn.yaml", models=[{"type": "LogisticRegression",
                                                       "params": {"maxIter": 10}}])
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         str(ROOT / "jobs" / "train.py"), str(config), "--no-tracking"],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _last_json(proc.stdout)["metrics"]["LogisticRegression"]["auc"] > 0.75
