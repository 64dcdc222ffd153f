"""Int8 scoring against float32 (issue 17, "Measure": int8 transform), both sides measured in
the same run on the same model and data (docs: ../shared/design.md section 5).

The model: sparkdist's MLP with hidden layers [1024, 1024] on 128 features, trained once with
TorchEstimator on ``datasets.make_nonlinear`` (the Linear layers hold all of its weights). The
two sides are that TorchModel with ``quantization='none'`` and ``'int8'``, at the defaults
(scoring batchSize 256, local[2]: two tasks).

- warm: rows/s of ``transform`` + a count that needs the predictions (a filter on
  ``prediction``; a bare count lets Spark prune the scoring UDF), wall clock on the driver
  around the whole call, in a session whose Python workers already scored; median of
  ``--repeats`` (3) per side after one untimed call of each, the sides alternating.
- cold: the same call as the first thing a fresh process does after its SparkSession started
  and cached the data (so the Python workers start, import torch/torchao and build the network
  inside the timed call); one process per call, the sides alternating, median of
  ``--cold-rounds`` (3).
- size: bytes of ``torch.save(module.state_dict())``, float32 against int8 (the network
  ``TorchModel.module()`` returns for each setting).
- accuracy: test-split accuracy of each side and their difference in percentage points
  (target <= 0.5), with the share of rows where the two predictions agree.
- kernel (context for the rows/s above): rows/s of the network alone, in this process on one
  thread, on a float32 matrix (no Spark, no Arrow), the sides alternating; with the deprecated
  ``torch.ao.quantization.quantize_dynamic`` (fbgemm) as a third, reference side.

Prints one JSON line; a full run (no --quick) also saves it as bench/results/quantization.json.

    python bench/quantization.py [--quick] [--train-rows 50000] [--score-rows 100000] ...
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/models/torch.py", "sparkdist/torchtrain/inference.py")
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "3g"}
ACCURACY_TARGET_PP = 0.5
PROTOCOL = ("wall clock on the driver around transform + a count that needs the predictions; "
            "median of {n} per side, the sides alternating")


@dataclass
class Sizes:
    features: int
    hidden: list[int]
    train_rows: int
    epochs: int
    score_rows: int
    repeats: int
    cold_rounds: int


def arguments(argv: list[str] | None = None) -> tuple[argparse.Namespace, Sizes]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, 1 timed call per side: checks that every part runs")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, nargs="+", default=[1024, 1024])
    parser.add_argument("--train-rows", type=int, default=50_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--score-rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold-rounds", type=int, default=3)
    parser.add_argument("--cold", nargs=3, metavar=("SIDE", "MODEL", "DATA"),
                        help=argparse.SUPPRESS)  # one cold call, in a process of its own
    args = parser.parse_args(argv)
    if args.quick:
        return args, Sizes(16, [64, 64], 2_000, 1, 4_000, 1, 1)
    return args, Sizes(args.features, list(args.hidden), args.train_rows, args.epochs,
                       args.score_rows, args.repeats, args.cold_rounds)


# ------------------------------------------------------------------------------- measuring
def session() -> Any:
    from _common import start_spark  # bench/ is on sys.path: run as python bench/<name>.py

    return start_spark("sparkdist-bench-quantization", SPARK_CONF)


def scored_count(model: Any, df: Any) -> int:
    """transform, then a count Spark cannot answer without running the scoring UDF."""
    from pyspark.sql import functions as F

    return int(model.transform(df).where(F.col("prediction").isNotNull()).count())


def with_quantization(model: Any, value: str) -> Any:
    return model.copy({model.quantization: value})


def side_figures(seconds: dict[str, float], rows: int, protocol: str) -> dict[str, Any]:
    """Seconds and rows/s of each side and int8's speed-up (float32 seconds / int8 seconds)."""
    return {"fp32_s": round(seconds["fp32"], 3), "int8_s": round(seconds["int8"], 3),
            "fp32_rows_per_s": round(rows / seconds["fp32"]),
            "int8_rows_per_s": round(rows / seconds["int8"]),
            "int8_speedup": round(seconds["fp32"] / seconds["int8"], 3), "rows": rows,
            "definition": protocol}


def size_figures(fp32_bytes: int, int8_bytes: int) -> dict[str, Any]:
    return {"fp32_bytes": fp32_bytes, "int8_bytes": int8_bytes,
            "int8_to_fp32": round(int8_bytes / fp32_bytes, 3),
            "definition": "bytes of torch.save(module.state_dict()) of TorchModel.module() "
                          "with quantization='none' and 'int8'"}


