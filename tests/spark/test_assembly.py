"""FeatureAssembler on a local Spark session: vector layout, null policies, labels, errors,
pipelines and persistence."""

from __future__ import annotations

import math
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


@pytest.mark.slow
def test_standardize_numeric_slots(churn_df):
    model = FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan"],
                             standardize=True).fit(churn_df)
    assert model.featureNames == CHURN_COUNTS + PLAN_NAMES
    raw = churn_df.agg(*[F.avg(c).alias(f"m{i}") for i, c in enumerate(CHURN_COUNTS)],
                       *[F.stddev(c).alias(f"s{i}") for i, c in enumerate(CHURN_COUNTS)]).first()
    a = F.col("a")
    aggs = []
    for i, col in enumerate(CHURN_COUNTS):
        back = a[i] * F.lit(raw[f"s{i}"]) + F.lit(raw[f"m{i}"])  # undo the scaling
        aggs += [F.avg(a[i]).alias(f"mean{i}"), F.stddev(a[i]).alias(f"sd{i}"),
                 F.max(F.abs(back - F.col(col))).alias(f"err{i}")]
    onehot = [a[len(CHURN_COUNTS) + j] for j in range(len(PLANS))]
    total = sum(onehot[1:], onehot[0])
    aggs += [F.min(total).alias("onehot_min"), F.max(total).alias("onehot_max"),
             F.count_if(F.greatest(*onehot) != 1.0).alias("not_binary")]
    stats = model.transform(churn_df).withColumn("a", vector_to_array("features")).agg(
        *aggs).first()
    for i, col in enumerate(CHURN_COUNTS):
        assert abs(stats[f"mean{i}"]) < 1e-9, col
        assert stats[f"sd{i}"] == pytest.approx(1.0, abs=1e-9), col
        assert stats[f"err{i}"] < 1e-9, col  # slot = (x - training mean) / training std
    assert stats["onehot_min"] == stats["onehot_max"] == 1.0  # one-hot slots are not scaled
    assert stats["not_binary"] == 0


def test_unseen_category_encodes_as_zeros(churn_df, small_churn):
    model = FeatureAssembler(numericCols=["month_interaction_count"], categoricalCols=["plan"],
                             labelCol=CHURN_LABEL).fit(churn_df.where("plan != 'premium'"))
    seen = [n for n in PLAN_NAMES if n != "plan=premium"]
    assert model.featureNames == ["month_interaction_count", *seen]
    rows = model.transform(small_churn).collect()
    assert {r["plan"] for r in rows} == set(PLANS)
    for row in rows:
        onehot = slots(row, model, "plan=")
        assert onehot == [float(n == f"plan={row['plan']}") for n in seen]
        assert row["features"][0] == row["month_interaction_count"]
    assert any(r["plan"] == "premium" for r in rows)


# -- null policies -------------------------------------------------------------------------
@pytest.mark.slow
def test_null_policy_error_names_columns_and_fixes(null_df):
    with pytest.raises(SchemaError) as info:
        FeatureAssembler(numericCols=["x"], categoricalCols=["c"], labelCol="y").fit(null_df)
    message = str(info.value)
    assert "'x': 1" in message and "'c': 1" in message
    assert "nullPolicy='drop'" in message and "'impute'" in message


def test_null_policy_error_is_the_default_and_ignores_other_columns(null_df):
    # 'other' has a null but is not an input, so the default policy accepts the data.
    complete = null_df.where("x IS NOT NULL AND c IS NOT NULL")
    model = FeatureAssembler(numericCols=["x"], categoricalCols=["c"]).fit(complete)
    assert model.transform(complete).count() == len(
        [r for r in NULL_ROWS if r[0] is not None and r[1] is not None])


