"""sparkdist ALS on a local Spark session: id round trips of any type, accuracy on low-rank
data, cold starts, checkpointing, metrics, persistence, Pipeline and tuning, typed errors."""

from __future__ import annotations

import logging
import math
import os

import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import RegressionEvaluator
from pyspark.ml.feature import SQLTransformer
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder, TrainValidationSplit
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType

from sparkdist.datasets import make_ratings, ratings
from sparkdist.exceptions import ParamError, SchemaError
from sparkdist.features import split
from sparkdist.models import _als_ids
from sparkdist.models._als_checks import check_ratings_schema, check_ratings_values
from sparkdist.models.als import ALS, ALSModel
from sparkdist.persist import data_dir
from tests.sparkjobs import count_jobs

COLS = {"userCol": "user_id", "itemCol": "item_id", "ratingCol": "rating"}
FAST = {"numUserBlocks": 2, "numItemBlocks": 2}  # MLlib's 10x10 blocks are slow on 2 cores
RANKING_KEYS = {"precision@5", "recall@5", "ndcg@5", "map@5"}


def als(**params) -> ALS:
    return ALS(**{**COLS, **FAST, "seed": 7, **params})


def rows(df, *cols):
    return sorted(tuple(r[c] for c in cols) for r in df.collect())


def recommended(recs, key, other):
    """{key id: [other ids, best first]} of a recommendations DataFrame."""
    return {r[key]: [x[other] for x in r["recommendations"]] for r in recs.collect()}


def finite(metrics):
    return all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())


@pytest.fixture(scope="module")
def data(spark):
    """Rank-4 ratings (+ noise 0.25) with string ids, split so every test id is seen.

    Density 0.3 (~29 training ratings a user): at the default 0.1 (~9) MLlib ALS, which has
    no bias terms, predicts the test ratings no better than their mean."""
    df = ratings(spark, density=0.3, seed=3).cache()  # 300 users, 120 items
    parts = split(df, {"train": 0.8, "test": 0.2}, method="cold_start", userCol="user_id",
                  itemCol="item_id", seed=11)
    frames = (df, parts["train"].cache(), parts["test"].cache())
    yield frames
    for frame in frames:
        frame.unpersist()


@pytest.fixture(scope="module")
def model(data):
    return als(rank=5, regParam=0.1).fit(data[1])


@pytest.fixture(scope="module")
def small(spark):
    """A small int-id ratings frame for the many short fits."""
    pdf = make_ratings(n_users=40, n_items=20, density=0.5, seed=5, string_ids=False)
    pdf.attrs = {}  # the true factors are not needed here
    df = spark.createDataFrame(pdf[["user_id", "item_id", "rating"]]).cache()
    yield df
    df.unpersist()


def test_mllib_params_and_defaults_are_kept(spark):  # MLlib stages need a SparkContext
    from pyspark.ml.recommendation import ALS as MLlibALS

    ours, theirs = ALS(), MLlibALS()
    for param in theirs.params:
        assert ours.hasParam(param.name), param.name
        if param.name not in ("coldStartStrategy", "seed"):
            assert ours.getOrDefault(param.name) == theirs.getOrDefault(param.name), param.name
    assert ours.getColdStartStrategy() == "drop" and ours.getDuplicatePolicy() == "error"
    assert ALS(rank=3).setMaxIter(4).getMaxIter() == 4 and ALS(rank=3).getRank() == 3


# -- ids of any type -------------------------------------------------------------------------
@pytest.mark.slow
def test_string_ids_round_trip(data, model):
    _, train, test = data
    out = model.transform(test)
    assert out.columns == test.columns + ["prediction"]
    assert out.schema["user_id"].dataType == StringType()
    assert rows(out, "user_id", "item_id") == rows(test, "user_id", "item_id")

    ids = train.agg(F.collect_set("user_id"), F.collect_set("item_id")).first()
    users, items = set(ids[0]), set(ids[1])
    recs = model.recommendForAllUsers(3).collect()
    assert {r["user_id"] for r in recs} == users
    for r in recs:
        assert len(r["recommendations"]) == 3 and {x["item_id"] for x in r[1]} <= items
        scores = [x["rating"] for x in r["recommendations"]]
        assert scores == sorted(scores, reverse=True)  # best first, kept through the joins
    by_item = recommended(model.recommendForAllItems(2), "item_id", "user_id")
    assert set(by_item) == items and all(set(v) <= users for v in by_item.values())
    assert set(model.userFactors.columns) == {"user_id", "features"}
    assert {r[0] for r in model.itemFactors.select("item_id").collect()} == items


