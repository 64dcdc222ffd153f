"""What sparkdist's MLlib classifiers add on top of MLlib, in one place: input checks, balanced
class weights and a decision threshold tuned on a held-out validation split.

:class:`_TunedClassifier` is mixed into an :class:`~sparkdist.models._mllib.MLlibEstimator`
whose Params include :class:`_ClassWeightParams` and :class:`_ThresholdTuningParams`; its model
mixes in :class:`_TunedModel`, which keeps and persists what the tuning found.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasSeed
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from sparkdist._params import stable_seed
from sparkdist.columns import check_one_of, col, require_columns, require_numeric
from sparkdist.exceptions import ParamError, SchemaError
from sparkdist.features import split
from sparkdist.models._labels import check_label
from sparkdist.models._mllib import MLlibEstimator, MLlibModel

CLASS_WEIGHTS = ("balanced",)
THRESHOLD_METRICS = ("f1", "accuracy", "precision", "recall", "youden")
#: Params whose value None means something (so an explicit None is kept, not dropped).
NULLABLE_PARAMS = frozenset({"classWeight", "thresholdMetric"})
WEIGHT_COL = "_sparkdist_weight"  # the working weight column MLlib trains on
_P1 = "_sparkdist_p1"  # working probability column while scoring thresholds
_BINS = 1000  # threshold candidates are k / _BINS for k = 1 .. _BINS - 1
_FIT, _VALIDATION = "fit", "validation"


def set_given(stage: Params, kwargs: Mapping[str, Any]) -> Any:
    """Set the keyword arguments a caller passed; None means "leave unset" (MLlib style)
    except for Params where None is a value of its own."""
    return stage._set(**{k: v for k, v in kwargs.items() if v is not None
                         or k in NULLABLE_PARAMS})


# -- Params ----------------------------------------------------------------------------------
class _ClassWeightParams(Params):
    """The ``classWeight`` Param."""

    classWeight: Param[Any] = Param(
        Params._dummy(), "classWeight",
        "None (every row counts once) or 'balanced': weight each row n / (k * n_class), so every "
        "class carries the same total weight; multiplied into weightCol when that is set",
        typeConverter=TypeConverters.toString,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(classWeight=None)

    def getClassWeight(self) -> str | None:
        """Gets the value of :py:attr:`classWeight` or its default (None)."""
        return self.getOrDefault(self.classWeight)

    def setClassWeight(self, value: str | None) -> Any:
        """Sets :py:attr:`classWeight` (None or 'balanced')."""
        return self._set(classWeight=value)


class _ThresholdTuningParams(HasSeed):
    """The ``thresholdMetric`` and ``validationFraction`` Params, and a reproducible seed."""

    thresholdMetric: Param[Any] = Param(
        Params._dummy(), "thresholdMetric",
        "None (keep the threshold as set) or the metric the binary decision threshold maximises "
        f"on a stratified validation split of the training data: one of {THRESHOLD_METRICS}",
        typeConverter=TypeConverters.toString,
    )
    validationFraction: Param[Any] = Param(
        Params._dummy(), "validationFraction",
        "fraction of the training rows held out to tune the threshold, in (0, 1); the model is "
        "fitted on the rest (only used when thresholdMetric is set)",
        typeConverter=TypeConverters.toFloat,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(thresholdMetric=None, validationFraction=0.2,
                         seed=stable_seed(type(self).__name__))

    def getThresholdMetric(self) -> str | None:
        """Gets the value of :py:attr:`thresholdMetric` or its default (None)."""
        return self.getOrDefault(self.thresholdMetric)

    def setThresholdMetric(self, value: str | None) -> Any:
        """Sets :py:attr:`thresholdMetric` (None or one of ``THRESHOLD_METRICS``)."""
        return self._set(thresholdMetric=value)

    def getValidationFraction(self) -> float:
        """Gets the value of :py:attr:`validationFraction` or its default (0.2)."""
        return self.getOrDefault(self.validationFraction)

    def setValidationFraction(self, value: float) -> Any:
        """Sets :py:attr:`validationFraction`, in (0, 1)."""
        return self._set(validationFraction=value)


# -- checks (no Spark jobs) ------------------------------------------------------------------
def check_input_columns(stage: Params, schema: StructType) -> None:
    """featuresCol must hold vectors, labelCol numbers, weightCol (when set) numbers."""
    features, label = stage.getOrDefault("featuresCol"), stage.getOrDefault("labelCol")
    require_columns(schema, [features], "featuresCol")
    if not isinstance(schema[features].dataType, VectorUDT):
        raise SchemaError(f"featuresCol: column '{features}' has type "
                          f"{schema[features].dataType.simpleString()}, not an ML vector; "
                          "assemble it first, e.g. with sparkdist.features.FeatureAssembler.")
    numeric = [("labelCol", label)]
    if stage.isDefined("weightCol") and stage.getOrDefault("weightCol"):
        numeric.append(("weightCol", stage.getOrDefault("weightCol")))
    for param, name in numeric:
        require_columns(schema, [name], param)
        require_numeric(schema, name, param, "index a string label with FeatureAssembler (or "
                        "StringIndexer) first.")


def check_classifier_params(stage: Params) -> None:
    """Unknown classWeight / thresholdMetric values and a validationFraction outside (0, 1)."""
    for name, allowed in (("classWeight", CLASS_WEIGHTS), ("thresholdMetric", THRESHOLD_METRICS)):
        check_one_of(name, stage.getOrDefault(name), (None, *allowed))
    fraction = stage.getOrDefault("validationFraction")
    if not 0.0 < fraction < 1.0:
        raise ParamError(f"validationFraction={fraction!r} must be in (0, 1), e.g. 0.2; it is "
                         "the share of training rows held out to tune the threshold.")


def check_class_counts(stage: Params, counts: dict[float, int]) -> dict[float, int]:
    """Refuse labels the options cannot work with (non-binary labels under tuning); return
    the counts per class (the labels are already checked to be class indices)."""
    label = stage.getOrDefault("labelCol")
    classes = {float(c): n for c, n in counts.items()}
    metric = stage.getOrDefault("thresholdMetric")
    if metric is None:
        return classes
    if sorted(classes) != [0.0, 1.0]:
        raise SchemaError(
            f"labelCol: column '{label}' has {len(classes)} classes {sorted(classes)}, but "
            f"thresholdMetric={metric!r} tunes a binary decision threshold and needs exactly the "
            "two classes 0 and 1; set thresholdMetric=None (for several classes set "
            "thresholds=[...] per class) or make the label binary.")
    fraction = stage.getOrDefault("validationFraction")
    small = min(classes, key=lambda c: classes[c])
    if classes[small] * fraction < 1.0:
        raise SchemaError(
            f"labelCol: class {small:g} of '{label}' has only {classes[small]} rows, so a "
            f"validationFraction={fraction:g} split holds none of it out; raise "
            "validationFraction or fit on more rows.")
    return classes


# -- class weights ---------------------------------------------------------------------------
def class_counts(dataset: DataFrame, label: str) -> dict[float, int]:
    """Rows per label value, in one aggregation."""
    rows = dataset.groupBy(col(label).cast("double").alias("c")).count().collect()
    return {r["c"]: r["count"] for r in rows}


def balanced_weight(label: Column, counts: dict[float, int]) -> Column:
    """``n / (k * n_c)`` for the class ``c`` of each row."""
    total, k = sum(counts.values()), len(counts)
    expr = None
    for value, n in sorted(counts.items()):
        is_class, weight = label.eqNullSafe(value), F.lit(total / (k * n))
        expr = F.when(is_class, weight) if expr is None else expr.when(is_class, weight)
    assert expr is not None
    return expr


# -- threshold tuning ------------------------------------------------------------------------
def confusion_by_threshold(scored: DataFrame, label: str,
                           weight: Column) -> tuple[np.ndarray, ...]:
    """(thresholds, tp, fp, fn, tn) for every candidate threshold, from ONE aggregation.

    A row is predicted positive when p1 > t, as MLlib predicts; ``ceil(p1 * _BINS) > k`` is
    that test for ``t = k / _BINS``, so a histogram over those bins gives every candidate's
    confusion counts by cumulative sums on the driver.
    """
    bin_ = F.ceil(vector_to_array(F.col(_P1))[1] * _BINS).cast("int")
    rows = (scored.groupBy(bin_.alias("b"), col(label).eqNullSafe(1.0).alias("pos"))
            .agg(F.sum(weight).alias("w")).collect())
    hist = np.zeros((2, _BINS + 1))
    for r in rows:
        hist[int(r["pos"]), min(max(r["b"], 0), _BINS)] += r["w"] or 0.0  # null weights
    # above[:, k] = weight of rows with bin > k, i.e. predicted positive at t = k / _BINS
    above = hist[:, ::-1].cumsum(axis=1)[:, ::-1] - hist
    k = np.arange(1, _BINS)
    tp, fp = above[1, k], above[0, k]
    fn, tn = hist[1].sum() - tp, hist[0].sum() - fp
    return k / _BINS, tp, fp, fn, tn


def metric_values(metric: str, tp: np.ndarray, fp: np.ndarray, fn: np.ndarray,
                  tn: np.ndarray) -> np.ndarray:
    """``metric`` at every candidate; a ratio with an empty denominator counts as 0."""
    def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
        return np.divide(num, den, out=np.zeros_like(num), where=den > 0)

    if metric == "f1":
        return ratio(2 * tp, 2 * tp + fp + fn)
    if metric == "accuracy":
        return ratio(tp + tn, tp + fp + fn + tn)
    if metric == "precision":
        return ratio(tp, tp + fp)
    if metric == "recall":
        return ratio(tp, tp + fn)
    return ratio(tp, tp + fn) - ratio(fp, fp + tn)  # youden: TPR - FPR


def best_threshold(thresholds: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """The best candidate; among ties the one nearest 0.5 (the least surprising cut)."""
    ties = np.flatnonzero(values >= values.max() - 1e-12)
    pick = ties[np.argmin(np.abs(thresholds[ties] - 0.5))]
    return float(thresholds[pick]), float(values[pick])


# -- estimator and model mixins --------------------------------------------------------------
if TYPE_CHECKING:  # what the mixins are mixed into, for the type checker only
    class _EstimatorBase(MLlibEstimator, _ClassWeightParams, _ThresholdTuningParams):
        ...

    class _ModelBase(MLlibModel, _ClassWeightParams, _ThresholdTuningParams):
        ...
else:
    _EstimatorBase = _ModelBase = object


def _user_weight_col(stage: Params) -> str | None:
    """The caller's weightCol, or None when unset or empty."""
    if not stage.isDefined("weightCol"):
        return None
    return stage.getOrDefault("weightCol") or None


