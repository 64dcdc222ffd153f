"""LogisticRegression and the random forests on a local Spark session: MLlib Params, Pipelines,
tuning, persistence, class weights, threshold tuning, quality and typed errors."""

from __future__ import annotations

import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml import classification as mllib_classification
from pyspark.ml import regression as mllib_regression
from pyspark.ml.evaluation import BinaryClassificationEvaluator, RegressionEvaluator
from pyspark.ml.functions import array_to_vector, vector_to_array
from pyspark.ml.linalg import Vectors
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder, TrainValidationSplit
from pyspark.sql import functions as F

from sparkdist.datasets import CHURN_COUNTS, CHURN_LABEL
from sparkdist.exceptions import ParamError, SchemaError
from sparkdist.features import FeatureAssembler, split
from sparkdist.models import (
    ALS,
    LogisticRegression,
    LogisticRegressionModel,
    RandomForestClassificationModel,
    RandomForestClassifier,
    RandomForestRegressionModel,
    RandomForestRegressor,
)
from sparkdist.models._classification import _P1, WEIGHT_COL, confusion_by_threshold
from sparkdist.store import PathExistsError

Y = CHURN_LABEL
FAST = {  # small settings; a test passes overrides as keywords
    "lr": lambda **kw: LogisticRegression(**{"labelCol": Y, "maxIter": 10, **kw}),
    "rfc": lambda **kw: RandomForestClassifier(**{"labelCol": Y, "numTrees": 5, "maxDepth": 3,
                                                  **kw}),
    "rfr": lambda **kw: RandomForestRegressor(**{"labelCol": Y, "numTrees": 5, "maxDepth": 3,
                                                 **kw}),
}
CLASSIFIERS = ["lr", "rfc"]
MODEL_TYPES = {"lr": LogisticRegressionModel, "rfc": RandomForestClassificationModel,
               "rfr": RandomForestRegressionModel}


def assembler() -> FeatureAssembler:
    return FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan"], labelCol=Y)


def params_by_name(stage) -> dict:
    return {p.name: v for p, v in stage.extractParamMap().items()}


def predictions(model, df) -> list[tuple]:
    """(id, prediction[, probability]) per row, sorted, for exact comparisons."""
    out = model.transform(df)
    cols = ["customer_id", "prediction"] + (["probability"] if "probability" in out.columns
                                            else [])
    return sorted(tuple(r) for r in out.select(*cols).collect())


def recall(model, df) -> float:
    row = (model.transform(df).where(F.col(Y) == 1.0)
           .agg(F.avg((F.col("prediction") == 1.0).cast("double")).alias("r")).first())
    return row["r"]


def f1(model, df) -> float:
    out = model.transform(df)
    c = out.agg(F.count_if((F.col("prediction") == 1) & (F.col(Y) == 1)).alias("tp"),
                F.count_if((F.col("prediction") == 1) & (F.col(Y) == 0)).alias("fp"),
                F.count_if((F.col("prediction") == 0) & (F.col(Y) == 1)).alias("fn")).first()
    return 2 * c["tp"] / (2 * c["tp"] + c["fp"] + c["fn"])


