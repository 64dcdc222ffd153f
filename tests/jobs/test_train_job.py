"""The main job, in-process and through a real spark-submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobs"))

import train  # noqa: E402


def _last_json(text: str) -> dict:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def test_job_on_committed_sample(spark, capsys, tmp_path):
    assert train.main(["--save", str(tmp_path / "model")]) == 0
    out = capsys.readouterr().out
    report = _last_json(out)
    assert "test AUC" in out and "test accuracy" in out
    assert report["metrics"]["auc"] > 0.75  # the generator's signal, well above chance
    counts = report["split"]["counts"]
    assert counts["train"] + counts["test"] == 5_000
    assert (tmp_path / "model" / "stages").is_dir()


def test_job_on_generated_rows(spark, capsys):
    assert train.main(["--rows", "3000", "--seed", "3"]) == 0
    report = _last_json(capsys.readouterr().out)
    assert sum(report["split"]["counts"].values()) == 3_000


def test_job_rejects_a_missing_data_path(spark, tmp_path):
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException, match="PATH_NOT_FOUND"):
        train.main(["--data", str(tmp_path / "nope.parquet")])


@pytest.mark.slow
def test_spark_submit_runs_the_job():
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         str(ROOT / "jobs" / "train.py"), "--rows", "2000"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _last_json(proc.stdout)["metrics"]["auc"] > 0.7
