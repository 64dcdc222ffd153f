"""Test fixtures: S3 on a local moto server, a seed, and cached data sets. The ``spark``
fixture (one local[2] session for the whole run) is in the repository's conftest.py, shared
with the docstring examples."""

from __future__ import annotations

import os

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# S3 for every test is the moto server that the ``moto_s3`` fixture below starts on this
# port (never real AWS). Set here, at import, because Spark's Python workers (which write
# checkpoints) get the environment the JVM had when the session fixture started it.
os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{_free_port()}",
                  AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                  AWS_DEFAULT_REGION="us-east-1")

from contextlib import contextmanager  # noqa: E402

import pytest  # noqa: E402

SEED = 20261201


@contextmanager
def _cached(df):
    """``df`` cached and materialised for the block, unpersisted after it."""
    df = df.cache()
    df.count()
    try:
        yield df
    finally:
        df.unpersist()


@pytest.fixture(scope="session")
def cached():
    """The context manager ``cached(df)`` for module fixtures: ``with cached(df) as df:
    yield df`` caches and counts ``df`` and unpersists it when the module is done."""
    return _cached


@pytest.fixture(scope="session")
def moto_s3(spark):
    """The moto S3 server on the port put in AWS_ENDPOINT_URL above, started once for the run;
    yields an s3fs filesystem (no listing cache). Each module makes its own bucket."""
    import logging
    from urllib.parse import urlparse

    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    jvm_env = spark.sparkContext._jvm.java.lang.System.getenv("AWS_ENDPOINT_URL")
    assert jvm_env == endpoint, "the Spark session started before conftest set the AWS variables"
    url = urlparse(endpoint)
    server = moto_server.ThreadedMotoServer(ip_address=url.hostname, port=url.port,
                                            verbose=False)
    server.start()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    yield s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
    server.stop()


@pytest.fixture
def seed() -> int:
    """The suite's seed: handed to the code under test, and set on Python's and NumPy's
    global generators (and torch's, when installed) for the test that asks for it."""
    import random

    import numpy as np

    random.seed(SEED)
    np.random.seed(SEED)
    try:
        import torch
    except ImportError:
        return SEED
    torch.manual_seed(SEED)
    return SEED


@pytest.fixture(scope="session")
def churn_df(spark):
    """10k churn rows with a known logistic ground truth, cached for the session."""
    from sparkdist.datasets import churn

    return churn(spark, n=10_000, seed=7, partitions=4).cache()


@pytest.fixture(scope="session")
def nonlinear(spark):
    """(train, test): 4000 and 1000 rows of ``make_nonlinear`` in 2 cached partitions each,
    shared by the TorchEstimator tests."""
    from sparkdist.datasets import make_nonlinear

    train = spark.createDataFrame(make_nonlinear(4000, 1)).repartition(2).cache()
    test = spark.createDataFrame(make_nonlinear(1000, 2)).repartition(2).cache()
    yield train, test
    train.unpersist()
    test.unpersist()
