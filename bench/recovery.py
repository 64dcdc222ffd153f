"""TorchEstimator recovery overhead: what one lost worker costs a checkpointed fit.

A fit of ``--epochs`` epochs on 2 workers checkpoints after every epoch. The same fit runs
without a failure and with one injected failure of rank 1 half-way through epoch
``--fail-epoch`` (an exception, and a SIGKILL of its Python worker). Spark retries the
training stage and every rank resumes from the last checkpoint.

Figures (medians over ``--repeats``):
- ``overhead_s``: wall time of the failed fit minus the clean fit's;
- ``interval_s``: the time of one checkpoint interval (one epoch, from the clean fits'
  per-epoch times on rank 0);
- ``ratio``: overhead_s / interval_s. Without checkpoints a failure would cost every epoch done
  before it (``fail_epoch - 1`` intervals plus the restart); with them it costs the restart
  (stage resubmission, worker start, spill, rendezvous) plus the part of the interrupted epoch
  that was done.

Prints one JSON line and saves it as bench/results/recovery.json.

    python bench/recovery.py [--rows 200000] [--epochs 6] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

from _common import machine, start_spark, write_result


def estimator(checkpoint_dir: str, epochs: int) -> Any:
    from sparkdist.models import TorchEstimator

    return TorchEstimator(numWorkers=2, epochs=epochs, batchSize=512, learningRate=0.005,
                          modelKwargs={"hidden": [128, 128]}, seed=3, progress=False,
                          checkpointDir=checkpoint_dir, rendezvousTimeoutSeconds=120)


def timed_fit(df: Any, epochs: int, fault: dict[str, Any] | None) -> tuple[float, Any]:
    from sparkdist.failpoints import arm

    with tempfile.TemporaryDirectory() as work:
        fit = estimator(os.path.join(work, "ckpt"), epochs)
        if fault:
            fit = arm(fit, work, rank=1, **fault)
        started = time.perf_counter()
        model = fit.fit(df)
        seconds = time.perf_counter() - started
        if fault:
            assert os.path.exists(os.path.join(work, "fired-1.pid")), "the fault never fired"
    return seconds, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--fail-epoch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    spark = start_spark("sparkdist-bench-recovery", {"spark.sql.shuffle.partitions": "2"},
                        master="local[2]")
    from sparkdist.datasets import make_nonlinear

    df = spark.createDataFrame(make_nonlinear(args.rows, seed=1, dim=16)).repartition(2).cache()
    df.count()
    started = time.perf_counter()
    timed_fit(df, 1, None)  # warm-up: Python workers with torch imported
    steps = None
    clean, epoch_times = [], []
    for _ in range(args.repeats):
        seconds, model = timed_fit(df, args.epochs, None)
        clean.append(seconds)
        epoch_times += [epoch["seconds"] for epoch in model.history]
        steps = model.trainingSummary["steps_per_epoch"]
    interval = statistics.median(epoch_times)
    result: dict[str, Any] = {
        "rows": args.rows, "epochs": args.epochs, "workers": 2,
        "checkpoint_every_epochs": 1, "steps_per_epoch": steps, "repeats": args.repeats,
        "clean_fit_s": round(statistics.median(clean), 3), "interval_s": round(interval, 3)}
    for kind in ("raise", "kill"):
        fault = {"epoch": args.fail_epoch, "step": steps // 2, "kind": kind}
        failed = [timed_fit(df, args.epochs, fault) for _ in range(args.repeats)]
        resumed = {model.trainingSummary["resumed_from_epoch"] for _, model in failed}
        overhead = statistics.median(s for s, _ in failed) - statistics.median(clean)
        result[kind] = {"failed_fit_s": round(statistics.median(s for s, _ in failed), 3),
                        "overhead_s": round(overhead, 3), "ratio": round(overhead / interval, 3),
                        "resumed_from_epoch": sorted(resumed)}
    result["without_checkpoints_would_redo_s"] = round((args.fail_epoch - 1) * interval, 3)
    result["note"] = (f"failure half-way through epoch {args.fail_epoch} of rank 1; ratio = "
                      "overhead_s / interval_s (one checkpoint interval = one epoch)")
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["machine"] = machine(spark)
    spark.stop()
    write_result("recovery", result, save=True)


if __name__ == "__main__":
    main()