def job_ids(spark, group: str) -> list[int]:
    return list(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


@pytest.fixture(scope="module")
def raw(churn_df):
    """1,500 raw churn rows (about 30% positive)."""
    df = churn_df.where(F.col("customer_id") < "C0001500").coalesce(2).cache()
    yield df
    df.unpersist()


@pytest.fixture(scope="module")
def assembled(raw):
    df = assembler().fit(raw).transform(raw).cache()
    yield df
    df.unpersist()


@pytest.fixture(scope="module")
def imbalanced(assembled):
    """About 10% positives: every negative and a hashed third of the positives."""
    keep = (F.col(Y) == 0.0) | (F.abs(F.xxhash64("customer_id")) % 3 == 0)
    df = assembled.where(keep).cache()
    yield df
    df.unpersist()


# -- Params ------------------------------------------------------------------------------------
@pytest.mark.parametrize("ours, theirs", [
    (LogisticRegression, mllib_classification.LogisticRegression),
    (RandomForestClassifier, mllib_classification.RandomForestClassifier),
    (RandomForestRegressor, mllib_regression.RandomForestRegressor),
], ids=["lr", "rfc", "rfr"])
def test_mllib_params_keep_names_and_defaults(spark, ours, theirs):
    mine, reference = ours(), theirs()
    for param in reference.params:
        assert mine.hasParam(param.name), param.name
        if param.name != "seed" and reference.hasDefault(param):
            assert mine.getOrDefault(param.name) == reference.getOrDefault(param), param.name
    assert ours().getSeed() == mine.getSeed()  # reproducible default seed


def test_sparkdist_params_defaults_and_setters():
    lr = LogisticRegression()
    assert (lr.getClassWeight(), lr.getThresholdMetric(), lr.getValidationFraction()) == (
        None, None, 0.2)
    lr.setParams(classWeight="balanced", thresholdMetric="f1", regParam=0.1)
    assert (lr.getClassWeight(), lr.getThresholdMetric(), lr.getRegParam()) == (
        "balanced", "f1", 0.1)
    lr.setParams(thresholdMetric=None)  # None is a value of its own for sparkdist's options
    assert lr.getThresholdMetric() is None
    assert LogisticRegression(seed=None).getSeed() == lr.getSeed()  # None = default, as MLlib
    assert LogisticRegression.task == LogisticRegressionModel.task == "classification"
    assert RandomForestRegressor.task == RandomForestRegressionModel.task == "regression"


# -- Pipeline, persistence, copy ------------------------------------------------------------------
def check_accessors(name, model) -> None:
    assert model.numFeatures == len(CHURN_COUNTS)
    if name == "lr":
        assert model.coefficients.size == 3 and isinstance(model.intercept, float)
        assert model.coefficientMatrix.numRows == 1 and model.interceptVector.size == 1
    else:
        assert model.getNumTrees == len(model.trees) == len(model.treeWeights) == 5
        assert model.featureImportances.size == 3
        assert abs(sum(model.featureImportances.toArray()) - 1.0) < 1e-9
    if name != "rfr":
        assert model.numClasses == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAST))
def test_pipeline_persistence_and_copy(raw, tmp_path, name):
    estimator = FAST[name](maxIter=3) if name == "lr" else FAST[name]()
    # Numeric columns only: fewer assembler stages to write and read back.
    numeric = FeatureAssembler(numericCols=CHURN_COUNTS, labelCol=Y)
    fitted = Pipeline(stages=[numeric, estimator]).fit(raw)
    model = fitted.stages[-1]
    assert isinstance(model, MODEL_TYPES[name]) and model.task == estimator.task
    check_accessors(name, model)
    expected = predictions(fitted, raw)

    fitted.save(str(tmp_path / "pipeline"))
    assert predictions(PipelineModel.load(str(tmp_path / "pipeline")), raw) == expected

    features, path = fitted.stages[0].transform(raw), str(tmp_path / "model")
    model.save(path)
    if name == "lr":  # the base class's check, once
        with pytest.raises(PathExistsError, match="already exists"):
            model.save(path)
        model.write().overwrite().save(path)
    loaded = MODEL_TYPES[name].load(path)
    assert params_by_name(loaded) == params_by_name(model)
    assert predictions(loaded, features) == expected
    assert predictions(model.copy(), features) == expected

    estimator.save(str(tmp_path / "estimator"))
    reloaded = type(estimator).load(str(tmp_path / "estimator"))
    assert reloaded.uid == estimator.uid
    assert params_by_name(reloaded) == params_by_name(estimator)
    twin = estimator.copy({estimator.predictionCol: "p2"})
    assert twin.getPredictionCol() == "p2" and estimator.getPredictionCol() == "prediction"


