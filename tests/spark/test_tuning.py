"""sparkdist.tuning.Tuner on real fits (issue 31): grid and sampled search with Optuna, the
validation split, bad inputs as typed errors, failed trials recorded, resume from sqlite
storage, TunerModel save/load, MLflow child runs, and distributed trials queueing on the
cluster's task slots (a TorchEstimator with numWorkers=2 and parallelism=2 in local[2])."""

from __future__ import annotations

import json
import time

import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from pyspark.ml import Pipeline
from pyspark.ml.tuning import ParamGridBuilder

from sparkdist.datasets import CHURN_COUNTS, CHURN_LABEL
from sparkdist.exceptions import ClusterConfigError, ParamError, TrainingError
from sparkdist.features import FeatureAssembler
from sparkdist.models import LogisticRegression
from sparkdist.tuning import Tuner, TunerModel
from sparkdist.tuning._trials import SlotGate


@pytest.fixture(scope="module")
def assembled(spark, cached):
    from sparkdist.datasets import churn

    df = churn(spark, n=2000, seed=3, partitions=2)
    features = FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan"],
                                labelCol=CHURN_LABEL).fit(df)
    with cached(features.transform(df)) as out:
        yield out


def _lr(**kwargs):
    return LogisticRegression(labelCol=CHURN_LABEL, maxIter=10, solver="mllib", **kwargs)


def test_a_grid_is_searched_exhaustively_and_the_best_model_is_refitted(assembled):
    lr = _lr()
    grid = ParamGridBuilder().addGrid(lr.regParam, [0.0, 0.5]).addGrid(
        lr.elasticNetParam, [0.0, 1.0]).build()
    model = Tuner(estimator=lr, space=grid, evaluator="auc", parallelism=2).fit(assembled)
    rows = model.trials.collect()
    assert len(rows) == 4 and {r.state for r in rows} == {"COMPLETE"}
    assert {json.dumps(json.loads(r.params), sort_keys=True) for r in rows} == {
        json.dumps({"regParam": a, "elasticNetParam": b}, sort_keys=True)
        for a in (0.0, 0.5) for b in (0.0, 1.0)}
    best = max(rows, key=lambda r: r.metric)
    assert model.bestValue == best.metric and model.bestParams == json.loads(best.params)
    assert model.bestModel.getOrDefault("regParam") == model.bestParams["regParam"]
    assert all(r.seconds > 0 for r in rows)
    assert "prediction" in model.transform(assembled).columns


def test_a_sampled_space_in_a_pipeline_minimises_a_loss_with_a_validation_col(assembled):
    from pyspark.sql import functions as F

    df = assembled.withColumn("is_val", F.abs(F.hash("customer_id")) % 4 == 0)
    pipeline = Pipeline(stages=[_lr()])
    space = {"regParam": FloatDistribution(1e-4, 1.0, log=True),
             "maxIter": IntDistribution(2, 8)}
    model = Tuner(estimator=pipeline, space=space, evaluator="logloss", numTrials=3,
                  sampler="random", validationCol="is_val", refit=False).fit(df)
    rows = model.trials.collect()
    assert len(rows) == 3 and model.bestValue == min(r.metric for r in rows)
    assert 1e-4 <= model.bestParams["regParam"] <= 1.0
    assert model.bestModel.stages[-1].getOrDefault("maxIter") == model.bestParams["maxIter"]


def test_a_pyspark_evaluator_scores_the_trials(assembled):
    from pyspark.ml.evaluation import BinaryClassificationEvaluator

    tuner = Tuner(estimator=_lr(), space={"regParam": FloatDistribution(1e-3, 1.0)},
                  evaluator=BinaryClassificationEvaluator(labelCol=CHURN_LABEL), numTrials=2)
    model = tuner.fit(assembled)
    assert model.metric == "areaUnderROC"
    assert model.bestValue == max(r.metric for r in model.trials.collect())
    with pytest.raises(ParamError, match="cannot be saved"):  # its Params hold objects
        tuner.write().save("unused")


def test_bad_spaces_and_metrics_are_typed_errors_before_any_fit(assembled):
    with pytest.raises(ParamError, match="Did you mean 'regParam'"):
        Tuner(estimator=_lr(), space={"regparm": FloatDistribution(0.0, 1.0)},
              evaluator="auc").fit(assembled)
    with pytest.raises(ParamError, match="maxIter does not take"):
        Tuner(estimator=_lr(), space={"maxIter": FloatDistribution(1.0, 9.0)},
              evaluator="auc").fit(assembled)
    with pytest.raises(ParamError, match="not an Optuna distribution"):
        Tuner(estimator=_lr(), space={"regParam": [0.1, 0.2]}, evaluator="auc").fit(assembled)
    with pytest.raises(ParamError, match="Did you mean 'auc'"):
        Tuner(estimator=_lr(), space={"regParam": FloatDistribution(0.0, 1.0)},
              evaluator="acu").fit(assembled)
    with pytest.raises(ParamError, match="pruner='hyperband' is not one of"):
        Tuner(estimator=_lr(), space={"regParam": FloatDistribution(0.0, 1.0)},
              evaluator="auc", pruner="hyperband").fit(assembled)


