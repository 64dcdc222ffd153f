"""XGBoost estimators on a local[2] session: quality, pipelines and tuning, persistence without
pickle, and typed errors for bad input and oversized num_workers."""

from __future__ import annotations

import base64
import json
import math
import pathlib
import pickle
import sys
import time

import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import BinaryClassificationEvaluator
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.ml.tuning import CrossValidator, CrossValidatorModel
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

from sparkdist.evaluation import evaluate
from sparkdist.exceptions import (
    ClusterConfigError,
    ParamError,
    SchemaError,
    SparkdistError,
    TrainingError,
)
from sparkdist.features import FeatureAssembler, split
from sparkdist.launch import task_slots
from sparkdist.models import (
    XGBoostClassificationModel,
    XGBoostClassifier,
    XGBoostRegressionModel,
    XGBoostRegressor,
)
from sparkdist.models.xgboost import BOOSTER_FILE, ModelLoadError
from sparkdist.persist import data_dir
from tests.sparkjobs import count_jobs

pytestmark = pytest.mark.slow
LABEL = "target"
SPLIT_SEED = 20261201
FAST = {"num_workers": 2, "n_estimators": 20, "max_depth": 3, "verbose": False}


# -- data ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cancer(spark):
    """scikit-learn's breast-cancer data (569 rows, 30 numeric features, binary target)."""
    from sklearn.datasets import load_breast_cancer

    frame = load_breast_cancer(as_frame=True).frame
    frame.columns = [c.replace(" ", "_") for c in frame.columns]
    df = spark.createDataFrame(frame).repartition(2).cache()
    df.count()
    yield df
    df.unpersist()


@pytest.fixture(scope="module")
def cancer_split(cancer):
    parts = split(cancer, {"train": 0.7, "test": 0.3}, method="stratified", labelCol=LABEL,
                  seed=SPLIT_SEED)
    return parts["train"].cache(), parts["test"].cache()


def feature_cols(df):
    return [c for c in df.columns if c != LABEL]


@pytest.fixture(scope="module")
def cancer_model(cancer_split):
    """FeatureAssembler + XGBoostClassifier(num_workers=2), fitted once for the module."""
    train, _ = cancer_split
    pipeline = Pipeline(stages=[
        FeatureAssembler(numericCols=feature_cols(train), labelCol=LABEL),
        XGBoostClassifier(labelCol=LABEL, num_workers=2, n_estimators=100, max_depth=3,
                          learning_rate=0.1, verbose=False),
    ])
    return pipeline.fit(train)


@pytest.fixture(scope="module")
def vectors(spark):
    """Three separable classes in two dimensions: (features, label, y, text)."""
    rows = []
    for i in range(90):
        k = i % 3
        x = (k * 3.0 + (i % 7) * 0.1, (i % 5) * 0.2 - k)
        rows.append((Vectors.dense(x), float(k), 2.0 * x[0] - x[1], f"c{k}"))
    schema = StructType([StructField("features", VectorUDT()), StructField("label", DoubleType()),
                         StructField("y", DoubleType()), StructField("text", StringType())])
    return spark.createDataFrame(rows, schema).cache()


def predictions(model, df, col="probability"):
    return [r[col] for r in model.transform(df).orderBy("features").collect()]


# -- quality, multiclass, regression ---------------------------------------------------------
def test_breast_cancer_auc(cancer_model, cancer_split):
    _, test = cancer_split
    final = cancer_model.stages[-1]
    assert isinstance(final, XGBoostClassificationModel) and final.task == "classification"
    metrics = evaluate(cancer_model, test)
    print(f"breast-cancer test AUC: {metrics['auc']:.4f}")
    assert metrics["auc"] >= 0.98


def test_multiclass(vectors):
    model = XGBoostClassifier(**FAST).fit(vectors)
    out = model.transform(vectors).collect()
    assert len(out[0]["probability"]) == 3 and len(out[0]["rawPrediction"]) == 3
    accuracy = sum(r["prediction"] == r["label"] for r in out) / len(out)
    assert accuracy > 0.95


def test_regressor(vectors):
    model = XGBoostRegressor(labelCol="y", **{**FAST, "n_estimators": 60}).fit(vectors)
    assert isinstance(model, XGBoostRegressionModel) and model.task == "regression"
    metrics = evaluate(model, vectors)
    assert metrics["r2"] > 0.95