@pytest.mark.slow
def test_numeric_ids_keep_value_and_type(small):
    # Longs beyond MLlib's int range for users, plain ints for items.
    df = small.select((F.col("user_id") + 2**40).alias("user_id"),
                      F.col("item_id").cast("int"), "rating")
    model = als(rank=3, maxIter=5).fit(df)
    out = model.transform(df)
    assert out.schema["user_id"].dataType == LongType()
    assert out.schema["item_id"].dataType == IntegerType()
    assert rows(out, "user_id", "item_id") == rows(df, "user_id", "item_id")

    items = {r[0] for r in df.select("item_id").distinct().collect()}
    recs = model.recommendForAllUsers(4)
    assert recs.schema["user_id"].dataType == LongType()
    by_user = recommended(recs, "user_id", "item_id")
    assert set(by_user) == {r[0] for r in df.select("user_id").distinct().collect()}
    assert all(set(v) <= items for v in by_user.values())
    subset = model.recommendForUserSubset(df.where(F.col("user_id") == df.first()[0]), 2)
    assert subset.count() == 1


@pytest.mark.slow
def test_non_negative_int_ids_go_to_mllib_unmapped(tmp_path, small):
    df = small.select((F.col("user_id") * 7).cast("int").alias("user_id"),
                      F.col("item_id").cast("int"), "rating")
    model = als(rank=3, maxIter=3).fit(df)
    users = {r[0] for r in df.select("user_id").distinct().collect()}
    assert {r.id for r in model.mllib_model.userFactors.collect()} == users  # MLlib's own ids
    assert {r.user_id for r in model.userFactors.collect()} == users
    path = str(tmp_path / "model")
    model.write().save(path)
    assert not {"user_index", "item_index"} & set(os.listdir(data_dir(path)))
    loaded = ALSModel.load(path)
    cols = ("user_id", "item_id", "prediction")
    assert rows(loaded.transform(df), *cols) == rows(model.transform(df), *cols)
    assert set(recommended(loaded.recommendForAllItems(2), "item_id", "user_id")) == \
        {r[0] for r in df.select("item_id").distinct().collect()}
    unknown = df.select((F.col("user_id") + 1).alias("user_id"), "item_id", "rating")
    assert model.transform(unknown).count() == 0  # ids of no user: cold starts, dropped

    negative = df.withColumn("user_id", -F.col("user_id") - 1)  # still mapped to 0..n-1
    shifted = als(rank=3, maxIter=3).fit(negative)
    assert {r.id for r in shifted.mllib_model.userFactors.collect()} == set(range(len(users)))
    assert {r.user_id for r in shifted.userFactors.collect()} == {-u - 1 for u in users}


@pytest.mark.slow
def test_int_ids_cost_mllib_jobs_and_the_checks_only(spark, small):
    # Issue 15: int ids go to MLlib as they are: the fit runs MLlib's own jobs plus the
    # value checks' aggregation (in a thread beside MLlib's fit), no indexing or counting
    # job, and trains the very model MLlib trains on the same rows.
    from pyspark.ml.recommendation import ALS as MLlibALS

    df = small.select(F.col("user_id").cast("int"), F.col("item_id").cast("int"),
                      "rating").cache()
    df.count()  # cached first: two jobs reading an unfilled cache would both fill it
    params = {**COLS, **FAST, "rank": 3, "maxIter": 3, "seed": 7}
    fits = {}
    ours = count_jobs(spark, lambda: fits.setdefault("ours", ALS(**params).fit(df)))
    mllib = count_jobs(spark, lambda: fits.setdefault("mllib", MLlibALS(**params).fit(df)))
    checks = count_jobs(spark, lambda: ALS(**params)._check_values(df, []))
    assert mllib < ours <= mllib + checks, (ours, mllib, checks)
    assert rows(fits["ours"].itemFactors, "item_id", "features") == \
        rows(fits["mllib"].itemFactors.withColumnRenamed("id", "item_id"), "item_id",
             "features")
    df.unpersist()


@pytest.mark.parametrize("bad,match", [
    ((2, 2, float("nan")), "ratingCol: column 'rating' is NaN in 1 of 3 rows"),
    ((2, 2, -1.0), "ratingCol: column 'rating' has 1 negative ratings"),
    ((None, 2, 1.0), "userCol: column 'user_id' is null in 1 of 3 rows"),
    ((0, 0, 5.0), r"1 \(user, item\) pairs .* \(0, 0\) has 2 rows"),
    (None, "empty DataFrame")])
