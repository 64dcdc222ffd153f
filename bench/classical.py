"""Fit time of each sparkdist estimator against the library it wraps, on the same data.

Pairs: sparkdist LogisticRegression / RandomForestClassifier / ALS vs MLlib's, and
XGBoostClassifier vs xgboost.spark's SparkXGBClassifier (both 2 workers). Each pair runs
alternately --repeats times on cached data; the median counts (target: ratio <= 1.05).
Also: the 2-worker XGBoost fit against single-process xgboost on the same rows (time ratio
and test AUC difference). ALS runs 5 rounds (at least --repeats): the median of the rounds'
ratios and their spread. Prints one JSON line.

LogisticRegression(solver='allreduce') against MLlib's LogisticRegression (issue 15): fit
time on --lr-rows x --lr-features dense generated rows (binomial, and --lr-classes classes
multinomial), same Params (MLlib's defaults: maxIter 100, tol 1e-6, no regularisation, and
an elastic-net row), both timed from the driver, alternating, median of --repeats after a
warm-up (target: mllib_s / allreduce_s >= 3), each round caching the rows anew and then
fitting them three times in turn: "first" (the first fit of the newly cached rows, which reads
them), "allreduce" (a later fit of the same rows, as a regParam grid's, which finds them held
by its ranks' Python workers) and MLlib, each timed alone; the test log-loss difference
(target <= 1e-4)
and the largest coefficient difference on the standardised scale (coefficient x feature std,
target <= 1e-3). Also scikit-learn's lbfgs on one core (threadpoolctl) on the same rows
collected to the driver, the single-machine reference (target: allreduce within 1.5x), with
each side's iterations beside the times (they stop by different rules: sklearn's on the
gradient, MLlib's and allreduce's on the objective's change).

    python bench/classical.py [--rows 200000] [--repeats 3] [--only lr] [--lr-rows 1000000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
from _common import alternating, machine, median_time, start_spark, timed, write_result
from pyspark.ml import classification as mllib_classification
from pyspark.ml import recommendation as mllib_recommendation
from pyspark.ml.functions import vector_to_array
from pyspark.sql import DataFrame

from sparkdist import models
from sparkdist.datasets import CHURN_COUNTS, CHURN_LABEL, churn, ratings
from sparkdist.evaluation import classification_metrics
from sparkdist.features import FeatureAssembler, split

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/models", "sparkdist/features", "sparkdist/launch", "sparkdist/_params.py")
LABEL = CHURN_LABEL
LR_LABEL = "label"


def pair(ours: Callable[[], object], theirs: Callable[[], object], repeats: int) -> dict:
    medians = alternating({"ours": ours, "theirs": theirs}, repeats)
    ours_s, theirs_s = medians["ours"], medians["theirs"]
    return {"sparkdist_s": round(ours_s, 3), "wrapped_s": round(theirs_s, 3),
            "ratio": round(ours_s / theirs_s, 3)}


def runs_pair(ours: Callable[[], object], theirs: Callable[[], object], runs: int) -> dict:
    """``pair`` with each run's ratio kept: after one untimed round, ``runs`` rounds in turn;
    the median ratio of the rounds and its spread (lowest, highest)."""
    for call in (ours, theirs):
        call()
    ratios, ours_s, theirs_s = [], [], []
    for _ in range(runs):
        ours_s.append(timed(ours))
        theirs_s.append(timed(theirs))
        ratios.append(ours_s[-1] / theirs_s[-1])
    return {"sparkdist_s": round(statistics.median(ours_s), 3),
            "wrapped_s": round(statistics.median(theirs_s), 3),
            "ratio": round(statistics.median(ratios), 3),
            "ratio_spread": [round(min(ratios), 3), round(max(ratios), 3)],
            "ratios": [round(r, 3) for r in ratios], "runs": runs}


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


# -- logistic regression: allreduce vs MLlib vs scikit-learn ---------------------------------
def lr_data(spark, rows: int, features: int, classes: int, seed: int = 0) -> DataFrame:
    """Dense rows from a logistic (softmax) model with logistic (Gumbel) noise, features on
    scales 1..5, in 2 partitions; ``test`` marks every 10th row."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    rng = np.random.default_rng(seed)
    scales = 1.0 + np.arange(features) % 5
    truth = rng.normal(size=(classes if classes > 2 else 1, features)) / scales
    df = spark.range(rows, numPartitions=2)
    x = [F.randn(seed * 1000 + j) * float(scales[j]) for j in range(features)]
    df = df.select("id", F.array(*x).alias("x"))

    def margin(k: int) -> object:
        return sum((F.col("x")[j] * float(truth[k, j]) for j in range(features)), F.lit(0.0))

    def noise(k: int) -> object:  # Gumbel; the difference of two is logistic
        return -F.log(-F.log(F.rand(seed * 1000 + features + k) * 0.999998 + 0.000001))

    if classes > 2:
        scores = F.array(*[margin(k) + noise(k) for k in range(classes)])
        label = F.array_position(scores, F.array_max(scores)) - 1
    else:
        label = F.when(margin(0) + noise(0) > noise(1), 1).otherwise(0)
    return df.select((F.col("id") % 10 == 0).alias("test"),
                     array_to_vector("x").alias("features"),
                     label.cast("double").alias(LR_LABEL))


