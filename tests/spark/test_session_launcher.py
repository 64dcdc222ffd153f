"""get_spark() never overrides what the launcher set: spark-submit's --master/--conf and
PYSPARK_SUBMIT_ARGS win over its arguments, $SPARKDIST_MASTER and its local defaults, which
only fill in the keys the launcher left unset. Each case is its own driver process (a launcher
acts once per JVM), on a local master, so no cluster is needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

KEYS = ("spark.master", "spark.driver.host", "spark.sql.shuffle.partitions",
        "spark.sql.execution.arrow.pyspark.enabled", "spark.app.name", "spark.x")
# Asks for another master and other values than the launcher's, in every way get_spark takes.
DRIVER = f"""
import json, os
os.environ["SPARKDIST_MASTER"] = "local[2]"
os.environ["SPARKDIST_CONF_spark__sql__shuffle__partitions"] = "5"
from sparkdist.session import get_spark
spark = get_spark(master="local[2]", conf={{"spark.x": "from-code",
                                          "spark.driver.host": "127.0.0.1"}})
print("RESULT " + json.dumps({{k: spark.conf.get(k, None) for k in {KEYS!r}}}))
spark.stop()
"""
LAUNCHER_CONF = {"spark.x": "from-launcher", "spark.driver.host": "localhost",
                 "spark.sql.shuffle.partitions": "7", "spark.ui.enabled": "false"}


def _run(command: list[str], tmp_path: Path, **env: str) -> dict[str, str | None]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SPARKDIST_", "PYSPARK_SUBMIT_ARGS"))}
    done = subprocess.run(command, cwd=tmp_path, env={**clean, **env}, capture_output=True,
                          text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def _launcher_args() -> list[str]:
    args = ["--master", "local[1]"]
    for key, value in LAUNCHER_CONF.items():
        args += ["--conf", f"{key}={value}"]
    return args


def _expect_launcher_wins(seen: dict[str, str | None]) -> None:
    assert seen["spark.master"] == "local[1]"  # not the argument, not $SPARKDIST_MASTER
    assert seen["spark.x"] == "from-launcher"
    assert seen["spark.driver.host"] == "localhost"
    assert seen["spark.sql.shuffle.partitions"] == "7"
    assert seen["spark.sql.execution.arrow.pyspark.enabled"] == "true"  # unset: filled in


@pytest.mark.slow
def test_pyspark_submit_args_win(tmp_path):
    submit_args = " ".join([*_launcher_args(), "pyspark-shell"])
    seen = _run([sys.executable, "-c", DRIVER], tmp_path, PYSPARK_SUBMIT_ARGS=submit_args)
    _expect_launcher_wins(seen)
    assert seen["spark.app.name"] == "sparkdist"  # pyspark's placeholder name is no choice


@pytest.mark.slow
def test_spark_submit_master_and_conf_win(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    submit = str(Path(sys.executable).with_name("spark-submit"))
    seen = _run([submit, *_launcher_args(), str(script)], tmp_path,
                PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    _expect_launcher_wins(seen)
    assert seen["spark.app.name"] == "driver.py"  # spark-submit's name for the app


@pytest.mark.slow
def test_without_a_launcher_master_the_arguments_apply(tmp_path):
    seen = _run([sys.executable, "-c", DRIVER], tmp_path)
    assert seen["spark.master"] == "local[2]"
    assert seen["spark.x"] == "from-code" and seen["spark.driver.host"] == "127.0.0.1"
    assert seen["spark.sql.shuffle.partitions"] == "5"


BAR = """
import json
from sparkdist.session import get_spark
spark = get_spark(master="local[1]")
print("RESULT " + json.dumps({"bar": spark.conf.get("spark.ui.showConsoleProgress", None)}))
spark.stop()
"""


@pytest.mark.slow
def test_console_progress_bar_is_off_unless_the_launcher_turns_it_on(tmp_path):
    # pyspark's own gateway is a "pyspark-shell", for which spark-submit turns the bar on when
    # nobody chose: that is no choice; a --conf in PYSPARK_SUBMIT_ARGS is, and wins.
    assert _run([sys.executable, "-c", BAR], tmp_path)["bar"] == "false"
    asked = "--conf spark.ui.showConsoleProgress=true pyspark-shell"
    assert _run([sys.executable, "-c", BAR], tmp_path, PYSPARK_SUBMIT_ARGS=asked)["bar"] == "true"


# -- launch-time conf and the executors' Python (round 3: N8, N9): one driver process ---------
LAUNCH = """
import json
from pyspark.sql import functions as F
from sparkdist.session import get_spark
spark = get_spark(master="local[1]", conf={"spark.driver.memory": "1500m",
                  "spark.driver.extraJavaOptions": "-Dsparkdist.flag=yes"})
jvm = spark.sparkContext._jvm
doubled = spark.range(3).select(F.udf(lambda x: x * 2, "long")("id")).collect()
print("RESULT " + json.dumps({
    "heap_mib": jvm.java.lang.Runtime.getRuntime().maxMemory() // 2**20,
    "flag": jvm.java.lang.System.getProperty("sparkdist.flag"),
    "class_path": jvm.java.lang.System.getProperty("java.class.path"),
    "daemon": spark.conf.get("spark.python.daemon.module", None),
    "doubled": sorted(row[0] for row in doubled)}))
spark.stop()
"""


def _python_without_sparkdist(where: Path) -> str:
    """A Python that imports pyspark but not sparkdist (as a conda or system Python would):
    the base interpreter of this virtualenv, with its site-packages on PYTHONPATH (a plain
    path: the editable install's .pth finder there does not run)."""
    import sysconfig

    base = getattr(sys, "_base_executable", sys.executable)
    script = where / "python-without-sparkdist"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{sysconfig.get_paths()["purelib"]}'
                      f'${{PYTHONPATH:+:$PYTHONPATH}}" exec "{base}" "$@"\n')
    script.chmod(0o755)
    probe = subprocess.run([str(script), "-c", "import pyspark, sparkdist"], cwd=where,
                           capture_output=True, text=True, timeout=120)
    if "No module named 'sparkdist'" not in probe.stderr:
        pytest.skip(f"no interpreter without sparkdist here: {probe.stderr[-300:]}")
    return str(script)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    where = tmp_path_factory.mktemp("launch")
    (where / "extra").mkdir()
    return _run([sys.executable, "-c", LAUNCH], where,
                PYSPARK_PYTHON=_python_without_sparkdist(where),
                SPARKDIST_CONF_spark__driver__extraClassPath=str(where / "extra"))


@pytest.mark.slow
def test_launch_time_conf_reaches_the_jvm_get_spark_starts(launched):
    assert 1300 < launched["heap_mib"] <= 1500  # -Xmx1500m, not the default 1g
    assert launched["flag"] == "yes"
    # from $SPARKDIST_CONF_spark__driver__extraClassPath
    assert any(entry.rstrip("/").endswith("/extra")
               for entry in launched["class_path"].split(os.pathsep))


@pytest.mark.slow
def test_udfs_work_when_the_executors_python_lacks_sparkdist(launched):
    assert launched["doubled"] == [0, 2, 4]
    assert launched["daemon"] is None  # pyspark's own daemon: the probe failed
