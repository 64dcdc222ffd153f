"""ALS matrix factorisation as a Spark ML Estimator, without MLlib's traps.

:class:`ALS` drives :class:`pyspark.ml.recommendation.ALS` and keeps its Params (names, docs
and defaults, except ``coldStartStrategy="drop"``), and adds:

* ids of any atomic type (strings, longs beyond the int range, ints) are indexed to ints
  ``0..n-1`` (deterministically) and mapped back in every output, with their original type;
* ``checkpointInterval`` is honoured: a checkpoint directory is set when none is;
* ``seed`` defaults to a value that is the same in every process (MLlib's default hashes the
  class name, which Python salts per process), so an unseeded fit is reproducible;
* ``coldStartStrategy="drop"`` by default, and ids unknown to the model are cold starts too, so
  predictions and RMSE are never NaN;
* typed errors for missing columns, null/NaN/negative ratings, duplicate pairs, no rows;
* :meth:`ALSModel.rankingMetrics` for precision/NDCG/MAP/recall@k plus RMSE/MAE.

Like MLlib's ALS, the input DataFrame must be deterministic (the same rows when recomputed).

Examples
--------
>>> from sparkdist.datasets import ratings
>>> from sparkdist.features import split
>>> parts = split(ratings(spark, seed=0), {"train": 0.8, "test": 0.2}, method="cold_start",
...               userCol="user_id", itemCol="item_id", seed=0)
>>> train, test = parts["train"], parts["test"]
>>> model = ALS(userCol="user_id", itemCol="item_id", rank=4, numUserBlocks=2,
...             numItemBlocks=2, seed=0).fit(train)  # 2 blocks suit a small sample
>>> model.recommendForAllUsers(5).first().recommendations[0]  # the best of 5
Row(item_id='i0011', rating=3.89...)

The examples of :class:`ALSModel` use this ``model`` and ``test``.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
from collections.abc import Sequence
from functools import reduce
from itertools import accumulate
from typing import Any, ClassVar

from pyspark import keyword_only
from pyspark.ml.evaluation import RankingEvaluator, RegressionEvaluator
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.recommendation import ALS as _MLlibALS
from pyspark.ml.recommendation import ALSModel as _MLlibALSModel
from pyspark.ml.recommendation import _ALSModelParams as _MLlibALSModelParams
from pyspark.ml.recommendation import _ALSParams as _MLlibALSParams
from pyspark.ml.wrapper import JavaModel
from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    FloatType,
    MapType,
    NumericType,
    StructType,
)

from sparkdist import store
from sparkdist.columns import col, require_columns, suggest
from sparkdist.exceptions import ClusterConfigError, ParamError, SchemaError
from sparkdist.models._classification import stable_seed
from sparkdist.models._mllib import MLLIB_DIR, MLlibEstimator, MLlibModel
from sparkdist.session import is_connect

__all__ = ["ALS", "ALSModel", "ensure_checkpoint_dir"]

_LOG = logging.getLogger(__name__)
_LOGGED: set[str] = set()

DUPLICATE_POLICIES = ("error", "mean", "sum")
COLD_START_STRATEGIES = ("drop", "nan")
USER_INDEX_DIR, ITEM_INDEX_DIR = "user_index", "item_index"  # Parquet (id, index) mappings
# Internal columns: the int indices MLlib sees, a join key and the rating it fits.
_U, _I, _KEY, _R = "_sparkdist_user", "_sparkdist_item", "_sparkdist_key", "_sparkdist_rating"
_BUCKETS = 64  # hash buckets that number the ids in parallel
_MAX_IDS = 2**31 - 1  # MLlib ALS ids are ints


class _ALSModelParams(_MLlibALSModelParams):
    """MLlib's model Params plus the rating column and feedback kind (used by the metrics)."""

    ratingCol: Param[str] = _MLlibALSParams.ratingCol
    implicitPrefs: Param[bool] = _MLlibALSParams.implicitPrefs

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(coldStartStrategy="drop", ratingCol="rating", implicitPrefs=False)

    def getRatingCol(self) -> str:
        return self.getOrDefault(self.ratingCol)

    def getImplicitPrefs(self) -> bool:
        return self.getOrDefault(self.implicitPrefs)