# -- model selection ----------------------------------------------------------------------------
def grid_and_evaluator(name, estimator):
    if name == "lr":
        grid = (ParamGridBuilder().addGrid(estimator.regParam, [0.0, 0.1])
                .addGrid(estimator.maxIter, [2, 3]).build())
    else:
        grid = (ParamGridBuilder().addGrid(estimator.maxDepth, [1, 2])
                .addGrid(estimator.numTrees, [2, 3]).build())
    evaluator = (RegressionEvaluator(labelCol=Y) if name == "rfr"
                 else BinaryClassificationEvaluator(labelCol=Y))
    return grid, evaluator


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAST))
def test_cross_validator_and_train_validation_split(assembled, seed, name):
    data = assembled.where(F.col("customer_id") < "C0000300")
    estimator = FAST[name](maxIter=3) if name == "lr" else FAST[name]()
    grid, evaluator = grid_and_evaluator(name, estimator)
    cv = CrossValidator(estimator=estimator, estimatorParamMaps=grid, evaluator=evaluator,
                        numFolds=2, seed=seed, parallelism=2).fit(data)
    assert len(cv.avgMetrics) == 4 and isinstance(cv.bestModel, MODEL_TYPES[name])
    tvs = TrainValidationSplit(estimator=estimator, estimatorParamMaps=grid, evaluator=evaluator,
                               trainRatio=0.7, seed=seed, parallelism=2).fit(data)
    assert len(tvs.validationMetrics) == 4 and isinstance(tvs.bestModel, MODEL_TYPES[name])


# -- class weights --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CLASSIFIERS)
def test_balanced_class_weight_raises_minority_recall(imbalanced, name):
    plain = FAST[name]().fit(imbalanced)
    balanced = FAST[name](classWeight="balanced").fit(imbalanced)
    assert recall(balanced, imbalanced) > recall(plain, imbalanced) + 0.2
    out = balanced.transform(imbalanced)
    assert WEIGHT_COL not in out.columns and WEIGHT_COL not in imbalanced.columns
    assert not balanced.isDefined(balanced.weightCol)
    assert not balanced.mllib_model.isDefined("weightCol")


def test_balanced_class_weight_multiplies_a_user_weight(imbalanced):
    data = imbalanced.withColumn("w", F.lit(2.0))
    model = FAST["lr"](classWeight="balanced", weightCol="w").fit(data)
    assert model.getWeightCol() == "w" and model.mllib_model.getWeightCol() == "w"
    unweighted = FAST["lr"](classWeight="balanced").fit(imbalanced)
    # A constant user weight scales every row alike, so the fit is the same.
    assert model.coefficients.toArray() == pytest.approx(unweighted.coefficients.toArray(),
                                                         rel=1e-3, abs=1e-4)


def test_balanced_class_weight_with_three_classes(spark):
    rows = [([float(i % 3), float(i % 5)], float(i % 3 if i % 4 else 0)) for i in range(90)]
    df = spark.createDataFrame(rows, "f array<double>, label double").select(
        "label", array_to_vector("f").alias("features"))
    model = LogisticRegression(maxIter=5, classWeight="balanced").fit(df)
    assert model.numClasses == 3


# -- threshold tuning -----------------------------------------------------------------------------
def test_confusion_counts_match_a_direct_count(spark):
    """The one-aggregation histogram gives exactly the counts of ``p1 > t`` per candidate."""
    p1s = [0.0, 0.001, 0.0015, 0.2, 0.5, 0.5004, 0.73, 0.999, 1.0, 0.3]
    labels = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    rows = [([1.0 - p, p], y) for p, y in zip(p1s, labels)]
    df = spark.createDataFrame(rows, "p array<double>, y double").select(
        "y", array_to_vector("p").alias(_P1))
    thresholds, tp, fp, fn, tn = confusion_by_threshold(df, "y", F.lit(1.0))
    for i in [0, 1, 199, 299, 499, 500, 729, 998]:
        t = thresholds[i]
        assert tp[i] == sum(p > t and y == 1 for p, y in zip(p1s, labels)), t
        assert fp[i] == sum(p > t and y == 0 for p, y in zip(p1s, labels)), t
        assert (tp[i] + fn[i], fp[i] + tn[i]) == (sum(labels), len(labels) - sum(labels))


