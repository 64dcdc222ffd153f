"""features -> split -> fit -> evaluate -> track: the one flow behind the CLI, jobs and notebooks.

Examples
--------
>>> from sparkdist.config import parse_config
>>> config = parse_config({
...     "name": "churn",
...     "data": {"generate": {"dataset": "churn", "rows": 2000}},
...     "features": {"numericCols": ["month_interaction_count"], "categoricalCols": ["plan"],
...                  "labelCol": "cancelled_within_week"},
...     "models": [{"type": "LogisticRegression", "params": {"maxIter": 10}}],
...     "tracking": {"enabled": False}})
>>> result = run(config, spark, progress=lambda line: None)  # progress: print by default
>>> print(result.table())
model                 fit s   accuracy        auc         f1    logloss     pr_auc
--------...
LogisticRegression ...

From a file, as ``make demo`` does: ``run(load_config("jobs/configs/churn.yaml"))``
(:func:`sparkdist.config.load_config`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.ml import Estimator, Pipeline, PipelineModel
from pyspark.sql import DataFrame, SparkSession

from sparkdist import datasets, store
from sparkdist.columns import suggest
from sparkdist.config import ConfigError, DataConfig, ModelConfig, WorkflowConfig
from sparkdist.evaluation import evaluate, final_stage, task_of
from sparkdist.exceptions import ParamError
from sparkdist.features import FeatureAssembler, FeatureAssemblerModel, split
from sparkdist.features.split import training_split
from sparkdist.persist import save_model
from sparkdist.session import get_spark

Progress = Callable[[str], None]


@dataclass
class ModelResult:
    name: str
    params: dict[str, Any]
    model: PipelineModel
    metrics: dict[str, float]
    fit_seconds: float
    run_id: str | None = None


@dataclass
class WorkflowResult:
    config: WorkflowConfig
    split: dict[str, Any]
    models: list[ModelResult] = field(default_factory=list)
    run_id: str | None = None

    def table(self) -> str:
        """The models side by side: fit time and every metric, in aligned columns."""
        metrics = sorted({m for r in self.models for m in r.metrics})
        width = max(len("model"), *(len(r.name) for r in self.models))
        widths = [max(9, len(m)) for m in metrics]  # "precision@10" is wider than a value
        head = f"{'model':<{width}}  {'fit s':>7}" + "".join(
            f"  {m:>{w}}" for m, w in zip(metrics, widths))
        lines = [head, "-" * len(head)]
        for r in self.models:
            cells = "".join(f"  {r.metrics.get(m, float('nan')):>{w}.4f}"
                            for m, w in zip(metrics, widths))
            lines.append(f"{r.name:<{width}}  {r.fit_seconds:>7.1f}{cells}")
        return "\n".join(lines)


def run(config: WorkflowConfig, spark: SparkSession | None = None,
        progress: Progress = print) -> WorkflowResult:
    """Run ``config``: load, split, then fit, evaluate, save and track each model."""
    # Fail fast: parameter names and values before Spark starts, their ranges (xgboost.spark's
    # checks build a session when none is active: sparkdist's comes first) before any data.
    estimators = {str(m.name): build_estimator(m, config, check=False) for m in config.models}
    _check_outputs(config)
    spark = spark or get_spark(app_name=f"sparkdist-{config.name}")
    for m in config.models:
        _check_ranges(m, estimators[str(m.name)])
        _one_display(estimators[str(m.name)])
    progress(f"loading data ({_describe(config.data)})")
    parts = split(load_data(spark, config.data), **_split_kwargs(config))
    fit_on = training_split(list(parts))
    score_on = "test" if "test" in parts else [n for n in parts if n != fit_on][-1]
    train, test = parts[fit_on].cache(), parts[score_on].cache()
    result = WorkflowResult(config=config, split=parts.metadata)
    progress(f"split {result.split['method']}: {result.split['counts']}")
    try:
        for i, (name, estimator) in enumerate(estimators.items(), 1):
            progress(f"[{i}/{len(estimators)}] {name}: fitting")
            params = config.models[i - 1].params
            result.models.append(_fit_one(name, params, estimator, config, train, test))
            progress(f"[{i}/{len(estimators)}] {name}: {_brief(result.models[-1])}")
        if config.tracking.enabled:
            _track(result, test, progress)
    finally:
        train.unpersist()
        test.unpersist()
    return result


def build_estimator(model: ModelConfig, config: WorkflowConfig, check: bool = True) -> Pipeline:
    """A Pipeline of the FeatureAssembler (when the config has features) and the model, its
    label/features columns defaulting to the feature config's. ``check``: the model's range
    checks too (some need a SparkSession: XGBoost's build one when none is active)."""
    import sparkdist.models

    estimator: Estimator = getattr(sparkdist.models, model.type)()
    params = dict(model.params)
    if config.features is not None:
        for param, value in (("labelCol", config.features.labelCol),
                             ("featuresCol", config.features.outputCol)):
            if estimator.hasParam(param):
                params.setdefault(param, value)
    for key, value in params.items():
        if not estimator.hasParam(key):
            names = [p.name for p in estimator.params]
            raise ConfigError(f"models[{model.name}].params: {model.type} has no parameter "
                              f"'{key}'.{suggest(key, names)}")
        try:
            estimator.set(estimator.getParam(key), value)
        except (TypeError, ValueError) as err:  # pyspark's type converter refused the value
            raise ConfigError(f"models[{model.name}].params.{key}: {value!r} is not a valid "
                              f"value ({_reason(err)}).") from None
    stages: list[Any] = [estimator]
    if config.features is not None:
        stages.insert(0, FeatureAssembler(**config.features.model_dump()))
    pipeline = Pipeline(stages=stages)
    if check:
        _check_ranges(model, pipeline)
    return pipeline


def _check_ranges(model: ModelConfig, pipeline: Pipeline) -> None:
    """The model's own checks of its Params (ranges, on the driver, no data)."""
    check = getattr(pipeline.getStages()[-1], "_check_params", None)
    if check is not None:
        try:
            check()
        except ParamError as err:
            raise ConfigError(f"models[{model.name}].params: {err}") from None


def _one_display(pipeline: Pipeline) -> None:
    """The workflow reports progress itself: a model's own progress bar (TorchEstimator's
    ``progress``) is off unless the config turns it on."""
    final = pipeline.getStages()[-1]
    if final.hasParam("progress") and not final.isSet("progress"):
        final.set(final.getParam("progress"), False)


def load_data(spark: SparkSession, data: DataConfig) -> DataFrame:
    if data.generate is not None:
        if data.generate.dataset == "churn":
            return datasets.churn(spark, n=data.generate.rows, seed=data.generate.seed)
        return datasets.ratings(spark, seed=data.generate.seed)
    if data.table is not None:
        return read_data(lambda: spark.table(str(data.table)), "data.table", ConfigError)
    return read_data(lambda: spark.read.format(data.format).load(data.path), "data.path",
                     ConfigError)


def read_data(read: Callable[[], DataFrame], where: str,
              error: type[ParamError] = ParamError) -> DataFrame:
    """``read()``, with the errors of opening data (no such path or table, an unknown format,
    files that are not of the format) as ``error`` naming ``where``. Spark resolves paths and
    infers the schema eagerly, so these come before any job."""
    try:
        return read()
    except (PySparkException, Py4JJavaError) as err:
        raise error(f"{where}: cannot read the data: {_reason(err)}") from None


def _reason(err: BaseException) -> str:
    """The first line of an error's message without the JVM's wrapping."""
    text = str(err).strip()
    if isinstance(err, Py4JJavaError):  # "An error occurred while calling o52.load.\n: ..."
        text = text.split("\n: ", 1)[-1]
    return (text.splitlines() or [type(err).__name__])[0].strip()


def _fit_one(name: str, params: dict[str, Any], estimator: Pipeline, config: WorkflowConfig,
             train: DataFrame, test: DataFrame) -> ModelResult:
    start = time.perf_counter()
    model = estimator.fit(train)
    seconds = time.perf_counter() - start
    metrics = evaluate(model, test, k=config.evaluation.get("k", 10))
    if config.output.modelDir:
        save_model(model, _model_path(config, name), overwrite=config.output.overwrite)
    return ModelResult(name=name, params=params, model=model, metrics=metrics,
                       fit_seconds=seconds)


def _track(result: WorkflowResult, test: DataFrame, progress: Progress) -> None:
    from sparkdist import tracking

    config = result.config
    table = {r.name: r.metrics for r in result.models}
    with tracking.workflow_run(config.tracking.experiment, config.name,
                               uri=config.tracking.uri) as run_id:
        tracking.log_workflow(config.model_dump(), result.split, table)
        for r in result.models:
            progress(f"tracking {r.name}")
            r.run_id = tracking.log_model_run(
                r.name, {"type": _type_of(config, r.name), **r.params}, r.metrics, r.model,
                _feature_names(r.model), figures(r.model, test, config.evaluation.get("k", 10)),
                result.split)
    result.run_id = run_id
    progress(f"MLflow run {run_id} at {tracking.tracking_uri(config.tracking.uri)}")


def figures(model: PipelineModel, test: DataFrame, k: int) -> dict[str, Any]:
    """The plots that suit the model's task."""
    from sparkdist import plots

    final = final_stage(model)
    task = task_of(final)
    if task == "recommendation":
        by_k = {kk: final.rankingMetrics(test, k=kk) for kk in sorted({1, 5, k})}
        return {"ranking_by_k": plots.ranking_by_k(by_k)}
    figs: dict[str, Any] = {}
    importances = _importances(final)
    if importances is not None:
        figs["feature_importances"] = plots.feature_importances(_feature_names(model),
                                                                importances)
    if task == "classification":
        predictions = model.transform(test).cache()
        label, prob, pred = (final.getOrDefault(p)
                             for p in ("labelCol", "probabilityCol", "predictionCol"))
        if getattr(final, "numClasses", 2) == 2:
            figs.update(plots.roc_pr_curves(predictions, label, prob))
        figs["confusion_matrix"] = plots.confusion_matrix(predictions, label, pred)
        predictions.unpersist()
    return figs


def _importances(final: Any) -> list[float] | None:
    """Tree importances, or the absolute coefficients of a binary linear model."""
    for attr in ("featureImportances", "coefficients"):
        try:
            values = getattr(final, attr)
        except Exception:  # absent, or a multinomial model with no single vector
            continue
        if values is not None:
            return [abs(float(v)) for v in values.toArray()]
    return None


def _feature_names(model: PipelineModel) -> list[str]:
    stages = model.stages if isinstance(model, PipelineModel) else []
    return next((s.featureNames for s in stages if isinstance(s, FeatureAssemblerModel)), [])


def _check_outputs(config: WorkflowConfig) -> None:
    """Refuse existing model paths before any training, unless output.overwrite."""
    if not config.output.modelDir or config.output.overwrite:
        return
    for m in config.models:
        if store.exists(_model_path(config, str(m.name))):
            raise store.PathExistsError(
                f"'{_model_path(config, str(m.name))}' already exists; set output.overwrite: "
                "true in the config, or choose another output.modelDir.")


def _model_path(config: WorkflowConfig, name: str) -> str:
    return f"{str(config.output.modelDir).rstrip('/')}/{name}"


def _split_kwargs(config: WorkflowConfig) -> dict[str, Any]:
    return config.split.model_dump(exclude_none=True)


def _type_of(config: WorkflowConfig, name: str) -> str:
    return next(m.type for m in config.models if m.name == name)


def _describe(data: DataConfig) -> str:
    if data.generate is not None:
        return f"generated {data.generate.dataset}"
    return data.table or f"{data.format} {data.path}"


def _brief(result: ModelResult) -> str:
    shown = ", ".join(f"{k} {v:.4f}" for k, v in list(result.metrics.items())[:3])
    return f"fit {result.fit_seconds:.1f}s, {shown}"
