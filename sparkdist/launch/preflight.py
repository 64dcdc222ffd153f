"""Checks that run on the driver before a barrier stage is launched.

A barrier stage needs all of its tasks running at once. Asked for more tasks than the cluster
has slots, Spark does not fail straight away: it re-checks every 15 s, 40 times by default
(``spark.scheduler.barrier.maxConcurrentTasksCheck.*``), so a typo in ``num_workers`` costs
ten minutes. These checks turn that into an immediate, explained error.

Examples
--------
>>> task_slots(spark)                      # local[2] -> 2
2
>>> check_num_workers(spark, 8)            # doctest: +SKIP
ClusterConfigError: num_workers=8 exceeds the 2 task slots of this cluster; ...
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkdist.exceptions import ClusterConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG = logging.getLogger(__name__)
#: How long to wait for executors that the configuration promises but have not registered yet
#: (a freshly started local-cluster or standalone application).
REGISTRATION_WAIT_S = 30.0
_POLL_S = 0.5
_CONF_KEYS = ("spark.master", "spark.task.cpus", "spark.executor.instances",
              "spark.executor.cores", "spark.cores.max")


def task_slots(spark: SparkSession) -> int:
    """Number of tasks the cluster can run at once for the default resource profile.

    This is the figure Spark's barrier scheduler checks a stage against: the cores of the
    registered executors divided by ``spark.task.cpus`` (tasks already running are not
    subtracted; a barrier stage waits for them, it does not hang). Where the scheduler cannot
    be asked (Spark Connect), the figure comes from the configuration: the ``local[N]`` or
    ``local-cluster[N,C,M]`` master, ``spark.executor.instances * spark.executor.cores``, or
    a standalone ``spark.cores.max``.

    Parameters
    ----------
    spark : the active SparkSession.

    Returns
    -------
    int : the number of concurrent task slots (0 while no executor has registered).

    Raises
    ------
    ClusterConfigError : when neither the scheduler nor the configuration tells.

    Examples
    --------
    >>> task_slots(get_spark(master="local[2]"))
    2
    """
    slots = _scheduler_slots(spark)
    if slots is None:
        slots = configured_slots(_conf(spark))
    if slots is None:
        raise ClusterConfigError(
            "cannot tell how many task slots this cluster has: the scheduler is not reachable "
            "(Spark Connect?) and spark.executor.instances / spark.executor.cores are unset."
        )
    return slots


def check_num_workers(spark: SparkSession, num_workers: int, param: str = "num_workers",
                      wait_s: float = REGISTRATION_WAIT_S) -> None:
    """Raise :class:`ClusterConfigError` unless ``num_workers`` barrier tasks fit at once.

    When the configuration promises enough slots but executors are still registering, wait up
    to ``wait_s`` seconds for them; otherwise fail at once. When the slot count cannot be
    determined at all, log a warning and let Spark decide.

    Parameters
    ----------
    spark : the active SparkSession.
    num_workers : the number of barrier tasks the caller will launch.
    param : the name of the parameter that set ``num_workers``, quoted in the error.
    wait_s : the longest wait for promised executors to register.

    Examples
    --------
    >>> check_num_workers(spark, 2)                          # local[2]: fine
    >>> check_num_workers(spark, 8, param="numWorkers")      # doctest: +SKIP
    ClusterConfigError: numWorkers=8 exceeds the 2 task slots of this cluster; ...
    """
    try:
        slots = task_slots(spark)
    except ClusterConfigError as err:
        _LOG.warning("skipping the %s check: %s", param, err)
        return
    if slots < num_workers and (configured_slots(_conf(spark)) or 0) >= num_workers:
        slots = _wait_for_slots(spark, num_workers, wait_s)
    if slots < num_workers:
        raise ClusterConfigError(
            f"{param}={num_workers} exceeds the {slots} task slots of this cluster "
            f"(executor cores / spark.task.cpus), so its barrier stage could never start; "
            f"lower {param} or add executors (spark.executor.instances / "
            f"spark.executor.cores)."
        )


def configured_slots(conf: Mapping[str, str | None]) -> int | None:
    """Task slots implied by the configuration alone, or None when it does not say.

    Examples
    --------
    >>> configured_slots({"spark.master": "local-cluster[2,2,1024]"})
    4
    >>> configured_slots({"spark.master": "spark://h:7077", "spark.executor.instances": "3",
    ...                   "spark.executor.cores": "4", "spark.task.cpus": "2"})
    6
    """
    master = conf.get("spark.master") or ""
    cores = _local_cores(master) if master.startswith("local") else _executor_cores(conf)
    if cores is None:
        return None
    return cores // max(1, int(conf.get("spark.task.cpus") or 1))


def _local_cores(master: str) -> int:
    """local -> 1, local[4] / local[4,2] -> 4, local[*] -> CPUs, local-cluster[2,3,M] -> 6."""
    if "[" not in master:
        return 1
    fields = master[master.find("[") + 1: master.find("]")].split(",")
    if master.startswith("local-cluster"):
        return int(fields[0]) * int(fields[1])
    head = fields[0].strip()
    return int(head) if head.isdigit() else (os.cpu_count() or 1)


def _executor_cores(conf: Mapping[str, str | None]) -> int | None:
    """Executor instances x cores (YARN, Kubernetes), else a standalone spark.cores.max."""
    instances, cores = conf.get("spark.executor.instances"), conf.get("spark.executor.cores")
    if instances and cores:
        return int(instances) * int(cores)
    cap = conf.get("spark.cores.max")
    return int(cap) if cap else None


def _scheduler_slots(spark: SparkSession) -> int | None:
    """Ask the scheduler (classic Spark only), as its barrier check does; None elsewhere."""
    try:
        jsc: Any = spark.sparkContext._jsc.sc()  # type: ignore[union-attr]
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # Spark Connect has no SparkContext; old JVMs lack the method
        return None


def _conf(spark: SparkSession) -> dict[str, str | None]:
    conf: dict[str, str | None] = {}
    for key in _CONF_KEYS:
        try:
            conf[key] = spark.conf.get(key, None)
        except Exception:  # a static key Connect refuses to show
            conf[key] = None
    return conf


def _wait_for_slots(spark: SparkSession, wanted: int, wait_s: float) -> int:
    deadline = time.monotonic() + wait_s
    slots = task_slots(spark)
    while slots < wanted and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        slots = task_slots(spark)
    return slots
