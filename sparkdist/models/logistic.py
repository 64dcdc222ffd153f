"""Logistic regression: MLlib's optimiser, sparkdist's class weights and threshold tuning.

Every MLlib Param keeps its name and default (the Params mixin is MLlib's own), so the stage
drops into Pipelines, ParamGridBuilder grids and CrossValidator like
``pyspark.ml.classification.LogisticRegression``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pyspark import keyword_only
from pyspark.ml import classification as mllib

from sparkdist.exceptions import ParamError
from sparkdist.models._classification import (
    _ClassWeightParams,
    _ThresholdTuningParams,
    _TunedClassifier,
    _TunedModel,
    set_given,
)
from sparkdist.models._mllib import MLlibEstimator, MLlibModel, delegated


class _LRParams(mllib._LogisticRegressionParams, _ClassWeightParams, _ThresholdTuningParams):
    """MLlib's logistic regression Params plus classWeight, thresholdMetric,
    validationFraction and seed (which only seeds the validation split)."""


class LogisticRegressionModel(_TunedModel, MLlibModel, _LRParams):
    """A fitted :class:`LogisticRegression`; ``transform`` adds rawPrediction, probability and
    prediction columns exactly as MLlib's model does.

    Examples
    --------
    >>> model = LogisticRegression(labelCol="cancelled_within_week",
    ...                            thresholdMetric="f1").fit(assembled_train)
    >>> model.coefficients.size, round(model.intercept, 1)
    (6, 1.0)
    >>> model.getThreshold(), model.validationMetric  # tuned on a validation split
    (0.33..., 0.66...)
    """

    _mllib_model = mllib.LogisticRegressionModel
    task: ClassVar[str] = "classification"

    coefficients = delegated("coefficients", "Coefficient per feature of a binomial model (the "
                             "model's feature weights, for tracking next to a forest's "
                             "``featureImportances``).")
    intercept = delegated("intercept", "Intercept of a binomial model.")
    coefficientMatrix = delegated("coefficientMatrix", "Coefficients, one row per class "
                                  "(multinomial) or one row (binomial).")
    interceptVector = delegated("interceptVector", "Intercepts, one per class (multinomial) or "
                                "one (binomial).")
    numClasses = delegated("numClasses", "Number of classes the model predicts.")
    numFeatures = delegated("numFeatures", "Length of the feature vectors the model expects.")


class LogisticRegression(_TunedClassifier, MLlibEstimator, _LRParams):
    """Logistic regression trained by MLlib, with optional balanced class weights and a
    decision threshold tuned for a metric.

    Parameters
    ----------
    classWeight : None or "balanced"
        "balanced" weights each row ``n / (k * n_class)`` (multiplied into ``weightCol`` when
        set) through a working column that neither the model nor your DataFrame sees.
    thresholdMetric : None or one of "f1", "accuracy", "precision", "recall", "youden"
        Hold out a stratified ``validationFraction`` of the rows (seeded by ``seed``), fit on
        the rest and set the threshold that maximises this metric on the held-out rows.
    validationFraction : float in (0, 1), default 0.2
    seed : int, the validation split's seed (the same seed and data give the same split).

    All other parameters are MLlib's, with MLlib's defaults.

    Examples
    --------
    >>> from pyspark.ml import Pipeline
    >>> from sparkdist.features import FeatureAssembler
    >>> lr = LogisticRegression(labelCol="cancelled_within_week", regParam=0.01,
    ...                         classWeight="balanced", thresholdMetric="f1")
    >>> assembler = FeatureAssembler(numericCols=["month_interaction_count"],
    ...                              categoricalCols=["plan"], labelCol="cancelled_within_week")
    >>> model = Pipeline(stages=[assembler, lr]).fit(train)
    >>> model.stages[-1].getThreshold(), model.stages[-1].validationMetric
    (0.49..., 0.67...)
    """

    _mllib_estimator = mllib.LogisticRegression
    _model_class = LogisticRegressionModel
    task: ClassVar[str] = "classification"

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", labelCol: str = "label",
                 predictionCol: str = "prediction", maxIter: int = 100, regParam: float = 0.0,
                 elasticNetParam: float = 0.0, tol: float = 1e-6, fitIntercept: bool = True,
                 threshold: float = 0.5, thresholds: list[float] | None = None,
                 probabilityCol: str = "probability", rawPredictionCol: str = "rawPrediction",
                 standardization: bool = True, weightCol: str | None = None,
                 family: str = "auto", aggregationDepth: int = 2,
                 classWeight: str | None = None, thresholdMetric: str | None = None,
                 validationFraction: float = 0.2, seed: int | None = None) -> None:
        super().__init__()
        set_given(self, self._input_kwargs)  # type: ignore[attr-defined]

    @keyword_only
    def setParams(self, *, featuresCol: str = "features", labelCol: str = "label",
                  predictionCol: str = "prediction", maxIter: int = 100, regParam: float = 0.0,
                  elasticNetParam: float = 0.0, tol: float = 1e-6, fitIntercept: bool = True,
                  threshold: float = 0.5, thresholds: list[float] | None = None,
                  probabilityCol: str = "probability", rawPredictionCol: str = "rawPrediction",
                  standardization: bool = True, weightCol: str | None = None,
                  family: str = "auto", aggregationDepth: int = 2,
                  classWeight: str | None = None, thresholdMetric: str | None = None,
                  validationFraction: float = 0.2, seed: int | None = None) -> LogisticRegression:
        """Set the given Params (same keywords as the constructor)."""
        return set_given(self, self._input_kwargs)  # type: ignore[attr-defined]

    def _check_classes(self, stats: Any) -> None:
        # MLlib counts max(label) + 1 classes; binomial takes at most 2.
        if self.getFamily().lower() == "binomial" and stats["max"] > 1:
            raise ParamError(
                f"family='binomial' fits 2 classes, but labelCol '{self.getLabelCol()}' holds "
                f"{stats['classes']} classes (up to {stats['max']:g}); use family='auto' or "
                "'multinomial', or make the label binary (0/1).")