# -- Params, pipelines, tuning ---------------------------------------------------------------
def test_params_copy_and_aliases():
    est = XGBoostClassifier(features_col="f", max_depth=4, num_workers=2)
    assert est.getFeaturesCol() == "f" and est.getOrDefault("max_depth") == 4
    assert est.getOrDefault("n_estimators") == 100  # xgboost.spark's default
    assert not est.getOrDefault("force_repartition")  # xgboost.spark's default
    other = est.copy({est.max_depth: 6})
    assert other.getOrDefault("max_depth") == 6 and est.getOrDefault("max_depth") == 4
    assert other.uid == est.uid
    with pytest.raises(TypeError):
        XGBoostClassifier(2)  # keyword-only


def test_repartitions_only_when_a_worker_would_get_no_rows(vectors):
    # xgboost.spark's rule (repartition unless the input has num_workers partitions), plus a
    # repartition when one of them is empty; force_repartition=True always repartitions.
    even = vectors.repartition(2).cache()
    half = even.where(F.spark_partition_id() == 0)  # 2 partitions, the second one empty

    def repartitions(df, **params):
        est = XGBoostClassifier(**{**FAST, **params})
        return est._repartition(df, est._validate(df)[2])

    assert not repartitions(even)
    assert repartitions(half) and repartitions(vectors.repartition(3))
    assert repartitions(even, force_repartition=True)
    assert XGBoostClassifier(**FAST).fit(half).transform(vectors).count() == 90
    even.unpersist()


def test_classifier_runs_no_more_jobs_than_xgboost_spark(spark, vectors):
    # Issue 15: the label checks count the classes that xgboost.spark would count in a job of
    # its own, and xgboost.spark takes that count; on input that needs no repartition the fit
    # runs no more Spark jobs than xgboost.spark's own fit.
    from xgboost.spark import SparkXGBClassifier

    even = vectors.repartition(2).cache()
    even.count()
    ours = count_jobs(spark, lambda: XGBoostClassifier(**FAST).fit(even))
    theirs = count_jobs(spark, lambda: SparkXGBClassifier(**FAST).fit(even))
    even.unpersist()
    assert ours <= theirs, (ours, theirs)


@pytest.mark.parametrize("labels, classes", [("label", 3), ("IF(label = 2, 0, label)", 2),
                                             ("label * 0", 1), ("id % 70", 70)])
def test_class_count_is_xgboost_sparks_own(spark, labels, classes):
    # The count from the label pass (a bit per class index below 63, an exact job above) gives
    # xgboost.spark the training parameters its own count would (objective, num_class).
    df = spark.range(140, numPartitions=2).selectExpr(
        "array(double(id)) AS features", f"double({labels.replace('label', 'id % 3')}) AS label")
    est = XGBoostClassifier(**FAST)
    stats = est._validate(df)[2]
    assert stats["classes"] == classes
    counted = est._xgboost_estimator(classes=stats["classes"])._get_distributed_train_params(df)
    assert counted == est._xgboost_estimator()._get_distributed_train_params(df)


def test_cross_validator_grid_in_pipeline(vectors):
    binary = vectors.where("label < 2")
    xgb = XGBoostClassifier(num_workers=2, verbose=False)
    pipeline = Pipeline(stages=[xgb])
    # Two grid points that differ in both Params: 2 folds x 2 fits + the refit (a 2 x 2 grid
    # proves nothing more and costs 4 distributed fits more).
    grid = [{xgb.max_depth: 2, xgb.n_estimators: 5}, {xgb.max_depth: 3, xgb.n_estimators: 10}]
    cv = CrossValidator(estimator=pipeline, estimatorParamMaps=grid, numFolds=2, seed=3,
                        evaluator=BinaryClassificationEvaluator())
    model = cv.fit(binary)
    assert isinstance(model, CrossValidatorModel) and len(model.avgMetrics) == 2
    best = model.bestModel.stages[-1]
    assert isinstance(best, XGBoostClassificationModel)
    chosen = (best.getOrDefault("max_depth"), best.getOrDefault("n_estimators"))
    assert chosen in ((2, 5), (3, 10))  # a grid point, both Params set by it
    assert all(m > 0.9 for m in model.avgMetrics)


# -- persistence -----------------------------------------------------------------------------
def test_model_and_pipeline_save_load_identical(cancer_model, cancer_split, tmp_path):
    _, test = cancer_split
    features = cancer_model.stages[0].transform(test).cache()
    model = cancer_model.stages[-1]
    model.write().save(str(tmp_path / "model"))
    booster = pathlib.Path(data_dir(str(tmp_path / "model"))) / BOOSTER_FILE
    assert booster.read_bytes()[:1] == b"{"
    loaded = XGBoostClassificationModel.load(str(tmp_path / "model"))
    assert loaded.uid == model.uid and loaded.getOrDefault("max_depth") == 3
    assert predictions(loaded, features) == predictions(model, features)

    cancer_model.write().save(str(tmp_path / "pipeline"))
    reloaded = PipelineModel.load(str(tmp_path / "pipeline"))
    assert isinstance(reloaded.stages[-1], XGBoostClassificationModel)
    got = [r["probability"] for r in reloaded.transform(test).orderBy("mean_radius").collect()]
    want = [r["probability"] for r in cancer_model.transform(test).orderBy("mean_radius")
            .collect()]
    assert got == want


