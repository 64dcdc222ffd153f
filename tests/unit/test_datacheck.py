"""TorchEstimator's value checks in the training ranks (no Spark): a partition scan drops the
rows with bad values and notes its figures, the ranks' figures combine, the rules raise the driver's
typed errors, and the driver ends the fit at once with that error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from sparkdist.exceptions import ParamError, SchemaError
from sparkdist.launch.attempts import Attempts as _Attempts
from sparkdist.torchtrain import datacheck
from sparkdist.torchtrain.datacheck import PartitionScan, check_stats, combine
from sparkdist.torchtrain.spec import DataRules

RULES = DataRules(source="features", label_col="label", nan_policy="error", batch_size=2,
                  loss="bce", num_classes=0)


def _batch(features, labels) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"features": features, "label": labels},
                                      schema=pa.schema([("features", pa.list_(pa.float32())),
                                                        ("label", pa.float32())]))


def _scan(*batches: pa.RecordBatch, dim: int = 2) -> tuple[list[pa.RecordBatch], list[float]]:
    scan = PartitionScan(batches, dim)
    kept = list(scan)
    return kept, scan.figures()


def test_a_scan_drops_rows_with_null_nan_or_infinite_values_and_counts_them():
    kept, figures = _scan(
        _batch([[0, 1], None, [1, 1], [np.nan, 1], [1, None], [np.inf, 0], [1, 0]],
               [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, None]),
        _batch([[2, 2]], [1.0]))
    assert [batch.num_rows for batch in kept] == [2, 1]
    assert kept[0].column("features").to_pylist() == [[0, 1], [1, 1]]
    assert figures == [8, 5, 2, 2, 0.0, 1.0, 0, 0, 0]


def test_rows_of_another_length_are_not_passed_on_but_counted():
    kept, figures = _scan(_batch([[0, 1], [1, 1, 1]], [1.0, 0.5]))
    assert kept[0].num_rows == 1
    assert figures[2:4] == [2, 3] and figures[6] == 1  # lengths 2..3, one fractional label


def test_the_ranks_figures_combine_and_empty_ranks_do_not_count():
    _, first = _scan(_batch([[0, 1], [1, 1]], [1.0, 0.0]))
    _, empty = _scan()
    stats = combine(np.array([first, empty]))
    assert stats == {"rows": 2, "bad_rows": 0, "fractional": 0, "min_dim": 2, "max_dim": 2,
                     "min_label": 0.0, "max_label": 1.0, "broken_labels": 0,
                     "negative_weights": 0}
    check_stats(stats, RULES)  # a good input passes


@pytest.mark.parametrize("change, error, match", [
    ({"rows": 0}, SchemaError, "empty DataFrame"),
    ({"max_dim": 3}, SchemaError, "between 2 and 3 values"),
    ({"bad_rows": 1}, SchemaError, "1 of 10 rows have NaN, infinite or null"),
    ({"max_label": 2.0}, SchemaError, "use loss='cross_entropy'"),
    ({"rows": 1}, ParamError, "batchSize=2 exceeds the 1 usable rows"),
])
def test_the_rules_raise_the_typed_error_that_names_the_fix(change, error, match):
    stats = {"rows": 10, "bad_rows": 0, "fractional": 0, "min_dim": 2, "max_dim": 2,
             "min_label": 0.0, "max_label": 1.0, **change}
    with pytest.raises(error, match=match):
        check_stats(stats, RULES)


def test_dropping_bad_rows_is_allowed_when_asked():
    stats = {"rows": 10, "bad_rows": 3, "fractional": 0, "min_dim": 2, "max_dim": 2,
             "min_label": 0.0, "max_label": 1.0}
    check_stats(stats, dataclasses.replace(RULES, nan_policy="drop"))


def test_a_rank_s_input_error_ends_the_fit_at_once_with_its_type():
    cancelled = []
    attempts = _Attempts(3, lambda: cancelled.append(True))
    attempts.record({"failure": "rank 1 of 2 failed: SchemaError: ...", "rank": 1,
                     "attempt": 7, "world_size": 2,
                     "input_error": {"type": "SchemaError", "message": "3 of 9 rows have NaN"}})
    assert cancelled == [True] and attempts.gave_up
    assert isinstance(attempts.input_error, SchemaError)
    assert str(attempts.input_error) == "3 of 9 rows have NaN"


def test_an_unknown_error_type_is_an_ordinary_failure():
    attempts = _Attempts(3, lambda: None)
    attempts.record({"failure": "boom", "attempt": 1, "world_size": 2,
                     "input_error": {"type": "SystemExit", "message": "x"}})
    assert attempts.input_error is None and not attempts.gave_up and attempts.last == "boom"


def _targets(labels, weights) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"features": [[0.0, 1.0]] * len(labels), "label": labels, "weight": weights},
        schema=pa.schema([("features", pa.list_(pa.float32())),
                          ("label", pa.list_(pa.float32())), ("weight", pa.float32())]))


def test_array_labels_of_another_length_or_with_a_null_and_negative_weights_are_broken():
    scan = PartitionScan([_targets([[0, 1], [1], [1, None], [np.nan, 0], [1, 1], [0, 0]],
                                   [1.0, 1.0, 1.0, 1.0, -2.0, np.nan])], 2, label_width=2,
                         weighted=True)
    kept = list(scan)
    assert kept[0].column("label").to_pylist() == [[0, 1]]
    figures = dict(zip(datacheck.FIELDS, scan.figures()))
    # broken: a short array, a null inside, a negative weight; bad: NaN label, NaN weight
    assert (figures["rows"], figures["bad_rows"]) == (6, 2)
    assert (figures["broken_labels"], figures["negative_weights"]) == (2, 1)
    rules = dataclasses.replace(RULES, label_width=2, weight_col="w", nan_policy="drop",
                                batch_size=1)
    with pytest.raises(SchemaError, match="labelCol 'label': 2 rows hold a null inside the "
                                          "array or not 2 values"):
        check_stats(combine(np.array([scan.figures()])), rules)
    with pytest.raises(SchemaError, match="weightCol 'w' holds 1 negative weights"):
        check_stats({**combine(np.array([scan.figures()])), "broken_labels": 0}, rules)
    with pytest.raises(SchemaError, match="weightCol 'w': the training rows' weights sum to "
                                          "0.0"):
        datacheck.check_training_weight(0.0, rules)
