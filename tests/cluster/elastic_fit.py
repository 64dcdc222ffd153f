"""The elastic-training driver of tests/cluster/test_elastic.py, run as its own process
against a standalone master (3 one-core workers):

    python tests/cluster/elastic_fit.py spark://127.0.0.1:PORT torch MIN_WORKERS VICTIM_PID OUT

``torch``: an uninterrupted 3-worker TorchEstimator fit (only where MIN_WORKERS < 3, the
reference), then the same fit with checkpoints, numWorkers=3 and minWorkers=MIN_WORKERS;
when rank 0 reports epoch 2 to the driver, the Worker daemon VICTIM_PID and every process
under it (its executor JVM, that JVM's Python workers) are SIGKILLed and never restarted.
``xgboost``: the same with XGBoostClassifier and checkpointDir, the kill once the first
checkpoint (chunk) is written. Writes one JSON object to OUT: accuracies, the fit's worker
counts, its timeline (the driver's view: slot changes, decisions, launches, rendezvous,
epoch reports) with the kill time, or the error and when it came.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ["PYSPARK_PYTHON"] = sys.executable  # what the executors run (pyspark reads this)

from sparkdist.datasets import make_nonlinear  # noqa: E402
from sparkdist.session import get_spark  # noqa: E402

TORCH = {"numWorkers": 3, "epochs": 20, "seed": 11, "progress": False, "batchSize": 64,
         "learningRate": 0.01, "modelKwargs": {"hidden": [32, 16]},
         "rendezvousTimeoutSeconds": 60, "maxRetries": 3,
         # the best epoch by validation loss: less end-of-training jitter in the comparison
         "validationFraction": 0.2}
XGB = {"num_workers": 3, "n_estimators": 30, "max_depth": 4, "learning_rate": 0.3,
       "checkpointEvery": 5, "maxRetries": 3}
KILL_AT_EPOCH = 2
#: slotWaitSeconds by minWorkers: where the survivors suffice (2) a wait that never ends the fit
#: while the killed executor's barrier tasks leave their slots; where they never do (3) a
#: short one, still well above the 0.3-0.5 s from the kill to the lost slots being seen, so a
#: fit that gave up without waiting fails the test's bound.
SLOT_WAIT_S = {2: 10.0, 3: 4.0}


def descendants(root: int) -> list[int]:
    """``root`` and every process under it (by /proc parent links)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                text = Path(f"/proc/{name}/stat").read_text()
                parents[int(name)] = int(text[text.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending += [child for child, parent in parents.items() if parent == pid]
    return found


class Killer(logging.Handler):
    """On the progress log line of ``epoch KILL_AT_EPOCH``, SIGKILL the victim's tree once."""

    def __init__(self, victim: int, pattern: str) -> None:
        super().__init__()
        self.victim, self.pattern = victim, pattern
        self.killed_at: float | None = None
        self.once = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if self.pattern in record.getMessage():
            self.kill()

    def kill(self) -> None:
        with self.once:
            if self.killed_at is not None:
                return
            pids = descendants(self.victim)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.killed_at = time.time()
            print(f"killed {pids} at {self.killed_at:.3f}", file=sys.stderr, flush=True)


class MidChunkKiller(Killer):
    """After the log line, wait until the next chunk's barrier stage runs all 3 tasks, then
    kill: the executor dies mid-chunk (a kill between two chunks can land in the moment
    before xgboost.spark submits its barrier job, see _xgboost_checkpoints)."""

    def __init__(self, victim: int, pattern: str, sc) -> None:
        super().__init__(victim, pattern)
        self.sc = sc

    def emit(self, record: logging.LogRecord) -> None:
        if self.pattern in record.getMessage():
            threading.Thread(target=self.kill_when_running, daemon=True).start()

    def kill_when_running(self) -> None:
        tracker, deadline = self.sc.statusTracker(), time.monotonic() + 60
        while time.monotonic() < deadline:
            infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            if any(i and i.numTasks == 3 and i.numActiveTasks == 3 for i in infos):
                break
            time.sleep(0.05)
        self.kill()


def session(master: str):
    python = sys.executable
    conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false", "spark.executor.cores": "1", "spark.cores.max": "3",
            "spark.executor.memory": "768m", "spark.sql.shuffle.partitions": "3",
            "spark.pyspark.python": python, "spark.executorEnv.GLOO_SOCKET_IFNAME": "lo",
            "spark.stage.maxConsecutiveAttempts": "8"}
    spark = get_spark(master=master, app_name="sparkdist-elastic", conf=conf)
    # every worker's executor registered before a fit looks at the slots: a fit that started
    # short of 3 would wait out its (short, under minWorkers=3) slotWaitSeconds before the kill
    status, deadline = spark.sparkContext._jsc.sc(), time.monotonic() + 120
    while status.getExecutorMemoryStatus().size() < 4 and time.monotonic() < deadline:  # + driver
        time.sleep(0.2)
    return spark


def accuracy(model, test) -> float:
    return model.transform(test).where("prediction = label").count() / test.count()


def torch_case(spark, min_workers: int, victim: int, work: Path) -> dict:
    from sparkdist.models import TorchEstimator

    train = spark.createDataFrame(make_nonlinear(8000, 1)).repartition(3).cache()
    test = spark.createDataFrame(make_nonlinear(3000, 2)).repartition(3).cache()
    train.count(), test.count()
    out: dict = {}
    if min_workers < 3:
        reference = TorchEstimator(**TORCH).fit(train)
        out["reference_accuracy"] = accuracy(reference, test)
        out["reference_worker_counts"] = reference.trainingSummary["worker_counts"]
        out["reference_steps_per_epoch"] = reference.trainingSummary["steps_per_epoch"]
    estimator = TorchEstimator(checkpointDir=str(work / "ckpt"), minWorkers=min_workers,
                               slotWaitSeconds=SLOT_WAIT_S[min_workers], **TORCH)
    killer = Killer(victim, f"epoch {KILL_AT_EPOCH}/")
    logger = logging.getLogger("sparkdist.models.torch")
    logger.setLevel(logging.INFO)
    logger.addHandler(killer)
    out.update(fit(lambda: estimator.fit(train), killer))
    model = out.pop("model", None)
    if model is not None:
        summary = model.trainingSummary
        out.update(accuracy=accuracy(model, test), worker_counts=summary["worker_counts"],
                   world_size=summary["world_size"], batch_size=summary["batch_size"],
                   global_batch_size=summary["global_batch_size"],
                   steps_per_epoch=summary["steps_per_epoch"],
                   resumed_from_epoch=summary["resumed_from_epoch"],
                   epochs_trained=len(model.history))
    return out


def fit(run, killer: Killer) -> dict:
    """Run the fit; what came of it, with the times of the kill and of the end."""
    started = time.time()
    out: dict = {"started": started}
    try:
        out["model"] = run()
    except Exception as err:
        out["error_type"] = type(err).__name__
        out["error"] = str(err)[:3000]
        out["traceback"] = traceback.format_exc()[-3000:]
    out["ended"] = time.time()
    out["killed_at"] = killer.killed_at
    return out


class Timeline(logging.Handler):
    """The elastic plan's timeline from its log lines (kept also when the fit fails)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.notes: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.notes.append((record.created, record.getMessage()))


def main(master: str, mode: str, min_workers: int, victim: int, target: str) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(400, repeat=True)  # where a stuck driver waits
    timeline = Timeline()
    logger = logging.getLogger("sparkdist.launch.elastic")
    logger.setLevel(logging.INFO)
    logger.addHandler(timeline)
    spark = session(master)
    work = Path(target).parent
    out = (torch_case if mode == "torch" else xgboost_case)(spark, min_workers, victim, work)
    out["timeline"] = timeline.notes
    Path(target).write_text(json.dumps(out, default=str))
    spark.stop()


def xgboost_case(spark, min_workers: int, victim: int, work: Path) -> dict:
    from pyspark.ml.functions import array_to_vector

    from sparkdist.models import XGBoostClassifier

    def frame(n: int, seed: int):
        rows = spark.createDataFrame(make_nonlinear(n, seed))
        return rows.withColumn("features", array_to_vector("features")).repartition(3).cache()

    train, test = frame(3000, 1), frame(3000, 2)
    train.count(), test.count()
    out: dict = {}
    if min_workers < 3:
        reference = XGBoostClassifier(checkpointDir=str(work / "reference"), **XGB).fit(train)
        out["reference_accuracy"] = accuracy(reference, test)
        out["reference_worker_counts"] = reference.trainingSummary["worker_counts"]
    estimator = XGBoostClassifier(checkpointDir=str(work / "ckpt"), minWorkers=min_workers,
                                  slotWaitSeconds=SLOT_WAIT_S[min_workers], **XGB)
    rounds = XGB["checkpointEvery"] * KILL_AT_EPOCH
    killer = MidChunkKiller(victim, f": {rounds} of {XGB['n_estimators']} rounds done",
                            spark.sparkContext)
    logger = logging.getLogger("sparkdist.models._xgboost_checkpoints")
    logger.setLevel(logging.INFO)
    logger.addHandler(killer)
    out.update(fit(lambda: estimator.fit(train), killer))
    model = out.pop("model", None)
    if model is not None:
        summary = model.trainingSummary
        out.update(accuracy=accuracy(model, test), worker_counts=summary["worker_counts"],
                   retries=summary["retries"],
                   rounds=model.get_booster().num_boosted_rounds())
    return out


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
