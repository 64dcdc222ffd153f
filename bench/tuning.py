"""sparkdist's Tuner against pyspark's TrainValidationSplit over the same 24 configurations,
distributed trials queueing on the task slots, and how soon a pruned fit stops (issue 31,
"Measure"), every figure from one run on local[2], timed as bench/_common.py says (wall clock
on the driver around the whole fit call; each side's first call is its cold figure, the median
of the ``--repeats`` rounds after it, the sides alternating, the warm one).

- search: scikit-learn's digits (64 pixels scaled to [0, 1], assembled into a ``features``
  vector, 10 classes), 20 % held out as test rows, the rest searched. The estimator: a
  TorchEstimator MLP (hidden [64], loss cross_entropy, 8 epochs, 1 worker). The 24
  configurations: learningRate {3e-4, 1e-3, 3e-3, 1e-2} x batchSize {16, 64, 256} x
  weightDecay {0, 1e-4}. Reference: ``TrainValidationSplit(estimatorParamMaps=<the 24
  maps>, evaluator=MulticlassClassificationEvaluator(metricName="accuracy"),
  trainRatio=0.8, parallelism=2)``, every configuration fitted, the best refitted on all
  searched rows. Ours: ``Tuner`` over the same 24 values as CategoricalDistributions, the
  settings a user picks to search faster: 12 trials, sampler "tpe", pruner "asha",
  parallelism 2, evaluator "accuracy", refit (the default); its validation rows are exactly
  the reference's (``validationCol`` set by the same ``rand(seed) >= 0.8`` that
  TrainValidationSplit draws), and the Tuner gives them to each trial's fit, whose per-epoch
  validation accuracy the pruner judges while it runs. Both sides' estimator is the same (no
  validation rows of its own). Figures per kind (cold, warm): each side's seconds around
  ``fit``, the ratio ours / reference (target <= 0.5); each side's best
  validation accuracy and the points ours is below the reference's (target <= 0.5); each
  best model's accuracy on the test rows. Before the first round one untimed 1-epoch fit
  starts the session's Python workers and first barrier stage, so that neither side's cold
  figure carries the session's start.
- queueing: ``--studies`` (20) Tuner studies one after another, each 3 trials of a
  TorchEstimator with numWorkers=2 (1 epoch, 300 digits rows) at parallelism=3 on local[2]
  (2 task slots: the trials must queue); each study's fit runs in a thread waited on for
  ``--study-timeout`` seconds (120) and counts as hung past it (its jobs are cancelled and the
  bench goes on; after 2 hung studies the rest are not run). Figures: studies finished of N
  (target: all), the trials' states summed, seconds per study.
- pruning: one study of TorchEstimators long enough to prune during their fit (hidden [1024,
  1024], batchSize 16, 24 epochs, 1 worker; about 1 s an epoch on this machine), learningRate
  log-uniform in [1e-5, 1e-1], 8 trials, pruner "asha", parallelism 2, refit off, on the
  searched digits rows (the Tuner's default validationFraction 0.2). Figures, from
  ``TunerModel.trials``: the pruned trials' ``pruneSeconds`` (seconds from the pruning
  decision to the pruned fit's Spark tasks having ended): count, median and max (target:
  median <= 5 s), and the epochs each pruned trial reported (``epochs``) against its budget.

Prints one JSON line; with --save also writes bench/results/tuning.json (bench/report.py
writes it from the line it reads).

    python bench/tuning.py [--quick] [--repeats 2] [--studies 20] [--save]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/tuning", "sparkdist/launch", "sparkdist/models/torch.py",
            "sparkdist/torchtrain")
SPARK_CONF = {"spark.sql.shuffle.partitions": "2"}
SECONDS_TARGET = 0.5
ACCURACY_TARGET_POINTS = 0.5
PRUNE_TARGET_S = 5.0
SEED = 7
#: The search's 24 configurations (4 x 3 x 2). The hidden sizes are not among them: they are
#: a key of the dict Param modelKwargs, and Optuna's CategoricalDistribution takes only
#: None, bool, int, float and str values.
SPACE: dict[str, list[Any]] = {"learningRate": [3e-4, 1e-3, 3e-3, 1e-2],
                               "batchSize": [16, 64, 256], "weightDecay": [0.0, 1e-4]}
QUICK_SPACE: dict[str, list[Any]] = {"learningRate": [1e-3, 1e-2], "batchSize": [64, 256],
                                     "weightDecay": [0.0]}
TRAIN_RATIO = 0.8  # TrainValidationSplit's; the Tuner's validation rows are the other 20 %
VALIDATION_COL = "is_validation"
MAX_HUNG = 2  # hung studies after which the queueing part stops (the slots may stay taken)
PROTOCOL = ("wall clock on the driver around the whole fit call; cold: each side's first call "
            "in the session (after one untimed 1-epoch fit that starts the session's Python "
            "workers and first barrier stage), warm: the median of the {n} calls after it, "
            "the sides alternating, the reference first")


@dataclass
class Sizes:
    space: dict[str, list[Any]]
    epochs: int
    hidden: list[int]
    trials: int
    repeats: int
    studies: int
    study_trials: int
    queue_rows: int
    study_timeout_s: float
    prune_hidden: list[int]
    prune_batch: int
    prune_epochs: int
    prune_trials: int
    prune_timeout_s: float
    quick: bool


def arguments(argv: list[str] | None = None) -> tuple[argparse.Namespace, Sizes]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes: checks that every part runs (pruneSeconds may be "
                             "missing); nothing to publish")
    parser.add_argument("--repeats", type=int, default=2, help="warm rounds of the search")
    parser.add_argument("--trials", type=int, default=12, help="the Tuner's numTrials")
    parser.add_argument("--studies", type=int, default=20, help="queueing studies")
    parser.add_argument("--study-timeout", type=float, default=120.0,
                        help="seconds after which a queueing study counts as hung")
    parser.add_argument("--save", action="store_true",
                        help="also write bench/results/tuning.json")
    args = parser.parse_args(argv)
    if args.quick:
        return args, Sizes(QUICK_SPACE, 1, [16], 2, 1, 2, 3, 300, args.study_timeout,
                           [64], 64, 4, 5, 300.0, True)
    return args, Sizes(SPACE, 8, [64], args.trials, args.repeats, args.studies, 3, 300,
                       args.study_timeout, [1024, 1024], 16, 24, 8, 600.0, False)


# ------------------------------------------------------------------------------- the figures
def grid_points(space: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Every configuration of ``space`` (its values' product), in a fixed order."""
    names = list(space)
    return [dict(zip(names, values, strict=True))
            for values in itertools.product(*(space[n] for n in names))]


