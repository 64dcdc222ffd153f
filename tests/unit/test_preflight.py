"""sparkdist.launch.preflight without Spark: slot arithmetic, num_workers errors and the
configuration findings, on conf dicts or a session-like object that only has a conf (as on Spark
Connect, where no scheduler is reachable). The real-session tests are in tests/spark."""

from __future__ import annotations

import logging

import pytest

from sparkdist import cli
from sparkdist.exceptions import ClusterConfigError, ParamError
from sparkdist.launch import check_num_workers, configured_slots, task_slots
from sparkdist.launch.preflight import (
    UNENCRYPTED_OPT_IN,
    Finding,
    conf_findings,
    findings,
    preflight,
    report,
)

CLUSTER = {"spark.master": "spark://h:7077", "spark.executor.instances": "2",
           "spark.executor.cores": "4"}
GPU_CLUSTER = {**CLUSTER, "spark.task.resource.gpu.amount": "1",
               "spark.executor.resource.gpu.amount": "2"}


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
    # standalone: executors of spark.executor.cores until spark.cores.max
    ({"spark.master": "spark://h:7077", "spark.cores.max": "8", "spark.executor.cores": "3"}, 6),
    # GPUs cap the slots of an executor, as the scheduler counts them
    ({**GPU_CLUSTER, "spark.executor.resource.gpu.amount": "1"}, 2),
    ({"spark.master": "local-cluster[2,4,1024]", "spark.task.resource.gpu.amount": "1",
      "spark.executor.resource.gpu.amount": "2"}, 4),
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


def _by_check(found: list[Finding], check: str) -> list[Finding]:
    return [f for f in found if f.check == check]


def test_healthy_conf_is_all_ok():
    found = conf_findings(CLUSTER)
    assert [f.check for f in found] == ["dynamic-allocation", "gpu", "security"]
    assert {f.severity for f in found} == {"ok"}


def test_dynamic_allocation_on_a_cluster_is_an_error_naming_the_fix():
    [finding] = _by_check(conf_findings({**CLUSTER, "spark.dynamicAllocation.enabled": "true"}),
                          "dynamic-allocation")
    assert finding.severity == "error"
    assert finding.fix == "spark.dynamicAllocation.enabled=false"
    assert "spark.dynamicAllocation.enabled=true" in finding.message
    assert "set spark.dynamicAllocation.enabled=false" in finding.message


def test_dynamic_allocation_under_local_master_only_warns():
    # Spark ignores it in local[N], so barrier stages run; warn for the cluster to come.
    conf = {"spark.master": "local[2]", "spark.dynamicAllocation.enabled": "TRUE"}
    [finding] = _by_check(conf_findings(conf), "dynamic-allocation")
    assert finding.severity == "warning" and "spark.dynamicAllocation.enabled=false" in finding.fix


def test_gpu_required_but_not_scheduled_names_the_keys():
    [finding] = _by_check(conf_findings(CLUSTER, use_gpu=True), "gpu")
    assert finding.severity == "error" and finding.fix == "spark.task.resource.gpu.amount=1"
    for key in ("spark.task.resource.gpu.amount=1", "spark.executor.resource.gpu.amount",
                "spark.executor.resource.gpu.discoveryScript", "useGpu='auto'"):
        assert key in finding.message


@pytest.mark.parametrize("use_gpu, conf, severity", [
    ("auto", CLUSTER, "ok"),                 # no GPUs: CPU training
    (False, CLUSTER, "ok"),
    (True, GPU_CLUSTER, "ok"),
    ("auto", GPU_CLUSTER, "ok"),
    (False, GPU_CLUSTER, "warning"),         # GPUs held but idle
    (True, {**GPU_CLUSTER, "spark.task.resource.gpu.amount": "0.5"}, "error"),  # NCCL: 1 each
    (True, {**GPU_CLUSTER, "spark.task.resource.gpu.amount": "2"}, "warning"),
])
def test_gpu_findings(use_gpu, conf, severity):
    found = _by_check(conf_findings(conf, use_gpu=use_gpu), "gpu")
    assert [f.severity for f in found] == [severity]


