"""TorchModel.transform against a bare ``mapInArrow`` running the same network, the model load
per task and the scoring UDF's size (issue 30, "Measure"), every figure from one run, timed as
bench/_common.py says (wall clock on the driver around the whole call; each side's first call
is its cold figure, the median of ``--repeats`` after it, the sides alternating, the warm one).

- throughput: rows/s of ``TorchModel.transform`` + a count that needs the predictions (a
  filter on ``prediction``; a bare count lets Spark prune the scoring UDF), MLP
  128-1024-1024-1 at the defaults (loss bce, scoring batch size, ``useGpu='auto'``), over
  rows/s of a bare ``mapInArrow`` on the same cached DataFrame that runs the same network,
  already built: each Python worker builds it once from a broadcast and keeps it for its
  later tasks, reads each Arrow batch's features list array in place as a float32 matrix (no
  pandas), scores it in slices of the model's scoring batch size under ``torch.no_grad()``
  and yields ``prediction``; then the same filter and count. Target >= 0.9, cold and warm.
- int8: the same transform with ``quantization='int8'`` in the same rounds, its rows/s
  against float32's (no target).
- load: seconds of the model load per task, first and later, from the driver: a model that no
  task scored yet, on one small partition per core (one scoring batch each), its first call
  and the median of its later calls, each less the median of the bare job on the same rows
  with its network cached (what the Spark job costs without any load). Target on a hit
  (later) <= 0.005 s. Beside it, where TorchModel reports them (``scoringLoads``), the
  seconds each task timed itself from its start to a network ready to score.
- udf: bytes of each Python function ``TorchModel.transform`` hands Spark, pickled as pyspark
  pickles it (``(func, returnType)`` with cloudpickle; over Spark's 1 MiB
  ``spark.broadcast.UDFCompressionThreshold`` pyspark ships that pickle as a broadcast), for
  an MLP 128-7000-7000-1 (50M float32 parameters, 200 MB). Target <= 1 MiB.

Prints one JSON line; with --save also writes bench/results/scoring.json (bench/report.py
writes it from the line it reads).

    python bench/scoring.py [--quick] [--rows 2500000] [--repeats 3] [--save]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/models/torch.py", "sparkdist/models/_torch_scoring.py",
            "sparkdist/models/_torch_checks.py", "sparkdist/torchtrain/inference.py",
            "sparkdist/torchtrain/modelcache.py", "sparkdist/torchtrain/spec.py",
            "sparkdist/torchtrain/params.py", "sparkdist/torchtrain/network.py")
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "6g"}
RATIO_TARGET = 0.9
LOAD_TARGET_S = 0.005
CLASSICAL_TARGET = 0.95  # sparkdist adds nothing to MLlib's transform, within noise
UDF_TARGET_BYTES = 1 << 20  # spark.broadcast.UDFCompressionThreshold's default
#: The name, in each Python worker's ``sys.modules``, of the bare reference's network cache.
CACHE_MODULE = "sparkdist_bench_scoring_networks"
PROTOCOL = ("wall clock on the driver around the whole call; cold: each side's first call in "
            "the session, warm: the median of the {n} calls after it, the sides alternating")


@dataclass
class Sizes:
    rows: int
    features: int
    hidden: list[int]
    fit_rows: int
    partitions: int  # 0: the session's default parallelism (spark.range's default)
    repeats: int
    load_repeats: int
    udf_hidden: list[int]
    loss: str


def arguments(argv: list[str] | None = None) -> tuple[argparse.Namespace, Sizes]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, 1 timed call per side: checks that every part runs")
    parser.add_argument("--rows", type=int, default=2_500_000, help="rows scored per call")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, nargs="+", default=[1024, 1024])
    parser.add_argument("--fit-rows", type=int, default=2_000,
                        help="rows of the 1-epoch fit that gives the TorchModel")
    parser.add_argument("--partitions", type=int, default=0,
                        help="partitions of the scored data (0: the default parallelism)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load-repeats", type=int, default=7)
    parser.add_argument("--udf-hidden", type=int, nargs="+", default=[7000, 7000],
                        help="hidden layers of the large model whose UDF is measured")
    parser.add_argument("--loss", choices=("bce", "mse"), default="bce")
    parser.add_argument("--save", action="store_true",
                        help="also write bench/results/scoring.json")
    args = parser.parse_args(argv)
    if args.quick:
        return args, Sizes(4_000, 16, [64, 64], 500, 0, 1, 2, [256, 256], args.loss)
    return args, Sizes(args.rows, args.features, list(args.hidden), args.fit_rows,
                       args.partitions, args.repeats, args.load_repeats, list(args.udf_hidden),
                       args.loss)


# ------------------------------------------------------------------------------- the figures
def throughput_figures(cold: dict[str, float], warm: dict[str, list[float]], rows: int,
                       repeats: int) -> dict[str, Any]:
    """Each kind's seconds and rows/s per side; sparkdist's ratio to the bare reference
    (sparkdist rows/s over bare rows/s) against the target, and int8's speed-up."""
    def kind(seconds: dict[str, float]) -> dict[str, Any]:
        ratio = seconds["bare"] / seconds["sparkdist"]
        return {**{f"{side}_s": round(s, 3) for side, s in seconds.items()},
                **{f"{side}_rows_per_s": round(rows / s) for side, s in seconds.items()},
                "ratio": round(ratio, 3), "meets_target": ratio >= RATIO_TARGET,
                "int8_speedup": round(seconds["sparkdist"] / seconds["int8"], 3)}

    return {"rows": rows, "target": f">= {RATIO_TARGET}",
            "cold": kind(cold),
            "warm": {**kind({side: statistics.median(runs) for side, runs in warm.items()}),
                     "runs_s": {side: [round(s, 3) for s in runs] for side, runs in warm.items()}},
            "definition": "rows/s of TorchModel.transform + a count that needs the predictions "
                          "(filter prediction IS NOT NULL) over rows/s of a bare mapInArrow "
                          "on the same cached DataFrame that runs the same network, already "
                          "built (each Python worker builds it once from a broadcast and "
                          "keeps it for its later tasks), reads each Arrow batch's features "
                          "list array in place as a float32 matrix, scores it in slices of "
                          "the model's scoring batch size under torch.no_grad() and yields "
                          "the prediction alone, then the same filter and count; int8: the "
                          "same transform with quantization='int8' (speed-up: float32 "
                          "seconds / int8 seconds); " + PROTOCOL.format(n=repeats)}