def search_kind(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One kind's figures from its runs (one run cold, the warm rounds' runs warm): the median
    of each side's seconds and accuracies; ratio ours / reference seconds, and the points
    ours' best validation accuracy is below the reference's, against their targets."""
    def median(side: str, key: str) -> float:
        return statistics.median(run[side][key] for run in runs)

    seconds = {side: median(side, "seconds") for side in ("reference", "sparkdist")}
    validation = {side: median(side, "validation") for side in seconds}
    test = {side: median(side, "test") for side in seconds}
    ratio = seconds["sparkdist"] / seconds["reference"]
    gap = 100 * (validation["reference"] - validation["sparkdist"])
    return {**{f"{side}_s": round(s, 3) for side, s in seconds.items()},
            "ratio": round(ratio, 3), "meets_target": ratio <= SECONDS_TARGET,
            **{f"{side}_best_validation_accuracy": round(v, 4) for side, v in validation.items()},
            "accuracy_gap_points": round(gap, 2),
            "meets_accuracy_target": gap <= ACCURACY_TARGET_POINTS,
            **{f"{side}_test_accuracy": round(v, 4) for side, v in test.items()},
            "test_gap_points": round(100 * (test["reference"] - test["sparkdist"]), 2),
            "runs": len(runs)}


def search_figures(runs: list[dict[str, Any]], sizes: Sizes, rows: dict[str, int]
                   ) -> dict[str, Any]:
    """The search's figures: cold from the first round, warm from the rounds after it (None
    without any), every run's own figures beside them."""
    points = len(grid_points(sizes.space))
    return {"configurations": points, "trials": sizes.trials, "space": sizes.space,
            "rows": rows, "target": f"<= {SECONDS_TARGET}",
            "accuracy_target": f"<= {ACCURACY_TARGET_POINTS}",
            "cold": search_kind(runs[:1]),
            "warm": search_kind(runs[1:]) if len(runs) > 1 else None,
            "runs": runs,
            "definition": f"seconds of Tuner.fit (numTrials {sizes.trials} of the {points} "
                          "configurations as CategoricalDistributions, sampler tpe, pruner "
                          "asha, parallelism 2, evaluator accuracy, refit; the Tuner's "
                          "validation rows give each trial's per-epoch values to the pruner) "
                          "over seconds of TrainValidationSplit.fit (the same "
                          f"{points} maps, MulticlassClassificationEvaluator accuracy, "
                          f"trainRatio {TRAIN_RATIO}, parallelism 2, the best refitted), the "
                          "same TorchEstimator MLP (hidden "
                          f"{sizes.hidden}, {sizes.epochs} epochs, 1 worker) on the same rows and "
                          "the same validation rows; accuracy gap: 100 x (the reference's best "
                          "validation accuracy - ours); test accuracy: each refitted best "
                          "model's on the held-out test rows; " + PROTOCOL.format(
                              n=sizes.repeats)}


