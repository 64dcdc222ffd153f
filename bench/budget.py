"""A per-worker memory budget enforced for real, to show what sharding buys: a model whose
parameters, gradients and Adam state do not fit one worker's budget under ``strategy="ddp"``
trains under ``strategy="fsdp"``, and an embedding table whose training state does not fit
trains under ``strategy="ps"``. A helper of bench/parallel.py and
tests/cluster/test_memory_budget.py (not part of the package): both put bench/ on ``sys.path``
and ``import budget``.

Spark caps each Python worker's address space (``RLIMIT_AS``) at
``spark.executor.pyspark.memory`` divided by the executor's cores: the worker sets the limit
on itself when it starts a task, so an allocation beyond it fails in that process (torch:
``DefaultCPUAllocator: can't allocate memory``) and reaches the driver as the fit's
TrainingError. :func:`budget_session` starts a ``local-cluster`` (one executor JVM and one
Python worker per rank) with that cap; on a real cluster, set the same conf on the cluster.

The cap counts address space, not resident memory: torch's libraries, gloo's threads, pyarrow
and glibc's per-thread malloc arenas map about 2 GiB before a model exists
(:data:`BASELINE_MB`, measured here), so a budget is that plus what the model needs. Most of
it is the arenas: a ps fit of a 16 MiB table trains at 2400 MiB and fails at 2000, and with
``spark.executorEnv.MALLOC_ARENA_MAX=2`` trains at 1200 MiB and fails at 1000 (2026-12-06).

Examples
--------
>>> spark = budget_session(budget_mb=2700)  # doctest: +SKIP
>>> outcome = compare_under_budget(spark, hidden=[4096] * 4)  # doctest: +SKIP
>>> outcome["ddp"]["error"], outcome["fsdp"]["history"][-1]["loss"]  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

#: About what a rank's Python worker maps before its model exists (python, torch, gloo,
#: pyarrow, the feed, malloc's arenas), in MiB, measured under local-cluster on CPU.
BASELINE_MB = 2200


def budget_conf(budget_mb: int) -> dict[str, str]:
    """The Spark conf that caps every Python worker (of a one-core executor) at
    ``budget_mb`` MiB of address space."""
    return {"spark.executor.pyspark.memory": f"{int(budget_mb)}m"}


def budget_session(budget_mb: int, workers: int = 2, executor_heap_mb: int = 2048,
                   driver_heap_mb: int = 3072, conf: dict[str, str] | None = None) -> Any:
    """A new ``local-cluster[workers,1,executor_heap_mb]`` SparkSession whose Python
    workers may each map at most ``budget_mb`` MiB. Stops the active session first (one
    SparkContext per process): call it from a driver of its own.

    The fitted weights travel from rank 0 through its executor's JVM to the driver's, so
    both heaps must hold a few copies of them: ``executor_heap_mb`` and
    ``driver_heap_mb`` (applied only when this call starts the driver's JVM: get_spark
    warns otherwise)."""
    from pyspark.sql import SparkSession

    from sparkdist.session import get_spark

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    settings = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": str(workers),
                "spark.driver.memory": f"{driver_heap_mb}m",  # reaches a JVM get_spark starts
                "spark.executor.memory": f"{executor_heap_mb}m",  # else 1g, whatever the worker has
                **budget_conf(budget_mb), **(conf or {})}
    return get_spark(master=f"local-cluster[{workers},1,{executor_heap_mb}]",
                     app_name=f"sparkdist-budget-{budget_mb}m", conf=settings)


def model_state_mb(hidden: list[int], input_dim: int = 8, output_dim: int = 1) -> dict[str,
                                                                                      float]:
    """MiB of the MLP's parameters, and of parameters + gradients + Adam's two moments
    (float32): what a ddp rank holds whole and an fsdp rank holds ``1/world`` of."""
    widths = [input_dim, *hidden, output_dim]
    count = sum(a * b + b for a, b in zip(widths, widths[1:]))
    params = count * 4 / 2**20
    return {"parameters": params, "training_state": 4 * params}


def table_state_mb(table_mb: float, servers: int) -> dict[str, float]:
    """MiB that a ddp rank and a ps server hold of an embedding table of ``table_mb`` under
    Adagrad: ddp the table, its gradient, DDP's gradient bucket and Adagrad's sum; a ps
    server ``1/servers`` of the rows and of their sums."""
    return {"ddp": 4 * table_mb, "ps": 2 * table_mb / servers}


def compare_under_budget(spark: Any, hidden: list[int], rows: int = 512, epochs: int = 1,
                         workers: int = 2, batch_size: int = 64,
                         strategies: tuple[str, ...] = ("ddp", "fsdp"),
                         **settings: Any) -> dict[str, dict[str, Any]]:
    """Fit the same MLP (``hidden`` layer widths, on ``rows`` rows of
    :func:`sparkdist.datasets.make_nonlinear`) with each strategy in ``spark`` (e.g. a
    :func:`budget_session`), without retries (see :func:`fit_each`)."""
    from sparkdist.datasets import make_nonlinear
    from sparkdist.models import TorchEstimator

    return fit_each(spark.createDataFrame(make_nonlinear(rows, 0)), workers, {
        strategy: TorchEstimator(strategy=strategy, numWorkers=workers, epochs=epochs,
                                 batchSize=batch_size, modelKwargs={"hidden": list(hidden)},
                                 maxRetries=0, progress=False, **settings)
        for strategy in strategies})


def compare_tables_under_budget(spark: Any, table_mb: int, checkpoint_dir: str,
                                rows: int = 256, workers: int = 4, batch_size: int = 64,
                                strategies: tuple[str, ...] = ("ddp", "ps"),
                                ) -> dict[str, dict[str, Any]]:
    """Fit a ``nets.ClickModel`` whose one embedding table holds ``table_mb`` MiB (rows of
    16 float32, two id features) with Adagrad under each strategy, on ``rows`` random rows,
    without retries (see :func:`fit_each`): ddp with the table built on the CPU, as a model
    that every rank holds whole; ps with it built on the meta device, so that no rank ever
    holds it whole (each of the ``workers`` servers draws its rows, and the driver puts the
    fitted table together from what they write under ``checkpoint_dir``)."""
    import numpy as np
    import pandas as pd

    from sparkdist.models import TorchEstimator
    from sparkdist.torchtrain import nets

    per_feature = table_mb * 2**20 // (16 * 4) // 2
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"dense": list(rng.normal(size=(rows, 4))),
                          "ids": list(rng.integers(0, per_feature, (rows, 2))),
                          "label": rng.integers(0, 2, rows).astype(float)})
    kwargs = {"dense": 4, "tables": [per_feature] * 2, "dim": 16, "hidden": [8]}
    return fit_each(spark.createDataFrame(frame), workers, {
        strategy: TorchEstimator(
            model=nets.ClickModel, inputCols={"dense": "dense", "ids": "ids"},
            inputShapes={"ids": [2]}, loss="bce", optimizer="adagrad", psInitStd=0.05,
            modelKwargs={**kwargs, "table_device": "meta" if strategy == "ps" else "cpu"},
            strategy=strategy, numWorkers=workers, epochs=1, batchSize=batch_size,
            checkpointDir=f"{checkpoint_dir}/{strategy}", maxRetries=0, progress=False)
        for strategy in strategies})


def fit_each(data: Any, workers: int, estimators: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per name: ``ok``, and the ``history`` and ``ranks`` (peak RSS, state held) of a fit
    of ``data`` (split over ``workers`` partitions) that trained, or the ``error`` of one
    that did not."""
    from sparkdist.exceptions import TrainingError

    data = data.repartition(workers).cache()
    data.count()
    outcome: dict[str, dict[str, Any]] = {}
    try:
        for name, estimator in estimators.items():
            try:
                model = estimator.fit(data)
            except TrainingError as err:
                outcome[name] = {"ok": False, "error": str(err)}
                continue
            outcome[name] = {"ok": True, "history": model.history,
                             "ranks": model.trainingSummary["ranks"],
                             "parameters_mb": sum(p.numel() * p.element_size() for p in
                                                  model.module().parameters()) / 2**20}
    finally:
        data.unpersist()
    return outcome
