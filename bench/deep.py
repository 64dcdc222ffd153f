"""TorchEstimator against its references, each figure a ratio of two things measured in the
same run (issue 14, "Benchmark protocol"; docs: ../shared/design.md section 5).

Every side is timed the same way: wall clock on the driver around the whole call. Each figure
is the median of ``--repeats`` (3) timed calls per side, after one untimed warm-up of each
side, the sides alternating (A B A B A B). Each figure carries its definition in the JSON.

- feed: rows/s of a 1-epoch linear fit against a bare barrier ``mapInArrow`` doing the same
  JVM vector-to-array conversion and building the same float32 matrices (target >= 0.8).
- memory: max peak RSS over the training workers at 4N rows against N rows (<= 1.2).
- scaling: samples/s of 2 workers against 1 at the default batchSize, optimizer and learning
  rate (>= 1.5); the same at batchSize 8192; the machine's ceiling for context.
- time_to_accuracy: wall time for 2 workers against 1 to reach a validation accuracy (<= 0.65),
  both at the defaults; beside it (``recommended``) the 2-worker side with the learning rate
  docs/deep-models.md recommends for several workers (``learningRateScaling='linear'``,
  ``warmupSteps=300``), the 1-worker side unchanged.
- overhead: a 1-step fit against ``TorchDistributor.run`` of the same DDP step, cold (each call
  in a fresh process) (<= 0.35) and warm (<= 0.15); beside the cold figure (local[2] or
  $SPARKDIST_MASTER, session by get_spark) the same on ``local-cluster[2,1,1024]`` with the
  session built by get_spark and by a plain ``SparkSession.builder`` (``cold_local_cluster``).
- recovery: extra wall time of a fit whose worker is SIGKILLed mid-epoch, against one cold
  1-step fit plus one checkpoint interval (<= 1.0).
- barrier_syncs: Spark barrier syncs per fit, from Spark's BarrierCoordinator log lines.
- ddp_reference (issue 32): samples/s of the scaling figure's 2-worker fit at the defaults
  (MLP hidden [256, 256] on 64 vector features, ``--scaling-rows`` rows, ``--scaling-epochs``
  epochs, the default batchSize per worker, optimizer, learningRate and loss) over samples/s
  of plain torch DDP doing the same outside Spark (bench/ddp_reference.py: ``torchrun
  --standalone --nproc_per_node=2``, gloo, ``torch.set_num_threads(1)`` per rank, each rank
  its half of the rows in memory as tensors, the same steps per epoch), both timed by wall
  clock on the driver around the whole call (torchrun's process start included), the sides
  alternating (bench/_common.py ``cold_and_warm``): cold = each side's first call in the
  section, warm = the median of ``--repeats`` calls after it (target >= 0.9 for both). Beside
  them DDP's steady samples/s: rows x epochs over the slowest rank's seconds between a
  barrier before its first step and one after its last (no process start, rendezvous, data
  or model building), and sparkdist's over the sum of its epochs' seconds.
- allreduce (issue 32): on 2 gloo ranks outside Spark (bench/allreduce.py, torchrun), the
  median ms of one ``dist.all_reduce`` of float32 tensors of 1 element, of the scaling
  model's gradient (82,689 floats, 331 KB) and of 4x it, ``--allreduce-calls`` back-to-back
  calls after 20 untimed, each rank with 1 and then 2 torch threads; and, over half as many
  steps (at least 20), the same model's step (batch 256 per rank) without DDP, with DDP, and
  with DDP plus a bucket-ready hook like sparkdist's StepClock, whose wait (bucket ready to
  backward's return: what TorchEstimator's ranks report as communication) is split into
  waiting for the other rank and the rest, and a bare all-reduce of the gradient's size after
  each step's computation; against them the ddp_reference fits' communication ms per step
  from their ranks (bench/allreduce.py's docstring defines each figure).

The executors' output reaches this process's stdout/stderr through the JVM, so they are
captured into a file before the SparkSession starts (for the sync count); progress goes to
the original stderr. Prints one JSON line; a full run (no --quick, no --only) where every
section succeeded also saves it as bench/results/deep.json. A section that fails records
{"error": ...}, the others still run, and the exit status is 1.

    python bench/deep.py [--quick] [--repeats 3] [--feed-rows 2500000] ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = (
    "sparkdist/models/torch.py",
    "sparkdist/torchtrain",
    "sparkdist/launch",
    "sparkdist/store.py",
    "sparkdist/session.py")
RESULTS = Path(__file__).resolve().parent / "results" / "deep.json"
SETTLE_S = 0.3  # for the JVM to copy the executors' last lines into the capture
SPARK_CONF = {"spark.sql.shuffle.partitions": "2"}
PROTOCOL = ("wall clock on the driver around the whole call; median of {n} per side after one "
            "untimed warm-up of each side; the sides alternate")
STEP_MODEL = {"features": 64, "hidden": [512, 512], "batch_size": 256, "workers": 2}
SCALING_MODEL = {"features": 64, "hidden": [256, 256]}  # scaling's and ddp_reference's MLP
#: learningRateScaling's factor for k workers (sparkdist.torchtrain.schedule's rule)
LR_SCALINGS: dict[str, Callable[[int], float]] = {"none": lambda k: 1.0, "linear": float,
                                                  "sqrt": lambda k: float(k) ** 0.5}


# ---------------------------------------------------------------------------- measuring
class Capture:
    """This process's stdout and stderr, and with them the JVM's, in one temporary file."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()
        self.saved: tuple[int, int] | None = None
        self.calls: list[dict[str, int]] = []  # barrier syncs of each counted timed call

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

    def log(self, message: str) -> None:
        """A progress line on the real stderr."""
        if self.saved is not None:
            os.write(self.saved[1], f"[bench/deep {time.strftime('%X')}] {message}\n".encode())

    def offset(self) -> int:
        return os.fstat(self.file.fileno()).st_size

    def text_since(self, offset: int) -> str:
        size = self.offset() - offset
        return os.pread(self.file.fileno(), size, offset).decode(errors="replace")


def sync_counts(text: str) -> dict[str, int]:
    """Barrier syncs in a stretch of captured output, as Spark and as sparkdist's rank 0 see
    them."""
    from sparkdist.launch import barrier

    lines = text.splitlines()
    prefix = "[sparkdist rank 0] "
    return {"spark": sum("BarrierCoordinator" in line and "finished successfully" in line
                         for line in lines),
            "rank0_logged": sum(prefix + barrier.SYNC_LOG_PREFIX in line for line in lines),
            "driver_rendezvous": sum(
                prefix + getattr(barrier, "DRIVER_RENDEZVOUS_LOG_PREFIX", "\0") in line
                for line in lines)}