class _TunedClassifier(_EstimatorBase):
    """``_fit`` for classifiers: Params -> schema -> label checks (one job) -> class counts
    (one job, only when an option needs them) -> hold out a validation split -> weight ->
    fit MLlib -> model -> tune threshold."""

    def _check_params(self) -> None:
        super()._check_params()
        check_classifier_params(self)

    def _validate(self, dataset: DataFrame) -> None:
        check_input_columns(self, dataset.schema)
        self._check_classes(check_label(dataset, self.getOrDefault("labelCol"),
                                        type(self).__name__, classes=True))

    def _check_classes(self, stats: Any) -> None:
        """What this classifier needs of the label's classes beyond being class indices
        (``stats``: ``_labels.label_aggregates``)."""

    def _fit(self, dataset: DataFrame) -> MLlibModel:
        self._check_params()
        self._validate(dataset)
        metric = self.getThresholdMetric()
        counts = None
        if metric is not None or self.getClassWeight() is not None:
            counts = check_class_counts(
                self, class_counts(dataset, self.getOrDefault("labelCol")))
        fit_rows, holdout = self._holdout(dataset) if metric is not None else (dataset, None)
        weighted, overrides = self._weighted(fit_rows, counts)
        model = cast(_TunedModel, self._model_class(self._fit_mllib(weighted, **overrides)))
        if overrides:  # the working weight column is MLlib's business, not the model's
            inner = model.mllib_inner
            inner.clear(inner.getParam("weightCol"))
        self._copyValues(model)
        if holdout is not None and metric is not None:
            model._tune_threshold(holdout, metric)
        return model

    def _holdout(self, dataset: DataFrame) -> tuple[DataFrame, DataFrame]:
        fraction = self.getValidationFraction()
        parts = split(dataset, {_FIT: 1.0 - fraction, _VALIDATION: fraction},
                      method="stratified", labelCol=self.getOrDefault("labelCol"),
                      seed=self.getSeed())
        return parts[_FIT], parts[_VALIDATION]

    def _weighted(self, dataset: DataFrame,
                  counts: dict[float, int] | None) -> tuple[DataFrame, dict[str, str]]:
        """With classWeight, the rows plus a working weight column and the override that
        points MLlib at it; otherwise the rows as they are."""
        if self.getClassWeight() is None:
            return dataset, {}
        assert counts is not None
        weight = balanced_weight(col(self.getOrDefault("labelCol")).cast("double"), counts)
        user = _user_weight_col(self)
        if user:
            weight = weight * col(user).cast("double")
        return dataset.withColumn(WEIGHT_COL, weight), {"weightCol": WEIGHT_COL}