class _ALSParams(_ALSModelParams, _MLlibALSParams):
    """Every MLlib ALS Param, plus ``duplicatePolicy``; a process-independent default seed."""

    duplicatePolicy: Param[str] = Param(
        Params._dummy(), "duplicatePolicy",
        "what to do with several ratings of one (user, item) pair: 'error' (raise), 'mean' "
        "(average them) or 'sum' (add them, e.g. implicit counts)",
        typeConverter=TypeConverters.toString)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(duplicatePolicy="error", seed=stable_seed(type(self).__name__))

    def getDuplicatePolicy(self) -> str:
        return self.getOrDefault(self.duplicatePolicy)


class ALS(MLlibEstimator, _ALSParams):
    """Alternating least squares on ratings with ids of any type.

    Parameters are MLlib's (same names and defaults) except ``coldStartStrategy="drop"``;
    ``duplicatePolicy`` says what to do with repeated (user, item) pairs: ``"error"``
    (default), ``"mean"`` or ``"sum"``. ``ratingCol=""`` rates every pair 1.0. When
    ``checkpointInterval`` >= 1 and the SparkContext has no checkpoint directory, a temporary
    one is set (see :func:`ensure_checkpoint_dir`).

    Examples
    --------
    >>> als = ALS(userCol="user_id", itemCol="item_id", rank=4, regParam=0.05, seed=0)
    >>> als.getColdStartStrategy(), als.getDuplicatePolicy(), als.getCheckpointInterval()
    ('drop', 'error', 10)

    The module's example fits one.
    """

    _mllib_estimator = _MLlibALS
    _input_kwargs: dict[str, Any]

    @keyword_only
    def __init__(self, *, rank: int = 10, maxIter: int = 10, regParam: float = 0.1,
                 numUserBlocks: int = 10, numItemBlocks: int = 10, implicitPrefs: bool = False,
                 alpha: float = 1.0, userCol: str = "user", itemCol: str = "item",
                 seed: int | None = None, ratingCol: str = "rating", nonnegative: bool = False,
                 checkpointInterval: int = 10, intermediateStorageLevel: str = "MEMORY_AND_DISK",
                 finalStorageLevel: str = "MEMORY_AND_DISK", coldStartStrategy: str = "drop",
                 blockSize: int = 4096, duplicatePolicy: str = "error") -> None:
        super().__init__()
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, *, rank: int = 10, maxIter: int = 10, regParam: float = 0.1,
                  numUserBlocks: int = 10, numItemBlocks: int = 10, implicitPrefs: bool = False,
                  alpha: float = 1.0, userCol: str = "user", itemCol: str = "item",
                  seed: int | None = None, ratingCol: str = "rating", nonnegative: bool = False,
                  checkpointInterval: int = 10, intermediateStorageLevel: str = "MEMORY_AND_DISK",
                  finalStorageLevel: str = "MEMORY_AND_DISK", coldStartStrategy: str = "drop",
                  blockSize: int = 4096, duplicatePolicy: str = "error") -> ALS:
        """Set the given Params (keyword arguments only)."""
        return self._set(**self._input_kwargs)

    def _fit(self, dataset: DataFrame) -> ALSModel:
        # The base template, except that the id mappings built while preparing the input
        # also go into the model.
        self._check_params()
        self._validate(dataset)
        if self.getCheckpointInterval() >= 1:  # first: on Spark Connect it may refuse
            ensure_checkpoint_dir(dataset.sparkSession)
        users, items = _index_ids(dataset, [self.getUserCol(), self.getItemCol()])
        inner = self._fit_mllib(self._indexed_ratings(dataset, users, items),
                                userCol=_U, itemCol=_I, ratingCol=_R)
        model = ALSModel(inner, users, items)
        self._copyValues(model)
        return model

    # -- validation ----------------------------------------------------------------------
    def _validate(self, dataset: DataFrame) -> None:
        _check_choice("duplicatePolicy", self.getDuplicatePolicy(), DUPLICATE_POLICIES)
        _check_choice("coldStartStrategy", self.getColdStartStrategy(), COLD_START_STRATEGIES)
        user, item, rating = self.getUserCol(), self.getItemCol(), self.getRatingCol()
        _check_id_column(dataset, user, "userCol")
        _check_id_column(dataset, item, "itemCol")
        if rating:
            require_columns(dataset.schema, [rating], "ratingCol")
            if not isinstance(dataset.schema[rating].dataType, NumericType):
                kind = dataset.schema[rating].dataType.simpleString()
                raise SchemaError(f"ratingCol: column '{rating}' has type {kind}, not numeric; "
                                  f"cast it first, e.g. F.col('{rating}').cast('double').")
        stats = _value_stats(dataset, user, item, rating)
        if not stats["rows"]:
            raise SchemaError("ALS got an empty DataFrame (0 rows); check the filter or split "
                              "that produced it.")
        for param, name, key in (("userCol", user, "u"), ("itemCol", item, "i")):
            if stats[key]:
                raise SchemaError(f"{param}: column '{name}' is null in {stats[key]} of "
                                  f"{stats['rows']} rows; every rating needs an id. Drop them "
                                  f"first: df.dropna(subset=['{name}']).")
        if rating:
            _check_ratings(stats, rating, self.getImplicitPrefs())
        if stats["pairs"] and self.getDuplicatePolicy() == "error":
            u, i, n = stats["example"]
            raise SchemaError(
                f"{stats['pairs']} (user, item) pairs of columns ('{user}', '{item}') occur more "
                f"than once, e.g. ({u!r}, {i!r}) has {n} rows. Set duplicatePolicy='mean' to "
                "average them or 'sum' to add them (e.g. implicit counts), or deduplicate "
                "first.")

    # -- preparation ---------------------------------------------------------------------
    def _indexed_ratings(self, dataset: DataFrame, users: DataFrame,
                         items: DataFrame) -> DataFrame:
        """(user index, item index, rating) rows, duplicates merged by ``duplicatePolicy``."""
        user, item, rating = self.getUserCol(), self.getItemCol(), self.getRatingCol()
        value = col(rating).cast("float") if rating else F.lit(1.0).cast("float")
        pairs = dataset.select(col(user), col(item), value.alias(_R))
        policy = self.getDuplicatePolicy()
        if policy != "error":  # "error" has already proved there are none
            merge = F.avg if policy == "mean" else F.sum
            pairs = pairs.groupBy(col(user), col(item)).agg(merge(_R).cast("float").alias(_R))
        pairs = _attach_index(_attach_index(pairs, user, users, _U), item, items, _I)
        return pairs.select(_U, _I, _R)