def test_a_metric_of_another_task_stops_the_study(assembled):
    with pytest.raises(ParamError, match="does not match the model's task 'classification'"):
        Tuner(estimator=_lr(), space={"regParam": FloatDistribution(0.0, 1.0)},
              evaluator="rmse", numTrials=3).fit(assembled)


def test_failed_trials_are_recorded_and_the_study_goes_on(assembled):
    lr = _lr()
    grid = ParamGridBuilder().addGrid(lr.regParam, [-1.0, 0.01]).build()  # -1: refused
    model = Tuner(estimator=lr, space=grid, evaluator="auc").fit(assembled)
    states = {json.loads(r.params)["regParam"]: r for r in model.trials.collect()}
    assert states[-1.0].state == "FAIL" and "regParam" in states[-1.0].error
    assert states[0.01].state == "COMPLETE" and model.bestParams == {"regParam": 0.01}


def test_every_trial_failing_is_a_training_error_with_the_first_error(assembled):
    with pytest.raises(TrainingError, match=r"2 of 2 failed; the first: .*regParam"):
        Tuner(estimator=_lr(), space={"regParam": FloatDistribution(-2.0, -1.0)},
              evaluator="auc", numTrials=2).fit(assembled)


def test_a_study_in_sqlite_resumes_without_rerunning_finished_trials(assembled, tmp_path):
    storage = f"sqlite:///{tmp_path}/study.db"
    space = {"regParam": FloatDistribution(1e-3, 1.0, log=True)}
    first = Tuner(estimator=_lr(), space=space, evaluator="auc", numTrials=2,
                  studyName="churn", storage=storage).fit(assembled)
    assert first.trials.count() == 2
    again = Tuner(estimator=_lr(), space=space, evaluator="auc", numTrials=3,
                  studyName="churn", storage=storage).fit(assembled)
    rows = again.trials.orderBy("number").collect()
    assert [r.number for r in rows] == [0, 1, 2]
    assert [r.params for r in rows[:2]] == [r.params for r in
                                            first.trials.orderBy("number").collect()]
    with pytest.raises(ParamError, match="exists in .* with another space"):
        Tuner(estimator=_lr(), space={"regParam": FloatDistribution(0.0, 1.0)},
              evaluator="auc", numTrials=3, studyName="churn", storage=storage).fit(assembled)
    with pytest.raises(ParamError, match="needs a studyName"):
        Tuner(estimator=_lr(), space=space, evaluator="auc", storage=storage).fit(assembled)


def test_a_trial_stopped_before_its_params_were_drawn_is_failed_and_not_queued(assembled,
                                                                              tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path}/study.db"
    space = {"regParam": FloatDistribution(1e-3, 1.0, log=True)}
    Tuner(estimator=_lr(), space=space, evaluator="auc", numTrials=1, studyName="early",
          storage=storage).fit(assembled)
    optuna.load_study(study_name="early", storage=storage).ask()  # RUNNING, no Params yet
    model = Tuner(estimator=_lr(), space=space, evaluator="auc", numTrials=2,
                  studyName="early", storage=storage).fit(assembled)
    rows = model.trials.orderBy("number").collect()
    assert [(r.number, r.state) for r in rows] == [(0, "COMPLETE"), (1, "FAIL"),
                                                   (2, "COMPLETE")]
    assert "no Params were drawn yet" in rows[1].error
    waiting = optuna.load_study(study_name="early", storage=storage).get_trials(
        states=(optuna.trial.TrialState.WAITING,))
    assert waiting == [] and "regParam" in json.loads(rows[2].params)


def test_a_tuner_model_saves_and_loads_with_its_best_model(assembled, tmp_path):
    from sparkdist.persist import load_model

    model = Tuner(estimator=Pipeline(stages=[_lr()]), evaluator="auc", numTrials=2,
                  space={"regParam": FloatDistribution(1e-3, 1.0, log=True)}).fit(assembled)
    model.write().save(str(tmp_path / "tuned"))
    for loaded in (TunerModel.load(str(tmp_path / "tuned")), load_model(str(tmp_path / "tuned"))):
        assert isinstance(loaded, TunerModel)
        assert loaded.bestParams == model.bestParams and loaded.bestValue == model.bestValue
        assert loaded.trials.collect() == model.trials.collect()
        assert loaded.getOrDefault("numTrials") == 2
        got = loaded.transform(assembled).select("prediction").collect()
        assert got == model.transform(assembled).select("prediction").collect()


