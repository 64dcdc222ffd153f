"""A real standalone cluster (a master and two workers from the pip pyspark): spark-submit the
deep-model job and SIGKILL one executor JVM while it trains; the job must still finish.

The job is submitted as docs/cluster.md says, ``spark-submit --master spark://...`` and nothing
else telling sparkdist the master: the training ranks must run on the cluster's executors
(their ids and hosts are in the fit's summary and the MLflow run), not on the driver.

Spark retries the training stage as a whole (it is a barrier stage followed by a shuffle), the
Worker relaunches the killed executor, and every rank of the retried attempt resumes from the
last checkpoint rank 0 wrote, so the epochs done before the kill are not trained again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sparkdist.launch.barrier import SYNC_LOG_PREFIX

ROOT = Path(__file__).resolve().parents[2]
# The helper next to this file, by path (tests/ is no package; any import mode works).
_spec = importlib.util.spec_from_file_location("sparkdist_tests_standalone",
                                               Path(__file__).with_name("standalone.py"))
standalone = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(standalone)

EPOCHS = 12         # with BATCH_SIZE, ~1 s an epoch on two 1-core executors: ~12 s training
BATCH_SIZE = 32
KILL_AT_EPOCH = 3   # rank 0 has logged this epoch: training is under way
TRAINING_STARTS_WITHIN_S = 180   # submit -> executors up -> data split -> epoch KILL_AT_EPOCH
JOB_ENDS_WITHIN_S = 240          # kill -> executor relaunched -> retrained -> saved, tracked
EPOCH_LINE = re.compile(r'\[sparkdist rank 0\] \{"epoch": (\d+),')
RESUME_LINE = re.compile(r"\[sparkdist rank 0\] resuming after epoch (\d+), step \d+")


@pytest.fixture
def cluster(tmp_path):
    with standalone.StandaloneCluster(tmp_path / "cluster", workers=2, cores=1,
                                      memory="1g") as running:
        yield running
    # (__exit__ stopped everything, also when the test failed)
    left = running.processes()
    assert not left, f"processes left behind by the cluster: {left}"


def job_config(tmp_path: Path, epochs: int = EPOCHS, batch_size: int = BATCH_SIZE) -> Path:
    """jobs/configs/churn_torch.yaml with only the TorchEstimator, long enough to interrupt,
    tracked in sqlite and saved under ``tmp_path``."""
    raw = yaml.safe_load((ROOT / "jobs" / "configs" / "churn_torch.yaml").read_text())
    raw["data"] = {"path": str(ROOT / raw["data"]["path"])}
    raw["tracking"] = {**raw.get("tracking", {}), "uri": f"sqlite:///{tmp_path}/mlruns.db"}
    raw["output"] = {"modelDir": str(tmp_path / "models")}
    model = next(m for m in raw["models"] if m["type"] == "TorchEstimator")
    model["params"].update(epochs=epochs, batchSize=batch_size, progress=False,
                           rendezvousTimeoutSeconds=60, checkpointDir=str(tmp_path / "ckpt"))
    raw["models"] = [model]
    path = tmp_path / "churn_torch_standalone.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def submit(cluster, config: Path, tmp_path: Path) -> subprocess.Popen:
    """spark-submit jobs/train.py CONFIG to the cluster, in a session of its own (so the
    driver JVM and its Python can be ended together); output goes to driver.out/.err."""
    python = sys.executable
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
           "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python,
           "SPARK_CONF_DIR": str(cluster.base / "conf")}
    env.pop("SPARKDIST_MASTER", None)  # spark-submit's --master alone must decide
    conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false", "spark.executor.cores": "1", "spark.cores.max": "2",
            "spark.executor.memory": "1g", "spark.sql.shuffle.partitions": "2",
            "spark.pyspark.python": python, "spark.executorEnv.GLOO_SOCKET_IFNAME": "lo",
            # A failed barrier stage is resubmitted whole; this many failed attempts abort the
            # job (the default, stated: spark.task.maxFailures does not apply to barrier tasks).
            "spark.stage.maxConsecutiveAttempts": "4"}
    command = [str(Path(python).parent / "spark-submit"), "--master", cluster.master_url]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += [str(ROOT / "jobs" / "train.py"), str(config)]
    with (tmp_path / "driver.out").open("w") as out, (tmp_path / "driver.err").open("w") as err:
        return subprocess.Popen(command, cwd=tmp_path, env=env, start_new_session=True,
                                stdout=out, stderr=err)


def rank0_progress(cluster) -> tuple[int, Path | None]:
    """The last epoch rank 0 logged, and the executor stderr it logged it in."""
    best: tuple[int, Path | None] = (0, None)
    for log in cluster.executor_logs():
        epochs = [int(m) for m in EPOCH_LINE.findall(log.read_text(errors="replace"))]
        if epochs and epochs[-1] >= best[0]:
            best = (epochs[-1], log)
    return best


def wait_for_epoch(cluster, driver: subprocess.Popen, epoch: int, timeout_s: float,
                   tmp_path: Path) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, log = rank0_progress(cluster)
        if done >= epoch and log is not None:
            return log
        if driver.poll() is not None:
            pytest.fail(f"the job ended (exit {driver.returncode}) before rank 0 logged epoch "
                        f"{epoch}:\n{tails(cluster, tmp_path)}")
        time.sleep(0.5)
    pytest.fail(f"rank 0 did not log epoch {epoch} within {timeout_s:.0f} s:\n"
                f"{tails(cluster, tmp_path)}")


def tails(cluster, tmp_path: Path, lines: int = 40) -> str:
    parts = []
    for path in [tmp_path / "driver.out", tmp_path / "driver.err", *cluster.executor_logs()]:
        if path.exists():
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path} ---\n" + "\n".join(text))
    return "\n".join(parts) + "\n" + cluster.logs_tail(15)


def victim_pid(cluster, log: Path) -> tuple[int, int]:
    """(worker index, pid) of the executor JVM that writes ``log`` (its cwd is log's dir)."""
    for index in range(1, cluster.workers + 1):
        for pid in cluster.executor_pids(index):
            if cluster.executor_dir(pid) == log.parent:
                return index, pid
    pytest.fail(f"no running executor of this cluster writes {log}")


def run_job(cluster, tmp_path: Path, kill: bool, epochs: int = EPOCHS) -> dict:
    """Submit the job, optionally SIGKILL rank 0's executor at epoch KILL_AT_EPOCH, wait for
    the end. Returns timings (s) and what was killed."""
    config = job_config(tmp_path, epochs=epochs)
    started = time.monotonic()
    driver = submit(cluster, config, tmp_path)
    result: dict = {}
    try:
        if kill:
            log = wait_for_epoch(cluster, driver, KILL_AT_EPOCH, TRAINING_STARTS_WITHIN_S,
                                 tmp_path)
            result["worker"], result["pid"] = victim_pid(cluster, log)
            result["log"] = log
            result["killed_after_s"] = time.monotonic() - started
            os.kill(result["pid"], signal.SIGKILL)
        try:
            driver.wait(timeout=JOB_ENDS_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job did not finish within {JOB_ENDS_WITHIN_S} s"
                        f"{' of the kill' if kill else ''}:\n{tails(cluster, tmp_path)}")
    finally:
        if driver.poll() is None:
            driver.kill()
        standalone.stop_session(driver.pid)  # the driver JVM's Python, should it outlive it
    result["seconds"] = time.monotonic() - started
    result["returncode"] = driver.returncode
    return result


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_job_survives_a_killed_executor(cluster, tmp_path):
    job = run_job(cluster, tmp_path, kill=True)
    assert job["returncode"] == 0, tails(cluster, tmp_path)
    print(f"\nstandalone: cluster up in {sum(cluster.timings.values()):.1f} s "
          f"{cluster.timings}; killed executor {job['pid']} of worker {job['worker']} "
          f"{job['killed_after_s']:.1f} s after submit; job {job['seconds']:.1f} s")

    # The killed executor is gone, the Worker launched a new one, the stage ran again.
    assert not standalone.alive(job["pid"])
    assert len(cluster.executor_logs()) >= 3  # the first two executors and the relaunched one
    logs = "\n".join(p.read_text(errors="replace") for p in cluster.executor_logs())
    rendezvous = [line for line in logs.splitlines() if SYNC_LOG_PREFIX in line]
    assert len(rendezvous) >= 4, f"the training stage did not run twice: {rendezvous}"
    assert EPOCHS in [int(e) for e in EPOCH_LINE.findall(logs)]  # trained to the end
    resumed = [int(e) for e in RESUME_LINE.findall(logs)]
    assert resumed and resumed[-1] >= KILL_AT_EPOCH, "the retried attempt did not resume"

    report = json.loads([line for line in (tmp_path / "driver.out").read_text().splitlines()
                         if line.startswith("{")][-1])
    assert report["metrics"]["TorchEstimator"]["auc"] > 0.75
    saved = tmp_path / "models" / "TorchEstimator"
    assert (saved / "metadata").is_dir() and any(saved.rglob("stages"))  # any save layout

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns.db")
    runs = mlflow.search_runs(experiment_names=["sparkdist-churn-torch"], output_format="list")
    run = next(r for r in runs if r.info.run_name == "TorchEstimator")
    assert run.info.status == "FINISHED"
    assert run.data.metrics["auc"] > 0.75 and run.data.params["epochs"] == str(EPOCHS)

    # The ranks of the attempt that finished ran on two of this cluster's executors.
    summary = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/training_summary.json")
    placement = summary["placement"]
    assert json.loads(run.data.params["placement"]) == placement
    executors = {log.parent.name for log in cluster.executor_logs()}  # work/<app>/<id>/
    print(f"placement {placement}; the cluster's executors {sorted(executors)}")
    assert [p["rank"] for p in placement] == [0, 1]
    assert {p["executor_id"] for p in placement} <= executors and "driver" not in executors
    assert len({p["executor_id"] for p in placement}) == 2  # one 1-core executor per rank
    assert {p["host"] for p in placement} == {"127.0.0.1"}