class ALSModel(MLlibModel, _ALSModelParams):
    """A fitted :class:`ALS`: predictions and recommendations in the original ids.

    ``mllib_model`` is the wrapped MLlib model; it works on the internal int indices.

    Examples
    --------
    >>> model.transform(test).columns
    ['user_id', 'item_id', 'rating', 'ts', 'prediction']
    >>> model.recommendForUserSubset(test, 10).first().user_id
    'u00004'
    """

    _mllib_model = _MLlibALSModel
    task: ClassVar[str] = "recommendation"

    def __init__(self, inner: JavaModel | None = None, users: DataFrame | None = None,
                 items: DataFrame | None = None) -> None:
        super().__init__(inner)
        self._users, self._items = users, items

    @property
    def mllib_model(self) -> Any:
        inner = super().mllib_model
        return inner._set(userCol=_U, itemCol=_I)

    @property
    def rank(self) -> int:
        """The rank of the factorisation."""
        return self.mllib_model.rank

    @property
    def userFactors(self) -> DataFrame:
        """(userCol, features) with the original user ids."""
        return _factors(self.mllib_model.userFactors, self._mapping(_U), self.getUserCol())

    @property
    def itemFactors(self) -> DataFrame:
        """(itemCol, features) with the original item ids."""
        return _factors(self.mllib_model.itemFactors, self._mapping(_I), self.getItemCol())

    def _mapping(self, which: str) -> DataFrame:
        mapping = self._users if which == _U else self._items
        assert mapping is not None, f"{type(self).__name__} is not fitted"
        return mapping

    def _transform(self, dataset: DataFrame) -> DataFrame:
        _check_choice("coldStartStrategy", self.getColdStartStrategy(), COLD_START_STRATEGIES)
        return self.mllib_model.transform(self._with_indices(dataset)).drop(_U, _I)

    def _with_indices(self, dataset: DataFrame) -> DataFrame:
        """``dataset`` plus the user and item indices; -1 (a cold start) for unknown ids."""
        user, item = self.getUserCol(), self.getItemCol()
        require_columns(dataset.schema, [user], "userCol")
        require_columns(dataset.schema, [item], "itemCol")
        indexed = _attach_index(dataset, user, self._mapping(_U), _U)
        return _attach_index(indexed, item, self._mapping(_I), _I)

    # -- recommendations -------------------------------------------------------------------
    def recommendForAllUsers(self, numItems: int) -> DataFrame:
        """Top ``numItems`` items of every user: (userCol, recommendations), where
        recommendations is ``array<struct<itemCol, rating>>``, best first.

        Examples
        --------
        >>> model.recommendForAllUsers(2).first()
        Row(user_id='u00004', recommendations=[Row(item_id='i0011', rating=3.89...),
                                               Row(item_id='i0005', rating=3.87...)])
        """
        _check_k("numItems", numItems)
        return self._original_ids(self.mllib_model.recommendForAllUsers(numItems), _U)

    def recommendForAllItems(self, numUsers: int) -> DataFrame:
        """Top ``numUsers`` users of every item: (itemCol, recommendations of (userCol,
        rating)), best first.

        Examples
        --------
        >>> model.recommendForAllItems(2).columns
        ['item_id', 'recommendations']
        """
        _check_k("numUsers", numUsers)
        return self._original_ids(self.mllib_model.recommendForAllItems(numUsers), _I)

    def recommendForUserSubset(self, dataset: DataFrame, numItems: int) -> DataFrame:
        """Top ``numItems`` items for each distinct user of ``dataset`` that the model knows
        (unknown users get no row).

        Examples
        --------
        >>> model.recommendForUserSubset(test.where("user_id = 'u00001'"), 5).count()
        1
        """
        _check_k("numItems", numItems)
        known = self._subset(dataset, self.getUserCol(), _U)
        return self._original_ids(self.mllib_model.recommendForUserSubset(known, numItems), _U)

    def recommendForItemSubset(self, dataset: DataFrame, numUsers: int) -> DataFrame:
        """Top ``numUsers`` users for each distinct item of ``dataset`` that the model knows.

        Examples
        --------
        >>> model.recommendForItemSubset(test, 5).columns
        ['item_id', 'recommendations']
        """
        _check_k("numUsers", numUsers)
        known = self._subset(dataset, self.getItemCol(), _I)
        return self._original_ids(self.mllib_model.recommendForItemSubset(known, numUsers), _I)

    def _subset(self, dataset: DataFrame, name: str, index: str) -> DataFrame:
        require_columns(dataset.schema, [name], "userCol" if index == _U else "itemCol")
        ids = dataset.select(col(name)).distinct()
        return _attach_index(ids, name, self._mapping(index), index).where(F.col(index) >= 0)

    def _original_ids(self, recs: DataFrame, key: str) -> DataFrame:
        """Map MLlib's (index, array<struct<other index, rating>>) back to the original ids,
        keeping each array's order."""
        other = _I if key == _U else _U
        key_name, other_name = ((self.getUserCol(), self.getItemCol()) if key == _U
                                else (self.getItemCol(), self.getUserCol()))
        flat = recs.select(key, F.posexplode("recommendations").alias("pos", "rec")).select(
            key, "pos", F.col(f"rec.{other}").alias(other), F.col("rec.rating").alias("rating"))
        flat = _to_original(flat, other, self._mapping(other), other_name)
        ranked = flat.groupBy(key).agg(
            F.sort_array(F.collect_list(F.struct("pos", col(other_name), "rating"))).alias("recs"))
        recs = ranked.select(key, F.transform("recs", lambda r: F.struct(
            r[other_name].alias(other_name), r["rating"].alias("rating"))).alias("recommendations"))
        return _to_original(recs, key, self._mapping(key), key_name).select(
            col(key_name), "recommendations")

    # -- evaluation ------------------------------------------------------------------------
    def rankingMetrics(self, dataset: DataFrame, k: int = 10,
                       relevanceThreshold: float | None = None) -> dict[str, float]:
        """Ranking quality at ``k`` and rating error of this model on ``dataset``.

        Only rows whose user and item the model was trained on count (as under
        ``coldStartStrategy="drop"``), so no metric is NaN. For each user, the ground truth
        is the set of items the user rated >= ``relevanceThreshold`` in ``dataset``; by
        default the user's own mean rating there for explicit feedback (so harsh and lenient
        raters both have relevant items), and any rating > 0 for implicit feedback. The
        predictions are the user's top-``k`` recommendations among *all* items, including
        items the user rated in training (the model does not keep its training pairs): the
        figures are lower than under protocols that filter seen items. Users without relevant
        items are left out. RMSE and MAE come from ``transform`` (explicit feedback only).

        Returns
        -------
        dict with ``precision@k``, ``recall@k``, ``ndcg@k``, ``map@k`` (in [0, 1]) and, for
        explicit feedback, ``rmse`` and ``mae``.

        Examples
        --------
        >>> metrics = model.rankingMetrics(test, k=5)
        >>> {name: round(value, 2) for name, value in metrics.items()}
        {'precision@5': 0.02, 'recall@5': 0.07, 'ndcg@5': 0.04, 'map@5': 0.03, 'rmse': 0.94,
         'mae': 0.69}
        """
        _check_k("k", k)
        user, item, rating = self.getUserCol(), self.getItemCol(), self.getRatingCol()
        for param, name in (("userCol", user), ("itemCol", item), ("ratingCol", rating)):
            require_columns(dataset.schema, [name], param)
        # The rating travels as _R: MLlib's evaluator parses column names ("a.b" as a field).
        known = (self._with_indices(dataset.select(col(user), col(item), col(rating).alias(_R)))
                 .where(F.col(_R).isNotNull() & ~F.isnan(F.col(_R).cast("double")))
                 .where((F.col(_U) >= 0) & (F.col(_I) >= 0)).cache())
        try:
            metrics = self._ranking(known, k, relevanceThreshold)
            if not self.getImplicitPrefs():
                metrics.update(self._rating_errors(known))
            return metrics
        finally:
            known.unpersist()

    def _ranking(self, known: DataFrame, k: int, threshold: float | None) -> dict[str, float]:
        r = F.col(_R)
        if threshold is not None:
            relevant = r >= float(threshold)
        elif self.getImplicitPrefs():
            relevant = r > 0
        else:
            relevant = r >= F.avg(r).over(Window.partitionBy(_U))
        truth = (known.withColumn("_relevant", relevant).where("_relevant").groupBy(_U)
                 .agg(F.collect_set(F.col(_I).cast("double")).alias("label")))
        recs = self.mllib_model.recommendForUserSubset(truth.select(_U), k)
        top = recs.select(_U, F.transform("recommendations", lambda x: x[_I].cast("double"))
                          .alias("prediction"))
        scored = truth.join(top, _U).cache()
        try:
            if scored.isEmpty():
                raise self._nothing_to_rank(known, threshold)
            evaluator = RankingEvaluator(labelCol="label", predictionCol="prediction", k=k)
            names = {"precision": "precisionAtK", "recall": "recallAtK", "ndcg": "ndcgAtK",
                     "map": "meanAveragePrecisionAtK"}
            return {f"{key}@{k}": evaluator.evaluate(scored, {evaluator.metricName: metric})
                    for key, metric in names.items()}
        finally:
            scored.unpersist()

    @staticmethod
    def _nothing_to_rank(known: DataFrame, threshold: float | None) -> SchemaError:
        if known.isEmpty():
            return SchemaError("rankingMetrics: no row of the DataFrame has a rating and a user "
                               "and item the model was trained on; evaluate on data that "
                               "overlaps the training users and items (e.g. a cold_start "
                               "split).")
        return SchemaError(f"rankingMetrics: no user has a rating >= relevanceThreshold="
                           f"{threshold}; lower the threshold.")

    def _rating_errors(self, known: DataFrame) -> dict[str, float]:
        predictions = self.mllib_model.setColdStartStrategy("drop").transform(known).cache()
        evaluator = RegressionEvaluator(labelCol=_R, predictionCol=self.getPredictionCol())
        try:
            return {m: evaluator.evaluate(predictions, {evaluator.metricName: m})
                    for m in ("rmse", "mae")}
        finally:
            predictions.unpersist()

    # -- persistence -----------------------------------------------------------------------
    def _save_artifacts(self, path: str) -> None:
        super()._save_artifacts(path)
        spark = SparkSession.active()
        for side, name in ((_U, USER_INDEX_DIR), (_I, ITEM_INDEX_DIR)):
            with store.jvm_output(spark, f"{path}/{name}") as out:
                self._mapping(side).write.parquet(out)

    @classmethod
    def _from_state(cls, state: dict[str, Any], path: str) -> ALSModel:
        spark = SparkSession.active()
        files = {name: store.jvm_input(spark, f"{path}/{name}")
                 for name in (MLLIB_DIR, USER_INDEX_DIR, ITEM_INDEX_DIR)}
        return cls(cls._mllib_model.load(files[MLLIB_DIR]),
                   spark.read.parquet(files[USER_INDEX_DIR]).cache(),
                   spark.read.parquet(files[ITEM_INDEX_DIR]).cache())


