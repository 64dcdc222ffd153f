"""Executor-side data feed: Arrow batches of one partition in, torch tensors out.

A Spark partition reaches a barrier task as an iterator of ``pyarrow.RecordBatch`` with a
``features`` column (list of numbers, one length ``dim`` for every row), a ``label`` column and
optionally a boolean ``is_validation`` column; or, for a network with several typed inputs
(``inputCols``), one column per input described by a :class:`Column` (float32 or int64; a
scalar, a fixed-length array, or a variable-length sequence of ids padded per batch to its
longest, with a mask). :func:`spill` makes one pass over it and writes
training and validation rows to two local Arrow IPC files in blocks of ``block_rows`` rows.
Each epoch then reads a file a block at a time (:meth:`SpilledRows.batches`): blocks in a
seeded random order, rows mixed in a sliding buffer of a few blocks. Memory is bounded by that
buffer and one batch, never by the partition size, and no row becomes a Python object.

Every rank yields the same number of steps per epoch, however many rows it holds:
:func:`step_sizes` splits a rank's rows over the steps, and the training loop calls it with
every rank's row count to know the global batch size of each step.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from sparkdist.exceptions import SchemaError
from sparkdist.torchtrain import inputs
from sparkdist.torchtrain.blockfile import BlockWriter
from sparkdist.torchtrain.inputs import Column, Inputs, Target

FEATURES = "features"
LABEL = "label"
WEIGHT = "weight"
IS_VALIDATION = "is_validation"
TRAIN_FILE = "train.arrow"
VALIDATION_FILE = "validation.arrow"
DEFAULT_BLOCK_ROWS = 4096
DEFAULT_SHUFFLE_BLOCKS = 8

# Rows as numpy arrays, one per file column in order (a sequence column as a zero-padded
# [rows, width] array followed by its [rows] lengths), the targets last: the float32 weights
# where there are any, then the float32 labels ([rows] or [rows, k]).
Chunk = tuple[np.ndarray, ...]


def targets(label_width: int = 0, weighted: bool = False) -> tuple[Column, ...]:
    """The columns a loss is computed against, last in every file: ``weight`` (``weightCol``)
    where rows are weighted, then ``label``: one float32 per row, or ``label_width`` (an array
    label, ``labelCols``)."""
    return (Column(WEIGHT),) * weighted + (Column(LABEL, width=label_width),)


def step_sizes(n: int, num_steps: int) -> np.ndarray:
    """Split ``n`` rows over ``num_steps`` steps: ``floor((s+1)n/k) - floor(sn/k)`` at step s.

    Every rank uses this rule, so any rank can compute every other rank's batch sizes (and so
    the global batch size of each step) from the all-gathered row counts.

    Parameters
    ----------
    n : int
        Number of rows (0 or more).
    num_steps : int
        Number of steps (1 or more).

    Returns
    -------
    numpy.ndarray
        ``num_steps`` int64 sizes that sum to ``n`` and differ by at most 1.

    Examples
    --------
    >>> step_sizes(5, 3).tolist()
    [1, 2, 2]
    """
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps} must be at least 1")
    if n < 0:
        raise ValueError(f"n={n} rows cannot be negative")
    bounds = np.arange(num_steps + 1, dtype=np.int64) * n // num_steps
    return np.diff(bounds)


def spill(
    batches: Iterable[pa.RecordBatch],
    directory: str,
    block_rows: int | None = None,
    dim: int | None = None,
    columns: tuple[Column, ...] | None = None,
    target: tuple[Column, ...] = targets(),
) -> tuple[SpilledRows, SpilledRows]:
    """Write one partition's rows to local Arrow files, training and validation apart.

    Parameters
    ----------
    batches : iterable of pyarrow.RecordBatch
        The partition: ``features`` (list of numbers), or the ``columns``; ``label`` (number)
        and optionally ``is_validation`` (bool; null counts as training). Other columns are
        ignored.
    directory : str
        Local scratch directory (created if missing); receives ``train.arrow`` and
        ``validation.arrow``. Deleting it afterwards is the caller's job.
    block_rows : int, optional
        Rows per record batch in the files (the last one may be shorter): the unit of
        shuffling. By default 4096, fewer for wide typed inputs (a block under 16 MiB).
    dim : int, optional
        Expected vector length. Without it the first non-empty batch sets it; with it, an empty
        partition still writes files that know their ``dim``.
    columns : tuple of Column, optional
        Typed inputs instead of ``features``; their values must already be checked (no nulls,
        fixed widths as declared: :class:`sparkdist.torchtrain.datacheck.PartitionScan`).
    target : tuple of Column, default one float32 ``label``
        The :func:`targets` columns: ``weight`` where rows are weighted, ``label`` (an array
        label of a fixed width checked by the scan).

    Returns
    -------
    tuple of SpilledRows
        ``(training, validation)``, both open; close them (or use ``with``) when done.

    Raises
    ------
    SchemaError
        A column is missing or not numeric, holds nulls, or vectors differ in length.

    Examples
    --------
    >>> batch = pa.RecordBatch.from_pydict({
    ...     "features": [[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.5, 0.5]],
    ...     "label": [1.0, 1.0, 0.0, 0.0],
    ...     "is_validation": [False, False, False, True]})
    >>> train, validation = spill([batch], tmp)
    >>> train.num_rows, validation.num_rows, train.dim
    (3, 1, 2)
    >>> with train, validation:
    ...     for x, y in train.batches(seed=1, epoch=0, num_steps=2):
    ...         print(tuple(x.shape), tuple(y.label.shape))
    (1, 2) (1,)
    (2, 2) (2,)
    """
    block_rows = block_rows or _block_rows(columns)
    if block_rows < 1:
        raise ValueError(f"block_rows={block_rows} must be at least 1")
    os.makedirs(directory, exist_ok=True)
    paths = (os.path.join(directory, TRAIN_FILE), os.path.join(directory, VALIDATION_FILE))
    writers = (BlockWriter(paths[0], block_rows), BlockWriter(paths[1], block_rows))
    try:
        dim = _spill_into(batches, writers, dim, columns, target)
    except BaseException:
        for writer in writers:
            writer.abort()
        raise
    schema = file_schema(columns, target, dim or 0)
    for writer in writers:
        writer.close(schema)
    return SpilledRows(paths[0]), SpilledRows(paths[1])


def _block_rows(columns: tuple[Column, ...] | None) -> int:
    """4096 rows (always for a ``features`` file, whose shuffle order must not change); fewer
    where typed inputs make a row wide, so a block stays under 16 MiB (8 bytes a value)."""
    if columns is None:
        return DEFAULT_BLOCK_ROWS
    row_bytes = sum(8 * max(1, c.cap if c.sequence else c.width) for c in columns)
    return max(64, min(DEFAULT_BLOCK_ROWS, 2**24 // row_bytes))


def _spill_into(batches: Iterable[pa.RecordBatch], writers: tuple[BlockWriter, BlockWriter],
                dim: int | None, columns: tuple[Column, ...] | None,
                target: tuple[Column, ...]) -> int | None:
    """Route every row to the training or validation writer; return the vector length."""
    first_row = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if columns is None:
            arrays, dim = _normalise(batch, dim, first_row)
        else:
            arrays = _typed(batch, columns)
        arrays += [_target_array(batch, column) for column in target]
        rows = pa.RecordBatch.from_arrays(arrays, schema=file_schema(columns, target, dim or 0))
        first_row += batch.num_rows
        mask = _validation_mask(batch)
        if mask is None:
            writers[0].write(rows)
        else:
            writers[0].write(rows.filter(pc.invert(mask)))
            writers[1].write(rows.filter(mask))
    return dim


def file_schema(columns: tuple[Column, ...] | None, target: tuple[Column, ...],
                dim: int = 0) -> pa.Schema:
    """The file schema: ``features`` (``dim`` 0 marks a file whose vector length is unknown:
    no rows) or each typed input as :meth:`Column.arrow_type`, then the targets."""
    head = [pa.field(FEATURES, pa.list_(pa.float32(), dim), nullable=False)] \
        if columns is None else [pa.field(c.name, c.arrow_type(), nullable=False)
                                 for c in columns]
    return pa.schema([*head, *(pa.field(c.name, c.arrow_type(), nullable=False)
                               for c in target)])


def _typed(batch: pa.RecordBatch, columns: tuple[Column, ...]) -> list[pa.Array]:
    """The batch's typed inputs as the file holds them."""
    missing = [c.name for c in columns if c.name not in batch.schema.names]
    if missing:
        raise SchemaError(f"columns {missing} are missing from the partition "
                          f"(columns: {batch.schema.names})")
    return [inputs.to_arrow(batch.column(c.name), c) for c in columns]


