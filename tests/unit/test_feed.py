"""The executor-side data feed: spill Arrow batches to local files, stream tensors back."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pytest
import torch

from sparkdist.exceptions import SchemaError
from sparkdist.torchtrain.feed import SpilledRows, spill, step_sizes, targets

DIM = 4
F32 = pa.float32()


def _vectors(ids: np.ndarray, dim: int) -> np.ndarray:
    """Row ``i`` is ``[i, i + 0.25, i + 0.5, ...]``: its id, and a check that it stays whole."""
    return ids[:, None].astype(np.float64) + 0.25 * np.arange(dim)


def _batch(ids, dim: int = DIM, value_type: pa.DataType = F32, kind: str = "list",
           validation: list | None = None) -> pa.RecordBatch:
    ids = np.asarray(ids, dtype=np.int64)
    values = pa.array(_vectors(ids, dim).ravel()).cast(value_type, safe=False)
    if kind == "fixed":
        features = pa.FixedSizeListArray.from_arrays(values, dim)
    else:
        list_class = pa.LargeListArray if kind == "large" else pa.ListArray
        offset_type = pa.int64() if kind == "large" else pa.int32()
        offsets = pa.array(np.arange(len(ids) + 1) * dim, type=offset_type)
        features = list_class.from_arrays(offsets, values)
    columns = {"features": features, "label": pa.array(ids * 2, type=pa.int64())}
    if validation is not None:
        columns["is_validation"] = pa.array(validation, type=pa.bool_())
    return pa.RecordBatch.from_pydict(columns)


def _skewed(n_sizes=(1, 0, 700, 3, 2000, 37), **kwargs) -> list[pa.RecordBatch]:
    starts = np.concatenate([[0], np.cumsum(n_sizes)])
    return [_batch(np.arange(starts[i], starts[i + 1]), **kwargs) for i in range(len(n_sizes))]


def _epoch(rows: SpilledRows, **kwargs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(rows.batches(**kwargs))


def _ids(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> np.ndarray:
    return np.concatenate([x[:, 0].numpy() for x, _ in batches]).astype(np.int64)


@pytest.mark.parametrize("value_type", [pa.float32(), pa.float64(), pa.int32()])
@pytest.mark.parametrize("kind", ["list", "large", "fixed"])
def test_every_row_comes_back_once_per_epoch(tmp_path, seed, value_type, kind):
    n = 2741
    train, validation = spill(iter(_skewed(value_type=value_type, kind=kind)), str(tmp_path),
                              block_rows=256)
    assert (train.num_rows, train.dim, train.num_blocks) == (n, DIM, 11)
    assert validation.num_rows == 0 and validation.dim == DIM
    with train:
        for epoch in range(2):
            batches = _epoch(train, seed=seed, epoch=epoch, num_steps=7, device="cpu")
            assert [len(y.label) for _, y in batches] == step_sizes(n, 7).tolist()
            for x, (y, weight) in batches:
                assert x.dtype == y.dtype == torch.float32 and x.shape == (len(y), DIM)
                assert weight is None
                assert torch.equal(y, 2 * x[:, 0])  # label travels with its row
                # int32 input truncates the 0.25 steps; the vector still stays whole
                expected = _vectors(x[:, 0].numpy(), DIM).astype(value_type.to_pandas_dtype())
                assert np.array_equal(x.numpy(), expected.astype(np.float32))
            assert sorted(_ids(batches)) == list(range(n))


@pytest.mark.parametrize(("n", "num_steps"), [(0, 5), (3, 5), (5, 5), (1000, 7), (7, 1)])
def test_step_sizes_split_every_row_evenly(n, num_steps):
    sizes = step_sizes(n, num_steps)
    assert len(sizes) == num_steps and sizes.sum() == n
    assert sizes.min() >= 0 and sizes.max() - sizes.min() <= 1


def test_step_sizes_refuse_no_steps():
    with pytest.raises(ValueError, match="num_steps=0"):
        step_sizes(10, 0)


@pytest.mark.parametrize("batches", [[], [_batch([])]])
def test_an_empty_partition_still_yields_every_step(tmp_path, seed, batches):
    train, validation = spill(iter(batches), str(tmp_path))
    assert train.num_rows == validation.num_rows == 0 and train.dim is None
    steps = _epoch(train, seed=seed, epoch=0, num_steps=3, dim=5)
    assert [(tuple(x.shape), tuple(y.label.shape)) for x, y in steps] == [((0, 5), (0,))] * 3
    with pytest.raises(ValueError, match="dim="):
        train.batches(seed, 0, 3)


def test_a_known_dim_is_kept_by_an_empty_partition_and_checked(tmp_path, seed):
    train, _ = spill(iter([]), str(tmp_path), dim=6)
    assert train.dim == 6
    assert tuple(next(train.batches(seed, 0, 2))[0].shape) == (0, 6)
    with pytest.raises(SchemaError, match="length 6.*dim=5"):
        train.batches(seed, 0, 2, dim=5)


def test_a_rank_with_few_rows_yields_empty_steps(tmp_path, seed):
    train, _ = spill(iter([_batch([0, 1])]), str(tmp_path))
    assert [len(y.label) for _, y in train.batches(seed, 0, num_steps=5)] == [0, 0, 1, 0, 1]


def test_same_seed_and_epoch_give_the_same_batches(tmp_path, seed):
    train, _ = spill(iter(_skewed()), str(tmp_path), block_rows=100)
    first = _ids(_epoch(train, seed=seed, epoch=0, num_steps=9))
    assert np.array_equal(first, _ids(_epoch(train, seed=seed, epoch=0, num_steps=9)))
    again = SpilledRows(train.path)  # a fresh reader (a retried task) sees the same order
    assert np.array_equal(first, _ids(_epoch(again, seed=seed, epoch=0, num_steps=9)))
    assert not np.array_equal(first, _ids(_epoch(train, seed=seed, epoch=1, num_steps=9)))
    assert not np.array_equal(first, _ids(_epoch(train, seed=seed + 1, epoch=0, num_steps=9)))


def test_shuffle_mixes_rows_across_blocks(tmp_path, seed):
    train, _ = spill(iter(_skewed()), str(tmp_path), block_rows=100)
    first_batch = _ids(_epoch(train, seed=seed, epoch=0, num_steps=27)[:1])
    assert len(set(first_batch // 100)) > 3  # rows of many blocks, not one block's run


def test_without_shuffle_rows_keep_the_file_order(tmp_path, seed):
    train, _ = spill(iter(_skewed()), str(tmp_path), block_rows=100)
    for epoch in range(2):
        ids = _ids(_epoch(train, seed=seed, epoch=epoch, num_steps=4, shuffle=False))
        assert ids.tolist() == list(range(train.num_rows))


def test_a_one_block_buffer_with_a_short_block_still_covers_every_row(tmp_path):
    train, _ = spill(iter([_batch(np.arange(250))]), str(tmp_path), block_rows=100)
    for seed in range(6):  # some seeds draw the short last block first
        ids = _ids(_epoch(train, seed=seed, epoch=0, num_steps=3, shuffle_blocks=1))
        assert sorted(ids) == list(range(250))


def test_validation_rows_go_to_their_own_file(tmp_path, seed):
    flags = [i % 4 == 0 if i % 7 else None for i in range(40)]  # null counts as training
    train, validation = spill(iter([_batch(np.arange(40), validation=flags)]), str(tmp_path))
    expected = [i for i, flag in enumerate(flags) if flag]
    assert _ids(_epoch(validation, seed=seed, epoch=0, num_steps=2, shuffle=False)).tolist() \
        == expected
    assert sorted(_ids(_epoch(train, seed=seed, epoch=0, num_steps=2))) \
        == sorted(set(range(40)) - set(expected))


@pytest.mark.parametrize("batches", [
    [_batch([0, 1]), _batch([2], dim=DIM + 1)],
    [pa.RecordBatch.from_pydict({
        "features": pa.array([[1.0] * DIM, [1.0] * (DIM + 1)]), "label": [0.0, 1.0]})],
])
def test_vectors_of_different_lengths_are_refused(tmp_path, batches):
    with pytest.raises(SchemaError, match=r"'features'.*lengths: 4 and 5.*pad or truncate"):
        spill(iter(batches), str(tmp_path))


def test_missing_and_null_columns_are_refused(tmp_path):
    with pytest.raises(SchemaError, match="'label' is missing"):
        spill(iter([pa.RecordBatch.from_pydict({"features": [[1.0]]})]), str(tmp_path))
    nulls = pa.RecordBatch.from_pydict({"features": [[1.0], [2.0]], "label": [1.0, None]})
    with pytest.raises(SchemaError, match="'label' holds 1 null"):
        spill(iter([nulls]), str(tmp_path))


def test_a_closed_file_refuses_to_read(tmp_path, seed):
    train, _ = spill(iter([_batch([0, 1])]), str(tmp_path))
    with train:
        pass
    with pytest.raises(ValueError, match="closed"):
        train.batches(seed, 0, 1)


def test_reading_an_epoch_does_not_load_the_file_into_memory(tmp_path, seed):
    n, dim, chunk = 200_000, 32, 10_000
    rng = np.random.default_rng(seed)

    def source():
        for start in range(0, n, chunk):
            values = pa.array(rng.random(chunk * dim, dtype=np.float32))
            yield pa.RecordBatch.from_arrays(
                [pa.FixedSizeListArray.from_arrays(values, dim),
                 pa.array(np.arange(start, start + chunk, dtype=np.float32))],
                names=["features", "label"])

    train, _ = spill(source(), str(tmp_path))
    file_size = (tmp_path / "train.arrow").stat().st_size
    assert file_size > n * dim * 4
    arrow_peak, seen = 0, []
    tracemalloc.start()
    try:
        for _, y in train.batches(seed, 0, num_steps=n // 256):
            arrow_peak = max(arrow_peak, pa.total_allocated_bytes())
            seen.append(y.label.numpy().copy())
        _, python_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(n, dtype=np.float32))
    # The shuffle buffer is 8 blocks of 4096 rows (about 4 MiB) plus one block in flight; the
    # file is about 25 MiB. The labels kept by the test itself (0.8 MiB) are traced too.
    assert python_peak < file_size / 3
    assert arrow_peak < file_size / 10


def test_array_labels_and_weights_travel_with_their_rows(tmp_path, seed):
    n = 700
    ids = np.arange(n, dtype=np.float64)
    batch = pa.RecordBatch.from_pydict({
        "features": pa.array([[v, v] for v in ids], pa.list_(pa.float32())),
        "label": pa.array([[v, -v] for v in ids], pa.list_(pa.float32())),
        "weight": pa.array(ids / n, pa.float64())})
    train, _ = spill([batch], str(tmp_path / "a"), block_rows=64, target=targets(2, True))
    with train:
        assert train.weight_sum() == pytest.approx(ids.sum() / n)
        for x, (label, weight) in train.batches(seed, 0, num_steps=6):
            assert label.shape == (len(x), 2) and weight.shape == (len(x),)
            assert torch.equal(label[:, 0], x[:, 0]) and torch.equal(label[:, 1], -x[:, 0])
            assert torch.allclose(weight, x[:, 0] / n)
    empty, _ = spill([], str(tmp_path / "b"), dim=2, target=targets(2, True))
    with empty:
        (x, (label, weight)), = empty.batches(seed, 0, num_steps=1)
        assert (x.shape, label.shape, weight.shape) == ((0, 2), (0, 2), (0,))
        assert empty.weight_sum() == 0.0
