"""Several typed inputs (issue 27, "Measure"), every figure from one run on this machine,
timed as bench/_common.py says (wall clock on the driver around the whole call, one untimed
warm-up, median of --repeats, the sides alternating).

- feed: rows/s of a DLRM-style fit (``nets.ClickModel``: 13 dense floats + 26 hashed ids per
  row into tables of 100,000 rows, embedding width 4, 1 epoch, 2 workers, batchSize 4096)
  against a bare barrier ``mapInArrow`` over the same two columns, cast the same way, that
  turns each Arrow batch into the same numpy arrays (float32 [b, 13], int64 [b, 26]) and
  counts them, with one partition per worker by the fit's own rule. Target >= 0.8.
- click AUC: the same model trained by TorchEstimator (2 workers, 2 epochs) and by a plain
  single-process torch loop over the same training rows (same seed, the global batch, same
  epochs), both scored on the same test rows. Target: within 0.002.
- digits: a CNN (``nets.ImageCNN``) on scikit-learn's digits as [1, 8, 8] images, test
  accuracy. Target >= 0.98.
- ratings: ``nets.TwoTower`` on the ratings sample (``datasets.make_ratings(density=0.3,
  seed=0)``, integer ids) against sparkdist's ALS on the same 80/20 split: test RMSE of each
  (reported; lower wins).
- sequence memory: the peak RSS of the busiest rank of a fit on token sequences
  (``nets.SequenceClassifier``), at 4x the rows against 1x. Target <= 1.2.

The session's driver gets 3 GiB (``spark.driver.memory``): at 400,000 cached rows the default
1 GiB heap runs out while rank 0's 42 MB of weights come back through the JVM.

Prints one JSON line; a full run (no --quick) also saves it as bench/results/inputs.json.

    python bench/inputs.py [--quick] [--rows 400000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from _common import machine, start_spark, write_result

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/models/torch.py", "sparkdist/models/_torch_checks.py",
            "sparkdist/torchtrain", "sparkdist/launch")
PROTOCOL = ("wall clock on the driver around the whole call; median of {n} per side after one "
            "untimed call of each, the sides alternating")
CLICK = {"dense": 13, "tables": [100_000] * 26, "dim": 4, "hidden": [16]}


def click_frame(spark: Any, rows: int, seed: int, partitions: int = 2) -> Any:
    """Criteo-like rows: 13 normal dense features, 26 ids (Zipf-like, below 100,000), a click
    drawn from a logistic function of a few of them."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(rows, 13)).astype(np.float32)
    ids = np.minimum(rng.zipf(1.3, (rows, 26)) - 1, 99_999)
    logit = dense[:, 0] - 0.5 * dense[:, 1] + 0.8 * (ids[:, 0] % 3 == 0) - 0.6 * (ids[:, 1] < 2)
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    frame = pd.DataFrame({"dense": list(dense), "ids": list(ids), "label": label})
    df = spark.createDataFrame(frame).repartition(partitions).cache()
    df.count()
    return df


def click_estimator(**settings: Any) -> Any:
    from sparkdist.models import TorchEstimator
    from sparkdist.torchtrain import nets

    return TorchEstimator(model=nets.ClickModel, modelKwargs=CLICK, loss="bce",
                          inputCols={"dense": "dense", "ids": "ids"},
                          inputShapes={"ids": [26]}, numWorkers=2, progress=False, seed=3,
                          **settings)


