"""Tuner and TunerModel: hyperparameter search over any sparkdist estimator (or a Pipeline
ending in one) as pyspark.ml stages, with Optuna's samplers, pruners and study storage.

Each trial is an ordinary fit of the estimator with the sampled Params, run from a driver
thread, ``parallelism`` trials at a time; a trial of an estimator that trains in a barrier
stage (``numWorkers`` / ``num_workers`` tasks) starts only when that many task slots are free,
so a ``parallelism`` above what the cluster holds queues instead of deadlocking.

Pruning runs during the fits: each epoch's validation value that rank 0 reports is given to
the trial, and rank 0 waits for the answer; where the pruner prunes the trial, every rank
ends the fit after that epoch (or, where rank 0 cannot be answered, the fit's barrier job is
cancelled); the trial is recorded PRUNED once its tasks have ended, so its slots are free
(``pruneSeconds``).
"""

from __future__ import annotations

import json
from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasSeed
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from sparkdist._params import stable_seed
from sparkdist.columns import col, require_columns
from sparkdist.exceptions import ParamError, TrainingError
from sparkdist.persist import ParamsPersistence, PersistentModel, load_model, save_model
from sparkdist.tuning import _space, _trials
from sparkdist.tuning._accessors_tuner import _TunerAccessors, _TunerModelAccessors

TRIALS_SCHEMA = StructType([
    StructField("number", LongType(), False), StructField("params", StringType(), False),
    StructField("metric", DoubleType(), True), StructField("state", StringType(), False),
    StructField("seconds", DoubleType(), True), StructField("error", StringType(), True),
    StructField("epochs", LongType(), True), StructField("pruneSeconds", DoubleType(), True)])
_SPACE_ATTR, _METRIC_ATTR = "sparkdist.space", "sparkdist.metric"
_FINISHED = ("COMPLETE", "PRUNED", "FAIL")


class _TunerParams(HasSeed):
    """The Params Tuner and TunerModel share (all JSON values, saved with the model)."""

    numTrials: Param[int] = Param(
        Params._dummy(), "numTrials", "trials in the study (finished trials of a resumed "
        "study count), >= 1; default 10, or the grid's size for a ParamGridBuilder grid",
        typeConverter=TypeConverters.toInt)
    parallelism: Param[int] = Param(
        Params._dummy(), "parallelism", "trials run at once from driver threads, >= 1",
        typeConverter=TypeConverters.toInt)
    validationFraction: Param[float] = Param(
        Params._dummy(), "validationFraction", "fraction of the rows held out to score "
        "trials, in (0, 1), by sparkdist.features.split (deterministic for a seed)",
        typeConverter=TypeConverters.toFloat)
    validationCol: Param[str] = Param(
        Params._dummy(), "validationCol", "boolean column: true marks the validation rows "
        "(replaces validationFraction)", typeConverter=TypeConverters.toString)
    studyName: Param[str] = Param(
        Params._dummy(), "studyName", "the Optuna study's name; with storage, a study of this "
        "name is resumed (its finished trials are not run again)",
        typeConverter=TypeConverters.toString)
    storage: Param[str] = Param(
        Params._dummy(), "storage", "Optuna storage URL (e.g. sqlite:///tuning.db); None keeps "
        "the study in memory", typeConverter=TypeConverters.toString)
    refit: Param[bool] = Param(
        Params._dummy(), "refit", "True: bestModel is fitted again on all rows with the best "
        "Params; False: bestModel is the best trial's own model",
        typeConverter=TypeConverters.toBoolean)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(numTrials=10, parallelism=1, validationFraction=0.2,
                         validationCol=None, studyName=None, storage=None, refit=True,
                         seed=stable_seed("Tuner"))


