"""Typed inputs of a network with several arguments (``inputCols``): how each column is held
in the spilled files, read back into numpy, and handed to the network as tensors.

A :class:`Column` is one ``forward`` argument's column: float32 or int64 (ids for
``nn.Embedding``), a scalar, a fixed-length array (reshaped to ``inputShapes`` by the network's
caller), or a variable-length sequence of ids: cut to ``maxSequenceLength`` when spilled,
padded with zeros per batch to the batch's longest, and passed with a boolean ``<arg>_mask``
(True on real tokens) where ``forward`` takes one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

if TYPE_CHECKING:
    from sparkdist.torchtrain.spec import InputField

#: What a step gets: one float32 [b, dim] tensor (the ``features`` layout), or the typed
#: inputs by column name (a sequence ``c`` also as ``c_mask``, True on its real tokens).
Inputs = Any


class Target(NamedTuple):
    """What a batch's loss is computed against: the labels (float32 ``[b]``, or ``[b, k]``
    for an array label or ``labelCols``) and the per-row weights (``weightCol``; None: every
    row weighs 1)."""

    label: torch.Tensor
    weight: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Target:
        """This target on ``device``, without waiting for it."""
        weight = None if self.weight is None else self.weight.to(device, non_blocking=True)
        return Target(self.label.to(device, non_blocking=True), weight)

    def scaled(self, factor: float) -> Target:
        """The weights times ``factor`` (the training rows over their summed weight, so the
        mean weight is 1 and the loop's per-row averaging gives the weighted mean)."""
        return self if self.weight is None else Target(self.label, self.weight * factor)


@dataclass(frozen=True)
class Column:
    """One typed input column, the same in the partition and the spilled file.

    ``width``: 0 for a scalar per row, n for a fixed-length array of n values (a shape is the
    caller's to restore), ignored for a ``sequence`` (a variable-length int64 array, cut to
    its first ``cap`` values at spill time and padded per batch to the batch's longest)."""

    name: str
    dtype: str = "float32"  # or "int64"
    width: int = 0
    sequence: bool = False
    cap: int = 0

    def arrow_type(self) -> pa.DataType:
        value = pa.int64() if self.dtype == "int64" else pa.float32()
        if self.sequence:
            return pa.list_(value)
        return pa.list_(value, self.width) if self.width else value


def to_arrow(values: pa.Array, column: Column) -> pa.Array:
    """``values`` (checked: no nulls, the declared width) as ``column``'s Arrow type; a
    sequence cut to its first ``cap`` values."""
    value_type = pa.int64() if column.dtype == "int64" else pa.float32()
    if column.sequence:
        values = values.cast(pa.list_(value_type), safe=False)
        return pc.list_slice(values, 0, column.cap) if column.cap else values
    if not column.width:
        return values.cast(value_type, safe=False)
    flat = pc.list_flatten(values).cast(value_type, safe=False)
    return pa.FixedSizeListArray.from_arrays(flat, column.width)


def column_of(field: pa.Field) -> Column:
    """The :class:`Column` a spilled file's field was written from."""
    kind = field.type
    sequence = pa.types.is_list(kind)
    fixed = pa.types.is_fixed_size_list(kind)
    value = kind.value_type if sequence or fixed else kind
    return Column(field.name, "int64" if pa.types.is_integer(value) else "float32",
                  kind.list_size if fixed else 0, sequence)


def padded(values: pa.Array) -> list[np.ndarray]:
    """A sequence column as a zero-padded int64 ``[rows, longest]`` array and its lengths."""
    lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(values).to_numpy(zero_copy_only=False)
    out = np.zeros((len(lengths), int(lengths.max(initial=0))), np.int64)
    starts = np.cumsum(lengths) - lengths
    out[np.repeat(np.arange(len(lengths)), lengths),
        np.arange(len(flat)) - np.repeat(starts, lengths)] = flat
    return [out, lengths]


def widened(array: np.ndarray, width: int) -> np.ndarray:
    """A padded sequence array zero-padded on the right to ``width`` columns (any other
    array as it is)."""
    if array.ndim < 2 or array.shape[1] >= width:
        return array
    return np.pad(array, ((0, 0), (0, width - array.shape[1])))


def tensors(chunk: tuple[np.ndarray, ...], columns: tuple[Column, ...]) -> dict[str, torch.Tensor]:
    """The typed inputs of a batch by column name; a sequence cut to the batch's longest (at
    least 1) with its mask."""
    inputs: dict[str, torch.Tensor] = {}
    arrays = iter(chunk)
    for column in columns:
        values = next(arrays)
        if column.sequence:
            lengths = next(arrays)
            longest = max(1, int(lengths.max(initial=0)))
            values = np.ascontiguousarray(widened(values, longest)[:, :longest])
            inputs[f"{column.name}_mask"] = torch.from_numpy(np.arange(longest) < lengths[:, None])
        inputs[column.name] = torch.from_numpy(values)
    return inputs


def to_device(inputs: Inputs, device: torch.device | str) -> Inputs:
    """``inputs`` (a tensor or tensors by name) on ``device``, without waiting for it."""
    if isinstance(inputs, dict):
        return {name: value.to(device, non_blocking=True) for name, value in inputs.items()}
    return inputs.to(device, non_blocking=True)


def feed_columns(fields: tuple[InputField, ...]) -> tuple[Column, ...] | None:
    """How the feed holds each typed input (None without typed inputs: one ``features``)."""
    if not fields:
        return None
    return tuple(Column(f.name, f.dtype, f.width, f.sequence, f.max_length) for f in fields)


def arguments(batch: Inputs, fields: tuple[InputField, ...]) -> Inputs:
    """The feed's batch as the network's arguments: a fixed-shape input reshaped to
    ``[rows, *shape]``, a sequence's mask passed as ``<arg>_mask`` where ``forward`` takes
    one; one features tensor as it is."""
    if not fields:
        return batch
    found: dict[str, torch.Tensor] = {}
    for field in fields:
        values = batch[field.name]
        if len(field.shape) > 1 and not field.sequence:
            values = values.reshape(len(values), *field.shape)
        found[field.arg] = values
        if field.mask:
            found[f"{field.arg}_mask"] = batch[f"{field.name}_mask"]
    return found