def queueing_figures(outcomes: list[dict[str, Any]], studies: int, sizes: Sizes
                     ) -> dict[str, Any]:
    """Studies finished of ``studies`` (hung, failed, not run), the trials' states summed
    and the finished studies' seconds."""
    states: Counter[str] = Counter()
    for outcome in outcomes:
        states.update(outcome.get("trials") or {})
    finished = [o for o in outcomes if o["state"] == "finished"]
    seconds = [o["seconds"] for o in finished]
    return {"studies": studies, "finished": len(finished),
            "hung": sum(o["state"] == "hung" for o in outcomes),
            "failed": sum(o["state"] == "failed" for o in outcomes),
            "not_run": studies - len(outcomes),
            "finished_share": round(len(finished) / studies, 3) if studies else None,
            "target": ">= 1.0", "meets_target": bool(studies) and len(finished) == studies,
            "trials": dict(sorted(states.items())),
            "median_study_s": round(statistics.median(seconds), 3) if seconds else None,
            "max_study_s": round(max(seconds), 3) if seconds else None,
            "study_s": [round(o["seconds"], 3) for o in outcomes],
            "errors": [o["error"] for o in outcomes if o.get("error")][:3],
            "definition": f"{studies} Tuner studies run one after another, each numTrials "
                          f"{sizes.study_trials} of a TorchEstimator with numWorkers=2 (1 "
                          f"epoch, {sizes.queue_rows} rows) at parallelism 3 on local[2] (2 "
                          "task slots), the rest at the defaults (sampler tpe, no pruner, "
                          "refit); a study whose fit had not returned after "
                          f"{sizes.study_timeout_s:g} s is hung (its jobs cancelled; after "
                          f"{MAX_HUNG} hung studies the rest are not run); seconds: wall "
                          "clock around each finished study's fit"}


def prune_column(columns: list[str], quick: bool) -> bool:
    """Whether the trials DataFrame has ``pruneSeconds``: a full run without it is an error
    (its figure would be silently missing); a --quick smoke run reports null."""
    if "pruneSeconds" in columns:
        return True
    if quick:
        return False
    raise RuntimeError(f"TunerModel.trials has no pruneSeconds column (columns: {columns}): "
                       "the pruning figure needs the Tuner that prunes during a fit")


