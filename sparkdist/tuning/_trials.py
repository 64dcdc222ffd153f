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

from sparkdist.exceptions import ClusterConfigError, ParamError
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


def slots_of(estimator: Any) -> int:
    """The barrier task slots one fit of ``estimator`` takes (0 for non-barrier fits)."""
    for stage in stages(estimator):
        for name in WORKER_PARAMS:
            if stage.hasParam(name):
                return int(stage.getOrDefault(name))
    return 0


def with_params(estimator: Any, values: Mapping[str, Any]) -> Any:
    """A copy of ``estimator`` (or Pipeline) with the Params named in ``values`` set."""
    extra = {find_param(estimator, name, "space")[1]: value for name, value in values.items()}
    return estimator.copy(extra)


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


def _run_one(study: Any, trial: Any, run: TrialRun) -> None:
    optuna = optuna_module()
    start = time.monotonic()
    estimator = with_params(run.estimator, trial.params)
    slots = slots_of(estimator)
    try:
        run.gate.acquire(slots)
        try:
            trial.set_user_attr("fitStart", time.time())  # wall clock, across processes
            model = estimator.fit(run.train)
        finally:
            trial.set_user_attr("fitEnd", time.time())
            run.gate.release(slots)
    except Exception as err:  # a failed fit is a failed trial; the study goes on
        _LOG.warning("trial %d failed: %s", trial.number, err)
        _tell_failed(study, trial, err, start)
        _child_run(run, trial, None, "FAIL")
        return
    try:
        value = run.score(model, run.validation)
    except ParamError as err:  # a metric the model cannot give: raised by run_trials
        _tell_failed(study, trial, err, start)
        raise
    except Exception as err:
        _LOG.warning("trial %d could not be scored: %s", trial.number, err)
        _tell_failed(study, trial, err, start)
        _child_run(run, trial, None, "FAIL")
        return
    pruned = _report_history(trial, model, run)
    trial.set_user_attr("seconds", time.monotonic() - start)
    if pruned:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(trial, value)
        _keep_best(run, trial, model, value)
    _child_run(run, trial, value, "PRUNED" if pruned else "COMPLETE")


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


def epoch_values(model: Any, metric: str, maximize: bool) -> list[float]:
    """Per-epoch validation values from the fitted model's ``history`` (TorchModel,
    KerasModel): ``val_<metric>``, else ``val_loss`` (minimising) or ``val_accuracy``
    (maximising); [] when the history has none."""
    final = stages(model)[0]
    history = getattr(final, "history", None)
    if not isinstance(history, list) or not history:
        return []
    fallback = "val_accuracy" if maximize else "val_loss"
    for key in (f"val_{metric}", fallback):
        values = [float(rec[key]) for rec in history if isinstance(rec, dict) and key in rec]
        if values:
            return values
    return []


def _report_history(trial: Any, model: Any, run: TrialRun) -> bool:
    """Report each epoch's validation value to the trial (after the fit: the pruner's state
    is right, the fit itself is not stopped early); whether the pruner prunes the trial."""
    values = epoch_values(model, run.metric, run.maximize)
    for step, value in enumerate(values):
        trial.report(value, step)
    return bool(values) and bool(trial.should_prune())


def _child_run(run: TrialRun, trial: Any, value: float | None, state: str) -> None:
    """One MLflow run per trial under the run that was active when fit started."""
    if run.parent_run is None:
        return
    client, parent = run.parent_run
    try:
        child = client.create_run(parent.info.experiment_id, run_name=f"trial-{trial.number}",
                                  tags={"mlflow.parentRunId": parent.info.run_id,
                                        "sparkdist.trialState": state})
        for name, param in trial.params.items():
            client.log_param(child.info.run_id, name, str(param)[:6000])
        if value is not None and not math.isnan(value):
            client.log_metric(child.info.run_id, run.metric, float(value))
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
