"""sparkdist on Spark Connect: a local Connect server (pyspark's ``connect`` extra) runs a
classification workflow, a 2-worker TorchEstimator fit, ALS without checkpoints, and the
pieces that cannot work there raise a clear error.

The Connect scenarios run in ONE subprocess (``connect_driver.py``, one server start): the
test session already holds a classic local[2] session in this process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark import cloudpickle

from sparkdist.exceptions import ClusterConfigError, TrainingError
from sparkdist.launch.barrier import run_barrier
from sparkdist.session import get_spark, is_connect

pytest.importorskip("grpc", reason="needs the connect extra: pip install sparkdist[connect]")

DRIVER = Path(__file__).with_name("connect_driver.py")
EXIT_WITHIN_S = 30  # from the script's last line to its exit
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _sleep travels by value


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_server_names_the_url_and_fails_fast():
    url = f"sc://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(ClusterConfigError) as caught:
        get_spark(remote=url)
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert url in message and "Connection refused" in message
    assert "start-connect-server" in message and "SPARK_REMOTE" in message


def test_spark_remote_env_is_honoured(monkeypatch):
    url = f"sc://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("SPARK_REMOTE", url)
    with pytest.raises(ClusterConfigError, match=url):
        get_spark()


def test_a_malformed_url_says_how_to_write_one():
    with pytest.raises(ClusterConfigError, match="sc://host:port"):
        get_spark(remote="http://localhost:15002")


def test_classic_session_is_not_connect(spark):
    assert not is_connect(spark) and not is_connect(spark.range(1))


def _sleep(context, batches, args):
    time.sleep(args["sleep_s"])
    return b"done"


@pytest.mark.slow
def test_classic_job_timeout_still_cancels_the_job(spark):
    started = time.monotonic()
    with pytest.raises(TrainingError, match="cancelled after the timeout of 5 s"):
        run_barrier(spark.range(4), _sleep, {"sleep_s": 120}, 2, timeout_s=5)
    assert time.monotonic() - started < 5 + 10
    assert spark.range(3).count() == 3  # the session still runs jobs


# ------------------------------------------------------------------ on a Connect server
@pytest.fixture(scope="module")
def connect(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("connect")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
    env.pop("SPARK_REMOTE", None)
    errors = work / "driver.err"
    with errors.open("w") as stderr:
        driver = subprocess.Popen([sys.executable, str(DRIVER), str(work)], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=stderr)
        last = next((line for line in driver.stdout if line.startswith('{"is_connect"')), "")
        try:  # the script never stops its session: it must still end by itself (issue 19)
            driver.wait(timeout=EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait()
    exited_at = time.time()
    assert last, errors.read_text()[-4000:]
    result = json.loads(last)
    result["exit"] = {"code": driver.returncode, "after_last_line_s": exited_at -
                      result["last_line_at"]}
    assert result["is_connect"] is True
    return result


@pytest.mark.slow
def test_a_script_that_never_stops_its_session_exits_by_itself(connect):
    """The driver fits, evaluates, saves, loads and evaluates pipelines on a local Connect
    session made by get_spark() and ends without spark.stop() (issue 19: pyspark 4.3.0 hung)."""
    assert connect["exit"]["code"] == 0, connect["exit"]
    assert connect["exit"]["after_last_line_s"] < EXIT_WITHIN_S


def _ok(result: dict, name: str) -> dict:
    entry = result[name]
    assert "ok" in entry, f"{name}: {entry.get('error')}: {entry.get('where')}"
    return entry["ok"]


@pytest.mark.slow
def test_classification_fit_evaluate_save_load(connect):
    out = _ok(connect, "classification")
    assert out["counts"]["train"] > out["counts"]["test"] > 0
    for name, stage in (("lr", "LogisticRegressionModel"),
                        ("rfc", "RandomForestClassificationModel")):
        assert out[name]["auc"] > 0.7, name
        assert out[name]["same_predictions"], name
        assert out[name]["final_stage"] == stage


@pytest.mark.slow
def test_workflow_runs_and_saves(connect):
    out = _ok(connect, "workflow")
    assert out["metrics"]["LogisticRegression"]["auc"] > 0.75
    assert out["saved"] == ["LogisticRegression"]


@pytest.mark.slow
def test_two_worker_torch_fit_transform_save_load(connect):
    out = _ok(connect, "torch")
    losses = out["losses"]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert out["accuracy"] > 0.7
    assert out["same_after_load"]


@pytest.mark.slow
def test_two_worker_keras_fit_transform_save_load(connect):
    out = _ok(connect, "keras")
    losses = out["losses"]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert out["accuracy"] > 0.7
    assert out["same_after_load"]


@pytest.mark.slow
def test_torch_retries_are_bounded_from_the_failure_reports(connect):
    entry = connect["torch_bounded"]
    assert entry.get("error") == "TrainingError", entry
    assert "gave up after 2 failed attempt(s) (maxRetries=1)" in entry["message"]
    assert "FailpointError: failpoint torch.step fired (2): rank 1" in entry["message"]
    assert "output tail of rank 1" in entry["message"]


@pytest.mark.slow
def test_job_timeout_cancels_and_progress_reports_arrive(connect):
    out = _ok(connect, "timeout")
    assert "cancelled after the timeout of 6 s" in out["message"]
    assert out["seconds"] < 6 + 10
    assert out["reports"] == [{"rank": 0, "hello": True}]


@pytest.mark.slow
def test_als_refuses_checkpointing_clearly_and_fits_without(connect):
    out = _ok(connect, "als")
    assert "Spark Connect" in out["refused"] and "spark.checkpoint.dir" in out["refused"]
    assert "checkpointInterval=-1" in out["refused"]
    assert out["rows"] > 0 and out["same_after_load"]


@pytest.mark.slow
def test_xgboost_says_it_needs_a_classic_session(connect):
    entry = connect["xgboost"]
    assert entry.get("error") == "ClusterConfigError", entry
    assert "Spark Connect" in entry["message"] and "classic SparkSession" in entry["message"]
