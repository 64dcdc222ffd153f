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
``fractional`` (good labels that are not whole numbers), ``broken_labels`` (rows of an array
label holding a null or not ``label_width`` values) and ``negative_weights``. With typed
inputs (``inputCols``) each input adds :data:`INPUT_FIELDS` (``<arg>.nulls``...): null values
or null array elements, rows whose array is not the declared length, the smallest and largest
id.
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
    from sparkdist.torchtrain.spec import DataRules, InputField

#: The order of the figures in the all-reduced table.
FIELDS = ("rows", "bad_rows", "min_dim", "max_dim", "min_label", "max_label", "fractional",
          "broken_labels", "negative_weights")
#: Each typed input's figures, after :data:`FIELDS`.
INPUT_FIELDS = ("nulls", "wrong_length", "min_id", "max_id")


def check_stats(stats: dict[str, Any], rules: DataRules) -> None:
    """Raise SchemaError/ParamError for input the fit cannot train on (``rules.num_classes``
    0: inferred from the labels)."""
    source = rules.source
    if stats["rows"] == 0:
        raise empty_data_error("TorchEstimator.fit")
    for field in rules.inputs:
        _check_input(field, {name: stats[f"{field.arg}.{name}"] for name in INPUT_FIELDS})
    if not rules.inputs and stats["min_dim"] != stats["max_dim"]:
        raise SchemaError(f"featuresCol: rows of '{source}' have between {stats['min_dim']} "
                          f"and {stats['max_dim']} values; every row needs the same length "
                          f"(assemble them with FeatureAssembler).")
    if stats["bad_rows"] and rules.nan_policy == "error":
        raise SchemaError(f"{stats['bad_rows']} of {stats['rows']} rows have NaN, infinite or "
                          f"null values in '{source}' or the label '{rules.label_col}'; "
                          f"clean them, impute them (FeatureAssembler nullPolicy='impute') or "
                          f"set nanPolicy='drop'.")
    _check_targets(stats, rules)
    good = stats["rows"] - (stats["bad_rows"] or 0)
    if rules.batch_size > good:
        raise ParamError(f"batchSize={rules.batch_size} exceeds the {good} usable rows; "
                         f"lower batchSize.")
    _check_labels(stats, rules)


def _check_input(field: InputField, figures: dict[str, Any]) -> None:
    """SchemaError for a typed input's nulls, lengths or ids (not dropped by nanPolicy: a
    null id or a cut array is a broken row, not a measurement gone wrong)."""
    where = field.describe()
    if figures["nulls"]:
        raise SchemaError(f"{where} holds {figures['nulls']} null values (or null elements "
                          f"inside arrays); drop or fill them before training.")
    if figures["wrong_length"]:
        raise SchemaError(f"{where}: {figures['wrong_length']} rows do not hold "
                          f"{field.width} values (inputShapes['{field.arg}']="
                          f"{list(field.shape)}); fix the shape in inputShapes or the arrays.")
    if field.dtype != "int64" or figures["min_id"] is None:
        return
    if figures["min_id"] < 0:
        raise SchemaError(f"{where} holds the negative id {figures['min_id']:.0f}; ids index "
                          f"an embedding table from 0: re-index the column (e.g. with "
                          f"StringIndexer) before training.")
    if field.num_embeddings and figures["max_id"] >= field.num_embeddings:
        raise SchemaError(f"{where} holds the id {figures['max_id']:.0f}, but the network's "
                          f"table for '{field.arg}' has {field.num_embeddings} rows "
                          f"(embedding_sizes); enlarge the table (modelKwargs) or re-index.")


def _check_targets(stats: dict[str, Any], rules: DataRules) -> None:
    """SchemaError for an array label of the wrong length (or with a null inside) and for
    negative weights: broken rows, not dropped by nanPolicy."""
    if stats.get("broken_labels"):
        raise SchemaError(f"labelCol '{rules.label_col}': {stats['broken_labels']} rows hold "
                          f"a null inside the array or not {rules.label_width} values (the "
                          f"first row's length); every row needs a label of the same length.")
    if stats.get("negative_weights"):
        raise SchemaError(f"weightCol '{rules.weight_col}' holds {stats['negative_weights']} "
                          f"negative weights; use weights >= 0.")


