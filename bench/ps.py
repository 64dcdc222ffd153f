"""Parameter servers (issue 33, "Measure"): ``strategy="ps"`` against the references, each
figure a ratio of two sides measured in the same run, timed as bench/_common.py says (wall
clock on the driver around the whole ``fit``; after one untimed fit on other rows warms the
session, the first fit of each side is reported as "first"; then the median of --repeats,
the sides alternating, as "later").

- click: a DLRM-style ``nets.ClickModel`` (13 dense features, 8 hashed ids per row into one
  table of 2^20 rows x 16: 8 features of 131,072 rows) on 2 workers, ``ps`` (every rank a
  server) against ``ddp``, both with optimizer="adagrad" at one learning rate (the tables'
  sparse Adagrad then takes the steps dense Adagrad takes: the same fit, tests/spark/
  test_strategy_ps.py). Bytes sent per step by the busiest rank (the kernel's TCP counters of
  each worker; target: ddp's >= 10x ps's), samples/s (target >= 2x) and the test AUC of each
  (target: within 0.002).
- async_vs_sync: the same model and rows under ``ps``, synchronous against asynchronous
  (``maxStaleness=4``), rank 1 slowed 2x (it sleeps as long as each step it computes took:
  :mod:`sparkdist.torchtrain.straggle`). Each side fits 1 to 4 epochs (the median of
  --repeats fits' seconds, and of their test AUCs, per epoch count, the sides alternating),
  at the click section's learning rate (0.05: both sides peak after one epoch, and then
  overfit the rare ids) and at 0.01. Time to the same AUC: the median seconds of the fewest
  epochs whose median AUC is within 0.002 (the click section's AUC target) of the best the
  synchronous side reached (None: not within 4 epochs). Target: async's <= sync's.
- sparse_lr: ``nets.HashedLogistic`` on 2^20 hashed features (16 ids per row) under ``ps``
  against MLlib's LogisticRegression (its defaults) on the same rows as 2^20-wide sparse
  vectors: seconds and test log-loss of each.

Prints one JSON line; a full run (no --quick) also saves it as bench/results/ps.json.

    python bench/ps.py [--quick] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import machine, start_spark, write_result

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/models/torch.py", "sparkdist/torchtrain", "sparkdist/launch")
PROTOCOL = ("wall clock on the driver around the whole fit; after an untimed fit on other "
            "rows warms the session, the first fit of each side ('first'), then the median of "
            "{n} per side, the sides alternating ('later')")
FEATURES, TABLE_ROWS, DIM = 8, 2**17, 16  # one table of 2^20 rows x 16
CLICK = {"dense": 13, "tables": [TABLE_ROWS] * FEATURES, "dim": DIM, "hidden": [64, 32]}
CLICK_FIT = {"optimizer": "adagrad", "learningRate": 0.05, "batchSize": 1024, "epochs": 2}
HASHED, IDS_PER_ROW = 2**20, 16
LR_FIT = {"optimizer": "adagrad", "learningRate": 0.1, "batchSize": 1024, "epochs": 3}
STALENESS, SLOWED, EPOCH_COUNTS = 4, {"rank": 1, "factor": 2.0}, (1, 2, 3, 4)
ASYNC_RATES, AUC_TOLERANCE = (0.05, 0.01), 0.002


def hashed_ids(rng: Any, rows: int, columns: int, size: int) -> Any:
    """Zipf-distributed ids (a few hot, a long tail), scattered over ``[0, size)``."""
    ranks = rng.zipf(1.2, (rows, columns)).astype(np.int64) - 1
    return (ranks * 2654435761 + np.arange(columns) * 97) % size


def click_frames(spark: Any, rows: int, seed: int = 4) -> tuple[Any, Any]:
    """Train and test rows: dense features and ids, a click drawn from a logistic function of
    two dense features and two features' per-id effects."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(rows, 13)).astype(np.float32)
    ids = hashed_ids(rng, rows, FEATURES, TABLE_ROWS)
    effects = rng.normal(size=(2, TABLE_ROWS))
    logit = dense[:, 0] - 0.5 * dense[:, 1] + effects[0, ids[:, 0]] + effects[1, ids[:, 1]]
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    frame = pd.DataFrame({"dense": list(dense), "ids": list(ids), "label": label})
    return _split(spark.createDataFrame(frame))


def _split(df: Any) -> tuple[Any, Any]:
    train, test = df.randomSplit([0.8, 0.2], seed=1)
    train, test = train.repartition(2).cache(), test.cache()
    train.count(), test.count()
    return train, test


def click_estimator(strategy: str) -> Any:
    from sparkdist.models import TorchEstimator
    from sparkdist.torchtrain import nets

    return TorchEstimator(model=nets.ClickModel, modelKwargs=CLICK, loss="bce",
                          inputCols={"dense": "dense", "ids": "ids"},
                          inputShapes={"ids": [FEATURES]}, numWorkers=2, progress=False,
                          seed=3, strategy=strategy, **CLICK_FIT)


