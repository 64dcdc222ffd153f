"""GPU scheduling without GPUs, as Spark's own tests do it: local-cluster with a fake discovery
script. Each of the two workers claims a different pair of fake GPU addresses (worker k:
``2k`` and ``2k+1``), its executor takes one of them, and each task takes its executor's.

The test runs this file as its own driver (the test session already has a local[2] session):

    python tests/cluster/test_gpu_scheduling.py DISCOVERY_SCRIPT

which prints one JSON line: the barrier ranks' records (``report_plan`` below)
and what plain (non-barrier) tasks saw through ``task_gpus()``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkdist.exceptions import TrainingError
from sparkdist.launch.gpus import device_plan, inherited_visible_devices, plan_for_task, task_gpus

MASTER = "local-cluster[2,1,1024]"
#: Each run of the script claims the next free index k (mkdir is atomic) and reports 2 GPUs.
DISCOVERY = """#!/usr/bin/env bash
claims="$(dirname "$0")/claims"
mkdir -p "$claims"
k=0
while ! mkdir "$claims/$k" 2>/dev/null; do k=$((k + 1)); done
echo "{\\"name\\": \\"gpu\\", \\"addresses\\": [\\"$((2 * k))\\", \\"$((2 * k + 1))\\"]}"
"""


def gpu_conf(script: str) -> dict[str, str]:
    """The confs that make local-cluster schedule one (fake) GPU per task."""
    return {
        "spark.worker.resource.gpu.amount": "2",
        "spark.worker.resource.gpu.discoveryScript": script,
        "spark.executor.resource.gpu.amount": "1",
        "spark.task.resource.gpu.amount": "1",
    }


@pytest.mark.slow
@pytest.mark.cluster
def test_each_rank_gets_its_own_gpu_and_plans_it(tmp_path: Path):
    script = tmp_path / "fake_gpus.sh"
    script.write_text(DISCOVERY)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    done = subprocess.run([sys.executable, __file__, str(script)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ranks, plain = result["ranks"], result["plain"]

    # The two workers ran the script once each and got disjoint pairs.
    assert sorted(p.name for p in (tmp_path / "claims").iterdir()) == ["0", "1"]
    assert [record["rank"] for record in ranks] == [0, 1]
    given = [record["gpus"] for record in ranks]
    assert all(len(addresses) == 1 for addresses in given), given
    workers = sorted(int(addresses[0]) // 2 for addresses in given)
    assert workers == [0, 1], f"both ranks got a GPU of the same worker: {given}"
    for record in ranks:
        address = record["gpus"][0]
        assert record["task_gpus"] == record["gpus"]  # TaskContext sees what the barrier saw
        # As if CUDA were there (4 GPUs on this host): the assigned GPU is the device.
        assumed = record.get("assumed_plan") or pytest.fail(str(record))
        assert assumed["device"] == f"cuda:{address}" and assumed["index"] == int(address)
        assert assumed["cuda_visible_devices"] == address
        assert assumed["child_device"] == "cuda:0" and assumed["backend"] == "nccl"
        # The real torch here is CPU-only: useGpu=True fails, naming the conf to set.
        error = record["plan_error"]
        assert "no CUDA device" in error and "spark.task.resource.gpu.amount" in error
    # Plain tasks (TorchModel.transform's path) see their executor's GPU, the same one the
    # barrier rank on that executor was given.
    by_executor = {record["executor"]: record["gpus"] for record in ranks}
    assert len(by_executor) == 2
    assert len(plain) == 4
    for task in plain:
        assert task["gpus"] == by_executor[task["executor"]], (task, by_executor)
        assert task["auto_device"] == "cpu"  # useGpu='auto' on a CPU-only torch


# ------------------------------------------------------------------------ the driver program
def _plain_tasks(batches):
    import pandas as pd

    for _ in batches:
        pass
    yield pd.DataFrame({"executor": [_executor_id()],
                        "gpus": [json.dumps(task_gpus())],
                        "auto_device": [plan_for_task("auto").device]})


def report_plan(context, batches, args) -> bytes:
    """The barrier worker of this check: every rank's GPUs and plan.

    Each rank plans its device with this process's torch, and, when ``args["assume_cuda"]``
    gives a device count, also as if CUDA were there (to check the scheduling on machines
    without GPUs); a plan that cannot be made is recorded as ``plan_error`` /
    ``assumed_plan_error`` instead. One ``allGather`` brings every rank's record to rank 0,
    which returns them as JSON bytes: a list ordered by rank.
    """
    for _ in batches:  # the input rows do not matter
        pass
    use_gpu = args.get("use_gpu", "auto")
    record = {"rank": context.rank, "gpus": list(context.gpus),
                              "task_gpus": task_gpus(), "pid": os.getpid(),
                              "executor": _executor_id()}
    _record_plan(record, "plan", lambda: plan_for_task(use_gpu, context.gpus))
    assume = args.get("assume_cuda")
    if assume:
        _record_plan(record, "assumed_plan",
                     lambda: device_plan(context.gpus, use_gpu, True, int(assume),
                                         inherited_visible_devices()))
    from pyspark import BarrierTaskContext

    gathered = BarrierTaskContext.get().allGather(json.dumps(record))
    return json.dumps(sorted((json.loads(item) for item in gathered),
                             key=lambda item: item["rank"])).encode()


def _record_plan(record: dict, key: str, plan) -> None:
    """``record[key]`` = the plan as a dict, or ``record[key + "_error"]`` = why there is none."""
    try:
        record[key] = plan().to_dict()
    except TrainingError as err:
        record[f"{key}_error"] = str(err)


def _executor_id() -> str:
    """The executor's id: standalone and local-cluster start executors in ``work/<app>/<id>``."""
    return os.environ.get("SPARK_EXECUTOR_ID") or os.path.basename(os.getcwd())


def _log(message: str) -> None:
    print(f"[gpu-scheduling] {message}", file=sys.stderr, flush=True)


def main(script: str) -> None:
    from sparkdist.launch.barrier import run_barrier
    from sparkdist.session import get_spark

    started = time.monotonic()
    spark = get_spark(master=MASTER, app_name="sparkdist-gpu-scheduling",
                      conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                            "spark.sql.shuffle.partitions": "2",
                            # fail in seconds rather than retry a broken stage for minutes
                            "spark.stage.maxConsecutiveAttempts": "1",
                            **gpu_conf(script)})
    _log(f"session up after {time.monotonic() - started:.1f} s")
    try:
        payload = run_barrier(spark.range(0, 2, 1, 2), report_plan,
                              {"use_gpu": True, "assume_cuda": 4}, num_workers=2,
                              timeout_s=120)
        ranks = json.loads(payload)
        _log(f"barrier stage done after {time.monotonic() - started:.1f} s")
        plain = (spark.range(0, 4, 1, 4)
                 .mapInPandas(_plain_tasks, "executor string, gpus string, auto_device string")
                 .collect())
        _log(f"plain tasks done after {time.monotonic() - started:.1f} s")
        print(json.dumps({
            "ranks": ranks,
            "plain": [{"executor": row["executor"], "gpus": json.loads(row["gpus"]),
                       "auto_device": row["auto_device"]} for row in plain]}))
    finally:
        spark.stop()


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main(sys.argv[1])