@pytest.mark.slow
def test_f1_threshold_beats_half_on_validation_rows(imbalanced, tmp_path):
    model = FAST["lr"](thresholdMetric="f1").fit(imbalanced)
    assert model.tunedThreshold != 0.5
    assert model.getThreshold() == pytest.approx(model.tunedThreshold)
    assert model.validationMetric > model.baselineValidationMetric

    # The split is deterministic, so the held-out rows can be rebuilt and scored here.
    holdout = split(imbalanced, {"fit": 0.8, "validation": 0.2}, method="stratified",
                    labelCol=Y, seed=model.getSeed())["validation"]
    at_half = model.copy({model.threshold: 0.5, model.thresholds: [0.5, 0.5]})
    assert f1(model, holdout) == pytest.approx(model.validationMetric, abs=1e-9)
    assert f1(model, holdout) > f1(at_half, holdout)
    assert model.copy().tunedThreshold == model.tunedThreshold

    model.save(str(tmp_path / "tuned"))
    loaded = LogisticRegressionModel.load(str(tmp_path / "tuned"))
    assert (loaded.tunedThreshold, loaded.validationMetric, loaded.baselineValidationMetric) == (
        model.tunedThreshold, model.validationMetric, model.baselineValidationMetric)
    assert loaded.getThreshold() == model.getThreshold()


def test_forest_threshold_tuning_with_class_weight(imbalanced):
    model = FAST["rfc"](thresholdMetric="youden", classWeight="balanced").fit(imbalanced)
    t = model.tunedThreshold
    assert model.getThresholds() == pytest.approx([1 - t, t])
    assert model.validationMetric >= model.baselineValidationMetric
    scored = model.transform(imbalanced).select(
        vector_to_array("probability")[1].alias("p1"), "prediction")
    assert scored.where((F.col("p1") > t) != (F.col("prediction") == 1.0)).isEmpty()


# -- quality ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_breast_cancer_accuracy(spark, seed):
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer(as_frame=True).frame
    data.columns = [c.replace(" ", "_") for c in data.columns]
    features = [c for c in data.columns if c != "target"]
    parts = split(spark.createDataFrame(data), {"train": 0.75, "test": 0.25},
                  method="stratified", labelCol="target", seed=seed)
    pipeline = Pipeline(stages=[
        FeatureAssembler(numericCols=features, labelCol="target", standardize=True),
        LogisticRegression(labelCol="target", regParam=0.001, maxIter=50)])
    scored = pipeline.fit(parts["train"]).transform(parts["test"])
    accuracy = scored.agg(F.avg((F.col("prediction") == F.col("target")).cast("double"))).first()
    assert accuracy[0] >= 0.95


@pytest.mark.slow
def test_forest_auc_on_churn(churn_df, seed):
    parts = split(churn_df.where(F.col("customer_id") < "C0004000"),
                  {"train": 0.8, "test": 0.2}, method="stratified", labelCol=Y, seed=seed)
    rf = RandomForestClassifier(labelCol=Y, numTrees=20, maxDepth=5)
    model = Pipeline(stages=[assembler(), rf]).fit(parts["train"])
    auc = BinaryClassificationEvaluator(labelCol=Y).evaluate(model.transform(parts["test"]))
    assert auc > 0.7