def arrays(df: DataFrame) -> tuple[np.ndarray, np.ndarray]:
    table = df.select(vector_to_array("features").alias("x"), LR_LABEL).toArrow()
    width = len(table.column("x")[0])
    x = table.column("x").combine_chunks().flatten().to_numpy().reshape(-1, width)
    return x, table.column(LR_LABEL).to_numpy()


def log_loss(coefficients: np.ndarray, intercepts: np.ndarray, x: np.ndarray,
             y: np.ndarray) -> float:
    margins = x @ coefficients.T + intercepts
    if coefficients.shape[0] == 1:
        margins = np.hstack([np.zeros_like(margins), margins])
    margins -= margins.max(axis=1, keepdims=True)
    log_p = margins - np.log(np.exp(margins).sum(axis=1, keepdims=True))
    return float(-log_p[np.arange(len(y)), y.astype(int)].mean())


def sklearn_lbfgs(x: np.ndarray, y: np.ndarray, params: dict, repeats: int) -> tuple:
    """scikit-learn's lbfgs on one core: median seconds and the fitted model."""
    from sklearn.linear_model import LogisticRegression as SklearnLR
    from threadpoolctl import threadpool_limits

    reg = params.get("regParam", 0.0)
    options = {"C": 1.0 / (reg * len(y))} if reg else {"C": np.inf}
    model = SklearnLR(solver="lbfgs", max_iter=params.get("maxIter", 100), tol=1e-6,
                      **options)
    with threadpool_limits(1):
        seconds = median_time(lambda: model.fit(x, y), repeats)
    return seconds, model


