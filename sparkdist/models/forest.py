"""Random forests: MLlib's tree learner; the classifier adds sparkdist's class weights and
threshold tuning (shared with logistic regression in ``_classification``).

Every MLlib Param keeps its name and default. One difference from MLlib: ``seed`` defaults to
a value that is the same in every process (MLlib's default hashes the class name, which Python
randomises per process), so an unseeded forest is reproducible.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pyspark import keyword_only
from pyspark.ml import classification as mllib_classification
from pyspark.ml import regression as mllib_regression
from pyspark.sql import DataFrame

from sparkdist._internals import (
    PredictorParams,
    ProbabilisticClassifierParams,
    RandomForestClassifierParams,
    RandomForestRegressorParams,
)
from sparkdist._params import stable_seed
from sparkdist.models._accessors_forest import (
    _RandomForestClassificationModelAccessors,
    _RandomForestClassifierAccessors,
    _RandomForestRegressionModelAccessors,
    _RandomForestRegressorAccessors,
)
from sparkdist.models._classification import (
    _ClassWeightParams,
    _ThresholdTuningParams,
    _TunedClassifier,
    _TunedModel,
    check_input_columns,
    set_given,
)
from sparkdist.models._labels import check_label
from sparkdist.models._mllib import MLlibEstimator, MLlibModel, delegated


class _RFClassifierParams(ProbabilisticClassifierParams, RandomForestClassifierParams,
                          _ClassWeightParams, _ThresholdTuningParams):
    """MLlib's random forest classifier Params (column names included) plus classWeight,
    thresholdMetric and validationFraction."""


class _RFRegressorParams(PredictorParams, RandomForestRegressorParams):
    """MLlib's random forest regressor Params (column names included), with a
    process-independent default seed."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(seed=stable_seed(type(self).__name__))


#: The Params of both forests by the fingerprint policy (see ``MLlibEstimator``): the
#: caching and output Params do not shape the ensemble.
_FOREST_TRAJECTORY: dict[str, bool] = {
    **dict.fromkeys((
        "bootstrap", "featureSubsetStrategy", "featuresCol", "impurity", "labelCol", "maxBins",
        "maxDepth", "maxMemoryInMB", "minInfoGain", "minInstancesPerNode",
        "minWeightFractionPerNode", "numTrees", "seed", "subsamplingRate", "weightCol"), True),
    **dict.fromkeys(("cacheNodeIds", "checkpointInterval", "leafCol", "predictionCol"), False),
}


class _ForestModel:
    """What both forest models expose from the fitted MLlib ensemble."""

    featureImportances = delegated("featureImportances", "Importance of each feature, averaged "
                                   "over the trees and normalised to sum to 1.")
    numFeatures = delegated("numFeatures", "Length of the feature vectors the model expects.")
    trees = delegated("trees", "The fitted decision trees (MLlib tree models).")
    # a property, as on MLlib's forest models
    getNumTrees = delegated("getNumTrees", "Number of trees in the ensemble.")
    treeWeights = delegated("treeWeights", "The weight of each tree's vote.")


# getNumTrees is a property on MLlib's forest models too (it shadows the Param getter there).
class RandomForestClassificationModel(_ForestModel, _TunedModel, MLlibModel,  # type: ignore[misc]
                                      _RFClassifierParams,
                                      _RandomForestClassificationModelAccessors):
    """A fitted :class:`RandomForestClassifier`.

    Examples
    --------
    >>> model = RandomForestClassifier(labelCol="cancelled_within_week", numTrees=5,
    ...                                maxDepth=3, seed=0).fit(assembled_train)
    >>> model.getNumTrees, model.numClasses, model.numFeatures
    (5, 2, 6)
    >>> model.featureImportances  # month, week, day counts, then plan=basic, premium, standard
    SparseVector(6, {0: 0.35..., 1: 0.49..., 2: 0.05..., 3: 0.09...})
    """

    _mllib_model = mllib_classification.RandomForestClassificationModel
    task: ClassVar[str] = "classification"
    numClasses = delegated("numClasses", "Number of classes the model predicts.")