class Tuner(Estimator, _TunerParams, ParamsPersistence, _TunerAccessors):
    """Search the Params of ``estimator`` for the best validation metric; fit returns a
    :class:`TunerModel`.

    Parameters
    ----------
    estimator : a sparkdist estimator, or a Pipeline ending in one.
    space : dict of Param name -> Optuna distribution (``FloatDistribution``,
        ``IntDistribution``, ``CategoricalDistribution``), or a ``ParamGridBuilder`` grid
        (searched exhaustively with Optuna's GridSampler). A name is looked up in the
        Pipeline's stages, last stage first.
    evaluator : a metric name of :mod:`sparkdist.evaluation` (auc, pr_auc, accuracy, f1,
        logloss, rmse, mae, r2) or a pyspark Evaluator; the direction follows from it.
    sampler : "tpe" (default), "random" or an Optuna sampler object (seeded by ``seed`` when
        given by name).
    pruner : "none" (default), "median", "asha" or an Optuna pruner object. An estimator that
        validates per epoch (TorchEstimator, KerasEstimator) without validation rows of its
        own is given the Tuner's validation rows, and each epoch's value reaches the pruner
        while the fit runs; a pruned fit ends after that epoch.

    A trial whose fit fails is recorded as FAIL with its error and the study goes on;
    TrainingError when no trial completes. A metric that does not fit the model's task stops
    the study with a ParamError.

    Examples
    --------
    >>> from optuna.distributions import FloatDistribution
    >>> from sparkdist.models import LogisticRegression
    >>> tuner = Tuner(estimator=LogisticRegression(labelCol="cancelled_within_week"),
    ...               space={"regParam": FloatDistribution(1e-4, 1.0, log=True)},
    ...               evaluator="auc", numTrials=4, parallelism=2)
    >>> tuner.getOrDefault("pruner"), tuner.getOrDefault("numTrials")
    ('none', 4)
    """

    estimator: Param[Any] = Param(Params._dummy(), "estimator", "the estimator (or Pipeline) "
                                  "each trial fits")
    space: Param[Any] = Param(Params._dummy(), "space", "Param name -> Optuna distribution, "
                              "or a ParamGridBuilder grid")
    evaluator: Param[Any] = Param(Params._dummy(), "evaluator", "a sparkdist.evaluation metric "
                                  "name or a pyspark Evaluator")
    sampler: Param[Any] = Param(Params._dummy(), "sampler", "'tpe', 'random' or an Optuna "
                                "sampler")
    pruner: Param[Any] = Param(
        Params._dummy(), "pruner", "'none', 'median' (Optuna's MedianPruner), 'asha' "
        "(SuccessiveHalvingPruner) or an Optuna pruner, fed each epoch's validation value "
        "while the trial's fit runs")

    @keyword_only
    def __init__(self, *, estimator: Any = None, space: Any = None, evaluator: Any = None,
                 sampler: Any = "tpe", numTrials: int = 10, parallelism: int = 1,
                 pruner: Any = "none", validationFraction: float = 0.2,
                 validationCol: str | None = None, studyName: str | None = None,
                 storage: str | None = None, refit: bool = True,
                 seed: int | None = None) -> None:
        super().__init__()
        self._setDefault(sampler="tpe", pruner="none")
        self._set(**self._input_kwargs)  # type: ignore[attr-defined]

    @keyword_only
    def setParams(self, *, estimator: Any = None, space: Any = None, evaluator: Any = None,
                  sampler: Any = "tpe", numTrials: int = 10, parallelism: int = 1,
                  pruner: Any = "none", validationFraction: float = 0.2,
                  validationCol: str | None = None, studyName: str | None = None,
                  storage: str | None = None, refit: bool = True,
                  seed: int | None = None) -> Tuner:
        return self._set(**self._input_kwargs)  # type: ignore[attr-defined, no-any-return]

    # -- fit: validate -> split -> study -> trials -> best model
    def _fit(self, dataset: DataFrame) -> TunerModel:
        get = self.getOrDefault
        estimator, space, grid = self._checked_space()
        metric, maximize = _space.check_metric(get("evaluator"))
        self._check_values(dataset)
        pruner = _space.make_pruner(get("pruner"))
        sampler = _space.make_sampler(get("sampler"), space, grid, get("seed"))
        study = self._study(space, metric, maximize, sampler, pruner)
        total = get("numTrials")
        if grid and not self.isSet(self.numTrials):
            total = len(get("space"))
        train, validation = self._split(dataset)
        trial_estimator, fit_rows = _trials.with_validation_rows(estimator, train, validation)
        run = _trials.TrialRun(
            estimator=trial_estimator, train=fit_rows, validation=validation,
            score=self._scorer(metric), maximize=maximize, metric=metric,
            gate=_trials.SlotGate(_task_slots(dataset)), keep_models=not get("refit"),
            parent_run=_trials.active_parent_run())
        try:
            _trials.rerun_interrupted(study)
            done = sum(t.state.name in _FINISHED and not t.user_attrs.get("interrupted")
                       for t in study.get_trials(deepcopy=False))
            _trials.run_trials(study, run, max(0, total - done), get("parallelism"), space)
        finally:
            train.unpersist()
            validation.unpersist()
        best = _best_trial(study)
        model = run.best.get("model") if run.best.get("number") == best.number else None
        if model is None:  # refit, or the best trial ran in an earlier session
            model = self._fit_best(run, estimator, best.params, dataset)
        result = TunerModel(bestModel=model, bestParams=dict(best.params),
                            bestValue=float(best.value), metric=metric,
                            trials=_trial_rows(study))
        self._copyValues(result)
        return result

    def _checked_space(self) -> tuple[Any, dict[str, Any], bool]:
        estimator = self.getOrDefault("estimator")
        if not isinstance(estimator, Estimator):
            raise ParamError(f"estimator={estimator!r}: give a sparkdist estimator or a "
                             "Pipeline ending in one.")
        space = self.getOrDefault("space")
        if _space.is_grid(space):
            return estimator, _space.grid_space(estimator, space), True
        return estimator, _space.check_space(estimator, space), False

    def _check_values(self, dataset: DataFrame) -> None:
        get = self.getOrDefault
        for name in ("numTrials", "parallelism"):
            if get(name) < 1:
                raise ParamError(f"{name}={get(name)}: use 1 or more.")
        if get("validationCol") is not None:
            require_columns(dataset.schema, [get("validationCol")], "validationCol")
        elif not 0 < get("validationFraction") < 1:
            raise ParamError(f"validationFraction={get('validationFraction')}: use a fraction "
                             "in (0, 1), e.g. 0.2, or set validationCol.")
        if get("storage") is not None and not get("studyName"):
            raise ParamError(f"storage={get('storage')!r} needs a studyName: the name is how a "
                             "later fit finds the study to resume.")

    def _split(self, dataset: DataFrame) -> tuple[DataFrame, DataFrame]:
        from sparkdist.features.split import split

        name = self.getOrDefault("validationCol")
        if name is not None:
            flag = F.coalesce(col(name).cast("boolean"), F.lit(False))
            train, validation = dataset.filter(~flag), dataset.filter(flag)
        else:
            fraction = self.getOrDefault("validationFraction")
            parts = split(dataset, {"train": 1 - fraction, "validation": fraction},
                          seed=self.getOrDefault("seed"))
            train, validation = parts["train"], parts["validation"]
        return train.cache(), validation.cache()

    def _scorer(self, metric: str) -> Any:
        evaluator = self.getOrDefault("evaluator")
        if not isinstance(evaluator, str):
            return lambda model, df: float(evaluator.evaluate(model.transform(df)))

        def score(model: Any, df: DataFrame) -> float:
            from sparkdist.evaluation import evaluate, final_stage, task_of

            metrics = evaluate(model, df, metrics=[metric])
            if metric not in metrics:
                metrics = evaluate(model, df)  # to name the metrics the task gives
                raise ParamError(
                    f"evaluator={metric!r} does not match the model's task "
                    f"'{task_of(final_stage(model))}': it gives {sorted(metrics)}; choose one "
                    "of those.")
            return float(metrics[metric])
        return score

    def _study(self, space: dict[str, Any], metric: str, maximize: bool, sampler: Any,
               pruner: Any) -> Any:
        optuna = _space.optuna_module()
        name, storage = self.getOrDefault("studyName"), self.getOrDefault("storage")
        try:
            study = optuna.create_study(
                storage=storage, sampler=sampler, pruner=pruner, study_name=name,
                direction="maximize" if maximize else "minimize", load_if_exists=True)
        except ValueError as err:  # e.g. the stored study optimises the other direction
            raise ParamError(f"studyName={name!r} in {storage!r} cannot be used: {err}. Use "
                             "another studyName.") from err
        wanted = {_SPACE_ATTR: _space.signature(space), _METRIC_ATTR: metric}
        for key, value in wanted.items():
            held = study.user_attrs.get(key)
            if held is None:
                study.set_user_attr(key, value)
            elif held != value:
                what = "space" if key == _SPACE_ATTR else "metric"
                raise ParamError(f"studyName={name!r} exists in {storage!r} with another "
                                 f"{what} ({held}); resume it with the same {what}, or use "
                                 "another studyName.")
        return study

    def _fit_best(self, run: _trials.TrialRun, estimator: Any, params: dict[str, Any],
                  dataset: DataFrame) -> Any:
        estimator = _trials.with_params(estimator, params)
        slots = run.slots(estimator)
        run.gate.acquire(slots)
        try:
            return estimator.fit(dataset)
        finally:
            run.gate.release(slots)