@dataclass
class Side:
    """The timed calls of one side of a comparison."""

    seconds: list[float] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    syncs: list[dict[str, int]] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def timed(capture: Capture, call: Callable[[], Any],
          count: bool = True) -> tuple[float, Any, dict[str, int]]:
    """Wall seconds of ``call()``, its result and the barrier syncs it made (kept for the
    per-fit count when ``count``)."""
    start = capture.offset()
    begin = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - begin
    time.sleep(SETTLE_S)
    syncs = sync_counts(capture.text_since(start))
    if count:
        capture.calls.append(syncs)
    return seconds, result, syncs


def alternate(capture: Capture, sides: dict[str, Callable[[], Any]], repeats: int, *,
              warm_up: bool = True, after: dict[str, Callable[[], Any]] | None = None,
              fits: Collection[str] = ()) -> dict[str, Side]:
    """One untimed call of each side, then ``repeats`` rounds of one timed call per side in
    the given order (A B A B ...). ``after[name]`` runs untimed after each call of that side
    (warm-up included); the barrier syncs of the sides named in ``fits`` (TorchEstimator
    fits) count for the per-fit figure."""
    after = after or {}
    if warm_up:
        for name, call in sides.items():
            call()
            if name in after:
                after[name]()
    measured = {name: Side() for name in sides}
    for _ in range(repeats):
        for name, call in sides.items():
            seconds, result, syncs = timed(capture, call, name in fits)
            measured[name].seconds.append(seconds)
            measured[name].results.append(result)
            measured[name].syncs.append(syncs)
            if name in after:
                after[name]()
    return measured


def verdict(ratio: float | None, target: str) -> bool | None:
    """Whether ``ratio`` meets a target written as '>= x' or '<= x'."""
    if ratio is None:
        return None
    sign, bound = target.split()
    return ratio >= float(bound) if sign == ">=" else ratio <= float(bound)


def figure(ratio: float | None, target: str, definition: str, **fields: Any) -> dict:
    rounded = None if ratio is None else round(ratio, 3)
    return {"ratio": rounded, "target": target, "meets_target": verdict(rounded, target),
            **fields, "definition": definition}


def rounded(values: list[float], digits: int = 3) -> list[float]:
    return [round(v, digits) for v in values]


# ---------------------------------------------------------------------------- data, estimators
def session(conf: dict[str, str], master: str | None = None) -> Any:
    """bench/_common.py's session (``master``, else $SPARKDIST_MASTER or local[2]; through
    sparkdist.session.get_spark), plus ``conf``."""
    from _common import start_spark  # bench/ is on sys.path: run as python bench/deep.py

    return start_spark("sparkdist-bench-deep", {**SPARK_CONF, **conf}, master=master)


