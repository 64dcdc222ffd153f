"""Every distributed estimator runs the same cluster preflight: on a session whose conf turns
Spark security on, XGBoost is refused exactly as TorchEstimator is, before any Spark job."""

from __future__ import annotations

import pytest
from pyspark.ml.linalg import Vectors

from sparkdist.exceptions import ClusterConfigError
from sparkdist.launch.preflight import UNENCRYPTED_OPT_IN
from sparkdist.models import TorchEstimator, XGBoostClassifier

GROUP = "sparkdist-preflight-estimators"


@pytest.fixture
def secured(spark):
    """A session of the test application whose conf says ``spark.authenticate=true``.

    The key is static (``spark.conf.set`` refuses it), so it goes straight into the new
    session's SQL conf, where ``spark.conf.get`` — what preflight reads — finds it."""
    from pyspark.sql import SparkSession

    session = spark.newSession()
    session._jsparkSession.sessionState().conf().setConfString("spark.authenticate", "true")
    assert session.conf.get("spark.authenticate") == "true"
    yield session
    # newSession() made itself the active session: later tests expect the fixture's
    SparkSession._activeSession = spark
    spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)
    assert SparkSession.getActiveSession().conf.get("spark.authenticate", None) != "true"


def _data(session):
    rows = [(Vectors.dense([float(i), float(i % 3)]), float(i % 2)) for i in range(40)]
    return session.createDataFrame(rows, ["features", "label"])


def _refusal(estimator, df) -> tuple[str, list[int]]:
    """The ClusterConfigError's message, and the Spark jobs the fit started."""
    sc = df.sparkSession.sparkContext
    sc.setJobGroup(GROUP, "preflight test")
    try:
        with pytest.raises(ClusterConfigError) as info:
            estimator.fit(df)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return str(info.value), list(sc.statusTracker().getJobIdsForGroup(GROUP))


def test_xgboost_is_refused_on_a_secured_cluster_like_torch(secured):
    df = _data(secured)
    xgb_message, xgb_jobs = _refusal(XGBoostClassifier(num_workers=1, n_estimators=2), df)
    torch_message, _ = _refusal(TorchEstimator(numWorkers=1, epochs=1, batchSize=8), df)
    assert xgb_message == torch_message
    assert "spark.authenticate=true" in xgb_message and UNENCRYPTED_OPT_IN in xgb_message
    assert xgb_jobs == [], "XGBoost started Spark jobs before its preflight refused the fit"


@pytest.mark.slow
def test_xgboost_opt_in_passes_the_security_check(secured):
    estimator = XGBoostClassifier(num_workers=1, n_estimators=2, allowUnencrypted=True,
                                  verbose=False)
    assert estimator.getOrDefault("allowUnencrypted") is True
    model = estimator.fit(_data(secured))
    assert model.transform(_data(secured)).count() == 40