def accuracy_figures(label: list[float], fp32: list[float], int8: list[float]) -> dict[str, Any]:
    """Both sides' accuracy on the same rows (in the same order), their difference in
    percentage points against the target, and the rows on which they agree."""
    rows = len(label)
    correct = {name: sum(p == y for p, y in zip(pred, label)) / rows
               for name, pred in (("fp32", fp32), ("int8", int8))}
    difference = 100 * abs(correct["fp32"] - correct["int8"])
    return {"fp32": round(correct["fp32"], 5), "int8": round(correct["int8"], 5),
            "difference_pp": round(difference, 3), "target_pp": f"<= {ACCURACY_TARGET_PP}",
            "meets_target": difference <= ACCURACY_TARGET_PP,
            "agreement": round(sum(a == b for a, b in zip(fp32, int8)) / rows, 5), "rows": rows,
            "definition": "test-split accuracy of each side and |fp32 - int8| in percentage "
                          "points; agreement: share of rows with the same prediction"}


def alternate(sides: dict[str, Any], repeats: int) -> dict[str, float]:
    from _common import alternating

    return alternating(sides, repeats, warmup=1)


# ------------------------------------------------------------------------------- the parts
def data(spark: Any, rows: int, features: int, seed: int, partitions: int = 2) -> Any:
    """Cached ``make_nonlinear`` rows with an ``id`` (to line up the two sides' predictions)."""
    from sparkdist.datasets import make_nonlinear

    pdf = make_nonlinear(rows, seed=seed, dim=features)
    pdf.insert(0, "id", range(rows))
    df = spark.createDataFrame(pdf).repartition(partitions).cache()
    assert df.count() == rows
    return df


def train(train_df: Any, sizes: Sizes) -> Any:
    from sparkdist.models import TorchEstimator

    return TorchEstimator(modelKwargs={"hidden": sizes.hidden}, epochs=sizes.epochs,
                          numWorkers=2, seed=17, progress=False).fit(train_df)


def accuracy(model: Any, test: Any) -> dict[str, Any]:
    frames = {side: with_quantization(model, side).transform(test)
              .select("id", "label", "prediction").toPandas().sort_values("id")
              for side in ("none", "int8")}
    label = frames["none"]["label"].tolist()
    return accuracy_figures(label, frames["none"]["prediction"].tolist(),
                            frames["int8"]["prediction"].tolist())


def cold(model_dir: str, data_dir: str, rounds: int, rows: int, log: Any,
         together: bool = False) -> dict[str, Any]:
    """Each call in a fresh process (its own SparkSession), the sides alternating; with
    ``together`` (--quick, a smoke run whose seconds are not figures) both sides' processes of
    a round run at once."""
    seconds: dict[str, list[float]] = {"fp32": [], "int8": []}
    for index in range(rounds):
        groups = [("fp32", "int8")] if together else [("fp32",), ("int8",)]
        for group in groups:
            for side, taken in cold_processes(group, model_dir, data_dir).items():
                seconds[side].append(taken)
                log(f"cold {side} round {index + 1}: {taken:.2f} s")
    figures = side_figures({side: statistics.median(values) for side, values in seconds.items()},
                           rows, "the first call in a fresh process (Python workers start, "
                           "import torch and torchao, build and quantize the network inside it); "
                           + PROTOCOL.format(n=rounds))
    return {**figures, "fp32_runs_s": [round(s, 3) for s in seconds["fp32"]],
            "int8_runs_s": [round(s, 3) for s in seconds["int8"]]}


