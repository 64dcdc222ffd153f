"""The SparkSession sparkdist works in: the active one, or a local one with sane defaults."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Environment variables read by :func:`get_spark` (arguments win over them).
ENV_MASTER = "SPARKDIST_MASTER"
ENV_LOG_LEVEL = "SPARKDIST_LOG_LEVEL"
ENV_CONF_PREFIX = "SPARKDIST_CONF_"  # SPARKDIST_CONF_spark__executor__memory=2g


def get_spark(
    master: str | None = None,
    app_name: str = "sparkdist",
    conf: Mapping[str, str] | None = None,
    log_level: str | None = None,
) -> SparkSession:
    """Return the active SparkSession, or build a local one.

    On Databricks, in a spark-submit job or in a notebook that already has ``spark``,
    the active session is returned untouched. Otherwise a session is built on ``master``
    (argument, else ``$SPARKDIST_MASTER``, else ``local[*]``) with Arrow enabled, the
    driver bound to 127.0.0.1 in local modes, shuffle partitions sized to the cores and
    WARN logs. ``conf`` and ``SPARKDIST_CONF_<key with '.' written '__'>`` add Spark conf.

    Examples
    --------
    >>> spark = get_spark(master="local[2]", conf={"spark.ui.enabled": "false"})
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    master = master or os.environ.get(ENV_MASTER, "local[*]")
    settings = {**_default_conf(master), **_env_conf(), **dict(conf or {})}
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level or os.environ.get(ENV_LOG_LEVEL, "WARN"))
    return spark


def _default_conf(master: str) -> dict[str, str]:
    conf = {"spark.sql.execution.arrow.pyspark.enabled": "true"}
    if master.startswith("local"):
        conf["spark.sql.shuffle.partitions"] = str(_local_cores(master))
        # The hostname may resolve to an interface executors cannot reach; loopback always works.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    return conf


def _local_cores(master: str) -> int:
    """Task slots of a local master: local -> 1, local[4] -> 4, local[*] -> CPUs,
    local-cluster[2,1,1024] -> 2."""
    if "[" not in master:
        return 1
    inner = master[master.find("[") + 1 : master.find("]")]
    if master.startswith("local-cluster"):
        workers, cores = inner.split(",")[:2]
        return int(workers) * int(cores)
    head = inner.split(",")[0]
    return int(head) if head.isdigit() else (os.cpu_count() or 1)


def _env_conf() -> dict[str, str]:
    return {
        key[len(ENV_CONF_PREFIX) :].replace("__", "."): value
        for key, value in os.environ.items()
        if key.startswith(ENV_CONF_PREFIX)
    }
