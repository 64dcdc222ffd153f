"""XGBoost as sparkdist Estimators: distributed training by ``xgboost.spark``, persistence by
sparkdist.

:class:`XGBoostClassifier` and :class:`XGBoostRegressor` keep xgboost's own parameter names
(``num_workers``, ``max_depth``, ``n_estimators``, ``learning_rate``, ``device``, ...) and the
column Params ``xgboost.spark`` uses (``featuresCol``, ``labelCol``, ``predictionCol``,
``weightCol``, ``validationIndicatorCol``, and for the classifier ``probabilityCol`` and
``rawPredictionCol``). ``fit`` checks the input and the cluster first, then hands the work to
``xgboost.spark.SparkXGBClassifier`` / ``SparkXGBRegressor`` (one barrier task per worker).

With ``checkpointDir`` set, ``fit`` boosts in chunks of ``checkpointEvery`` rounds, each
continuing from the booster saved after the previous one under ``checkpointDir/runId`` (the
newest ``keepCheckpoints`` kept). A failed chunk is run again from the newest intact checkpoint,
at most ``maxRetries`` times per fit, then the fit raises TrainingError with the last cause. A
fit given the ``runId`` of an interrupted one continues it when its Params and data match
(a mismatch is refused before launch, naming each difference); ``resume='required'`` with a
larger ``n_estimators`` (the total) boosts only the missing rounds of a completed run, which
the default ``resume='auto'`` trains again from scratch (see ``HasRecovery``). Without sampling
(``subsample``, ``colsample_*``) the chunked booster equals the one of a single fit.
``early_stopping_rounds`` cannot be combined with checkpoints (the count would restart in every
chunk), and ``callbacks`` see each chunk as its own training (``epoch`` restarts at 0).

With validation rows (``validationIndicatorCol``) the model's ``history`` has one record per
boosting round: ``val_<metric>`` for each eval metric (xgboost's names: ``val_logloss``,
``val_rmse``, ``val_auc``, ...), ``val_loss`` (the first metric's), and the training metrics
by name. A :class:`sparkdist.tuning.Tuner`'s pruner judges those values after a plain fit; a
checkpointed fit passes them to it after each chunk, and stops (raising FitStopped) when it
prunes the trial.

A fitted model saves its booster as UBJSON (xgboost's native format) and its Params as JSON;
loading parses exactly those two and never unpickles: ``xgboost.spark``'s own reader, which
unpickles a callbacks field, is never called. xgboost is imported on first fit/transform/load,
so constructing, tuning grids and saving estimators work without it.

Examples
--------
>>> from pyspark.ml import Pipeline
>>> from sparkdist.features import FeatureAssembler
>>> pipeline = Pipeline(stages=[
...     FeatureAssembler(numericCols=["month_interaction_count", "week_interaction_count"],
...                      labelCol="cancelled_within_week"),
...     XGBoostClassifier(labelCol="cancelled_within_week", num_workers=2, max_depth=4,
...                       n_estimators=20)])
>>> model = pipeline.fit(train)
>>> model.write().save(f"{tmp}/churn-xgb")  # or s3://bucket/churn-xgb, gs://, ...

A resumable fit: 500 rounds, checkpointed every 50 under ``checkpointDir/runId``:

>>> resumable = XGBoostClassifier(labelCol="cancelled_within_week", num_workers=2,
...                               n_estimators=500, checkpointDir=f"{tmp}/ckpt",
...                               checkpointEvery=50, runId="churn-nightly")
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any, ClassVar

from py4j.protocol import Py4JJavaError
from pyspark import keyword_only
from pyspark.errors import PySparkException
from pyspark.ml import Estimator, Model
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import Params
from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, NumericType, StructType

from sparkdist import _internals, failpoints, store
from sparkdist._params import keywords, unknown_param
from sparkdist.columns import check_one_of, col, require_columns, require_numeric
from sparkdist.exceptions import (
    ModelLoadError,
    ParamError,
    SchemaError,
    SparkdistError,
    TrainingError,
)
from sparkdist.launch.barrier import worker_message
from sparkdist.launch.preflight import preflight
from sparkdist.models._accessors_xgboost import (
    _XGBoostClassificationModelAccessors,
    _XGBoostClassifierAccessors,
    _XGBoostRegressionModelAccessors,
    _XGBoostRegressorAccessors,
)
from sparkdist.models._labels import check_label
from sparkdist.models._recovery import HasElastic, HasRecovery, content_hash, data_identity
from sparkdist.models._xgboost_params import (
    ALIASES,
    HINTS,
    TRAJECTORY,
    ClassifierParams,
    RegressorParams,
    XGBoostFitParams,
)
from sparkdist.persist import ParamsPersistence, PersistentModel
from sparkdist.session import require_classic

BOOSTER_FILE = "booster.ubj"
BOOSTER_FORMAT = "ubj"
_CONNECT_FIX = ("xgboost.spark drives its training and scoring through the SparkContext and "
                "RDDs; fit and score XGBoost models on a classic SparkSession "
                "(get_spark(master=...)).")
INSTALL_HINT = 'XGBoost models need the xgboost package: pip install "sparkdist[xgboost]"'
DEVICES = ("cpu", "cuda", "gpu")
_FILLED = "filled_partitions"  # stats key: partitions of the input that hold rows
_CLASS_BITS = 63  # class indices 0..62 are counted by one bit each of a long (not the sign)
_PARTITION = "_sparkdist_partition"  # internal column: the partition of each row


def _xgboost_spark() -> ModuleType:
    """``xgboost.spark``, imported on first use."""
    try:
        import xgboost.spark as xgboost_spark
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} ({err})") from err
    return xgboost_spark


def _push_params(source: Params, target: Params) -> Params:
    """Set on ``target`` every defined Param of ``source`` that it also has."""
    for param, value in source.extractParamMap().items():
        if target.hasParam(param.name):
            target._set(**{param.name: value})
    return target


# -- estimators ------------------------------------------------------------------------------
class _XGBoostEstimator(Estimator, XGBoostFitParams, HasRecovery, HasElastic,
                        ParamsPersistence):
    """Validates, then fits the matching ``xgboost.spark`` estimator (once, or in checkpointed
    chunks of rounds) and wraps its model."""

    _transient_params = ("callbacks",)
    _param_aliases = ALIASES  # accepted keywords besides the Param names
    _param_hints = HINTS  # why a familiar xgboost name is refused

    _xgb_estimator: ClassVar[str]  # class name in xgboost.spark
    _model_class: ClassVar[type[_XGBoostModel]]
    _counts_classes: ClassVar[bool] = False  # whether _check_label needs class statistics

    def setParams(self, **params: Any) -> _XGBoostEstimator:
        """Set Params by name; xgboost.spark's snake_case column names are accepted too."""
        for name, value in params.items():
            real = ALIASES.get(name, name)
            if not self.hasParam(real):
                raise unknown_param(type(self), name, keywords(type(self)))
            try:
                self._set(**{real: value})
            except TypeError as err:
                raise ParamError(f"{real}={value!r}: {err}") from err
        return self

    def _fit(self, dataset: DataFrame) -> _XGBoostModel:
        require_classic(dataset, f"{type(self).__name__}.fit (xgboost.spark)", _CONNECT_FIX)
        location, run_id, stats = self._validate(dataset)
        classes = stats["classes"] if self._counts_classes else None
        make = partial(self._xgboost_estimator, self._repartition(dataset, stats), classes)
        if location is None:
            from sparkdist.models._xgboost_checkpoints import round_records

            inner = self._fit_once(dataset, make)
            model = self._model_class(inner, history=round_records(
                getattr(inner, "training_summary", None)))
        else:
            model = self._fit_checkpointed(dataset, location, run_id, stats, make)
        self._copyValues(model)
        return model

    def _repartition(self, dataset: DataFrame, stats: Any) -> bool:
        """Whether xgboost.spark repartitions the input: when forced, when it has not
        ``num_workers`` partitions (xgboost.spark's rule) or when one of them is empty (its
        worker would idle); ``stats`` counted the partitions that hold rows."""
        workers = self.getOrDefault("num_workers")
        return (self.getOrDefault("force_repartition") or stats[_FILLED] != workers
                or dataset.rdd.getNumPartitions() != workers)

    def _fit_once(self, dataset: DataFrame, make: Callable[[], Any]) -> Any:
        """One ``xgboost.spark`` fit of all rounds, no checkpoints, no retries."""
        try:
            return make().fit(dataset)
        except (Py4JJavaError, PySparkException) as err:  # a failed job
            raise TrainingError(f"XGBoost training failed on the executors: "
                                f"{worker_message(err)}") from err

    def _fit_checkpointed(self, dataset: DataFrame, location: str, run_id: str,
                          stats: Any, make: Callable[[], Any]) -> _XGBoostModel:
        """Boost in checkpointed chunks (see ``_xgboost_checkpoints``) while holding the run
        (see ``HasRecovery.guarded_run``); wrap the final booster."""
        from sparkdist.models import _xgboost_checkpoints as chunks

        get = self.getOrDefault
        plan = chunks.ChunkPlan(location=location, run_id=run_id, rounds=get("n_estimators"),
                                every=get("checkpointEvery"), keep=get("keepCheckpoints"),
                                max_retries=get("maxRetries"), num_workers=get("num_workers"),
                                elastic=self.elastic_plan("num_workers"))
        fingerprint = {**self._trajectory_values(),
                       **data_identity(dataset.select(*self._data_columns()).schema, stats)}
        with self.guarded_run(location, run_id, fingerprint, "n_estimators") as run:
            raw, summary, history = chunks.fit_in_chunks(make, dataset, plan,
                                                         failpoints.armed(self))
            assert run is not None
            run.complete(plan.rounds)
        return self._model_class(self._model_class._wrap_booster(raw, location), summary,
                                 history)

    def _data_columns(self) -> list[str]:
        """The input columns the fit reads."""
        names = ("featuresCol", "labelCol", "weightCol", "base_margin_col",
                 "validationIndicatorCol")
        return [self.getOrDefault(n) for n in names if self.isDefined(n) and self.getOrDefault(n)]

    def _xgboost_estimator(self, repartition: bool | None = None,
                           classes: int | None = None) -> Any:
        """The xgboost.spark estimator with this one's Params; ``classes``: the label's class
        count, which it then takes instead of counting it in a job."""
        cls = getattr(_xgboost_spark(), self._xgb_estimator)
        inner: Any = _push_params(self, cls() if classes is None
                                  else _internals.xgboost_counting_classes(cls, classes))
        return inner if repartition is None else inner._set(force_repartition=repartition)

    # validation: Params, then checkpoints, schema, the cluster, then one pass over the label
    # (which also counts the partitions that hold rows, for _repartition)
    def _validate(self, dataset: DataFrame) -> tuple[str | None, str, Any]:
        """Check everything before launch; return (checkpoint directory or None, run id,
        the data stats: with checkpoints, the content hash included)."""
        self._check_params()
        # xgboost.spark's barrier stage is never retried by Spark: retries happen on the
        # driver, so spark.stage.maxConsecutiveAttempts does not bound maxRetries here.
        location, run_id = self.checkpoint_location(dataset.sparkSession, spark_retries=False)
        self._check_schema(dataset.schema)
        # TorchEstimator's cluster checks (task slots, dynamic allocation, security); GPUs are
        # xgboost.spark's own check of ``device`` (in _check_params).
        preflight(dataset.sparkSession, self.getOrDefault("num_workers"), gpu_checks=False,
                  allow_unencrypted=self.getOrDefault("allowUnencrypted"), param="num_workers")
        identity = [content_hash(*self._data_columns())] if location else []
        # Spark refuses spark_partition_id() inside an aggregate: a column below it.
        marked = dataset.withColumn(_PARTITION, F.spark_partition_id())
        filled = F.size(F.collect_set(_PARTITION)).alias(_FILLED)
        return location, run_id, self._check_label(marked, [*identity, filled])

    def _check_params(self) -> None:
        workers, device = self.getOrDefault("num_workers"), self.getOrDefault("device")
        if workers < 1:
            raise ParamError(f"num_workers={workers}: use 1 or more.")
        self.check_elastic("num_workers")
        check_one_of("device", device, DEVICES)
        try:  # xgboost.spark's own cross-checks (tree_method, early stopping, GPU conf)
            _internals.xgboost_validate_params(self._xgboost_estimator())
        except ValueError as err:
            raise ParamError(str(err)) from err
        if self.isDefined("checkpointDir") and self.getOrDefault("checkpointDir"):
            from sparkdist.models._xgboost_checkpoints import check_chunkable

            check_chunkable(self.getOrDefault("n_estimators"),
                            self.getOrDefault("early_stopping_rounds"),
                            self.getOrDefault("callbacks") if self.isDefined("callbacks")
                            else None)

    def _check_schema(self, schema: StructType) -> None:
        features, label = self.getOrDefault("featuresCol"), self.getOrDefault("labelCol")
        require_columns(schema, [features], "featuresCol")
        _check_features_type(schema, features)
        require_columns(schema, [label], "labelCol")
        require_numeric(schema, label, "labelCol", "index it first (FeatureAssembler("
                        "labelCol=...) indexes string labels) or cast it to double.")
        for name, family in (("weightCol", NumericType), ("base_margin_col", NumericType),
                             ("validationIndicatorCol", BooleanType)):
            column = self.getOrDefault(name) if self.isDefined(name) else None
            if column:
                require_columns(schema, [column], name)
                if not isinstance(schema[column].dataType, family):
                    raise SchemaError(f"{name}: column '{column}' has type "
                                      f"{schema[column].dataType.simpleString()}; it must be "
                                      f"{'boolean' if family is BooleanType else 'numeric'}.")

    def _check_label(self, dataset: DataFrame, extra: list[Any]) -> Any:
        """One pass: the label checks, plus ``extra`` aggregates; the stats row. A classifier
        counts its classes in that pass without a distinct aggregation (see
        ``_class_count``); xgboost.spark then takes that count instead of a job of its own."""
        label = self.getOrDefault("labelCol")
        counting = _class_bits(col(label).cast("double")) if self._counts_classes else []
        stats = check_label(dataset, label, type(self).__name__, self._counts_classes,
                            [*extra, *counting])
        if self._counts_classes:
            stats = Row(**stats.asDict(), classes=_class_count(dataset, label, stats))
        self._check_label_values(label, stats)
        return stats

    def _check_label_values(self, label: str, stats: Any) -> None:
        """Classifiers check the class indices further; regressors take any finite label."""


