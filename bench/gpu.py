"""One GPU: TorchEstimator and TorchModel.transform against plain torch loops, bf16 against
fp32, XGBoost cuda vs cpu.

Every figure is a ratio of two things measured in this run, on this GPU; each has its
definition in a ``note`` next to it.

(a) torch: one rank's samples/s in ``TorchEstimator.fit`` (numWorkers=1, useGpu=True, an MLP)
    against a plain torch loop in this process with the same model, batch, optimizer, loss
    and steps per epoch, its data already on the GPU. Two figures: per epoch (median over
    epochs 2..N, rank 0's own epoch timer against the loop's) and wall clock (rows x epochs
    over the driver's wall time around the whole fit, against the whole loop's time).
(b) bf16: the plain loop under ``torch.autocast(dtype=bfloat16)`` against fp32.
    TorchEstimator has no mixed-precision Param, so it has no bf16 figure.
(c) xgboost: wall clock around ``sparkdist.models.XGBoostClassifier.fit`` (numWorkers=1) with
    ``device="cuda"`` against ``device="cpu"``, same cached DataFrame, same Params.
(d) scoring: samples/s of ``TorchModel.transform`` + a count that needs the predictions (the
    model from a 1-epoch ``useGpu=True`` fit, scoring on the task's GPU) against a plain torch
    loop in this process over the same Arrow batches (the cached DataFrame's, collected once)
    on the same GPU: each batch's features as a float32 matrix, moved to the GPU in slices of
    the model's scoring batch size, the network, the outputs back to the CPU. With each side's
    GPU utilisation while it ran (``nvidia-smi`` sampled every 100 ms; null without it).

Each side: one warm-up, then the median of ``--repeats`` runs, the sides alternating.

Why local-cluster and not local[N]: Spark's local backend offers tasks no custom resources, so
with ``spark.task.resource.gpu.amount`` set a local[N] stage is never scheduled, and without it
a task has no GPU address, which ``gpus.plan_for_task`` needs for ``useGpu=True``. This script
starts ``local-cluster[1,C,M]`` whose one worker discovers one GPU (a script reporting the
first of ``$CUDA_VISIBLE_DEVICES``, else ``0``), with ``spark.executor.resource.gpu.amount=1``
and ``spark.task.resource.gpu.amount=1``, so the training task is assigned that GPU. With
``useGpu=True`` a fit either trains on CUDA or fails; the rank's log line ``device cuda:...``
in the executor's stderr is also checked after the warm-up fit. Run it with the GPU as CUDA
index 0 (no ``CUDA_VISIBLE_DEVICES``, or ``CUDA_VISIBLE_DEVICES=0``): xgboost.spark takes the
assigned address as its CUDA ordinal.

Without CUDA it prints ``{"benchmark": "gpu", "skipped": ...}`` and exits 0. Otherwise it
prints one JSON line and saves it as bench/results/gpu.json.

    python bench/gpu.py [--quick] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/models/torch.py", "sparkdist/torchtrain", "sparkdist/launch/gpus.py")
RESULTS = Path(__file__).resolve().parent / "results" / "gpu.json"
DISCOVERY = """#!/usr/bin/env bash
first="${CUDA_VISIBLE_DEVICES%%,*}"
echo "{\\"name\\": \\"gpu\\", \\"addresses\\": [\\"${first:-0}\\"]}"
"""
FULL = {"rows": 1_000_000, "dim": 256, "hidden": [1024, 1024], "batch": 8192, "epochs": 6,
        "xgb_rows": 500_000, "xgb_dim": 64, "n_estimators": 100, "max_depth": 8,
        "worker_mb": 24576, "executor_memory": "20g", "driver_memory": "8g"}
QUICK = {"rows": 65_536, "dim": 64, "hidden": [256, 256], "batch": 8192, "epochs": 3,
         "xgb_rows": 20_000, "xgb_dim": 16, "n_estimators": 10, "max_depth": 4,
         "worker_mb": 4096, "executor_memory": "3g", "driver_memory": "2g"}


# ------------------------------------------------------------------ the plain torch reference
def plain_loop(device: str, rows: int, dim: int, hidden: list[int], batch: int, epochs: int,
               bf16: bool = False, seed: int = 0) -> dict[str, Any]:
    """Train sparkdist's MLP with Adam (lr 1e-3) and BCE-with-logits on random rows already on
    ``device``: ``ceil(rows / batch)`` near-equal steps per epoch in a fresh seeded order, as
    TorchEstimator takes them, the loss summed on the device and read once per epoch.

    Returns ``epoch_s`` (each epoch, the device synchronised at its end), ``wall_s`` (model
    build to the last epoch's end; the data's creation excluded), ``samples_per_s`` (rows over
    the median of epochs 2..N, or of the only epoch) and ``wall_samples_per_s``.
    """
    import torch
    import torch.nn.functional as F

    from sparkdist.torchtrain.nets import MLP

    dev = torch.device(device)
    generator = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(rows, dim, device=dev, generator=generator)
    y = (x[:, 0] + x[:, 1] > 0).float()
    steps = -(-rows // batch)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    sync()
    begin = time.perf_counter()
    torch.manual_seed(seed)
    model = MLP(dim, 1, hidden).to(dev)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    epoch_s = []
    for _ in range(epochs):
        start = time.perf_counter()
        total = torch.zeros((), dtype=torch.float64, device=dev)
        order = torch.randperm(rows, device=dev, generator=generator)
        for index in order.tensor_split(steps):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                output = model(x[index]).squeeze(-1)
            loss = F.binary_cross_entropy_with_logits(output.float(), y[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(index)
        total.item()  # reads the loss sum: the epoch's one host sync, as TorchEstimator
        sync()
        epoch_s.append(time.perf_counter() - start)
    wall_s = time.perf_counter() - begin
    timed = epoch_s[1:] or epoch_s
    return {"epoch_s": epoch_s, "wall_s": wall_s,
            "samples_per_s": rows / statistics.median(timed),
            "wall_samples_per_s": rows * epochs / wall_s}


# ----------------------------------------------------------------------------------- Spark
def start_spark(cores: int, size: dict[str, Any], scratch: Path) -> Any:
    """local-cluster with one worker that owns one GPU; every task holds it (see module doc)."""
    from sparkdist.session import get_spark

    script = scratch / "discover_gpu.sh"
    script.write_text(DISCOVERY)
    script.chmod(0o755)
    os.environ.pop("SPARKDIST_QUIET_RANKS", None)  # the rank logs name the device
    return get_spark(master=f"local-cluster[1,{cores},{size['worker_mb']}]",
                     app_name="sparkdist-bench-gpu",
                     conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                           "spark.executor.memory": size["executor_memory"],
                           # (d) collects the scored rows' Arrow batches into this process
                           "spark.driver.memory": size["driver_memory"],
                           "spark.driver.maxResultSize": "0",
                           "spark.task.cpus": str(cores),
                           "spark.worker.resource.gpu.amount": "1",
                           "spark.worker.resource.gpu.discoveryScript": str(script),
                           "spark.executor.resource.gpu.amount": "1",
                           "spark.task.resource.gpu.amount": "1",
                           "spark.sql.shuffle.partitions": "1"})


def random_frame(spark: Any, rows: int, dim: int, seed: int) -> Any:
    """Cached ``features`` array<float> (standard normal) and ``label`` = x0 + x1 > 0."""
    from collections.abc import Iterator

    import numpy as np
    import pyarrow as pa

    def generate(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            ids = batch.column(0).to_numpy()
            if not len(ids):
                continue
            x = np.random.default_rng([seed, int(ids[0])]).standard_normal(
                (len(ids), dim), dtype=np.float32)
            features = pa.ListArray.from_arrays(np.arange(0, x.size + 1, dim, dtype=np.int32),
                                                x.ravel())
            label = pa.array((x[:, 0] + x[:, 1] > 0).astype(np.float64))
            yield pa.RecordBatch.from_arrays([features, label], ["features", "label"])

    df = (spark.range(rows, numPartitions=4)
          .mapInArrow(generate, "features array<float>, label double").cache())
    assert df.count() == rows
    return df


def rank_devices(spark: Any) -> list[str]:
    """The ``device ...`` lines the training ranks logged, from the executors' stderr files
    (local-cluster keeps them under ``$SPARK_HOME/work/<app id>/<executor>/stderr``)."""
    from pyspark.find_spark_home import _find_spark_home

    app = spark.sparkContext.applicationId
    lines = []
    for home in (_find_spark_home(), os.getcwd()):
        for path in glob.glob(os.path.join(home, "work", app, "*", "stderr")):
            with open(path, errors="replace") as handle:
                lines += [line.split("] ", 1)[1].strip() for line in handle
                          if line.startswith("[sparkdist rank") and "] device " in line]
    return lines


def median_rate(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def torch_figures(spark: Any, size: dict[str, Any], repeats: int) -> dict[str, Any]:
    """(a) TorchEstimator against the plain loop, and (b) bf16 against fp32 (plain loop)."""
    from sparkdist.models import TorchEstimator

    rows, dim, hidden, batch, epochs = (size[k] for k in ("rows", "dim", "hidden", "batch",
                                                          "epochs"))
    df = random_frame(spark, rows, dim, seed=1)
    estimator = TorchEstimator(modelKwargs={"hidden": hidden}, batchSize=batch, epochs=epochs,
                               numWorkers=1, useGpu=True, progress=False, seed=1)

    def fit() -> dict[str, Any]:
        begin = time.perf_counter()
        model = estimator.fit(df)
        wall_s = time.perf_counter() - begin
        epoch_s = [record["seconds"] for record in model.history]
        return {"epoch_s": epoch_s, "wall_s": wall_s,
                "samples_per_s": rows / statistics.median(epoch_s[1:] or epoch_s),
                "wall_samples_per_s": rows * epochs / wall_s,
                "spill_s": model.trainingSummary["spill_seconds"],
                "placement": model.trainingSummary["placement"]}

    def plain(bf16: bool) -> dict[str, Any]:
        return plain_loop("cuda", rows, dim, hidden, batch, epochs, bf16=bf16)

    warm_up = fit()
    devices = rank_devices(spark)
    if any(not line.startswith("device cuda") for line in devices):
        raise SystemExit(f"TorchEstimator did not train on CUDA: {devices}")
    plain(False), plain(True)
    runs: dict[str, list[dict[str, Any]]] = {"sparkdist": [], "fp32": [], "bf16": []}
    for _ in range(repeats):
        runs["fp32"].append(plain(False))
        runs["bf16"].append(plain(True))
        runs["sparkdist"].append(fit())
    df.unpersist()
    ours, fp32, bf16 = (median_rate(runs[k], "samples_per_s") for k in ("sparkdist", "fp32",
                                                                       "bf16"))
    ours_wall, fp32_wall = (median_rate(runs[k], "wall_samples_per_s")
                            for k in ("sparkdist", "fp32"))
    import torch

    return {
        "torch": {
            "rows": rows, "features": dim, "hidden": hidden, "batch_size": batch,
            "epochs": epochs, "optimizer": "adam lr 1e-3", "loss": "bce",
            "sparkdist_samples_per_s": round(ours), "plain_samples_per_s": round(fp32),
            "ratio": round(ours / fp32, 3),
            "sparkdist_wall_samples_per_s": round(ours_wall),
            "plain_wall_samples_per_s": round(fp32_wall),
            "ratio_wall": round(ours_wall / fp32_wall, 3),
            "sparkdist_fit_s": [round(run["wall_s"], 2) for run in runs["sparkdist"]],
            "sparkdist_spill_s": [round(run["spill_s"], 2) for run in runs["sparkdist"]],
            "sparkdist_epoch_s": [[round(s, 3) for s in run["epoch_s"]]
                                  for run in runs["sparkdist"]],
            "plain_epoch_s": [[round(s, 3) for s in run["epoch_s"]] for run in runs["fp32"]],
            "warm_up_fit_s": round(warm_up["wall_s"], 2),
            "rank_device_log": devices[0] if devices else "executor stderr not found",
            "placement": warm_up["placement"],
            "note": "ratio (headline): samples/s of one TorchEstimator rank (numWorkers=1, "
                    "useGpu=True) = rows / median of epochs 2..N as rank 0 times them "
                    "(model.history seconds), over the same for a plain torch loop in the "
                    "driver process on the same GPU: same MLP, batch, Adam, BCE, steps per "
                    "epoch, its data already on the GPU (sparkdist reads its rows from the "
                    "local spill file and copies each batch to the GPU, the plain loop "
                    "indexes a GPU tensor). ratio_wall: rows*epochs / driver wall time around "
                    "the whole fit (data check job, spill from Spark, rendezvous, weights "
                    "back), over rows*epochs / the plain loop's whole time (model build and "
                    "every epoch, data creation excluded). fp32 as torch's defaults give it "
                    f"(TF32 matmul {torch.backends.cuda.matmul.allow_tf32}). Median of "
                    f"{repeats} after one warm-up, alternating."},
        "bf16": {
            "fp32_samples_per_s": round(fp32), "bf16_samples_per_s": round(bf16),
            "ratio": round(bf16 / fp32, 3),
            "bf16_epoch_s": [[round(s, 3) for s in run["epoch_s"]] for run in runs["bf16"]],
            "sparkdist": None,
            "note": "ratio: samples/s (rows / median of epochs 2..N) of the plain loop with "
                    "its forward pass under torch.autocast(dtype=torch.bfloat16) over the "
                    "same loop in fp32; same model, data, batch, optimizer. TorchEstimator "
                    "has no mixed-precision Param (no autocast or bf16 anywhere in "
                    "sparkdist.torchtrain), so there is no sparkdist bf16 figure."}}


def xgboost_figures(spark: Any, size: dict[str, Any], repeats: int, cores: int) -> dict:
    """(c) XGBoostClassifier.fit wall clock, device cuda against cpu."""
    from sparkdist.models import XGBoostClassifier

    rows = size["xgb_rows"]
    df = random_frame(spark, rows, size["xgb_dim"], seed=2)
    params = {"num_workers": 1, "n_estimators": size["n_estimators"],
              "max_depth": size["max_depth"], "tree_method": "hist"}

    def fit(device: str) -> float:
        begin = time.perf_counter()
        XGBoostClassifier(device=device, **params).fit(df)
        return time.perf_counter() - begin

    fit("cpu"), fit("cuda")
    times: dict[str, list[float]] = {"cpu": [], "cuda": []}
    for _ in range(repeats):
        for device in times:
            times[device].append(fit(device))
    df.unpersist()
    cpu, cuda = (statistics.median(times[k]) for k in ("cpu", "cuda"))
    return {"rows": rows, "features": size["xgb_dim"], **params, "cpu_threads": cores,
            "cpu_fit_s": round(cpu, 3), "cuda_fit_s": round(cuda, 3),
            "cpu_fit_s_all": [round(s, 2) for s in times["cpu"]],
            "cuda_fit_s_all": [round(s, 2) for s in times["cuda"]],
            "ratio": round(cpu / cuda, 3),
            "note": "ratio: rows/s with device='cuda' over rows/s with device='cpu' (= cpu "
                    "fit seconds / cuda fit seconds; > 1: cuda is faster), each the driver's "
                    "wall clock around sparkdist.models.XGBoostClassifier.fit on the same "
                    "cached DataFrame with the same Params, numWorkers=1; the cpu side uses "
                    f"spark.task.cpus={cores} threads. Median of {repeats} after one warm-up "
                    "each, alternating."}


# ---------------------------------------------------------------------------------- scoring
def plain_scoring(module: Any, batches: list[Any], dim: int, batch_size: int,
                  device: str) -> int:
    """TorchModel's scoring by hand: each Arrow batch's ``features`` list array read in place as
    a float32 matrix, ``batch_size`` rows at a time to ``device``, the network under
    ``torch.no_grad()``, the outputs back to the CPU and ``prediction`` = logit > 0; returns
    the rows with a prediction."""
    import numpy as np
    import torch

    dev = torch.device(device)
    rows = 0
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a read-only view, never written
        for batch in batches:
            column = batch.column(0)
            if not len(column):
                continue
            x = column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), dim)
            logits = torch.cat([module(torch.from_numpy(x[start:start + batch_size]).to(dev))
                                .cpu() for start in range(0, len(x), batch_size)])
            prediction = (logits[:, 0] > 0).double().numpy()
            rows += int(np.count_nonzero(~np.isnan(prediction)))
    return rows


class Utilisation:
    """The GPU's utilisation (%), sampled by ``nvidia-smi`` every ``every_ms`` while the
    ``with`` block runs; no samples where nvidia-smi is missing."""

    def __init__(self, index: str, every_ms: int = 100) -> None:
        self.index, self.every_ms = index, every_ms
        self.samples: list[float] = []
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> Utilisation:
        exe = shutil.which("nvidia-smi")
        if exe:
            self._proc = subprocess.Popen(
                [exe, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i",
                 self.index, "-lms", str(self.every_ms)], stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            with contextlib.suppress(ValueError):
                self.samples.append(float(line.strip()))

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=10)


def utilisation_summary(samples: list[float]) -> dict[str, Any] | None:
    """Mean and highest utilisation (%) and the sample count; None without samples."""
    if not samples:
        return None
    return {"mean_percent": round(statistics.mean(samples), 1),
            "max_percent": round(max(samples), 1), "samples": len(samples)}


def gpu_index() -> str:
    """The GPU the worker discovers (DISCOVERY): the first of CUDA_VISIBLE_DEVICES, else 0."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0] or "0"