def cold_processes(sides: tuple[str, ...], model_dir: str, data_dir: str) -> dict[str, float]:
    """One cold call per side, each in a process of its own, the processes started at once."""
    running = {side: subprocess.Popen([sys.executable, __file__, "--cold", side, model_dir,
                                       data_dir], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for side in sides}
    seconds: dict[str, float] = {}
    for side, proc in running.items():
        out, err = proc.communicate(timeout=900)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            raise RuntimeError(f"cold {side} call failed (exit {proc.returncode}): "
                               f"{err[-3000:]}")
        seconds[side] = float(json.loads(lines[-1])["seconds"])
    return seconds


def cold_call(side: str, model_dir: str, data_dir: str) -> None:
    """In a fresh process: load the model and the data (cached), then time one call."""
    from sparkdist.models import TorchModel

    spark = session()
    df = spark.read.parquet(data_dir).cache()
    df.count()
    model = with_quantization(TorchModel.load(model_dir), "int8" if side == "int8" else "none")
    start = time.perf_counter()
    scored_count(model, df)
    print(json.dumps({"side": side, "seconds": time.perf_counter() - start}), flush=True)
    spark.stop()


def kernel(model: Any, rows: int, features: int, repeats: int) -> dict[str, Any]:
    """The networks alone: what the int8 kernels give before Spark and Arrow take their
    share."""
    import numpy as np
    import torch

    from sparkdist.torchtrain.inference import score

    matrix = np.random.default_rng(3).normal(size=(rows, features)).astype(np.float32)
    networks = {"fp32": with_quantization(model, "none").module(),
                "int8": with_quantization(model, "int8").module(),
                "deprecated_quantize_dynamic": legacy_int8(with_quantization(model, "none"))}
    batch = model.getOrDefault("batchSize")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seconds = alternate({side: lambda n=n: score(n, matrix, batch, 1)
                             for side, n in networks.items()}, repeats)
    finally:
        torch.set_num_threads(threads)
    return {**{f"{side}_rows_per_s": round(rows / s) for side, s in seconds.items()},
            "int8_speedup": round(seconds["fp32"] / seconds["int8"], 3),
            "deprecated_quantize_dynamic_speedup": round(
                seconds["fp32"] / seconds["deprecated_quantize_dynamic"], 3),
            "rows": rows, "definition": "the network alone on a float32 matrix in batches of "
            f"batchSize, one thread, in the driver process; median of {repeats} per side, the "
            "sides alternating after one untimed call of each"}


def legacy_int8(model: Any) -> Any:
    """The float32 network through torch.ao.quantization.quantize_dynamic (deprecated in
    torch 2.13, kept here as a reference only)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(model.module(), {torch.nn.Linear}, dtype=torch.qint8)


def network_figures(model: Any, sizes: Sizes) -> dict[str, Any]:
    import torch

    network = model.module()
    total = sum(p.numel() for p in network.parameters())
    linear = sum(p.numel() for layer in network.modules() if isinstance(layer, torch.nn.Linear)
                 for p in layer.parameters())
    return {"features": sizes.features, "hidden": sizes.hidden, "parameters": total,
            "linear_share": round(linear / total, 4),
            "train_seconds_per_epoch": [round(e["seconds"], 1) for e in model.history]}


def run(sizes: Sizes, log: Any, quick: bool = False) -> dict[str, Any]:
    from sparkdist.torchtrain.inference import state_bytes

    spark = session()
    figures: dict[str, Any] = {"sizes": asdict(sizes)}
    train_df = data(spark, sizes.train_rows, sizes.features, seed=1)
    model = train(train_df, sizes)
    train_df.unpersist()
    figures["network"] = network_figures(model, sizes)
    log(f"trained: {figures['network']}")
    test = data(spark, sizes.score_rows, sizes.features, seed=2)
    sides = {side: with_quantization(model, value) for side, value in
             (("fp32", "none"), ("int8", "int8"))}
    figures["size"] = size_figures(state_bytes(sides["fp32"].module()),
                                   state_bytes(sides["int8"].module()))
    figures["accuracy"] = accuracy(model, test)
    log(f"accuracy: {figures['accuracy']}")
    figures["kernel"] = kernel(model, min(sizes.score_rows, 20_000), sizes.features,
                               sizes.repeats)
    log(f"kernel: {figures['kernel']}")
    warm = alternate({side: lambda m=m: scored_count(m, test) for side, m in sides.items()},
                     sizes.repeats)
    figures["warm"] = side_figures(warm, sizes.score_rows, "in a session whose Python workers "
                                   "already scored; " + PROTOCOL.format(n=sizes.repeats)
                                   + " after one untimed call of each")
    log(f"warm: {figures['warm']}")
    with tempfile.TemporaryDirectory(prefix="sparkdist-bench-quantization-") as tmp:
        model.write().save(f"{tmp}/model")
        test.drop("id").write.parquet(f"{tmp}/data")
        test.unpersist()
        figures["machine"] = machine(spark)
        spark.stop()  # the cold processes get the cores to themselves
        figures["cold"] = cold(f"{tmp}/model", f"{tmp}/data", sizes.cold_rounds,
                               sizes.score_rows, log, together=quick)
    return figures


def machine(spark: Any) -> str:
    import torch

    return (f"{os.cpu_count()} cores, Python {platform.python_version()}, Spark {spark.version}, "
            f"torch {torch.__version__}, master {spark.sparkContext.master}, load avg (1 min) "
            f"{os.getloadavg()[0]:.2f}")


def log_line(message: str) -> None:
    print(f"[bench/quantization {time.strftime('%X')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    args, sizes = arguments(argv)
    if args.cold:
        return cold_call(*args.cold)
    from _common import write_result

    started = time.perf_counter()
    figures = {"quick": args.quick, **run(sizes, log_line, quick=args.quick),
               "seconds": round(time.perf_counter() - started, 1)}
    write_result("quantization", figures, save=not args.quick)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