def _target_array(batch: pa.RecordBatch, column: Column) -> pa.Array:
    """The label or the weights as the file holds them (an array label already checked)."""
    if column.name not in batch.schema.names:
        raise SchemaError(f"column '{column.name}' is missing from the partition (columns: "
                          f"{batch.schema.names}); select the features and label columns "
                          "before training")
    values = batch.column(column.name)
    if column.width:
        return inputs.to_arrow(values, column)
    return _as_float32(values, column.name)


def _normalise(batch: pa.RecordBatch, dim: int | None, first_row: int) -> tuple[
        list[pa.Array], int]:
    """The features as fixed_size_list<float32, dim>, and their vector length."""
    if FEATURES not in batch.schema.names:
        raise SchemaError(
            f"column '{FEATURES}' is missing from the partition (columns: "
            f"{batch.schema.names}); select the features and label columns before training")
    values, dim = _flat_values(batch.column(FEATURES), dim, first_row)
    return [pa.FixedSizeListArray.from_arrays(values, dim)], dim


def _flat_values(features: pa.Array, dim: int | None, first_row: int) -> tuple[pa.Array, int]:
    """Check the vector lengths and return all values, row after row, as float32."""
    kind = features.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)):
        raise SchemaError(
            f"column '{FEATURES}' has type {kind}; it must be an array of numbers (turn a "
            "Vector column into one with pyspark.ml.functions.vector_to_array)")
    if features.null_count:
        raise SchemaError(f"column '{FEATURES}' holds {features.null_count} null vectors; "
                          "drop or impute them before training")
    if pa.types.is_fixed_size_list(kind):
        lengths = np.full(len(features), kind.list_size)
    else:
        lengths = pc.list_value_length(features).to_numpy(zero_copy_only=False)
    dim = int(lengths[0]) if dim is None else dim
    _check_lengths(lengths, dim, first_row)
    return _as_float32(features.flatten(), FEATURES), dim