def test_null_policy_drop(null_df):
    model = FeatureAssembler(numericCols=["x"], categoricalCols=["c"], labelCol="y",
                             nullPolicy="drop").fit(null_df)
    kept = [r for r in NULL_ROWS if r[0] is not None and r[1] is not None]
    assert model.featureNames == ["x"] + [f"c={v}" for v in sorted({r[1] for r in kept})]
    out = model.transform(null_df).collect()
    assert sorted(r["x"] for r in out) == sorted(r[0] for r in kept)
    assert any(r["other"] is None for r in out)  # a null outside the inputs keeps its row
    for row in out:
        assert row["features"][0] == row["x"]
        assert slots(row, model, "c=") == [float(n == f"c={row['c']}")
                                           for n in model.featureNames[1:]]


def test_null_policy_impute_uses_training_mean_and_mode(null_df):
    model = FeatureAssembler(numericCols=["x"], categoricalCols=["c"], labelCol="y",
                             nullPolicy="impute").fit(null_df)
    mean = statistics.fmean(r[0] for r in NULL_ROWS if r[0] is not None)
    mode = statistics.mode(r[1] for r in NULL_ROWS if r[1] is not None)
    assert model.fill == {"x": pytest.approx(mean), "c": mode}
    categories = sorted({r[1] for r in NULL_ROWS if r[1] is not None})
    assert model.featureNames == ["x"] + [f"c={v}" for v in categories]
    out = model.transform(null_df).collect()
    assert len(out) == len(NULL_ROWS)
    for row in out:
        x = mean if row["x"] is None else row["x"]
        c = mode if row["c"] is None else row["c"]
        assert row["features"][0] == pytest.approx(x)
        assert slots(row, model, "c=") == [float(v == c) for v in categories]
    # The user's columns are left as they were.
    assert sum(r["x"] is None for r in out) == 1 and sum(r["c"] is None for r in out) == 1


def test_null_policy_impute_fills_nulls_first_seen_at_transform(null_df):
    complete = null_df.where("x IS NOT NULL AND c IS NOT NULL")
    train = [r for r in NULL_ROWS if r[0] is not None and r[1] is not None]
    model = FeatureAssembler(numericCols=["x"], categoricalCols=["c"],
                             nullPolicy="impute").fit(complete)
    mean = statistics.fmean(r[0] for r in train)
    out = model.transform(null_df.where("x IS NULL")).collect()
    assert [r["features"][0] for r in out] == [pytest.approx(mean)]


def test_null_policy_impute_refuses_null_vectors(spark):
    df = spark.createDataFrame([(1.0, [1.0, 2.0]), (2.0, None), (3.0, [0.5, 0.5])],
                               "x double, arr array<double>")
    # array_to_vector fails on a null array, so only convert the others.
    df = df.withColumn("v", F.when(F.col("arr").isNotNull(), array_to_vector("arr")))
    with pytest.raises(SchemaError) as info:
        FeatureAssembler(numericCols=["x"], vectorCols=["v"], nullPolicy="impute").fit(df)
    assert "vectorCols" in str(info.value) and "'v'" in str(info.value)
    assert "nullPolicy='drop'" in str(info.value)
    dropped = FeatureAssembler(numericCols=["x"], vectorCols=["v"], nullPolicy="drop").fit(df)
    assert dropped.transform(df).count() == 2