def load_figures(first_s: float, later_s: list[float], bare_s: list[float], tasks: int,
                 rows: int, first: list[dict], later: list[dict]) -> dict[str, Any]:
    """Model-load seconds per task as each task timed them (``TorchModel.scoringLoads``):
    the first call's (the median over its tasks) and the later calls' (the median over all
    their tasks, on a cache hit); beside them the driver's estimate, each call less the
    median bare job (negative where the bare job was the slower: noise)."""
    job = statistics.median(bare_s)
    seconds = [record["seconds"] for record in later]
    headline = statistics.median(seconds)
    return {"first_s": round(statistics.median(r["seconds"] for r in first), 5),
            "later_s": round(headline, 5), "target": f"<= {LOAD_TARGET_S}",
            "meets_target": headline <= LOAD_TARGET_S,
            "ratio_to_target": round(headline / LOAD_TARGET_S, 3),
            "first_hits": sum(r["hit"] for r in first), "first_tasks": len(first),
            "later_max_s": round(max(seconds), 5),
            "later_hits": sum(r["hit"] for r in later), "later_tasks": len(later),
            "driver_estimate": {"first_s": round(first_s - job, 4),
                                "later_s": round(statistics.median(later_s) - job, 4),
                                "bare_job_s": round(job, 4)},
            "tasks": tasks, "rows": rows,
            "definition": f"seconds from a scoring task's start to a network ready to score, "
                          f"as each task timed it (TorchModel.scoringLoads), on {rows} rows in "
                          f"{tasks} partitions (one task per core, one scoring batch each): "
                          f"first: the median over the tasks of the first transform of a "
                          f"model no task had scored (a build); later: the median over the "
                          f"tasks of the {len(later_s)} transforms after it (a cache hit "
                          "where the worker built it before). driver_estimate: wall seconds "
                          "of transform + count less the median bare mapInArrow job on the "
                          "same rows"}


