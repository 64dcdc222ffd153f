"""Deterministic splits on a local Spark session: invariants of every method, metadata and
typed errors for bad input."""

from __future__ import annotations

from datetime import datetime

import pytest
from pyspark.sql import functions as F

from sparkdist.datasets import CHURN_LABEL, ratings
from sparkdist.exceptions import ParamError, SchemaError
from sparkdist.features import SplitResult, split

TRAIN_TEST = {"train": 0.8, "test": 0.2}
THREE_WAY = {"train": 0.6, "valid": 0.25, "test": 0.15}


def values(df, col="customer_id"):
    return {r[0] for r in df.select(col).collect()}


def counts_by(df, col):
    return {r[0]: r["count"] for r in df.groupBy(col).count().collect()}


@pytest.fixture(scope="module")
def n_rows(churn_df):
    return churn_df.count()


@pytest.fixture(scope="module")
def all_ids(churn_df):
    return values(churn_df)


# -- random ----------------------------------------------------------------------------------
@pytest.mark.parametrize("keyCols", [["customer_id"], None], ids=["keyCols", "all-columns"])
def test_random_split_is_deterministic(churn_df, seed, all_ids, keyCols):
    parts = split(churn_df, TRAIN_TEST, method="random", seed=seed, keyCols=keyCols)
    test = values(parts["test"])
    assert values(parts["test"]) == test  # second evaluation of the same plan

    reshuffled = churn_df.repartition(7)  # other partitioning, not cached
    assert reshuffled.rdd.getNumPartitions() == 7
    assert values(split(reshuffled, TRAIN_TEST, seed=seed, keyCols=keyCols)["test"]) == test

    cached = churn_df.repartition(3).cache()
    try:
        assert cached.count() == len(all_ids)
        assert values(split(cached, TRAIN_TEST, seed=seed, keyCols=keyCols)["test"]) == test
    finally:
        cached.unpersist()

    train = values(parts["train"])
    assert train.isdisjoint(test)
    assert train | test == all_ids
    assert 0 < len(test) < len(all_ids)


def test_random_fractions_close_to_requested(churn_df, seed, n_rows):
    counts = split(churn_df, TRAIN_TEST, seed=seed, keyCols=["customer_id"]).metadata["counts"]
    assert sum(counts.values()) == n_rows
    for name, frac in TRAIN_TEST.items():
        assert counts[name] / n_rows == pytest.approx(frac, abs=0.02), name


def test_random_three_way_split(churn_df, seed, all_ids):
    parts = split(churn_df, THREE_WAY, seed=seed, keyCols=["customer_id"])
    assert list(parts) == list(THREE_WAY)
    assert len(parts) == 3
    ids = {name: values(parts[name]) for name in THREE_WAY}
    for name, frac in THREE_WAY.items():
        assert len(ids[name]) / len(all_ids) == pytest.approx(frac, abs=0.02), name
    assert set.union(*ids.values()) == all_ids
    assert sum(len(s) for s in ids.values()) == len(all_ids)  # pairwise disjoint


def test_different_seeds_give_different_splits(churn_df, seed):
    first = values(split(churn_df, TRAIN_TEST, seed=seed, keyCols=["customer_id"])["test"])
    other = values(split(churn_df, TRAIN_TEST, seed=seed + 1, keyCols=["customer_id"])["test"])
    assert first != other
    # Independent hashes: the overlap is about 0.2 * 0.2 of the rows, far from all of them.
    assert len(first & other) < 0.5 * min(len(first), len(other))


# -- stratified ------------------------------------------------------------------------------
def _check_per_class_fractions(parts, label, fractions):
    per_split = {name: counts_by(parts[name], label) for name in fractions}
    classes = set().union(*per_split.values())
    totals = {c: sum(per_split[n].get(c, 0) for n in fractions) for c in classes}
    assert len(classes) >= 2
    for name, frac in fractions.items():
        for cls, total in totals.items():
            got = per_split[name].get(cls, 0)
            assert got / total == pytest.approx(frac, abs=0.01), (name, cls)
            assert abs(got - frac * total) <= 1, (name, cls)  # documented: exact to a row
    return totals