def test_gpu_on_yarn_without_discovery_script_warns():
    conf = {**GPU_CLUSTER, "spark.master": "yarn"}
    found = _by_check(conf_findings(conf, use_gpu=True), "gpu")
    assert [f.severity for f in found] == ["ok", "warning"]
    assert found[1].key == "spark.executor.resource.gpu.discoveryScript"
    script = {**conf, "spark.executor.resource.gpu.discoveryScript": "/opt/gpus.sh"}
    assert [f.severity for f in _by_check(conf_findings(script), "gpu")] == ["ok"]


@pytest.mark.parametrize("key", ["spark.authenticate", "spark.network.crypto.enabled",
                                 "spark.ssl.enabled", "spark.ssl.rpc.enabled"])
def test_secured_cluster_refused_unless_opted_in(key):
    [refused] = _by_check(conf_findings({**CLUSTER, key: "true"}), "security")
    assert refused.severity == "error" and refused.key == key
    assert f"{key}=true" in refused.message
    assert "neither authenticated nor encrypted" in refused.message
    assert UNENCRYPTED_OPT_IN in refused.message and "allowUnencrypted=True" in refused.message
    [allowed] = _by_check(conf_findings({**CLUSTER, key: "true"}, allow_unencrypted=True),
                          "security")
    assert allowed.severity == "warning" and "opt-in" in allowed.message


def test_preflight_raises_the_first_error_before_checking_slots():
    session = ConfOnlySession(spark_master="spark://h:7077", spark_executor_instances="1",
                              spark_executor_cores="1", spark_authenticate="true")
    session.conf.values["spark.dynamicAllocation.enabled"] = "true"
    with pytest.raises(ClusterConfigError, match="spark.dynamicAllocation.enabled=false"):
        preflight(session, 8)
    session.conf.values["spark.dynamicAllocation.enabled"] = "false"
    with pytest.raises(ClusterConfigError, match="allowUnencrypted=True"):
        preflight(session, 8)
    with pytest.raises(ClusterConfigError, match="numWorkers=8 exceeds the 1 task slots"):
        preflight(session, 8, allow_unencrypted=True)


def test_preflight_returns_findings_and_logs_warnings(caplog):
    session = ConfOnlySession(spark_master="local[2]", spark_ssl_enabled="true")
    with caplog.at_level(logging.WARNING):
        found = preflight(session, 2, allow_unencrypted=True)
    assert [f.severity for f in found] == ["ok", "ok", "warning", "ok"]
    assert "spark.ssl.enabled=true" in caplog.text


def test_findings_without_num_workers_reports_slots():
    found = findings(ConfOnlySession(spark_master="local-cluster[2,3,1024]"))
    [slots] = _by_check(found, "task-slots")
    assert slots.severity == "ok" and "6 task slot(s)" in slots.message
    assert slots.key == "spark.master" and slots.value == "local-cluster[2,3,1024]"


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "2"])
def test_bad_num_workers_is_a_param_error(bad):
    with pytest.raises(ParamError, match=f"numWorkers={bad!r}: use a whole number, 1 or more"):
        preflight(ConfOnlySession(spark_master="local[2]"), bad)


@pytest.mark.parametrize("bad", ["yes", "true", 1, None])
def test_bad_use_gpu_is_a_param_error(bad):
    with pytest.raises(ParamError, match="useGpu=.*use 'auto', True or False"):
        conf_findings(CLUSTER, use_gpu=bad)


def test_report_lists_each_finding_and_a_verdict():
    found = conf_findings({**CLUSTER, "spark.authenticate": "true"})
    text = report(found, "spark://h:7077")
    lines = text.splitlines()
    assert lines[0] == "sparkdist doctor: spark://h:7077" and len(lines) == 5
    assert lines[3].split()[:2] == ["ERROR", "security"]
    assert lines[-1] == "1 error(s), 0 warning(s): not ready for sparkdist training."
    assert found[2].as_dict()["key"] == "spark.authenticate"


@pytest.mark.parametrize("value, reason", [("0", "0: use 1 or more"),
                                           ("two", "'two' is not a whole number")])
def test_doctor_rejects_bad_num_workers_before_starting_spark(capsys, value, reason):
    with pytest.raises(SystemExit) as info:
        cli.main(["doctor", "--num-workers", value])
    assert info.value.code == 2
    assert f"argument --num-workers: {reason}" in capsys.readouterr().err
