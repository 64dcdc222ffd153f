"""FeatureAssembler on a local Spark session: vector layout, null policies, labels, errors,
pipelines and persistence."""

from __future__ import annotations

import statistics

import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.classification import LogisticRegression
from pyspark.ml.evaluation import BinaryClassificationEvaluator
from pyspark.ml.feature import VectorSlicer
from pyspark.ml.functions import array_to_vector, vector_to_array
from pyspark.sql import functions as F

from sparkdist.datasets import CHURN_COEFFICIENTS, CHURN_COUNTS, CHURN_LABEL, PLANS, REGIONS
from sparkdist.exceptions import ParamError, SchemaError
from sparkdist.features import FeatureAssembler, FeatureAssemblerModel, split

PLAN_NAMES = [f"plan={p}" for p in sorted(PLANS)]
REGION_NAMES = [f"region={r}" for r in sorted(REGIONS)]

#: x numeric with one null, c categorical with one null, y label, other not an input.
NULL_ROWS = [
    (1.0, "a", 1, "k"),
    (2.0, "b", 0, "k"),
    (None, "a", 1, "k"),
    (6.0, None, 0, "k"),
    (3.0, "a", 1, None),
    (4.0, "c", 0, "k"),
    (5.0, "a", 1, "k"),
]
NULL_SCHEMA = "x double, c string, y int, other string"


@pytest.fixture(scope="module")
def small_churn(churn_df):
    """A few hundred churn rows (cached) for tests that collect values."""
    df = churn_df.where(F.col("customer_id") < "C0000400").cache()
    assert df.count() > 100
    yield df
    df.unpersist()


@pytest.fixture(scope="module")
def null_df(spark):
    return spark.createDataFrame(NULL_ROWS, NULL_SCHEMA)


def slots(row, model, prefix):
    return [v for v, n in zip(row["features"], model.featureNames) if n.startswith(prefix)]


# -- vector layout -------------------------------------------------------------------------
def test_vector_size_names_and_passthrough(churn_df, small_churn):
    model = FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan", "region"],
                             labelCol=CHURN_LABEL).fit(churn_df)
    assert isinstance(model, FeatureAssemblerModel)
    assert model.featureNames == CHURN_COUNTS + PLAN_NAMES + REGION_NAMES
    sizes = (model.transform(churn_df)
             .select(F.size(vector_to_array("features")).alias("n")).distinct().collect())
    assert [r["n"] for r in sizes] == [len(model.featureNames)]
    rows = model.transform(small_churn).collect()
    for row in rows:
        features = row["features"].toArray().tolist()
        assert features[:3] == [float(row[c]) for c in CHURN_COUNTS]  # unchanged
        assert slots(row, model, "plan=") == [float(n == f"plan={row['plan']}")
                                              for n in PLAN_NAMES]
        assert slots(row, model, "region=") == [float(n == f"region={row['region']}")
                                                for n in REGION_NAMES]
        assert row[CHURN_LABEL] in (0.0, 1.0)


def test_standardize_numeric_slots(churn_df):
    model = FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan"],
                             standardize=True).fit(churn_df)
    assert model.featureNames == CHURN_COUNTS + PLAN_NAMES
    arr = model.transform(churn_df).withColumn("a", vector_to_array("features"))
    aggs = []
    for i, col in enumerate(CHURN_COUNTS):
        aggs += [F.avg(F.col("a")[i]).alias(f"mean{i}"), F.stddev(F.col("a")[i]).alias(f"sd{i}"),
                 F.avg(col).alias(f"xmean{i}"), F.stddev(col).alias(f"xsd{i}"),
                 F.max(F.abs(F.col("a")[i] * F.stddev(col).over(_all())
                             + F.avg(col).over(_all()) - F.col(col))).alias(f"err{i}")]
    onehot = [F.col("a")[3 + j] for j in range(len(PLANS))]
    aggs += [F.min(sum(onehot)).alias("onehot_min"), F.max(sum(onehot)).alias("onehot_max"),
             F.count_if(F.greatest(*onehot) != 1.0).alias("not_binary")]
    stats = arr.select("*", *_window_free(aggs)).first() if False else _agg(arr, aggs)
    for i, col in enumerate(CHURN_COUNTS):
        assert abs(stats[f"mean{i}"]) < 1e-9, col
        assert stats[f"sd{i}"] == pytest.approx(1.0, abs=1e-9), col
        assert stats[f"err{i}"] < 1e-9, col  # slot = (x - training mean) / training std
    assert stats["onehot_min"] == stats["onehot_max"] == 1.0  # one-hot slots are not scaled
    assert stats["not_binary"] == 0


def _all():
    from pyspark.sql import Window

    return Window.partitionBy()


def _window_free(aggs):  # pragma: no cover - kept for symmetry, never called
    return aggs


def _agg(df, aggs):
    """Aggregations that mix window expressions: evaluate the windows first, then agg."""
    return df.agg(*aggs).first() if not any("over" in str(a) for a in aggs) else _two_step(df)


def _two_step(df):
    raise AssertionError("unreachable")