# -- bad input: typed errors, raised before any Spark job ---------------------------------
@pytest.mark.parametrize("name, kwargs, error, match", [
    ("lr", {"classWeight": "balance"}, ParamError, "classWeight='balance'.*'balanced'"),
    ("rfc", {"thresholdMetric": "recal"}, ParamError, "thresholdMetric='recal'.*'recall'"),
    ("lr", {"validationFraction": 0.0}, ParamError, "validationFraction=0.0 must be in"),
    ("rfc", {"validationFraction": 1.5}, ParamError, "validationFraction=1.5"),
    ("lr", {"featuresCol": "feature"}, SchemaError, "featuresCol.*'feature'.*'features'"),
    ("rfc", {"labelCol": "cancelled_within_wek"}, SchemaError, "labelCol.*'cancelled_within_week'"),
    ("rfr", {"labelCol": "price"}, SchemaError, "labelCol: column 'price'"),
    ("lr", {"featuresCol": "month_interaction_count"}, SchemaError, "not an ML vector"),
    ("rfc", {"labelCol": "plan"}, SchemaError, "labelCol: column 'plan'.*not numeric"),
    ("lr", {"weightCol": "wieght"}, SchemaError, "weightCol: column 'wieght'"),
])
def test_bad_input_raises_before_any_job(spark, assembled, name, kwargs, error, match):
    params = {"labelCol": Y, **kwargs}
    estimator = {"lr": LogisticRegression, "rfc": RandomForestClassifier,
                 "rfr": RandomForestRegressor}[name](**params)
    group = f"bad-input-{name}-{sorted(kwargs)}"
    spark.sparkContext.setJobGroup(group, "bad input")
    try:
        with pytest.raises(error, match=match):
            estimator.fit(assembled)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert job_ids(spark, group) == []


def test_threshold_metric_refuses_more_than_two_classes(assembled):
    three = assembled.withColumn(Y, F.col("day_interaction_count") % 3)
    with pytest.raises(SchemaError, match=rf"labelCol: column '{Y}' has 3 classes.*"
                                          "thresholdMetric=None"):
        LogisticRegression(labelCol=Y, thresholdMetric="f1").fit(three)


def test_threshold_metric_refuses_a_class_too_small_to_hold_out(assembled):
    tiny = assembled.where((F.col(Y) == 0) | (F.col("customer_id") < "C0000010"))
    with pytest.raises(SchemaError, match="raise validationFraction"):
        RandomForestClassifier(labelCol=Y, thresholdMetric="f1").fit(tiny)


def test_class_weight_refuses_null_labels(assembled):
    nulls = assembled.withColumn(Y, F.when(F.col("customer_id") < "C0000005", None)
                                 .otherwise(F.col(Y)))
    with pytest.raises(SchemaError, match="has 5 null or NaN values"):
        LogisticRegression(labelCol=Y, classWeight="balanced").fit(nulls)


# -- labels and MLlib Param ranges (report D12: F6, F7, F7c, M2b-d, M3) ---------------------
@pytest.mark.parametrize("name, label, params, error, match", [
    ("lr", "IF(x = 0, NULL, y)", {}, SchemaError, "'y' has 4 null or NaN values"),
    ("lr", "IF(x = 0, double('NaN'), y)", {"classWeight": "balanced"}, SchemaError,
     "'y' has 4 null or NaN values"),
    ("rfc", "y - 1", {}, SchemaError, "'y' holds negative values.*class indices"),
    ("lr", "y / 2", {"thresholdMetric": "f1"}, SchemaError, "'y' holds fractional values"),
    ("lr", "x % 3", {"family": "binomial"}, ParamError,
     "family='binomial' fits 2 classes, but labelCol 'y' holds labels up to 2 \\(3 classes"),
    ("rfr", "IF(x = 0, double('-inf'), x)", {}, SchemaError, "'y' has 4 infinite values"),
])
def test_bad_labels_are_typed_errors_before_training(spark, name, label, params, error, match):
    rows = [(Vectors.dense([float(i % 5)]), float(i % 5), float(i % 2)) for i in range(20)]
    df = spark.createDataFrame(rows, ["features", "x", "y"]).withColumn("y", F.expr(label))
    estimator = {"lr": LogisticRegression, "rfc": RandomForestClassifier,
                 "rfr": RandomForestRegressor}[name](labelCol="y", **params)
    with pytest.raises(error, match=match):
        estimator.fit(df)


def test_three_classes_train_with_family_auto(spark):
    rows = [(Vectors.dense([float(i % 3)]), float(i % 3)) for i in range(30)]
    model = LogisticRegression(maxIter=5).fit(spark.createDataFrame(rows, ["features", "label"]))
    assert model.numClasses == 3