def _check_lengths(lengths: np.ndarray, dim: int, first_row: int) -> None:
    """Raise :class:`SchemaError` at the first vector whose length is not ``dim``."""
    if dim < 1:
        raise SchemaError(f"column '{FEATURES}' holds empty vectors; every row needs at least "
                          "one feature")
    bad = np.flatnonzero(lengths != dim)
    if bad.size:
        row = int(bad[0])
        raise SchemaError(
            f"column '{FEATURES}' holds vectors of different lengths: {dim} and "
            f"{int(lengths[row])} (row {first_row + row} of this partition); every row needs "
            "the same length: pad or truncate the vectors (or fix the feature pipeline) "
            "before training")


def _as_float32(values: pa.Array, column: str) -> pa.Array:
    """Cast numbers to float32; nulls and non-numbers raise :class:`SchemaError`."""
    kind = values.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
            or pa.types.is_decimal(kind) or pa.types.is_boolean(kind)):
        raise SchemaError(f"column '{column}' holds values of type {kind}; it must hold "
                          "numbers (cast it to double first)")
    if values.null_count:
        raise SchemaError(f"column '{column}' holds {values.null_count} null values; drop or "
                          "impute them before training")
    # Unsafe: float64 -> float32 may round, which is what training on float32 means anyway.
    return values.cast(pa.float32(), safe=False)


def _validation_mask(batch: pa.RecordBatch) -> pa.Array | None:
    """The rows to keep for validation, or None when every row is for training."""
    if IS_VALIDATION not in batch.schema.names:
        return None
    mask = pc.fill_null(batch.column(IS_VALIDATION).cast(pa.bool_()), False)
    return mask if pc.any(mask).as_py() else None