def test_int_id_checks_beside_mllib_raise_their_errors(spark, bad, match):
    # With int ids the checks run beside MLlib's fit; their typed error wins whatever MLlib
    # did (failed on a null id or no rows, trained on NaN, a negative or a duplicate).
    good = [(0, 0, 4.0), (1, 1, 3.0)]
    df = spark.createDataFrame(good + [bad] if bad else [],
                               "user_id int, item_id int, rating double")
    with pytest.raises(SchemaError, match=match):
        als(rank=2, maxIter=2).fit(df)


@pytest.mark.slow
def test_id_index_is_dense_and_deterministic(data):
    df = data[0]
    [first] = _als_ids.index_ids(df.repartition(3), ["user_id"])
    [second] = _als_ids.index_ids(df.repartition(5, "item_id"), ["user_id"])
    mapping = dict(rows(first, "id", "index"))
    assert mapping == dict(rows(second, "id", "index"))
    assert sorted(mapping.values()) == list(range(len(mapping)))
    # The input checks collect the same id counts in their own job: the same numbering.
    mapped = check_ratings_schema(df, "user_id", "item_id", "rating")
    _, counts = check_ratings_values(df, "user_id", "item_id", "rating", False, "mean", mapped)
    assert mapped == ["user_id", "item_id"] and counts
    [folded, _] = _als_ids.index_ids(df, mapped, counts)
    assert dict(rows(folded, "id", "index")) == mapping


# -- accuracy, cold starts, metrics ----------------------------------------------------------
@pytest.mark.slow
def test_unknown_ids_are_cold_starts(spark, data, model):
    _, _, test = data
    strangers = spark.createDataFrame([("new-user", "i0001", 3.0), ("u00001", "new-item", 3.0)],
                                      test.select("user_id", "item_id", "rating").schema)
    mixed = test.select("user_id", "item_id", "rating").unionByName(strangers)
    assert model.transform(mixed).count() == test.count()  # dropped by default

    nan = model.copy().setColdStartStrategy("nan").transform(mixed).collect()
    assert len(nan) == test.count() + 2
    assert sorted((r.user_id, r.item_id) for r in nan if math.isnan(r.prediction)) == \
        [("new-user", "i0001"), ("u00001", "new-item")]

    int_ids = spark.createDataFrame([(1, 2)], ["user_id", "item_id"])  # other type: unknown
    assert model.transform(int_ids).count() == 0


@pytest.mark.slow
def test_rmse_well_below_rating_std_and_metrics_never_nan(spark, data, model):
    _, _, test = data
    std = test.agg(F.stddev("rating")).first()[0]
    predictions = model.transform(test).cache()
    assert predictions.where(F.isnan("prediction")).count() == 0
    rmse = RegressionEvaluator(labelCol="rating").evaluate(predictions)
    predictions.unpersist()
    print(f"ALS test RMSE {rmse:.3f} vs rating std {std:.3f}")
    assert rmse < 0.6 * std

    unseen = spark.createDataFrame([(f"new{i}", "i0001", 4.0) for i in range(20)]
                                   + [("u00001", "new-item", 5.0)],
                                   test.select("user_id", "item_id", "rating").schema)
    metrics = model.rankingMetrics(test.select(*unseen.columns).unionByName(unseen), k=5)
    assert set(metrics) == RANKING_KEYS | {"rmse", "mae"}
    assert finite(metrics)
    assert all(0.0 <= metrics[k] <= 1.0 for k in RANKING_KEYS)
    assert 0.0 < metrics["mae"] <= metrics["rmse"]
    assert metrics["rmse"] == pytest.approx(rmse)  # unseen rows are left out, as cold starts

    with pytest.raises(SchemaError, match="lower the threshold"):
        model.rankingMetrics(test, k=5, relevanceThreshold=99.0)
    with pytest.raises(SchemaError, match="no row .* trained on"):
        model.rankingMetrics(unseen, k=5)
    with pytest.raises(ParamError, match="k=0"):
        model.rankingMetrics(test, k=0)
    with pytest.raises(ParamError, match="numItems"):
        model.recommendForAllUsers(0)


@pytest.mark.slow
def test_implicit_feedback_accepts_negatives_and_reports_ranking_only(small):
    df = small.withColumn("rating", F.col("rating") - 3.0)  # negative = disliked
    model = als(rank=3, maxIter=5, implicitPrefs=True, alpha=2.0).fit(df)
    metrics = model.rankingMetrics(df, k=5, relevanceThreshold=1.0)
    assert set(metrics) == RANKING_KEYS and finite(metrics)


