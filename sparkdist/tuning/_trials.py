"""Running a Tuner's trials: each one an ordinary fit of the estimator with the sampled Params,
from a driver thread, ``parallelism`` at a time, behind a gate on the cluster's task slots
for estimators that train in barrier stages (``numWorkers`` / ``num_workers`` tasks each);
then the metric on the validation rows, the per-epoch history reported to the trial, and an
MLflow child run when a run is active."""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame

from sparkdist.exceptions import ClusterConfigError, FitStopped, ParamError
from sparkdist.launch import observe
from sparkdist.tuning._space import find_param, optuna_module, stages

_LOG = logging.getLogger(__name__)
#: The Params that say how many barrier tasks (task slots) one fit takes.
WORKER_PARAMS = ("numWorkers", "num_workers")


class SlotGate:
    """Counts the cluster's task slots between trials: a distributed trial starts only when
    its ``numWorkers`` slots are free, so more concurrent trials than the cluster holds wait
    here instead of in Spark's barrier scheduler."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._cond = threading.Condition()

    def acquire(self, slots: int) -> None:
        if slots > self.total:
            raise ClusterConfigError(
                f"numWorkers={slots} exceeds the {self.total} task slots of this cluster; "
                "lower numWorkers in the estimator or the space, or add executors.")
        with self._cond:
            self._cond.wait_for(lambda: self.free >= slots)
            self.free -= slots

    def release(self, slots: int) -> None:
        with self._cond:
            self.free += slots
            self._cond.notify_all()


def slots_of(estimator: Any, partitions: int, total: int) -> int:
    """The barrier task slots one fit of ``estimator`` takes (0 for non-barrier fits): its
    ``numWorkers``; for sparkdist's LogisticRegression with a solver that may all-reduce,
    one rank per partition of its input (``partitions``) up to the cluster's ``total``, as
    its plan takes them (where 'auto' then picks MLlib, the slots were held for nothing)."""
    from sparkdist.models.logistic import LogisticRegression

    for stage in stages(estimator):
        for name in WORKER_PARAMS:
            if stage.hasParam(name):
                return int(stage.getOrDefault(name))
        if isinstance(stage, LogisticRegression) and stage.getSolver() != "mllib":
            return max(1, min(partitions, total))
    return 0


def with_params(estimator: Any, values: Mapping[str, Any]) -> Any:
    """A copy of ``estimator`` (or Pipeline) with the Params named in ``values`` set."""
    extra = {find_param(estimator, name, "space")[1]: value for name, value in values.items()}
    return estimator.copy(extra)


def for_trial(estimator: Any, values: Mapping[str, Any], number: int) -> Any:
    """The estimator of trial ``number``: ``values`` set, and a ``runId`` the user set made
    the trial's own (``<runId>-trial-<number>``), so that trials never resume, or wait for,
    each other's checkpointed runs."""
    trial = with_params(estimator, values)
    for stage in stages(trial):
        if stage.hasParam("runId") and stage.isSet("runId") and stage.getOrDefault("runId"):
            stage.set(stage.getParam("runId"), f"{stage.getOrDefault('runId')}-trial-{number}")
    return trial


#: The column that marks the Tuner's validation rows where a trial's estimator takes them.
VALIDATION_FLAG = "__sparkdist_tuner_validation"


def with_validation_rows(estimator: Any, train: DataFrame,
                         validation: DataFrame) -> tuple[Any, DataFrame]:
    """The estimator and rows each trial fits. An estimator that validates per epoch or round
    (``validationIndicatorCol``: TorchEstimator, KerasEstimator, XGBoost) and has no
    validation rows of its own is given the Tuner's, flagged, so the validation values the
    pruner judges are measured on the rows the trial is scored on."""
    from pyspark.sql import functions as F

    final = stages(estimator)[0]
    own = final.hasParam("validationFraction") and final.getOrDefault("validationFraction") > 0
    if not final.hasParam("validationIndicatorCol") or own \
            or final.isSet("validationIndicatorCol"):
        return estimator, train
    rows = train.withColumn(VALIDATION_FLAG, F.lit(False)).unionByName(
        validation.withColumn(VALIDATION_FLAG, F.lit(True)))
    return estimator.copy({final.getParam("validationIndicatorCol"): VALIDATION_FLAG}), rows