# -- bad inputs ------------------------------------------------------------------------------
BAD_INPUTS = {
    "missing-numeric": (dict(numericCols=["month_interactions_count"]), SchemaError,
                        ["numericCols", "'month_interactions_count'",
                         "Did you mean 'month_interaction_count'?"]),
    "missing-categorical": (dict(categoricalCols=["regoin"]), SchemaError,
                            ["categoricalCols", "Did you mean 'region'?"]),
    "string-as-numeric": (dict(numericCols=["plan"]), SchemaError,
                          ["numericCols", "'plan'", "string", "categoricalCols"]),
    "not-a-vector": (dict(vectorCols=["month_interaction_count"]), SchemaError,
                     ["vectorCols", "'month_interaction_count'", "array_to_vector"]),
    "output-exists": (dict(numericCols=CHURN_COUNTS, outputCol="plan"), SchemaError,
                      ["outputCol", "'plan'", "already exists"]),
    "unknown-null-policy": (dict(numericCols=CHURN_COUNTS, nullPolicy="imput"), ParamError,
                            ["nullPolicy='imput'", "Did you mean 'impute'?"]),
    "no-inputs": (dict(), ParamError, ["numericCols", "categoricalCols", "vectorCols"]),
    "listed-twice": (dict(numericCols=["month_interaction_count"],
                          categoricalCols=["month_interaction_count"]), ParamError,
                     ["'month_interaction_count'", "more than once"]),
    "missing-label": (dict(numericCols=CHURN_COUNTS, labelCol="churned"), SchemaError,
                      ["labelCol", "'churned'"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_inputs_raise_typed_errors(churn_df, case):
    kwargs, error, fragments = BAD_INPUTS[case]
    with pytest.raises(error) as info:
        FeatureAssembler(**kwargs).fit(churn_df)
    assert isinstance(info.value, ValueError)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_all_null_column_is_refused(churn_df):
    df = churn_df.withColumn("empty", F.lit(None).cast("double"))
    with pytest.raises(SchemaError) as info:
        FeatureAssembler(numericCols=["month_interaction_count", "empty"],
                         nullPolicy="impute").fit(df)
    message = str(info.value)
    assert "numericCols: column 'empty' is null in all" in message
    assert str(churn_df.count()) in message


def test_empty_dataframe_is_refused(churn_df):
    with pytest.raises(SchemaError, match="empty DataFrame"):
        FeatureAssembler(numericCols=CHURN_COUNTS).fit(churn_df.limit(0))


def test_transform_missing_input_column(churn_df, small_churn):
    model = FeatureAssembler(numericCols=CHURN_COUNTS).fit(small_churn)
    with pytest.raises(SchemaError, match="'day_interaction_count'"):
        model.transform(churn_df.drop("day_interaction_count"))


# -- labels --------------------------------------------------------------------------------
def test_string_label_is_indexed_alphabetically(spark):
    values = ["yes", "no", "maybe", "no", "yes", "yes"]
    df = spark.createDataFrame([(float(i), v) for i, v in enumerate(values)], "x double, y string")
    model = FeatureAssembler(numericCols=["x"], labelCol="y").fit(df)
    assert model.labels == sorted(set(values))
    out = model.transform(df).collect()
    assert [r["y"] for r in out] == [float(model.labels.index(v)) for v in values]
    assert model.transform(df).schema["y"].dataType.simpleString() == "double"


@pytest.mark.parametrize("dtype", ["int", "bigint", "boolean", "float"])
def test_numeric_label_cast_to_double(spark, dtype):
    raw = [(0.5, 1), (1.5, 0), (2.5, 1)]
    df = spark.createDataFrame(raw, "x double, y int").withColumn("y", F.col("y").cast(dtype))
    model = FeatureAssembler(numericCols=["x"], labelCol="y").fit(df)
    assert model.labels is None
    out = model.transform(df)
    assert out.schema["y"].dataType.simpleString() == "double"
    assert [r["y"] for r in out.collect()] == [float(y) for _, y in raw]


def test_transform_without_label_column(churn_df, small_churn):
    model = FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan"],
                             labelCol=CHURN_LABEL).fit(churn_df)
    with_label = model.transform(small_churn).select("customer_id", "features").collect()
    unlabeled = model.transform(small_churn.drop(CHURN_LABEL))
    assert CHURN_LABEL not in unlabeled.columns
    assert unlabeled.select("customer_id", "features").collect() == with_label


# -- vector columns ------------------------------------------------------------------------
def test_vector_columns_are_appended(spark):
    rows = [(1.0, "a", [0.1, 0.2, 0.3]), (2.0, "b", [1.0, 2.0, 3.0]), (3.0, "a", [7.0, 8.0, 9.0])]
    df = (spark.createDataFrame(rows, "x double, c string, arr array<double>")
          .withColumn("v", array_to_vector("arr")))
    model = FeatureAssembler(numericCols=["x"], categoricalCols=["c"], vectorCols=["v"]).fit(df)
    assert model.featureNames == ["x", "c=a", "c=b", "v[0]", "v[1]", "v[2]"]
    out = model.transform(df).collect()
    for (x, c, arr), row in zip(rows, out):
        assert row["features"].toArray().tolist() == [x, float(c == "a"), float(c == "b"), *arr]


# -- metadata ------------------------------------------------------------------------------
def test_output_carries_ml_attribute_names(churn_df, small_churn):
    model = FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan"],
                             standardize=True).fit(churn_df)
    out = model.transform(small_churn)
    meta = out.schema["features"].metadata["ml_attr"]
    attrs = sorted(meta["attrs"]["numeric"], key=lambda a: a["idx"])
    assert [a["name"] for a in attrs] == model.featureNames
    assert [a["idx"] for a in attrs] == list(range(len(model.featureNames)))
    assert meta["num_attrs"] == len(model.featureNames)
    # Downstream stages resolve slots by these names.
    sliced = VectorSlicer(inputCol="features", outputCol="picked",
                          names=["plan=premium", "month_interaction_count"]).transform(out)
    for row in sliced.limit(50).collect():
        names = model.featureNames
        assert row["picked"].toArray().tolist() == [
            row["features"][names.index("plan=premium")],
            row["features"][names.index("month_interaction_count")]]


# -- pipelines and persistence -------------------------------------------------------------
@pytest.fixture(scope="module")
def churn_split(churn_df):
    parts = split(churn_df, {"train": 0.8, "test": 0.2}, seed=3, keyCols=["customer_id"])
    return parts["train"], parts["test"]


@pytest.fixture(scope="module")
def churn_pipeline(churn_split):
    train, _ = churn_split
    pipeline = Pipeline(stages=[
        FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan"],
                         labelCol=CHURN_LABEL),
        LogisticRegression(maxIter=10, labelCol=CHURN_LABEL),
    ])
    return pipeline.fit(train)