def check_training_weight(total: float, rules: DataRules) -> float:
    """The training rows' summed weight (their count where rows are unweighted); SchemaError
    where every weight is 0: no row would train."""
    if rules.weight_col and not total > 0:
        raise SchemaError(f"weightCol '{rules.weight_col}': the training rows' weights sum "
                          f"to {total}; at least one row needs a weight above 0.")
    return total


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


def combine(table: np.ndarray, fields: tuple[InputField, ...] = ()) -> dict[str, Any]:
    """The totals of every rank's :meth:`PartitionScan.figures` (one row per rank); the
    extremes come from the ranks that kept a good row."""
    column = dict(zip(FIELDS, table.T))
    ids: dict[str, Any] = {}
    for at, field in enumerate(fields):
        part = dict(zip(INPUT_FIELDS, table[:, len(FIELDS) + at * len(INPUT_FIELDS):].T))
        ids[f"{field.arg}.nulls"] = int(part["nulls"].sum())
        ids[f"{field.arg}.wrong_length"] = int(part["wrong_length"].sum())
        seen = np.isfinite(part["min_id"])
        ids[f"{field.arg}.min_id"] = part["min_id"][seen].min().item() if seen.any() else None
        ids[f"{field.arg}.max_id"] = part["max_id"][seen].max().item() if seen.any() else None
    kept = column["rows"] > column["bad_rows"]
    stats: dict[str, Any] = {name: int(column[name].sum()) for name in (
        "rows", "bad_rows", "fractional", "broken_labels", "negative_weights")}
    for name, extreme in (("min_dim", np.min), ("max_dim", np.max), ("min_label", np.min),
                          ("max_label", np.max)):
        stats[name] = extreme(column[name][kept]).item() if kept.any() else None
    stats["min_dim"], stats["max_dim"] = (None if stats[name] is None else int(stats[name])
                                          for name in ("min_dim", "max_dim"))
    return {**stats, **ids}