@dataclass
class TrialRun:
    """What the trials share: the data, the metric and the bookkeeping."""

    estimator: Any
    train: DataFrame
    validation: DataFrame
    score: Callable[[Any, DataFrame], float]
    maximize: bool
    metric: str
    gate: SlotGate
    keep_models: bool
    parent_run: Any = None
    best: dict[str, Any] = field(default_factory=dict)
    aborted: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    partitions: int = 0  # the fit rows' partitions, read on the first trial

    def slots(self, estimator: Any) -> int:
        with self.lock:
            self.partitions = self.partitions or self.train.rdd.getNumPartitions()
        return slots_of(estimator, self.partitions, self.gate.total)


def run_trials(study: Any, run: TrialRun, count: int, parallelism: int,
               fixed: Mapping[str, Any]) -> None:
    """Ask ``study`` for ``count`` trials and run them, ``parallelism`` at a time; an error
    that concerns the study (a metric that does not fit the model) stops it and is raised."""
    def one(_: int) -> None:
        if run.aborted:
            return
        trial = study.ask(dict(fixed))
        try:
            _run_one(study, trial, run)
        except ParamError as err:  # the study is misconfigured: every trial would fail
            run.aborted.append(err)

    with ThreadPoolExecutor(max_workers=max(1, parallelism),
                            thread_name_prefix="sparkdist-trial") as pool:
        list(pool.map(one, range(count)))
    if run.aborted:
        raise run.aborted[0]


def rerun_interrupted(study: Any) -> int:
    """Trials a stopped driver left RUNNING (one Tuner drives a study at a time) are recorded
    FAIL, marked ``interrupted`` (not counted as run), and their Params queued to run again;
    how many there were. A trial stopped before its Params were drawn has none to repeat."""
    optuna = optuna_module()
    storage = study._storage  # Optuna's storage API; the study exposes no public handle
    left = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for trial in left:
        storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
        storage.set_trial_user_attr(trial._trial_id, "error", "the driver stopped while the "
                                    "trial ran; " + ("its Params are run again" if trial.params
                                                     else "no Params were drawn yet"))
        storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
        if trial.params:
            study.enqueue_trial(trial.params, skip_if_exists=False)
    if left:
        _LOG.warning("%d trial(s) of study %r were left running by a driver that stopped: "
                     "recorded FAIL and queued again", len(left), study.study_name)
    return len(left)


def _run_one(study: Any, trial: Any, run: TrialRun) -> None:
    start = time.monotonic()
    estimator = for_trial(run.estimator, trial.params, trial.number)
    slots = run.slots(estimator)
    pruning = _Pruning(trial, run)
    try:
        run.gate.acquire(slots)
        start = time.monotonic()  # a trial's seconds leave out its wait for slots
        try:
            trial.set_user_attr("fitStart", time.time())  # wall clock, across processes
            with observe.observing(pruning):
                model = estimator.fit(run.train)
        finally:
            trial.set_user_attr("fitEnd", time.time())
            run.gate.release(slots)
    except FitStopped as stop:  # the pruner stopped it: its tasks have ended
        _tell_pruned(study, trial, pruning, start, stop.free_seconds)
        _child_run(run, trial, None, "PRUNED", pruning.records)
        return
    except Exception as err:  # a failed fit is a failed trial; the study goes on
        _LOG.warning("trial %d failed: %s", trial.number, err)
        _tell_failed(study, trial, err, start)
        _child_run(run, trial, None, "FAIL", pruning.records)
        return
    try:
        value = run.score(model, run.validation)
    except ParamError as err:  # a metric the model cannot give: raised by run_trials
        _tell_failed(study, trial, err, start)
        raise
    except Exception as err:
        _LOG.warning("trial %d could not be scored: %s", trial.number, err)
        _tell_failed(study, trial, err, start)
        _child_run(run, trial, None, "FAIL", pruning.records)
        return
    records = pruning.records or _history(model)
    if not pruning.records:  # no live reports (e.g. no report channel): judge the history
        _report_history(trial, records, run)
    if pruning.stopped or (not pruning.records and _should_prune(trial)):
        _tell_pruned(study, trial, pruning, start, None)
        _child_run(run, trial, value, "PRUNED", records)
        return
    trial.set_user_attr("seconds", time.monotonic() - start)
    if records:
        trial.set_user_attr("epochs", len(records))
    study.tell(trial, value)
    _keep_best(run, trial, model, value)
    _child_run(run, trial, value, "COMPLETE", records)


