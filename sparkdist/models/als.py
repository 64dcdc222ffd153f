"""ALS matrix factorisation as a Spark ML Estimator, without MLlib's traps.

:class:`ALS` drives :class:`pyspark.ml.recommendation.ALS` and keeps its Params (names, docs
and defaults, except ``coldStartStrategy="drop"``), and adds:

* ids of any atomic type (strings, longs beyond the int range, ints) are indexed to ints
  ``0..n-1`` (deterministically) and mapped back in every output, with their original type;
  a column of non-negative ints goes to MLlib as it is (no mapping, no extra job);
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
import uuid
from typing import Any, ClassVar

from pyspark import InheritableThread, keyword_only
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.recommendation import ALS as _MLlibALS
from pyspark.ml.recommendation import ALSModel as _MLlibALSModel
from pyspark.ml.wrapper import JavaModel
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from sparkdist import store
from sparkdist._internals import ALSModelParams as _MLlibALSModelParams
from sparkdist._internals import ALSParams as _MLlibALSParams
from sparkdist._params import stable_seed
from sparkdist.columns import check_one_of, col, require_columns
from sparkdist.exceptions import ClusterConfigError
from sparkdist.models._accessors_als import _ALSAccessors, _ALSModelAccessors
from sparkdist.models._als_checks import check_ratings_schema, check_ratings_values
from sparkdist.models._als_ids import (
    _I,
    _R,
    _U,
    attach_index,
    factors,
    index_ids,
    original_ids,
)
from sparkdist.models._als_metrics import check_k, ranking_metrics, rating_errors
from sparkdist.models._mllib import MLLIB_DIR, MLlibEstimator, MLlibModel
from sparkdist.session import is_connect

__all__ = ["ALS", "ALSModel", "ensure_checkpoint_dir"]

_LOG = logging.getLogger(__name__)
_LOGGED: set[str] = set()

DUPLICATE_POLICIES = ("error", "mean", "sum")
COLD_START_STRATEGIES = ("drop", "nan")
USER_INDEX_DIR, ITEM_INDEX_DIR = "user_index", "item_index"  # Parquet (id, index) mappings


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


class ALS(MLlibEstimator, _ALSParams, _ALSAccessors):
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
    _trajectory = {  # the storage, checkpoint and scoring Params do not shape the factors
        **dict.fromkeys((
            "alpha", "duplicatePolicy", "implicitPrefs", "itemCol", "maxIter", "nonnegative",
            "numItemBlocks", "numUserBlocks", "rank", "ratingCol", "regParam", "seed",
            "userCol"), True),
        **dict.fromkeys(("blockSize", "checkpointInterval", "coldStartStrategy",
                         "finalStorageLevel", "intermediateStorageLevel", "predictionCol"),
                        False),
    }
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
        mapped = check_ratings_schema(dataset, self.getUserCol(), self.getItemCol(),
                                      self.getRatingCol())
        if mapped or is_connect(dataset.sparkSession):
            stats, counts = self._check_values(dataset, mapped)
            if self.getCheckpointInterval() >= 1:  # after the checks: on Connect it may refuse
                ensure_checkpoint_dir(dataset.sparkSession)
            users, items = self._mappings(dataset, stats, mapped, counts)
            inner = self._fit_indexed(dataset, users, items)
        else:
            inner, users, items = self._fit_beside_checks(dataset)
        model = ALSModel(inner, users, items)
        self._copyValues(model)
        return model

    def _mappings(self, dataset: DataFrame, stats: Row, mapped: list[str],
                  counts: list[Row]) -> tuple[DataFrame | None, DataFrame | None]:
        """The (user, item) mappings: non-negative int ids are MLlib's own (None); other
        columns get an (id, index) mapping, from the id counts of the check job (int columns
        with negative ids: a job of theirs)."""
        user, item = self.getUserCol(), self.getItemCol()
        late = [c for c, low in ((user, stats["u_min"]), (item, stats["i_min"]))
                if c not in mapped and low is not None and low < 0]
        built = dict(zip(mapped, index_ids(dataset, mapped, counts)))
        built.update(zip(late, index_ids(dataset, late) if late else []))
        return built.get(user), built.get(item)

    def _fit_indexed(self, dataset: DataFrame, users: DataFrame | None,
                     items: DataFrame | None) -> JavaModel:
        return self._fit_mllib(self._indexed_ratings(dataset, users, items),
                               userCol=_U, itemCol=_I, ratingCol=_R)

    def _fit_beside_checks(self, dataset: DataFrame) -> tuple[JavaModel, DataFrame | None,
                                                             DataFrame | None]:
        """Int id columns (classic Spark): MLlib fits while the value checks' job runs in a
        thread beside it, so the checks cost little wall time (MLlib's small jobs leave task
        slots idle). A failed check cancels the fit's jobs and its error is raised, whatever
        MLlib did; negative ids (MLlib refuses them) are indexed and fitted again."""
        sc = dataset.sparkSession.sparkContext
        tag = f"sparkdist-als-{uuid.uuid4().hex}"
        found: dict[str, Any] = {}

        def check() -> None:
            try:
                found["stats"] = self._check_values(dataset, [])[0]
            except Exception as err:  # raised in the caller's thread below
                found["error"] = err
                sc.cancelJobsWithTag(tag)

        if self.getCheckpointInterval() >= 1:
            ensure_checkpoint_dir(dataset.sparkSession)
        thread = InheritableThread(target=check, daemon=True)  # the caller's job group, pool
        thread.start()
        sc.addJobTag(tag)
        inner, failure = None, None
        try:
            inner = self._fit_indexed(dataset, None, None)
        except Exception as err:  # judged once the checks are done
            failure = err
        finally:
            sc.removeJobTag(tag)
            thread.join()
        if "error" in found:
            raise found["error"]
        users, items = self._mappings(dataset, found["stats"], [], [])
        if users is not None or items is not None:  # negative ids: MLlib refused them
            return self._fit_indexed(dataset, users, items), users, items
        if failure is not None:
            raise failure
        assert inner is not None
        return inner, None, None

    # -- validation ----------------------------------------------------------------------
    def _check_params(self) -> None:
        super()._check_params()
        check_one_of("duplicatePolicy", self.getDuplicatePolicy(), DUPLICATE_POLICIES)
        check_one_of("coldStartStrategy", self.getColdStartStrategy(), COLD_START_STRATEGIES)

    def _check_values(self, dataset: DataFrame, mapped: list[str]) -> tuple[Row, list[Row]]:
        """The value checks' job (see ``check_ratings_values``): stats and id counts."""
        return check_ratings_values(dataset, self.getUserCol(), self.getItemCol(),
                                    self.getRatingCol(), self.getImplicitPrefs(),
                                    self.getDuplicatePolicy(), mapped)

    # -- preparation ---------------------------------------------------------------------
    def _indexed_ratings(self, dataset: DataFrame, users: DataFrame | None,
                         items: DataFrame | None) -> DataFrame:
        """(user index, item index, rating) rows, duplicates merged by ``duplicatePolicy``."""
        user, item, rating = self.getUserCol(), self.getItemCol(), self.getRatingCol()
        value = col(rating).cast("float") if rating else F.lit(1.0).cast("float")
        pairs = dataset.select(col(user), col(item), value.alias(_R))
        policy = self.getDuplicatePolicy()
        if policy != "error":  # "error" has already proved there are none
            merge = F.avg if policy == "mean" else F.sum
            pairs = pairs.groupBy(col(user), col(item)).agg(merge(_R).cast("float").alias(_R))
        pairs = attach_index(attach_index(pairs, user, users, _U), item, items, _I)
        return pairs.select(_U, _I, _R)