def _class_bits(label: Column) -> list[Column]:
    """Aggregates that count the classes of checked labels (finite whole numbers >= 0) in
    the label pass: one bit per class index below _CLASS_BITS, OR-ed, and the labels above.
    A distinct count would add two shuffles (two jobs under AQE) to that pass."""
    small = (label >= 0) & (label < _CLASS_BITS)
    bit = F.when(small, F.pow(F.lit(2.0), label).cast("long"))  # exact: a power of two
    return [F.coalesce(F.bit_or(bit), F.lit(0).cast("long")).alias("class_bits"),
            F.count_if(label >= _CLASS_BITS).alias("large_labels")]


def _class_count(dataset: DataFrame, label: str, stats: Any) -> int:
    """The distinct labels, from ``_class_bits``; labels of _CLASS_BITS or more (many
    classes, or a label that is no class index) are counted exactly in a job of their own."""
    if not stats["large_labels"]:
        return bin(stats["class_bits"]).count("1")
    counted = dataset.agg(F.count_distinct(col(label).cast("double"))).first()
    assert counted is not None
    return int(counted[0])


def _check_features_type(schema: StructType, name: str) -> None:
    dtype = schema[name].dataType
    if isinstance(dtype, VectorUDT) or (isinstance(dtype, ArrayType)
                                        and isinstance(dtype.elementType, NumericType)):
        return
    raise SchemaError(f"featuresCol: column '{name}' has type {dtype.simpleString()}; XGBoost "
                      "needs an ML vector or an array of numbers. Assemble the features with "
                      "sparkdist.features.FeatureAssembler.")