def pruning_figures(rows: list[dict[str, Any]], budget: int, has_column: bool,
                    study_s: float, sizes: Sizes) -> dict[str, Any]:
    """The pruned trials' pruneSeconds (count, median, max, against the target) and the
    epochs each pruned trial reported to the pruner against its budget."""
    pruned = [r for r in rows if r["state"] == "PRUNED"]
    waits = sorted(float(r["pruneSeconds"]) for r in pruned
                   if has_column and r.get("pruneSeconds") is not None)
    median = statistics.median(waits) if waits else None
    epochs = [int(r["epochs"]) for r in pruned if r.get("epochs") is not None]
    return {"trials": len(rows), "pruned": len(pruned),
            "states": dict(sorted(Counter(r["state"] for r in rows).items())),
            "pruned_during_fit": len(waits) if has_column else None,
            "prune_s": [round(w, 3) for w in waits] if has_column else None,
            "median_prune_s": None if median is None else round(median, 3),
            "max_prune_s": round(waits[-1], 3) if waits else None,
            "target_s": PRUNE_TARGET_S, "target": f"<= {PRUNE_TARGET_S}",
            "meets_target": None if median is None else median <= PRUNE_TARGET_S,
            "ratio_to_target": None if median is None else round(median / PRUNE_TARGET_S, 3),
            "epochs_budget": budget, "pruned_epochs_reported": epochs,
            "median_pruned_epochs": statistics.median(epochs) if epochs else None,
            "median_trial_s": median_seconds(rows),
            "study_s": round(study_s, 3),
            "note": None if has_column else "TunerModel.trials has no pruneSeconds column "
                                            "(quick run)",
            "definition": f"one Tuner study, numTrials {sizes.prune_trials}, pruner asha, "
                          "parallelism 2, refit off, learningRate log-uniform in [1e-5, 1e-1], "
                          f"of a TorchEstimator MLP (hidden {sizes.prune_hidden}, batchSize "
                          f"{sizes.prune_batch}, {budget} epochs, 1 worker, validated per epoch "
                          "on the Tuner's validation rows); prune_s: each trial's pruneSeconds "
                          "(seconds "
                          "from the pruning decision to the pruned fit's Spark tasks having "
                          "ended; null for trials not pruned during their fit), median over "
                          "the trials pruned during their fit; epochs reported: each pruned "
                          "trial's epochs column (the per-epoch reports its fit sent before "
                          "it stopped)"}