# -- checkpointing ---------------------------------------------------------------------------
def _set_checkpoint_dir(sc, value):
    """Set (or clear, with None) the SparkContext's checkpoint directory as is."""
    option = sc._jvm.scala.Option.apply(value)
    getattr(sc._jsc.sc(), "checkpointDir_$eq")(option)


@pytest.mark.slow
def test_checkpoint_dir_is_set_automatically(spark, small, caplog):
    sc = spark.sparkContext
    previous = sc.getCheckpointDir()
    _set_checkpoint_dir(sc, None)
    try:
        with caplog.at_level(logging.WARNING, logger="sparkdist.models.als"):
            als(rank=2, maxIter=4, checkpointInterval=2).fit(small)
        directory = sc.getCheckpointDir()
        assert directory is not None and "sparkdist-checkpoints-" in directory
        written = os.listdir(directory.removeprefix("file:"))
        assert any(name.startswith("rdd-") for name in written)  # MLlib did checkpoint
        message = " ".join(r.getMessage() for r in caplog.records)
        assert "sparkdist-checkpoints-" in message and "setCheckpointDir" in message
    finally:
        _set_checkpoint_dir(sc, previous)


# -- persistence, Pipeline, tuning -----------------------------------------------------------
@pytest.mark.slow
def test_save_load_estimator_and_model(tmp_path, data, model):
    _, _, test = data
    estimator = als(rank=5, duplicatePolicy="mean", coldStartStrategy="nan")
    estimator.save(str(tmp_path / "als"))
    loaded_est = ALS.load(str(tmp_path / "als"))
    assert {p.name: v for p, v in loaded_est.extractParamMap().items()} == \
        {p.name: v for p, v in estimator.extractParamMap().items()}

    path = str(tmp_path / "model")
    model.write().save(path)
    assert {"mllib", "user_index", "item_index"} <= set(os.listdir(data_dir(path)))
    loaded = ALSModel.load(path)
    assert loaded.getUserCol() == "user_id" and loaded.rank == model.rank
    cols = ("user_id", "item_id", "prediction")
    assert rows(loaded.transform(test), *cols) == rows(model.transform(test), *cols)
    assert recommended(loaded.recommendForAllUsers(3), "user_id", "item_id") == \
        recommended(model.recommendForAllUsers(3), "user_id", "item_id")


@pytest.mark.slow
def test_in_pipeline_with_save_load(tmp_path, data):
    _, train, test = data
    cast = SQLTransformer(statement="SELECT user_id, item_id, CAST(rating AS DOUBLE) AS rating "
                                    "FROM __THIS__")
    fitted = Pipeline(stages=[cast, als(rank=4, maxIter=5)]).fit(train)
    assert isinstance(fitted.stages[-1], ALSModel)
    out = fitted.transform(test)
    assert out.schema["rating"].dataType == DoubleType()
    cols = ("user_id", "item_id", "prediction")
    predicted = rows(out, *cols)
    assert len(predicted) == test.count() and not any(math.isnan(p[2]) for p in predicted)

    fitted.write().save(str(tmp_path / "pipeline"))
    reloaded = PipelineModel.load(str(tmp_path / "pipeline"))
    assert rows(reloaded.transform(test), *cols) == predicted


@pytest.mark.slow
@pytest.mark.parametrize("tuner", ["cv", pytest.param("tvs", marks=pytest.mark.slow)])
def test_tuning_with_grid(small, tuner):
    estimator = als(maxIter=3)
    grid = (ParamGridBuilder().addGrid(estimator.regParam, [0.05, 0.3])
            .addGrid(estimator.rank, [2, 4]).build())
    evaluator = RegressionEvaluator(labelCol="rating")
    if tuner == "cv":  # random folds put unseen users in validation: NaN under MLlib's default
        search = CrossValidator(estimator=estimator, estimatorParamMaps=grid,
                                evaluator=evaluator, numFolds=2, seed=3)
    else:
        search = TrainValidationSplit(estimator=estimator, estimatorParamMaps=grid,
                                      evaluator=evaluator, trainRatio=0.75, seed=3)
    fitted = search.fit(small)
    metrics = fitted.avgMetrics if tuner == "cv" else fitted.validationMetrics
    assert len(metrics) == 4 and all(math.isfinite(m) for m in metrics)
    assert isinstance(fitted.bestModel, ALSModel)


