"""Preflight and ``sparkdist doctor`` against real Spark: the local[2] session fixture, and one
``sparkdist doctor`` process on its own local[1] application with a conf that must be refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkdist import cli
from sparkdist.exceptions import ClusterConfigError
from sparkdist.launch.preflight import findings, preflight

#: The issue's budget for preflight on a healthy cluster.
BUDGET_S = 5.0


def test_healthy_session_passes_within_budget(spark):
    start = time.monotonic()
    found = preflight(spark, 2)
    elapsed = time.monotonic() - start
    assert elapsed < BUDGET_S, f"preflight took {elapsed:.2f} s"
    assert [(f.check, f.severity) for f in found] == [
        ("dynamic-allocation", "ok"), ("gpu", "ok"), ("security", "ok"), ("task-slots", "ok")]
    assert found[-1].message == "numWorkers=2 fits the 2 task slot(s)."


def test_too_many_workers_fail_at_once(spark):
    start = time.monotonic()
    with pytest.raises(ClusterConfigError) as info:
        preflight(spark, 3, param="num_workers")
    assert time.monotonic() - start < BUDGET_S  # no 10-minute barrier wait, no 30 s poll
    assert "num_workers=3 exceeds the 2 task slots" in str(info.value)


def test_gpu_required_on_a_cpu_session_names_the_conf(spark):
    with pytest.raises(ClusterConfigError, match=r"set spark\.task\.resource\.gpu\.amount=1"):
        preflight(spark, 1, use_gpu=True)


def test_findings_read_the_session_conf(spark):
    [slots] = [f for f in findings(spark) if f.check == "task-slots"]
    assert (slots.key, slots.value) == ("spark.master", "local[2]")
    assert "2 task slot(s)" in slots.message


def test_doctor_in_process_uses_the_active_session(spark, capsys):
    assert cli.main(["doctor", "--num-workers", "2"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("sparkdist doctor: local[2]\n")
    assert text.rstrip().endswith("0 error(s), 0 warning(s): ready for sparkdist training.")
    assert cli.main(["doctor", "--num-workers", "3", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["master"] == "local[2]"
    [error] = [f for f in out["findings"] if f["severity"] == "error"]
    assert error["check"] == "task-slots" and "numWorkers=3" in error["message"]


@pytest.mark.slow
def test_doctor_command_refuses_a_misconfigured_application(tmp_path):
    """The installed console script, its own Spark application, conf from the environment."""
    script = Path(sys.executable).with_name("sparkdist")
    if not script.exists():
        pytest.skip("the sparkdist console script is not installed (pip install -e .)")
    env = {**os.environ, "SPARKDIST_MASTER": "local[1]",
           "SPARKDIST_CONF_spark__ui__enabled": "false",
           "SPARKDIST_CONF_spark__dynamicAllocation__enabled": "true",
           "SPARKDIST_CONF_spark__authenticate": "true"}
    done = subprocess.run([str(script), "doctor", "--num-workers", "1", "--gpu", "--json"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["master"] == "local[1]"
    assert [(f["check"], f["severity"], f["key"]) for f in out["findings"]] == [
        ("dynamic-allocation", "warning", "spark.dynamicAllocation.enabled"),
        ("gpu", "error", "spark.task.resource.gpu.amount"),
        ("security", "error", "spark.authenticate"),
        ("task-slots", "ok", "spark.master")]
