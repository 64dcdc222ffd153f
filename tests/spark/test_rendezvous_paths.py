"""Both rendezvous paths of a barrier stage, run on the local session: through the driver's
report socket (what local masters take by default) and Spark's ``allGather`` (what clusters
take), picked by the Spark conf ``spark.sparkdist.rendezvous`` (:mod:`sparkdist.launch.barrier`).
A small set on each: the rendezvous itself, and a 2-worker ddp fit whose rank fails, so that
it trains through two rendezvous (the first attempt's and the retry's) and resumes from its
checkpoint (marked slow: ``make test`` runs it, ``make test-fast`` runs the rendezvous
only). About 2 s and 15 s a path on a warm session."""

from __future__ import annotations

import json

import pytest

from sparkdist.datasets import make_nonlinear
from sparkdist.exceptions import ClusterConfigError
from sparkdist.failpoints import arm
from sparkdist.launch.barrier import (
    DRIVER_RENDEZVOUS_LOG_PREFIX,
    RENDEZVOUS_CONF,
    SYNC_LOG_PREFIX,
    run_barrier,
)

#: What a rank logs when it gathers by each path.
LOGGED = {"driver": DRIVER_RENDEZVOUS_LOG_PREFIX, "spark": SYNC_LOG_PREFIX}


def _set_conf(spark, value):
    """Set (or, with None, unset) the rendezvous conf; return what it was."""
    previous = spark.conf.get(RENDEZVOUS_CONF, None)
    if value is None:
        spark.conf.unset(RENDEZVOUS_CONF)
    else:
        spark.conf.set(RENDEZVOUS_CONF, value)
    return previous


@pytest.fixture(params=sorted(LOGGED))
def path(request, spark):
    """Each rendezvous path in turn, set on the shared session for the test only."""
    previous = _set_conf(spark, request.param)
    yield request.param
    _set_conf(spark, previous)


@pytest.fixture(scope="module")
def data(spark, cached):
    with cached(spark.createDataFrame(make_nonlinear(1000, 3)).repartition(2)) as df:
        yield df


def _gather(spark) -> dict:
    """One barrier stage of 2 ranks that only meet: rank 0's log tail, hosts and placement."""

    def rendezvous_worker(context, batches, args):  # pickled by value (a nested function)
        import json

        for _ in batches:
            pass
        found = context.rendezvous()
        return json.dumps({"tail": context.tail(), "hosts": list(found.hosts),
                           "placement": context.placement}).encode()

    return json.loads(run_barrier(spark.range(2, numPartitions=2), rendezvous_worker, {}, 2))


def test_the_ranks_gather_by_the_path_the_conf_names(spark, path):
    out = _gather(spark)
    other = next(name for name in LOGGED if name != path)
    assert LOGGED[path] in out["tail"] and LOGGED[other] not in out["tail"]
    assert [p["rank"] for p in out["placement"]] == [0, 1] and len(out["hosts"]) == 2


@pytest.mark.slow
def test_a_fit_trains_and_resumes_after_a_failed_rank(data, path, tmp_path):
    from sparkdist.models import TorchEstimator

    estimator = arm(
        TorchEstimator(epochs=2, numWorkers=2, batchSize=100, learningRate=0.01, seed=5,
                       modelKwargs={"hidden": [16]}, checkpointDir=str(tmp_path / "ckpt"),
                       rendezvousTimeoutSeconds=60, progress=False),
        str(tmp_path), rank=1, epoch=2, step=0, action="raise")
    model = estimator.fit(data)
    summary = model.trainingSummary
    assert (tmp_path / "fired-1.pid").exists() and summary["resumed_from_epoch"] == 1
    assert [epoch["epoch"] for epoch in model.history] == [1, 2]
    assert model.history[1]["loss"] < model.history[0]["loss"]


def test_an_unknown_path_is_refused_before_the_stage(spark):
    previous = _set_conf(spark, "sideways")
    try:
        with pytest.raises(ClusterConfigError, match=rf"{RENDEZVOUS_CONF}='sideways'.*auto"):
            _gather(spark)
    finally:
        _set_conf(spark, previous)