class PartitionScan:
    """Pass one partition's Arrow batches on without their bad rows (a null, NaN or infinite
    value in the features or the label) and without rows whose vector is not ``dim`` long,
    noting the figures :func:`check_stats` needs on the way. Vectorised over each batch
    (Arrow and numpy): the JVM only converts the vectors, as any reader of them would."""

    def __init__(self, batches: Iterable[pa.RecordBatch], dim: int,
                 fields: tuple[InputField, ...] = (), label_width: int = 0,
                 weighted: bool = False) -> None:
        self._batches, self.dim, self.fields = batches, dim, fields
        self.label_width, self.weighted = label_width, weighted
        self.rows = self.bad_rows = self.fractional = 0
        self.broken_labels = self.negative_weights = 0
        self.min_dim = self.max_dim = dim
        self.min_label, self.max_label = np.inf, -np.inf
        self.inputs = [[0, 0, np.inf, -np.inf] for _ in fields]  # INPUT_FIELDS of each

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for batch in self._batches:
            if batch.num_rows:
                yield self._keep(batch)

    def _keep(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.fields:
            return self._keep_typed(batch)
        self.rows += batch.num_rows
        features = batch.column("features")
        lengths = pc.fill_null(pc.list_value_length(features), -1).to_numpy(
            zero_copy_only=False)
        labels, good, broken = self._targets(batch)
        good &= lengths >= 0  # a null vector: length -1
        shaped = lengths == self.dim
        if shaped.any():  # every value of the rows of the right length: finite?
            rows = features if shaped.all() else features.filter(pa.array(shaped))
            values = pc.list_flatten(rows).to_numpy(zero_copy_only=False)
            finite = np.isfinite(values.astype(np.float32, copy=False))
            good[shaped] &= finite.reshape(-1, self.dim).all(1)
        self.bad_rows += int(np.count_nonzero(~good & ~broken))
        good &= ~broken
        if good.any():
            self.min_dim = min(self.min_dim, int(lengths[good].min()))
            self.max_dim = max(self.max_dim, int(lengths[good].max()))
            self._note_labels(labels[good])
        keep = good & shaped
        return batch if keep.all() else batch.filter(pa.array(keep))

    def _targets(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The labels as float64 ``[rows]`` or ``[rows, label_width]`` (NaN where null or
        broken), the rows whose label and weight are finite, and the broken rows (an array
        label with a null inside or of another length, a negative weight), counted."""
        column = batch.column("label")
        if self.label_width:
            lengths = pc.fill_null(pc.list_value_length(column), -1).to_numpy(
                zero_copy_only=False)
            nulls = pc.list_flatten(column).is_null().to_numpy(zero_copy_only=False)
            parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
            broken = (lengths != self.label_width) | (
                np.bincount(parents, weights=nulls, minlength=len(column)) > 0)
            labels = np.full((len(column), self.label_width), np.nan)
            fine = pc.list_flatten(column.filter(pa.array(~broken)))
            labels[~broken] = fine.to_numpy(zero_copy_only=False).astype(
                np.float64).reshape(-1, self.label_width)
            self.broken_labels += int(np.count_nonzero(broken))
            good = np.isfinite(labels).all(1)
        else:
            labels = column.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls: NaN
            broken, good = np.zeros(len(labels), bool), np.isfinite(labels)
        if self.weighted:
            weights = batch.column("weight").to_numpy(zero_copy_only=False).astype(np.float64)
            negative = weights < 0
            self.negative_weights += int(np.count_nonzero(negative))
            broken |= negative
            good &= np.isfinite(weights)
        return labels, good, broken

    def _note_labels(self, kept: np.ndarray) -> None:
        """The range of the good rows' labels (every value of an array label)."""
        if kept.size:
            self.min_label = min(self.min_label, float(kept.min()))
            self.max_label = max(self.max_label, float(kept.max()))
            self.fractional += int(np.count_nonzero(kept != np.floor(kept)))

    def _keep_typed(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The typed inputs' rows: broken ones (nulls, wrong lengths) counted per input and
        dropped (the fit then stops on them), non-finite floats and labels counted as bad."""
        self.rows += batch.num_rows
        labels, good, broken = self._targets(batch)
        for field, figures in zip(self.fields, self.inputs):
            row_broken, row_bad = _scan_input(batch.column(field.name), field, figures)
            broken |= row_broken
            good &= ~row_bad
        self.bad_rows += int(np.count_nonzero(~good & ~broken))
        keep = good & ~broken
        self._note_labels(labels[keep])
        return batch if keep.all() else batch.filter(pa.array(keep))

    def figures(self) -> list[float]:
        """This partition's figures, in :data:`FIELDS` order, then each input's."""
        return [self.rows, self.bad_rows, self.min_dim, self.max_dim, self.min_label,
                self.max_label, self.fractional, self.broken_labels, self.negative_weights,
                *(x for each in self.inputs for x in each)]


def _scan_input(column: pa.Array, field: InputField, figures: list[Any]) -> tuple[
        np.ndarray, np.ndarray]:
    """One typed input of a batch: (rows broken: a null, a null element, a fixed-shape array
    of another length; rows with a non-finite float), its figures updated in place."""
    rows = len(column)
    broken = column.is_null().to_numpy(zero_copy_only=False).copy()
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or \
            pa.types.is_fixed_size_list(column.type):
        flat = pc.list_flatten(column)
        parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
        null_values = flat.is_null().to_numpy(zero_copy_only=False)
        broken |= np.bincount(parents, weights=null_values, minlength=rows) > 0
        figures[0] += int(np.count_nonzero(broken))
        if field.width:
            lengths = pc.fill_null(pc.list_value_length(column), -1).to_numpy(
                zero_copy_only=False)
            wrong = (lengths != field.width) & ~broken
            figures[1] += int(np.count_nonzero(wrong))
            broken |= wrong
    else:
        flat, parents = column, np.arange(rows)
        figures[0] += int(np.count_nonzero(broken))
    values = flat.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls: NaN
    if field.dtype == "int64":
        present = values[~np.isnan(values)]
        if present.size:
            figures[2] = min(figures[2], float(present.min()))
            figures[3] = max(figures[3], float(present.max()))
        return broken, np.zeros(rows, bool)
    nonfinite = np.bincount(parents, weights=~np.isfinite(values), minlength=rows) > 0
    return broken, nonfinite & ~broken