# -- id mappings ---------------------------------------------------------------------------
def _index_ids(dataset: DataFrame, cols: Sequence[str]) -> list[DataFrame]:
    """(id, index) per column: its distinct ids numbered 0..n-1 in (hash bucket, id) order.

    An index is a pure function of the set of ids, so recomputing it never changes it, and
    it needs no RDD API (zipWithIndex), so it runs on Spark Connect. Hash buckets instead of
    one global sort keep the numbering parallel (a window without a partition runs in one
    task). Cached, because training and every transform join them.
    """
    bucket = F.pmod(F.xxhash64("id"), F.lit(_BUCKETS)).cast("int").alias("_bucket")
    ids = [dataset.select(col(c).alias("id")).distinct().select("id", bucket) for c in cols]
    counts = [d.groupBy("_bucket").count().withColumn("_col", F.lit(k))
              for k, d in enumerate(ids)]
    sizes: dict[int, dict[int, int]] = {k: {} for k in range(len(cols))}
    for row in reduce(DataFrame.unionByName, counts).collect():  # one small job
        sizes[row["_col"]][row["_bucket"]] = row["count"]
    return [_numbered(d, sizes[k], col) for k, (d, col) in enumerate(zip(ids, cols))]


def _numbered(ids: DataFrame, sizes: dict[int, int], col: str) -> DataFrame:
    """Number ``ids`` (id, _bucket): the bucket's offset plus the id's rank in its bucket."""
    if sum(sizes.values()) > _MAX_IDS:
        raise SchemaError(f"column '{col}' has {sum(sizes.values())} distinct ids; MLlib ALS "
                          f"supports at most {_MAX_IDS}.")
    starts = list(accumulate((sizes.get(b, 0) for b in range(_BUCKETS - 1)), initial=0))
    offset = F.element_at(F.array(*[F.lit(s) for s in starts]), F.col("_bucket") + 1)
    rank = F.row_number().over(Window.partitionBy("_bucket").orderBy("id")) - 1
    return ids.select("id", (offset + rank).cast("int").alias("index")).cache()


