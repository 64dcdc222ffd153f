"""Deterministic train/test splits.

A row's split is a pure function of its values (a stable hash of key columns and the
seed, plus, for some methods, statistics of the whole DataFrame), never of partitioning,
caching or task order. Spark's ``randomSplit`` draws per partition, so it can move rows
between splits when a DataFrame is recomputed; these splits cannot.

Examples
--------
>>> parts = split(df, {"train": 0.8, "test": 0.2}, method="random", seed=42,
...               keyCols=["customer_id"])
>>> train, test = parts["train"], parts["test"]
>>> parts.metadata
{'method': 'random', 'seed': 42, 'fractions': {'train': 0.8, 'test': 0.2},
 'keyCols': ['customer_id'], 'counts': {'train': 1627, 'test': 373}}
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import FractionalType, MapType, StructField, StructType

from sparkdist.columns import (
    check_one_of,
    col,
    empty_data_error,
    is_discrete,
    is_temporal,
    quoted,
    require_columns,
    suggest,
)
from sparkdist.exceptions import ParamError, SchemaError

METHODS = ("random", "stratified", "time", "group", "cold_start")
#: Which column parameters each method needs.
REQUIRED = {"stratified": ("labelCol",), "time": ("timeCol",), "group": ("groupCol",),
            "cold_start": ("userCol", "itemCol")}
_SPLIT = "_sparkdist_split"
_KEY, _LABEL, _BUCKET = "_sd_key", "_sd_label", "_sd_bucket"  # stratified: ranking columns
#: Hash buckets per class in the stratified ranking job; only buckets that hold a cut are sorted.
_BUCKETS = 1024
_HASH_BITS = 53  # exactly representable in a double, so u is uniform on [0, 1)
_MAX_STRATA = 1000
_QUANTILE_ACCURACY = 1_000_000  # exact below a million rows, within 1e-6 of rank above
#: How far the (exact) sum of the fractions may be from 1: float rounding of fractions such as
#: 0.7 + 0.2 + 0.1, never a real shortfall such as 3 x 0.333333.
_SUM_TOLERANCE = 1e-9


class SplitResult(Mapping[str, DataFrame]):
    """The split DataFrames by name, plus :attr:`metadata` for tracking."""

    def __init__(self, assigned: DataFrame, names: Sequence[str], info: dict[str, Any]) -> None:
        self._assigned = assigned
        self._frames = {n: assigned.where(F.col(_SPLIT) == n).drop(_SPLIT) for n in names}
        self._info = copy.deepcopy(info)
        self._metadata: dict[str, Any] | None = None

    def __getitem__(self, name: str) -> DataFrame:
        if name not in self._frames:
            raise KeyError(f"no split named {name!r}; the splits are {list(self._frames)}."
                           f"{suggest(name, self._frames)}")
        return self._frames[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._frames)

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def metadata(self) -> dict[str, Any]:
        """Method, seed, fractions, columns and the row count of each split (one Spark job,
        run on first access)."""
        if self._metadata is None:
            rows = self._assigned.groupBy(_SPLIT).count().collect()
            found = {r[_SPLIT]: r["count"] for r in rows}
            counts = {n: found.get(n, 0) for n in self._frames}
            self._metadata = {**self._info, "counts": counts}
        return copy.deepcopy(self._metadata)


def split(df: DataFrame, fractions: Mapping[str, float], method: str = "random", seed: int = 42,
          keyCols: Sequence[str] | None = None, labelCol: str | None = None,
          timeCol: str | None = None, groupCol: str | None = None, userCol: str | None = None,
          itemCol: str | None = None, cutoffs: Sequence[Any] | None = None) -> SplitResult:
    """Split ``df`` into named parts, deterministically.

    Parameters
    ----------
    fractions : mapping of split name to fraction, in order; the fractions sum to 1 (within
        1e-9, so write thirds as 1/3, not 0.333333).
        For ``time`` earlier rows go to earlier splits; for ``cold_start`` the training side
        is the split named ``train`` (else the first).
    method : ``random`` (hash of ``keyCols``, default all columns), ``stratified`` (per-class
        fractions exact to a row, ``labelCol``), ``time`` (cut-offs at time quantiles of
        ``timeCol``, or explicit ``cutoffs``), ``group`` (all rows of a ``groupCol`` value on
        one side) or ``cold_start`` (every ``userCol`` and ``itemCol`` value of the other
        splits also appears in the training side; rows that would break this move to it).
    seed : the hash seed; the same seed and data give the same split anywhere.

    Notes
    -----
    Each part is ``df`` with a column computed row by row, then filtered: it keeps ``df``'s
    partitions (a model fitted on it uses as many cores as ``df`` has partitions), and
    ``df``'s rows are not shuffled to make it. ``stratified`` runs one Spark job here, which
    ranks the rows near each class's cuts (only those are shuffled), and ``time`` one for the
    quantiles; ``cold_start`` broadcasts the users and items that have no training row. In
    ``stratified``, rows equal in every column (map columns aside) go to the same split, so a
    class's counts can be off by the number of such duplicates at a cut.
    """
    names, fracs = _check_fractions(fractions)
    columns = _check_method(df, method, keyCols=keyCols, labelCol=labelCol, timeCol=timeCol,
                            groupCol=groupCol, userCol=userCol, itemCol=itemCol)
    if df.isEmpty():
        raise empty_data_error("split")
    info: dict[str, Any] = {"method": method, "seed": seed, "fractions": dict(fractions),
                            **columns}
    if method == "random":
        assigned = df.withColumn(_SPLIT, _cumulative(_unit(_key_cols(df, keyCols), seed),
                                                     names, fracs))
    elif method == "group":
        assigned = df.withColumn(_SPLIT, _cumulative(_unit([groupCol], seed), names, fracs))
    elif method == "stratified":
        assigned = _stratified(df, str(labelCol), names, fracs, seed, keyCols)
    elif method == "time":
        bounds = _time_cutoffs(df, str(timeCol), fracs, cutoffs)
        info["cutoffs"] = [b.isoformat() for b in bounds]
        assigned = df.withColumn(_SPLIT, _by_time(col(str(timeCol)), names, bounds))
    else:
        assigned = _cold_start(df, str(userCol), str(itemCol), names, fracs, seed, keyCols)
    return SplitResult(assigned, names, info)


# -- validation (no Spark jobs) -------------------------------------------------------------
def _check_fractions(fractions: Mapping[str, float]) -> tuple[list[str], list[float]]:
    example = "e.g. fractions={'train': 0.8, 'test': 0.2}"
    if not isinstance(fractions, Mapping) or len(fractions) < 2:
        raise ParamError(f"fractions must map at least two split names to fractions; {example}.")
    for name, value in fractions.items():
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value <= 0:
            raise ParamError(f"fractions[{name!r}]={value!r}: each fraction must be a number "
                             f"greater than 0; {example}.")
    total = math.fsum(fractions.values())  # exact, so the rule does not depend on the order
    if abs(total - 1.0) > _SUM_TOLERANCE:
        raise ParamError(f"fractions sum to {total!r}, not 1; scale them so they add up to 1 "
                         f"({example}; write thirds as 1/3).")
    return list(fractions), [float(v) for v in fractions.values()]


def _check_method(df: DataFrame, method: str, **cols: Any) -> dict[str, Any]:
    """Check the method, its required column parameters and their types; return them."""
    check_one_of("method", method, METHODS)
    for param in REQUIRED.get(method, ()):
        if not cols[param]:
            raise ParamError(f"method={method!r} needs {param}=<column name>.")
    given = {p: v for p, v in cols.items() if v}
    for param, value in given.items():
        require_columns(df.schema, [value] if isinstance(value, str) else value, param)
    if method == "time" and not is_temporal(df.schema[cols["timeCol"]].dataType):
        dtype = df.schema[cols["timeCol"]].dataType.simpleString()
        raise SchemaError(f"timeCol: column '{cols['timeCol']}' has type {dtype}, not a "
                          "timestamp or date; convert it first, e.g. F.to_timestamp(col).")
    if method == "stratified":
        _check_categorical(df, cols["labelCol"])
    return given


def _check_categorical(df: DataFrame, label: str) -> None:
    """A stratum column must be discrete: strings, booleans, integers, or whole-valued
    numbers with few distinct values (MLlib labels are doubles 0.0, 1.0, ...)."""
    dtype = df.schema[label].dataType
    if is_discrete(dtype):
        return
    if isinstance(dtype, FractionalType):
        value = col(label)
        stats = df.agg(F.count_distinct(value).alias("k"),
                       F.count_if(value != F.floor(value)).alias("fractional")).first()
        assert stats is not None
        if stats["k"] <= _MAX_STRATA and stats["fractional"] == 0:
            return
        detail = f"{stats['k']} distinct values, {stats['fractional']} of them not whole"
    else:
        detail = f"type {dtype.simpleString()}"
    raise SchemaError(f"labelCol: column '{label}' is not categorical ({detail}); stratify on a "
                      "class label, or bin a continuous column first "
                      "(pyspark.ml.feature.Bucketizer or QuantileDiscretizer).")


# -- assignment ------------------------------------------------------------------------------
def _key_cols(df: DataFrame, keyCols: Sequence[str] | None) -> list[str]:
    if keyCols:
        return list(keyCols)
    return [f.name for f in df.schema.fields if not isinstance(f.dataType, MapType)]


def _unit(cols: Sequence[str | None], seed: int) -> Column:
    """A stable uniform number in [0, 1) from the values of ``cols`` and ``seed``."""
    hashed = F.xxhash64(F.lit(seed), *[col(str(c)) for c in cols])
    mask = F.lit((1 << _HASH_BITS) - 1)
    return hashed.bitwiseAND(mask).cast("double") / float(1 << _HASH_BITS)


def _cumulative(position: Column, names: Sequence[str], fracs: Sequence[float]) -> Column:
    """Name of the split whose cumulative fraction interval holds ``position`` in [0, 1)."""
    bound, expr = 0.0, None
    for name, frac in zip(names[:-1], fracs[:-1]):
        bound += frac
        expr = (F.when(position < bound, name) if expr is None
                else expr.when(position < bound, name))
    assert expr is not None
    return expr.otherwise(names[-1])


def _stratified(df: DataFrame, label: str, names: Sequence[str], fracs: Sequence[float],
                seed: int, keyCols: Sequence[str] | None) -> DataFrame:
    """Rank rows within each class by hash; the rank quantile picks the split, so each class
    is split in the requested proportions to within one row.

    One Spark job finds, in each class, the hash key of the first row of each split
    (:func:`_split_starts`); a row's split is then a comparison of its key with those of its
    class, looked up through a broadcast join of that small table. So the parts are ``df``
    with a column added: no row is shuffled and the parts keep ``df``'s partitions (a window
    over the rows of each class would put each class into one partition).
    """
    key = F.struct(_unit(_key_cols(df, keyCols), seed).alias("u"),
                   _unit(_key_cols(df, None), seed + 1).alias("t"))
    keyed = df.withColumn(_KEY, key)
    starts = _split_starts(keyed.select(col(label).alias(_LABEL), _KEY), fracs)
    cuts = [f"_sd_cut{i}" for i in range(1, len(names))]
    schema = StructType([StructField(_LABEL, df.schema[label].dataType)]
                        + [StructField(c, keyed.schema[_KEY].dataType) for c in cuts])
    table = df.sparkSession.createDataFrame(_cut_rows(starts, len(names)), schema)
    joined = keyed.join(F.broadcast(table), keyed[quoted(label)].eqNullSafe(table[_LABEL]),
                        "left")
    # The split's index: how many of the class's cuts the row's key reaches.
    index = sum((F.when(F.col(_KEY) >= F.col(c), 1).otherwise(0) for c in cuts), F.lit(0))
    names_array = F.array(*[F.lit(n) for n in names])
    return (joined.withColumn(_SPLIT, F.element_at(names_array, index + 1))
            .drop(_KEY, _LABEL, *cuts))


def _split_starts(keyed: DataFrame, fracs: Sequence[float]) -> dict[Any, dict[int, Any]]:
    """For each class (``_LABEL``), the key (``_KEY``) of the first row of each non-empty
    split, by split index. Rank r of a class's n rows (by key) goes to the split whose interval
    holds r / n. Keys are uniform, so a class's key range is cut into ``_BUCKETS`` buckets;
    only the rows of the buckets that hold a split's first row are shuffled and ranked, the
    others are only counted."""
    by_class = Window.partitionBy(_LABEL)
    keyed = keyed.withColumn(_BUCKET, F.floor(F.col(_KEY)["u"] * _BUCKETS))
    counts = keyed.groupBy(_LABEL, _BUCKET).agg(F.count(F.lit(1)).alias("_sd_c"))
    counts = (counts.withColumn("_sd_n", F.sum("_sd_c").over(by_class))
              .withColumn("_sd_off", F.sum("_sd_c").over(by_class.orderBy(_BUCKET))
                          - F.col("_sd_c")))
    first, n = F.col("_sd_off"), F.col("_sd_n")
    last = first + F.col("_sd_c") - 1
    holds_start = (first == 0) | (_index((first - 1) / n, fracs) != _index(last / n, fracs))
    buckets = counts.where(holds_start).select(
        F.col(_LABEL).alias("_sd_bl"), F.col(_BUCKET).alias("_sd_bb"), first, n)
    rows = keyed.join(F.broadcast(buckets), F.col(_LABEL).eqNullSafe(F.col("_sd_bl"))
                      & (F.col(_BUCKET) == F.col("_sd_bb")))
    in_bucket = Window.partitionBy(_LABEL, _BUCKET).orderBy(_KEY)
    rank = first + F.row_number().over(in_bucket) - 1
    ranked = rows.withColumn("_sd_r", rank).withColumn("_sd_i", _index(F.col("_sd_r") / n, fracs))
    previous = _index((F.col("_sd_r") - 1) / n, fracs)
    found = (ranked.where((F.col("_sd_r") == 0) | (F.col("_sd_i") != previous))
             .select(_LABEL, "_sd_i", _KEY).collect())
    starts: dict[Any, dict[int, Any]] = {}
    for row in found:
        starts.setdefault(row[_LABEL], {})[row["_sd_i"]] = row[_KEY]
    return starts


def _cut_rows(starts: Mapping[Any, Mapping[int, Any]], n_splits: int) -> list[tuple[Any, ...]]:
    """One row per class: its label, then for each split after the first, the key from which
    rows go to that split or a later one (the next non-empty split's first key; None when no
    later split has rows)."""
    rows = []
    for label, firsts in starts.items():
        cuts: list[Any] = []
        for i in range(n_splits - 1, 0, -1):
            nxt = firsts.get(i, cuts[0] if cuts else None)
            cuts.insert(0, None if nxt is None else tuple(nxt))
        rows.append((label, *cuts))
    return rows


def _index(position: Column, fracs: Sequence[float]) -> Column:
    """Index of the split whose cumulative fraction interval holds ``position`` (the same
    bounds as :func:`_cumulative`)."""
    bound, expr = 0.0, None
    for i, frac in enumerate(fracs[:-1]):
        bound += frac
        expr = F.when(position < bound, i) if expr is None else expr.when(position < bound, i)
    assert expr is not None
    return expr.otherwise(len(fracs) - 1)


def _time_cutoffs(df: DataFrame, time_col: str, fracs: Sequence[float],
                  cutoffs: Sequence[Any] | None) -> list[datetime]:
    """Explicit cut-offs, or the time quantiles at the cumulative fractions (one job, which
    also refuses null times: no cut-off can place them)."""
    bounds = None if cutoffs is None else [_as_datetime(c, "cutoffs") for c in cutoffs]
    if bounds is not None and (len(bounds) != len(fracs) - 1 or bounds != sorted(bounds)):
        raise ParamError(f"cutoffs={list(cutoffs or [])!r} must be {len(fracs) - 1} ascending "
                         "timestamps, one between each pair of consecutive splits.")
    micros = F.unix_micros(col(time_col).cast("timestamp"))
    probs = [sum(fracs[: i + 1]) for i in range(len(fracs) - 1)]
    aggs = [F.count_if(micros.isNull()).alias("nulls")]
    if bounds is None:
        aggs.append(F.percentile_approx(micros, probs, _QUANTILE_ACCURACY).alias("q"))
    row = df.agg(*aggs).first()
    assert row is not None
    if row["nulls"]:
        raise SchemaError(f"timeCol: column '{time_col}' is null in {row['nulls']} rows, which "
                          "no time split can place; drop or fill them first.")
    return bounds if bounds is not None else [_micros_to_datetime(q) for q in row["q"]]


def _by_time(time: Column, names: Sequence[str], bounds: Sequence[datetime]) -> Column:
    """Rows before the first cut-off go to the first split, and so on."""
    expr = None
    for name, bound in zip(names[:-1], bounds):
        cond = time.cast("timestamp") < F.lit(bound)
        expr = F.when(cond, name) if expr is None else expr.when(cond, name)
    assert expr is not None
    return expr.otherwise(names[-1])


def _cold_start(df: DataFrame, user: str, item: str, names: Sequence[str],
                fracs: Sequence[float], seed: int, keyCols: Sequence[str] | None) -> DataFrame:
    """Random split by (user, item), then rows of the other splits whose user or item is not
    in the training split move to it.

    The users and items with no training row (usually few) are broadcast to every task, so
    the parts are ``df`` with a column added and keep its partitions (a shuffle join would
    hash the rows by user and by item, which adaptive execution may coalesce into one
    partition when it cannot broadcast on its own)."""
    first = training_split(names)
    tentative = df.withColumn(_SPLIT, _cumulative(_unit(keyCols or [user, item], seed),
                                                  names, fracs))
    users = _without_training_rows(tentative, user, first)
    items = _without_training_rows(tentative, item, first)
    joined = (tentative.join(users, tentative[quoted(user)].eqNullSafe(users["_sd_id"]), "left")
              .drop("_sd_id").withColumnRenamed("_sd_cold", "_sd_cold_user"))
    joined = joined.join(items, joined[quoted(item)].eqNullSafe(items["_sd_id"]), "left")
    cold = F.col("_sd_cold_user").isNotNull() | F.col("_sd_cold").isNotNull()
    return (joined.withColumn(_SPLIT, F.when(cold, first).otherwise(F.col(_SPLIT)))
            .drop("_sd_id", "_sd_cold", "_sd_cold_user"))


def _without_training_rows(tentative: DataFrame, id_col: str, first: str) -> DataFrame:
    """The values of ``id_col`` (as ``_sd_id``, with a constant ``_sd_cold``) that have no row
    in split ``first``, marked for a broadcast join."""
    in_first = F.max((F.col(_SPLIT) == first).cast("int"))
    ids = (tentative.groupBy(col(id_col).alias("_sd_id")).agg(in_first.alias("_sd_seen"))
           .where(F.col("_sd_seen") == 0).select("_sd_id", F.lit(1).alias("_sd_cold")))
    return F.broadcast(ids)


def training_split(names: Sequence[str]) -> str:
    """The split that trains: the one named 'train', else the first."""
    return "train" if "train" in names else names[0]


def _as_datetime(value: Any, param: str) -> datetime:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        raise ParamError(f"{param}: {value!r} is not a timestamp; use an ISO string such as "
                         "'2024-06-01' or a datetime.") from None


def _micros_to_datetime(micros: int) -> datetime:
    """Session-local wall time, matching how Spark compares a timestamp literal."""
    return datetime.fromtimestamp(micros / 1_000_000)