@pytest.mark.parametrize("estimator, params, match", [
    (RandomForestClassifier, {"maxDepth": 40}, r"maxDepth=40 is out of range: "
     r"RandomForestClassifier needs maxDepth in \[0, 30\] \(Maximum depth of the tree\)"),
    (LogisticRegression, {"maxIter": -1}, "maxIter=-1 is out of range: LogisticRegression "
     "needs maxIter >= 0"),
    (RandomForestRegressor, {"subsamplingRate": 0.0}, r"subsamplingRate in \(0, 1\]"),
    (RandomForestRegressor, {"impurity": "gini"}, r"impurity one of \['variance'\]"),
    (ALS, {"rank": 0}, "rank=0 is out of range: ALS needs rank >= 1"),
])
def test_mllib_param_ranges_fail_before_any_job(spark, assembled, estimator, params, match):
    group = f"param-range-{sorted(params)}"
    spark.sparkContext.setJobGroup(group, "param range")
    try:
        with pytest.raises(ParamError, match=match):
            estimator(**params).fit(assembled)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert job_ids(spark, group) == []


_PROBES = {
    "maxIter": [-1, 0, 5], "regParam": [-0.1, 0.0], "tol": [-1e-9, 0.0],
    "checkpointInterval": [-2, -1, 0, 1], "elasticNetParam": [-0.1, 0.0, 1.0, 1.1],
    "threshold": [-0.1, 0.0, 1.0, 1.1], "aggregationDepth": [1, 2],
    "maxBlockSizeInMB": [-1.0, 0.0], "family": ["auto", "Binomial", "multinomial", "x"],
    "maxDepth": [-1, 0, 30, 31], "maxBins": [1, 2], "minInstancesPerNode": [0, 1],
    "minInfoGain": [-0.1, 0.0], "maxMemoryInMB": [-1, 0], "numTrees": [0, 1],
    "subsamplingRate": [0.0, 1e-9, 1.0, 1.1], "minWeightFractionPerNode": [-0.1, 0.0, 0.5],
    "impurity": ["gini", "Entropy", "variance", "x"],
    "featureSubsetStrategy": ["auto", "SQRT", "0", "0.5", "1.0", "1.5", "2", "x", "0.0"],
    "rank": [0, 1], "numUserBlocks": [0, 1], "numItemBlocks": [0, 1], "alpha": [-0.1, 0.0],
    "blockSize": [0, 1], "coldStartStrategy": ["nan", "NaN", "drop", "x"],
    "intermediateStorageLevel": ["NONE", "MEMORY_ONLY", "MEMORY_AND_DISK_SER", "x"],
    "finalStorageLevel": ["NONE", "DISK_ONLY_3", "x"],
    "thresholds": [[0.5, 0.5], [0.0, 0.0], [-1.0, 2.0], [0.0, 1.0]],
}


def test_param_rules_agree_with_mllib_validators(spark):
    """sparkdist restates MLlib's JVM validators (so that they run without a session and on
    Spark Connect); every rule must accept exactly what the JVM accepts."""
    from pyspark.ml.common import _py2java
    from pyspark.ml.recommendation import ALS as MLlibALS

    from sparkdist.models._mllib import PARAM_RULES

    assert set(_PROBES) == set(PARAM_RULES)
    gateway = spark.sparkContext._gateway
    checked = 0
    for mllib in (mllib_classification.LogisticRegression(),
                  mllib_classification.RandomForestClassifier(),
                  mllib_regression.RandomForestRegressor(), MLlibALS()):
        for name, values in _PROBES.items():
            if not mllib.hasParam(name):
                continue
            is_valid = mllib._java_obj.getParam(name).isValid()
            for value in values:
                value = mllib.getParam(name).typeConverter(value)
                if isinstance(value, list):  # a Java double[]
                    java = gateway.new_array(gateway.jvm.double, len(value))
                    for i, v in enumerate(value):
                        java[i] = v
                else:
                    java = _py2java(spark.sparkContext, value)
                ours = PARAM_RULES[name](mllib, value) is None
                assert ours == is_valid.apply(java), (type(mllib).__name__, name, value)
                checked += 1
    assert checked > 100
