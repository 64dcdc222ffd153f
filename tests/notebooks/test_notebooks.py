"""The notebooks in notebooks/, run cell by cell on the shared local session, and the helpers
of sparkdist.notebook (parameters, the runner's errors, the "no Spark" message)."""

from __future__ import annotations

import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

from sparkdist import notebook as nb
from sparkdist.exceptions import ClusterConfigError, ParamError

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))


@pytest.fixture
def nb_env(tmp_path, monkeypatch):
    """MLflow in a temporary sqlite store, headless matplotlib, figures saved under tmp, and
    a working directory outside the repository (data paths must still resolve)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv(nb.ENV_FIGURE_DIR, str(tmp_path / "figures"))
    for name in ("NUM_TREES", "EPOCHS", "ROWS", "DATA_PATH"):
        monkeypatch.delenv(nb.ENV_PREFIX + name, raising=False)
    monkeypatch.chdir(tmp_path)
    import matplotlib

    matplotlib.use("Agg")
    return tmp_path


def _run(name: str, spark, **params):
    start = time.perf_counter()
    ns = nb.run_notebook(ROOT / "notebooks" / name, spark=spark, params=params)
    print(f"{name}: {time.perf_counter() - start:.1f} s")
    return ns


# ----------------------------------------------------------------------- the notebooks
@pytest.mark.slow
def test_churn_notebook(spark, nb_env):
    ns = _run("01_churn_classification.py", spark, num_trees=10, xgb_rounds=20)
    assert set(ns["metrics"]) == {"LogisticRegression", "RandomForestClassifier",
                                  "XGBoostClassifier"}
    for name, metrics in ns["metrics"].items():
        assert metrics["auc"] > 0.75, name
    assert sum(ns["parts"].metadata["counts"].values()) == 5000
    import mlflow

    runs = mlflow.search_runs(experiment_names=["sparkdist-churn-notebook"],
                              output_format="list")
    assert ns["result"].run_id in {r.info.run_id for r in runs}
    assert len(runs) == 4  # the workflow run and one nested run per model
    assert len(list((nb_env / "figures").glob("roc_curve_*.png"))) == 3


@pytest.mark.slow
def test_recommendations_notebook(spark, nb_env):
    ns = _run("02_recommendations_als.py", spark, max_iter=5, k=5)
    metrics = ns["metrics"]
    assert 0 < metrics["rmse"] < 1.0
    assert {"precision@5", "ndcg@5", "map@5", "recall@5"} <= set(metrics)
    assert sorted(ns["by_k"]) == [1, 5]
    first = ns["recommendations"].orderBy("user_id").first()
    assert first["user_id"].startswith("u") and first["recommendations"][0]["item_id"][0] == "i"
    assert len(first["recommendations"]) == 5


@pytest.mark.slow
def test_deep_learning_notebook(spark, nb_env):
    ns = _run("03_deep_learning_on_gpus.py", spark, epochs=3,
              checkpoint_dir=str(nb_env / "ckpt"))
    assert [h["epoch"] for h in ns["model"].history] == [1, 2, 3]
    assert ns["metrics"]["auc"] > 0.7
    assert ns["keras_metrics"]["auc"] > 0.7
    trials = ns["tuned"].trials.collect()
    assert len(trials) == 4 and {t.state for t in trials} <= {"COMPLETE", "PRUNED"}
    assert ns["tuned"].bestValue > 0.7
    assert ns["first"].trainingSummary["resumed_from_epoch"] is None
    assert ns["resumed"].trainingSummary["resumed_from_epoch"] == 2
    assert [h["epoch"] for h in ns["resumed"].history] == [1, 2, 3, 4]
    assert (nb_env / "ckpt" / "demo").is_dir()
    assert ns["gpu_scheduled"] is False  # the test session schedules no GPUs
    # fsdp: each rank holds at most half the whole training state, under the budget
    assert ns["whole_mb"] > ns["budget_mb"]
    assert len(ns["held"]) == 2 and all(held <= 0.55 * ns["whole_mb"] for held in ns["held"])
    assert ns["sharded"].trainingSummary["strategy"] == "fsdp"


# ----------------------------------------------------------------- notebook format
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebooks_are_thin_databricks_sources(path):
    assert path.read_text().startswith(nb.HEADER + "\n")
    cells = nb.read_cells(path)
    assert cells[0].is_markdown and len(cells) >= 5
    for cell in cells:
        compile(cell.source, f"{path.name} cell {cell.number}", "exec")
        lines = cell.source.splitlines()
        assert not any(s.startswith(("def ", "class ")) for s in lines), (
            f"{path.name} cell {cell.number}: keep logic in sparkdist, not in the notebook")
    assert len(NOTEBOOKS) == 3


# -------------------------------------------------------------------------- the runner
NOTEBOOK = """# Databricks notebook source
# MAGIC %md
# MAGIC # A test notebook

# COMMAND ----------

from sparkdist import notebook as nb

rows = nb.param("rows", 10)

# COMMAND ----------

