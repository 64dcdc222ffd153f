"""Training that does not wait (issue 17): gradient compression, local SGD and bounded
staleness against plain DDP (float32), each figure a ratio of two things measured in the same
run (docs: ../shared/design.md section 5).

Every side is a TorchEstimator fit on 2 workers of ``datasets.make_nonlinear`` at the defaults
users get (MLP, batchSize, Adam, learningRate), 10% held out by validationFraction, changed
only by the side's own Params (``MODES``). Each side is timed the same way: wall clock on the
driver around the whole ``fit``, median of ``--repeats`` (3) timed fits after one untimed
warm-up fit of each side, the sides alternating (A B C ... A B C ...). The warm-up fit's time
is reported as ``first_fit_s`` (the first fit of that side in this session; truly cold, with
fresh Python workers, only for the first side, fp32).

--quick: small data, 1 epoch, one fit per side (no warm-up). --only plain|straggler|wide:
one section (printed, not saved).

- per mode: allreduce bytes per step per rank (what the gradient hook or model average
  handed to ``all_reduce``, from ``trainingSummary["ranks"]``), samples/s (training rows x
  epochs / fit wall time), and time to a validation accuracy (``--accuracy``, 0.95): the
  fit's fixed costs (wall time - the epochs' seconds) plus the seconds of the epochs up to
  the first that reached it (as bench/deep.py), each against fp32; beside it the epoch each
  timed fit reached the threshold and the median final validation accuracy.
- straggler: the same, with rank 1 slowed 2x (it sleeps as long as each step it computes
  took: :mod:`sparkdist.torchtrain.straggle`), each mode's time to accuracy against fp32's
  with the same straggler; target: the best mode <= 0.7. Its threshold is chosen from this
  run's own data: the lowest validation accuracy fp32 had after its third epoch among its
  timed fits, so every fp32 fit reaches it by its third epoch (the figure measures
  convergence, not the first epoch's speed).
- In every section, if an fp32 fit reaches the threshold before its third epoch (always so
  with --quick's 1 epoch) or never, ``best`` says so (``threshold_reached_by_fp32_at_epoch``,
  ``reason``) and gives no verdict (``meets_target`` None).
- straggler_wide_model: the straggler section again with ``modelKwargs={"hidden": [256,
  256]}`` for every side. The default MLP's step is mostly fixed per-step costs (the feed,
  Python, the collectives' latency) that the straggler's sleep does not double, so there a
  slowed rank costs DDP little and no mode can win much back; a wider model's step is mostly
  computation, as in the jobs this mode is for.

Prints one JSON line; a full run (no --quick) also saves bench/results/communication.json.

    python bench/communication.py [--quick] [--repeats 3] [--rows 200000] [--epochs 6]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from _common import machine, start_spark, write_result

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/models/torch.py", "sparkdist/torchtrain", "sparkdist/launch")
MODES: dict[str, dict[str, Any]] = {
    "fp32": {},
    "fp16": {"gradientCompression": "fp16"},
    "bf16": {"gradientCompression": "bf16"},
    "powersgd": {"gradientCompression": "powersgd"},
    "sync4": {"syncEvery": 4},
    "sync16": {"syncEvery": 16},
    "stale": {"maxStaleness": 4, "syncEvery": 2},
}
TARGET = "<= 0.7"
#: A time-to-accuracy threshold must be one fp32 DDP reaches no earlier than this epoch.
THRESHOLD_EPOCH = 3
SLOWED: dict[str, Any] = {"rank": 1, "factor": 2.0}
#: The straggler section again with a wider MLP, whose steps are mostly computation: with the
#: default MLP a step is mostly fixed per-step costs, which the straggler does not double.
WIDE: dict[str, Any] = {"hidden": [256, 256]}


def fit(data: Any, mode: str, epochs: int, straggler: bool,
        model_kwargs: dict[str, Any] | None = None) -> tuple[Any, float]:
    from sparkdist.models import TorchEstimator
    from sparkdist.torchtrain import straggle

    shape = {"modelKwargs": model_kwargs} if model_kwargs else {}
    estimator = TorchEstimator(numWorkers=2, epochs=epochs, validationFraction=0.1, seed=7,
                               progress=False, **shape, **MODES[mode])
    if straggler:
        straggle.arm(estimator, **SLOWED)
    started = time.perf_counter()
    model = estimator.fit(data)
    return model, time.perf_counter() - started


def measure(data: Any, modes: list[str], epochs: int, repeats: int, straggler: bool,
            warm_up: bool = True, model_kwargs: dict[str, Any] | None = None,
            ) -> dict[str, dict[str, Any]]:
    """Per mode: the first fit's seconds, the timed fits' seconds, their histories and the
    last fit's per-rank summary (the modes alternating). With ``warm_up`` (not --quick) the
    first fit is untimed."""
    runs: dict[str, dict[str, Any]] = {m: {"seconds": [], "histories": []} for m in modes}
    for round_ in range(repeats + warm_up):
        for mode in modes:
            model, seconds = fit(data, mode, epochs, straggler, model_kwargs)
            run = runs[mode]
            run.setdefault("first_fit_s", seconds)
            if warm_up and round_ == 0:
                continue
            run["seconds"].append(seconds)
            run["histories"].append(model.history)
            run["summary"] = {key: model.trainingSummary[key]
                              for key in ("ranks", "steps_per_epoch", "rows")}
    return runs


def time_to(history: list[dict], wall_s: float, threshold: float) -> float | None:
    """Seconds a fit took to reach ``threshold`` validation accuracy: its fixed costs (wall
    time minus the epochs' seconds) plus the epochs up to the first that reached it."""
    spent = wall_s - sum(record["seconds"] for record in history)
    for record in history:
        spent += record["seconds"]
        if record.get("val_accuracy", 0.0) >= threshold:
            return spent
    return None


def epoch_reached(history: list[dict], threshold: float) -> int | None:
    """The first epoch (from 1) whose validation accuracy reached ``threshold``."""
    return next((epoch for epoch, record in enumerate(history, 1)
                 if record.get("val_accuracy", 0.0) >= threshold), None)


def fp32_threshold(runs: dict[str, dict[str, Any]]) -> float:
    """The lowest validation accuracy fp32 had after its third epoch (its last, in shorter
    fits) among its timed fits: every fp32 fit reaches it by that epoch."""
    return min(h[min(THRESHOLD_EPOCH, len(h)) - 1].get("val_accuracy", 0.0)
               for h in runs["fp32"]["histories"])


def side(run: dict[str, Any], epochs: int, threshold: float) -> dict[str, Any]:
    """One mode's figures from its runs."""
    summary, wall = run["summary"], statistics.median(run["seconds"])
    steps = summary["steps_per_epoch"] * epochs
    reached = [time_to(h, s, threshold) for h, s in zip(run["histories"], run["seconds"])]
    final = [h[-1].get("val_accuracy", 0.0) for h in run["histories"]]
    ranks = summary["ranks"]
    return {"allreduce_bytes_per_step": max(r["allreduce_bytes"] for r in ranks) / steps,
            "samples_per_s": summary["rows"] * epochs / wall,
            "time_to_accuracy_s": (None if None in reached else
                                   statistics.median([t for t in reached if t is not None])),
            "fit_s": wall, "first_fit_s": run["first_fit_s"], "runs_s": run["seconds"],
            "time_to_accuracy_runs_s": reached,
            "reached_at_epoch_runs": [epoch_reached(h, threshold) for h in run["histories"]],
            "final_val_accuracy": round(statistics.median(final), 4),
            "skipped_steps": [r.get("skipped_steps", 0) for r in ranks],
            "val_accuracy": [round(e.get("val_accuracy", 0.0), 4) for e in run["histories"][-1]]}


def ratio(value: float | None, reference: float | None) -> float | None:
    return round(value / reference, 3) if value is not None and reference else None


def figures(runs: dict[str, dict[str, Any]], epochs: int, threshold: float) -> dict[str, Any]:
    """Every mode's figures and its ratios against fp32."""
    sides = {mode: side(run, epochs, threshold) for mode, run in runs.items()}
    base = sides["fp32"]
    for figures_ in sides.values():
        figures_["ratios"] = {
            name: ratio(figures_[name], base[name])
            for name in ("allreduce_bytes_per_step", "samples_per_s", "time_to_accuracy_s")}
    return {mode: {"threshold": threshold, **f} for mode, f in _rounded(sides).items()}


def best(sides: dict[str, Any]) -> dict[str, Any]:
    """The mode with the lowest time to accuracy against fp32, and the target's verdict: none
    when an fp32 fit reaches the threshold before its third epoch, or never."""
    fp32 = sides["fp32"]["reached_at_epoch_runs"]
    earliest = None if None in fp32 else min(fp32)
    verdict = {"mode": None, "ratio": None, "target": TARGET, "meets_target": None,
               "threshold": sides["fp32"]["threshold"],
               "threshold_reached_by_fp32_at_epoch": earliest}
    if earliest is None:
        return {**verdict, "reason": f"an fp32 DDP fit never reached it (epochs: {fp32})"}
    if earliest < THRESHOLD_EPOCH:
        return {**verdict, "reason": (
            f"fp32 DDP reached it at epoch {earliest}, before its {THRESHOLD_EPOCH}rd: the "
            "time would measure the first epochs' speed, not convergence")}
    reached = {mode: f["ratios"]["time_to_accuracy_s"] for mode, f in sides.items()
               if mode != "fp32" and f["ratios"]["time_to_accuracy_s"] is not None}
    if not reached:
        return {**verdict, "reason": "no other mode reached the threshold"}
    mode = min(reached, key=reached.__getitem__)
    return {**verdict, "mode": mode, "ratio": reached[mode],
            "meets_target": reached[mode] <= float(TARGET.split()[1])}


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small data, 1 epoch, 1 timed fit per side: checks that it runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--accuracy", type=float, default=0.95, help="validation accuracy")
    parser.add_argument("--only", choices=("plain", "straggler", "wide"),
                        help="one section (a partial run: printed, not saved)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated modes, fp32 included (a partial run)")
    options = parser.parse_args()
    rows, epochs, repeats, threshold = ((4_000, 1, 1, 0.5) if options.quick else
                                        (options.rows, options.epochs, options.repeats,
                                         options.accuracy))
    started = time.perf_counter()
    spark = start_spark("sparkdist-bench-communication", {"spark.sql.shuffle.partitions": "2"})
    from sparkdist.datasets import make_nonlinear

    data = spark.createDataFrame(make_nonlinear(rows, seed=5)).repartition(2).cache()
    data.count()
    modes, warm_up = options.modes.split(","), not options.quick
    assert modes[0] == "fp32" and set(modes) <= set(MODES), f"--modes {options.modes}"
    plain = slowed = wide = None
    if options.only in (None, "plain"):
        plain = figures(measure(data, modes, epochs, repeats, False, warm_up), epochs,
                        threshold)
    if options.only in (None, "straggler"):
        runs = measure(data, modes, epochs, repeats, True, warm_up)
        slowed = figures(runs, epochs, fp32_threshold(runs))
    if options.only in (None, "wide"):
        runs = measure(data, modes, epochs, repeats, True, warm_up, WIDE)
        wide = figures(runs, epochs, fp32_threshold(runs))
    result = {
        "quick": options.quick, "machine": machine(spark), "modes": MODES,
        "settings": {"rows": rows, "epochs": epochs, "threshold": threshold, "workers": 2,
                     "repeats": repeats, "straggler": SLOWED},
        "per_mode": plain,
        "straggler": slowed and {"per_mode": slowed, "best": best(slowed)},
        "straggler_wide_model": wide and {"modelKwargs": WIDE, "per_mode": wide,
                                          "best": best(wide)},
        "best_without_straggler": plain and best(plain),
        "definition": ("TorchEstimator fits on 2 workers of datasets.make_nonlinear(rows, "
                       "dim=8), defaults but for each mode's Params, validationFraction=0.1; "
                       "wall clock on the driver around the whole fit, median of the timed "
                       "fits after one untimed warm-up fit per side, sides alternating; ratios "
                       "against fp32 DDP measured in the same run; time to accuracy: the fit's "
                       "fixed costs plus the epochs up to the first to reach the section's "
                       "validation-accuracy threshold; without straggler the threshold is "
                       "settings.threshold; straggler: rank 1 sleeps as long as each step it "
                       "computes took, and the threshold is chosen from data measured in the "
                       "same run: the lowest validation accuracy fp32 DDP had after its third "
                       "epoch among its timed fits; in every section, if an fp32 fit reaches "
                       "the threshold before its third epoch or never, no verdict "
                       "(meets_target None, with the reason); straggler_wide_model: the "
                       "straggler section with modelKwargs " + str(WIDE)),
        "seconds": round(time.perf_counter() - started, 1)}
    write_result("communication", result, save=not (options.quick or options.only
                                                      or len(modes) < len(MODES)))


if __name__ == "__main__":
    main()