class _Pruning:
    """The observer of a trial's fit: reports each epoch's validation value to the trial and
    asks the pruner whether to stop (True stops the fit: sparkdist.launch.observe)."""

    def __init__(self, trial: Any, run: TrialRun) -> None:
        self.trial, self.run = trial, run
        self.records: list[dict[str, Any]] = []
        self.stopped = False

    def __call__(self, record: dict[str, Any]) -> bool:
        self.records.append(record)
        value = epoch_value(record, self.run.metric, self.run.maximize)
        if value is None:
            return False
        self.trial.report(value, int(record.get("epoch", len(self.records))) - 1)
        self.stopped = self.stopped or _should_prune(self.trial)
        return self.stopped


def _should_prune(trial: Any) -> bool:
    return bool(trial.should_prune())


def _tell_pruned(study: Any, trial: Any, pruning: _Pruning, start: float,
                 free_seconds: float | None) -> None:
    optuna = optuna_module()
    trial.set_user_attr("epochs", len(pruning.records))
    if free_seconds is not None:
        trial.set_user_attr("pruneSeconds", free_seconds)
    trial.set_user_attr("seconds", time.monotonic() - start)
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)


def _tell_failed(study: Any, trial: Any, err: BaseException, start: float) -> None:
    optuna = optuna_module()
    message = "".join(traceback.format_exception_only(type(err), err)).strip()
    trial.set_user_attr("error", message[:2000])
    trial.set_user_attr("seconds", time.monotonic() - start)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def _keep_best(run: TrialRun, trial: Any, model: Any, value: float) -> None:
    with run.lock:
        best = run.best.get("value")
        better = best is None or (value > best if run.maximize else value < best)
        if better and not math.isnan(value):
            run.best.update(value=value, number=trial.number,
                            model=model if run.keep_models else None)


def epoch_value(record: Mapping[str, Any], metric: str, maximize: bool) -> float | None:
    """One epoch's validation value in the study's direction: ``val_<metric>``, else
    ``val_accuracy`` (maximising), else ``val_loss`` (negated when maximising, e.g. r2 of a
    regression); None where the record has no validation value."""
    keys = [(f"val_{metric}", 1.0)] + ([("val_accuracy", 1.0), ("val_loss", -1.0)]
                                       if maximize else [("val_loss", 1.0)])
    for key, sign in keys:
        if isinstance(record.get(key), (int, float)):
            return sign * float(record[key])
    return None


def _history(model: Any) -> list[dict[str, Any]]:
    """The fitted model's per-epoch records (TorchModel, KerasModel), else []."""
    history = getattr(stages(model)[0], "history", None)
    return [rec for rec in history if isinstance(rec, dict)] if isinstance(history, list) else []


def _report_history(trial: Any, records: list[dict[str, Any]], run: TrialRun) -> None:
    """Report each epoch's validation value to the trial after its fit (where no report came
    while it ran): the pruner's state is right for the trials after it."""
    for step, record in enumerate(records):
        value = epoch_value(record, run.metric, run.maximize)
        if value is not None:
            trial.report(value, step)


def _child_run(run: TrialRun, trial: Any, value: float | None, state: str,
               records: list[dict[str, Any]]) -> None:
    """One MLflow run per trial under the run that was active when fit started: its Params,
    its metric, each epoch's record as metrics by step, and its state as a tag."""
    if run.parent_run is None:
        return
    from mlflow.entities import Metric, Param

    client, parent = run.parent_run
    try:
        child = client.create_run(parent.info.experiment_id, run_name=f"trial-{trial.number}",
                                  tags={"mlflow.parentRunId": parent.info.run_id,
                                        "sparkdist.trialState": state})
        now = int(time.time() * 1000)
        metrics = [Metric(key, float(v), now, step) for step, rec in enumerate(records)
                   for key, v in rec.items()
                   if key not in ("epoch", "epochs") and isinstance(v, (int, float))
                   and not isinstance(v, bool) and math.isfinite(v)]
        if value is not None and not math.isnan(value):
            metrics.append(Metric(run.metric, float(value), now, 0))
        client.log_batch(child.info.run_id, metrics=metrics, params=[
            Param(name, str(param)[:6000]) for name, param in trial.params.items()])
        client.set_terminated(child.info.run_id, "FINISHED" if state != "FAIL" else "FAILED")
    except Exception as err:  # tracking must not fail the study
        _LOG.warning("MLflow child run of trial %d not logged: %s", trial.number, err)


def active_parent_run() -> Any:
    """(MlflowClient, the active run) when an MLflow run is active, else None (MLflow is not
    imported for this: without it imported, no run can be active)."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or mlflow.active_run() is None:
        return None
    return mlflow.MlflowClient(), mlflow.active_run()