def udf_figures(udf_bytes: list[int], model_bytes: int, parameters: int,
                hidden: list[int], features: int, scoring_model_udf_bytes: int
                ) -> dict[str, Any]:
    total = sum(udf_bytes)
    return {"udf_bytes": total, "per_udf_bytes": udf_bytes, "model_bytes": model_bytes,
            "parameters": parameters, "hidden": hidden, "features": features,
            "target_bytes": UDF_TARGET_BYTES, "target": f"<= {UDF_TARGET_BYTES}",
            "meets_target": total <= UDF_TARGET_BYTES,
            "ratio_to_target": round(total / UDF_TARGET_BYTES, 4),
            "scoring_model_udf_bytes": scoring_model_udf_bytes,
            "definition": "bytes of every Python function TorchModel.transform hands Spark, "
                          "each pickled as pyspark pickles it ((func, returnType) with "
                          "cloudpickle, before pyspark turns a pickle over Spark's 1 MiB "
                          "threshold into a broadcast), summed; model_bytes: "
                          "torch.save(module.state_dict())"}


# ------------------------------------------------------------------------------- measuring
def session() -> Any:
    from _common import start_spark  # bench/ is on sys.path: run as python bench/<name>.py

    return start_spark("sparkdist-bench-scoring", SPARK_CONF)


