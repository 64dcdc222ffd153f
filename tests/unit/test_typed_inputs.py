"""Typed inputs in the feed (issue 27): several columns spilled and read back by name, ids kept
as int64, fixed shapes restored, sequences padded per batch to the batch's longest with a
mask; and the one-pass checks naming the column of a null, a cut array or a bad id."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from sparkdist.exceptions import SchemaError
from sparkdist.torchtrain import datacheck, inputs
from sparkdist.torchtrain.feed import spill
from sparkdist.torchtrain.spec import DataRules, InputField

FIELDS = (InputField("user", "userId", "int64"),
          InputField("image", "pixels", "float32", (1, 2, 2)),
          InputField("tokens", "words", "int64", sequence=True, max_length=3, mask=True))


def _batch(n: int, start: int = 0, **overrides) -> pa.RecordBatch:
    ids = np.arange(start, start + n)
    columns = {
        "in_user": pa.array(ids * 7 + 2**40, pa.int64()),  # beyond float32's exact integers
        "in_image": pa.array([[float(i)] * 4 for i in ids], pa.list_(pa.float64())),
        "in_tokens": pa.array([list(range(1, 1 + i % 5)) for i in ids], pa.list_(pa.int32())),
        "label": pa.array(ids.astype(np.float64)),
    }
    columns.update(overrides)
    return pa.RecordBatch.from_pydict(columns)


def _scan_and_spill(tmp_path, batches, fields=FIELDS):
    scan = datacheck.PartitionScan(batches, 0, fields)
    train, validation = spill(scan, str(tmp_path), block_rows=8,
                              columns=inputs.feed_columns(fields))
    stats = datacheck.combine(np.array([scan.figures()], dtype=np.float64), fields)
    return train, validation, stats


def test_typed_columns_come_back_by_name_with_their_types_shapes_and_masks(tmp_path):
    train, _, stats = _scan_and_spill(tmp_path, [_batch(30), _batch(13, start=30)])
    datacheck.check_stats(stats, DataRules("", "label", "error", 4, "mse", 0, FIELDS))
    seen = []
    with train:
        assert train.num_rows == 43
        for batch, (label, _) in train.batches(seed=3, epoch=0, num_steps=5):
            args = inputs.arguments(batch, FIELDS)
            assert set(args) == {"user", "image", "tokens", "tokens_mask"}
            assert args["user"].dtype == torch.int64 and args["image"].shape[1:] == (1, 2, 2)
            ids = ((args["user"] - 2**40) // 7).numpy()
            assert (ids == label.numpy()).all()  # the row's columns stay together
            assert (args["image"].reshape(len(ids), 4) == label[:, None]).all()
            lengths = np.minimum(ids % 5, 3)  # cut to maxSequenceLength
            assert args["tokens"].shape[1] == max(1, lengths.max())  # the batch's longest
            assert (args["tokens_mask"].sum(1).numpy() == lengths).all()
            expected = np.where(args["tokens_mask"].numpy(),
                                np.arange(1, args["tokens"].shape[1] + 1), 0)
            assert (args["tokens"].numpy() == expected).all()
            seen += ids.tolist()
    assert sorted(seen) == list(range(43))


@pytest.mark.parametrize(("override", "message"), [
    ({"in_user": pa.array([1, None, 3], pa.int64())}, r"inputCols\['user'\].*1 null"),
    ({"in_image": pa.array([[1.0] * 4, [1.0, None, 1.0, 1.0], [1.0] * 4])},
     r"inputCols\['image'\].*null"),
    ({"in_image": pa.array([[1.0] * 4, [1.0] * 3, [1.0] * 4])},
     r"inputCols\['image'\].*1 rows do not hold 4 values"),
    ({"in_user": pa.array([1, -4, 3], pa.int64())}, r"inputCols\['user'\].*negative id -4"),
    ({"in_tokens": pa.array([[1], [2, None], [3]], pa.list_(pa.int64()))},
     r"inputCols\['tokens'\].*null"),
])
def test_a_broken_typed_value_is_a_schema_error_naming_its_column(tmp_path, override, message):
    _, _, stats = _scan_and_spill(tmp_path, [_batch(3, **override)])
    with pytest.raises(SchemaError, match=message):
        datacheck.check_stats(stats, DataRules("", "label", "drop", 1, "mse", 0, FIELDS))


def test_an_id_beyond_the_declared_table_is_refused(tmp_path):
    fields = (InputField("user", "userId", "int64", num_embeddings=10),)
    batch = pa.RecordBatch.from_pydict({"in_user": pa.array([3, 10]), "label": [0.0, 1.0]})
    _, _, stats = _scan_and_spill(tmp_path, [batch], fields)
    with pytest.raises(SchemaError, match=r"id 10, but the network's table for 'user' has 10"):
        datacheck.check_stats(stats, DataRules("", "label", "error", 1, "mse", 0, fields))


def test_nan_in_a_float_input_is_a_bad_row_that_nan_policy_drop_drops(tmp_path):
    fields = FIELDS[1:2]
    batch = pa.RecordBatch.from_pydict({
        "in_image": pa.array([[1.0] * 4, [float("nan")] + [1.0] * 3, [2.0] * 4]),
        "label": [0.0, 1.0, 2.0]})
    train, _, stats = _scan_and_spill(tmp_path, [batch], fields)
    assert (stats["rows"], stats["bad_rows"], train.num_rows) == (3, 1, 2)
    with pytest.raises(SchemaError, match="1 of 3 rows have NaN"):
        datacheck.check_stats(stats, DataRules("pixels", "label", "error", 1, "mse", 0, fields))
    datacheck.check_stats(stats, DataRules("pixels", "label", "drop", 1, "mse", 0, fields))


def test_scoring_pads_sequences_and_refuses_nulls_lengths_and_negative_ids_by_column():
    import pyarrow as pa

    from sparkdist.torchtrain.inference import typed_rows

    # Arrow batches as the scoring UDF gets them; the sequence a slice (offsets not from 0).
    rows = typed_rows(FIELDS, (pa.array([1, 2]), pa.array([[0.5] * 4, [1.0] * 4]),
                               pa.array([[9], [4, 5, 6, 7], [8]]).slice(1)))
    assert rows["in_tokens"].tolist() == [[4, 5, 6], [8, 0, 0]]  # cut to 3, padded
    assert rows["in_tokens_mask"].tolist() == [[True] * 3, [True, False, False]]
    assert rows["in_image"].shape == (2, 4) and rows["in_user"].dtype == np.int64
    for arrays, message in [
            ((pa.array([1, None]),), r"inputCols\['user'\].*null"),
            ((pa.array([1]), pa.array([[0.5] * 3])), r"inputCols\['image'\].*3 values"),
            ((pa.array([-1]),), r"inputCols\['user'\].*negative id -1"),
            ((pa.array([1]), pa.array([[0.5] * 4]), pa.array([[1, None]])),
             r"inputCols\['tokens'\].*null")]:
        with pytest.raises(ValueError, match=message):
            typed_rows(FIELDS[:len(arrays)], arrays)


def test_input_params_that_are_not_a_dict_of_names_are_refused_naming_the_param():
    from sparkdist.models import TorchEstimator

    with pytest.raises(TypeError, match="inputCols"):
        TorchEstimator(inputCols={"user": 3})
    with pytest.raises(TypeError, match="inputShapes"):
        TorchEstimator(inputShapes={"image": [1, -8]})


def test_the_decoding_thread_keeps_order_raises_its_error_and_stops_with_the_consumer():
    import threading
    import time

    from sparkdist.torchtrain.inference import prefetched

    assert list(prefetched(iter(range(50)))) == list(range(50))

    def failing():
        yield 1
        raise ValueError("TorchModel: inputCols['user'] holds a null")

    found = prefetched(failing())
    assert next(found) == 1
    with pytest.raises(ValueError, match="holds a null"):
        next(found)
    endless = prefetched(iter(int, 1))  # never ends on its own
    assert next(endless) == 0
    endless.close()
    deadline = time.monotonic() + 5
    while any(t.name == "sparkdist-decode" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the decoding thread outlived its consumer"
        time.sleep(0.05)
