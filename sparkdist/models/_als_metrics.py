"""ALS evaluation: ranking quality at ``k`` (precision, recall, NDCG, MAP) and rating errors
(RMSE, MAE), over rows already indexed by :mod:`sparkdist.models._als_ids` and restricted to
users and items the model knows. :meth:`~sparkdist.models.als.ALSModel.rankingMetrics` is the
public entry point."""

from __future__ import annotations

from typing import Any

from pyspark.ml.evaluation import RankingEvaluator, RegressionEvaluator
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sparkdist.exceptions import ParamError, SchemaError
from sparkdist.models._als_ids import _I, _R, _U

#: RankingEvaluator's metric per key of the result (``precision@k``, ...).
RANKING_METRICS = {"precision": "precisionAtK", "recall": "recallAtK", "ndcg": "ndcgAtK",
                   "map": "meanAveragePrecisionAtK"}


def check_k(name: str, k: int) -> None:
    """ParamError unless ``k`` is a whole number >= 1."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ParamError(f"{name}={k!r} must be a whole number >= 1, e.g. {name}=10.")


def ranking_metrics(mllib_model: Any, known: DataFrame, k: int, threshold: float | None,
                    implicit: bool) -> dict[str, float]:
    """``precision@k`` .. ``map@k`` of ``mllib_model``'s top-``k`` recommendations against
    each user's relevant items in ``known`` (columns ``_U``, ``_I``, ``_R``): rated >=
    ``threshold``, else > 0 (implicit feedback), else >= the user's mean rating."""
    r = F.col(_R)
    if threshold is not None:
        relevant = r >= float(threshold)
    elif implicit:
        relevant = r > 0
    else:
        relevant = r >= F.avg(r).over(Window.partitionBy(_U))
    truth = (known.withColumn("_relevant", relevant).where("_relevant").groupBy(_U)
             .agg(F.collect_set(F.col(_I).cast("double")).alias("label")))
    recs = mllib_model.recommendForUserSubset(truth.select(_U), k)
    top = recs.select(_U, F.transform("recommendations", lambda x: x[_I].cast("double"))
                      .alias("prediction"))
    scored = truth.join(top, _U).cache()
    try:
        if scored.isEmpty():
            raise _nothing_to_rank(known, threshold)
        evaluator = RankingEvaluator(labelCol="label", predictionCol="prediction", k=k)
        return {f"{key}@{k}": evaluator.evaluate(scored, {evaluator.metricName: metric})
                for key, metric in RANKING_METRICS.items()}
    finally:
        scored.unpersist()


def _nothing_to_rank(known: DataFrame, threshold: float | None) -> SchemaError:
    if known.isEmpty():
        return SchemaError("rankingMetrics: no row of the DataFrame has a rating and a user "
                           "and item the model was trained on; evaluate on data that "
                           "overlaps the training users and items (e.g. a cold_start "
                           "split).")
    return SchemaError(f"rankingMetrics: no user has a rating >= relevanceThreshold="
                       f"{threshold}; lower the threshold.")


def rating_errors(mllib_model: Any, known: DataFrame, prediction_col: str) -> dict[str, float]:
    """RMSE and MAE of ``mllib_model``'s predictions of ``known``'s ``_R`` ratings (cold
    starts dropped)."""
    predictions = mllib_model.setColdStartStrategy("drop").transform(known).cache()
    evaluator = RegressionEvaluator(labelCol=_R, predictionCol=prediction_col)
    try:
        return {m: evaluator.evaluate(predictions, {evaluator.metricName: m})
                for m in ("rmse", "mae")}
    finally:
        predictions.unpersist()