def plain_conf(master: str) -> dict[str, str]:
    """What a user's own ``SparkSession.builder`` sets for the cold figure's ``plain`` rows:
    the master, the bench's UI, loopback and shuffle settings, and nothing of sparkdist's (no
    ``spark.python.daemon.module``, no Arrow or other get_spark defaults)."""
    return {"spark.master": master, "spark.app.name": "sparkdist-bench-deep-plain",
            "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            **SPARK_CONF}


def plain_session(master: str) -> Any:
    """A session built as a user would, without sparkdist: ``SparkSession.builder`` with
    :func:`plain_conf` (the executors run this Python, as $PYSPARK_PYTHON says)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in plain_conf(master).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def vector_frame(spark: Any, rows: int, dim: int, seed: int, partitions: int) -> Any:
    """Cached: an ML vector ``features`` column of ``dim`` uniform values and a 0/1 ``label``,
    in ``partitions`` partitions, built in the JVM (no Python worker starts)."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    values = F.array(*[F.rand(seed * 1000 + i) for i in range(dim)])
    df = (spark.range(rows, numPartitions=partitions).select(values.alias("v"))
          .select(array_to_vector("v").alias("features"),
                  (F.col("v")[0] + F.col("v")[1] > 1).cast("double").alias("label"))
          .cache())
    assert df.count() == rows
    return df


def nonlinear_frame(spark: Any, rows: int, seed: int, partitions: int) -> Any:
    """Cached ``datasets.make_nonlinear`` rows (features array<float> of 8, label 0/1)."""
    from sparkdist.datasets import make_nonlinear

    df = spark.createDataFrame(make_nonlinear(rows, seed=seed)).repartition(partitions).cache()
    assert df.count() == rows
    return df


def estimator(**kwargs: Any) -> Any:
    from sparkdist.models import TorchEstimator

    return TorchEstimator(**{"seed": 1, "progress": False, **kwargs})


def batch_per_worker() -> bool:
    """Whether batchSize counts rows per worker (DDP, Horovod) rather than in all."""
    from sparkdist.models import TorchEstimator

    return "per worker" in TorchEstimator().getParam("batchSize").doc


def ranks_of(model: Any) -> list[dict] | None:
    """The per-rank figures of a fit (``trainingSummary["ranks"]``), None where absent."""
    return model.trainingSummary.get("ranks")


# ------------------------------------------------------------------------------------ feed
def matrices_counted(batches: Iterator[Any]) -> Iterator[Any]:
    """The bare reference's task: each Arrow batch into a float32 matrix and labels; count."""
    import numpy as np
    import pyarrow as pa

    rows = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        values = batch.column(0).flatten().to_numpy(zero_copy_only=False)
        matrix = values.astype(np.float32, copy=False).reshape(batch.num_rows, -1)
        labels = batch.column(1).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        rows += min(len(matrix), len(labels))
    yield pa.RecordBatch.from_pydict({"rows": pa.array([rows], pa.int64())})


def bare_feed(df: Any, workers: int) -> int:
    """A barrier stage over ``df`` like the fit's: vector_to_array(float32) in the JVM, one
    partition per worker (by the fit's own rule), Arrow batches into matrices, a shuffle and a
    collect after the stage. Returns the rows it read."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    from sparkdist.launch.barrier import _with_partitions

    arrays = df.select(vector_to_array(F.col("features"), "float32").alias("features"),
                       F.col("label").cast("float").alias("label"))
    counted = (_with_partitions(arrays, workers)
               .mapInArrow(matrices_counted, "rows long", barrier=True)
               .repartition(1).collect())
    return sum(row["rows"] for row in counted)


def feed(capture: Capture, df: Any, rows: int, repeats: int) -> tuple[dict, list[Any]]:
    """Figure and the timed fits' models (memory uses them: they are its 4N side)."""
    settings = {"modelKwargs": {"hidden": []}, "epochs": 1, "numWorkers": 2, "batchSize": 4096}
    est = estimator(**settings)

    def bare() -> int:
        counted = bare_feed(df, 2)
        assert counted == rows, counted
        return counted

    sides = alternate(capture, {"fit": lambda: est.fit(df), "bare": bare}, repeats,
                      fits={"fit"})
    fit, reference = sides["fit"], sides["bare"]
    result = figure(
        reference.median / fit.median, ">= 0.8",
        "rows/s of TorchEstimator.fit (linear model, 1 epoch, 2 workers, batchSize 4096, "
        "progress off) over rows/s of a bare barrier mapInArrow that converts the vector "
        "column with vector_to_array(float32) in the JVM, has one partition per worker by the "
        "fit's own rule, turns each Arrow batch into a float32 numpy matrix, counts the rows "
        "and ends in .repartition(1).collect() like the fit's stage; both over the same cached "
        "DataFrame (ML vector features). rows/s = rows / wall seconds of the whole call; "
        + PROTOCOL.format(n=repeats),
        rows=rows, features=32, settings=settings,
        fit_rows_per_s=round(rows / fit.median), bare_rows_per_s=round(rows / reference.median),
        fit_s=round(fit.median, 3), bare_s=round(reference.median, 3),
        fit_runs_s=rounded(fit.seconds), bare_runs_s=rounded(reference.seconds),
        bare_at_least_3_s=reference.median >= 3.0, ranks=ranks_of(fit.results[-1]))
    return result, fit.results


# ---------------------------------------------------------------------------------- memory
def peak_rss(models: list[Any]) -> float | None:
    """The largest peak RSS (MiB) of any rank in any of the fits; None without per-rank data."""
    peaks = [rank["peak_rss_mb"] for model in models for rank in (ranks_of(model) or [])]
    return max(peaks) if peaks and all(ranks_of(m) for m in models) else None


def memory(small: Any, rows: int, large_models: list[Any]) -> dict:
    """Peak RSS of the feed's fits (4N rows) against the same fit on N = rows / 4 rows."""
    est = estimator(modelKwargs={"hidden": []}, epochs=1, numWorkers=2, batchSize=4096)
    small_models = [est.fit(small)]
    definition = ("max over ranks of each training worker's peak RSS (VmHWM since the fit "
                  "started, trainingSummary['ranks'][i]['peak_rss_mb']) in the feed's fits "
                  "(4N rows) over the same in one fit of the same settings on N rows, a "
                  "separately cached DataFrame of the same shape; flat within 20% meets it")
    large_peak, small_peak = peak_rss(large_models), peak_rss(small_models)
    fields = {"rows_n": rows // 4, "rows_4n": rows}
    if large_peak is None or small_peak is None:
        return {**fields, "ratio": None, "target": "<= 1.2", "meets_target": None,
                "skipped": "model.trainingSummary has no 'ranks' (per-rank peak_rss_mb) yet",
                "definition": definition}
    return figure(large_peak / small_peak, "<= 1.2", definition, **fields,
                  peak_rss_mb_n=round(small_peak, 1), peak_rss_mb_4n=round(large_peak, 1),
                  ranks_n=ranks_of(small_models[0]), ranks_4n=ranks_of(large_models[-1]))


# --------------------------------------------------------------------------------- scaling
def speedup(capture: Capture, frames: dict[int, Any], rows: int, epochs: int, repeats: int,
            **settings: Any) -> dict:
    """samples/s of 2 workers over 1 for the given settings (defaults for the rest)."""
    hidden = SCALING_MODEL["hidden"]
    fits = {f"workers_{n}": (lambda n=n: estimator(  # type: ignore[misc]
        modelKwargs={"hidden": hidden}, epochs=epochs, numWorkers=n, **settings).fit(frames[n]))
        for n in (1, 2)}
    sides = alternate(capture, fits, repeats, fits=set(fits))
    one, two = sides["workers_1"], sides["workers_2"]
    per_s = {name: rows * epochs / side.median for name, side in sides.items()}
    return {
        "ratio": round(per_s["workers_2"] / per_s["workers_1"], 3),
        "settings": {"hidden": hidden, "epochs": epochs, **settings},
        **{f"samples_per_s_{name}": round(value) for name, value in per_s.items()},
        "fit_s_workers_1": round(one.median, 3), "fit_s_workers_2": round(two.median, 3),
        "runs_s_workers_1": rounded(one.seconds), "runs_s_workers_2": rounded(two.seconds),
        "epoch_s_workers_1": rounded([e["seconds"] for e in one.results[-1].history]),
        "epoch_s_workers_2": rounded([e["seconds"] for e in two.results[-1].history]),
        "steps_per_epoch": {"workers_1": one.results[-1].trainingSummary["steps_per_epoch"],
                            "workers_2": two.results[-1].trainingSummary["steps_per_epoch"]},
        "ranks_workers_2": ranks_of(two.results[-1])}


def scaling(capture: Capture, frames: dict[int, Any], rows: int, epochs: int,
            repeats: int) -> dict:
    from sparkdist.models import TorchEstimator

    default_batch = TorchEstimator().getOrDefault("batchSize")
    at_defaults = speedup(capture, frames, rows, epochs, repeats)
    large = speedup(capture, frames, rows, epochs, repeats, batchSize=8192)
    steps = max(4, rows // default_batch // 4)
    ceiling = {str(batch): machine_ceiling(64, [256, 256], batch, max(2, steps * 256 // batch))
               for batch in (default_batch, 8192)}
    return {
        **figure(at_defaults["ratio"], ">= 1.5",
                 "samples/s = rows x epochs / wall seconds of the whole fit, 2 workers over "
                 "1; MLP hidden [256, 256] on 64 ML-vector features, the default batchSize "
                 f"({default_batch}), optimizer and learningRate (not passed); each side's "
                 "input cached with one partition per worker; "
                 + PROTOCOL.format(n=repeats)),
        "rows": rows, "features": 64, "batch_size_default": default_batch,
        "batch_size_is_per_worker": batch_per_worker(),
        "epoch_at_least_2_s": min(at_defaults["epoch_s_workers_1"]) >= 2.0,
        "at_defaults": at_defaults,
        "batch_8192": large,
        "machine_ceiling": ceiling,
        "machine_ceiling_definition": (
            "the same MLP's training steps (Adam) as plain torch loops, one thread per "
            "process, no Spark: samples/s of 2 independent processes at once over 1, each "
            "process with the same batch (the per-process batch); the most a data-parallel "
            "trainer could reach here, with no gradient exchange")}


def local_steps(input_dim: int, hidden: list[int], batch: int, steps: int) -> float:
    """Seconds for ``steps`` plain training steps on ``batch`` rows, one thread (best of 2
    after a warm-up round)."""
    import torch
    import torch.nn.functional as F

    from sparkdist.torchtrain.nets import MLP

    torch.set_num_threads(1)
    model = MLP(input_dim, 1, hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    x, y = torch.randn(batch, input_dim), torch.randint(0, 2, (batch,)).float()
    timings = []
    for _ in range(3):
        begin = time.perf_counter()
        for _ in range(steps):
            loss = F.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        timings.append(time.perf_counter() - begin)
    return min(timings[1:])


def machine_ceiling(input_dim: int, hidden: list[int], batch: int, steps: int) -> dict:
    """Samples/s of 2 independent single-thread processes over 1, same batch each."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        one = pool.submit(local_steps, input_dim, hidden, batch, steps).result()
    with ProcessPoolExecutor(2, mp_context=spawn) as pool:
        two = max(pool.map(local_steps, *zip(*[(input_dim, hidden, batch, steps)] * 2)))
    return {"ratio": round(2 * one / two, 3), "batch_per_process": batch, "steps": steps,
            "single_process_samples_per_s": round(batch * steps / one)}


# ---------------------------------------------------------------- plain DDP and all-reduce
def ddp_setup(rows: int, epochs: int) -> Any:
    """The scaling figure's 2-worker fit at TorchEstimator's defaults, as plain DDP's
    ``ddp_reference.Setup``: same MLP, rows, epochs, batch per worker, optimizer, learning
    rate (scaled as learningRateScaling says), weight decay and loss."""
    import ddp_reference

    from sparkdist.models import TorchEstimator

    get, workers = TorchEstimator().getOrDefault, 2
    batch = get("batchSize") if batch_per_worker() else get("batchSize") // workers
    scaling = get("learningRateScaling") if TorchEstimator().hasParam(
        "learningRateScaling") else "none"
    return ddp_reference.Setup(
        features=SCALING_MODEL["features"], hidden=list(SCALING_MODEL["hidden"]), rows=rows,
        epochs=epochs, batch=batch, optimizer=get("optimizer"),
        learning_rate=get("learningRate") * LR_SCALINGS[scaling](workers),
        weight_decay=get("weightDecay"), loss=get("loss"), seed=1, workers=workers)


def communication_ms(ranks: list[dict] | None) -> list[float] | None:
    """Each rank's communication ms per train step (StepClock: bucket ready to backward's
    return), None without per-rank figures."""
    if not ranks or not all(rank.get("train_steps") for rank in ranks):
        return None
    return [round(1000 * rank["communication_s"] / rank["train_steps"], 3) for rank in ranks]


def ddp_figures(samples: int, cold: dict[str, float], warm: dict[str, list[float]],
                ddp_steady_s: list[float], sparkdist_steady_s: list[float],
                repeats: int) -> dict:
    """The cold and warm figures of sparkdist against plain DDP: each side's samples/s (the
    ratio's two sides) and its steady samples/s (in the ranks; the first run's for cold, the
    median of the rest for warm), ``samples`` = rows x epochs."""
    what = ("samples/s of a TorchEstimator 2-worker fit (MLP hidden [256, 256] on 64 ML-vector "
            "features, the default batchSize per worker, optimizer, learningRate and loss, "
            "input cached in 2 partitions) over samples/s of plain DDP outside Spark doing the "
            "same (torchrun --standalone --nproc_per_node=2, gloo, torch.set_num_threads(1), "
            "each rank its half of the rows in memory as tensors, the same steps per epoch; "
            "bench/ddp_reference.py); samples/s = rows x epochs / wall seconds on the driver "
            "around the whole call (torchrun's process start included); ")
    found = {}
    for kind in ("cold", "warm"):
        pick: Callable[[list[float]], float] = (
            (lambda v: v[0]) if kind == "cold" else (lambda v: statistics.median(v[1:])))
        ours = cold["sparkdist"] if kind == "cold" else statistics.median(warm["sparkdist"])
        theirs = cold["ddp"] if kind == "cold" else statistics.median(warm["ddp"])
        ddp_steady, our_steady = pick(ddp_steady_s), pick(sparkdist_steady_s)
        found[kind] = figure(
            theirs / ours, ">= 0.9", what + (
                "cold: each side's first call in this section (which runs first: the "
                "session's first fit)" if kind == "cold" else
                f"warm: the median of the {repeats} calls after the first") +
            ", the sides alternating",
            sparkdist_samples_per_s=round(samples / ours),
            ddp_samples_per_s=round(samples / theirs),
            sparkdist_s=round(ours, 3), ddp_s=round(theirs, 3),
            ddp_steady_samples_per_s=round(samples / ddp_steady),
            ddp_startup_s=round(theirs - ddp_steady, 3),
            sparkdist_steady_samples_per_s=round(samples / our_steady),
            sparkdist_outside_epochs_s=round(ours - our_steady, 3))
    return found


def versus_ddp(df: Any, rows: int, epochs: int, repeats: int) -> dict:
    """The 2-worker fit at the defaults against plain DDP outside Spark, cold and warm."""
    from dataclasses import asdict

    import ddp_reference
    from _common import cold_and_warm

    setup = ddp_setup(rows, epochs)
    est = estimator(modelKwargs={"hidden": setup.hidden}, epochs=epochs, numWorkers=2)
    runs: dict[str, list[Any]] = {"sparkdist": [], "ddp": []}

    def fit() -> Any:
        runs["sparkdist"].append(est.fit(df))
        return runs["sparkdist"][-1]

    def ddp() -> Any:
        runs["ddp"].append(ddp_reference.run(setup))
        return runs["ddp"][-1]

    cold, warm, _ = cold_and_warm({"sparkdist": fit, "ddp": ddp}, repeats)
    models, ddp_runs = runs["sparkdist"], runs["ddp"]
    return {
        **ddp_figures(rows * epochs, cold, warm,
                      [ddp_reference.steady_seconds(r) for r in ddp_runs],
                      [sum(e["seconds"] for e in m.history) for m in models], repeats),
        "setup": asdict(setup), "rows": rows, "epochs": epochs,
        "steps_per_epoch": {"sparkdist": models[-1].trainingSummary["steps_per_epoch"],
                            "ddp": ddp_runs[-1][0]["steps_per_epoch"]},
        "sparkdist_runs_s": rounded([cold["sparkdist"], *warm["sparkdist"]]),
        "ddp_runs_s": rounded([cold["ddp"], *warm["ddp"]]),
        "ddp_train_runs_s": rounded([ddp_reference.steady_seconds(r) for r in ddp_runs]),
        "ddp_epoch_s": rounded(ddp_runs[-1][0]["epoch_s"]),
        "sparkdist_epoch_s": rounded([e["seconds"] for e in models[-1].history]),
        "sparkdist_communication_ms_per_step": communication_ms(ranks_of(models[-1])),
        "ranks_sparkdist": ranks_of(models[-1]),
        "steady_definition": (
            "ddp_steady_samples_per_s: rows x epochs over the slowest DDP rank's seconds from "
            "a dist.barrier() before its first step to one after its last (no process start, "
            "imports, rendezvous, data or model building); ddp_startup_s: the wall seconds "
            "minus those; sparkdist_steady_samples_per_s: rows x epochs over the sum of the "
            "fit's epochs' seconds (model.history); sparkdist_outside_epochs_s: the rest")}


def allreduce_figures(calls: int) -> dict:
    """bench/allreduce.py's figures for the scaling model, 1 and 2 torch threads per rank."""
    import allreduce

    found = allreduce.measure(SCALING_MODEL["features"], list(SCALING_MODEL["hidden"]), 256,
                              threads=(1, 2), calls=calls, steps=max(20, calls // 2))
    return {**found, "definition": " ".join(allreduce.__doc__.split("\n\n")[1:3]).replace(
        "\n", " ")}


# ------------------------------------------------------------------------ time to accuracy
def time_to(model: Any, wall_s: float, threshold: float) -> float | None:
    """Seconds a fit took to reach ``threshold`` validation accuracy: its fixed costs (wall
    time minus the epochs' seconds) plus the epochs up to the first that reached it."""
    history = model.history
    fixed = wall_s - sum(record["seconds"] for record in history)
    spent = fixed
    for record in history:
        spent += record["seconds"]
        if record.get("val_accuracy", 0.0) >= threshold:
            return spent
    return None


#: What docs/deep-models.md ("Several workers: the learning rate") recommends for 2-8
#: workers: the linear rule with a warm-up of a few hundred steps (its example's 300).
RECOMMENDED_SCALING = {"learningRateScaling": "linear", "warmupSteps": 300}


def accuracy_sides(frames: dict[int, Any], epochs: int) -> dict[str, Callable[[], Any]]:
    """The time-to-accuracy fits: 1 and 2 workers at the defaults, and 2 workers with the
    documented several-worker settings (which leave 1 worker unchanged, so the 1-worker fit
    at the defaults is that row's reference too)."""
    def fit(workers: int, **settings: Any) -> Callable[[], Any]:
        return lambda: estimator(epochs=epochs, numWorkers=workers, validationFraction=0.1,
                                 **settings).fit(frames[workers])

    return {"workers_1": fit(1), "workers_2": fit(2),
            "workers_2_recommended": fit(2, **RECOMMENDED_SCALING)}


def accuracy_row(one: float | None, two: float | None, definition: str, **fields: Any) -> dict:
    """One time-to-accuracy figure: 2 workers' seconds over 1's (None where either side never
    reached the threshold)."""
    return figure(two / one if one and two else None, "<= 0.65", definition,
                  seconds_workers_1=round(one, 3) if one else None,
                  seconds_workers_2=round(two, 3) if two else None, **fields)


def time_to_accuracy(capture: Capture, frames: dict[int, Any], rows: int, epochs: int,
                     threshold: float, repeats: int) -> dict:
    """The figure at the defaults (both sides), and beside it ``recommended``: the 2-worker
    side with docs/deep-models.md's several-worker learning rate (RECOMMENDED_SCALING)."""
    fits = accuracy_sides(frames, epochs)
    sides = alternate(capture, fits, repeats, fits=set(fits))
    reached: dict[str, list[float | None]] = {
        name: [time_to(model, s, threshold) for model, s in zip(side.results, side.seconds)]
        for name, side in sides.items()}
    medians = {name: (statistics.median(times) if None not in times else None)
               for name, times in reached.items()}
    common = (f"validation accuracy {threshold} on datasets.make_nonlinear({rows}, dim=8) "
              "(10% held out by validationFraction), default MLP, batchSize (per worker), "
              "optimizer and learningRate; one fit of "
              f"{epochs} epochs per run, and its time to the threshold = (fit wall time - sum "
              "of the epochs' seconds) + the seconds of the epochs up to the first whose "
              "val_accuracy reaches it; None where a side never reached it; the three fits "
              "(1 worker, 2 workers at the defaults, 2 workers recommended) alternate, "
              + PROTOCOL.format(n=repeats))
    settings = ", ".join(f"{key}={value!r}" for key, value in RECOMMENDED_SCALING.items())
    recommended = accuracy_row(
        medians["workers_1"], medians["workers_2_recommended"],
        "the same as the figure at the defaults except the 2-worker side: seconds for 2 "
        f"workers with {settings} (docs/deep-models.md, 'Several workers: the learning rate': "
        "the rate ramps from learningRate to 2 x learningRate over the first "
        f"{RECOMMENDED_SCALING['warmupSteps']} steps) over 1 worker at the defaults (the rule "
        "changes nothing for 1 worker) to reach " + common,
        settings_workers_2=dict(RECOMMENDED_SCALING),
        runs_s_workers_1=[round(t, 3) if t else None for t in reached["workers_1"]],
        runs_s_workers_2=[round(t, 3) if t else None
                          for t in reached["workers_2_recommended"]],
        val_accuracy_workers_2=[round(e.get("val_accuracy", 0), 4)
                                for e in sides["workers_2_recommended"].results[-1].history],
        lr_workers_2=[e.get("lr") for e in sides["workers_2_recommended"].results[-1].history])
    return {**accuracy_row(
        medians["workers_1"], medians["workers_2"],
        "seconds for 2 workers over 1 to reach " + common + "; both sides at the defaults "
        "(learningRateScaling 'none'); 'recommended' beside it: the 2-worker side with the "
        "documented several-worker learning rate",
        threshold=threshold, rows=rows, epochs=epochs,
        **{f"runs_s_{name}": [round(t, 3) if t else None for t in reached[name]]
           for name in ("workers_1", "workers_2")},
        **{f"val_accuracy_{name}": [round(e.get("val_accuracy", 0), 4)
                                    for e in sides[name].results[-1].history]
           for name in ("workers_1", "workers_2")}),
        "recommended": recommended}


# -------------------------------------------------------------------------------- overhead
def one_ddp_step(input_dim: int, hidden: list[int], rows: int, seed: int) -> float:
    """TorchDistributor's side: the same MLP, one DDP step on ``rows`` random rows per
    process."""
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
        x, y = torch.randn(rows, input_dim), torch.randint(0, 2, (rows,)).float()
        loss = F.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return float(loss)
    finally:
        dist.destroy_process_group()


def step_calls(spark: Any) -> tuple[Any, dict[str, Callable[[], Any]]]:
    """The 1-step fit and TorchDistributor's run of the same DDP step, and its data."""
    from pyspark.ml.torch.distributor import TorchDistributor

    dim, hidden, batch, workers = (STEP_MODEL[k] for k in ("features", "hidden", "batch_size",
                                                           "workers"))
    per_worker = batch if batch_per_worker() else batch // workers
    df = vector_frame(spark, per_worker * workers, dim, seed=3, partitions=workers)

    def fit() -> Any:
        model = estimator(modelKwargs={"hidden": hidden}, epochs=1, numWorkers=workers,
                          batchSize=batch).fit(df)
        assert model.trainingSummary["steps_per_epoch"] == 1, model.trainingSummary
        return model

    def distributor() -> float:
        loss = TorchDistributor(num_processes=workers, local_mode=False, use_gpu=False).run(
            one_ddp_step, dim, hidden, per_worker, 1)
        assert loss == loss  # a number came back
        return loss

    return df, {"sparkdist": fit, "torch_distributor": distributor}


#: The cold figure's rows on a multi-process master (issue 32): 2 executor JVMs of 1 core.
CLUSTER_MASTER = "local-cluster[2,1,1024]"
#: How the cold process builds its session: sparkdist.session.get_spark (through
#: bench/_common.start_spark), or the user's own plain SparkSession.builder (plain_conf).
BUILDERS = ("get_spark", "plain")
DAEMON_CONF = "spark.python.daemon.module"


def cold_call(side: str, master: str | None = None, builder: str = "get_spark") -> None:
    """In a fresh process (``--cold SIDE``, ``--cold-master``, ``--cold-builder``): a
    SparkSession (``builder``: get_spark or plain), the data (a JVM-only job, for both sides
    alike), then one timed call; prints {"seconds": ...} with the session's master and
    Python daemon module."""
    spark = session({}, master) if builder == "get_spark" else plain_session(str(master))
    _, calls = step_calls(spark)
    begin = time.perf_counter()
    calls[side]()
    seconds = time.perf_counter() - begin
    found = {"side": side, "seconds": seconds, "master": spark.sparkContext.master,
             "builder": builder, "daemon_module": spark.conf.get(DAEMON_CONF, None)}
    spark.stop()
    print(json.dumps(found))


def cold_command(side: str, master: str | None = None, builder: str = "get_spark") -> list[str]:
    """The command line of one cold call (the existing row: no master, get_spark)."""
    command = [sys.executable, __file__, "--cold", side]
    if master is not None:
        command += ["--cold-master", master]
    return command + (["--cold-builder", builder] if builder != "get_spark" else [])


def cold_result(side: str, master: str | None = None, builder: str = "get_spark") -> dict:
    done = subprocess.run(cold_command(side, master, builder), capture_output=True, text=True,
                          env=os.environ.copy())
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"cold {side} run ({master or 'default master'}, {builder}) failed "
                           f"(exit {done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def cold_run(side: str, master: str | None = None, builder: str = "get_spark") -> float:
    return float(cold_result(side, master, builder)["seconds"])


def cold_cluster_row(capture: Capture, master: str, builder: str, rounds: int,
                     definition: str) -> dict:
    """One cold row on ``master`` with sessions built by ``builder``: both sides' fresh
    processes alternating, ``rounds`` rounds."""
    runs: dict[str, list[dict]] = {"sparkdist": [], "torch_distributor": []}
    for _ in range(rounds):
        for side, found in runs.items():
            found.append(cold_result(side, master, builder))
    seconds = {side: [run["seconds"] for run in found] for side, found in runs.items()}
    capture.log(f"overhead, cold runs on {master} ({builder}): {seconds}")
    ours, theirs = (statistics.median(seconds[s]) for s in ("sparkdist", "torch_distributor"))
    built = ("sparkdist.session.get_spark (through bench/_common.start_spark: its local-master "
             "defaults, among them spark.python.daemon.module=sparkdist.launch.daemon)"
             if builder == "get_spark" else
             "a plain SparkSession.builder as a user would build it, with only spark.master, "
             "the UI off, the driver bound to 127.0.0.1 and spark.sql.shuffle.partitions=2 "
             "(no sparkdist conf: pyspark's own Python daemon)")
    return figure(
        ours / theirs, "<= 0.35", definition + (
            f"; cold on {master}: each call is the first in a fresh Python process whose "
            f"SparkSession is built by {built}, then the data cached by a JVM-only job, then "
            "the call timed; both sides' processes on the same master and builder, "
            f"alternating, median of {rounds}"),
        master=master, builder=builder,
        daemon_module=sorted({str(run["daemon_module"]) for f in runs.values() for run in f}),
        sparkdist_s=round(ours, 3), torch_distributor_s=round(theirs, 3),
        sparkdist_runs_s=rounded(seconds["sparkdist"]),
        torch_distributor_runs_s=rounded(seconds["torch_distributor"]))


def overhead(capture: Capture, spark: Any, repeats: int,
             cold_rounds: int) -> tuple[dict, Callable[[], Any]]:
    """The figures, and the 1-step fit (recovery re-warms Python workers with it)."""
    df, calls = step_calls(spark)
    cold: dict[str, list[float]] = {"sparkdist": [], "torch_distributor": []}
    for _ in range(cold_rounds):
        for side in cold:
            cold[side].append(cold_run(side))
    capture.log(f"overhead, cold runs: {cold}")
    warm = alternate(capture, calls, repeats,
                     after={"torch_distributor": calls["sparkdist"]}, fits={"sparkdist"})
    cold_ratio = statistics.median(cold["sparkdist"]) / statistics.median(
        cold["torch_distributor"])
    warm_ratio = warm["sparkdist"].median / warm["torch_distributor"].median
    setup = {**STEP_MODEL, "rows": df.count(), "steps": 1}
    df.unpersist()
    definition = ("wall seconds of a 1-step TorchEstimator.fit (MLP {hidden} on {features} "
                  "vector features, {workers} workers, batchSize {batch_size}, rows = one "
                  "step's) over TorchDistributor(num_processes=2, local_mode=False, "
                  "use_gpu=False).run of the same single DDP step (gloo, same MLP, Adam, "
                  "the same rows per process)").format(**STEP_MODEL)
    clusters: dict[str, dict] = {}
    for builder in BUILDERS:  # a row that cannot start leaves its error, not the section's
        try:
            clusters[builder] = cold_cluster_row(capture, CLUSTER_MASTER, builder, cold_rounds,
                                                 definition)
        except Exception as error:
            clusters[builder] = {"error": f"{type(error).__name__}: {error}"[-3000:],
                                 "master": CLUSTER_MASTER, "builder": builder}
    return {
        "setup": setup,
        "cold_local_cluster": clusters,
        "cold": figure(cold_ratio, "<= 0.35", definition + (
            "; cold: each call is the first in a fresh Python process with its own "
            "SparkSession (started, data cached by a JVM-only job, then the call timed), "
            f"the two sides' processes alternating, median of {cold_rounds}"),
            sparkdist_s=round(statistics.median(cold["sparkdist"]), 3),
            torch_distributor_s=round(statistics.median(cold["torch_distributor"]), 3),
            sparkdist_runs_s=rounded(cold["sparkdist"]),
            torch_distributor_runs_s=rounded(cold["torch_distributor"])),
        "warm": figure(warm_ratio, "<= 0.15", definition + (
            "; warm: in one process after one warm-up of each side, alternating; an untimed "
            "fit follows every TorchDistributor run (which leaves no reusable Python "
            "workers), so each timed fit finds Spark's Python workers started with torch "
            "imported (as any fit after the first in a session), "
            f"median of {repeats}"),
            sparkdist_s=round(warm["sparkdist"].median, 3),
            torch_distributor_s=round(warm["torch_distributor"].median, 3),
            sparkdist_runs_s=rounded(warm["sparkdist"].seconds),
            torch_distributor_runs_s=rounded(warm["torch_distributor"].seconds),
            torch_distributor_barrier_syncs=max(
                count["spark"] for count in warm["torch_distributor"].syncs)),
    }, calls["sparkdist"]


# -------------------------------------------------------------------------------- recovery
def interval_settings(steps_per_epoch: int) -> tuple[dict[str, int], float]:
    """The checkpoint interval: Params and its length in epochs (every third of an epoch
    where checkpointEverySteps exists, so that a kill half-way through an epoch falls in the
    middle of an interval, not on a checkpoint; else every epoch)."""
    from sparkdist.models import TorchEstimator

    if TorchEstimator().hasParam("checkpointEverySteps"):
        steps = max(1, steps_per_epoch // 3)
        return {"checkpointEverySteps": steps}, steps / steps_per_epoch
    return {"checkpointEvery": 1}, 1.0


def recovery(capture: Capture, df: Any, epochs: int, cold_fit_s: float, repeats: int,
             rewarm: Callable[[], Any]) -> dict:
    from sparkdist.failpoints import arm

    settings = {"modelKwargs": {"hidden": [256, 256]}, "epochs": epochs, "numWorkers": 2,
                "rendezvousTimeoutSeconds": 120}
    probe = estimator(**settings).fit(df)  # the warm-up, shared by both sides
    steps_per_epoch = probe.trainingSummary["steps_per_epoch"]
    interval, interval_epochs = interval_settings(steps_per_epoch)
    fail = {"rank": 1, "epoch": epochs, "step": steps_per_epoch // 2, "action": "kill"}

    def fit(killed: bool) -> Any:
        with tempfile.TemporaryDirectory() as work:
            est = estimator(**settings, **interval, checkpointDir=f"{work}/ckpt", runId="bench")
            if killed:
                est = arm(est, work, **fail)
            model = est.fit(df)
            assert not killed or os.path.exists(f"{work}/fired-1.pid"), "the kill never fired"
        return model

    sides = alternate(capture, {"clean": lambda: fit(False), "killed": lambda: fit(True)},
                      repeats, warm_up=False, after={"killed": rewarm})
    clean, killed = sides["clean"], sides["killed"]
    epoch_s = statistics.median(e["seconds"] for m in clean.results for e in m.history)
    interval_s = epoch_s * interval_epochs
    extra_s = killed.median - clean.median
    budget_s = cold_fit_s + interval_s
    return figure(
        extra_s / budget_s, "<= 1.0",
        "extra_s = median wall seconds of a fit whose rank 1 is SIGKILLed (failpoint "
        f"torch.step, epoch {fail['epoch']} of {epochs}, step {fail['step']} of "
        f"{steps_per_epoch}: half-way) minus the median of the same fit without the kill; "
        "both checkpoint (checkpointDir + runId) at the interval shown; budget_s = the cold "
        "1-step fit (overhead.cold.sparkdist_s) + one checkpoint interval (median epoch "
        "seconds of the clean fits x the interval in epochs); ratio = extra_s / budget_s. "
        "One untimed clean fit warms up both sides; an untimed 1-step fit follows every killed "
        f"fit (Python workers warm again after the kill); median of {repeats}",
        extra_s=round(extra_s, 3), budget_s=round(budget_s, 3),
        cold_fit_s=round(cold_fit_s, 3), interval_s=round(interval_s, 3),
        interval=interval, steps_per_epoch=steps_per_epoch, epoch_s=round(epoch_s, 3),
        clean_fit_s=round(clean.median, 3), killed_fit_s=round(killed.median, 3),
        clean_runs_s=rounded(clean.seconds), killed_runs_s=rounded(killed.seconds),
        resumed_from=[{key: m.trainingSummary.get(key) for key in ("resumed_from_epoch",
                                                                   "resumed_from_step")}
                      for m in killed.results])


# -------------------------------------------------------------------------------------- main
@dataclass
class Sizes:
    feed_rows: int
    scaling_rows: int
    scaling_epochs: int
    accuracy_rows: int
    accuracy_epochs: int
    accuracy: float
    recovery_rows: int
    recovery_epochs: int
    repeats: int
    cold_rounds: int
    allreduce_calls: int = 200


def arguments() -> tuple[argparse.Namespace, Sizes]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, 1 timed run per side: checks that every section runs")
    parser.add_argument("--feed-rows", type=int, default=2_500_000)
    parser.add_argument("--scaling-rows", type=int, default=200_000)
    parser.add_argument("--scaling-epochs", type=int, default=3)
    parser.add_argument("--accuracy-rows", type=int, default=200_000)
    parser.add_argument("--accuracy-epochs", type=int, default=6)
    parser.add_argument("--accuracy", type=float, default=0.95, help="validation accuracy")
    parser.add_argument("--recovery-rows", type=int, default=100_000)
    parser.add_argument("--recovery-epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold-rounds", type=int, default=3)
    parser.add_argument("--allreduce-calls", type=int, default=200)
    parser.add_argument("--only", help="comma-separated sections (development)")
    parser.add_argument("--cold", choices=("sparkdist", "torch_distributor"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--cold-master", help=argparse.SUPPRESS)
    parser.add_argument("--cold-builder", choices=BUILDERS, default="get_spark",
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        return args, Sizes(100_000, 20_000, 2, 20_000, 3, 0.7, 20_000, 2, 1, 1, 50)
    return args, Sizes(args.feed_rows, args.scaling_rows, args.scaling_epochs,
                       args.accuracy_rows, args.accuracy_epochs, args.accuracy,
                       args.recovery_rows, args.recovery_epochs, args.repeats,
                       args.cold_rounds, args.allreduce_calls)


def feed_and_memory(capture: Capture, spark: Any, sizes: Sizes) -> dict:
    df = vector_frame(spark, sizes.feed_rows, 32, seed=1, partitions=2)
    result, large_models = feed(capture, df, sizes.feed_rows, sizes.repeats)
    df.unpersist()
    small = vector_frame(spark, sizes.feed_rows // 4, 32, seed=2, partitions=2)
    try:
        return {"feed": result, "memory": memory(small, sizes.feed_rows, large_models)}
    finally:
        small.unpersist()


def scaling_section(capture: Capture, spark: Any, sizes: Sizes) -> dict:
    frames = {n: vector_frame(spark, sizes.scaling_rows, 64, seed=4, partitions=n)
              for n in (1, 2)}
    try:
        return {"scaling": scaling(capture, frames, sizes.scaling_rows, sizes.scaling_epochs,
                                   sizes.repeats)}
    finally:
        for frame in frames.values():
            frame.unpersist()


def ddp_section(capture: Capture, spark: Any, sizes: Sizes) -> dict:
    df = vector_frame(spark, sizes.scaling_rows, SCALING_MODEL["features"], seed=4,
                      partitions=2)  # the scaling figure's 2-worker input
    try:
        return {"ddp_reference": versus_ddp(df, sizes.scaling_rows, sizes.scaling_epochs,
                                            sizes.repeats)}
    finally:
        df.unpersist()


def accuracy_section(capture: Capture, spark: Any, sizes: Sizes) -> dict:
    frames = {n: nonlinear_frame(spark, sizes.accuracy_rows, seed=5, partitions=n)
              for n in (1, 2)}
    try:
        return {"time_to_accuracy": time_to_accuracy(
            capture, frames, sizes.accuracy_rows, sizes.accuracy_epochs, sizes.accuracy,
            sizes.repeats)}
    finally:
        for frame in frames.values():
            frame.unpersist()


def overhead_and_recovery(capture: Capture, spark: Any, sizes: Sizes,
                          with_recovery: bool) -> dict:
    result, rewarm = overhead(capture, spark, sizes.repeats, sizes.cold_rounds)
    if not with_recovery:
        return {"overhead": result}
    df = vector_frame(spark, sizes.recovery_rows, 64, seed=6, partitions=2)
    try:
        return {"overhead": result, "recovery": recovery(
            capture, df, sizes.recovery_epochs, result["cold"]["sparkdist_s"], sizes.repeats,
            rewarm)}
    finally:
        df.unpersist()


def run_all(capture: Capture, spark: Any, sizes: Sizes, only: set[str] | None) -> dict:
    """Every wanted section; one that fails leaves {"error": ...} and the others run."""
    def wanted(*names: str) -> bool:
        return only is None or bool(only & set(names))

    # ddp_reference first: its cold sparkdist fit is then the session's first, as a user's
    sections: list[tuple[tuple[str, ...], Callable[[], dict]]] = [
        (("ddp_reference",), lambda: ddp_section(capture, spark, sizes)),
        (("allreduce",), lambda: {"allreduce": allreduce_figures(sizes.allreduce_calls)}),
        (("feed", "memory"), lambda: feed_and_memory(capture, spark, sizes)),
        (("scaling",), lambda: scaling_section(capture, spark, sizes)),
        (("time_to_accuracy",), lambda: accuracy_section(capture, spark, sizes)),
        (("overhead", "recovery"), lambda: overhead_and_recovery(
            capture, spark, sizes, wanted("recovery")))]
    figures: dict[str, Any] = {}
    for names, run in sections:
        if not wanted(*names):
            continue
        try:
            figures.update(run())
        except Exception as error:  # keep the other sections' figures
            figures.update({name: {"error": f"{type(error).__name__}: {error}"[-3000:]}
                            for name in names})
        for name in names:
            capture.log(f"{name}: {json.dumps(figures.get(name))}")
    return figures


def main() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    args, sizes = arguments()
    if args.cold:
        return cold_call(args.cold, args.cold_master, args.cold_builder)
    started = time.perf_counter()
    load = [os.getloadavg()[0]]
    with Capture() as capture:  # before the JVM starts, so that it inherits the capture
        spark = session({"spark.driver.memory": "3g"})
        jvm = spark.sparkContext._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.BarrierCoordinator", jvm.org.apache.logging.log4j.Level.INFO)
        only = set(args.only.split(",")) if args.only else None
        figures: dict[str, Any] = {"benchmark": "deep", "quick": args.quick,
                                   "sizes": sizes.__dict__}
        figures.update(run_all(capture, spark, sizes, only))
        load.append(os.getloadavg()[0])
        figures["barrier_syncs"] = barrier_syncs(capture)
        figures["seconds"] = round(time.perf_counter() - started, 1)
        figures["machine"] = machine(spark, load)
        spark.stop()
    failed = [name for name, value in figures.items()
              if isinstance(value, dict) and "error" in value]
    save(figures, partial=args.quick or bool(args.only) or bool(failed))
    if failed:
        raise SystemExit(f"bench/deep.py: sections failed: {failed}")


def barrier_syncs(capture: Capture) -> dict:
    """Spark barrier syncs per timed TorchEstimator fit (killed fits not counted)."""
    fits = capture.calls
    return {"per_fit": max((count["spark"] for count in fits), default=None),
            "rank0_logged_per_fit": max((c["rank0_logged"] for c in fits), default=None),
            "driver_rendezvous_per_fit": max((c["driver_rendezvous"] for c in fits),
                                             default=None),
            "fits_counted": len(fits),
            "consistent": all(count["spark"] == count["rank0_logged"] for count in fits),
            "definition": "the most Spark barrier syncs (BarrierCoordinator 'finished "
                          "successfully' log lines) during any one timed TorchEstimator fit "
                          "(feed, scaling, time to accuracy, warm overhead), the Spark syncs "
                          "rank 0 logged in it, and its rendezvous through the driver's "
                          "socket instead of a Spark sync (local masters)"}


def machine(spark: Any, load: list[float]) -> str:
    import torch

    return (f"{os.cpu_count()} cores, Python {platform.python_version()}, Spark {spark.version}, "
            f"torch {torch.__version__}, master {spark.sparkContext.master}, load avg (1 min) "
            f"{'/'.join(f'{x:.2f}' for x in load)}")


def save(figures: dict, partial: bool) -> None:
    """Print the JSON line (with its provenance); a full run also replaces
    bench/results/deep.json (atomically)."""
    from _common import provenance

    line = json.dumps({**figures, "provenance": provenance()})
    print(line)
    if partial:
        return
    RESULTS.parent.mkdir(exist_ok=True)
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(line + "\n")
    os.replace(tmp, RESULTS)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