def _task_slots(dataset: DataFrame) -> int:
    from sparkdist.launch.preflight import task_slots

    return task_slots(dataset.sparkSession)


def _best_trial(study: Any) -> Any:
    """The best COMPLETE trial, or TrainingError naming why there is none."""
    trials = study.get_trials(deepcopy=False)
    if any(t.state.name == "COMPLETE" for t in trials):
        return study.best_trial
    failed = [t for t in trials if t.state.name == "FAIL"]
    first = failed[0].user_attrs.get("error", "no error recorded") if failed else ""
    raise TrainingError(
        f"no trial of the study completed ({len(failed)} of {len(trials)} failed"
        + (f"; the first: {first}" if failed else "") + "). Check the estimator and the space "
        "(tuner.fit raises only after every trial failed or was pruned).")


def _trial_rows(study: Any) -> list[dict[str, Any]]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        seconds = t.user_attrs.get("seconds")
        rows.append({"number": int(t.number), "params": json.dumps(t.params, sort_keys=True),
                     "metric": None if t.value is None else float(t.value),
                     "state": t.state.name, "seconds": None if seconds is None else float(seconds),
                     "error": t.user_attrs.get("error"), "epochs": t.user_attrs.get("epochs"),
                     "pruneSeconds": t.user_attrs.get("pruneSeconds")})
    return rows


