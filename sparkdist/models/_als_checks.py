"""ALS input checks: id columns, the rating column and its values, and duplicate (user,
item) pairs, from one aggregation job; typed errors that name the column and the fix. The
same job finds the smallest id of each int id column (non-negative ints need no mapping)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    FloatType,
    IntegerType,
    MapType,
    StructType,
)

from sparkdist.columns import col, empty_data_error, require_columns, require_numeric
from sparkdist.exceptions import SchemaError
from sparkdist.models._als_ids import _I, _U, id_counts


def check_ratings_schema(dataset: DataFrame, user: str, item: str, rating: str) -> list[str]:
    """Refuse what the schema shows no ALS fit can use (no Spark job): missing or
    non-atomic id columns, a non-numeric rating column (``rating=""`` rates every pair 1.0:
    no rating column). Returns the id columns that are not ints (they need a mapping)."""
    _check_id_column(dataset, user, "userCol")
    _check_id_column(dataset, item, "itemCol")
    if rating:
        require_columns(dataset.schema, [rating], "ratingCol")
        require_numeric(dataset.schema, rating, "ratingCol",
                        f"cast it first, e.g. F.col('{rating}').cast('double').")
    return [c for c in dict.fromkeys((user, item))
            if not isinstance(dataset.schema[c].dataType, IntegerType)]


def check_ratings_values(dataset: DataFrame, user: str, item: str, rating: str,
                         implicit: bool, duplicate_policy: str,
                         mapped: list[str]) -> tuple[Row, list[Row]]:
    """Refuse the values no ALS fit can use, in one Spark job: no rows, null ids, null/NaN
    ratings, negative explicit ratings and, under ``duplicatePolicy='error'``, repeated
    (user, item) pairs. Returns the stats row (``u_min``/``i_min``: the smallest user and
    item ids of an int column, else None) and the
    :func:`~sparkdist.models._als_ids.id_counts` rows of the ``mapped`` columns, collected in
    the same job."""
    stats, counts = _value_stats(dataset, user, item, rating, mapped)
    if not stats["rows"]:
        raise empty_data_error("ALS.fit")
    for param, name, key in (("userCol", user, "u"), ("itemCol", item, "i")):
        if stats[key]:
            raise SchemaError(f"{param}: column '{name}' is null in {stats[key]} of "
                              f"{stats['rows']} rows; every rating needs an id. Drop them "
                              f"first: df.dropna(subset=['{name}']).")
    if rating:
        _check_ratings(stats, rating, implicit)
    if stats["pairs"] and duplicate_policy == "error":
        u, i, n = stats["example"]
        raise SchemaError(
            f"{stats['pairs']} (user, item) pairs of columns ('{user}', '{item}') occur more "
            f"than once, e.g. ({u!r}, {i!r}) has {n} rows. Set duplicatePolicy='mean' to "
            "average them or 'sum' to add them (e.g. implicit counts), or deduplicate "
            "first.")
    return stats, counts


def _check_id_column(dataset: DataFrame, name: str, param: str) -> None:
    require_columns(dataset.schema, [name], param)
    dtype = dataset.schema[name].dataType
    if isinstance(dtype, (ArrayType, MapType, StructType)):
        raise SchemaError(f"{param}: column '{name}' has type {dtype.simpleString()}; ids must "
                          "be single values such as strings or integers.")


def _check_ratings(stats: Any, rating: str, implicit: bool) -> None:
    rows = stats["rows"]
    if stats["null"]:
        raise SchemaError(f"ratingCol: column '{rating}' is null in {stats['null']} of {rows} "
                          f"rows; drop them (df.dropna(subset=['{rating}'])) or fill them "
                          f"(df.fillna({{'{rating}': 0.0}})).")
    if stats["nan"]:
        raise SchemaError(f"ratingCol: column '{rating}' is NaN in {stats['nan']} of {rows} "
                          f"rows; drop them first: df.where(~F.isnan('{rating}')).")
    if stats["neg"] and not implicit:
        raise SchemaError(f"ratingCol: column '{rating}' has {stats['neg']} negative ratings "
                          f"(minimum {stats['min']}) while implicitPrefs=False; shift explicit "
                          "ratings onto a non-negative scale (subtract the minimum), or set "
                          "implicitPrefs=True if they are implicit signals.")


def _value_stats(dataset: DataFrame, user: str, item: str, rating: str,
                 mapped: list[str]) -> tuple[Row, list[Row]]:
    """Rows, null ids, null/NaN/negative ratings and duplicate pairs, and the id counts of
    the ``mapped`` columns, in one Spark job."""
    r = col(rating) if rating else F.lit(1.0)
    is_float = rating and isinstance(dataset.schema[rating].dataType, (FloatType, DoubleType))
    # Grouped under internal names: "a.b" would read as a struct field in the second agg.
    pairs = dataset.groupBy(col(user).alias(_U), col(item).alias(_I)).agg(
        F.count(F.lit(1)).alias("n"), F.count_if(r.isNull()).alias("null"),
        F.count_if(F.isnan(r) if is_float else F.lit(False)).alias("nan"),
        F.count_if(r < 0).alias("neg"), F.min(r).alias("min"))
    n = F.col("n")

    def total(col: Column | str) -> Column:
        return F.coalesce(F.sum(col), F.lit(0))

    def int_min(name: str, key: str) -> Column:
        is_int = isinstance(dataset.schema[name].dataType, IntegerType)
        return F.min(key) if is_int else F.lit(None).cast("int")

    stats = pairs.agg(
        total(n).alias("rows"), total(F.when(F.col(_U).isNull(), n)).alias("u"),
        total(F.when(F.col(_I).isNull(), n)).alias("i"), total("null").alias("null"),
        total("nan").alias("nan"), total("neg").alias("neg"), F.min("min").alias("min"),
        F.count_if(n > 1).alias("pairs"),
        F.min(F.when(n > 1, F.struct(_U, _I, "n"))).alias("example"),
        int_min(user, _U).alias("u_min"), int_min(item, _I).alias("i_min"))
    if not mapped:
        return stats.collect()[0], []
    rows = stats.unionByName(id_counts(dataset, mapped), allowMissingColumns=True).collect()
    [summary] = [row for row in rows if row["_col"] is None]
    return summary, [row for row in rows if row["_col"] is not None]