def auc(model: Any, test: Any) -> float:
    from sklearn.metrics import roc_auc_score

    scored = model.transform(test).select("label", "probability").toPandas()
    return float(roc_auc_score(scored.label, [p[1] for p in scored.probability]))


def sides(fits: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict[str, Any]]:
    """Per side: the first fit's seconds, the later fits' seconds, the last model."""
    runs: dict[str, dict[str, Any]] = {name: {"seconds": []} for name in fits}
    for round_ in range(repeats + 1):
        for name, fit in fits.items():
            started = time.perf_counter()
            model = fit()
            seconds = time.perf_counter() - started
            runs[name].update(model=model, **({"first_s": seconds} if not round_ else {}))
            if round_:
                runs[name]["seconds"].append(seconds)
    return runs


def click(train: Any, test: Any, repeats: int) -> dict[str, Any]:
    click_estimator("ddp").copy({}).setEpochs(1).fit(test)  # warms the session, untimed
    runs = sides({"ps": lambda: click_estimator("ps").fit(train),
                  "ddp": lambda: click_estimator("ddp").fit(train)}, repeats)
    found: dict[str, Any] = {}
    for name, run in runs.items():
        summary = run["model"].trainingSummary
        steps = summary["steps_per_epoch"] * CLICK_FIT["epochs"]
        later = statistics.median(run["seconds"])
        found[name] = {
            "first_s": round(run["first_s"], 2), "later_s": round(later, 2),
            "samples_per_s_later": round(summary["rows"] * CLICK_FIT["epochs"] / later, 1),
            "samples_per_s_first": round(summary["rows"] * CLICK_FIT["epochs"] / run["first_s"],
                                        1),
            "sent_mb_per_step": round(max(r["sent_mb"] for r in summary["ranks"]) / steps, 4),
            "state_mb": max(r["state_mb"] for r in summary["ranks"]),
            "test_auc": round(auc(run["model"], test), 4)}
    ps, ddp = found["ps"], found["ddp"]
    return {"rows": summary["rows"], "test_rows": test.count(), "model": CLICK, "fit": CLICK_FIT,
            **found,
            "bytes_ratio": round(ddp["sent_mb_per_step"] / ps["sent_mb_per_step"], 2),
            "bytes_target": ">= 10",
            "throughput_ratio_later": round(ps["samples_per_s_later"] / ddp["samples_per_s_later"],
                                           3),
            "throughput_ratio_first": round(ps["samples_per_s_first"] / ddp["samples_per_s_first"],
                                           3),
            "throughput_target": ">= 2",
            "auc_difference": round(abs(ps["test_auc"] - ddp["test_auc"]), 4),
            "auc_target": "<= 0.002",
            "definition": "ClickModel " + str(CLICK) + ", " + str(CLICK_FIT) + ", 2 workers; "
            + PROTOCOL.format(n=repeats) + "; bytes: the busiest rank's TCP bytes sent over "
            "the fit's steps"}


def async_vs_sync(train: Any, test: Any, repeats: int, rate: float) -> dict[str, Any]:
    """Synchronous against asynchronous servers with rank 1 slowed 2x: time to the same AUC."""
    from sparkdist.torchtrain import straggle

    def fit(mode: str, epochs: int) -> tuple[float, float, float]:
        estimator = click_estimator("ps").setEpochs(epochs).setLearningRate(rate)
        if mode == "async":
            estimator.setMaxStaleness(STALENESS)
        straggle.arm(estimator, **SLOWED)
        started = time.perf_counter()
        model = estimator.fit(train)
        seconds = time.perf_counter() - started
        skipped = model.trainingSummary["ranks"][SLOWED["rank"]]["skipped_steps"]
        return seconds, auc(model, test), skipped / (model.trainingSummary["steps_per_epoch"]
                                                     * epochs)

    runs: dict[str, dict[int, list[tuple[float, float, float]]]] = {"sync": {}, "async": {}}
    for epochs in EPOCH_COUNTS:
        for _ in range(repeats):
            for mode, per_epochs in runs.items():
                per_epochs.setdefault(epochs, []).append(fit(mode, epochs))
    found = {mode: {str(epochs): {
        "seconds": round(statistics.median(f[0] for f in fits), 2),
        "test_auc": round(statistics.median(f[1] for f in fits), 4),
        "slowed_rank_skipped": round(statistics.median(f[2] for f in fits), 3)}
        for epochs, fits in per_epochs.items()} for mode, per_epochs in runs.items()}
    target = round(max(f["test_auc"] for f in found["sync"].values()) - AUC_TOLERANCE, 4)
    reached = {mode: next(((int(e), f["seconds"]) for e, f in per.items()
                           if f["test_auc"] >= target), (None, None))
               for mode, per in found.items()}
    sync_s, async_s = reached["sync"][1], reached["async"][1]
    return {"learning_rate": rate, "staleness": STALENESS, "slowed": SLOWED, "per_epochs": found,
            "target_auc": target, "sync_epochs": reached["sync"][0],
            "async_epochs": reached["async"][0], "sync_s": sync_s, "async_s": async_s,
            "time_ratio": round(async_s / sync_s, 3) if async_s and sync_s else None,
            "target": "<= 1",
            "definition": "ClickModel " + str(CLICK) + ", " + str(CLICK_FIT) + " but 1-4 "
            f"epochs at learningRate {rate}, strategy='ps' on 2 workers, rank 1 slowed 2x, "
            "synchronous vs "
            f"maxStaleness={STALENESS}; seconds: wall clock on the driver around the whole fit, "
            f"median of {repeats} per epoch count (test AUC: their median), the sides "
            "alternating; time to the same AUC: the seconds of the fewest epochs whose AUC is "
            f"within {AUC_TOLERANCE} of the synchronous side's best"}