class XGBoostClassifier(_XGBoostEstimator, ClassifierParams, _XGBoostClassifierAccessors):
    """Gradient-boosted trees for binary and multiclass labels (class indices 0..k-1),
    trained by ``num_workers`` XGBoost workers in one Spark barrier stage.

    Outputs ``predictionCol`` (class index), ``probabilityCol`` and ``rawPredictionCol``
    (vectors, as MLlib classifiers do, so Spark's evaluators work unchanged).

    ``checkpointDir``, ``checkpointEvery``, ``keepCheckpoints``, ``runId`` and ``maxRetries``
    make the fit resumable by rounds (see the module docstring).

    Examples
    --------
    >>> clf = XGBoostClassifier(labelCol="cancelled_within_week", num_workers=1, max_depth=4,
    ...                         n_estimators=20, learning_rate=0.1)
    >>> model = clf.fit(assembled_train)
    >>> model.transform(assembled_test).select("probability", "prediction").first()
    Row(probability=DenseVector([0.89..., 0.10...]), prediction=0.0)
    """

    _xgb_estimator = "SparkXGBClassifier"
    _trajectory = {**TRAJECTORY, "probabilityCol": False, "rawPredictionCol": False}
    _counts_classes = True

    @keyword_only
    def __init__(self, **params: Any) -> None:
        super().__init__()
        self.setParams(**self._input_kwargs)  # type: ignore[attr-defined]

    def _check_label_values(self, label: str, stats: Any) -> None:
        classes, low, high = stats["classes"], stats["min"], stats["max"]
        top = 1 if classes <= 2 else classes - 1  # binary:logistic takes {0, 1}
        if stats["fractional"] or low < 0 or high > top or (classes > 2 and low != 0):
            raise SchemaError(
                f"labelCol: column '{label}' holds {classes} distinct values from {low:g} to "
                f"{high:g}; XGBoostClassifier needs class indices 0..{max(top, 1)}. Index the "
                "label first (FeatureAssembler(labelCol=...) or StringIndexer).")


