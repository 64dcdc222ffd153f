"""Metrics over Spark's own evaluators, so they scale with the data."""

from __future__ import annotations

from pyspark.ml.evaluation import BinaryClassificationEvaluator, MulticlassClassificationEvaluator
from pyspark.sql import DataFrame

from sparkdist.columns import require_columns


def binary_metrics(predictions: DataFrame, labelCol: str = "label",
                   rawPredictionCol: str = "rawPrediction",
                   predictionCol: str = "prediction") -> dict[str, float]:
    """AUC (ROC and PR) and accuracy of a binary classifier's predictions.

    Examples
    --------
    >>> binary_metrics(model.transform(test), labelCol="cancelled_within_week")
    {'auc': 0.81, 'pr_auc': 0.67, 'accuracy': 0.76}
    """
    require_columns(predictions.schema, [labelCol, rawPredictionCol, predictionCol],
                    "predictions")
    binary = BinaryClassificationEvaluator(labelCol=labelCol, rawPredictionCol=rawPredictionCol)
    accuracy = MulticlassClassificationEvaluator(labelCol=labelCol, predictionCol=predictionCol,
                                                 metricName="accuracy")
    return {
        "auc": binary.evaluate(predictions, {binary.metricName: "areaUnderROC"}),
        "pr_auc": binary.evaluate(predictions, {binary.metricName: "areaUnderPR"}),
        "accuracy": accuracy.evaluate(predictions),
    }