def hashed_frames(spark: Any, rows: int, seed: int = 6) -> tuple[Any, Any]:
    """Rows of 16 hashed feature ids (an array column for sparkdist, a 2^20-wide sparse vector
    of the same ids for MLlib) and a label from a logistic function of true weights."""
    import pandas as pd
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F

    rng = np.random.default_rng(seed)
    ids = np.sort(hashed_ids(rng, rows, IDS_PER_ROW, HASHED), axis=1)
    truth = rng.normal(size=HASHED) * 0.5
    logit = truth[ids].sum(1) * 0.5
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    df = spark.createDataFrame(pd.DataFrame({"ids": list(ids), "label": label}))
    return _split(df.withColumn("features", F.udf(_sparse_vector, VectorUDT())("ids")))


def _sparse_vector(ids: list[int]) -> Any:
    """The ids as a 2^20-wide sparse vector (a repeated id counted)."""
    from pyspark.ml.linalg import SparseVector

    unique, counts = np.unique(np.asarray(ids), return_counts=True)
    return SparseVector(HASHED, unique.tolist(), counts.astype(float).tolist())


def sparse_lr(spark: Any, rows: int, repeats: int) -> dict[str, Any]:
    from pyspark.ml.classification import LogisticRegression

    from sparkdist.models import TorchEstimator
    from sparkdist.torchtrain import nets

    train, test = hashed_frames(spark, rows)
    LogisticRegression(maxIter=2).fit(test)  # warms the session, untimed
    ours = TorchEstimator(model=nets.HashedLogistic, modelKwargs={"features": HASHED},
                          inputCols={"ids": "ids"}, inputShapes={"ids": [IDS_PER_ROW]},
                          loss="bce", strategy="ps", numWorkers=2, progress=False, seed=3,
                          **LR_FIT)
    runs = sides({"sparkdist": lambda: ours.fit(train),
                  "mllib": lambda: LogisticRegression().fit(train)}, repeats)
    found = {name: {"first_s": round(run["first_s"], 2),
                    "later_s": round(statistics.median(run["seconds"]), 2),
                    "test_log_loss": round(log_loss(run["model"], test), 4)}
             for name, run in runs.items()}
    return {"rows": train.count(), "test_rows": test.count(), "features": HASHED,
            "ids_per_row": IDS_PER_ROW, "fit": LR_FIT, **found,
            "time_ratio_later": round(found["sparkdist"]["later_s"] / found["mllib"]["later_s"], 3),
            "time_ratio_first": round(found["sparkdist"]["first_s"] / found["mllib"]["first_s"], 3),
            "log_loss_difference": round(found["sparkdist"]["test_log_loss"]
                                         - found["mllib"]["test_log_loss"], 4),
            "definition": "nets.HashedLogistic under strategy='ps' (2 workers, " + str(LR_FIT)
            + ") vs pyspark.ml LogisticRegression() (defaults: maxIter 100, regParam 0) on the "
            "same rows as 2^20-wide sparse vectors; " + PROTOCOL.format(n=repeats)}


def log_loss(model: Any, test: Any) -> float:
    from sklearn.metrics import log_loss as loss

    scored = model.transform(test).select("label", "probability").toPandas()
    return float(loss(scored.label, [float(p[1]) for p in scored.probability], labels=[0, 1]))


def clicks(spark: Any, rows: int, repeats: int) -> dict[str, Any]:
    train, test = click_frames(spark, rows)
    return {"click": click(train, test, repeats),
            "async_vs_sync": [async_vs_sync(train, test, repeats, rate) for rate in ASYNC_RATES]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rows, 1 repeat")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    repeats = 1 if options.quick else options.repeats
    spark = start_spark("sparkdist-bench-ps", conf={"spark.driver.memory": "4g"})
    result = {"machine": machine(spark), "repeats": repeats,
              **clicks(spark, 10_000 if options.quick else 100_000, repeats),
              "sparse_lr": sparse_lr(spark, 10_000 if options.quick else 120_000, repeats)}
    write_result("ps", result, save=not options.quick)


if __name__ == "__main__":
    main()
