"""Every split method keeps its input's parallelism (issue 32, item 6): each part has as many
partitions as the input, with the rows spread over them as the input's are, so a model fitted
on a part uses every core.

Bound: the input has 4 partitions of equal size (round-robin), so a part's largest partition
holds about 1/4 of the part's rows (binomial noise: about +-0.01 for the 2,000-row test part).
A part is refused when its largest partition holds more than 0.4 of its rows: far above the
noise, and it fails whenever fewer than 3 of the 4 partitions hold the part (a part squeezed
into 1 partition, the old stratified split, shows 1.0; into 2, at least 0.5).
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from sparkdist.datasets import CHURN_LABEL, ratings
from sparkdist.features import split

TRAIN_TEST = {"train": 0.8, "test": 0.2}
PARTITIONS = 4
MAX_SHARE = 0.4


@pytest.fixture(scope="module")
def ratings4(spark):
    df = ratings(spark, n_users=300, n_items=400, density=0.05, seed=11, partitions=PARTITIONS)
    return df.cache()


def _unsized(df):
    """The same rows and partitions, as a DataFrame whose size Spark cannot estimate (built
    from an RDD, like many real inputs): it cannot plan a broadcast join on its own."""
    return df.sparkSession.createDataFrame(df.rdd, df.schema)


def _with_account(df):
    """A group column with 500 values (a narrow column: the partitions stay as they are)."""
    return df.withColumn("account", F.substring("customer_id", 2, 7).cast("int") % 500)


def _partition_sizes(df):
    rows = df.groupBy(F.spark_partition_id().alias("p")).count().collect()
    sizes = {r["p"]: r["count"] for r in rows}
    return [sizes.get(p, 0) for p in range(df.rdd.getNumPartitions())]


CASES = {
    "random": ("churn", {"method": "random", "keyCols": ["customer_id"]}),
    "random-all-columns": ("churn", {"method": "random"}),
    "stratified-binary": ("churn", {"method": "stratified", "labelCol": CHURN_LABEL}),
    "stratified-multiclass": ("churn", {"method": "stratified", "labelCol": "plan"}),
    "stratified-unsized": ("churn-unsized", {"method": "stratified", "labelCol": CHURN_LABEL}),
    "time": ("churn", {"method": "time", "timeCol": "signup_ts"}),
    "group": ("churn", {"method": "group", "groupCol": "account"}),
    "cold_start": ("ratings", {"method": "cold_start", "userCol": "user_id",
                               "itemCol": "item_id"}),
    "cold_start-unsized": ("ratings-unsized", {"method": "cold_start", "userCol": "user_id",
                                               "itemCol": "item_id"}),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_parts_keep_the_input_partitions(churn_df, ratings4, seed, case):
    source, kwargs = CASES[case]
    df = _with_account(churn_df) if source.startswith("churn") else ratings4
    if source.endswith("unsized"):
        df = _unsized(df)
    assert df.rdd.getNumPartitions() == PARTITIONS
    assert max(_partition_sizes(df)) / df.count() <= 0.26  # precondition: an even input

    parts = split(df, TRAIN_TEST, seed=seed, **kwargs)
    total = 0
    for name in parts:
        sizes = _partition_sizes(parts[name])
        assert len(sizes) == PARTITIONS, (name, sizes)
        assert sum(sizes) > 0, name
        assert max(sizes) / sum(sizes) <= MAX_SHARE, (name, sizes)
        total += sum(sizes)
    assert total == df.count()


def test_stratified_part_is_the_input_plus_a_column(churn_df, seed):
    """No row of the part is shuffled: its plan over the input has no hash exchange (the
    ranking job's exchanges are in a separate job, run once by split)."""
    parts = split(churn_df, TRAIN_TEST, method="stratified", seed=seed, labelCol=CHURN_LABEL)
    plan = parts["train"]._jdf.queryExecution().executedPlan().toString()
    assert "BroadcastHashJoin" in plan
    assert "hashpartitioning" not in plan.split("InMemoryRelation")[0], plan


def test_stratified_identical_rows_go_to_the_same_split(spark, seed):
    """A row's split is a function of its values: rows identical in every column land
    together, even where the per-class cut falls among them."""
    rows = [(i % 5, "ab"[i % 2]) for i in range(40)]
    df = spark.createDataFrame(rows, "v int, label string").repartition(3)
    parts = split(df, {"train": 0.6, "valid": 0.25, "test": 0.15}, method="stratified",
                  seed=seed, labelCol="label")
    where = {}
    for name in parts:
        for row in parts[name].collect():
            where.setdefault(tuple(row), set()).add(name)
    assert len(where) == 10
    assert all(len(names) == 1 for names in where.values()), where
    assert sum(parts.metadata["counts"].values()) == 40
