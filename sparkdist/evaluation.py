"""Metrics suited to a model's task, computed by Spark's own evaluators so they scale.

``evaluate(model, df)`` scores any fitted sparkdist model, MLlib model or PipelineModel:
classification -> AUC, PR-AUC, log-loss, accuracy, F1; regression -> RMSE, MAE, R2;
recommendation -> RMSE, MAE and ranking@k (from the model's ``rankingMetrics``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pyspark.ml import Model, PipelineModel
from pyspark.ml.evaluation import (
    BinaryClassificationEvaluator,
    MulticlassClassificationEvaluator,
    RegressionEvaluator,
)
from pyspark.sql import DataFrame

from sparkdist.columns import check_one_of, col, require_columns

TASKS = ("classification", "regression", "recommendation")
CLASSIFICATION_METRICS = ("auc", "pr_auc", "logloss", "accuracy", "f1")
REGRESSION_METRICS = ("rmse", "mae", "r2")


def evaluate(model: Model, df: DataFrame, k: int = 10,
             metrics: Collection[str] | None = None) -> dict[str, float]:
    """Score ``model`` on ``df`` (which holds the label) with the metrics of its task, or only
    the task's metrics named in ``metrics`` (one metric: one Spark job over the predictions,
    none cached; a name the task does not have is left out).

    Examples
    --------
    >>> metrics = evaluate(pipeline_model, test)
    >>> {name: round(value, 2) for name, value in metrics.items()}
    {'auc': 0.86, 'pr_auc': 0.73, 'logloss': 0.43, 'accuracy': 0.79, 'f1': 0.65}
    >>> {name: round(value, 2) for name, value in
    ...  evaluate(pipeline_model, test, metrics=["accuracy", "rmse"]).items()}
    {'accuracy': 0.79}
    """
    final = final_stage(model)
    task = task_of(final)
    if task == "recommendation":
        if isinstance(model, PipelineModel):  # the stages before the recommender, applied
            df = PipelineModel(model.stages[:-1]).transform(df)
        found = dict(final.rankingMetrics(df, k=k))
        return found if metrics is None else {n: v for n, v in found.items() if n in metrics}
    predictions = model.transform(df)
    several = metrics is None or len(metrics) > 1
    if several:  # the evaluators each read them: score once
        predictions = predictions.cache()
    try:
        if task == "regression":
            return regression_metrics(predictions, names=metrics,
                                      **_cols(final, "labelCol", "predictionCol"))
        return classification_metrics(predictions, names=metrics, **_cols(
            final, "labelCol", "predictionCol", "probabilityCol", "rawPredictionCol"))
    finally:
        if several:
            predictions.unpersist()


def final_stage(model: Any) -> Any:
    """The stage that makes the predictions: the last one of a PipelineModel."""
    while isinstance(model, PipelineModel):
        model = model.stages[-1]
    return model


def task_of(model: Any) -> str:
    """A sparkdist model's declared task; for other models, inferred from their Params."""
    task = getattr(model, "task", None)
    if task is None:
        if model.hasParam("probabilityCol"):
            task = "classification"
        elif model.hasParam("userCol"):
            task = "recommendation"
        else:
            task = "regression"
    check_one_of(f"{type(model).__name__}.task", task, TASKS)
    return task


def classification_metrics(predictions: DataFrame, labelCol: str = "label",
                           predictionCol: str = "prediction",
                           probabilityCol: str = "probability",
                           rawPredictionCol: str = "rawPrediction",
                           names: Collection[str] | None = None) -> dict[str, float]:
    """Binary: auc, pr_auc, logloss, accuracy, f1 (of class 1). Multiclass: logloss,
    accuracy, f1 (weighted by class). ``names``: only those (all when None)."""
    require_columns(predictions.schema, [labelCol, predictionCol, probabilityCol], "predictions")
    wanted = set(CLASSIFICATION_METRICS if names is None else names)
    binary = False
    if wanted & {"auc", "pr_auc", "f1"}:  # only these differ between binary and multiclass
        first = predictions.select(col(probabilityCol)).first()
        binary = first is not None and first[0].size == 2
    multi = MulticlassClassificationEvaluator(labelCol=labelCol, predictionCol=predictionCol,
                                              probabilityCol=probabilityCol)
    metrics: dict[str, float] = {}
    if binary and wanted & {"auc", "pr_auc"}:
        require_columns(predictions.schema, [rawPredictionCol], "predictions")
        roc = BinaryClassificationEvaluator(labelCol=labelCol, rawPredictionCol=rawPredictionCol)
        for name, spark_name in (("auc", "areaUnderROC"), ("pr_auc", "areaUnderPR")):
            if name in wanted:
                metrics[name] = roc.evaluate(predictions, {roc.metricName: spark_name})
    for name, spark_name in (("logloss", "logLoss"), ("accuracy", "accuracy")):
        if name in wanted:
            metrics[name] = multi.evaluate(predictions, {multi.metricName: spark_name})
    if "f1" in wanted:
        f1: dict[Any, Any] = ({multi.metricName: "fMeasureByLabel", multi.metricLabel: 1.0}
                              if binary else {multi.metricName: "f1"})
        metrics["f1"] = multi.evaluate(predictions, f1)
    return {name: metrics[name] for name in CLASSIFICATION_METRICS if name in metrics}


def regression_metrics(predictions: DataFrame, labelCol: str = "label",
                       predictionCol: str = "prediction",
                       names: Collection[str] | None = None) -> dict[str, float]:
    """rmse, mae and r2 over the rows with a prediction (NaN predictions are dropped);
    ``names``: only those (all when None)."""
    require_columns(predictions.schema, [labelCol, predictionCol], "predictions")
    scored = predictions.dropna(subset=[predictionCol])
    evaluator = RegressionEvaluator(labelCol=labelCol, predictionCol=predictionCol)
    return {name: evaluator.evaluate(scored, {evaluator.metricName: name})
            for name in REGRESSION_METRICS if names is None or name in names}


def _cols(model: Any, *params: str) -> dict[str, str]:
    """The model's column Params that exist, as keyword arguments."""
    return {p: model.getOrDefault(p) for p in params if model.hasParam(p)}
