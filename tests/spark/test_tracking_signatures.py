"""MLflow's own scoring paths on every model kind the workflows log (issue 30), with real
MLflow on a sqlite store: the churn workflow's pipelines (the FeatureAssembler and logistic
regression, a random forest, XGBoost or a TorchEstimator MLP) and the ratings workflow's ALS,
logged by ``tracking.log_model_run`` with 5 rows of their data as the workflows log them, carry
a signature (the columns each reads, typed; ``prediction``, ``double``) and a 5-row input
example; ``mlflow.pyfunc.load_model(uri).predict(pandas)``, loading from the model registry and
``mlflow.pyfunc.spark_udf`` called by column name score as the Spark model's ``transform``."""

from __future__ import annotations

import pandas as pd
import pytest
from pyspark.ml import Pipeline
from pyspark.sql import functions as F

from sparkdist import tracking
from sparkdist.datasets import CHURN_LABEL, make_ratings
from sparkdist.features import FeatureAssembler
from sparkdist.models import (
    ALS,
    LogisticRegression,
    RandomForestClassifier,
    TorchEstimator,
    XGBoostClassifier,
)

mlflow = pytest.importorskip("mlflow")

#: The churn workflow's models, small: a forest of 5 trees, one epoch of the MLP.
CHURN_MODELS = {
    "LogisticRegression": lambda: LogisticRegression(maxIter=5),
    "RandomForestClassifier": lambda: RandomForestClassifier(numTrees=5, maxDepth=3, seed=1),
    "XGBoostClassifier": lambda: XGBoostClassifier(num_workers=1, n_estimators=5),
    "TorchEstimator": lambda: TorchEstimator(numWorkers=1, epochs=1, batchSize=64, seed=1,
                                             progress=False, modelKwargs={"hidden": [8]}),
}
#: What each churn model reads: the FeatureAssembler's columns, typed by the data
#: (day_interaction_count is a bigint column here: long; the int columns: double).
CHURN_INPUTS = [("month_interaction_count", "double"), ("week_interaction_count", "double"),
                ("day_interaction_count", "long"), ("plan", "string"), ("region", "string")]
KINDS = [*CHURN_MODELS, "ALS"]


@pytest.fixture(scope="module")
def logged(spark, churn_df, cached, tmp_path_factory):
    """{kind: (the fitted PipelineModel, its run id)}, the churn and the ratings data."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('signatures')}/mlruns.db"
    churn = (churn_df.where(F.col("customer_id") < "C0000400").drop("signup_ts")
             .withColumn("day_interaction_count", F.col("day_interaction_count").cast("bigint")))
    ratings = spark.createDataFrame(make_ratings(n_users=40, n_items=20, seed=1))
    features = FeatureAssembler(numericCols=[c for c, _ in CHURN_INPUTS[:3]],
                                categoricalCols=["plan", "region"], labelCol=CHURN_LABEL,
                                standardize=True)
    with cached(churn) as churn, cached(ratings) as ratings:
        fitted = {kind: Pipeline(stages=[features, make().setLabelCol(CHURN_LABEL)]).fit(churn)
                  for kind, make in CHURN_MODELS.items()}
        als = ALS(userCol="user_id", itemCol="item_id", rank=4, maxIter=3, seed=1)
        fitted["ALS"] = Pipeline(stages=[als]).fit(ratings)
        churn_rows, ratings_rows = churn.limit(5).toPandas(), ratings.limit(5).toPandas()
        models = {}
        with tracking.workflow_run("signatures", "workflow", uri=uri):
            for kind, model in fitted.items():
                rows = ratings_rows if kind == "ALS" else churn_rows  # as the workflows do
                models[kind] = (model, tracking.log_model_run(kind, {}, {}, model, [], {}, {},
                                                              rows=rows))
        mlflow.set_tracking_uri(uri)
        yield models, churn, ratings


@pytest.fixture(scope="module")
def frame(spark, logged):
    """8 churn rows and 8 ratings rows side by side (ids the ALS model knows), one
    partition, numbered: every model's input columns in one frame."""
    models, churn, ratings = logged
    als = models["ALS"][0].stages[-1]
    known = (ratings.join(als.userFactors.select("user_id"), "user_id")
             .join(als.itemFactors.select("item_id"), "item_id"))
    rows = pd.concat([churn.limit(8).toPandas(), known.limit(8).toPandas()], axis=1)
    return spark.createDataFrame(rows.assign(row=range(8))).coalesce(1)