class XGBoostRegressor(_XGBoostEstimator, RegressorParams, _XGBoostRegressorAccessors):
    """Gradient-boosted trees for a numeric label, trained by ``num_workers`` XGBoost
    workers in one Spark barrier stage.

    ``checkpointDir``, ``checkpointEvery``, ``keepCheckpoints``, ``runId`` and ``maxRetries``
    make the fit resumable by rounds (see the module docstring).

    Examples
    --------
    >>> reg = XGBoostRegressor(labelCol="cancelled_within_week", num_workers=1,
    ...                        n_estimators=20, objective="reg:logistic")  # a 0/1 label: P(churn)
    >>> model = reg.fit(assembled_train)
    >>> model.transform(assembled_test).select("cancelled_within_week", "prediction").first()
    Row(cancelled_within_week=0.0, prediction=0.15...)
    """

    _xgb_estimator = "SparkXGBRegressor"
    _trajectory = {**TRAJECTORY, "objective": True}

    @keyword_only
    def __init__(self, **params: Any) -> None:
        super().__init__()
        self.setParams(**self._input_kwargs)  # type: ignore[attr-defined]


# -- models ----------------------------------------------------------------------------------
class _XGBoostModel(Model, PersistentModel):
    """A fitted XGBoost model: an ``xgboost.spark`` model with this model's Params pushed
    down at transform time, saved as UBJSON booster + JSON Params."""

    #: "classification" or "regression": how evaluation scores it.
    task: ClassVar[str]
    _xgb_model: ClassVar[str]  # class name in xgboost.spark
    _xgb_sklearn: ClassVar[str]  # class name in xgboost

    def __init__(self, inner: Any = None, summary: dict[str, Any] | None = None,
                 history: list[dict[str, Any]] | None = None) -> None:
        super().__init__()
        self._inner = inner
        self._summary = summary or {}
        self._history = list(history or [])

    @property
    def trainingSummary(self) -> dict[str, Any]:  # noqa: N802 (the name TorchModel uses)
        """How a checkpointed fit ran: run_id, checkpoint_dir, resumed_from_round (rounds
        taken from an earlier fit's checkpoint, or None), retries (failed chunks run
        again) and worker_counts (the workers of the first chunk and of each retry or change:
        ``[3, 2]`` where a lost executor left 2 slots and minWorkers allowed 2). Empty for a
        fit without checkpointDir and for a loaded model."""
        return dict(self._summary)

    @property
    def history(self) -> list[dict[str, Any]]:
        """One record per boosting round of a fit with validation rows
        (``validationIndicatorCol``): ``epoch`` (the round, 1-based), ``val_<name>`` for each
        eval metric (xgboost's names: ``val_logloss``, ``val_rmse``, ``val_auc``, ...),
        ``val_loss`` (the first metric's value), and the training metrics by name (``loss``:
        the first). Empty without validation rows. A checkpointed fit that resumed an
        earlier fit's checkpoint has records from the first round it boosted itself. Saved
        with the model.

        >>> model.history[0]  # doctest: +SKIP
        {'epoch': 1, 'loss': 0.58..., 'logloss': 0.58..., 'val_loss': 0.59..., 'val_logloss': ...}
        """
        return [dict(record) for record in self._history]

    @property
    def xgboost_model(self) -> Any:
        """The fitted ``xgboost.spark`` model, carrying this model's Params."""
        if self._inner is None:
            raise SparkdistError(f"{type(self).__name__} is not fitted; fit an estimator or "
                                 "load a saved model.")
        return _push_params(self, self._inner.copy())

    def get_booster(self) -> Any:
        """The trained ``xgboost.Booster`` (feature importances, dumps, SHAP)."""
        return self.xgboost_model.get_booster()

    def _transform(self, dataset: DataFrame) -> DataFrame:
        require_classic(dataset, f"{type(self).__name__}.transform (xgboost.spark)",
                        _CONNECT_FIX)
        require_columns(dataset.schema, [self.getOrDefault("featuresCol")], "featuresCol")
        _check_features_type(dataset.schema, self.getOrDefault("featuresCol"))
        with _internals.xgboost_session_in_a_task():  # MLflow's spark_udf transforms inside a task
            return self.xgboost_model.transform(dataset)

    # persistence: sparkdist.persist writes and reads (strictly, without pickle)
    def _save_artifacts(self, path: str) -> None:
        store.write_bytes(f"{path}/{BOOSTER_FILE}",
                          bytes(self.get_booster().save_raw(BOOSTER_FORMAT)))

    def _state(self) -> dict[str, Any]:
        import xgboost

        return {"boosterFile": BOOSTER_FILE, "boosterFormat": BOOSTER_FORMAT,
                "xgboostVersion": xgboost.__version__, "history": self._history}

    @classmethod
    def _from_state(cls, state: dict[str, Any], path: str) -> _XGBoostModel:
        if not isinstance(state, dict) or state.get("boosterFormat") != BOOSTER_FORMAT:
            raise ModelLoadError(f"'{path}': unsupported booster format in metadata "
                                 f"({state!r}); sparkdist writes '{BOOSTER_FORMAT}' only.")
        raw = _read_bytes(f"{path.rstrip('/')}/{BOOSTER_FILE}")
        # a model saved before histories were kept has none
        return cls(cls._wrap_booster(raw, path), history=_history(state.get("history", []), path))

    @classmethod
    def _wrap_booster(cls, raw: bytes, path: str) -> Any:
        """Parse UBJSON into xgboost's sklearn model inside the ``xgboost.spark`` model."""
        if not raw.startswith(b"{"):  # a UBJSON object opens with '{': refuse anything else
            raise ModelLoadError(f"'{path}/{BOOSTER_FILE}' is not a UBJSON booster.")
        xgboost_spark = _xgboost_spark()
        import xgboost

        sklearn_model = getattr(xgboost, cls._xgb_sklearn)()
        try:
            sklearn_model.load_model(bytearray(raw))
        except (xgboost.core.XGBoostError, TypeError, ValueError) as err:
            raise ModelLoadError(f"'{path}/{BOOSTER_FILE}' is not a valid XGBoost booster: "
                                 f"{err}") from err
        return getattr(xgboost_spark, cls._xgb_model)(sklearn_model)