class RandomForestRegressionModel(_ForestModel, MLlibModel,  # type: ignore[misc]
                                  _RFRegressorParams, _RandomForestRegressionModelAccessors):
    """A fitted :class:`RandomForestRegressor`.

    Examples
    --------
    >>> model = RandomForestRegressor(labelCol="cancelled_within_week", numTrees=5, maxDepth=3,
    ...                               seed=0).fit(assembled_train)  # a 0/1 label: P(churn)
    >>> model.getNumTrees, model.numFeatures
    (5, 6)
    >>> model.transform(assembled_test).select("prediction").first()
    Row(prediction=0.08...)
    """

    _mllib_model = mllib_regression.RandomForestRegressionModel
    task: ClassVar[str] = "regression"


class RandomForestClassifier(_TunedClassifier, MLlibEstimator, _RFClassifierParams,
                             _RandomForestClassifierAccessors):
    """A random forest classifier trained by MLlib, with optional balanced class weights and a
    decision threshold tuned for a metric (binary labels).

    Parameters
    ----------
    classWeight : None or "balanced"
        "balanced" weights each row ``n / (k * n_class)`` (multiplied into ``weightCol`` when
        set) through a working column that neither the model nor your DataFrame sees.
    thresholdMetric : None or one of "f1", "accuracy", "precision", "recall", "youden"
        Hold out a stratified ``validationFraction`` of the rows (seeded by ``seed``), fit on
        the rest and set ``thresholds=[1 - t, t]`` for the ``t`` that maximises this metric on
        the held-out rows.
    validationFraction : float in (0, 1), default 0.2

    All other parameters are MLlib's, with MLlib's defaults; ``seed`` seeds both the forest
    and the validation split.

    Examples
    --------
    >>> rf = RandomForestClassifier(labelCol="cancelled_within_week", numTrees=10, maxDepth=4,
    ...                             classWeight="balanced", thresholdMetric="f1", seed=0)
    >>> model = rf.fit(assembled_train)
    >>> model.getThresholds(), model.validationMetric  # tuned on a validation split
    ([0.414..., 0.586...], 0.63...)
    >>> model.transform(assembled_test).select("probability", "prediction").first()
    Row(probability=DenseVector([0.89..., 0.10...]), prediction=0.0)
    """

    _mllib_estimator = mllib_classification.RandomForestClassifier
    _trajectory = {**_FOREST_TRAJECTORY, "classWeight": True, "thresholdMetric": True,
                   "validationFraction": True, "pruneTree": True, "probabilityCol": False,
                   "rawPredictionCol": False, "thresholds": False}
    _model_class = RandomForestClassificationModel
    task: ClassVar[str] = "classification"

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", labelCol: str = "label",
                 predictionCol: str = "prediction", probabilityCol: str = "probability",
                 rawPredictionCol: str = "rawPrediction", maxDepth: int = 5, maxBins: int = 32,
                 minInstancesPerNode: int = 1, minInfoGain: float = 0.0, pruneTree: bool = True,
                 maxMemoryInMB: int = 256, cacheNodeIds: bool = False,
                 checkpointInterval: int = 10, impurity: str = "gini", numTrees: int = 20,
                 featureSubsetStrategy: str = "auto", seed: int | None = None,
                 subsamplingRate: float = 1.0, leafCol: str = "",
                 minWeightFractionPerNode: float = 0.0, weightCol: str | None = None,
                 bootstrap: bool = True, thresholds: list[float] | None = None,
                 classWeight: str | None = None, thresholdMetric: str | None = None,
                 validationFraction: float = 0.2) -> None:
        super().__init__()
        set_given(self, self._input_kwargs)  # type: ignore[attr-defined]

    @keyword_only
    def setParams(self, *, featuresCol: str = "features", labelCol: str = "label",
                  predictionCol: str = "prediction", probabilityCol: str = "probability",
                  rawPredictionCol: str = "rawPrediction", maxDepth: int = 5, maxBins: int = 32,
                  minInstancesPerNode: int = 1, minInfoGain: float = 0.0, pruneTree: bool = True,
                  maxMemoryInMB: int = 256, cacheNodeIds: bool = False,
                  checkpointInterval: int = 10, impurity: str = "gini", numTrees: int = 20,
                  featureSubsetStrategy: str = "auto", seed: int | None = None,
                  subsamplingRate: float = 1.0, leafCol: str = "",
                  minWeightFractionPerNode: float = 0.0, weightCol: str | None = None,
                  bootstrap: bool = True, thresholds: list[float] | None = None,
                  classWeight: str | None = None, thresholdMetric: str | None = None,
                  validationFraction: float = 0.2) -> RandomForestClassifier:
        """Set the given Params (same keywords as the constructor)."""
        return set_given(self, self._input_kwargs)  # type: ignore[attr-defined]