def test_each_trial_is_an_mlflow_child_run_of_the_active_run(assembled, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        # this store's own experiment (an earlier test may have left another one active)
        mlflow.set_experiment("tuning")
        with mlflow.start_run() as parent:
            Tuner(estimator=_lr(), space={"regParam": FloatDistribution(1e-3, 1.0)},
                  evaluator="auc", numTrials=2, parallelism=2).fit(assembled)
        children = mlflow.search_runs(
            filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
        assert len(children) == 2
        assert children["metrics.auc"].notna().all() and children["params.regParam"].notna().all()
    finally:
        mlflow.set_tracking_uri(None)


def test_the_slot_gate_queues_trials_that_need_more_slots_than_are_free():
    import threading

    gate = SlotGate(2)
    gate.acquire(2)
    started = threading.Event()

    def second():
        gate.acquire(2)
        started.set()
        gate.release(2)

    thread = threading.Thread(target=second)
    thread.start()
    assert not started.wait(0.3)  # queued while the first holds both slots
    gate.release(2)
    assert started.wait(5)
    thread.join()
    with pytest.raises(ClusterConfigError, match="numWorkers=3 exceeds the 2 task slots"):
        gate.acquire(3)


def test_a_fit_history_is_reported_per_epoch_and_the_pruner_judges_it():
    import types

    import optuna

    from sparkdist.tuning._trials import _report_history, epoch_value

    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.MedianPruner(
        n_startup_trials=1, n_warmup_steps=0))
    run = types.SimpleNamespace(metric="logloss", maximize=False)
    first = study.ask()
    _report_history(first, [{"val_loss": 0.5}, {"val_loss": 0.3}], run)
    assert not first.should_prune()
    study.tell(first, 0.3)
    second = study.ask()
    _report_history(second, [{"val_loss": 0.9}, {"val_loss": 0.8}], run)
    assert second.should_prune()  # the Tuner then records it as PRUNED
    assert study.trials[1].intermediate_values == {0: 0.9, 1: 0.8}
    # the value in the study's direction: the metric's own, accuracy, or the loss negated
    assert epoch_value({"val_auc": 0.7, "val_accuracy": 0.6}, "auc", True) == 0.7
    assert epoch_value({"val_accuracy": 0.6, "val_loss": 0.2}, "f1", True) == 0.6
    assert epoch_value({"val_loss": 0.2}, "r2", True) == -0.2
    assert epoch_value({"loss": 0.2}, "rmse", False) is None


@pytest.mark.slow
def test_distributed_trials_above_the_slots_queue_instead_of_deadlocking(spark, nonlinear,
                                                                         tmp_path):
    import optuna

    from sparkdist.models import TorchEstimator

    train, _ = nonlinear
    small = train.limit(400).repartition(2).cache()
    net = TorchEstimator(numWorkers=2, epochs=2, progress=False, batchSize=128,
                         validationFraction=0.25)
    start = time.monotonic()
    storage = f"sqlite:///{tmp_path}/torch.db"
    model = Tuner(estimator=net, evaluator="accuracy", numTrials=2, parallelism=2,
                  pruner="median", refit=False, studyName="torch", storage=storage,
                  space={"learningRate": FloatDistribution(1e-3, 1e-1, log=True)}).fit(small)
    small.unpersist()
    rows = model.trials.collect()
    assert [r.state for r in rows] == ["COMPLETE", "COMPLETE"], rows
    assert time.monotonic() - start < 300
    assert len(model.bestModel.history) == 2
    # both trials wanted both task slots at once: the second fit began after the first ended
    trials = optuna.load_study(study_name="torch", storage=storage).get_trials()
    (a_start, a_end), (b_start, b_end) = sorted(
        (t.user_attrs["fitStart"], t.user_attrs["fitEnd"]) for t in trials)
    assert a_end <= b_start
    # each epoch's validation accuracy was reported to its trial (for the pruner)
    assert all(len(t.intermediate_values) == 2 for t in trials)


def test_barrier_fits_hold_their_slots_in_the_gate(spark):
    from sparkdist.models import TorchEstimator, XGBoostClassifier
    from sparkdist.tuning._trials import slots_of

    assert slots_of(Pipeline(stages=[TorchEstimator(numWorkers=2)]), 8, 2) == 2
    assert slots_of(XGBoostClassifier(num_workers=1), 8, 2) == 1
    # LR's all-reduce takes one rank per partition, up to the task slots; MLlib's none
    assert slots_of(LogisticRegression(solver="auto"), 8, 2) == 2
    assert slots_of(LogisticRegression(solver="allreduce"), 1, 2) == 1
    assert slots_of(_lr(), 8, 2) == 0


def test_one_metric_is_scored_alone_and_equals_the_full_evaluation(assembled):
    from sparkdist.evaluation import evaluate

    model = _lr().fit(assembled)
    full = evaluate(model, assembled)
    alone = evaluate(model, assembled, metrics=["auc"])  # not cached: summed in another order
    assert list(alone) == ["auc"] and alone["auc"] == pytest.approx(full["auc"], abs=1e-12)
    # a name the task does not have is left out
    f1 = evaluate(model, assembled, metrics=["f1", "rmse"])
    assert list(f1) == ["f1"] and f1["f1"] == pytest.approx(full["f1"], abs=1e-12)