def _columns(schema) -> list[tuple[str, str]]:
    return [(spec["name"], spec["type"]) for spec in schema.to_dict()]


def _transformed(model, frame) -> list[float]:
    """The Spark model's predictions for ``frame``'s rows, in their order."""
    return [r.prediction for r in model.transform(frame).orderBy("row").collect()]


@pytest.mark.parametrize("kind", KINDS)
def test_each_model_is_signed_with_the_columns_it_reads_and_an_example(logged, kind):
    model, run_id = logged[0][kind]
    info = mlflow.models.get_model_info(f"runs:/{run_id}/model")
    inputs = [("user_id", "string"), ("item_id", "string")] if kind == "ALS" else CHURN_INPUTS
    assert _columns(info.signature.inputs) == inputs
    assert _columns(info.signature.outputs) == [("prediction", "double")]
    example = mlflow.artifacts.load_dict(f"runs:/{run_id}/model/input_example.json")
    assert example["columns"] == [name for name, _ in inputs] and len(example["data"]) == 5
    if kind != "ALS":  # without the FeatureAssembler: the features vector
        alone = tracking._signature(model.stages[-1])
        assert _columns(alone.inputs) == [("features", "sparkml_vector")]


def test_als_ids_are_signed_as_fitted(spark):
    from mlflow.types import DataType

    ids = spark.createDataFrame([(1, 2, "a")], "user int, item bigint, name string")
    assert [tracking._id_input(ids, c) for c in ids.columns] == [
        ("user", DataType.long), ("item", DataType.long), ("name", DataType.string)]


@pytest.mark.parametrize("kind", KINDS)
def test_pyfunc_from_the_registry_predicts_pandas_as_the_spark_model(logged, frame, kind):
    model, run_id = logged[0][kind]
    version = mlflow.register_model(f"runs:/{run_id}/model", f"sparkdist-{kind}")
    assert version.run_id == run_id
    pyfunc = mlflow.pyfunc.load_model(f"models:/sparkdist-{kind}/{version.version}")
    rows = frame.orderBy("row").toPandas()  # every column: the pyfunc reads its own
    assert list(pyfunc.predict(rows)) == pytest.approx(_transformed(model, frame))


@pytest.mark.slow  # MLflow starts a Spark in the Python worker: 75-130 s at load 4-9
def test_spark_udf_by_column_name_scores_as_the_spark_model(spark, logged, frame):
    """Each model's UDF with its signature's columns (the usual batch path), in one job: MLflow
    loads a Spark model in the Python worker's own local Spark session, started once."""
    models = logged[0]
    scored = {}
    for kind in KINDS:
        uri = f"runs:/{models[kind][1]}/model"
        udf = mlflow.pyfunc.spark_udf(spark, uri, env_manager="local")
        names = mlflow.models.get_model_info(uri).signature.inputs.input_names()
        if kind == "LogisticRegression":  # no columns: the signature's names, from the frame
            scored[kind] = udf()
        elif kind == "ALS":  # a struct: its field names
            scored[kind] = udf(F.struct(*names))
        else:
            scored[kind] = udf(*[F.col(name) for name in names])
    rows = frame.select("row", *[column.alias(kind) for kind, column in scored.items()])
    got = rows.orderBy("row").toPandas()
    for kind in KINDS:
        assert list(got[kind]) == pytest.approx(_transformed(models[kind][0], frame)), kind


def test_als_scores_unknown_ids_as_its_cold_start_strategy_says(logged, frame):
    """The pyfunc returns what transform keeps: under "drop" (the default) no prediction for
    a pair of unknown ids, under "nan" NaN in its place."""
    model, run_id = logged[0]["ALS"]
    rows = frame.orderBy("row").limit(3).toPandas()[["user_id", "item_id"]]
    rows.loc[1, "user_id"] = "nobody"
    dropping = mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(rows)
    assert len(dropping) == 2
    nan = model.copy()
    nan.stages[-1].setColdStartStrategy("nan")
    with tracking.workflow_run("signatures", "nan", uri=mlflow.get_tracking_uri()):
        nan_run = tracking.log_model_run("ALS", {}, {}, nan, [], {}, {}, rows=rows)
    scored = mlflow.pyfunc.load_model(f"runs:/{nan_run}/model").predict(rows)
    assert len(scored) == 3 and pd.isna(scored[1])
    assert [scored[0], scored[2]] == pytest.approx(dropping)
