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

import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.ml import Estimator, Pipeline, PipelineModel
from pyspark.sql import DataFrame, SparkSession

from sparkdist import datasets, store
from sparkdist.columns import suggest
from sparkdist.config import ConfigError, DataConfig, ModelConfig, WorkflowConfig, import_modules
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
    # Fail fast: the user's modules (their classes may be named in params), parameter names
    # and values, the output and tracking locations before Spark starts, the Params' ranges
    # (xgboost.spark's checks build a session when none is active: sparkdist's comes first)
    # before any data.
    import_modules(config.imports)
    estimators = {str(m.name): build_estimator(m, config, check=False) for m in config.models}
    _check_outputs(config)
    _check_tracking(config)
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
            _track(result, train, test, progress)
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
                              f"value ({reason(err)}).") from None
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
        raise error(f"{where}: cannot read the data: {reason(err)}") from None


def reason(err: BaseException) -> str:
    """An error's message in one line: without the JVM's wrapping and stack trace, the cause
    after the last "failed due to:", the last line of a Python worker's traceback."""
    text = str(err).strip()
    if isinstance(err, Py4JJavaError):  # "An error occurred while calling o52.load.\n: ..."
        text = text.split("\n: ", 1)[-1]
    text = text.split("\n\tat ", 1)[0].split("\n\n", 1)[0]  # the stack, pyspark's extras
    if "Traceback (most recent call last):" in text:  # a Python worker: its exception line
        lines = text.split("Traceback (most recent call last):")[-1].splitlines()
        text = next((line for line in reversed(lines) if line[:1].strip()), text)
    text = " ".join(text.split()).rsplit(" failed due to: ", 1)[-1]
    text = re.sub(r"^(?:[a-z_]\w*\.){2,}[A-Z]\w*(?:Exception|Error): ", "", text)  # a JVM class
    return text[:500] or type(err).__name__


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


def _track(result: WorkflowResult, train: DataFrame, test: DataFrame,
           progress: Progress) -> None:
    from sparkdist import tracking

    config = result.config
    table = {r.name: r.metrics for r in result.models}
    rows = train.limit(5).toPandas()  # each model's input example: one job for all
    with tracking.workflow_run(config.tracking.experiment, config.name,
                               uri=config.tracking.uri) as run_id:
        tracking.log_workflow(config.model_dump(), result.split, table)
        for r in result.models:
            progress(f"tracking {r.name}")
            r.run_id = tracking.log_model_run(
                r.name, {"type": _type_of(config, r.name), **r.params}, r.metrics, r.model,
                _feature_names(r.model), figures(r.model, test, config.evaluation.get("k", 10)),
                result.split, rows)
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
    """Refuse model paths that cannot be written before any training: a modelDir that is a
    file or lies under one, a model path that is a file, and existing models unless
    output.overwrite."""
    model_dir = config.output.modelDir
    if not model_dir:
        return
    blocking = _file_at_or_above(model_dir)
    if blocking is not None:
        raise ConfigError(f"output.modelDir: '{model_dir}' is or lies under the file "
                          f"'{blocking}'; give a directory (it is created when absent).")
    for m in config.models:
        path = _model_path(config, str(m.name))
        store.check_target(path, "output.modelDir")
        if store.is_file(path):
            raise ConfigError(f"output.modelDir: '{path}' is a file, where model {m.name} "
                              "would be saved; remove it or choose another output.modelDir.")
        if not config.output.overwrite and store.exists(path):
            raise store.PathExistsError(
                f"'{path}' already exists; set output.overwrite: true in the config, or "
                "choose another output.modelDir.")


def _file_at_or_above(url: str) -> str | None:
    """The file that ``url`` is or lies under (local paths: their nearest existing
    ancestor), else None."""
    where = store.locate(url, "output.modelDir")
    if not where.local:
        return url if store.is_file(url) else None
    path = where.path
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path if os.path.lexists(path) and not os.path.isdir(path) else None


def _check_tracking(config: WorkflowConfig) -> None:
    """An unusable tracking URI is refused before any training (it used to fail after the
    models were saved): MLflow is pointed at it and asked for the experiment."""
    if not config.tracking.enabled:
        return
    from sparkdist import tracking

    uri = tracking.tracking_uri(config.tracking.uri)
    try:
        mlflow = tracking._mlflow()
        with _patient_once():
            mlflow.set_tracking_uri(uri)
            mlflow.get_experiment_by_name(config.tracking.experiment)
    except Exception as err:  # MlflowException, ImportError, a database driver's error
        raise ConfigError(f"tracking.uri: MLflow cannot use {uri!r} ({reason(err)}); fix "
                          "tracking.uri (or $MLFLOW_TRACKING_URI), or turn tracking off "
                          "(tracking.enabled: false, or sparkdist train --no-tracking).") from None


@contextmanager
def _patient_once() -> Iterator[None]:
    """MLflow's HTTP client retries for minutes by default: for the check, one retry and a
    10 s timeout, unless the user set them."""
    defaults = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    added = {k: v for k, v in defaults.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


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
