"""ALS id mappings: the ids of any atomic type in a user or item column, numbered ``0..n-1``
(the ints MLlib ALS needs) deterministically, and the joins that attach those indices to rows
and map MLlib's outputs back to the original ids.

A mapping is a cached DataFrame of (id, index); :class:`~sparkdist.models.als.ALSModel` keeps
one per side and saves them as Parquet. ``None`` is the identity: a column of non-negative
ints goes to MLlib as it is, with no mapping to build or join.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from itertools import accumulate

from pyspark.sql import DataFrame, Row, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType

from sparkdist.columns import col
from sparkdist.exceptions import SchemaError

# Internal columns: the int indices MLlib sees, a join key and the rating it fits.
_U, _I, _KEY, _R = "_sparkdist_user", "_sparkdist_item", "_sparkdist_key", "_sparkdist_rating"
_BUCKETS = 64  # hash buckets that number the ids in parallel
_MAX_IDS = 2**31 - 1  # MLlib ALS ids are ints


def index_ids(dataset: DataFrame, cols: Sequence[str],
              counts: Sequence[Row] | None = None) -> list[DataFrame]:
    """(id, index) per column: its distinct ids numbered 0..n-1 in (hash bucket, id) order.

    An index is a pure function of the set of ids, so recomputing it never changes it, and
    it needs no RDD API (zipWithIndex), so it runs on Spark Connect. Hash buckets instead of
    one global sort keep the numbering parallel (a window without a partition runs in one
    task). ``counts``: the rows of :func:`id_counts` when already collected (the input checks
    collect them in their job), else one small job collects them. Cached, because training
    and every transform join them.
    """
    rows = id_counts(dataset, cols).collect() if counts is None else counts
    sizes: dict[int, dict[int, int]] = {k: {} for k in range(len(cols))}
    for row in rows:
        sizes[row["_col"]][row["_bucket"]] = row["count"]
    return [_numbered(_ids(dataset, c), sizes[k], c) for k, c in enumerate(cols)]


def id_counts(dataset: DataFrame, cols: Sequence[str]) -> DataFrame:
    """(_col, _bucket, count): how many distinct ids column ``cols[_col]`` has per bucket."""
    counts = [_ids(dataset, c).groupBy("_bucket").count().withColumn("_col", F.lit(k))
              for k, c in enumerate(cols)]
    return reduce(DataFrame.unionByName, counts)


def _ids(dataset: DataFrame, name: str) -> DataFrame:
    bucket = F.pmod(F.xxhash64("id"), F.lit(_BUCKETS)).cast("int").alias("_bucket")
    return dataset.select(col(name).alias("id")).distinct().select("id", bucket)


def _numbered(ids: DataFrame, sizes: dict[int, int], col: str) -> DataFrame:
    """Number ``ids`` (id, _bucket): the bucket's offset plus the id's rank in its bucket."""
    if sum(sizes.values()) > _MAX_IDS:
        raise SchemaError(f"column '{col}' has {sum(sizes.values())} distinct ids; MLlib ALS "
                          f"supports at most {_MAX_IDS}.")
    starts = list(accumulate((sizes.get(b, 0) for b in range(_BUCKETS - 1)), initial=0))
    offset = F.element_at(F.array(*[F.lit(s) for s in starts]), F.col("_bucket") + 1)
    rank = F.row_number().over(Window.partitionBy("_bucket").orderBy("id")) - 1
    return ids.select("id", (offset + rank).cast("int").alias("index")).cache()


def attach_index(df: DataFrame, name: str, mapping: DataFrame | None, out: str) -> DataFrame:
    """``df`` plus column ``out``: the index of ``df[name]`` in ``mapping``, -1 if absent.

    Values of another type are cast to the mapping's id type; those that do not cast are
    unknown too. Without a mapping the index is the id as an int (-1 if it is null, negative
    or does not cast)."""
    if mapping is None:
        index = col(name) if df.schema[name].dataType == IntegerType() else \
            col(name).try_cast(IntegerType())
        return df.withColumn(out, F.when(index >= 0, index).otherwise(F.lit(-1)))
    id_type = mapping.schema["id"].dataType
    key = col(name) if df.schema[name].dataType == id_type else col(name).try_cast(id_type)
    lookup = mapping.select(F.col("id").alias(_KEY), F.col("index").alias(out))
    joined = df.withColumn(_KEY, key).join(lookup, on=_KEY, how="left").drop(_KEY)
    return joined.withColumn(out, F.coalesce(F.col(out), F.lit(-1)))


def to_original(df: DataFrame, index: str, mapping: DataFrame | None,
                name: str) -> DataFrame:
    """Replace the index column ``index`` by the original id, named ``name``."""
    if mapping is None:
        return df.withColumnRenamed(index, name)
    lookup = mapping.select(F.col("index").alias(index), F.col("id").alias(name))
    return df.join(lookup, on=index).drop(index)


def factors(factors: DataFrame, mapping: DataFrame | None, name: str) -> DataFrame:
    """MLlib's (id, features) factors with the original ids in column ``name``."""
    return to_original(factors.withColumnRenamed("id", _KEY), _KEY, mapping, name).select(
        col(name), "features")


def original_ids(recs: DataFrame, key: str, names: dict[str, str],
                 mappings: dict[str, DataFrame | None]) -> DataFrame:
    """Map MLlib's (index, array<struct<other index, rating>>) back to the original ids,
    keeping each array's order. ``key`` is ``_U`` (recommendations per user) or ``_I``;
    ``names`` and ``mappings`` give each side's column name and mapping."""
    other = _I if key == _U else _U
    key_name, other_name = names[key], names[other]
    if mappings[other] is None:  # rename the struct field: no explode, no regrouping
        recs = recs.select(key, F.transform("recommendations", lambda r: F.struct(
            r[other].alias(other_name), r["rating"].alias("rating"))).alias("recommendations"))
        return to_original(recs, key, mappings[key], key_name).select(
            col(key_name), "recommendations")
    flat = recs.select(key, F.posexplode("recommendations").alias("pos", "rec")).select(
        key, "pos", F.col(f"rec.{other}").alias(other), F.col("rec.rating").alias("rating"))
    flat = to_original(flat, other, mappings[other], other_name)
    ranked = flat.groupBy(key).agg(
        F.sort_array(F.collect_list(F.struct("pos", col(other_name), "rating"))).alias("recs"))
    recs = ranked.select(key, F.transform("recs", lambda r: F.struct(
        r[other_name].alias(other_name), r["rating"].alias("rating"))).alias("recommendations"))
    return to_original(recs, key, mappings[key], key_name).select(
        col(key_name), "recommendations")
