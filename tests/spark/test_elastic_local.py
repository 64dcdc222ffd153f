"""Elastic plans on real Spark in local mode (where task slots never change): the history
records each training attempt, a restart on the same slots stays on the same workers, and a
fit whose restart finds enough slots is not disturbed. Lost executors: tests/cluster/
test_elastic.py."""

from __future__ import annotations

import os
import sys

import pytest
from pyspark import cloudpickle

from sparkdist.launch.barrier import run_barrier
from sparkdist.launch.elastic import ElasticPlan

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers travel by value


def _fail_once_after_rendezvous(context, batches, args):
    """Rendezvous, then rank 1 fails the first attempt (a marker file counts attempts)."""
    context.rendezvous()
    marker = os.path.join(args["dir"], "failed")
    if context.rank == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("rank 1 fails its first attempt")
    return f"{context.world_size} workers, batch {args['batch_size']}".encode()


@pytest.mark.slow
def test_a_restart_on_the_same_slots_keeps_the_workers_and_the_history_has_both(spark,
                                                                             tmp_path):
    plan = ElasticPlan(min_workers=1, slot_wait_s=30,
                       for_world=lambda args, world: {**args, "batch_size": 99})
    out = run_barrier(spark.range(4), _fail_once_after_rendezvous,
                      {"dir": str(tmp_path), "batch_size": 8}, 2, max_retries=2, elastic=plan)
    assert out == b"2 workers, batch 8"  # Spark's in-place retry: not re-planned
    assert plan.worker_counts == [2, 2]
    assert any("rendezvous of 2 done" in what for _, what in plan.timeline)


@pytest.mark.slow
def test_a_torch_fit_reports_its_worker_counts(spark, nonlinear):
    from sparkdist.models import TorchEstimator

    train, _ = nonlinear
    model = TorchEstimator(numWorkers=2, minWorkers=1, epochs=1, progress=False,
                           batchSize=256).fit(train)
    assert model.trainingSummary["worker_counts"] == [2]
    assert model.trainingSummary["world_size"] == 2
