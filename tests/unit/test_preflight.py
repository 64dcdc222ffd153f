"""Slot arithmetic and num_workers errors of sparkdist.launch.preflight, without Spark: a
session-like object that only has a conf (as on Spark Connect, where no scheduler is reachable)."""

from __future__ import annotations

import logging

import pytest

from sparkdist.exceptions import ClusterConfigError
from sparkdist.launch import check_num_workers, configured_slots, task_slots


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class ConfOnlySession:
    """Has ``conf`` but no ``sparkContext``, like a Spark Connect session."""

    def __init__(self, **conf: str) -> None:
        self.conf = _Conf({k.replace("_", "."): v for k, v in conf.items()})


@pytest.mark.parametrize("conf, slots", [
    ({"spark.master": "local"}, 1),
    ({"spark.master": "local[2]"}, 2),
    ({"spark.master": "local[4, 3]"}, 4),
    ({"spark.master": "local[4]", "spark.task.cpus": "2"}, 2),
    ({"spark.master": "local-cluster[2,3,1024]"}, 6),
    ({"spark.master": "spark://h:7077", "spark.executor.instances": "3",
      "spark.executor.cores": "4", "spark.task.cpus": "2"}, 6),
    ({"spark.master": "spark://h:7077", "spark.cores.max": "8", "spark.task.cpus": "2"}, 4),
    ({"spark.master": "spark://h:7077"}, None),
    ({"spark.master": "yarn", "spark.executor.instances": "5"}, None),
])
def test_configured_slots(conf, slots):
    assert configured_slots(conf) == slots


def test_local_star_counts_cpus():
    assert configured_slots({"spark.master": "local[*]"}) >= 1


def test_task_slots_falls_back_to_conf():
    assert task_slots(ConfOnlySession(spark_master="local-cluster[2,1,1024]")) == 2


def test_too_many_workers_names_param_value_slots_and_fix():
    session = ConfOnlySession(spark_master="local[2]")
    check_num_workers(session, 2)
    with pytest.raises(ClusterConfigError) as info:
        check_num_workers(session, 8, param="numWorkers")
    message = str(info.value)
    assert "numWorkers=8" in message and "2 task slots" in message
    assert "lower numWorkers or add executors (spark.executor.instances / " \
           "spark.executor.cores)" in message


def test_unknown_slots_warn_and_let_spark_decide(caplog):
    with caplog.at_level(logging.WARNING):
        check_num_workers(ConfOnlySession(spark_master="spark://h:7077"), 64)
    assert "skipping the num_workers check" in caplog.text
    with pytest.raises(ClusterConfigError, match="spark.executor.instances"):
        task_slots(ConfOnlySession(spark_master="spark://h:7077"))
