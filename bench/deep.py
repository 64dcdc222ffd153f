"""TorchEstimator: feed throughput, scaling, fixed overhead and Spark barrier syncs per fit.

(a) feed: rows/s the training loop consumes (a linear model, large batches) against a bare
    barrier ``mapInArrow`` that only counts the rows of the same cached DataFrame (target
    >= 0.8). Headline: the first epoch, fed from Spark: ``rows / (spill + epoch 1 seconds)``
    on rank 0 over ``rows / bare job time``; also reported: later epochs (memory-mapped
    feed) and the whole fit's wall time, fixed costs included.
(b) scaling: samples/s of a compute-bound MLP on 2 workers against 1, same global batch, one
    thread per worker, from the per-epoch times rank 0 records (epochs 2..N; target >= 1.7).
    Compute-bound: a batch of 2048 rows per step, so that a step's arithmetic outweighs its
    gradient all-reduce.
(c) overhead: wall time of a one-step fit (rows == batchSize) against TorchDistributor
    (num_processes=2, local_mode=False) running the same single DDP step (target <= 0.5).
(d) syncs: Spark barrier syncs per fit, counted twice: by Spark's BarrierCoordinator (its INFO
    line per completed sync) and by the lines rank 0 logs before each sync (target <= 2).

Every fit's executor output is captured to count (d): in local mode the executors' Python
workers write through the JVM, whose stdout/stderr are inherited from this process when the
SparkSession starts. A ``dup2`` in this process after that point does not reach the JVM, so the
capture is set up before the session starts and kept for the whole run. Prints one JSON line
and saves it as bench/results/deep.json.

    python bench/deep.py [--rows 400000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "deep.json"
SETTLE_S = 0.5  # for the JVM to copy the executors' last lines into the capture


class Capture:
    """This process's stdout and stderr, and with them the JVM's, in one temporary file."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()
        self.saved: tuple[int, int] | None = None

    def __enter__(self) -> Capture:
        sys.stdout.flush(), sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        os.dup2(self.file.fileno(), 1)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        sys.stdout.flush(), sys.stderr.flush()
        assert self.saved is not None
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)
        if error is not None:  # the executors' side of the story
            print(self.text_since(0)[-6000:], file=sys.stderr)

    def offset(self) -> int:
        return os.fstat(self.file.fileno()).st_size

    def text_since(self, offset: int) -> str:
        size = self.offset() - offset
        return os.pread(self.file.fileno(), size, offset).decode(errors="replace")


def sync_counts(text: str) -> dict[str, int]:
    """Barrier syncs in a stretch of captured output, as Spark and as sparkdist see them."""
    from sparkdist.launch.barrier import SYNC_LOG_PREFIX

    lines = text.splitlines()
    return {"spark": sum("BarrierCoordinator" in line and "finished successfully" in line
                         for line in lines),
            "rank0_logged": sum(f"[sparkdist rank 0] {SYNC_LOG_PREFIX}" in line
                                for line in lines)}


def timed(capture: Capture, run: Callable[[], Any]) -> tuple[float, Any, dict[str, int]]:
    """Wall seconds of ``run()``, its result and the barrier syncs it made."""
    start = capture.offset()
    begin = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - begin
    time.sleep(SETTLE_S)
    return seconds, result, sync_counts(capture.text_since(start))


def features_frame(spark: Any, rows: int, dim: int, seed: int) -> Any:
    """Cached ``features`` array<float> and 0/1 ``label``, in 2 partitions."""
    from pyspark.sql import functions as F

    features = F.array(*[F.rand(seed * 1000 + i).cast("float") for i in range(dim)])
    df = (spark.range(rows, numPartitions=2).select(features.alias("features"))
          .withColumn("label", (F.col("features")[0] + F.col("features")[1] > 1).cast("float"))
          .cache())
    assert df.count() == rows
    return df


def estimator(**kwargs: Any) -> Any:
    from sparkdist.models import TorchEstimator

    defaults = {"learningRate": 0.01, "seed": 1, "progress": False}
    return TorchEstimator(**{**defaults, **kwargs})