def _attach_index(df: DataFrame, name: str, mapping: DataFrame, out: str) -> DataFrame:
    """``df`` plus column ``out``: the index of ``df[name]`` in ``mapping``, -1 if absent.

    Values of another type are cast to the mapping's id type; those that do not cast are
    unknown too."""
    id_type = mapping.schema["id"].dataType
    key = col(name) if df.schema[name].dataType == id_type else col(name).try_cast(id_type)
    lookup = mapping.select(F.col("id").alias(_KEY), F.col("index").alias(out))
    joined = df.withColumn(_KEY, key).join(lookup, on=_KEY, how="left").drop(_KEY)
    return joined.withColumn(out, F.coalesce(F.col(out), F.lit(-1)))


def _to_original(df: DataFrame, index: str, mapping: DataFrame, name: str) -> DataFrame:
    """Replace the index column ``index`` by the original id, named ``name``."""
    lookup = mapping.select(F.col("index").alias(index), F.col("id").alias(name))
    return df.join(lookup, on=index).drop(index)


def _factors(factors: DataFrame, mapping: DataFrame, name: str) -> DataFrame:
    """MLlib's (id, features) factors with the original ids in column ``name``."""
    return _to_original(factors.withColumnRenamed("id", _KEY), _KEY, mapping, name).select(
        col(name), "features")