@pytest.mark.parametrize("fractions", [TRAIN_TEST, THREE_WAY], ids=["2-way", "3-way"])
def test_stratified_per_class_fractions(churn_df, seed, n_rows, fractions):
    # A rare class: about 6% of rows.
    df = churn_df.withColumn("rare", (F.col("day_interaction_count") >= 4).cast("int"))
    rare_share = df.where("rare = 1").count() / n_rows
    assert 0.02 < rare_share < 0.15
    parts = split(df, fractions, method="stratified", seed=seed, labelCol="rare")
    totals = _check_per_class_fractions(parts, "rare", fractions)
    assert sum(totals.values()) == n_rows
    assert sum(parts.metadata["counts"].values()) == n_rows


def test_stratified_multiclass_string_label(churn_df, seed, n_rows):
    parts = split(churn_df, TRAIN_TEST, method="stratified", seed=seed, labelCol="plan")
    totals = _check_per_class_fractions(parts, "plan", TRAIN_TEST)
    assert totals == counts_by(churn_df, "plan")


def test_stratified_double_label(churn_df, seed, n_rows):
    df = churn_df.withColumn("label", F.col(CHURN_LABEL).cast("double"))
    parts = split(df, TRAIN_TEST, method="stratified", seed=seed, labelCol="label",
                  keyCols=["customer_id"])
    totals = _check_per_class_fractions(parts, "label", TRAIN_TEST)
    assert set(totals) == {0.0, 1.0}
    meta = parts.metadata
    assert meta["labelCol"] == "label"
    assert sum(meta["counts"].values()) == n_rows
    assert meta["counts"]["test"] == sum(counts_by(parts["test"], "label").values())
    # Also deterministic under repartitioning.
    again = split(df.repartition(5), TRAIN_TEST, method="stratified", seed=seed,
                  labelCol="label", keyCols=["customer_id"])
    assert values(again["test"]) == values(parts["test"])


# -- time ------------------------------------------------------------------------------------
def _time_range(df, col="signup_ts"):
    row = df.agg(F.min(col).alias("lo"), F.max(col).alias("hi"), F.count("*").alias("n")).first()
    return row["lo"], row["hi"], row["n"]


def test_time_split_orders_train_before_test(churn_df, seed, n_rows):
    parts = split(churn_df, TRAIN_TEST, method="time", seed=seed, timeCol="signup_ts")
    _, train_max, n_train = _time_range(parts["train"])
    test_min, _, n_test = _time_range(parts["test"])
    assert train_max < test_min
    assert n_train + n_test == n_rows
    assert n_test / n_rows == pytest.approx(TRAIN_TEST["test"], abs=0.005)
    meta = parts.metadata
    assert meta["method"] == "time"
    assert meta["timeCol"] == "signup_ts"
    assert len(meta["cutoffs"]) == 1
    cutoff = datetime.fromisoformat(meta["cutoffs"][0])
    assert train_max < cutoff <= test_min
    assert meta["counts"] == {"train": n_train, "test": n_test}


def test_time_split_three_way(churn_df, seed, n_rows):
    parts = split(churn_df, THREE_WAY, method="time", seed=seed, timeCol="signup_ts")
    ranges = [_time_range(parts[name]) for name in THREE_WAY]
    for (_, hi, _), (lo, _, _) in zip(ranges, ranges[1:]):
        assert hi < lo
    for (_, _, n), frac in zip(ranges, THREE_WAY.values()):
        assert n / n_rows == pytest.approx(frac, abs=0.005)
    assert len(parts.metadata["cutoffs"]) == 2


def test_time_split_explicit_cutoffs(churn_df, seed, n_rows):
    cutoff = datetime(2024, 7, 1)
    parts = split(churn_df, TRAIN_TEST, method="time", seed=seed, timeCol="signup_ts",
                  cutoffs=["2024-07-01"])
    _, train_max, n_train = _time_range(parts["train"])
    test_min, _, n_test = _time_range(parts["test"])
    assert train_max < cutoff <= test_min
    assert n_train == churn_df.where(F.col("signup_ts") < F.lit(cutoff)).count()
    assert n_train + n_test == n_rows
    assert parts.metadata["cutoffs"] == [cutoff.isoformat()]