class RandomForestRegressor(MLlibEstimator, _RFRegressorParams, _RandomForestRegressorAccessors):
    """A random forest regressor trained by MLlib.

    All parameters are MLlib's, with MLlib's defaults (``seed`` excepted, see the module).

    Examples
    --------
    >>> from pyspark.ml import Pipeline
    >>> from sparkdist.features import FeatureAssembler
    >>> rf = RandomForestRegressor(labelCol="month_interaction_count", numTrees=10, maxDepth=4,
    ...                            seed=0)
    >>> model = Pipeline(stages=[
    ...     FeatureAssembler(numericCols=["week_interaction_count", "day_interaction_count"],
    ...                      labelCol="month_interaction_count"), rf]).fit(train)
    >>> model.stages[-1].featureImportances
    SparseVector(2, {0: 0.79..., 1: 0.20...})
    """

    _mllib_estimator = mllib_regression.RandomForestRegressor
    _trajectory = _FOREST_TRAJECTORY
    _model_class = RandomForestRegressionModel
    task: ClassVar[str] = "regression"

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", labelCol: str = "label",
                 predictionCol: str = "prediction", maxDepth: int = 5, maxBins: int = 32,
                 minInstancesPerNode: int = 1, minInfoGain: float = 0.0,
                 maxMemoryInMB: int = 256, cacheNodeIds: bool = False,
                 checkpointInterval: int = 10, impurity: str = "variance",
                 subsamplingRate: float = 1.0, seed: int | None = None, numTrees: int = 20,
                 featureSubsetStrategy: str = "auto", leafCol: str = "",
                 minWeightFractionPerNode: float = 0.0, weightCol: str | None = None,
                 bootstrap: bool = True) -> None:
        super().__init__()
        set_given(self, self._input_kwargs)  # type: ignore[attr-defined]

    @keyword_only
    def setParams(self, *, featuresCol: str = "features", labelCol: str = "label",
                  predictionCol: str = "prediction", maxDepth: int = 5, maxBins: int = 32,
                  minInstancesPerNode: int = 1, minInfoGain: float = 0.0,
                  maxMemoryInMB: int = 256, cacheNodeIds: bool = False,
                  checkpointInterval: int = 10, impurity: str = "variance",
                  subsamplingRate: float = 1.0, seed: int | None = None, numTrees: int = 20,
                  featureSubsetStrategy: str = "auto", leafCol: str = "",
                  minWeightFractionPerNode: float = 0.0, weightCol: str | None = None,
                  bootstrap: bool = True) -> RandomForestRegressor:
        """Set the given Params (same keywords as the constructor)."""
        return set_given(self, self._input_kwargs)  # type: ignore[attr-defined]

    def _validate(self, dataset: DataFrame) -> None:
        check_input_columns(self, dataset.schema)
        check_label(dataset, self.getOrDefault("labelCol"), type(self).__name__, classes=False)