class SpilledRows:
    """Rows spilled by :func:`spill`, read back a block at a time. Plain reads, not a memory
    map: a mapped file's pages count towards the process's resident memory as they are
    touched, so a memory map would grow a worker's RSS with its partition.

    Parameters
    ----------
    path : str
        An Arrow IPC file written by :func:`spill`.

    Attributes
    ----------
    path : str
        The file.
    num_rows : int
        Number of rows in the file.
    dim : int or None
        Vector length of a ``features`` file; None when the file has no rows and the length
        was never known, and for typed inputs.
    columns : tuple of Column or None
        The typed inputs (None for a ``features`` file).
    target : tuple of Column
        The :func:`targets` the file holds after its inputs.
    num_blocks : int
        Number of record batches (blocks) in the file.

    Examples
    --------
    >>> batch = pa.RecordBatch.from_pydict({"features": [[0.0, 1.0], [1.0, 0.0]],
    ...                                     "label": [1.0, 0.0]})
    >>> for spilled in spill([batch], tmp):  # writes train.arrow and validation.arrow
    ...     spilled.close()
    >>> with SpilledRows(f"{tmp}/train.arrow") as rows:
    ...     x, y = next(rows.batches(seed=1, epoch=0, num_steps=1))
    >>> rows.num_rows, rows.num_blocks, tuple(x.shape)
    (2, 1, (2, 2))
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._source = pa.OSFile(path, "rb")
        self._reader: pa.ipc.RecordBatchFileReader | None = pa.ipc.open_file(self._source)
        schema = self._reader.schema
        self.dim: int | None = None
        self.columns: tuple[Column, ...] | None = None
        self.target = tuple(inputs.column_of(field) for field in schema
                            if field.name in (WEIGHT, LABEL))
        heads = [field for field in schema if field.name not in (WEIGHT, LABEL)]
        if [field.name for field in heads] == [FEATURES]:
            kind = schema.field(FEATURES).type
            if not pa.types.is_fixed_size_list(kind):
                raise SchemaError(f"{path} is not a file written by spill(): column "
                                  f"'{FEATURES}' has type {kind}")
            self.dim = kind.list_size or None
        else:
            self.columns = tuple(inputs.column_of(field) for field in heads)
        self.num_blocks: int = self._reader.num_record_batches
        blocks = (self._reader.get_batch(i).num_rows for i in range(self.num_blocks))
        self._block_sizes = np.fromiter(blocks, dtype=np.int64, count=self.num_blocks)
        self.num_rows = int(self._block_sizes.sum())

    def __repr__(self) -> str:
        return (f"SpilledRows({self.path!r}, num_rows={self.num_rows}, dim={self.dim}, "
                f"num_blocks={self.num_blocks})")

    def __enter__(self) -> SpilledRows:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def weight_sum(self) -> float:
        """The rows' summed weights (``weightCol``); the row count where rows weigh 1."""
        if self.target[0].name != WEIGHT or self._reader is None:
            return float(self.num_rows)
        at = self._reader.schema.get_field_index(WEIGHT)
        return float(sum(np.sum(self._reader.get_batch(i).column(at).to_numpy(), dtype=np.float64)
                         for i in range(self.num_blocks)))

    def close(self) -> None:
        """Close the file (batches already yielded stay valid: they are copies)."""
        self._reader = None
        self._source.close()

    def batches(
        self,
        seed: int,
        epoch: int,
        num_steps: int,
        shuffle: bool = True,
        *,
        dim: int | None = None,
        shuffle_blocks: int = DEFAULT_SHUFFLE_BLOCKS,
        device: torch.device | str | None = None,
    ) -> Iterator[tuple[Inputs, Target]]:
        """Yield exactly ``num_steps`` batches that hold every row once.

        Step ``s`` holds ``step_sizes(num_rows, num_steps)[s]`` rows, possibly 0.

        Parameters
        ----------
        seed, epoch : int
            The shuffle order depends on these two only: same pair, same batches.
        num_steps : int
            Number of batches to yield (1 or more).
        shuffle : bool, default True
            Permute the blocks, then mix rows in a sliding buffer of ``shuffle_blocks`` blocks.
            False keeps the file order (for validation).
        dim : int, optional
            Vector length, needed when the file is empty and never learnt it; when the file
            knows its length, a different ``dim`` raises :class:`SchemaError`.
        shuffle_blocks : int, default 8
            Blocks in the shuffle buffer: memory is about ``shuffle_blocks * block_rows`` rows.
        device : torch.device or str, optional
            Move the tensors there; by default they stay on the CPU.

        Yields
        ------
        tuple
            The inputs (features float32 ``[b, dim]``, or the typed inputs by column name:
            :data:`Inputs`) and the :class:`Target` (labels float32 ``[b]`` or ``[b, k]``,
            weights ``[b]`` or None), fresh memory (not views of the file).
        """
        empty = self._empty(dim)
        sizes = step_sizes(self.num_rows, num_steps)
        if shuffle_blocks < 1:
            raise ValueError(f"shuffle_blocks={shuffle_blocks} must be at least 1")
        if self._reader is None:
            raise ValueError(f"{self.path} is closed")
        if self.num_rows == 0:
            chunks: Iterator[Chunk] = iter(())
        elif shuffle:
            chunks = self._shuffled_chunks(np.random.default_rng([seed, epoch]), shuffle_blocks)
        else:
            chunks = (self._read_block(i) for i in range(self.num_blocks))
        weighted = self.target[0].name == WEIGHT
        return _batches(_Rechunker(chunks, empty), sizes, self.columns, weighted, device)

    def _empty(self, dim: int | None) -> Chunk:
        """A chunk of no rows (the vector length resolved for a ``features`` file)."""
        head = (np.empty((0, self._resolve_dim(dim)), np.float32),) if self.columns is None \
            else _concat([], self.columns)
        return (*head, *_concat([], self.target))

    def _resolve_dim(self, dim: int | None) -> int:
        if self.dim is None:
            if dim is None:
                raise ValueError(f"{self.path} has no rows and does not know the vector "
                                 "length: pass dim= (the feature count of the other ranks)")
            return dim
        if dim is not None and dim != self.dim:
            raise SchemaError(f"column '{FEATURES}' has vectors of length {self.dim} in "
                              f"{self.path} but dim={dim} was expected; every partition needs "
                              "the same vector length")
        return self.dim

    def _read_block(self, index: int) -> Chunk:
        """One block as numpy arrays (read-only views of its read buffers where they can be:
        every column but a sequence, which is padded into a new array)."""
        if self._reader is None:
            raise ValueError(f"{self.path} was closed while its batches were being read")
        block = self._reader.get_batch(index)
        rows = block.num_rows
        if self.columns is None:
            features = block.column(0).flatten().to_numpy(zero_copy_only=True)
            arrays = [features.reshape(rows, -1)]
        else:
            arrays = []
            for at, column in enumerate(self.columns):
                arrays += _arrays(block.column(at), column, rows)
        first = block.num_columns - len(self.target)
        for at, column in enumerate(self.target, start=first):
            arrays += _arrays(block.column(at), column, rows)
        return tuple(arrays)

    def _shuffled_chunks(self, rng: np.random.Generator, shuffle_blocks: int) -> Iterator[Chunk]:
        """Blocks in random order through a sliding shuffle buffer of ``shuffle_blocks`` blocks.

        Each incoming block of r rows pushes out r rows drawn at random from the buffer and
        takes their slots, so a row can leave long after (or before) its block neighbours.
        """
        order = rng.permutation(self.num_blocks)
        block_rows = int(self._block_sizes.max())
        buffer = _concat([self._read_block(i) for i in order[:shuffle_blocks]], self.columns)
        for index in order[shuffle_blocks:]:
            new = self._read_block(index)
            if len(new[-1]) > len(buffer[-1]):  # a short last block filled a one-block buffer
                yield from _drain(buffer, rng, block_rows)
                buffer = tuple(array.copy() for array in new)
                continue
            slots = rng.choice(len(buffer[-1]), size=len(new[-1]), replace=False)
            yield _take(buffer, slots)
            buffer = _put(buffer, slots, new)
        yield from _drain(buffer, rng, block_rows)