class _TunedModel(_ModelBase):
    """State of a classifier model whose threshold may have been tuned.

    Attributes
    ----------
    tunedThreshold : float or None
        The threshold chosen on the validation split (None when thresholdMetric was unset).
    validationMetric : float or None
        thresholdMetric at ``tunedThreshold`` on the validation split.
    baselineValidationMetric : float or None
        thresholdMetric at threshold 0.5 on the same rows, for comparison.
    """

    tunedThreshold: float | None = None
    validationMetric: float | None = None
    baselineValidationMetric: float | None = None

    @property
    def mllib_inner(self) -> Any:
        """The fitted MLlib model itself (not a copy), for bookkeeping right after a fit."""
        assert self._inner is not None
        return self._inner

    def _tune_threshold(self, holdout: DataFrame, metric: str) -> None:
        scorer = self.mllib_model
        scorer._set(probabilityCol=_P1, predictionCol="", rawPredictionCol="")
        user = _user_weight_col(self)
        weight = col(user).cast("double") if user else F.lit(1.0)
        thresholds, *counts = confusion_by_threshold(scorer.transform(holdout),
                                                     self.getOrDefault("labelCol"), weight)
        values = metric_values(metric, *counts)
        self.tunedThreshold, self.validationMetric = best_threshold(thresholds, values)
        self.baselineValidationMetric = float(values[_BINS // 2 - 1])  # t = 0.5
        self._apply_threshold(self.tunedThreshold)

    def _apply_threshold(self, threshold: float) -> None:
        """Set both forms MLlib reads: ``thresholds`` (every probabilistic classifier) and,
        where it exists, the binary ``threshold`` (kept consistent with it)."""
        self._set(thresholds=[1.0 - threshold, threshold])
        if self.hasParam("threshold"):
            self._set(threshold=threshold)

    def _state(self) -> dict[str, Any]:
        return {"tunedThreshold": self.tunedThreshold, "validationMetric": self.validationMetric,
                "baselineValidationMetric": self.baselineValidationMetric}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.tunedThreshold = state.get("tunedThreshold")
        self.validationMetric = state.get("validationMetric")
        self.baselineValidationMetric = state.get("baselineValidationMetric")
