"""Logistic regression: MLlib's objective solved by MLlib or by an all-reduce barrier stage,
plus sparkdist's class weights and threshold tuning.

Every MLlib Param keeps its name and default (the Params mixin is MLlib's own), so the stage
drops into Pipelines, ParamGridBuilder grids and CrossValidator like
``pyspark.ml.classification.LogisticRegression``. Both solvers return MLlib's own
``LogisticRegressionModel`` inside sparkdist's, with its training summary.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pyspark import keyword_only
from pyspark.ml import classification as mllib
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.wrapper import JavaModel
from pyspark.sql import DataFrame

from sparkdist._internals import LogisticRegressionParams
from sparkdist.columns import check_one_of
from sparkdist.exceptions import ParamError
from sparkdist.models import _lr_allreduce
from sparkdist.models._accessors_logistic import (
    _LogisticRegressionAccessors,
    _LogisticRegressionModelAccessors,
)
from sparkdist.models._classification import (
    WEIGHT_COL,
    _ClassWeightParams,
    _ThresholdTuningParams,
    _TunedClassifier,
    _TunedModel,
    _user_weight_col,
    set_given,
)
from sparkdist.models._mllib import MLlibEstimator, MLlibModel, copy_shared_params, delegated


class _LRParams(LogisticRegressionParams, _ClassWeightParams, _ThresholdTuningParams):
    """MLlib's logistic regression Params plus solver, classWeight, thresholdMetric,
    validationFraction and seed (which only seeds the validation split)."""

    solver: Param[Any] = Param(
        Params._dummy(), "solver",
        "'auto' (all-reduce where the training rows fit the executors' memory on a classic "
        "session with torch installed, else MLlib), 'allreduce' (one barrier stage: every "
        "rank keeps its partition as a matrix and the gradient is all-reduced; same "
        "objective as MLlib's) or 'mllib' (MLlib's own optimiser, one Spark job per "
        "iteration)",
        typeConverter=TypeConverters.toString,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(solver="auto")

    def getSolver(self) -> str:
        """Gets the value of :py:attr:`solver` or its default ('auto')."""
        return self.getOrDefault(self.solver)


class LogisticRegressionModel(_TunedModel, MLlibModel, _LRParams,
                              _LogisticRegressionModelAccessors):
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
    hasSummary = delegated("hasSummary", "Whether the model carries MLlib's training summary: "
                           "a fitted one does, with either solver; a loaded one does not.")
    summary = delegated("summary", "MLlib's training summary, with either solver: "
                        "objectiveHistory (MLlib's objective, from the starting point), "
                        "totalIterations, and metrics on the training rows (binomial: "
                        "areaUnderROC, roc, ...), computed on first use.")


class LogisticRegression(_TunedClassifier, MLlibEstimator, _LRParams, _LogisticRegressionAccessors):
    """Logistic regression trained by MLlib, with optional balanced class weights and a
    decision threshold tuned for a metric.

    Parameters
    ----------
    solver : "auto" (default), "allreduce" or "mllib"
        "allreduce" solves MLlib's objective (the same coefficients within the solvers'
        tolerance) in one Spark barrier stage: each task holds its partition as a float64
        matrix and the ranks all-reduce loss and gradient (torch.distributed) once per
        evaluation, instead of one Spark job per iteration. It needs a classic session and
        torch, and takes no coefficient bounds. "auto" uses it when the rows fit the memory
        of the executors' Python workers (``rows x (features + classes) x 8 bytes x 3`` per
        task, against ``spark.executor.pyspark.memory``, else ``spark.executor.memory``), and
        MLlib otherwise (the reason is logged); a label with a single class always goes to
        MLlib. That count assumes even partitions: under "auto", a partition found over the
        budget makes the fit repartition the rows evenly and run again (MLlib where they
        were even already); "allreduce" raises ParamError.
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
    _trajectory = {
        **dict.fromkeys((
            "aggregationDepth", "classWeight", "elasticNetParam", "family", "featuresCol",
            "fitIntercept", "labelCol", "lowerBoundsOnCoefficients", "lowerBoundsOnIntercepts",
            "maxBlockSizeInMB", "maxIter", "regParam", "seed", "solver", "standardization",
            "thresholdMetric", "tol", "upperBoundsOnCoefficients", "upperBoundsOnIntercepts",
            "validationFraction", "weightCol"), True),
        **dict.fromkeys(("predictionCol", "probabilityCol", "rawPredictionCol", "threshold",
                         "thresholds"), False),
    }

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", labelCol: str = "label",
                 predictionCol: str = "prediction", maxIter: int = 100, regParam: float = 0.0,
                 elasticNetParam: float = 0.0, tol: float = 1e-6, fitIntercept: bool = True,
                 threshold: float = 0.5, thresholds: list[float] | None = None,
                 probabilityCol: str = "probability", rawPredictionCol: str = "rawPrediction",
                 standardization: bool = True, weightCol: str | None = None,
                 family: str = "auto", aggregationDepth: int = 2,
                 classWeight: str | None = None, thresholdMetric: str | None = None,
                 validationFraction: float = 0.2, seed: int | None = None,
                 solver: str = "auto") -> None:
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
                  validationFraction: float = 0.2, seed: int | None = None,
                  solver: str = "auto") -> LogisticRegression:
        """Set the given Params (same keywords as the constructor)."""
        return set_given(self, self._input_kwargs)  # type: ignore[attr-defined]

    def setSolver(self, value: str) -> LogisticRegression:
        """Sets :py:attr:`solver` ('auto', 'allreduce' or 'mllib')."""
        return self._set(solver=value)

    def _check_params(self) -> None:
        super()._check_params()
        check_one_of("solver", self.getSolver(), _lr_allreduce.SOLVERS)

    def _fit_mllib(self, dataset: DataFrame, **overrides: Any) -> JavaModel:
        inner = copy_shared_params(self, self._mllib_estimator())
        inner._set(**overrides)
        found = _lr_allreduce.plan(self.getSolver(), dataset, inner, self._label_stats)
        if found is None:
            return inner.fit(dataset)
        weight = _user_weight_col(self)
        if overrides.get("weightCol") == WEIGHT_COL:
            weight = f"classWeight x {weight}" if weight else "classWeight"
        return _lr_allreduce.fit(dataset, inner, found, weight, self.getSolver())

    def _check_classes(self, stats: Any) -> None:
        self._label_stats = stats  # rows and label range, for the solver's plan
        # MLlib counts max(label) + 1 classes; binomial takes at most 2.
        if self.getFamily().lower() == "binomial" and stats["max"] > 1:
            raise ParamError(
                f"family='binomial' fits 2 classes, but labelCol '{self.getLabelCol()}' holds "
                f"labels up to {stats['max']:g} ({int(stats['max']) + 1} classes as MLlib "
                "counts them); use family='auto' or 'multinomial', or make the label binary "
                "(0/1).")
