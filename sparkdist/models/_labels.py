"""The label checks every sparkdist estimator with a ``labelCol`` runs before training: one
aggregation over the label (other aggregates an estimator needs ride in the same job), then
typed errors naming the column and the fix. TorchEstimator checks its label in its own data
pass (``_torch_checks._data_aggregates``), where ``nanPolicy='drop'`` may drop bad rows instead."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sparkdist.columns import col, empty_data_error
from sparkdist.exceptions import SchemaError


def label_aggregates(label: Column, classes: bool) -> list[Column]:
    """Rows, null-or-NaN and infinite labels; for classifiers also what class indices need
    (min, max and fractional values, over the finite labels). No distinct count: it would
    cost the job two shuffles, and MLlib counts max + 1 classes."""
    missing = label.isNull() | F.isnan(label)
    infinite = F.abs(label) == F.lit(float("inf"))
    aggregates = [F.count(F.lit(1)).alias("rows"), F.count_if(missing).alias("missing"),
                  F.count_if(infinite).alias("infinite")]
    if classes:
        finite = F.when(~(missing | infinite), label)
        aggregates += [F.min(finite).alias("min"), F.max(finite).alias("max"),
                       F.count_if(finite != F.floor(finite)).alias("fractional")]
    return aggregates


def check_label(dataset: DataFrame, label: str, owner: str, classes: bool,
                extra: Sequence[Column] = ()) -> Any:
    """Run the label aggregation (plus ``extra``) as one job and refuse what no fit can use:
    no rows, null/NaN or infinite labels and, for a classifier, labels that are not class
    indices 0, 1, ... (negative or fractional). Returns the stats row."""
    stats = dataset.agg(*label_aggregates(col(label).cast("double"), classes),
                        *extra).first()
    assert stats is not None
    if stats["rows"] == 0:
        raise empty_data_error(f"{owner}.fit")
    for key, what, fix in (("missing", "null or NaN", "drop or fill"),
                           ("infinite", "infinite", "drop or clip")):
        if stats[key]:
            raise SchemaError(f"labelCol: column '{label}' has {stats[key]} {what} values; {fix} "
                              "those rows before fitting.")
    if classes and (stats["fractional"] or stats["min"] < 0):
        kind = "fractional" if stats["fractional"] else "negative"
        raise SchemaError(
            f"labelCol: column '{label}' holds {kind} values (from {stats['min']:g} to "
            f"{stats['max']:g}); {owner} needs class indices 0, 1, ..., k-1. Index the label "
            "first (FeatureAssembler(labelCol=...) or StringIndexer), or use a regressor for a "
            "numeric target.")
    return stats