def arrays_counted(batches: Iterator[Any]) -> Iterator[Any]:
    """The bare reference's task: each Arrow batch into the fit's numpy arrays; count."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        dense = pc.list_flatten(batch.column(0)).to_numpy(zero_copy_only=False)
        ids = pc.list_flatten(batch.column(1)).to_numpy(zero_copy_only=False)
        dense = dense.astype(np.float32, copy=False).reshape(batch.num_rows, -1)
        ids = ids.astype(np.int64, copy=False).reshape(batch.num_rows, -1)
        labels = batch.column(2).to_numpy(zero_copy_only=False).astype(np.float32)
        rows += min(len(dense), len(ids), len(labels))
    yield pa.RecordBatch.from_pydict({"rows": pa.array([rows], pa.int64())})


def bare_scan(df: Any) -> int:
    from pyspark.sql import functions as F

    from sparkdist.launch.barrier import _with_partitions

    columns = df.select(F.col("dense").cast("array<float>"), F.col("ids").cast("array<bigint>"),
                        F.col("label").cast("float"))
    counted = (_with_partitions(columns, 2).mapInArrow(arrays_counted, "rows long", barrier=True)
               .repartition(1).collect())
    return sum(row["rows"] for row in counted)


def alternate(sides: dict[str, Any], repeats: int) -> tuple[dict[str, list[float]], dict]:
    """Seconds of each side's calls, and each side's last result."""
    for call in sides.values():
        call()
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    last: dict[str, Any] = {}
    for _ in range(repeats):
        for name, call in sides.items():
            started = time.perf_counter()
            last[name] = call()
            seconds[name].append(time.perf_counter() - started)
    return seconds, last


def feed(df: Any, rows: int, repeats: int) -> dict:
    estimator = click_estimator(epochs=1, batchSize=4096)
    seconds, last = alternate({"fit": lambda: estimator.fit(df), "bare": lambda: bare_scan(df)},
                              repeats)
    fit, bare = (statistics.median(seconds[k]) for k in ("fit", "bare"))
    ratio = round(bare / fit, 3)
    return {"ratio": ratio, "target": ">= 0.8", "meets_target": ratio >= 0.8, "rows": rows,
            "fit_rows_per_s": round(rows / fit), "bare_rows_per_s": round(rows / bare),
            "fit_runs_s": [round(s, 3) for s in seconds["fit"]],
            "bare_runs_s": [round(s, 3) for s in seconds["bare"]],
            "ranks": last["fit"].trainingSummary["ranks"],
            "definition": "rows/s of the DLRM-style TorchEstimator fit (1 epoch, 2 workers, "
                          "batchSize 4096, progress off) over rows/s of a bare barrier "
                          "mapInArrow reading the same columns into the same numpy arrays; "
                          + PROTOCOL.format(n=repeats)}


def single_process_auc(train: Any, test: Any, epochs: int, batch: int) -> float:
    """The click model trained by a plain torch loop on all training rows in this process."""
    import torch
    from sklearn.metrics import roc_auc_score

    from sparkdist.torchtrain import nets

    def arrays(df: Any) -> tuple[Any, Any, Any]:
        frame = df.toPandas()
        return (torch.tensor(np.stack(frame.dense.to_numpy()), dtype=torch.float32),
                torch.tensor(np.stack(frame.ids.to_numpy()), dtype=torch.int64),
                torch.tensor(frame.label.to_numpy(), dtype=torch.float32))

    torch.manual_seed(3)
    net = nets.ClickModel(**CLICK)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    dense, ids, label = arrays(train)
    generator = torch.Generator().manual_seed(3)
    for _ in range(epochs):
        order = torch.randperm(len(label), generator=generator)
        for start in range(0, len(order), batch):
            rows = order[start:start + batch]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                net(dense[rows], ids[rows]).squeeze(1), label[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dense, ids, label = arrays(test)
    with torch.no_grad():
        return float(roc_auc_score(label.numpy(), net(dense, ids).squeeze(1).numpy()))


def click_auc(df: Any, epochs: int = 2, batch: int = 1024) -> dict:
    from sklearn.metrics import roc_auc_score

    train, test = df.randomSplit([0.8, 0.2], seed=7)
    model = click_estimator(epochs=epochs, batchSize=batch // 2).fit(train)
    scored = model.transform(test).select("probability", "label").toPandas()
    ours = float(roc_auc_score(scored.label, [p[1] for p in scored.probability]))
    single = single_process_auc(train, test, epochs, batch)
    difference = round(abs(ours - single), 4)
    return {"sparkdist_auc": round(ours, 4), "single_process_auc": round(single, 4),
            "difference": difference, "target": "<= 0.002", "meets_target": difference <= 0.002,
            "definition": f"test AUC of the DLRM-style model trained by TorchEstimator (2 "
                          f"workers, batchSize {batch // 2} each, {epochs} epochs, Adam 1e-3) "
                          f"and by a single-process torch loop (global batch {batch}, same "
                          f"epochs, seed and optimizer) on the same rows"}


def digits(spark: Any) -> dict:
    import pandas as pd
    from sklearn.datasets import load_digits

    from sparkdist.models import TorchEstimator
    from sparkdist.torchtrain import nets

    data = load_digits()
    df = spark.createDataFrame(pd.DataFrame({"pixels": list(data.data / 16.0),
                                             "label": data.target})).repartition(2)
    train, test = df.randomSplit([0.8, 0.2], seed=3)
    model = TorchEstimator(model=nets.ImageCNN, modelKwargs={"classes": 10},
                           inputCols={"image": "pixels"}, inputShapes={"image": [1, 8, 8]},
                           loss="cross_entropy", epochs=30, batchSize=32, learningRate=3e-3,
                           numWorkers=2, progress=False, seed=3).fit(train)
    accuracy = model.transform(test).where("prediction = label").count() / test.count()
    return {"accuracy": round(accuracy, 4), "target": ">= 0.98",
            "meets_target": accuracy >= 0.98, "test_rows": test.count(),
            "definition": "test accuracy (20% split) of nets.ImageCNN on scikit-learn's digits as "
                          "[1, 8, 8] images, 30 epochs, batchSize 32, Adam 3e-3, 2 workers"}


def ratings(spark: Any) -> dict:
    from pyspark.sql import functions as F

    from sparkdist.datasets import ratings as make
    from sparkdist.models import ALS, TorchEstimator
    from sparkdist.torchtrain import nets

    df = make(spark, partitions=2, density=0.3, seed=0, string_ids=False).select(
        F.col("user_id").cast("int").alias("user"), F.col("item_id").cast("int").alias("item"),
        F.col("rating").cast("double")).cache()
    counts = df.agg(F.max("user"), F.max("item"), F.avg("rating")).first()
    train, test = df.randomSplit([0.8, 0.2], seed=1)

    def rmse(scored: Any) -> float:
        frame = scored.select("prediction", "rating").toPandas().dropna()
        return float(np.sqrt(((frame.prediction - frame.rating) ** 2).mean()))

    tower = TorchEstimator(model=nets.TwoTower, inputCols={"user": "user", "item": "item"},
                           modelKwargs={"num_users": counts[0] + 1, "num_items": counts[1] + 1,
                                        "dim": 16, "mean": counts[2]},
                           labelCol="rating", loss="mse", epochs=10, batchSize=128,
                           learningRate=0.01, weightDecay=1e-5, numWorkers=2, progress=False,
                           seed=3).fit(train)
    als = ALS(userCol="user", itemCol="item", ratingCol="rating",
              coldStartStrategy="drop", seed=3).fit(train)
    ours, reference = rmse(tower.transform(test)), rmse(als.transform(test))
    return {"two_tower_rmse": round(ours, 4), "als_rmse": round(reference, 4),
            "ratio": round(ours / reference, 3), "target": "-",
            "winner": "two-tower" if ours < reference else "ALS",
            "definition": "test RMSE (20% split of the ratings sample) of nets.TwoTower (dim 16, "
                          "10 epochs) against sparkdist's ALS at its defaults on the same split "
                          "(ALS drops users and items it never saw; the two-tower scores them "
                          "from their untrained embeddings)"}


def sequence_memory(spark: Any, rows: int) -> dict:
    import pandas as pd

    from sparkdist.models import TorchEstimator
    from sparkdist.torchtrain import nets

    def peak(n: int) -> float:
        rng = np.random.default_rng(n)
        lengths = rng.integers(4, 64, n)
        tokens = [rng.integers(1, 1000, k) for k in lengths]
        frame = pd.DataFrame({"words": tokens, "label": (lengths > 32).astype(float)})
        df = spark.createDataFrame(frame).repartition(2).cache()
        df.count()
        model = TorchEstimator(
            model=nets.SequenceClassifier, inputCols={"tokens": "words"}, maxSequenceLength=64,
            modelKwargs={"vocab": 1000, "dim": 16, "heads": 2, "layers": 1, "max_length": 64},
            loss="cross_entropy", epochs=1, batchSize=512, numWorkers=2, progress=False,
            seed=3).fit(df)
        df.unpersist()
        return max(rank["peak_rss_mb"] for rank in model.trainingSummary["ranks"])

    small, large = peak(rows), peak(4 * rows)
    ratio = round(large / small, 3)
    return {"small_rows": rows, "large_rows": 4 * rows, "small_peak_mb": small,
            "large_peak_mb": large, "ratio": ratio, "target": "<= 1.2",
            "meets_target": ratio <= 1.2,
            "definition": "peak RSS of the busiest rank of a 1-epoch token-sequence fit "
                          "(lengths 4-63, maxSequenceLength 64), 4x the rows against 1x"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; nothing saved")
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = 40_000 if args.quick else args.rows
    # the driver receives the click model's 2.6M-row table (42 MB) while it caches the rows:
    # more than the default 1 GiB heap holds
    spark = start_spark("sparkdist-bench-inputs", conf={"spark.driver.memory": "3g"})
    df = click_frame(spark, rows, seed=1)
    figures = {"feed": feed(df, rows, 1 if args.quick else args.repeats),
               "click_auc": click_auc(df), "digits": digits(spark),
               "ratings": ratings(spark),
               "sequence_memory": sequence_memory(spark, 10_000 if args.quick else 50_000),
               "machine": machine(spark)}
    write_result("inputs", figures, save=not args.quick)


if __name__ == "__main__":
    main()