class TunerModel(Model, _TunerParams, PersistentModel, _TunerModelAccessors):
    """The result of :class:`Tuner`: ``bestModel`` (transform delegates to it),
    ``bestParams``, ``bestValue``, ``metric`` and ``trials`` (a DataFrame: number, params as
    JSON, metric, state, seconds, error). Saved with its best model nested under its path."""

    def __init__(self, bestModel: Any = None, bestParams: dict[str, Any] | None = None,
                 bestValue: float = float("nan"), metric: str = "",
                 trials: list[dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.bestModel = bestModel
        self.bestParams = dict(bestParams or {})
        self.bestValue = bestValue
        self.metric = metric
        self._trial_rows = list(trials or [])

    @property
    def trials(self) -> DataFrame:
        spark = SparkSession.active()
        return spark.createDataFrame([tuple(r.get(f.name) for f in TRIALS_SCHEMA.fields)
                                      for r in self._trial_rows], TRIALS_SCHEMA)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        return self.bestModel.transform(dataset)  # type: ignore[no-any-return]

    def _state(self) -> dict[str, Any]:
        return {"bestParams": self.bestParams, "bestValue": self.bestValue,
                "metric": self.metric, "trials": self._trial_rows}

    def _save_artifacts(self, path: str) -> None:
        save_model(self.bestModel, f"{path}/bestModel")

    @classmethod
    def _from_state(cls, state: dict[str, Any], path: str) -> TunerModel:
        return cls(bestModel=load_model(f"{path}/bestModel"), bestParams=state["bestParams"],
                   bestValue=float(state["bestValue"]), metric=str(state["metric"]),
                   trials=state["trials"])