def test_pipeline_reaches_auc(churn_pipeline, churn_split):
    _, test = churn_split
    predictions = churn_pipeline.transform(test)
    auc = BinaryClassificationEvaluator(labelCol=CHURN_LABEL,
                                        metricName="areaUnderROC").evaluate(predictions)
    assert auc > 0.7
    assembler, lr = churn_pipeline.stages
    weights = dict(zip(assembler.featureNames, lr.coefficients.toArray()))
    for name in CHURN_COUNTS:  # the counts lower churn in the ground truth
        assert weights[name] < 0 and CHURN_COEFFICIENTS[name] < 0, name
    assert weights["plan=basic"] > weights["plan=standard"] > weights["plan=premium"]


@pytest.mark.slow
def test_pipeline_model_save_load(churn_pipeline, churn_split, tmp_path):
    _, test = churn_split
    path = str(tmp_path / "pipeline")
    churn_pipeline.write().overwrite().save(path)
    churn_pipeline.write().overwrite().save(path)  # overwriting an existing save works
    loaded = PipelineModel.load(path)
    assembler = loaded.stages[0]
    assert isinstance(assembler, FeatureAssemblerModel)
    assert assembler.featureNames == churn_pipeline.stages[0].featureNames
    cols = ["customer_id", "prediction", "probability"]
    before = sorted(churn_pipeline.transform(test).select(*cols).collect())
    after = sorted(loaded.transform(test).select(*cols).collect())
    assert len(before) > 0
    assert after == before


