"""get_spark against the live test session."""

from __future__ import annotations

from sparkdist.session import get_spark


def test_returns_the_active_session(spark):
    assert get_spark() is spark


def test_local_defaults_applied(spark):
    conf = spark.conf
    assert conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.sql.shuffle.partitions") == "2"  # the fixture's explicit conf wins