# ------------------------------------------------------------------------------------ (a) feed
def count_rows(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": pa.array([rows], pa.int64())})


def bare_feed(df: Any) -> int:
    """The reference: a barrier stage that reads every row into Python and counts them."""
    counted = (df.select("features", "label").mapInArrow(count_rows, "rows long", barrier=True)
               .repartition(1).collect())
    return sum(row["rows"] for row in counted)


def feed(spark: Any, capture: Capture, rows: int, epochs: int, repeats: int,
         syncs: list[dict]) -> dict:
    df = features_frame(spark, rows, 32, seed=1)
    est = estimator(modelKwargs={"hidden": []}, epochs=epochs, numWorkers=2, batchSize=4096)
    assert bare_feed(df) == rows  # warm-up: Python workers, for both sides alike
    est.fit(df)
    bare, fits, spills, first, later = [], [], [], [], []
    for _ in range(repeats):
        bare.append(timed(capture, lambda: bare_feed(df))[0])
        seconds, model, counted = timed(capture, lambda: est.fit(df))
        fits.append(seconds)
        syncs.append(counted)
        spills.append(model.trainingSummary["spill_seconds"])
        first.append(spills[-1] + model.history[0]["seconds"])
        later.append(statistics.median(record["seconds"] for record in model.history[1:]))
    bare_s, fit_s, spill_s, first_s, later_s = (statistics.median(x) for x in
                                                (bare, fits, spills, first, later))
    reference = rows / bare_s
    rates = {"spill": rows / spill_s, "first_epoch": rows / first_s, "later_epochs": rows / later_s,
             "wall": rows * epochs / fit_s}
    df.unpersist()
    return {
        "rows": rows, "features": 32, "epochs": epochs, "batch_size": 4096, "model": "linear",
        "workers": 2, "bare_mapInArrow_s": round(bare_s, 3), "fit_s": round(fit_s, 3),
        "spill_s": round(spill_s, 3), "first_epoch_s": round(first_s, 3),
        "later_epoch_s": round(later_s, 3),
        "bare_rows_per_s": round(reference),
        **{f"loop_rows_per_s_{k}": round(v) for k, v in rates.items()},
        "ratio": round(rates["first_epoch"] / reference, 3),
        "ratio_spill": round(rates["spill"] / reference, 3),
        "ratio_later_epochs": round(rates["later_epochs"] / reference, 3),
        "ratio_wall": round(rates["wall"] / reference, 3),
        "note": "ratio (headline): rows / (rank 0's spill of its partition from Spark + its "
                "first epoch) over rows / time of a barrier mapInArrow that only counts the "
                "rows; ratio_spill: the Spark-to-local-file read alone (no training); "
                "ratio_later_epochs: epochs 2..N, fed from the memory-mapped spill; "
                "ratio_wall: rows*epochs / fit wall time, fixed costs (data check job, "
                "rendezvous, process group, weights back) included."}


# --------------------------------------------------------------------------------- (b) scaling
def scaling(spark: Any, capture: Capture, rows: int, epochs: int, syncs: list[dict]) -> dict:
    df = features_frame(spark, rows, 64, seed=2)
    hidden, batch = [256, 256], 8192
    figures: dict[str, Any] = {"rows": rows, "features": 64, "hidden": hidden,
                               "epochs": epochs, "batch_size": batch, "threads_per_worker": 1}
    samples_per_s = {}
    for workers in (1, 2):
        est = estimator(modelKwargs={"hidden": hidden}, epochs=epochs, numWorkers=workers,
                        batchSize=batch, learningRate=0.001)
        seconds, model, counted = timed(capture, lambda: est.fit(df))  # noqa: B023 (called at once)
        syncs.append(counted)
        timed_epochs = [record["seconds"] for record in model.history[1:]]
        samples_per_s[workers] = rows / statistics.median(timed_epochs)
        figures[f"workers_{workers}"] = {
            "fit_s": round(seconds, 3), "epoch_s": [round(s, 3) for s in timed_epochs],
            "samples_per_s": round(samples_per_s[workers])}
    df.unpersist()
    figures["speedup"] = round(samples_per_s[2] / samples_per_s[1], 3)
    ceiling, single = machine_ceiling(64, hidden, batch, rows // batch)
    figures["machine_ceiling"] = ceiling
    figures["single_process_samples_per_s"] = round(single)
    figures["workers_1_vs_single_process"] = round(samples_per_s[1] / single, 3)
    figures["note"] = ("samples/s = rows / median epoch time on rank 0, epochs 2..N (epoch 1 "
                       "warms up); spark.task.cpus=1, so each worker trains on one thread. "
                       "machine_ceiling: the same steps in 2 independent processes (half the "
                       "batch each, no gradient exchange, no Spark) against 1, i.e. the most "
                       "any data-parallel trainer could reach on this machine. "
                       "single_process: the same steps as a plain torch loop on one thread, "
                       "no Spark")
    return figures


def local_steps(input_dim: int, hidden: list[int], rows: int, steps: int) -> float:
    """Seconds for ``steps`` plain training steps on ``rows`` rows, one thread."""
    import torch
    import torch.nn.functional as F

    from sparkdist.torchtrain.nets import MLP

    torch.set_num_threads(1)
    model = MLP(input_dim, 1, hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    x, y = torch.randn(rows, input_dim), torch.randint(0, 2, (rows,)).float()
    timings = []
    for _ in range(3):  # the first round warms up
        begin = time.perf_counter()
        for _ in range(steps):
            loss = F.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        timings.append(time.perf_counter() - begin)
    return min(timings[1:])


def machine_ceiling(input_dim: int, hidden: list[int], batch: int,
                    steps: int) -> tuple[float, float]:
    """Speedup of 2 independent single-thread processes (half batch each) over 1, and the
    samples/s of the one (a plain single-process torch loop)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        one = pool.submit(local_steps, input_dim, hidden, batch, steps).result()
    with ProcessPoolExecutor(2, mp_context=spawn) as pool:
        two = max(pool.map(local_steps, *zip(*[(input_dim, hidden, batch // 2, steps)] * 2)))
    return round(one / two, 3), batch * steps / one


# -------------------------------------------------------------------------------- (c) overhead
def one_ddp_step(input_dim: int, hidden: list[int], batch_size: int, seed: int) -> float:
    """TorchDistributor's side: the same MLP, one DDP step on batch_size random rows in all."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from sparkdist.torchtrain.nets import MLP

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        torch.manual_seed(seed)
        model = DistributedDataParallel(MLP(input_dim, 1, hidden))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        torch.manual_seed(seed + dist.get_rank())
        rows = batch_size // dist.get_world_size()
        x, y = torch.randn(rows, input_dim), torch.randint(0, 2, (rows,)).float()
        loss = F.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return float(loss)
    finally:
        dist.destroy_process_group()


def overhead(spark: Any, capture: Capture, repeats: int, syncs: list[dict]) -> dict:
    """Per round: TorchDistributor, then a sparkdist fit (cold), then another (warm).

    TorchDistributor's barrier tasks leave Spark's Python workers unusable for reuse, so the
    fit right after it starts fresh workers and imports torch again ("cold"); the next fit
    reuses them ("warm", the usual case for repeated fits in one session). TorchDistributor
    starts new torchrun processes on every run, so each of its runs is cold by design.
    """
    from pyspark.ml.torch.distributor import TorchDistributor

    batch, dim, hidden = 256, 64, [512, 512]
    df = features_frame(spark, batch, dim, seed=3)
    est = estimator(modelKwargs={"hidden": hidden}, epochs=1, numWorkers=2, batchSize=batch)
    distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    times: dict[str, list[float]] = {"torch_distributor": [], "cold": [], "warm": []}
    their_syncs = []
    for _ in range(repeats):
        seconds, loss, counted = timed(
            capture, lambda: distributor.run(one_ddp_step, dim, hidden, batch, 1))
        assert loss == loss  # a number came back
        times["torch_distributor"].append(seconds)
        their_syncs.append(counted["spark"])
        for kind in ("cold", "warm"):
            seconds, model, counted = timed(capture, lambda: est.fit(df))
            assert model.history[0]["epoch"] == 1
            times[kind].append(seconds)
            syncs.append(counted)
    df.unpersist()
    theirs, warm, cold = (statistics.median(times[k]) for k in ("torch_distributor", "warm",
                                                                 "cold"))
    return {"rows": batch, "batch_size": batch, "hidden": hidden, "features": dim,
            "workers": 2, "repeats": repeats, "sparkdist_s": round(warm, 3),
            "sparkdist_cold_s": round(cold, 3), "torch_distributor_s": round(theirs, 3),
            "ratio": round(warm / theirs, 3), "ratio_cold": round(cold / theirs, 3),
            "torch_distributor_barrier_syncs": max(their_syncs),
            "note": "ratio (headline): a fit whose Spark Python workers already imported torch "
                    "(any earlier fit in the session) over TorchDistributor.run; ratio_cold: "
                    "the fit right after TorchDistributor, which leaves no reusable Python "
                    "workers, so it pays worker start and torch import like a first fit"}


# -------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=400_000, help="rows for (a)")
    parser.add_argument("--scaling-rows", type=int, default=160_000, help="rows for (b)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs for (a) and (c)")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    started = time.perf_counter()
    load = [os.getloadavg()[0]]
    syncs: list[dict] = []
    with Capture() as capture:  # before the JVM starts, so that it inherits the capture
        from sparkdist.session import get_spark

        spark = get_spark(master=os.environ.get("SPARKDIST_MASTER", "local[2]"),
                          conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                "spark.ui.showConsoleProgress": "false"})
        jvm = spark.sparkContext._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.BarrierCoordinator", jvm.org.apache.logging.log4j.Level.INFO)
        figures: dict[str, Any] = {"benchmark": "deep", "repeats": args.repeats}
        figures["feed"] = feed(spark, capture, args.rows, 3, args.repeats, syncs)
        load.append(os.getloadavg()[0])
        figures["scaling"] = scaling(spark, capture, args.scaling_rows, 4, syncs)
        load.append(os.getloadavg()[0])
        figures["overhead"] = overhead(spark, capture, args.repeats, syncs)
        load.append(os.getloadavg()[0])
        figures["barrier_syncs"] = {
            "per_fit": max(count["spark"] for count in syncs),
            "rank0_logged_per_fit": max(count["rank0_logged"] for count in syncs),
            "fits_counted": len(syncs),
            "consistent": all(count["spark"] == count["rank0_logged"] for count in syncs)}
        import torch

        figures["seconds"] = round(time.perf_counter() - started, 1)
        figures["machine"] = (f"{os.cpu_count()} cores, Python {platform.python_version()}, "
                              f"Spark {spark.version}, torch {torch.__version__}, master "
                              f"{spark.sparkContext.master}, load avg (1 min) "
                              f"{'/'.join(f'{x:.2f}' for x in load)}")
        spark.stop()
    line = json.dumps(figures)
    print(line)
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(line + "\n")
    os.replace(tmp, RESULTS)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