def test_estimator_save_load_identical(vectors, tmp_path):
    binary = vectors.where("label < 2")
    est = XGBoostClassifier(num_workers=1, n_estimators=8, max_depth=2, verbose=False,
                            monotone_constraints="(1,0)")
    est.write().save(str(tmp_path / "est"))
    loaded = XGBoostClassifier.load(str(tmp_path / "est"))
    assert loaded.uid == est.uid
    assert loaded.getOrDefault("monotone_constraints") == "(1,0)"
    assert math.isnan(loaded.getOrDefault("missing"))
    Pipeline(stages=[est]).write().save(str(tmp_path / "pipeline"))
    stage = Pipeline.load(str(tmp_path / "pipeline")).getStages()[0]
    assert isinstance(stage, XGBoostClassifier) and stage.getOrDefault("max_depth") == 2
    assert predictions(loaded.fit(binary), binary) == predictions(est.fit(binary), binary)


def test_unsaveable_params_refused_before_writing(cancer_model, tmp_path):
    est = XGBoostClassifier(callbacks=[object()])
    with pytest.raises(ParamError, match="callbacks.*JSON"):
        est.write().save(str(tmp_path / "est"))
    model = cancer_model.stages[-1].copy({cancer_model.stages[-1].monotone_constraints: {1}})
    with pytest.raises(ParamError, match="monotone_constraints"):
        model.write().save(str(tmp_path / "model"))
    assert list(tmp_path.iterdir()) == []