total = rows * 2
raise ValueError(f"boom after {total}")
"""


def test_runner_error_names_the_cell(tmp_path):
    path = tmp_path / "demo.py"
    path.write_text(NOTEBOOK)
    with pytest.raises(nb.NotebookError) as info:
        nb.run_notebook(path)
    message = str(info.value)
    assert "demo.py: cell 3 (line 13, 'total = rows * 2') failed at line 14" in message
    assert "ValueError: boom after 20" in message
    assert isinstance(info.value.__cause__, ValueError)
    frames = traceback.extract_tb(info.value.__cause__.__traceback__)
    assert (frames[-1].filename, frames[-1].lineno) == (str(path.resolve()), 14)


def test_runner_wrong_widget_type_names_the_widget(tmp_path):
    path = tmp_path / "demo.py"
    path.write_text(NOTEBOOK)
    with pytest.raises(nb.NotebookError, match="cell 2") as info:
        nb.run_notebook(path, params={"rows": "many"})
    cause = info.value.__cause__
    assert isinstance(cause, ParamError)
    assert "widget 'rows'" in str(cause) and "an integer" in str(cause)


def test_runner_keeps_the_namespace_and_refuses_other_files(tmp_path):
    path = tmp_path / "demo.py"
    path.write_text(NOTEBOOK.replace('raise ValueError(f"boom after {total}")', ""))
    ns = nb.run_notebook(path, params={"rows": 4})
    assert ns["total"] == 8
    other = tmp_path / "plain.py"
    other.write_text("x = 1\n")
    with pytest.raises(nb.NotebookError, match="Databricks notebook source"):
        nb.run_notebook(other)


# --------------------------------------------------------------------------- param()
def test_param_reads_env_and_converts(monkeypatch):
    monkeypatch.setenv("SPARKDIST_NB_EPOCHS", "8")
    monkeypatch.setenv("SPARKDIST_NB_TRACK", "no")
    monkeypatch.setenv("SPARKDIST_NB_LEARNING_RATE", "0.01")
    assert nb.param("epochs", 4) == 8
    assert nb.param("track", True) is False
    assert nb.param("learning_rate", 1e-3) == pytest.approx(0.01)
    assert nb.param("name", "x") == "x"
    assert nb.param("maybe", None, type=int) is None


@pytest.mark.parametrize(("value", "default", "expected"), [
    ("2.5", 4, "an integer"), ("lots", 0.1, "a number"), ("maybe", True, "a boolean")])
def test_param_wrong_type_names_widget_and_type(monkeypatch, value, default, expected):
    monkeypatch.setenv("SPARKDIST_NB_SETTING", value)
    with pytest.raises(ParamError) as info:
        nb.param("setting", default)
    assert "widget 'setting'" in str(info.value) and expected in str(info.value)
    assert "SPARKDIST_NB_SETTING" in str(info.value)


class _Widgets:
    def __init__(self, values: dict[str, str]) -> None:
        self.values, self.created = values, {}

    def text(self, name: str, default: str, label: str) -> None:
        self.created[name] = (default, label)
        self.values.setdefault(name, default)

    def get(self, name: str) -> str:
        return self.values[name]


class _DbUtils:
    def __init__(self, values: dict[str, str]) -> None:
        self.widgets = _Widgets(values)


def test_param_uses_databricks_widgets(monkeypatch):
    dbutils = _DbUtils({"epochs": "12"})
    monkeypatch.setattr(sys.modules["__main__"], "dbutils", dbutils, raising=False)
    monkeypatch.setenv("SPARKDIST_NB_EPOCHS", "3")  # a widget wins on Databricks
    assert nb.param("epochs", 4) == 12
    assert nb.param("track", True) is True
    assert dbutils.widgets.created == {"epochs": ("4", "epochs"), "track": ("true", "track")}
    dbutils.widgets.values["epochs"] = "twelve"
    with pytest.raises(ParamError, match="widget 'epochs' \\(Databricks widget\\)"):
        nb.param("epochs", 4)


# ------------------------------------------------------------- session, paths, show
def test_no_spark_available_message_in_a_subprocess(tmp_path):
    code = ("from sparkdist.notebook import spark_session\n"
            "from sparkdist.exceptions import ClusterConfigError\n"
            "try:\n    spark_session(master='local[1]')\n"
            "except ClusterConfigError as err:\n    print('MESSAGE', err)\n")
    env = {"PATH": "/usr/bin:/bin", "JAVA_HOME": str(tmp_path / "no-java"),
           "SPARK_LOCAL_IP": "127.0.0.1", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120, cwd=tmp_path)
    message = next(line for line in out.stdout.splitlines() if line.startswith("MESSAGE"))
    assert "Spark is not available" in message
    assert f"JAVA_HOME={tmp_path / 'no-java'} has no bin/java" in message


def test_no_spark_message_for_missing_pyspark():
    message = nb.spark_unavailable_message(ImportError("No module named 'pyspark'"))
    assert "No module named 'pyspark'" in message and "pip install" in message
    assert issubclass(ClusterConfigError, RuntimeError)


def test_find_path_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert nb.find_path("data/churn_sample.parquet") == str(ROOT / "data/churn_sample.parquet")
    assert nb.find_path("dbfs:/mnt/x.parquet") == "dbfs:/mnt/x.parquet"
    with pytest.raises(ParamError, match="no_such.parquet"):
        nb.find_path("data/no_such.parquet")


def test_show_prefers_display_and_falls_back_to_print(capsys, tmp_path):
    import pandas as pd

    nb.show(pd.DataFrame({"a": [1, 2]}))
    assert "a" in capsys.readouterr().out
    shown: list = []
    path = tmp_path / "nb.py"
    path.write_text(nb.HEADER + "\nfrom sparkdist import notebook as nb\nnb.show(42)\n")
    nb.run_notebook(path, namespace={"display": shown.append})
    assert shown == [42]