def _arrays(values: pa.Array, column: Column, rows: int) -> list[np.ndarray]:
    """One file column of a block as numpy: a view of the read buffer where it can be (all but
    a sequence, padded into a new array with its lengths)."""
    if column.sequence:
        return inputs.padded(values)
    if column.width:
        return [values.flatten().to_numpy(zero_copy_only=True).reshape(rows, column.width)]
    return [values.to_numpy(zero_copy_only=True)]


def _take(chunk: Chunk, rows: np.ndarray) -> Chunk:
    return tuple(array[rows] for array in chunk)


def _put(buffer: Chunk, slots: np.ndarray, new: Chunk) -> Chunk:
    """``buffer`` with ``new``'s rows in ``slots`` (a sequence widened where ``new`` is wider);
    in place where nothing widens."""
    out = []
    for held, rows in zip(buffer, new):
        held = inputs.widened(held, rows.shape[1]) if rows.ndim == 2 else held
        held[slots] = inputs.widened(rows, held.shape[1]) if rows.ndim == 2 else rows
        out.append(held)
    return tuple(out)


def _concat(parts: list[Chunk], columns: tuple[Column, ...] | None) -> Chunk:
    """The rows of ``parts`` in one chunk (sequences padded to the widest); with no parts, a
    chunk of no rows for ``columns``."""
    if not parts:
        assert columns is not None  # a features file knows its width (SpilledRows._empty)
        arrays: list[np.ndarray] = []
        for column in columns:
            dtype = np.int64 if column.dtype == "int64" else np.float32
            if column.sequence:
                arrays += [np.empty((0, 0), np.int64), np.empty(0, np.int64)]
            else:
                arrays.append(np.empty((0, column.width) if column.width else 0, dtype))
        return tuple(arrays)
    out = []
    for same in zip(*parts):  # one array of every part
        width = max((a.shape[1] for a in same if a.ndim == 2), default=0)
        out.append(np.concatenate([inputs.widened(a, width) for a in same]))
    return tuple(out)