def median_seconds(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The median seconds of the trials in each state that has any timed."""
    found: dict[str, list[float]] = {}
    for r in rows:
        if r["seconds"] is not None:
            found.setdefault(r["state"], []).append(float(r["seconds"]))
    return {state: round(statistics.median(s), 3) for state, s in sorted(found.items())}


# ------------------------------------------------------------------------------- measuring
def session() -> Any:
    from _common import start_spark  # bench/ is on sys.path: run as python bench/<name>.py

    return start_spark("sparkdist-bench-tuning", SPARK_CONF)


def digits_frames(spark: Any) -> tuple[Any, Any]:
    """Cached (searched rows, test rows) of scikit-learn's digits: ``features`` (the 64
    pixels / 16, assembled by VectorAssembler) and ``label`` (a double, 0-9)."""
    import pandas as pd
    from pyspark.ml.feature import VectorAssembler
    from sklearn.datasets import load_digits

    data = load_digits()
    pixels = [f"p{i}" for i in range(data.data.shape[1])]
    frame = pd.DataFrame(data.data / 16.0, columns=pixels).assign(label=data.target * 1.0)
    df = VectorAssembler(inputCols=pixels, outputCol="features").transform(
        spark.createDataFrame(frame)).select("features", "label").repartition(2)
    searched, test = (part.cache() for part in df.randomSplit([0.8, 0.2], seed=SEED))
    searched.count(), test.count()  # cached now: rand(seed) sees fixed partitions
    return searched, test


def estimator(hidden: list[int], epochs: int, **params: Any) -> Any:
    from sparkdist.models import TorchEstimator

    return TorchEstimator(modelKwargs={"hidden": hidden}, loss="cross_entropy", numClasses=10,
                          epochs=epochs, numWorkers=1, progress=False, seed=SEED, **params)


def accuracy(model: Any, df: Any) -> float:
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    return float(evaluator.evaluate(model.transform(df)))


def timed_fit(fit: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    model = fit()
    return model, time.perf_counter() - started


def reference_run(searched: Any, test: Any, sizes: Sizes) -> dict[str, Any]:
    """TrainValidationSplit over every configuration: seconds, best validation and test
    accuracy."""
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import TrainValidationSplit

    net = estimator(sizes.hidden, sizes.epochs)
    maps = [{net.getParam(name): value for name, value in point.items()}
            for point in grid_points(sizes.space)]
    split = TrainValidationSplit(
        estimator=net, estimatorParamMaps=maps, trainRatio=TRAIN_RATIO, parallelism=2,
        evaluator=MulticlassClassificationEvaluator(metricName="accuracy"), seed=SEED)
    model, seconds = timed_fit(lambda: split.fit(searched))
    metrics = list(model.validationMetrics)
    best = max(range(len(metrics)), key=metrics.__getitem__)
    return {"seconds": seconds, "validation": metrics[best], "test": accuracy(model, test),
            "best": grid_points(sizes.space)[best],
            "metrics": [round(m, 4) for m in metrics]}  # per configuration, grid order


def sparkdist_run(flagged: Any, test: Any, sizes: Sizes) -> dict[str, Any]:
    """Tuner over the same values, on the reference's validation rows: seconds, best
    validation and test accuracy, its trials' states."""
    from optuna.distributions import CategoricalDistribution

    from sparkdist.tuning import Tuner

    tuner = Tuner(estimator=estimator(sizes.hidden, sizes.epochs),
                  space={name: CategoricalDistribution(values)
                         for name, values in sizes.space.items()},
                  evaluator="accuracy", numTrials=sizes.trials, parallelism=2, sampler="tpe",
                  pruner="asha", validationCol=VALIDATION_COL, seed=SEED)
    model, seconds = timed_fit(lambda: tuner.fit(flagged))
    states = Counter(row.state for row in model.trials.select("state").collect())
    return {"seconds": seconds, "validation": float(model.bestValue),
            "test": accuracy(model, test), "states": dict(sorted(states.items())),
            "best": model.bestParams}


def search(searched: Any, test: Any, sizes: Sizes, log: Callable[[str], None]
           ) -> dict[str, Any]:
    """The reference and ours in turn, a cold round then ``repeats`` warm ones, the side that
    goes first alternating between rounds."""
    from pyspark.sql import functions as F

    # TrainValidationSplit's own draw: rand(seed) >= trainRatio marks its validation rows
    flagged = searched.withColumn(VALIDATION_COL, F.rand(SEED) >= TRAIN_RATIO)
    rows = {"searched": searched.count(), "test": test.count(),
            "validation": flagged.where(F.col(VALIDATION_COL)).count()}
    estimator(sizes.hidden, 1).fit(searched)  # the session's first barrier stage, untimed
    runs = []
    sides = {"reference": lambda: reference_run(searched, test, sizes),
             "sparkdist": lambda: sparkdist_run(flagged, test, sizes)}
    for round_ in range(sizes.repeats + 1):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))  # alternate
        run = {side: sides[side]() for side in order}
        log(f"search round {round_}: {run}")
        runs.append(run)
    return search_figures(runs, sizes, rows)


def within(call: Callable[[], Any], timeout_s: float) -> tuple[str, Any, float]:
    """(state, result or error, seconds) of ``call`` run in a daemon thread and waited on
    for ``timeout_s``: "finished", "failed" or "hung" (the thread is left behind)."""
    done: dict[str, Any] = {}

    def target() -> None:
        try:
            done["result"] = call()
        except Exception as err:  # a failed study is a figure, not the bench's end
            done["error"] = f"{type(err).__name__}: {err}"[:500]

    started = time.perf_counter()
    thread = threading.Thread(target=target, daemon=True, name="bench-study")
    thread.start()
    thread.join(timeout_s)
    seconds = time.perf_counter() - started
    if thread.is_alive():
        return "hung", None, seconds
    if "error" in done:
        return "failed", done["error"], seconds
    return "finished", done["result"], seconds