def lr_rows(spark, rows: int, features: int, classes: int, repeats: int,
            params: dict, with_sklearn: bool) -> dict:
    data = lr_data(spark, rows, features, classes).cache()
    train = data.where("not test").drop("test").cache()
    test = data.where("test").drop("test")
    n = train.count()
    fits: dict[str, object] = {}

    def cache_anew() -> None:  # new blocks: the next fit is a first fit of these rows
        nonlocal train
        train.unpersist()
        train = data.where("not test").drop("test").cache()
        train.count()

    sides: dict[str, Callable[[], object]] = {
        "first": lambda: models.LogisticRegression(solver="allreduce", **params).fit(train),
        "allreduce": lambda: models.LogisticRegression(solver="allreduce", **params).fit(train),
        "mllib": lambda: mllib_classification.LogisticRegression(**params).fit(train)}
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(repeats + 1):  # the first round warms up, untimed
        cache_anew()
        for name, call in sides.items():  # in turn; "allreduce" right after "first"
            started = time.perf_counter()
            fits[name] = call()
            if round_:
                seconds[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    xt, yt = arrays(test)
    x, y = arrays(train)
    std = x.std(axis=0, ddof=1)
    coef = {k: (m.coefficientMatrix.toArray(), m.interceptVector.toArray())  # type: ignore
            for k, m in fits.items()}
    losses = {k: log_loss(c, b, xt, yt) for k, (c, b) in coef.items()}
    figures = {
        "rows": n, "features": features, "classes": classes, "params": params,
        "allreduce_s": round(medians["allreduce"], 3), "mllib_s": round(medians["mllib"], 3),
        "speedup": round(medians["mllib"] / medians["allreduce"], 2),
        "first_fit_s": round(medians["first"], 3),
        "speedup_first_fit": round(medians["mllib"] / medians["first"], 2),
        "runs_s": {name: [round(v, 3) for v in values] for name, values in seconds.items()},
        "iterations_allreduce": fits["allreduce"].summary.totalIterations,  # type: ignore
        "iterations_mllib": fits["mllib"].summary.totalIterations,  # type: ignore
        "test_logloss_allreduce": round(losses["allreduce"], 6),
        "test_logloss_mllib": round(losses["mllib"], 6),
        "logloss_difference": float(f"{abs(losses['allreduce'] - losses['mllib']):.2e}"),
        "max_std_coefficient_difference": float(
            f"{np.abs((coef['allreduce'][0] - coef['mllib'][0]) * std).max():.2e}"),
        "zero_pattern_equal": bool(((coef["allreduce"][0] == 0)
                                    == (coef["mllib"][0] == 0)).all())}
    if with_sklearn:
        sk_seconds, model = sklearn_lbfgs(x, y, params, repeats)
        reference = model.coef_ if classes > 2 else model.coef_[:1]
        figures.update({
            "sklearn_1core_s": round(sk_seconds, 3),
            "iterations_sklearn": int(model.n_iter_.max()),
            "allreduce_vs_sklearn": round(medians["allreduce"] / sk_seconds, 2),
            "test_logloss_sklearn": round(log_loss(reference, model.intercept_, xt, yt), 6)})
    data.unpersist()
    train.unpersist()
    return figures


def logistic_regression_figures(spark, args: argparse.Namespace) -> dict:
    rows, width, repeats = args.lr_rows, args.lr_features, args.repeats
    out = {"binomial": lr_rows(spark, rows, width, 2, repeats, {"labelCol": LR_LABEL}, True),
           "elastic_net": lr_rows(spark, rows, width, 2, repeats,
                                  {"labelCol": LR_LABEL, "regParam": 0.01,
                                   "elasticNetParam": 0.5}, False)}
    if args.lr_classes > 2:
        out["multinomial"] = lr_rows(spark, rows, width, args.lr_classes, repeats,
                                     {"labelCol": LR_LABEL}, True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["all", "lr"], default="all",
                        help="lr: only the LogisticRegression allreduce-vs-MLlib rows")
    parser.add_argument("--lr-rows", type=int, default=1_000_000)
    parser.add_argument("--lr-features", type=int, default=50)
    parser.add_argument("--lr-classes", type=int, default=10,
                        help="classes of the multinomial row (<= 2: no multinomial row)")
    args = parser.parse_args()
    # the JVM heap is fixed when it starts: MLlib on 1M x 50 rows needs more than 1 GiB
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--driver-memory 6g pyspark-shell")
    spark = start_spark("sparkdist-bench-classical")
    if args.only == "lr":
        write_result("classical_lr", {"logistic_regression_allreduce":
                                      logistic_regression_figures(spark, args),
                                      "repeats": args.repeats, "machine": machine(spark)})
        return
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
    figures["als"] = runs_pair(lambda: models.ALS(**als).fit(rated),
                               lambda: mllib_recommendation.ALS(**als).fit(rated),
                               max(5, args.repeats))
    figures["logistic_regression_allreduce"] = logistic_regression_figures(spark, args)
    figures["machine"] = machine(spark)
    write_result("classical", figures)


if __name__ == "__main__":
    main()