def test_time_split_on_date_column(churn_df, seed, n_rows):
    df = churn_df.withColumn("signup_date", F.to_date("signup_ts"))
    parts = split(df, TRAIN_TEST, method="time", timeCol="signup_date", cutoffs=["2024-07-01"])
    _, train_max, _ = _time_range(parts["train"], "signup_date")
    test_min, _, _ = _time_range(parts["test"], "signup_date")
    assert train_max < datetime(2024, 7, 1).date() <= test_min


def test_time_split_with_null_timestamps_is_refused(churn_df):
    df = churn_df.withColumn(
        "signup_ts", F.when(F.col("month_interaction_count") > 60, None)
        .otherwise(F.col("signup_ts")))
    with pytest.raises(SchemaError, match="timeCol: column 'signup_ts' is null"):
        split(df, TRAIN_TEST, method="time", timeCol="signup_ts")


def test_time_split_explicit_cutoffs_with_null_timestamps_is_refused(churn_df):
    df = churn_df.withColumn(
        "signup_ts", F.when(F.col("month_interaction_count") > 60, None)
        .otherwise(F.col("signup_ts")))
    with pytest.raises(SchemaError, match="timeCol"):
        _ = split(df, TRAIN_TEST, method="time", timeCol="signup_ts",
                  cutoffs=["2024-07-01"]).metadata


# -- group -----------------------------------------------------------------------------------
def test_group_split_keeps_groups_together(churn_df, seed, n_rows):
    df = churn_df.withColumn("account", F.substring("customer_id", 2, 7).cast("int") % 500)
    groups = values(df, "account")
    assert len(groups) == 500
    parts = split(df, TRAIN_TEST, method="group", seed=seed, groupCol="account")
    train, test = values(parts["train"], "account"), values(parts["test"], "account")
    assert train.isdisjoint(test)
    assert train | test == groups
    assert len(test) / len(groups) == pytest.approx(TRAIN_TEST["test"], abs=0.07)
    meta = parts.metadata
    assert meta["groupCol"] == "account"
    assert sum(meta["counts"].values()) == n_rows


# -- cold start ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sparse_ratings(spark):
    # Few ratings per user and per item, so a plain random split leaves some cold.
    return ratings(spark, n_users=300, n_items=400, density=0.01, seed=11, partitions=2).cache()


def test_cold_start_split_has_no_cold_users_or_items(sparse_ratings, seed):
    fractions = {"train": 0.7, "test": 0.3}
    total = sparse_ratings.count()

    plain = split(sparse_ratings, fractions, method="random", seed=seed,
                  keyCols=["user_id", "item_id"])
    plain_train = plain["train"].select("user_id", "item_id").collect()
    plain_test = plain["test"].select("user_id", "item_id").collect()
    cold_users = {r[0] for r in plain_test} - {r[0] for r in plain_train}
    cold_items = {r[1] for r in plain_test} - {r[1] for r in plain_train}
    assert cold_users and cold_items, "precondition: a plain random split leaves cold ids"

    parts = split(sparse_ratings, fractions, method="cold_start", seed=seed,
                  userCol="user_id", itemCol="item_id")
    train = parts["train"].select("user_id", "item_id").collect()
    test = parts["test"].select("user_id", "item_id").collect()
    assert test, "test split is empty"
    assert {r[0] for r in test} <= {r[0] for r in train}
    assert {r[1] for r in test} <= {r[1] for r in train}
    pairs_train, pairs_test = {tuple(r) for r in train}, {tuple(r) for r in test}
    assert pairs_train.isdisjoint(pairs_test)
    assert len(pairs_train | pairs_test) == len(train) + len(test) == total
    # Only rows that would have been cold moved; the rest of the random split stands.
    assert pairs_test <= {tuple(r) for r in plain_test}
    counts = parts.metadata["counts"]
    assert counts == {"train": len(train), "test": len(test)}