def queueing(spark: Any, searched: Any, sizes: Sizes, log: Callable[[str], None]
             ) -> dict[str, Any]:
    """``studies`` studies of 2-worker trials at parallelism 3, each within its timeout."""
    from optuna.distributions import FloatDistribution

    from sparkdist.models import TorchEstimator
    from sparkdist.tuning import Tuner

    rows = searched.limit(sizes.queue_rows).repartition(2).cache()
    rows.count()
    net = TorchEstimator(loss="cross_entropy", numClasses=10, epochs=1, numWorkers=2,
                         progress=False, seed=SEED)
    outcomes: list[dict[str, Any]] = []
    for number in range(sizes.studies):
        tuner = Tuner(estimator=net, space={"learningRate": FloatDistribution(1e-3, 1e-1,
                                                                              log=True)},
                      evaluator="accuracy", numTrials=sizes.study_trials, parallelism=3,
                      seed=number)
        state, result, seconds = within(partial(tuner.fit, rows), sizes.study_timeout_s)
        outcomes.append(study_outcome(state, result, seconds))
        log(f"queueing study {number}: {outcomes[-1]}")
        if state == "hung":
            spark.sparkContext.cancelAllJobs()  # free the slots its barrier tasks hold
            if sum(o["state"] == "hung" for o in outcomes) >= MAX_HUNG:
                break
    rows.unpersist()
    return queueing_figures(outcomes, sizes.studies, sizes)


def study_outcome(state: str, result: Any, seconds: float) -> dict[str, Any]:
    if state != "finished":
        return {"state": state, "seconds": seconds, "trials": None,
                "error": result if state == "failed" else None}
    states = Counter(row.state for row in result.trials.select("state").collect())
    return {"state": state, "seconds": seconds, "trials": dict(states), "error": None}


def pruning(searched: Any, sizes: Sizes, log: Callable[[str], None]) -> dict[str, Any]:
    """One study of long fits, pruned by asha: its trials' pruneSeconds and epochs."""
    from optuna.distributions import FloatDistribution

    from sparkdist.tuning import Tuner

    tuner = Tuner(estimator=estimator(sizes.prune_hidden, sizes.prune_epochs,
                                      batchSize=sizes.prune_batch),
                  space={"learningRate": FloatDistribution(1e-5, 1e-1, log=True)},
                  evaluator="accuracy", numTrials=sizes.prune_trials, parallelism=2,
                  pruner="asha", refit=False, seed=SEED)
    state, result, seconds = within(lambda: tuner.fit(searched), sizes.prune_timeout_s)
    if state != "finished":
        raise RuntimeError(f"the pruning study {state} after {seconds:.0f} s: {result}")
    has_column = prune_column(result.trials.columns, sizes.quick)
    rows = [row.asDict() for row in result.trials.collect()]
    log(f"pruning: {rows}")
    return pruning_figures(rows, sizes.prune_epochs, has_column, seconds, sizes)


def run(sizes: Sizes, log: Callable[[str], None]) -> dict[str, Any]:
    points = len(grid_points(sizes.space))
    if not sizes.quick and (points != 24 or sizes.trials >= points):
        raise SystemExit(f"the search is over 24 configurations with fewer trials; got "
                         f"{points} and {sizes.trials}")
    spark = session()
    searched, test = digits_frames(spark)
    figures: dict[str, Any] = {"sizes": asdict(sizes)}
    figures["search"] = search(searched, test, sizes, log)
    figures["queueing"] = queueing(spark, searched, sizes, log)
    figures["pruning"] = pruning(searched, sizes, log)
    figures["machine"] = machine(spark)
    return figures


def machine(spark: Any) -> str:
    import optuna
    import torch
    from _common import machine as where

    return f"{where(spark)}, torch {torch.__version__}, optuna {optuna.__version__}"


def log_line(message: str) -> None:
    print(f"[bench/tuning {time.strftime('%X')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    args, sizes = arguments(argv)
    from _common import write_result

    started = time.perf_counter()
    figures = {"quick": args.quick, **run(sizes, log_line),
               "seconds": round(time.perf_counter() - started, 1)}
    write_result("tuning", figures, save=args.save)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
