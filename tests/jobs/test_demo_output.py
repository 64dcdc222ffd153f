"""`make demo` reads like a report: jobs/train.py without a config runs both demo jobs (churn
with every classifier family, then ratings with ALS) and prints sparkdist's progress lines, no
one else's progress bars or INFO logs, and the comparison tables at the end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHURN_MODELS = ("LogisticRegression", "RandomForestClassifier", "XGBoostClassifier",
                "TorchEstimator")
PROGRESS = re.compile(r"^\s*\d+\.\ds  (churn|ratings): ")


def _tables(lines: list[str]) -> list[dict[str, dict[str, float]]]:
    """Each comparison table (a "model  fit s  ..." header, a rule, then rows) as
    {model: {column: value}}."""
    tables = []
    for i, line in enumerate(lines):
        if line.startswith("model ") and "fit s" in line and set(lines[i + 1]) == {"-"}:
            columns = line.replace("fit s", "fit_s").split()[1:]
            rows = {}
            for row in lines[i + 2:]:
                cells = row.split()
                if len(cells) != len(columns) + 1:
                    break
                rows[cells[0]] = dict(zip(columns, map(float, cells[1:])))
            tables.append(rows)
    return tables


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """jobs/train.py as `make demo` runs it, MLflow in a fresh sqlite file."""
    tmp = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlruns.db"}
    for key in ("PYSPARK_SUBMIT_ARGS", "SPARK_SUBMIT_OPTS", "MLFLOW_LOGGING_LEVEL",
                "SPARKDIST_LOG_LEVEL", "SPARK_REMOTE", "SPARKDIST_MASTER"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(ROOT / "jobs" / "train.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=570)
    return proc


@pytest.mark.slow
def test_demo_ends_with_the_comparison_tables(demo):
    assert demo.returncode == 0, demo.stderr[-3000:]
    lines = demo.stdout.splitlines()
    churn, ratings = _tables(lines)
    assert set(churn) == set(CHURN_MODELS)
    for name, row in churn.items():
        assert row["auc"] > 0.75, name
        assert 0 < row["logloss"] < 0.69, name  # better than a coin
        assert {"accuracy", "f1", "logloss", "pr_auc"} <= set(row), name
    assert set(ratings) == {"ALS"}
    assert 0 < ratings["ALS"]["rmse"] < 0.6  # ratings have std ~0.95; the noise is 0.25
    assert {"mae", "ndcg@10", "precision@10", "recall@10", "map@10"} <= set(ratings["ALS"])
    assert 0 <= ratings["ALS"]["ndcg@10"] <= 1
    assert len(re.findall(r"^MLflow run [0-9a-f]{32} \(sqlite:", demo.stdout, re.M)) == 2
    # The progress lines come first, the report after the last of them.
    progress = [i for i, line in enumerate(lines) if PROGRESS.match(line)]
    assert progress and {"churn", "ratings"} == {PROGRESS.match(lines[i])[1] for i in progress}
    header = next(i for i, line in enumerate(lines) if line.startswith("model "))
    assert progress[-1] < header


@pytest.mark.slow
def test_demo_shows_no_other_progress_or_info_logs(demo):
    assert demo.returncode == 0, demo.stderr[-3000:]
    output = demo.stdout + demo.stderr
    assert "[Stage" not in output  # Spark's console progress bar
    assert not re.findall(r"^.*\bINFO\b.*$", output, re.M)  # Spark, XGBoost, MLflow, py4j
    assert "netlib" not in output  # "dlopen(libblas.so.3) failed": no native BLAS here
    assert "log4j profile" not in output and "Setting default log level" not in output
    assert "%|" not in output  # TorchEstimator's tqdm bar: the workflow reports progress
    assert "[sparkdist rank" not in output  # the ranks' lines on the local console