def scoring_figures(spark: Any, size: dict[str, Any], repeats: int) -> dict[str, Any]:
    """(d) TorchModel.transform on the task's GPU against a plain loop over the same Arrow
    batches on the same GPU, each with its GPU utilisation."""
    from pyspark.sql import functions as F

    from sparkdist.models import TorchEstimator

    rows, dim, hidden = size["rows"], size["dim"], size["hidden"]
    sample = random_frame(spark, min(rows, 8192), dim, seed=4)
    model = TorchEstimator(modelKwargs={"hidden": hidden}, epochs=1, numWorkers=1,
                           useGpu=True, progress=False, seed=4).fit(sample)
    sample.unpersist()
    df = random_frame(spark, rows, dim, seed=3)
    batches = df.select("features").toArrow().to_batches()
    batch = model.getOrDefault("inferenceBatchSize")
    module = model.module().to("cuda").eval()

    def ours() -> int:
        return int(model.transform(df).where(F.col("prediction").isNotNull()).count())

    def plain() -> int:
        return plain_scoring(module, batches, dim, batch, "cuda")

    sides = {"sparkdist": ours, "plain": plain}
    for name, call in sides.items():  # one warm-up each
        assert call() == rows, name
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, call in sides.items():
            with Utilisation(gpu_index()) as sampler:
                begin = time.perf_counter()
                call()
                seconds[name].append(time.perf_counter() - begin)
            samples[name] += sampler.samples
    df.unpersist()
    ours_s, plain_s = (statistics.median(seconds[k]) for k in ("sparkdist", "plain"))
    return {"rows": rows, "features": dim, "hidden": hidden, "batch_size": batch,
            "sparkdist_samples_per_s": round(rows / ours_s),
            "plain_samples_per_s": round(rows / plain_s), "ratio": round(plain_s / ours_s, 3),
            "sparkdist_s_all": [round(s, 3) for s in seconds["sparkdist"]],
            "plain_s_all": [round(s, 3) for s in seconds["plain"]],
            "gpu_utilisation": {name: utilisation_summary(found)
                                for name, found in samples.items()},
            "note": "ratio: samples/s of TorchModel.transform + a count that needs the "
                    "predictions (filter prediction IS NOT NULL), the model from a 1-epoch "
                    "useGpu=True fit scoring on the GPU Spark assigned to the task, over "
                    "samples/s of a plain torch loop in the driver process over the same "
                    "Arrow batches (the cached DataFrame's features, collected once before) "
                    "on the same GPU: each batch's list array read in place as a float32 "
                    "matrix, moved to the GPU in slices of the model's scoring batch size, "
                    "the same network under no_grad, the outputs back to the CPU, prediction "
                    "= logit > 0. Wall clock around each call; median of "
                    f"{repeats} after one warm-up each, alternating. gpu_utilisation: "
                    "nvidia-smi's utilization.gpu every 100 ms during each side's timed "
                    "calls (null without nvidia-smi)."}


