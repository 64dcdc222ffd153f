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
from pyspark.sql.types import FractionalType, MapType

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
    is split in the requested proportions to within one row."""
    tiebreak = _unit(_key_cols(df, None), seed + 1)
    ordered = Window.partitionBy(col(label)).orderBy(_unit(_key_cols(df, keyCols), seed),
                                                     tiebreak)
    position = ((F.row_number().over(ordered) - 1)
                / F.count(F.lit(1)).over(Window.partitionBy(col(label))))
    return df.withColumn(_SPLIT, _cumulative(position, names, fracs))


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
    in the training split move to it."""
    first = training_split(names)
    tentative = df.withColumn(_SPLIT, _cumulative(_unit(keyCols or [user, item], seed),
                                                  names, fracs))
    seen = tentative.where(F.col(_SPLIT) == first)
    users = seen.select(col(user).alias("_sd_u")).distinct().withColumn("_sd_uk", F.lit(1))
    items = seen.select(col(item).alias("_sd_i")).distinct().withColumn("_sd_ik", F.lit(1))
    joined = (tentative.join(users, tentative[quoted(user)].eqNullSafe(users["_sd_u"]), "left")
              .join(items, tentative[quoted(item)].eqNullSafe(items["_sd_i"]), "left"))
    cold = F.col("_sd_uk").isNull() | F.col("_sd_ik").isNull()
    return (joined.withColumn(_SPLIT, F.when(cold, first).otherwise(F.col(_SPLIT)))
            .drop("_sd_u", "_sd_uk", "_sd_i", "_sd_ik"))


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