class XGBoostClassificationModel(_XGBoostModel, ClassifierParams,
                                 _XGBoostClassificationModelAccessors):
    """A fitted :class:`XGBoostClassifier`.

    Examples
    --------
    >>> model = XGBoostClassifier(labelCol="cancelled_within_week", num_workers=1,
    ...                           n_estimators=10).fit(assembled_train)
    >>> model.write().overwrite().save(f"{tmp}/xgb")
    >>> same = XGBoostClassificationModel.load(f"{tmp}/xgb")
    >>> same.get_booster().num_boosted_rounds()
    10
    """

    task = "classification"
    _xgb_model = "SparkXGBClassifierModel"
    _xgb_sklearn = "XGBClassifier"


class XGBoostRegressionModel(_XGBoostModel, RegressorParams, _XGBoostRegressionModelAccessors):
    """A fitted :class:`XGBoostRegressor`.

    Examples
    --------
    >>> model = XGBoostRegressor(labelCol="cancelled_within_week", num_workers=1,
    ...                          n_estimators=10, max_depth=3).fit(assembled_train)
    >>> model.transform(assembled_test).select("prediction").first()
    Row(prediction=0.06...)
    """

    task = "regression"
    _xgb_model = "SparkXGBRegressorModel"
    _xgb_sklearn = "XGBRegressor"


XGBoostClassifier._model_class = XGBoostClassificationModel
XGBoostRegressor._model_class = XGBoostRegressionModel


# -- saved histories and booster files -------------------------------------------------------
def _history(value: Any, path: str) -> list[dict[str, Any]]:
    """A saved history, checked: a list of records mapping names to numbers."""
    def is_record(record: Any) -> bool:
        return isinstance(record, dict) and all(
            isinstance(name, str) and isinstance(number, (int, float))
            and not isinstance(number, bool) for name, number in record.items())

    if isinstance(value, list) and all(is_record(record) for record in value):
        return value
    raise ModelLoadError(f"'{path}': its history is not a list of per-round records of "
                         "numbers; the metadata was edited or damaged. Save the model again.")


def _read_bytes(path: str) -> bytes:
    try:
        return store.read_bytes(path)
    except FileNotFoundError as err:
        raise ModelLoadError(f"'{path}' is missing: the model directory is incomplete.") from err