def test_cold_start_trains_on_the_split_named_train(sparse_ratings, seed):
    # The name decides, not the order: a config file's keys may come back sorted.
    parts = split(sparse_ratings, {"test": 0.3, "train": 0.7}, method="cold_start", seed=seed,
                  userCol="user_id", itemCol="item_id")
    train = parts["train"].select("user_id", "item_id").collect()
    test = parts["test"].select("user_id", "item_id").collect()
    assert len(train) > len(test) > 0
    assert {r[0] for r in test} <= {r[0] for r in train}
    assert {r[1] for r in test} <= {r[1] for r in train}


# -- metadata --------------------------------------------------------------------------------
def test_metadata_contents(churn_df, seed, n_rows):
    parts = split(churn_df, THREE_WAY, method="random", seed=seed, keyCols=["customer_id"])
    assert isinstance(parts, SplitResult)
    meta = parts.metadata
    counts = {name: parts[name].count() for name in THREE_WAY}
    assert meta == {"method": "random", "seed": seed, "fractions": THREE_WAY,
                    "keyCols": ["customer_id"], "counts": counts}
    assert list(meta["fractions"]) == list(THREE_WAY)
    assert list(meta["counts"]) == list(THREE_WAY)
    assert sum(counts.values()) == n_rows
    meta["method"] = "changed"  # the top level is a copy
    assert parts.metadata["method"] == "random"


def test_metadata_nested_values_are_copies(churn_df, seed):
    parts = split(churn_df, TRAIN_TEST, seed=seed, keyCols=["customer_id"])
    counts = dict(parts.metadata["counts"])
    parts.metadata["counts"]["train"] = -1
    assert parts.metadata["counts"] == counts


def test_metadata_cold_start_columns(sparse_ratings, seed):
    parts = split(sparse_ratings, TRAIN_TEST, method="cold_start", seed=seed,
                  userCol="user_id", itemCol="item_id")
    meta = parts.metadata
    assert {k: meta[k] for k in ("method", "seed", "userCol", "itemCol")} == {
        "method": "cold_start", "seed": seed, "userCol": "user_id", "itemCol": "item_id"}
    assert "keyCols" not in meta


# -- bad inputs ------------------------------------------------------------------------------
def _with_score(df):
    return df.withColumn("score", F.rand(7))


