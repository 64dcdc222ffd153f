"""End-to-end flows: features -> split -> fit -> evaluate. Used by jobs, the CLI and notebooks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.classification import LogisticRegression
from pyspark.sql import DataFrame

from sparkdist.datasets import CHURN_COUNTS, CHURN_LABEL
from sparkdist.evaluation import binary_metrics
from sparkdist.features import FeatureAssembler, split


@dataclass
class WorkflowResult:
    model: PipelineModel
    metrics: dict[str, float]
    split: dict[str, Any]  # the split metadata, for tracking


def churn_baseline(df: DataFrame, seed: int = 42, max_iter: int = 10,
                   test_fraction: float = 0.2) -> WorkflowResult:
    """The classic churn flow: assemble the three interaction counts, split train/test by
    customer, fit ``LogisticRegression(maxIter=10)`` and score the test side.

    Examples
    --------
    >>> result = churn_baseline(churn(spark, n=5_000))
    >>> result.metrics["auc"] > 0.5
    True
    """
    parts = split(df, {"train": 1.0 - test_fraction, "test": test_fraction}, seed=seed,
                  keyCols=["customer_id"])
    pipeline = Pipeline(stages=[
        FeatureAssembler(numericCols=CHURN_COUNTS, labelCol=CHURN_LABEL),
        LogisticRegression(labelCol=CHURN_LABEL, maxIter=max_iter),
    ])
    model = pipeline.fit(parts["train"])
    metrics = binary_metrics(model.transform(parts["test"]), labelCol=CHURN_LABEL)
    return WorkflowResult(model=model, metrics=metrics, split=parts.metadata)