def test_estimator_save_load(tmp_path):
    assembler = FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan"],
                                 vectorCols=["v"], labelCol=CHURN_LABEL, outputCol="feats",
                                 nullPolicy="impute", standardize=True)
    path = str(tmp_path / "assembler")
    assembler.write().overwrite().save(path)
    loaded = FeatureAssembler.load(path)
    assert isinstance(loaded, FeatureAssembler)
    assert loaded.uid == assembler.uid

    def params(stage):
        return {p.name: v for p, v in stage.extractParamMap().items()}

    assert params(loaded) == params(assembler)
    assert loaded.isSet(loaded.labelCol) and loaded.isSet(loaded.standardize)
    assert not FeatureAssembler.load(_save(FeatureAssembler(numericCols=["x"]),
                                           tmp_path / "defaults")).isSet("labelCol")


def _save(stage, path):
    stage.write().overwrite().save(str(path))
    return str(path)


@pytest.mark.slow
def test_model_save_load_preserves_state(spark, null_df, tmp_path):
    df = null_df.withColumn("y", F.when(F.col("y") == 1, "churned").otherwise("stayed"))
    model = FeatureAssembler(numericCols=["x"], categoricalCols=["c"], labelCol="y",
                             nullPolicy="impute", standardize=True).fit(df)
    path = str(tmp_path / "model")
    model.save(path)
    loaded = FeatureAssemblerModel.load(path)
    assert isinstance(loaded, FeatureAssemblerModel)
    assert loaded.uid == model.uid
    assert loaded.featureNames == model.featureNames
    assert loaded.fill == model.fill and loaded.fill
    assert loaded.labels == model.labels == ["churned", "stayed"]
    assert {p.name: v for p, v in loaded.extractParamMap().items()} == {
        p.name: v for p, v in model.extractParamMap().items()}
    assert loaded.transform(df).collect() == model.transform(df).collect()


# -- NaN, infinity, any column name, label contract at transform ----------------------------
NAN = float("nan")
INF = float("inf")


def test_nan_is_imputed_with_the_mean_of_the_other_values(spark):
    df = spark.createDataFrame([(1.0, 0), (NAN, 1), (3.0, 0), (None, 1)], "x double, y int")
    model = FeatureAssembler(numericCols=["x"], labelCol="y", nullPolicy="impute",
                             standardize=True).fit(df)
    assert model.fill == {"x": pytest.approx(2.0)}  # mean of 1 and 3: NaN is not a value
    raw = FeatureAssembler(numericCols=["x"], labelCol="y", nullPolicy="impute").fit(df)
    out = raw.transform(df).collect()
    assert [r["features"][0] for r in out] == pytest.approx([1.0, 2.0, 3.0, 2.0])
    scaled = [r["features"][0] for r in model.transform(df).collect()]
    assert all(math.isfinite(v) for v in scaled) and scaled[1] == pytest.approx(0.0)


def test_nan_under_drop_drops_the_row(spark):
    df = spark.createDataFrame([(1.0, "a"), (NAN, "b"), (3.0, "a")], "x double, c string")
    model = FeatureAssembler(numericCols=["x"], categoricalCols=["c"], nullPolicy="drop").fit(df)
    assert [r["x"] for r in model.transform(df).collect()] == [1.0, 3.0]
    assert model.featureNames == ["x", "c=a"]  # 'b' came only with the NaN row


@pytest.mark.parametrize("standardize", [False, True])
def test_nan_under_error_is_refused_at_fit_naming_the_column(spark, standardize):
    df = spark.createDataFrame([(1.0, 2.0), (NAN, 3.0), (3.0, 4.0)], "x double, ok float")
    with pytest.raises(SchemaError) as info:
        FeatureAssembler(numericCols=["x", "ok"], standardize=standardize).fit(df)
    message = str(info.value)
    assert "{'x': 1}" in message and "NaN" in message and "'impute'" in message