BAD_INPUTS = {
    "missing-key-column": (dict(keyCols=["customer_idd"]), SchemaError,
                           ["keyCols", "customer_idd", "Did you mean 'customer_id'?"]),
    "missing-label-column": (dict(method="stratified", labelCol="cancelled_within_weak"),
                             SchemaError, ["labelCol", f"Did you mean '{CHURN_LABEL}'?"]),
    "missing-group-column": (dict(method="group", groupCol="regoin"), SchemaError,
                             ["groupCol", "Did you mean 'region'?"]),
    "fractions-sum": (dict(fractions={"train": 0.8, "test": 0.3}), ParamError,
                      ["fractions", "sum to 1.1"]),
    "negative-fraction": (dict(fractions={"train": 1.2, "test": -0.2}), ParamError,
                          ["fractions['test']", "-0.2"]),
    "unknown-method": (dict(method="stratifed"), ParamError,
                       ["method='stratifed'", "Did you mean 'stratified'?"]),
    "stratified-continuous": (dict(method="stratified", labelCol="score"), SchemaError,
                              ["labelCol", "'score'", "not categorical"]),
    "stratified-no-label": (dict(method="stratified"), ParamError, ["labelCol"]),
    "time-no-column": (dict(method="time"), ParamError, ["timeCol"]),
    "time-string-column": (dict(method="time", timeCol="customer_id"), SchemaError,
                           ["timeCol", "'customer_id'", "string"]),
    "group-no-column": (dict(method="group"), ParamError, ["groupCol"]),
    "cold-start-no-item": (dict(method="cold_start", userCol="customer_id"), ParamError,
                           ["itemCol"]),
    "cutoff-not-a-date": (dict(method="time", timeCol="signup_ts", cutoffs=["next tuesday"]),
                          ParamError, ["cutoffs", "next tuesday"]),
    "cutoffs-too-many": (dict(method="time", timeCol="signup_ts",
                              cutoffs=["2024-03-01", "2024-06-01"]), ParamError, ["cutoffs"]),
    "cutoffs-descending": (dict(method="time", timeCol="signup_ts", fractions=THREE_WAY,
                                cutoffs=["2024-09-01", "2024-03-01"]),
                           ParamError, ["cutoffs", "ascending"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_inputs_raise_typed_errors(churn_df, case):
    kwargs, error, fragments = BAD_INPUTS[case]
    kwargs = {"fractions": TRAIN_TEST, **kwargs}
    df = _with_score(churn_df) if kwargs.get("labelCol") == "score" else churn_df
    with pytest.raises(error) as info:
        _ = split(df, **kwargs).metadata
    assert isinstance(info.value, ValueError)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_empty_dataframe_is_refused(churn_df):
    with pytest.raises(SchemaError, match="empty DataFrame"):
        split(churn_df.limit(0), TRAIN_TEST)
    with pytest.raises(SchemaError, match="empty DataFrame"):
        split(churn_df.where("false"), TRAIN_TEST, method="stratified", labelCol=CHURN_LABEL)


def test_unknown_split_name(churn_df, seed):
    parts = split(churn_df, TRAIN_TEST, seed=seed)
    with pytest.raises(KeyError) as info:
        _ = parts["valid"]
    message = str(info.value)
    assert "'valid'" in message and "['train', 'test']" in message
    assert "valid" not in parts
    assert parts.get("valid") is None
    named = split(churn_df, {"train": 0.8, "validation": 0.2}, seed=seed)
    with pytest.raises(KeyError, match="Did you mean 'validation'"):
        _ = named["valid"]


# -- column names with dots and backticks; the fraction-sum rule ------------------------------
@pytest.fixture(scope="module")
def dotted(spark):
    """60 rows whose every column name needs quoting (`` `id.x` `` and ``lab`el``)."""
    rows = [(i, f"u{i % 7}", f"i{i % 5}", "ab"[i % 2], datetime(2024, 1, 1 + i % 28))
            for i in range(60)]
    return spark.createDataFrame(
        rows, "`id.x` int, `u.id` string, `i``id` string, `lab``el` string, `t.s` timestamp")


@pytest.mark.parametrize("method,cols", [
    ("random", {}), ("random", {"keyCols": ["id.x"]}),
    ("stratified", {"labelCol": "lab`el"}), ("time", {"timeCol": "t.s"}),
    ("group", {"groupCol": "u.id"}), ("cold_start", {"userCol": "u.id", "itemCol": "i`id"})])
def test_columns_with_dots_and_backticks(dotted, seed, method, cols):
    parts = split(dotted, TRAIN_TEST, method=method, seed=seed, **cols)
    ids = [r[0] for name in parts for r in parts[name].select("`id.x`").collect()]
    assert sorted(ids) == list(range(60))  # every row in exactly one split
    assert parts.metadata["counts"]["train"] > parts.metadata["counts"]["test"] > 0


@pytest.mark.parametrize("fractions", [{"train": 0.7, "valid": 0.2, "test": 0.1},
                                       {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3},
                                       {f"p{i}": 0.1 for i in range(10)}])
def test_fractions_with_float_rounding_are_accepted(churn_df, fractions):
    assert split(churn_df, fractions).metadata["fractions"] == fractions


@pytest.mark.parametrize("fractions", [{"train": 0.799999, "test": 0.2},
                                       {"a": 0.333333, "b": 0.333333, "c": 0.333333}])
def test_fractions_short_of_one_are_refused_showing_the_sum(churn_df, fractions):
    with pytest.raises(ParamError, match=r"fractions sum to 0\.999999\d*, not 1.*1/3"):
        split(churn_df, fractions)
