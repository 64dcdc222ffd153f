"""TorchEstimator's strategies against ddp on 2 workers, each figure a ratio of two things
measured in the same run (issue 16; docs: ../shared/design.md section 5).

- state: the most MiB any rank holds of parameters, gradients and optimizer state (Adam)
  under fsdp, pipeline and tensor, against ddp (target <= 0.55, ideal 0.5); peak RSS per
  worker beside it. From each fit's ``trainingSummary["ranks"]``.
- throughput: samples/s (training rows x epochs / wall clock on the driver around the whole
  ``fit``) and MiB sent per step per rank (the kernel's TCP byte counts of each worker), each
  strategy against ddp. Median of ``--repeats`` fits per side after one untimed warm-up, the
  sides alternating.
- loss_curve: the largest relative difference between fsdp's per-epoch training loss and
  ddp's with the same seed (float tolerance expected).
- budget: a model whose weights and Adam state exceed a per-worker memory cap enforced by the
  kernel (``spark.executor.pyspark.memory`` on local-cluster workers) fails under ddp and
  trains under fsdp (bench/budget.py; skipped with --quick).

A strategy that is refused records {"error": ...}; the others still run. Prints one JSON
line; a full run (no --quick) also saves bench/results/parallel.json.

    python bench/parallel.py [--quick] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import machine, start_spark, write_result

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/models/torch.py", "sparkdist/torchtrain", "sparkdist/launch")
STRATEGIES = ("ddp", "fsdp", "pipeline", "tensor")
MODEL = {"features": 64, "hidden": [1024, 1024, 1024], "rows": 20_000, "epochs": 2,
         "batch_size": 256, "workers": 2}
QUICK = {**MODEL, "hidden": [64, 64], "rows": 2_000, "epochs": 1}
#: A 256 MiB MLP (1 GiB with gradients and Adam's moments) under a 3400 MiB cap per worker.
BUDGET = {"budget_mb": 3400, "hidden": [4096] * 5, "workers": 2}


def fit(data: Any, strategy: str, shape: dict[str, Any]) -> tuple[Any, float]:
    from sparkdist.models import TorchEstimator

    estimator = TorchEstimator(strategy=strategy, numWorkers=shape["workers"],
                               epochs=shape["epochs"], batchSize=shape["batch_size"],
                               modelKwargs={"hidden": shape["hidden"]}, seed=7,
                               progress=False)
    started = time.perf_counter()
    model = estimator.fit(data)
    return model, time.perf_counter() - started


def measure(data: Any, shape: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Per strategy: the fits' wall times (alternating with the others), the summary of the
    last fit."""
    runs: dict[str, dict[str, Any]] = {name: {"seconds": []} for name in STRATEGIES}
    for round_ in range(repeats + 1):  # round 0: the untimed warm-up
        for name in STRATEGIES:
            if "error" in runs[name]:
                continue
            try:
                model, seconds = fit(data, name, shape)
            except Exception as err:  # a refused or failing strategy: recorded, others go on
                runs[name]["error"] = f"{type(err).__name__}: {str(err)[:400]}"
                continue
            if round_:
                runs[name]["seconds"].append(seconds)
            runs[name]["summary"], runs[name]["history"] = model.trainingSummary, model.history
        print(f"round {round_} done", file=sys.stderr, flush=True)
    return runs


def figures(runs: dict[str, dict[str, Any]], shape: dict[str, Any]) -> dict[str, Any]:
    base = _side(runs["ddp"], shape)
    result: dict[str, Any] = {"ddp": base}
    for name in STRATEGIES[1:]:
        side = _side(runs[name], shape)
        if "error" not in side and "error" not in base:
            side["state_ratio"] = round(side["state_mb"] / base["state_mb"], 3)
            side["state_target_met"] = side["state_ratio"] <= 0.55
            side["throughput_ratio"] = round(side["samples_per_s"] / base["samples_per_s"], 3)
            side["sent_ratio"] = round(side["sent_mb_per_step"] / base["sent_mb_per_step"], 3)
        result[name] = side
    if "history" in runs["fsdp"] and "history" in runs["ddp"]:
        pairs = zip(runs["fsdp"]["history"], runs["ddp"]["history"])
        result["loss_curve_max_rel_diff"] = max(abs(a["loss"] - b["loss"]) / abs(b["loss"])
                                                for a, b in pairs)
    return result


def _side(run: dict[str, Any], shape: dict[str, Any]) -> dict[str, Any]:
    if "error" in run:
        return {"error": run["error"]}
    summary, seconds = run["summary"], statistics.median(run["seconds"])
    ranks, steps = summary["ranks"], summary["steps_per_epoch"] * shape["epochs"]
    return {"seconds": round(seconds, 3),
            "samples_per_s": round(summary["rows"] * shape["epochs"] / seconds, 1),
            "state_mb": max(rank["state_mb"] for rank in ranks),
            "peak_rss_mb": [rank["peak_rss_mb"] for rank in ranks],
            "sent_mb_per_step": round(max(rank["sent_mb"] for rank in ranks) / steps, 4)}


def budget(quick: bool) -> dict[str, Any]:
    """ddp and fsdp under a per-worker address-space cap (its own driver: the cap needs a
    local-cluster session of its own, as tests/cluster/test_memory_budget.py runs it)."""
    if quick:
        return {"skipped": "--quick"}
    from budget import model_state_mb

    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import json, sys\nsys.path.insert(0, {here!r})\n"
            "from budget import budget_session, compare_under_budget\n"
            f"spark = budget_session({BUDGET['budget_mb']})\n"
            f"print(json.dumps(compare_under_budget(spark, {BUDGET['hidden']})))\n"
            "spark.stop()\n")
    env = {key: value for key, value in os.environ.items() if key != "PYSPARK_SUBMIT_ARGS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=1800, env=env)
    if done.returncode:
        return {"error": done.stderr[-2000:]}
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    return {**BUDGET, "training_state_mb": round(model_state_mb(BUDGET["hidden"])
                                                 ["training_state"], 1),
            **{name: {"trained": side["ok"], "error": side.get("error", "")[:300],
                      "state_mb": [rank.get("state_mb") for rank in side.get("ranks", [])]}
               for name, side in outcome.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small model, 1 repeat")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    shape = QUICK if options.quick else MODEL
    repeats = 1 if options.quick else options.repeats
    spark = start_spark("sparkdist-bench-parallel")
    from sparkdist.datasets import make_nonlinear

    data = spark.createDataFrame(make_nonlinear(shape["rows"], seed=3,
                                                dim=shape["features"])).cache()
    data.count()
    runs = measure(data, shape, repeats)
    result = {"machine": machine(spark), "model": shape, "repeats": repeats,
              "strategies": figures(runs, shape), "budget": budget(options.quick)}
    write_result("parallel", result, save=not options.quick)


if __name__ == "__main__":
    main()
