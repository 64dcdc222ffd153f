"""get_spark against the live test session."""

from __future__ import annotations

import pytest

from sparkdist.session import get_spark


def test_returns_the_active_session(spark):
    assert get_spark() is spark


def test_local_defaults_applied(spark):
    conf = spark.conf
    assert conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.sql.shuffle.partitions") == "2"  # the fixture's explicit conf wins


# -- round 3: N8 launch-time conf on a running JVM, N9 the daemon's preload --------------------
def test_launch_time_conf_on_a_running_jvm_is_named_in_a_warning(spark, caplog):
    import logging

    caplog.set_level(logging.WARNING, "sparkdist.session")
    asked = {"spark.driver.memory": "3g", "spark.driver.extraJavaOptions": "-Dx=1",
             "spark.sql.shuffle.partitions": "2"}
    assert get_spark(master="local[2]", conf=asked) is spark
    warned = [r.getMessage() for r in caplog.records if "runs already" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    assert "spark.driver.memory" in warned[0] and "spark.driver.extraJavaOptions" in warned[0]
    assert "shuffle" not in warned[0]  # a runtime key is no launch-time key


def test_preload_needs_an_executor_python_that_imports_the_daemon(monkeypatch, tmp_path):
    """The executors' Python decides: this one preloads; another one that cannot import
    sparkdist (here the base interpreter of this virtualenv: the same file as its
    bin/python, without its packages) gets pyspark's own daemon."""
    import subprocess
    import sys

    from sparkdist.launch import daemon
    from sparkdist.session import ENV_PRELOAD, preload_conf

    monkeypatch.delenv(ENV_PRELOAD, raising=False)
    monkeypatch.chdir(tmp_path)  # not the source tree: `python -c` would import it from there
    preloaded = {daemon.CONF: daemon.MODULE}
    assert preload_conf("local[2]", {"spark.pyspark.python": sys.executable}) == preloaded
    base = getattr(sys, "_base_executable", sys.executable)
    if subprocess.run([base, "-c", "import sparkdist"], capture_output=True).returncode == 0:
        pytest.skip("the base interpreter imports sparkdist too")
    assert preload_conf("local[2]", {"spark.pyspark.python": base}) == {}
    monkeypatch.setenv("PYSPARK_PYTHON", base)
    assert preload_conf("local[2]", {}) == {}
    assert preload_conf("local[2]", {daemon.CONF: "pyspark.daemon"}) == {}  # chosen: kept
    assert preload_conf("spark://host:7077", {}) == {}  # executors elsewhere: unless asked
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    assert preload_conf("spark://127.0.0.1:7077", {}) == preloaded  # workers on loopback
    monkeypatch.setenv(ENV_PRELOAD, "1")  # the user says the executors import sparkdist
    assert preload_conf("spark://host:7077", {}) == preloaded
    assert preload_conf("yarn", {daemon.CONF: "pyspark.daemon"}) == {}  # chosen: kept


@pytest.mark.parametrize("value", ["0", "false"])
def test_preload_switched_off(monkeypatch, value):
    import sys

    from sparkdist.session import ENV_PRELOAD, preload_conf

    monkeypatch.setenv(ENV_PRELOAD, value)
    assert preload_conf("local[2]", {"spark.pyspark.python": sys.executable}) == {}


def test_preload_switch_with_another_value_is_a_config_error(monkeypatch):
    from sparkdist.exceptions import ClusterConfigError
    from sparkdist.session import ENV_PRELOAD, preload_conf

    monkeypatch.setenv(ENV_PRELOAD, "maybe")
    with pytest.raises(ClusterConfigError, match="SPARKDIST_PRELOAD"):
        preload_conf("local[2]", {})