def test_nan_in_a_float_categorical_column_is_missing(spark):
    df = spark.createDataFrame([(1.0, 1.0), (2.0, NAN), (3.0, 1.0)], "x double, c double")
    model = FeatureAssembler(numericCols=["x"], categoricalCols=["c"],
                             nullPolicy="impute").fit(df)
    assert model.fill["c"] == "1.0" and model.featureNames == ["x", "c=1.0"]
    with pytest.raises(SchemaError, match=r"'c': 1"):
        FeatureAssembler(numericCols=["x"], categoricalCols=["c"]).fit(df)


@pytest.mark.parametrize("policy", ["error", "drop", "impute"])
@pytest.mark.parametrize("value", [INF, -INF])
def test_infinity_is_refused_naming_the_column(spark, policy, value):
    df = spark.createDataFrame([(1.0, 1), (value, 2), (3.0, 3)], "`x.inf` double, n int")
    with pytest.raises(SchemaError) as info:
        FeatureAssembler(numericCols=["n", "x.inf"], nullPolicy=policy,
                         standardize=True).fit(df)
    assert "numericCols" in str(info.value) and "{'x.inf': 1}" in str(info.value)


@pytest.mark.slow
def test_dotted_and_backticked_column_names(spark):
    rows = [(1.0, "p", [1.0, 0.0], "no"), (2.0, "q", [0.0, 1.0], "yes"),
            (None, "p", [1.0, 1.0], "yes")]
    df = (spark.createDataFrame(rows, "`a.b` double, `c``d` string, arr array<double>, "
                                      "`y.label` string")
          .withColumn("v.e`c", array_to_vector("arr")).drop("arr"))
    model = FeatureAssembler(numericCols=["a.b"], categoricalCols=["c`d"], vectorCols=["v.e`c"],
                             labelCol="y.label", nullPolicy="impute").fit(df)
    assert model.featureNames == ["a.b", "c`d=p", "c`d=q", "v.e`c[0]", "v.e`c[1]"]
    out = model.transform(df).collect()
    assert [list(r["features"]) for r in out] == [
        [1.0, 1.0, 0.0, 1.0, 0.0], [2.0, 0.0, 1.0, 0.0, 1.0], [1.5, 1.0, 0.0, 1.0, 1.0]]
    assert [r["y.label"] for r in out] == [0.0, 1.0, 1.0]
    numeric_label = df.withColumn("y.label", F.lit(1))
    dropped = FeatureAssembler(numericCols=["a.b"], labelCol="y.label",
                               nullPolicy="drop").fit(numeric_label)
    assert [r["y.label"] for r in dropped.transform(numeric_label).collect()] == [1.0, 1.0]


def test_null_string_label_is_refused_at_fit(spark):
    df = spark.createDataFrame([(1.0, "a"), (2.0, None), (3.0, "b")], "x double, y string")
    with pytest.raises(SchemaError) as info:
        FeatureAssembler(numericCols=["x"], labelCol="y").fit(df)
    message = str(info.value)
    assert "labelCol: column 'y' is null in 1 of 3 rows" in message and "dropna" in message


def test_string_label_at_transform_unseen_refused_null_kept(spark):
    train = spark.createDataFrame([(1.0, "a"), (2.0, "b")], "x double, y string")
    model = FeatureAssembler(numericCols=["x"], labelCol="y").fit(train)
    with pytest.raises(SchemaError) as info:
        model.transform(spark.createDataFrame([(1.0, "a"), (2.0, "c")], "x double, y string"))
    assert "labelCol: column 'y' holds 'c'" in str(info.value)
    assert "['a', 'b']" in str(info.value)
    scoring = spark.createDataFrame([(1.0, "b"), (2.0, None)], "x double, y string")
    assert [r["y"] for r in model.transform(scoring).collect()] == [1.0, None]


def test_transform_refuses_an_existing_output_column(spark, null_df):
    model = FeatureAssembler(numericCols=["x"], nullPolicy="drop").fit(null_df)
    with pytest.raises(SchemaError, match="outputCol 'features' already exists.*another outputCol"):
        model.transform(model.transform(null_df))