def frame(spark: Any, rows: int, features: int, seed: int, partitions: int) -> Any:
    """Cached ``features`` array<float> (standard normal) and ``label`` (x0 + x1 > 0)."""
    import numpy as np
    import pyarrow as pa

    def generate(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            ids = batch.column(0).to_numpy()
            if not len(ids):
                continue
            x = np.random.default_rng([seed, int(ids[0])]).standard_normal(
                (len(ids), features), dtype=np.float32)
            offsets = np.arange(0, x.size + 1, features, dtype=np.int32)
            yield pa.RecordBatch.from_arrays(
                [pa.ListArray.from_arrays(offsets, x.ravel()),
                 pa.array((x[:, 0] + x[:, 1] > 0).astype(np.float64))], ["features", "label"])

    df = (spark.range(rows, numPartitions=partitions or None)
          .mapInArrow(generate, "features array<float>, label double").cache())
    assert df.count() == rows
    return df


def fit(spark: Any, sizes: Sizes, hidden: list[int], seed: int, rows: int = 0,
        **params: Any) -> Any:
    """A TorchModel from a 1-epoch fit, one worker, on ``rows`` (else ``fit_rows``) rows: what
    it scores does not matter."""
    from sparkdist.models import TorchEstimator

    train = frame(spark, rows or sizes.fit_rows, sizes.features, seed=seed, partitions=1)
    try:
        return TorchEstimator(modelKwargs={"hidden": hidden}, loss=sizes.loss, epochs=1,
                              numWorkers=1, progress=False, seed=seed, **params).fit(train)
    finally:
        train.unpersist()


def scored_count(model: Any, df: Any) -> int:
    """transform, then a count Spark cannot answer without running the scoring UDF."""
    from pyspark.sql import functions as F

    return int(model.transform(df).where(F.col("prediction").isNotNull()).count())


def bare_side(model: Any, spark: Any) -> tuple[Callable[[Any], int], Any]:
    """The reference: ``count(df)`` scores ``df`` with a bare mapInArrow over the model's own
    network, already built (see the module doc); returns it and the broadcast to destroy."""
    import pickle

    network = model.copy({model.quantization: "none"}).module().cpu().eval()
    payload = spark.sparkContext.broadcast(pickle.dumps(network))
    scorer = bare_scorer(payload, uuid.uuid4().hex, model.inputDim,
                         model.getOrDefault("inferenceBatchSize"), model.getOrDefault("loss"))
    del network

    def count(df: Any) -> int:
        from pyspark.sql import functions as F

        return int(df.select("features").mapInArrow(scorer, "prediction double")
                   .where(F.col("prediction").isNotNull()).count())

    return count, payload


def bare_scorer(payload: Any, token: str, features: int, batch_size: int,
                loss: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The mapInArrow function: the network from this Python worker's cache (built once from
    the broadcast ``payload``), each Arrow batch's features read in place as a float32
    matrix, scored ``batch_size`` rows at a call, and ``prediction`` yielded (bce: logit > 0,
    as TorchModel predicts; mse: the output)."""
    def score(batches: Iterator[Any]) -> Iterator[Any]:
        import pickle
        import types
        import warnings

        import numpy as np
        import pyarrow as pa
        import torch

        cache = sys.modules.setdefault(CACHE_MODULE, types.ModuleType(CACHE_MODULE))
        network = getattr(cache, token, None)
        if network is None:
            network = pickle.loads(payload.value).eval()
            setattr(cache, token, network)
        for batch in batches:
            column = batch.column(0)
            if not len(column):
                continue
            x = column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), features)
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # a read-only view, never written
                output = torch.cat([network(torch.from_numpy(x[start:start + batch_size]))
                                    for start in range(0, len(x), batch_size)])[:, 0].numpy()
            prediction = (output > 0) if loss == "bce" else output
            yield pa.RecordBatch.from_arrays([pa.array(prediction.astype(np.float64))],
                                             ["prediction"])

    return score


def udf_bytes(model: Any, df: Any) -> list[int]:
    """The pickled bytes of each Python function ``model.transform(df)`` hands Spark, as
    pyspark pickles it: pyspark's ``_wrap_function`` (every Python UDF, pandas, Arrow or
    mapIn*, passes through it when its column is made) is wrapped for the call."""
    import pyspark.sql.udf as udf_module
    from pyspark.serializers import CloudPickleSerializer

    found: list[int] = []
    original = udf_module._wrap_function

    def recording(sc: Any, func: Any, returnType: Any = None) -> Any:  # noqa: N803
        command = func if returnType is None else (func, returnType)
        found.append(len(CloudPickleSerializer().dumps(command)))
        return original(sc, func, returnType)

    udf_module._wrap_function = recording
    try:
        model.transform(df)
    finally:
        udf_module._wrap_function = original
    if not found:
        raise RuntimeError("TorchModel.transform created no Python UDF through pyspark's "
                           "_wrap_function: this measurement needs another hook")
    return found


def state_dict_bytes(model: Any) -> tuple[int, int]:
    """Bytes of ``torch.save(module.state_dict())`` and the parameter count."""
    import torch

    network = model.module()
    buffer = io.BytesIO()
    torch.save(network.state_dict(), buffer)
    return len(buffer.getvalue()), sum(p.numel() for p in network.parameters())


def load_seconds(model: Any, spark: Any, features: int, repeats: int) -> dict[str, Any]:
    """Model-load seconds per task, first and later (:func:`load_figures`), for a ``model``
    that no task has scored yet: one partition per core of one scoring batch each."""
    tasks = spark.sparkContext.defaultParallelism
    rows = tasks * model.getOrDefault("inferenceBatchSize")
    small = frame(spark, rows, features, seed=11, partitions=tasks)
    bare, payload = bare_side(model, spark)
    try:
        for _ in range(2):  # every worker builds the bare network (untimed)
            bare(small)
        started = time.perf_counter()
        scored_count(model, small)
        first = time.perf_counter() - started
        first_tasks = model.scoringLoads
        later: list[float] = []
        later_tasks: list[dict] = []
        bare_s: list[float] = []
        for _ in range(repeats):
            for runs, call in ((later, lambda: scored_count(model, small)),
                               (bare_s, lambda: bare(small))):
                started = time.perf_counter()
                call()
                runs.append(time.perf_counter() - started)
            later_tasks += model.scoringLoads
    finally:
        payload.destroy()
        small.unpersist()
    return load_figures(first, later, bare_s, tasks, rows, first_tasks, later_tasks)


def run(sizes: Sizes, log: Callable[[str], None]) -> dict[str, Any]:
    from _common import cold_and_warm

    spark = session()
    figures: dict[str, Any] = {"sizes": asdict(sizes)}
    # the 200 MB model first, before the scored data takes the JVM's memory
    large = fit(spark, sizes, sizes.udf_hidden, seed=7, rows=64, batchSize=64,
                optimizer="sgd")  # one step
    small = frame(spark, 64, sizes.features, seed=9, partitions=1)
    model_bytes, parameters = state_dict_bytes(large)
    found = udf_bytes(large, small)
    del large
    gc.collect()
    log(f"udf: {found} bytes for a {model_bytes:,}-byte model")

    model = fit(spark, sizes, sizes.hidden, seed=1)
    figures["udf"] = udf_figures(found, model_bytes, parameters, sizes.udf_hidden,
                                 sizes.features, sum(udf_bytes(model, small)))
    small.unpersist()
    df = frame(spark, sizes.rows, sizes.features, seed=3, partitions=sizes.partitions)
    figures["network"] = {"features": sizes.features, "hidden": sizes.hidden, "outputs": 1,
                          "loss": sizes.loss, "parameters": state_dict_bytes(model)[1],
                          "scoring_batch_size": model.getOrDefault("inferenceBatchSize"),
                          "partitions": df.rdd.getNumPartitions()}
    log(f"scoring {sizes.rows:,} rows: {figures['network']}")
    bare, payload = bare_side(model, spark)
    int8 = model.copy({model.quantization: "int8"})
    cold, warm, last = cold_and_warm({"sparkdist": lambda: scored_count(model, df),
                                      "int8": lambda: scored_count(int8, df),
                                      "bare": lambda: bare(df)}, sizes.repeats)
    assert set(last.values()) == {sizes.rows}, last
    payload.destroy()
    df.unpersist()
    figures["throughput"] = throughput_figures(cold, warm, sizes.rows, sizes.repeats)
    log(f"throughput: {figures['throughput']}")

    figures["classical"] = classical_figures(spark, sizes)
    log(f"classical: {figures['classical']}")
    fresh = fit(spark, sizes, sizes.hidden, seed=5)  # weights no task has loaded
    figures["load"] = load_seconds(fresh, spark, sizes.features, sizes.load_repeats)
    log(f"load: {figures['load']}")
    figures["machine"] = machine(spark)
    return figures


def classical_figures(spark: Any, sizes: Sizes) -> dict[str, Any]:
    """sparkdist's LogisticRegressionModel.transform against the MLlib model it wraps, the
    same filter and count on the same cached vectors: what sparkdist adds around MLlib's
    transform (target: nothing, a ratio >= 0.95)."""
    from _common import cold_and_warm
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    from sparkdist.models import LogisticRegression

    rows = max(1, sizes.rows // 5)
    df = frame(spark, rows, sizes.features, seed=13, partitions=sizes.partitions)
    vectors = df.select(array_to_vector("features").alias("features"), "label").cache()
    assert vectors.count() == rows
    df.unpersist()
    model = LogisticRegression(maxIter=5).fit(vectors.limit(10_000))

    def count(scorer: Any) -> int:
        return int(scorer.transform(vectors).where(F.col("prediction").isNotNull()).count())

    cold, warm, _ = cold_and_warm({"sparkdist": lambda: count(model),
                                   "mllib": lambda: count(model.mllib_model)}, sizes.repeats)
    vectors.unpersist()

    def kind(seconds: dict[str, float]) -> dict[str, Any]:
        ratio = seconds["mllib"] / seconds["sparkdist"]
        return {"sparkdist_s": round(seconds["sparkdist"], 3),
                "mllib_s": round(seconds["mllib"], 3), "ratio": round(ratio, 3),
                "meets_target": ratio >= CLASSICAL_TARGET}

    return {"rows": rows, "target": f">= {CLASSICAL_TARGET}", "cold": kind(cold),
            "warm": kind({side: statistics.median(runs) for side, runs in warm.items()}),
            "definition": "seconds of sparkdist's LogisticRegressionModel.transform + a count "
                          "that needs the predictions, against the same on the MLlib model it "
                          f"wraps (model.mllib_model), {rows} cached vector rows of "
                          f"{sizes.features} features; ratio: MLlib seconds / sparkdist "
                          "seconds; " + PROTOCOL.format(n=sizes.repeats)}


def machine(spark: Any) -> str:
    import torch

    return (f"{os.cpu_count()} cores, Python {platform.python_version()}, Spark {spark.version}, "
            f"torch {torch.__version__}, master {spark.sparkContext.master}")


def log_line(message: str) -> None:
    print(f"[bench/scoring {time.strftime('%X')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    args, sizes = arguments(argv)
    from _common import write_result

    started = time.perf_counter()
    figures = {"quick": args.quick, **run(sizes, log_line),
               "seconds": round(time.perf_counter() - started, 1)}
    write_result("scoring", figures, save=args.save)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
