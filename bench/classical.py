"""Fit time of each sparkdist estimator against the library it wraps, on the same data.

Pairs: sparkdist LogisticRegression / RandomForestClassifier / ALS vs MLlib's, and
XGBoostClassifier vs xgboost.spark's SparkXGBClassifier (both 2 workers). Each pair runs
alternately --repeats times on cached data; the median counts (target: ratio <= 1.05).
Also: the 2-worker XGBoost fit against single-process xgboost on the same rows (time ratio
and test AUC difference). Prints one JSON line.

    python bench/classical.py [--rows 200000] [--repeats 3]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
from _common import alternating, machine, start_spark, timed, write_result
from pyspark.ml import classification as mllib_classification
from pyspark.ml import recommendation as mllib_recommendation
from pyspark.ml.functions import vector_to_array
from pyspark.sql import DataFrame

from sparkdist import models
from sparkdist.datasets import CHURN_COUNTS, CHURN_LABEL, churn, ratings
from sparkdist.evaluation import classification_metrics
from sparkdist.features import FeatureAssembler, split

LABEL = CHURN_LABEL


def pair(ours: Callable[[], object], theirs: Callable[[], object], repeats: int) -> dict:
    medians = alternating({"ours": ours, "theirs": theirs}, repeats)
    ours_s, theirs_s = medians["ours"], medians["theirs"]
    return {"sparkdist_s": round(ours_s, 3), "wrapped_s": round(theirs_s, 3),
            "ratio": round(ours_s / theirs_s, 3)}


def churn_features(spark, rows: int) -> tuple[DataFrame, DataFrame]:
    df = churn(spark, n=rows, seed=0, partitions=2)
    parts = split(df, {"train": 0.8, "test": 0.2}, method="stratified", labelCol=LABEL)
    assembler = FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan"],
                                 labelCol=LABEL).fit(parts["train"])
    train = assembler.transform(parts["train"]).select("features", LABEL).cache()
    test = assembler.transform(parts["test"]).select("features", LABEL).cache()
    train.count(), test.count()
    return train, test


def xgboost_single_process(train: DataFrame, test: DataFrame, params: dict) -> dict:
    """The same model on one process with xgboost's own API; time and test AUC."""
    import xgboost
    from sklearn.metrics import roc_auc_score

    def arrays(df: DataFrame) -> tuple[np.ndarray, np.ndarray]:
        pdf = df.select(vector_to_array("features").alias("x"), LABEL).toPandas()
        return np.stack(pdf["x"].to_numpy()), pdf[LABEL].to_numpy()

    (x, y), (xt, yt) = arrays(train), arrays(test)
    clf = xgboost.XGBClassifier(**params, n_jobs=2)
    seconds = timed(lambda: clf.fit(x, y))
    return {"seconds": seconds, "auc": float(roc_auc_score(yt, clf.predict_proba(xt)[:, 1]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spark = start_spark("sparkdist-bench-classical")
    train, test = churn_features(spark, args.rows)
    figures: dict[str, object] = {"rows": args.rows, "repeats": args.repeats}

    lr = {"labelCol": LABEL, "maxIter": 20}
    figures["logistic_regression"] = pair(
        lambda: models.LogisticRegression(**lr).fit(train),
        lambda: mllib_classification.LogisticRegression(**lr).fit(train), args.repeats)
    rf = {"labelCol": LABEL, "numTrees": 20, "maxDepth": 6, "seed": 1}
    figures["random_forest"] = pair(
        lambda: models.RandomForestClassifier(**rf).fit(train),
        lambda: mllib_classification.RandomForestClassifier(**rf).fit(train), args.repeats)

    xgb = {"max_depth": 4, "n_estimators": 50, "learning_rate": 0.2}
    from xgboost.spark import SparkXGBClassifier

    ours = models.XGBoostClassifier(labelCol=LABEL, num_workers=2, **xgb)
    figures["xgboost"] = pair(
        lambda: ours.fit(train),
        lambda: SparkXGBClassifier(label_col=LABEL, num_workers=2, **xgb).fit(train),
        args.repeats)
    distributed_s = timed(lambda: ours.fit(train))
    distributed_auc = classification_metrics(ours.fit(train).transform(test), labelCol=LABEL)["auc"]
    single = xgboost_single_process(train, test, xgb)
    figures["xgboost_2_workers_vs_single_process"] = {
        "distributed_s": round(distributed_s, 3), "single_s": round(single["seconds"], 3),
        "time_ratio": round(distributed_s / single["seconds"], 2),
        "auc_distributed": round(distributed_auc, 4), "auc_single": round(single["auc"], 4),
        "auc_difference": round(distributed_auc - single["auc"], 4)}

    rated = ratings(spark, n_users=3000, n_items=1000, density=0.05, seed=0).cache()
    als = {"userCol": "user_idx", "itemCol": "item_idx", "ratingCol": "rating", "rank": 8,
           "maxIter": 5, "seed": 1}
    rated = rated.selectExpr("cast(substring(user_id, 2) as int) as user_idx",
                             "cast(substring(item_id, 2) as int) as item_idx", "rating").cache()
    figures["ratings_rows"] = rated.count()
    figures["als"] = pair(lambda: models.ALS(**als).fit(rated),
                          lambda: mllib_recommendation.ALS(**als).fit(rated), args.repeats)
    figures["machine"] = machine(spark)
    write_result("classical", figures)


if __name__ == "__main__":
    main()
