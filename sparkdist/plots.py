"""Evaluation plots as matplotlib figures (ROC, precision-recall, confusion matrix, feature
importances, ranking metrics by k). matplotlib is imported lazily (the ``mlflow`` extra)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pyspark.ml.functions import vector_to_array
from pyspark.sql import DataFrame

from sparkdist.columns import col

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MAX_CURVE_ROWS = 100_000  # ROC/PR curves come from a sample of at most this many rows
TOP_FEATURES = 20


def _figure(title: str) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    return fig, ax


def roc_pr_curves(predictions: DataFrame, labelCol: str, probabilityCol: str,
                  seed: int = 0) -> dict[str, Figure]:
    """ROC and precision-recall curves of a binary classifier (from a row sample)."""
    scores, labels = _sample_scores(predictions, labelCol, probabilityCol, seed)
    order = np.argsort(-scores, kind="stable")
    hits = labels[order]
    tp, fp = np.cumsum(hits), np.cumsum(1 - hits)
    tpr, fpr = tp / max(tp[-1], 1), fp / max(fp[-1], 1)
    precision = tp / np.arange(1, len(hits) + 1)
    roc, ax = _figure("ROC curve")
    ax.plot(np.r_[0, fpr], np.r_[0, tpr])
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey")
    ax.set(xlabel="false positive rate", ylabel="true positive rate")
    pr, ax = _figure("Precision-recall curve")
    ax.plot(tpr, precision)
    ax.set(xlabel="recall", ylabel="precision", ylim=(0, 1.02))
    return {"roc_curve": roc, "precision_recall_curve": pr}


def _sample_scores(predictions: DataFrame, labelCol: str, probabilityCol: str,
                   seed: int) -> tuple[np.ndarray, np.ndarray]:
    rows = predictions.count()
    sample = predictions if rows <= MAX_CURVE_ROWS else predictions.sample(
        fraction=MAX_CURVE_ROWS / rows, seed=seed)
    pdf: Any = sample.select(vector_to_array(col(probabilityCol))[1].alias("score"),
                        col(labelCol).cast("int").alias("label")).toPandas()
    return pdf["score"].to_numpy(), pdf["label"].to_numpy()


def confusion_matrix(predictions: DataFrame, labelCol: str, predictionCol: str) -> Figure:
    """Exact counts of (label, prediction) pairs, as a heat map."""
    counts = predictions.groupBy(col(labelCol), col(predictionCol)).count().collect()
    classes = sorted({r[labelCol] for r in counts} | {r[predictionCol] for r in counts})
    index = {c: i for i, c in enumerate(classes)}
    matrix = np.zeros((len(classes), len(classes)), dtype=np.int64)
    for r in counts:
        matrix[index[r[labelCol]], index[r[predictionCol]]] = r["count"]
    fig, ax = _figure("Confusion matrix")
    ax.imshow(matrix, cmap="Blues")
    for (i, j), n in np.ndenumerate(matrix):
        ax.text(j, i, str(n), ha="center", va="center")
    ticks = [f"{c:g}" for c in classes]
    ax.set(xticks=range(len(classes)), yticks=range(len(classes)), xticklabels=ticks,
           yticklabels=ticks, xlabel="predicted", ylabel="actual")
    return fig


def feature_importances(names: Sequence[str], values: Sequence[float]) -> Figure:
    """The TOP_FEATURES largest importances as a horizontal bar chart."""
    order = np.argsort(np.abs(values))[::-1][:TOP_FEATURES][::-1]
    fig, ax = _figure("Feature importances")
    ax.barh([names[i] if i < len(names) else f"f{i}" for i in order],
            [values[i] for i in order])
    return fig


def ranking_by_k(metrics_by_k: Mapping[int, Mapping[str, float]]) -> Figure:
    """precision@k, ndcg@k, map@k, recall@k against k."""
    ks = sorted(metrics_by_k)
    fig, ax = _figure("Ranking metrics by k")
    for name in ("precision", "ndcg", "map", "recall"):
        values = [metrics_by_k[k].get(f"{name}@{k}") for k in ks]
        if all(v is not None for v in values):
            ax.plot(ks, values, marker="o", label=f"{name}@k")
    ax.set(xlabel="k", ylim=(0, 1))
    ax.legend()
    return fig
