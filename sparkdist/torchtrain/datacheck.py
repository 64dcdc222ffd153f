"""The value checks of TorchEstimator's input, made once, in the pass that reads the data.

The driver checks the schema before launch; the values (row count, vector lengths, NaN,
infinite and null values, labels against the loss, ``batchSize`` against the rows) are checked
by the training ranks while they read their partitions (:class:`PartitionScan`), so a fit reads
its input once. The ranks combine their partitions' figures by one all-reduce and every rank
applies :func:`check_stats` to the same totals: all raise the same SchemaError or ParamError,
which the driver raises as is (:data:`sparkdist.launch.barrier.INPUT_ERRORS`). Where the driver
must read the data anyway (a resume fingerprint, a class count to infer), it applies the same
rules to its own aggregates before launch.

``stats`` holds ``rows``, ``bad_rows`` (NaN, infinite or null in the features or the label),
``min_dim``/``max_dim`` (vector lengths of the good rows), ``min_label``/``max_label`` and
``fractional`` (good labels that are not whole numbers).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkdist.columns import empty_data_error
from sparkdist.exceptions import ParamError, SchemaError

if TYPE_CHECKING:
    from sparkdist.torchtrain.spec import DataRules

#: The order of the figures in the all-reduced table.
FIELDS = ("rows", "bad_rows", "min_dim", "max_dim", "min_label", "max_label", "fractional")


def check_stats(stats: dict[str, Any], rules: DataRules) -> None:
    """Raise SchemaError/ParamError for input the fit cannot train on (``rules.num_classes``
    0: inferred from the labels)."""
    source = rules.source
    if stats["rows"] == 0:
        raise empty_data_error("TorchEstimator.fit")
    if stats["min_dim"] != stats["max_dim"]:
        raise SchemaError(f"featuresCol: rows of '{source}' have between {stats['min_dim']} "
                          f"and {stats['max_dim']} values; every row needs the same length "
                          f"(assemble them with FeatureAssembler).")
    if stats["bad_rows"] and rules.nan_policy == "error":
        raise SchemaError(f"{stats['bad_rows']} of {stats['rows']} rows have NaN, infinite or "
                          f"null values in '{source}' or the label '{rules.label_col}'; "
                          f"clean them, impute them (FeatureAssembler nullPolicy='impute') or "
                          f"set nanPolicy='drop'.")
    good = stats["rows"] - (stats["bad_rows"] or 0)
    if rules.batch_size > good:
        raise ParamError(f"batchSize={rules.batch_size} exceeds the {good} usable rows; "
                         f"lower batchSize.")
    _check_labels(stats, rules)


def _check_labels(stats: dict[str, Any], rules: DataRules) -> None:
    loss, label = rules.loss, rules.label_col
    if loss not in ("bce", "cross_entropy"):
        return
    if stats["fractional"] or stats["min_label"] < 0 or (
            loss == "bce" and stats["max_label"] > 1):
        allowed = "0 and 1" if loss == "bce" else "class indices 0..k-1"
        hint = (" For more than 2 classes use loss='cross_entropy'." if loss == "bce"
                and not stats["fractional"] else "")
        raise SchemaError(f"labelCol: '{label}' holds values from {stats['min_label']} to "
                          f"{stats['max_label']}, but loss='{loss}' needs {allowed}.{hint}")
    classes = rules.num_classes
    if loss == "cross_entropy" and classes and stats["max_label"] >= classes:
        raise ParamError(f"numClasses={classes} but labelCol '{label}' reaches "
                         f"{stats['max_label']:.0f}; raise numClasses or leave it 0.")


def combine(table: np.ndarray) -> dict[str, Any]:
    """The totals of every rank's :meth:`PartitionScan.figures` (one row per rank); the
    extremes come from the ranks that kept a good row."""
    column = dict(zip(FIELDS, table.T))
    kept = column["rows"] > column["bad_rows"]
    stats: dict[str, Any] = {name: int(column[name].sum())
                             for name in ("rows", "bad_rows", "fractional")}
    for name, extreme in (("min_dim", np.min), ("max_dim", np.max), ("min_label", np.min),
                          ("max_label", np.max)):
        stats[name] = extreme(column[name][kept]).item() if kept.any() else None
    stats["min_dim"], stats["max_dim"] = (None if stats[name] is None else int(stats[name])
                                          for name in ("min_dim", "max_dim"))
    return stats


class PartitionScan:
    """Pass one partition's Arrow batches on without their bad rows (a null, NaN or infinite
    value in the features or the label) and without rows whose vector is not ``dim`` long,
    noting the figures :func:`check_stats` needs on the way. Vectorised over each batch
    (Arrow and numpy): the JVM only converts the vectors, as any reader of them would."""

    def __init__(self, batches: Iterable[pa.RecordBatch], dim: int) -> None:
        self._batches, self.dim = batches, dim
        self.rows = self.bad_rows = self.fractional = 0
        self.min_dim = self.max_dim = dim
        self.min_label, self.max_label = np.inf, -np.inf

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for batch in self._batches:
            if batch.num_rows:
                yield self._keep(batch)

    def _keep(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        self.rows += batch.num_rows
        features = batch.column("features")
        lengths = pc.fill_null(pc.list_value_length(features), -1).to_numpy(
            zero_copy_only=False)
        labels = batch.column("label").to_numpy(zero_copy_only=False).astype(np.float64)
        good = np.isfinite(labels) & (lengths >= 0)  # nulls arrive as NaN, and length -1
        shaped = lengths == self.dim
        if shaped.any():  # every value of the rows of the right length: finite?
            rows = features if shaped.all() else features.filter(pa.array(shaped))
            values = pc.list_flatten(rows).to_numpy(zero_copy_only=False)
            finite = np.isfinite(values.astype(np.float32, copy=False))
            good[shaped] &= finite.reshape(-1, self.dim).all(1)
        self.bad_rows += int(np.count_nonzero(~good))
        if good.any():
            self.min_dim = min(self.min_dim, int(lengths[good].min()))
            self.max_dim = max(self.max_dim, int(lengths[good].max()))
            kept = labels[good]
            self.min_label = min(self.min_label, float(kept.min()))
            self.max_label = max(self.max_label, float(kept.max()))
            self.fractional += int(np.count_nonzero(kept != np.floor(kept)))
        keep = good & shaped
        return batch if keep.all() else batch.filter(pa.array(keep))

    def figures(self) -> list[float]:
        """This partition's figures, in :data:`FIELDS` order."""
        return [self.rows, self.bad_rows, self.min_dim, self.max_dim, self.min_label,
                self.max_label, self.fractional]
