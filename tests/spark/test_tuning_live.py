"""The Tuner's trials as live distributed fits (issue 31): a pruned TorchEstimator fit is
cancelled after the epoch the pruner rejects and its task slots are free; a trial whose rank is
killed is recorded FAIL and the study goes on; a driver killed mid-study is resumed from its
sqlite storage without re-running finished trials, the interrupted trial run again."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from optuna.distributions import FloatDistribution

from sparkdist import failpoints
from sparkdist.models import TorchEstimator
from sparkdist.tuning import Tuner

pytestmark = pytest.mark.slow
SPACE = {"learningRate": FloatDistribution(1e-3, 1e-1, log=True)}


@pytest.fixture(scope="module")
def small(nonlinear, cached):
    train, _ = nonlinear
    with cached(train.limit(400).repartition(2)) as out:
        yield out


def _prune_odd_trials_after(epochs):
    import optuna

    class PruneOddTrials(optuna.pruners.BasePruner):
        """Prunes trials 1, 3, ... once they reported ``epochs`` epochs (deterministic)."""

        def prune(self, study, trial):
            return trial.number % 2 == 1 and len(trial.intermediate_values) >= epochs

    return PruneOddTrials()


def test_a_pruned_fit_is_cancelled_and_frees_its_slots(spark, small, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    net = TorchEstimator(numWorkers=2, epochs=30, progress=False, batchSize=32)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        mlflow.set_experiment("tuning-live")
        with mlflow.start_run() as parent:
            model = Tuner(estimator=net, evaluator="accuracy", numTrials=2, parallelism=2,
                          pruner=_prune_odd_trials_after(2), refit=False,
                          space=SPACE).fit(small)
        children = {run.data.tags["sparkdist.trialState"]: run for run in mlflow.MlflowClient()
                    .search_runs([parent.info.experiment_id],
                                 f"tags.mlflow.parentRunId = '{parent.info.run_id}'")}
        history = mlflow.MlflowClient().get_metric_history(children["PRUNED"].info.run_id,
                                                           "val_accuracy")
    finally:
        mlflow.set_tracking_uri(None)
    rows = {r.state: r for r in model.trials.collect()}
    assert set(rows) == {"COMPLETE", "PRUNED"}, rows
    # the per-epoch values were the Tuner's validation rows': the estimator had none
    assert rows["COMPLETE"].epochs == 30 and len(model.bestModel.history) == 30
    assert "val_accuracy" in model.bestModel.history[-1]
    # the ranks stopped after the rejected epoch: its tasks ended within seconds
    assert rows["PRUNED"].epochs == 2 and rows["PRUNED"].seconds < rows["COMPLETE"].seconds
    assert rows["PRUNED"].pruneSeconds is not None and rows["PRUNED"].pruneSeconds < 5
    assert spark.sparkContext.statusTracker().getActiveStageIds() == []
    assert [m.step for m in history] == [0, 1]  # the child run has its epochs


def test_a_trial_whose_rank_is_killed_fails_and_the_study_goes_on(small, tmp_path):
    net = failpoints.arm(TorchEstimator(numWorkers=2, epochs=3, progress=False, batchSize=64,
                                        maxRetries=0, checkpointDir=str(tmp_path / "ckpt"),
                                        runId="churn"),
                         str(tmp_path), rank=1, epoch=2, action="kill")
    try:
        model = Tuner(estimator=net, evaluator="accuracy", numTrials=2, parallelism=1,
                      refit=False, space=SPACE).fit(small)
    finally:
        failpoints.disarm(net)
    rows = model.trials.orderBy("number").collect()
    assert [r.state for r in rows] == ["FAIL", "COMPLETE"], rows
    assert re.search(r"gave up|failed on the executors", rows[0].error), rows[0].error
    assert os.path.exists(tmp_path / "fired-1.pid")
    # each trial checkpointed its own run: the second did not resume the killed one's
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["churn-trial-0",
                                                                     "churn-trial-1"]


DRIVER = textwrap.dedent('''
    import sys
    from optuna.distributions import FloatDistribution
    from pyspark.sql import SparkSession
    from sparkdist.datasets import CHURN_COUNTS, CHURN_LABEL, churn
    from sparkdist.features import FeatureAssembler
    from sparkdist.models import LogisticRegression
    from sparkdist.tuning import Tuner

    spark = SparkSession.builder.master("local[1]").getOrCreate()
    df = churn(spark, n=2000, seed=3, partitions=2)
    df = FeatureAssembler(numericCols=CHURN_COUNTS, labelCol=CHURN_LABEL).fit(df).transform(df)
    Tuner(estimator=LogisticRegression(labelCol=CHURN_LABEL, maxIter=10, solver="mllib"),
          space={"regParam": FloatDistribution(1e-3, 1.0, log=True)}, evaluator="auc",
          numTrials=40, studyName="killed", storage=sys.argv[1]).fit(df)
''')


def _kill_when_running(process, storage, complete, limit_s=240):
    """SIGKILL ``process``'s group once ``complete`` trials finished and one is RUNNING with
    its Params drawn (Optuna records a trial RUNNING before it stores its Params)."""
    import optuna

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            trials = optuna.load_study(study_name="killed", storage=storage).get_trials()
        except Exception:  # the study is not created yet (KeyError), or sqlite is busy
            trials = []
        states = [t.state.name for t in trials]
        if states.count("COMPLETE") >= complete and any(
                t.state.name == "RUNNING" and t.params for t in trials):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return states
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"the driver never had {complete} trials done and one running")


def test_a_killed_driver_resumes_without_rerunning_finished_trials(assembled_churn, tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path}/study.db"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    process = subprocess.Popen([sys.executable, str(script), storage], start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_when_running(process, storage, complete=2)
    before = optuna.load_study(study_name="killed", storage=storage).get_trials()
    running = [t for t in before if t.state.name == "RUNNING"]
    done = {t.number: t.params for t in before if t.state.name == "COMPLETE"}
    assert len(running) == 1
    model = Tuner(estimator=_churn_lr(), space={"regParam": FloatDistribution(1e-3, 1.0,
                                                                             log=True)},
                  evaluator="auc", numTrials=len(done) + 2, studyName="killed",
                  storage=storage).fit(assembled_churn)
    rows = {r.number: r for r in model.trials.collect()}
    assert {n: json.loads(rows[n].params) for n in done} == done  # finished: not run again
    interrupted = rows[running[0].number]
    assert interrupted.state == "FAIL" and "driver stopped" in interrupted.error
    new = [r for n, r in rows.items() if n not in done and n != running[0].number]
    assert [r.state for r in new] == ["COMPLETE", "COMPLETE"]
    assert json.loads(new[0].params) == running[0].params  # the interrupted Params, again


def _churn_lr():
    from sparkdist.datasets import CHURN_LABEL
    from sparkdist.models import LogisticRegression

    return LogisticRegression(labelCol=CHURN_LABEL, maxIter=10, solver="mllib")


@pytest.fixture(scope="module")
def assembled_churn(spark, cached):
    from sparkdist.datasets import CHURN_COUNTS, CHURN_LABEL, churn
    from sparkdist.features import FeatureAssembler

    df = churn(spark, n=2000, seed=3, partitions=2)
    features = FeatureAssembler(numericCols=CHURN_COUNTS, labelCol=CHURN_LABEL).fit(df)
    with cached(features.transform(df)) as out:
        yield out