# ------------------------------------------------------------------------------------ main
def save(line: str) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(line + "\n")
    os.replace(tmp, RESULTS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per side (3)")
    parser.add_argument("--cores", type=int, default=min(8, os.cpu_count() or 1),
                        help="the worker's cores = spark.task.cpus (XGBoost's CPU threads)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"benchmark": "gpu", "skipped": (
            f"no CUDA device: torch {torch.__version__} (CUDA build: {torch.version.cuda}) "
            "reports torch.cuda.is_available() False")}))
        return 0
    size = QUICK if args.quick else FULL
    repeats = args.repeats or (1 if args.quick else 3)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sparkdist-bench-gpu-") as scratch:
        spark = start_spark(args.cores, size, Path(scratch))
        try:
            figures: dict[str, Any] = {"benchmark": "gpu", "quick": args.quick,
                                       "repeats": repeats}
            figures.update(torch_figures(spark, size, repeats))
            figures["scoring"] = scoring_figures(spark, size, repeats)
            figures["xgboost"] = xgboost_figures(spark, size, repeats, args.cores)
            import xgboost

            figures["seconds"] = round(time.perf_counter() - started, 1)
            figures["machine"] = (
                f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} cores, Python "
                f"{platform.python_version()}, Spark {spark.version}, torch "
                f"{torch.__version__} (CUDA {torch.version.cuda}), xgboost "
                f"{xgboost.__version__}, master {spark.sparkContext.master}")
        finally:
            spark.stop()
    line = json.dumps(figures)
    print(line)
    save(line)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