class _Payload:
    """Unpickling this creates the marker file."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def _pickled(marker):
    return pickle.dumps(_Payload(marker))


def _rewrite_metadata(path: pathlib.Path, change) -> None:
    part = next((path / "metadata").glob("part-*"))
    metadata = json.loads(part.read_text())
    change(metadata)
    part.write_text(json.dumps(metadata))
    for crc in (path / "metadata").glob(".*.crc"):
        crc.unlink()


@pytest.fixture
def saved(cancer_model, tmp_path):
    path = tmp_path / "model"
    cancer_model.stages[-1].write().save(str(path))
    return path


@pytest.fixture
def marker(tmp_path):
    marker = tmp_path / "PICKLE_RAN"
    pickle.loads(_pickled(marker))  # the payload is live: unpickling it creates the marker
    assert marker.exists()
    marker.unlink()
    return marker


def test_planted_pickles_are_never_executed(saved, marker, cancer_model, cancer_split):
    payload = base64.encodebytes(_pickled(marker)).decode("ascii")

    def plant(metadata):  # inert places: refused fields are tested below
        metadata["sparkdistState"]["payload"] = payload
    _rewrite_metadata(saved, plant)
    for name in ("model/part-00000", "init_booster.json/part-00000", "callbacks.pkl"):
        (saved / name).parent.mkdir(parents=True, exist_ok=True)
        (saved / name).write_bytes(_pickled(marker))
    loaded = XGBoostClassificationModel.load(str(saved))
    features = cancer_model.stages[0].transform(cancer_split[1])
    assert predictions(loaded, features) == predictions(cancer_model.stages[-1], features)
    assert not marker.exists()


@pytest.mark.parametrize("where", ["serialized_callbacks", "extra-field", "paramMap",
                                   "metadata", "booster", "booster-brace"])
def test_pickle_carriers_are_refused(saved, marker, where):
    payload = base64.encodebytes(_pickled(marker)).decode("ascii")
    if where == "serialized_callbacks":
        _rewrite_metadata(saved, lambda m: m.update(serialized_callbacks=payload))
    elif where == "extra-field":
        _rewrite_metadata(saved, lambda m: m.update(pickled=payload))
    elif where == "paramMap":
        _rewrite_metadata(saved, lambda m: m["paramMap"].update(callbacks=payload))
    elif where == "metadata":
        next((saved / "metadata").glob("part-*")).write_bytes(_pickled(marker))
    else:
        prefix = b"{" if where == "booster-brace" else b""
        (pathlib.Path(data_dir(str(saved))) / BOOSTER_FILE).write_bytes(prefix + _pickled(marker))
    with pytest.raises(ModelLoadError):
        XGBoostClassificationModel.load(str(saved))
    assert not marker.exists()


def test_estimator_refuses_planted_callbacks(spark, marker, tmp_path):
    path = tmp_path / "est"
    XGBoostClassifier(max_depth=2).write().save(str(path))
    payload = base64.encodebytes(_pickled(marker)).decode("ascii")
    _rewrite_metadata(path, lambda m: m["paramMap"].update(callbacks=payload))
    with pytest.raises(ModelLoadError, match="callbacks"):
        XGBoostClassifier.load(str(path))
    assert not marker.exists()


def test_foreign_directories_are_refused(cancer_model, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="not a saved sparkdist.*no metadata"):
        XGBoostClassificationModel.load(str(tmp_path / "empty"))
    with pytest.raises(SparkdistError, match="no metadata"):
        XGBoostClassifier.load(str(tmp_path / "missing"))
    native = str(tmp_path / "native")
    cancer_model.stages[-1].xgboost_model.write().save(native)  # xgboost.spark's own format
    with pytest.raises(ModelLoadError, match="xgboost.spark"):
        XGBoostClassificationModel.load(native)
    with pytest.raises(ModelLoadError, match="FeatureAssemblerModel"):
        cancer_model.stages[0].write().save(str(tmp_path / "assembler"))
        XGBoostRegressionModel.load(str(tmp_path / "assembler"))


# -- bad input -------------------------------------------------------------------------------
def test_num_workers_beyond_slots_fails_fast(spark, vectors):
    assert task_slots(spark) == 2
    started = time.monotonic()
    with pytest.raises(ClusterConfigError) as info:
        XGBoostClassifier(num_workers=8).fit(vectors)
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert "num_workers=8" in message and "2 task slots" in message
    assert "spark.executor.instances" in message


@pytest.mark.parametrize("params, match", [
    ({"max_dept": 3}, "Did you mean 'max_depth'"),
    ({"numWorkers": 2}, "Did you mean 'num_workers'"),
    ({"objective": "multi:softmax"}, "picks the objective"),
    ({"max_depth": "deep"}, "max_depth"),
])
def test_bad_constructor_params(params, match):
    with pytest.raises(ParamError, match=match):
        XGBoostClassifier(**params)


@pytest.mark.parametrize("params, match", [
    ({"device": "tpu"}, "device='tpu'"),
    ({"num_workers": 0}, "num_workers=0"),
    ({"tree_method": "exact"}, "exact"),
    ({"early_stopping_rounds": 3}, "validation"),
])
def test_bad_param_values_fail_before_spark_jobs(vectors, params, match):
    with pytest.raises(ParamError, match=match):
        XGBoostClassifier(**params).fit(vectors)


@pytest.mark.parametrize("est, match", [
    (XGBoostClassifier(featuresCol="feature"), "Did you mean 'features'"),
    (XGBoostClassifier(labelCol="labl"), "Did you mean 'label'"),
    (XGBoostRegressor(labelCol="text"), "not numeric"),
    (XGBoostClassifier(featuresCol="y"), "vector"),
    (XGBoostClassifier(weightCol="text"), "numeric"),
    (XGBoostClassifier(labelCol="y"), "class indices"),
])
def test_bad_columns(vectors, est, match):
    with pytest.raises(SchemaError, match=match):
        est.fit(vectors)


def test_bad_labels(spark, vectors):
    shifted = vectors.selectExpr("features", "label + 1 AS label")  # classes 1, 2, 3
    with pytest.raises(SchemaError, match="class indices 0..2"):
        XGBoostClassifier().fit(shifted)
    nulls = vectors.selectExpr("features", "IF(label = 1, NULL, label) AS label")
    with pytest.raises(SchemaError, match="null or NaN"):
        XGBoostRegressor().fit(nulls)
    with pytest.raises(SchemaError, match="empty"):
        XGBoostRegressor().fit(vectors.limit(0))


def test_worker_failure_is_a_training_error_with_the_cause(vectors):
    with pytest.raises(TrainingError, match="reg:nonexistent"):
        XGBoostRegressor(labelCol="y", num_workers=1, objective="reg:nonexistent").fit(vectors)


def test_missing_xgboost_names_the_extra(vectors, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgboost", None)
    monkeypatch.setitem(sys.modules, "xgboost.spark", None)
    with pytest.raises(ImportError, match=r'pip install "sparkdist\[xgboost\]"'):
        XGBoostClassifier().fit(vectors)


def test_infinite_label_is_a_schema_error_before_training(vectors):
    """Report M1e: an inf label was a 3 KB TrainingError ending in a native backtrace."""
    inf = vectors.selectExpr("features", "IF(label = 1, double('inf'), y) AS y")
    with pytest.raises(SchemaError, match="labelCol: column 'y' has 30 infinite values; drop "
                                          "or clip those rows"):
        XGBoostRegressor(labelCol="y").fit(inf)
