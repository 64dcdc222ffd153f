"""sparkdist._internals on a live session, against the pyspark and xgboost of constraints.txt
(tests/unit/test_internals.py checks the versions). java_object, push_params_to_java and
wrap_java_model run in every fit of LogisticRegression(solver='allreduce')
(tests/spark/test_lr_allreduce.py)."""

from __future__ import annotations

import json

import pytest

from sparkdist import _internals


def test_jvm_handles(spark):
    assert _internals.jvm_started()
    jvm = _internals.jvm(spark)
    assert jvm.java.lang.Integer.parseInt("7") == 7
    assert _internals.hadoop_conf(spark).getClass().getName() == (
        "org.apache.hadoop.conf.Configuration")
    array = _internals.gateway(spark).new_array(jvm.double, 3)
    assert len(array) == 3
    scala = _internals.java_spark_context(spark.sparkContext)
    assert scala.statusStore() is not None and scala.applicationId() == (
        spark.sparkContext.applicationId)
    rdd = _internals.java_dataframe(spark.range(5).repartition(2)).queryExecution().toRdd()
    assert rdd.getNumPartitions() == 2


def test_params_metadata(spark):
    from pyspark.ml.feature import Binarizer

    stage = Binarizer(threshold=0.5, inputCol="x", outputCol="y")
    record = json.loads(_internals.params_metadata(stage, spark, {"extra": 1}))
    assert (record["uid"], record["paramMap"]["threshold"], record["extra"]) == (
        stage.uid, 0.5, 1)
    assert record["class"] == "pyspark.ml.feature.Binarizer"


def test_xgboost_private_api(spark):
    xgboost_spark = pytest.importorskip("xgboost.spark")
    classifier = xgboost_spark.SparkXGBClassifier
    _internals.xgboost_validate_params(classifier())
    with pytest.raises(ValueError, match="validation_indicator_col"):
        _internals.xgboost_validate_params(classifier(early_stopping_rounds=3))
    # the class count comes from the caller: no DataFrame is read (None would fail)
    three = _internals.xgboost_counting_classes(classifier, 3)
    assert isinstance(three, classifier)
    params = three._get_distributed_train_params(None)
    assert (params["objective"], params["num_class"]) == ("multi:softprob", 3)
    two = _internals.xgboost_counting_classes(classifier, 2)._get_distributed_train_params(None)
    assert two["objective"] == "binary:logistic" and "num_class" not in two


def test_xgboost_session_in_a_task(spark):
    """Outside a task the block changes nothing; in one (a Python worker's TaskContext, set
    here by hand) xgboost.spark's refusing ``_get_spark_session`` answers the active session."""
    core = pytest.importorskip("xgboost.spark.core")
    from pyspark import TaskContext

    refusing = core._get_spark_session
    with _internals.xgboost_session_in_a_task():
        assert core._get_spark_session is refusing
    TaskContext._setTaskContext(TaskContext())
    try:
        with pytest.raises(RuntimeError, match="executor side"):
            refusing()
        with _internals.xgboost_session_in_a_task():
            assert core._get_spark_session() is spark
        assert core._get_spark_session is refusing
    finally:
        TaskContext._setTaskContext(None)