# -- duplicates ------------------------------------------------------------------------------
def _with_duplicate(spark):
    """A full 4x3 rank-1 matrix, and pair ('a', 'x') rated 1 and 5."""
    scale = {"a": 1.0, "b": 1.5, "c": 2.0, "d": 2.5}
    pairs = [(u, i, s * w) for u, s in scale.items() for i, w in (("y", 1.0), ("z", 1.5))]
    pairs += [(u, "x", s * 2.0) for u, s in scale.items() if u != "a"]
    return spark.createDataFrame(pairs + [("a", "x", 1.0), ("a", "x", 5.0)],
                                 ["user_id", "item_id", "rating"])


def test_duplicates_error_by_default(spark):
    with pytest.raises(SchemaError) as info:
        als().fit(_with_duplicate(spark))
    message = str(info.value)
    assert "1 (user, item) pairs" in message and "('a', 'x') has 2 rows" in message
    assert "duplicatePolicy='mean'" in message and "'sum'" in message


@pytest.mark.slow
def test_duplicate_policies_mean_and_sum(spark):
    df = _with_duplicate(spark)
    pair = df.where("user_id = 'a' AND item_id = 'x'").limit(1)
    fit = {p: als(rank=2, maxIter=10, regParam=0.001, duplicatePolicy=p).fit(df)
           for p in ("mean", "sum")}
    predicted = {p: m.transform(pair).first()["prediction"] for p, m in fit.items()}
    assert predicted["mean"] == pytest.approx(3.0, abs=0.6)
    assert predicted["sum"] == pytest.approx(6.0, abs=0.8)


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize("param,wrong,right", [("userCol", "user_idd", "user_id"),
                                                ("itemCol", "itemid", "item_id"),
                                                ("ratingCol", "ratings", "rating")])
def test_missing_column_suggests_the_right_one(small, param, wrong, right):
    with pytest.raises(SchemaError, match=f"{param}: column '{wrong}'.*Did you mean '{right}'"):
        als(**{param: wrong}).fit(small)


@pytest.mark.parametrize("value,match", [(None, "is null in 1 of 3 rows"),
                                         (float("nan"), "is NaN in 1 of 3 rows"),
                                         (-1.0, "has 1 negative ratings.*implicitPrefs=True")])
def test_bad_ratings(spark, value, match):
    df = spark.createDataFrame([("a", "x", 4.0), ("b", "y", 3.0), ("c", "z", value)],
                               "user_id string, item_id string, rating double")
    with pytest.raises(SchemaError, match=f"ratingCol: column 'rating' {match}"):
        als().fit(df)


def test_other_bad_input(spark, small):
    schema = "user_id string, item_id string, rating double"
    with pytest.raises(SchemaError, match="empty DataFrame"):
        als().fit(spark.createDataFrame([], schema))
    with pytest.raises(SchemaError, match="itemCol: column 'item_id' is null in 1 of 2"):
        als().fit(spark.createDataFrame([("a", "x", 1.0), ("b", None, 2.0)], schema))
    with pytest.raises(SchemaError, match="not numeric"):
        als().fit(spark.createDataFrame([Row(user_id="a", item_id="x", rating="5")]))
    with pytest.raises(SchemaError, match="array<bigint>; ids must be single values"):
        als().fit(spark.createDataFrame([Row(user_id=[1], item_id=1, rating=1.0)]))
    with pytest.raises(ParamError, match="duplicatePolicy='meen'.*Did you mean 'mean'"):
        als(duplicatePolicy="meen").fit(small)
    with pytest.raises(ParamError, match="coldStartStrategy='dorp'.*Did you mean 'drop'"):
        als(coldStartStrategy="dorp").fit(small)


@pytest.mark.slow
def test_column_names_with_dots_and_backticks(small):
    names = {"userCol": "user.id", "itemCol": "item`id", "ratingCol": "r.a`t"}
    df = (small.withColumnRenamed("user_id", "user.id").withColumnRenamed("item_id", "item`id")
          .withColumnRenamed("rating", "r.a`t"))
    model = als(rank=3, maxIter=5, duplicatePolicy="mean", **names).fit(df)
    out = model.transform(df)
    assert out.count() == df.count() and out.where("isnan(prediction)").count() == 0
    assert model.userFactors.columns == ["user.id", "features"]
    assert model.itemFactors.count() == df.select("`item``id`").distinct().count()
    recs = model.recommendForUserSubset(df.limit(1), 3)
    assert recs.columns == ["user.id", "recommendations"]
    assert set(recs.first()["recommendations"][0].asDict()) == {"item`id", "rating"}
    assert model.recommendForAllItems(2).columns == ["item`id", "recommendations"]
    assert finite(model.rankingMetrics(df, k=5))