def _drain(buffer: Chunk, rng: np.random.Generator, block_rows: int) -> Iterator[Chunk]:
    """Empty the buffer in random order, a block at a time (one whole copy would double it)."""
    out = rng.permutation(len(buffer[-1]))
    for start in range(0, len(out), block_rows):
        yield _take(buffer, out[start:start + block_rows])


def _batches(rechunker: _Rechunker, sizes: np.ndarray, columns: tuple[Column, ...] | None,
             weighted: bool, device: torch.device | str | None) -> Iterator[
                 tuple[Inputs, Target]]:
    """Cut the row stream into tensors of the given sizes."""
    for size in sizes:
        chunk = rechunker.take(int(size))
        y = Target(torch.from_numpy(chunk[-1]),
                   torch.from_numpy(chunk[-2]) if weighted else None)
        if columns is None:
            x: Inputs = torch.from_numpy(chunk[0])
        else:
            x = inputs.tensors(chunk, columns)
        yield (x, y) if device is None else (inputs.to_device(x, device), y.to(device))


class _Rechunker:
    """Cuts a stream of row chunks into arrays of requested sizes (always fresh copies)."""

    def __init__(self, chunks: Iterator[Chunk], empty: Chunk) -> None:
        self._chunks = chunks
        self._empty = empty
        self._head: Chunk = empty
        self._offset = 0

    def take(self, size: int) -> Chunk:
        """The next ``size`` rows; copies, so they never point into a block's buffers."""
        pieces: list[Chunk] = [self._empty]
        while size > 0:
            if self._offset == len(self._head[-1]):
                self._advance()
            end = min(self._offset + size, len(self._head[-1]))
            pieces.append(tuple(array[self._offset:end] for array in self._head))
            size -= end - self._offset
            self._offset = end
        return _concat(pieces, None)

    def _advance(self) -> None:
        head = next(self._chunks, None)
        if head is None:  # step sizes sum to num_rows, so only a corrupt file ends early
            raise RuntimeError("the spilled file ended before the last step")
        self._head, self._offset = head, 0