# -- checks ----------------------------------------------------------------------------------
def _check_choice(param: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ParamError(f"{param}={value!r} is not supported; use one of {allowed}."
                         f"{suggest(str(value), allowed)}")


def _check_k(name: str, k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ParamError(f"{name}={k!r} must be a whole number >= 1, e.g. {name}=10.")


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


def _value_stats(dataset: DataFrame, user: str, item: str, rating: str) -> Row:
    """Rows, null ids, null/NaN/negative ratings and duplicate pairs, in one Spark job."""
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

    stats = pairs.agg(
        total(n).alias("rows"), total(F.when(F.col(_U).isNull(), n)).alias("u"),
        total(F.when(F.col(_I).isNull(), n)).alias("i"), total("null").alias("null"),
        total("nan").alias("nan"), total("neg").alias("neg"), F.min("min").alias("min"),
        F.count_if(n > 1).alias("pairs"),
        F.min(F.when(n > 1, F.struct(_U, _I, "n"))).alias("example")).first()
    assert stats is not None
    return stats


# -- checkpointing -------------------------------------------------------------------------
def ensure_checkpoint_dir(spark: SparkSession) -> str | None:
    """The SparkContext's checkpoint directory, set to a temporary one when none is set.

    MLlib ALS silently ignores ``checkpointInterval`` without a checkpoint directory, and long
    runs then fail with stack overflows from their lineage. Logs a warning (once) when it sets
    one. Under Spark Connect there is no SparkContext to set one on: the server's
    ``spark.checkpoint.dir`` is returned, and without it :class:`ClusterConfigError` says so.

    Examples
    --------
    >>> ensure_checkpoint_dir(spark)
    'file:/.../sparkdist-checkpoints-...'
    """
    if is_connect(spark):
        return _connect_checkpoint_dir(spark)
    sc = spark.sparkContext
    if sc.getCheckpointDir() is None:
        directory = _default_checkpoint_dir(str(sc.master), sc.applicationId)
        sc.setCheckpointDir(directory)
        _log_once(f"sparkdist set the Spark checkpoint directory to {directory} so that ALS "
                  "honours checkpointInterval; to choose another, call "
                  "spark.sparkContext.setCheckpointDir(path) before fitting (or set "
                  "checkpointInterval=-1 to turn checkpointing off).")
    return sc.getCheckpointDir()


def _connect_checkpoint_dir(spark: SparkSession) -> str:
    """The Connect server's ``spark.checkpoint.dir``: a client cannot set one (no
    SparkContext), and without one ALS would silently skip its checkpoints."""
    try:
        directory = spark.conf.get("spark.checkpoint.dir", None)
    except Exception:  # a server that refuses to show the key
        directory = None
    if not directory:
        raise ClusterConfigError(
            "ALS checkpointing (checkpointInterval >= 1) needs a Spark checkpoint directory, "
            "and a Spark Connect client cannot set one (SparkContext.setCheckpointDir does "
            "not exist on Connect); start the Connect server with "
            "--conf spark.checkpoint.dir=<a path every executor can reach>, or set "
            "checkpointInterval=-1 to fit without checkpoints.")
    return str(directory)


def _default_checkpoint_dir(master: str, app_id: str) -> str:
    """A driver-local temporary directory in local modes (removed at exit); on a cluster, a
    directory on the default filesystem, which every executor can reach."""
    if master.startswith("local"):
        directory = tempfile.mkdtemp(prefix="sparkdist-checkpoints-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        return directory
    return f"/tmp/sparkdist-checkpoints/{app_id}"


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        _LOG.warning(message)
