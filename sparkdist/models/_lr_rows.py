"""A rank's rows in a LogisticRegression fit by all-reduce: read from Arrow into a float64
matrix (:func:`read_partition`), prepared (:class:`Prepared`), and kept in the Python worker,
so that the next fit of the same cached data (CrossValidator's folds over a ``regParam``
grid, Tuner trials) skips reading them.

Reading its partition out of Spark's cache into a float64 matrix is most of what a fit by
all-reduce costs. Each rank keeps the matrix it prepared (standardised, with its statistics;
one per process, the latest) in its Python worker, which Spark reuses for later tasks
(``spark.python.worker.reuse``, the default). The next fit of the same data runs its barrier
stage over a placeholder of one row per rank, and the ranks check in one all-reduce that
together they hold every piece of it; where a piece is missing (Spark ended an idle worker,
after a minute by default, or another task took it) the fit reads the data as usual.

The same data: a DataFrame whose plan reads nothing but Spark's cache (``cache()`` or
``persist()``, the input itself or what it was derived from) through deterministic
expressions, named by the application, the plan's semantic hash and the ids of the cached
blocks it reads (a DataFrame cached again gets new ones). Nothing else is kept: rows read from
files or tables could change between two fits.

Memory: a worker drops what it holds before it reads any data, and keeps a matrix only where
the machine's available memory is at least as much again plus a tenth of the machine's, and
never under ``spark.executor.pyspark.memory`` (a cap on each worker's address space).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkdist import _internals
from sparkdist.exceptions import ParamError

if TYPE_CHECKING:
    import pyarrow as pa

#: Bytes a rank holds per matrix cell at its peak (Arrow batches, the matrix, temporaries).
COPIES = 3
#: Fits of the same data the driver remembers as held by their ranks (the latest ones).
_REMEMBERED = 16


# ----------------------------------------------------------------------------- the driver
def data_key(rows: Any, **shape: Any) -> str | None:
    """The identity of ``rows`` (the stage's input) and of how the ranks prepare them
    (``shape``: ranks, width, centring...), or None where its rows could change between two
    fits (its plan reads something besides Spark's cache, or draws random numbers)."""
    rows = rows.select("*")  # a new plan: a DataFrame looks up the cache once, when first used
    plan = _internals.java_dataframe(rows).queryExecution().withCachedData()
    if not plan.deterministic():
        return None
    leaves = plan.collectLeaves()
    blocks = []
    for i in range(leaves.size()):
        leaf = leaves.apply(i)
        if leaf.getClass().getSimpleName() != "InMemoryRelation":
            return None
        blocks.append(int(leaf.cacheBuilder().cachedColumnBuffers().id()))
    fields = ",".join(f"{name}={shape[name]}" for name in sorted(shape))
    return (f"{rows.sparkSession.sparkContext.applicationId}:{rows.semanticHash()}:"
            f"{sorted(blocks)}:{fields}")


class Remembered:
    """The data keys whose last fit left every rank holding its piece (driver side)."""

    def __init__(self) -> None:
        self._keys: collections.OrderedDict[str, None] = collections.OrderedDict()

    def __contains__(self, key: str | None) -> bool:
        return key is not None and key in self._keys

    def held(self, key: str) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > _REMEMBERED:
            self._keys.popitem(last=False)

    def forget(self, key: str) -> None:
        self._keys.pop(key, None)


REMEMBERED = Remembered()


# ---------------------------------------------------------------------------- the workers
@dataclass
class Partition:
    """One rank's rows as arrays, and what is wrong with them (counted, not raised, so that
    every rank raises the same error after one all-reduce)."""

    x: np.ndarray  # (rows, dim) float64
    y: np.ndarray
    w: np.ndarray
    bad_length: int = 0
    null_vectors: int = 0
    bad_weights: int = 0

    @property
    def rows(self) -> int:
        return int(self.y.size)


#: How a rank's over-budget partition error starts (:func:`fit` recognises it by this).
OVER_BUDGET = "a partition holds over"


def read_partition(batches: Iterator[pa.RecordBatch], args: dict[str, Any]) -> Partition:
    """The partition's (features as arrays, label[, weight]) batches as one dense matrix.
    Stops early when the partition outgrows the memory budget."""
    dim, kept, held = args["dim"], [], 0
    for batch in batches:
        kept.append(batch)
        held += batch.nbytes
        if held * COPIES > args["budget"]:
            raise ParamError(
                f"{OVER_BUDGET} {held / 2**20:.0f} MiB of Arrow data, more than the "
                f"memory budget of a rank allows ({args['budget'] / 2**20:.0f} MiB / {COPIES}); "
                "repartition the input into more partitions or set solver='mllib'.")
    rows = sum(batch.num_rows for batch in kept)
    part = Partition(x=np.zeros((rows, dim)), y=np.empty(rows), w=np.ones(rows))
    start = 0
    while kept:
        batch = kept.pop(0)  # release each batch once copied
        end = start + batch.num_rows
        part.bad_length += _fill_rows(part.x[start:end], batch.column(0))
        part.null_vectors += batch.column(0).null_count
        part.y[start:end] = batch.column(1).to_numpy(zero_copy_only=False)
        if args["weighted"]:
            weights = batch.column(2).fill_null(float("nan")).to_numpy(zero_copy_only=False)
            part.w[start:end] = weights
            part.bad_weights += int((~np.isfinite(weights) | (weights < 0)).sum())
        start = end
    return part


def _fill_rows(out: np.ndarray, arrays: pa.Array) -> int:
    """Write the feature arrays (Arrow lists of doubles) into ``out``; return how many do not
    have ``out.shape[1]`` values, nulls included (then nothing is written)."""
    rows, dim = out.shape
    lengths = arrays.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    bad = int((lengths != dim).sum())
    if not bad:
        out[:] = arrays.flatten().to_numpy(zero_copy_only=False).reshape(rows, dim)
    return bad


@dataclass
class Prepared:
    """One rank's rows as the optimiser uses them, and the statistics of all ranks' rows."""

    x: np.ndarray  # standardised (and centred with an intercept), float64
    y: np.ndarray
    w: np.ndarray
    max_label: int
    weight_sum: float
    hist: np.ndarray  # weight per class
    mean: np.ndarray
    std: np.ndarray
    inverse: np.ndarray  # 1 / std, 0 for a constant column

    @property
    def rows(self) -> int:
        return int(self.y.size)

    @property
    def nbytes(self) -> int:
        return int(self.x.nbytes + self.y.nbytes + self.w.nbytes)


#: What this Python worker holds: (data key, its piece = the rank that prepared it, rows).
_held: tuple[str, int, Prepared] | None = None


def drop() -> None:
    """Free what this worker holds (before it reads other data)."""
    global _held
    _held = None


def hold(key: str, piece: int, prepared: Prepared) -> bool:
    """Keep ``prepared`` for the next fit of ``key`` where the machine has room; whether it
    is kept."""
    global _held
    _held = None
    if not _room_for(prepared.nbytes):
        return False
    _held = (key, piece, prepared)
    return True


def piece_of(key: str) -> tuple[int, Prepared | None]:
    """The piece of ``key`` this worker holds and its rows, or (-1, None)."""
    if _held is None or _held[0] != key:
        return -1, None
    return _held[1], _held[2]


def complete(piece: int, world_size: int, all_reduce_sum: Any) -> bool:
    """Whether the ranks hold every piece once (one all-reduce; every rank gets the same
    answer)."""
    counts = np.zeros(world_size + 1)
    counts[piece if 0 <= piece < world_size else world_size] = 1.0
    total = all_reduce_sum(counts)
    return bool((total[:world_size] == 1.0).all())


def _room_for(nbytes: int) -> bool:
    """Whether the machine has ``nbytes`` and a tenth of its memory available (Linux's
    MemAvailable; elsewhere never), and no address-space cap on this worker (Spark's
    ``spark.executor.pyspark.memory``: what it held would count against its next tasks)."""
    if os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB"):
        return False
    try:
        with open("/proc/meminfo") as info:
            fields = dict(line.split(":", 1) for line in info)
        total = int(fields["MemTotal"].split()[0]) * 1024
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return False
    return available >= nbytes + total // 10