class ALSModel(MLlibModel, _ALSModelParams, _ALSModelAccessors):
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
        # A side without a mapping uses its (non-negative int) ids as MLlib's.
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
        return factors(self.mllib_model.userFactors, self._mapping(_U), self.getUserCol())

    @property
    def itemFactors(self) -> DataFrame:
        """(itemCol, features) with the original item ids."""
        return factors(self.mllib_model.itemFactors, self._mapping(_I), self.getItemCol())

    def _mapping(self, which: str) -> DataFrame | None:
        assert self._inner is not None, f"{type(self).__name__} is not fitted"
        return self._users if which == _U else self._items

    def _transform(self, dataset: DataFrame) -> DataFrame:
        check_one_of("coldStartStrategy", self.getColdStartStrategy(), COLD_START_STRATEGIES)
        return self.mllib_model.transform(self._with_indices(dataset)).drop(_U, _I)

    def _with_indices(self, dataset: DataFrame) -> DataFrame:
        """``dataset`` plus the user and item indices; -1 (a cold start) for unknown ids."""
        user, item = self.getUserCol(), self.getItemCol()
        require_columns(dataset.schema, [user], "userCol")
        require_columns(dataset.schema, [item], "itemCol")
        indexed = attach_index(dataset, user, self._mapping(_U), _U)
        return attach_index(indexed, item, self._mapping(_I), _I)

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
        check_k("numItems", numItems)
        return self._original(self.mllib_model.recommendForAllUsers(numItems), _U)

    def recommendForAllItems(self, numUsers: int) -> DataFrame:
        """Top ``numUsers`` users of every item: (itemCol, recommendations of (userCol,
        rating)), best first.

        Examples
        --------
        >>> model.recommendForAllItems(2).columns
        ['item_id', 'recommendations']
        """
        check_k("numUsers", numUsers)
        return self._original(self.mllib_model.recommendForAllItems(numUsers), _I)

    def recommendForUserSubset(self, dataset: DataFrame, numItems: int) -> DataFrame:
        """Top ``numItems`` items for each distinct user of ``dataset`` that the model knows
        (unknown users get no row).

        Examples
        --------
        >>> model.recommendForUserSubset(test.where("user_id = 'u00001'"), 5).count()
        1
        """
        check_k("numItems", numItems)
        known = self._subset(dataset, self.getUserCol(), _U)
        return self._original(self.mllib_model.recommendForUserSubset(known, numItems), _U)

    def recommendForItemSubset(self, dataset: DataFrame, numUsers: int) -> DataFrame:
        """Top ``numUsers`` users for each distinct item of ``dataset`` that the model knows.

        Examples
        --------
        >>> model.recommendForItemSubset(test, 5).columns
        ['item_id', 'recommendations']
        """
        check_k("numUsers", numUsers)
        known = self._subset(dataset, self.getItemCol(), _I)
        return self._original(self.mllib_model.recommendForItemSubset(known, numUsers), _I)

    def _subset(self, dataset: DataFrame, name: str, index: str) -> DataFrame:
        require_columns(dataset.schema, [name], "userCol" if index == _U else "itemCol")
        ids = dataset.select(col(name)).distinct()
        return attach_index(ids, name, self._mapping(index), index).where(F.col(index) >= 0)

    def _original(self, recs: DataFrame, key: str) -> DataFrame:
        names = {_U: self.getUserCol(), _I: self.getItemCol()}
        return original_ids(recs, key, names, {_U: self._mapping(_U), _I: self._mapping(_I)})

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
        check_k("k", k)
        user, item, rating = self.getUserCol(), self.getItemCol(), self.getRatingCol()
        for param, name in (("userCol", user), ("itemCol", item), ("ratingCol", rating)):
            require_columns(dataset.schema, [name], param)
        # The rating travels as _R: MLlib's evaluator parses column names ("a.b" as a field).
        known = (self._with_indices(dataset.select(col(user), col(item), col(rating).alias(_R)))
                 .where(F.col(_R).isNotNull() & ~F.isnan(F.col(_R).cast("double")))
                 .where((F.col(_U) >= 0) & (F.col(_I) >= 0)).cache())
        try:
            metrics = ranking_metrics(self.mllib_model, known, k, relevanceThreshold,
                                      self.getImplicitPrefs())
            if not self.getImplicitPrefs():
                metrics.update(rating_errors(self.mllib_model, known, self.getPredictionCol()))
            return metrics
        finally:
            known.unpersist()

    # -- persistence -----------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        # The sides whose ids are MLlib's own (no mapping saved); absent in older models.
        return {"unmapped": [name for side, name in ((_U, USER_INDEX_DIR), (_I, ITEM_INDEX_DIR))
                             if self._mapping(side) is None]}

    def _save_artifacts(self, path: str) -> None:
        super()._save_artifacts(path)
        spark = SparkSession.active()
        for side, name in ((_U, USER_INDEX_DIR), (_I, ITEM_INDEX_DIR)):
            mapping = self._mapping(side)
            if mapping is not None:
                with store.jvm_output(spark, f"{path}/{name}") as out:
                    mapping.write.parquet(out)

    @classmethod
    def _from_state(cls, state: dict[str, Any], path: str) -> ALSModel:
        spark = SparkSession.active()
        unmapped = state.get("unmapped", []) if isinstance(state, dict) else []
        mappings = [None if name in unmapped else
                    spark.read.parquet(store.jvm_input(spark, f"{path}/{name}")).cache()
                    for name in (USER_INDEX_DIR, ITEM_INDEX_DIR)]
        return cls(cls._mllib_model.load(store.jvm_input(spark, f"{path}/{MLLIB_DIR}")),
                   *mappings)


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
