"""Run the benchmarks in bench/ and publish their figures: ``bench/results/<name>.json`` (each
benchmark's last full run), ``latest.json`` (every figure plus the comparison table),
``latest.md`` (the table), ``latest.png`` (the chart) and ``docs/performance.md`` (the page).

Each benchmark runs as its own process (its own SparkSession) and prints one JSON line; a
ratio is always measured against a reference run in the same process, on the same data, so
the figures compare tools rather than machines. Every published figure carries its commit,
date and the machine's load during the run: a figure whose measured code (the benchmark's
``MEASURES``) changed after its commit is marked STALE, and a run on a busy machine NOISY,
which is listed but not published as a result.

    python bench/report.py                   # what `make bench` runs
    python bench/report.py --only classical  # rerun one; the others' figures are kept
    python bench/report.py --page            # no run: rewrite the pages (`make docs`)
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
LATEST = RESULTS / "latest.json"
PAGE = REPO / "docs" / "performance.md"
SCRIPTS = ("split_assembly", "classical", "deep", "parallel", "communication", "quantization",
           "daemon_memory", "inputs", "finetune", "keras_estimator", "scoring", "tuning", "ps")
#: A run is noise, not a result, where the 1-minute load average exceeded this before it
#: started (or, for a result without per-process figures, at any sample) ...
NOISY_LOAD = 1.5
#: ... or where a process outside the benchmark used more than this share of one core.
NOISY_OTHERS = 0.10
#: Before each benchmark, wait up to this long for the load the last one left to decay.
SETTLE_S = 180


def run(name: str) -> dict[str, Any]:
    """The JSON line the benchmark printed last."""
    settle()
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(BENCH / f"{name}.py")], capture_output=True,
                          text=True, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
                                          "GLOO_SOCKET_IFNAME": "lo"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"bench/{name}.py failed (exit {done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    print(f"bench/{name}.py: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return json.loads(lines[-1])


def settle() -> None:
    """Wait until the 1-minute load average is under 1 (the previous benchmark's own load
    decays in about 40 s), at most SETTLE_S seconds; a machine that stays busy gives a run
    that the report marks NOISY."""
    deadline = time.monotonic() + SETTLE_S
    while os.getloadavg()[0] >= 1.0 and time.monotonic() < deadline:
        time.sleep(5)


# -- provenance: where, when and how quietly each benchmark's figures were measured ----------

def git(*args: str) -> tuple[int, str]:
    """(exit status, stdout) of ``git args`` in this repository; 128 without git."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 128, ""
    return done.returncode, done.stdout.strip()


#: Modules that only one benchmark's fits import: a strategy's module (and what only it
#: imports) is loaded by name, when a fit names the strategy
#: (sparkdist.torchtrain.strategies.module), so a change to them leaves the figures of the
#: other benchmarks that measure their folder current (tests/unit/test_bench_report.py
#: checks that nothing else imports them).
ONLY_FOR = {"ps": ("sparkdist/torchtrain/strategies/ps.py", "sparkdist/torchtrain/tables.py",
                   "sparkdist/torchtrain/tables_async.py")}


def measured_paths(name: str) -> tuple[str, ...]:
    """The ``MEASURES`` a benchmark script declares, read without importing it, less the
    modules only another benchmark's fits import (as git's exclude pathspecs)."""
    tree = ast.parse((BENCH / f"{name}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "MEASURES" for t in node.targets):
            paths = ast.literal_eval(node.value)
            if isinstance(paths, tuple) and paths and all(isinstance(p, str) for p in paths):
                return paths + tuple(f":(exclude){path}" for other, only in ONLY_FOR.items()
                                     if other != name for path in only)
    raise SystemExit(f"bench/{name}.py: MEASURES must be a non-empty tuple of the code paths "
                     "it measures, e.g. MEASURES = (\"sparkdist/features\",)")


def summary(name: str) -> str:
    """The first paragraph of a benchmark script's docstring: what it measures."""
    doc = ast.get_docstring(ast.parse((BENCH / f"{name}.py").read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def provenance(name: str, figures: dict[str, Any], source: Path) -> dict[str, Any]:
    """The result's recorded provenance; for results written before benchmarks recorded it,
    what they did record (top-level commit, date, load) and otherwise the commit that added
    the result file (the measured code is no newer than that)."""
    found = dict(figures.get("provenance") or {})
    for key in ("commit", "date"):
        if key not in found and figures.get(key):
            found[key] = figures[key]
    if "load_1min" not in found:
        loads = figures.get("load_1min") or _loads_in(str(figures.get("machine", "")))
        if loads:
            found["load_1min"] = {"start": loads[0], "max": max(loads), "end": loads[-1]}
    if not found.get("commit"):
        status, line = git("log", "-1", "--format=%H %cd", "--date=format:%Y-%m-%d %H:%M",
                           "--", str(source.relative_to(REPO)))
        if status == 0 and line:
            commit, date = line.split(" ", 1)
            found.update(commit=commit, committed_only=True)
            found.setdefault("date", f"{date} (commit date)")
    return found


def _loads_in(machine: str) -> list[float]:
    """The loads an older result wrote into its machine line: 'load avg (1 min) 1.45/6.05'."""
    match = re.search(r"load avg \(1 min\) ([\d./]+)", machine)
    return [float(x) for x in match.group(1).split("/") if x] if match else []


def stale(found: dict[str, Any], paths: tuple[str, ...]) -> str | None:
    """Why the figure no longer describes the code, or None: a measured path differs between
    its commit and the checkout (the working tree, so that pages regenerated before a commit
    stay right after it), or was uncommitted when it was measured."""
    commit = found.get("commit")
    if not commit:
        return "no commit recorded"
    status, _ = git("diff", "--quiet", commit, "--", *paths)
    if status == 1:
        return f"measured code changed since {commit[:7]}"
    if status != 0:
        return f"commit {commit[:7]} is not in this history"
    excluded = {p.removeprefix(":(exclude)") for p in paths if p.startswith(":(exclude)")}
    dirty = [f for f in found.get("dirty", []) if f not in excluded and any(
        f == p or f.startswith(p.rstrip("/") + "/") for p in paths)]
    return f"measured with uncommitted changes to {', '.join(dirty)}" if dirty else None


def noisy(found: dict[str, Any]) -> str | None:
    """Why the run is noise rather than a result, or None (see NOISY_LOAD, NOISY_OTHERS)."""
    load, others = found.get("load_1min"), found.get("others_cpu")
    if not load:
        return "no load recorded"
    if load["start"] > NOISY_LOAD:
        return f"load {load['start']} > {NOISY_LOAD} at the start"
    if others is None and load["max"] > NOISY_LOAD:
        return f"load up to {load['max']} > {NOISY_LOAD}"
    if others and others["share_of_a_core"] > NOISY_OTHERS:
        return (f"{others['busiest']} used {others['share_of_a_core']:.0%} of a core "
                f"(> {NOISY_OTHERS:.0%})")
    return None


def status(found: dict[str, Any], paths: tuple[str, ...]) -> dict[str, Any]:
    """The provenance a row shows: commit, date, load, and its STALE / NOISY reasons."""
    load, others = found.get("load_1min"), found.get("others_cpu")
    shown = f"{load['start']}-{load['max']}" if load else "unrecorded"
    if others:
        shown += f", others {others['share_of_a_core']:.0%} of a core"
    commit = (found.get("commit") or "")[:7] or "unrecorded"
    if found.get("committed_only"):
        commit = f"unrecorded (result added in {commit})"
    return {"commit": commit,
            "date": found.get("date", "unrecorded"), "load": shown,
            "stale": stale(found, paths), "noisy": noisy(found)}


def stored(names: tuple[str, ...] = SCRIPTS) -> dict[str, tuple[dict[str, Any], Path]]:
    """Each benchmark's last stored result and the file it came from: results/<name>.json,
    else the figures an older latest.json kept."""
    found: dict[str, tuple[dict[str, Any], Path]] = {}
    kept = json.loads(LATEST.read_text()).get("benchmarks", {}) if LATEST.exists() else {}
    for name in names:
        path = RESULTS / f"{name}.json"
        if path.exists():
            found[name] = (json.loads(path.read_text()), path)
        elif name in kept:
            found[name] = (kept[name], LATEST)
    return found


# -- the comparison table ------------------------------------------------------------------

#: Which way is better, by unit, for a row whose target does not say.
LOWER_IS_BETTER = {"s", "ms", "MiB", "bytes", "syncs", "RMSE", "loss", "difference", "parameters"}


def table(figures: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per comparison: its benchmark, what, sparkdist's figure, the reference's,
    ratio, target, and which way is better."""
    rows: list[dict[str, Any]] = []
    for name, rows_of in (("split_assembly", _split_rows), ("classical", _classical_rows),
                          ("deep", _deep_rows), ("parallel", _parallel_rows),
                          ("communication", _communication_rows),
                          ("quantization", _quantization_rows),
                          ("daemon_memory", _daemon_rows), ("inputs", _inputs_rows),
                          ("finetune", _finetune_rows),
                          ("keras_estimator", _keras_rows), ("scoring", _scoring_rows),
                          ("tuning", _tuning_rows), ("ps", _ps_rows)):
        if name not in figures:
            continue

        def row(what: str, ours: Any, reference: Any, ratio: float, target: str,
                unit: str = "s", definition: str | None = None, bench: str = name) -> None:
            better = ("lower" if target.startswith("<=") else "higher" if
                      target.startswith(">=") else
                      "lower" if unit in LOWER_IS_BETTER else "higher")
            rows.append({"benchmark": bench, "comparison": what, "sparkdist": ours,
                         "reference": reference, "unit": unit, "ratio": ratio,
                         "target": target, "better": better, "definition": definition})

        rows_of(figures[name], row)
    return rows


def _split_rows(f: dict[str, Any], row: Any) -> None:
    """bench/split_assembly.py: the shared data contract against MLlib's own."""
    row(f"FeatureAssembler + split vs VectorAssembler + randomSplit ({f['rows']:,} rows)",
        f["sparkdist_s"], f["reference_s"], f["time_ratio"], "-")


def _classical_rows(f: dict[str, Any], row: Any) -> None:
    """bench/classical.py: each classical estimator against the stage it wraps."""
    for key, what, target in (
            ("logistic_regression", "LogisticRegression vs MLlib", "<= 1.05"),
            ("random_forest", "RandomForestClassifier vs MLlib", "<= 1.05"),
            ("xgboost", "XGBoostClassifier vs xgboost.spark", "<= 1.05"),
            ("als", "ALS vs MLlib", "<= 1.10")):
        spread = f[key].get("ratio_spread")
        row(f"{what}, fit time" + (f" (median of {f[key]['runs']} runs' ratios, spread "
                                   f"{spread[0]}-{spread[1]})" if spread else ""),
            f[key]["sparkdist_s"], f[key]["wrapped_s"], f[key]["ratio"], target)
    _allreduce_rows(f.get("logistic_regression_allreduce", {}), row)
    single = f["xgboost_2_workers_vs_single_process"]
    row("XGBoost on 2 Spark workers vs single-process xgboost, fit time",
        single["distributed_s"], single["single_s"], single["time_ratio"], "-")


def _daemon_rows(f: dict[str, Any], row: Any) -> None:
    """bench/daemon_memory.py: a worker of sparkdist's preloading daemon against pyspark's."""
    for key, what in (("rss_mb", "RSS"), ("private_mb", "private memory")):
        row(f"Python worker {what}, sparkdist's preloading daemon vs pyspark's (local[1])",
            f["preload"][key], f["pyspark"][key],
            round(f["preload"][key] / f["pyspark"][key], 3), "-", "MiB")
    row("One full gc.collect() in a worker, sparkdist's preloading daemon vs pyspark's",
        f["preload"]["gc_s"], f["pyspark"]["gc_s"],
        round(f["preload"]["gc_s"] / f["pyspark"]["gc_s"], 3), "-")


def _allreduce_rows(f: dict[str, Any], row: Any) -> None:
    """bench/classical.py: LogisticRegression(solver='allreduce') against MLlib's fit and
    scikit-learn's lbfgs on one core."""
    for key, what in (("binomial", "binomial"), ("elastic_net", "elastic net"),
                      ("multinomial", "10 classes")):
        if key not in f:
            continue
        side = f[key]
        shape = f"{side['rows']:,} x {side['features']}"
        row(f"LogisticRegression allreduce vs MLlib, {what}, {shape}, fit time (log-loss "
            f"difference {side['logloss_difference']:.0e})" + (
                ", a later fit of the same cached rows" if "first_fit_s" in side else ""),
            side["allreduce_s"], side["mllib_s"],
            round(side["allreduce_s"] / side["mllib_s"], 3), "<= 0.33")
        if "first_fit_s" in side:
            row(f"LogisticRegression allreduce vs MLlib, {what}, {shape}, fit time, the first "
                "fit of newly cached rows", side["first_fit_s"], side["mllib_s"],
                round(side["first_fit_s"] / side["mllib_s"], 3), "<= 0.33")
        if "sklearn_1core_s" in side:
            row(f"LogisticRegression allreduce (2 ranks) vs scikit-learn lbfgs (1 core), {what}"
                f", {shape}, fit time", side["allreduce_s"], side["sklearn_1core_s"],
                side["allreduce_vs_sklearn"], "<= 1.5")


def _parallel_rows(f: dict[str, Any], row: Any) -> None:
    """bench/parallel.py: each strategy against ddp on 2 workers."""
    strategies, shape = f["strategies"], f["model"]
    ddp = strategies["ddp"]
    for name in ("fsdp", "pipeline", "tensor"):
        side = strategies.get(name, {})
        if "state_ratio" not in side:
            continue
        row(f"strategy={name} vs ddp, MiB of parameters + gradients + Adam state on the "
            f"busiest rank (MLP {shape['hidden']})", side["state_mb"], ddp["state_mb"],
            side["state_ratio"], "<= 0.55", "MiB")
        row(f"strategy={name} vs ddp, samples/s (MiB sent per step: "
            f"{side['sent_mb_per_step']} vs {ddp['sent_mb_per_step']})",
            side["samples_per_s"], ddp["samples_per_s"], side["throughput_ratio"], "-",
            "samples/s")


def _communication_rows(f: dict[str, Any], row: Any) -> None:
    """bench/communication.py: each mode against fp32 DDP, without and with a straggler."""
    for mode, side in f["per_mode"].items():
        if mode == "fp32" or "ratios" not in side:
            continue
        ratios = side["ratios"]
        row(f"{mode} vs fp32 DDP, time to {f['settings']['threshold']} validation accuracy "
            f"(all-reduce bytes/step x{ratios['allreduce_bytes_per_step']}, samples/s "
            f"x{ratios['samples_per_s']})", side["time_to_accuracy_s"],
            f["per_mode"]["fp32"]["time_to_accuracy_s"], ratios["time_to_accuracy_s"], "-")
    for key, model in (("straggler", "default MLP"),
                       ("straggler_wide_model", "MLP hidden [256, 256]")):
        best = (f.get(key) or {}).get("best")
        if not best:
            continue
        straggler = f[key]["per_mode"]
        threshold = f"{best['threshold']:.3f}" if best.get("threshold") else "the"
        what = f"One rank slowed 2x, {model}: best mode ({best['mode']}) vs fp32 DDP, time to " \
               f"{threshold} validation accuracy (fp32 reaches it in epoch " \
               f"{best.get('threshold_reached_by_fp32_at_epoch')})"
        if best["mode"]:
            row(what, straggler[best["mode"]]["time_to_accuracy_s"],
                straggler["fp32"]["time_to_accuracy_s"], best["ratio"], best["target"])
        elif best.get("reason"):
            row(f"{what}: no verdict, {best['reason']}", None,
                straggler["fp32"]["time_to_accuracy_s"], None, best["target"])


def _quantization_rows(f: dict[str, Any], row: Any) -> None:
    """bench/quantization.py: int8 scoring against float32."""
    size, accuracy = f["size"], f["accuracy"]
    row("TorchModel int8 vs float32, saved network size", size["int8_bytes"],
        size["fp32_bytes"], size["int8_to_fp32"], "-", "bytes", size.get("definition"))
    row("TorchModel int8 vs float32, test accuracy (difference in points)",
        accuracy["int8"], accuracy["fp32"], accuracy["difference_pp"],
        accuracy["target_pp"], "accuracy", accuracy.get("definition"))
    for kind in ("warm", "cold"):
        side = f[kind]
        row(f"TorchModel int8 vs float32 transform, rows/s, {kind} (speed-up)",
            side["int8_rows_per_s"], side["fp32_rows_per_s"], side["int8_speedup"], "-",
            "rows/s", side.get("definition"))


def _inputs_rows(f: dict[str, Any], row: Any) -> None:
    """bench/inputs.py: several typed inputs (ids, images, sequences)."""
    feed, auc, digits = f["feed"], f["click_auc"], f["digits"]
    row("TorchEstimator DLRM-style fit vs bare barrier scan of the same columns, rows/s",
        feed["fit_rows_per_s"], feed["bare_rows_per_s"], feed["ratio"], feed["target"],
        "rows/s", feed["definition"])
    row("DLRM-style model, TorchEstimator vs single-process torch loop, test AUC (difference)",
        auc["sparkdist_auc"], auc["single_process_auc"], auc["difference"], auc["target"],
        "AUC", auc["definition"])
    row("ImageCNN on digits as [1, 8, 8] images, test accuracy (reference: the target)",
        digits["accuracy"], float(digits["target"].split()[1]), digits["accuracy"],
        digits["target"], "accuracy", digits["definition"])
    ratings, memory = f["ratings"], f["sequence_memory"]
    row(f"TwoTower vs ALS on the ratings sample, test RMSE ({ratings['winner']} wins)",
        ratings["two_tower_rmse"], ratings["als_rmse"], ratings["ratio"], "-", "RMSE",
        ratings["definition"])
    row(f"Token-sequence fit, peak worker RSS, {memory['large_rows']:,} vs "
        f"{memory['small_rows']:,} rows", memory["large_peak_mb"], memory["small_peak_mb"],
        memory["ratio"], memory["target"], "MiB", memory["definition"])


def _finetune_rows(f: dict[str, Any], row: Any) -> None:
    """bench/finetune.py: LoRA adapters against full fine-tuning of the same model."""
    setup = f["setup"]
    what = (f"CausalLM ({f['trainable']['model_params']:,} parameters), LoRA vs full "
            f"fine-tuning, {setup['rows']:,} rows x {setup['epochs']} epochs, 2 workers")
    share = f["trainable"]
    row(f"{what}: trainable parameters (reference: all)", share["adapter_params"],
        share["model_params"], share["share"], share["target"], "parameters",
        "the LoRA adapters' parameters over the model's")
    for key in ("optimizer", "allreduce"):
        part = f[key]
        row(f"{what}: {part['what']}", part["lora"], part["full"], part["ratio"],
            part["target"], "MiB" if key == "optimizer" else "bytes", part["what"])
    loss = f["loss"]
    row("CausalLM second task, test loss after LoRA vs the base's before it", loss["after"],
        loss["before"], loss["ratio"], loss["target"], "loss",
        "cross-entropy on 2,000 held-out rows of the second task")
    for kind in ("warm", "cold"):
        side = f["speed"][kind]
        row(f"{what}: samples/s, {kind} (LoRA over full)", side["lora_samples_per_s"],
            side["full_samples_per_s"], side["ratio"], "-", "samples/s",
            "wall clock on the driver around the whole fit; cold: each side's first call, "
            "warm: the median of the calls after it, the sides alternating")
    merged = f["merged"]
    row("TorchModel with LoRA adapters, merged vs separate: largest rawPrediction difference",
        merged["max_abs_difference"], 0.0, merged["max_abs_difference"], merged["target"],
        "difference", "the largest absolute difference over 2,000 rows"
        + (f", where the largest |logit| is {merged['largest_abs_logit']:.1f} (float32 "
           f"spacing up to {merged['largest_abs_logit'] / 2**23:.1e})"
           if "largest_abs_logit" in merged else ""))


def _keras_rows(f: dict[str, Any], row: Any) -> None:
    """bench/keras_estimator.py: KerasEstimator against TorchEstimator and Keras' own fit."""
    digits = f["digits"]
    row("Digits, Keras MLP by KerasEstimator vs the torch MLP by TorchEstimator: test "
        "accuracy", digits["keras_accuracy"], digits["torch_accuracy"],
        digits["keras_accuracy"], digits["target"], "accuracy", digits["definition"])
    for kind in ("warm", "cold"):
        side = f["speed"][kind]
        row(f"Digits fit, KerasEstimator vs TorchEstimator: samples/s, {kind}",
            side["keras_samples_per_s"], side["torch_samples_per_s"], side["ratio"], "-",
            "samples/s", "wall clock on the driver around the whole fit, 2 workers; cold: "
            "each side's first call (Keras' first, so it also pays the session's first "
            "barrier stage), warm: the median of the calls after it, the sides alternating")
    for name, found in f["against_keras_fit"].items():
        row(f"1 worker, 5 steps, {name}: largest weight difference from keras.Model.fit",
            found["max_abs_difference"], 0.0, found["max_abs_difference"], found["target"],
            "difference", "the same seed, data and batches (the whole data per step); "
            "torch.optim's Adam adds epsilon after the bias correction, Keras' before")


def _scoring_rows(f: dict[str, Any], row: Any) -> None:
    """bench/scoring.py: TorchModel.transform against a bare mapInArrow with the network
    built, int8 against float32, the model load per task and the scoring UDF's size."""
    t, net = f["throughput"], f["network"]
    shape = "-".join(str(n) for n in [net["features"], *net["hidden"], net["outputs"]])
    for kind in ("cold", "warm"):
        side = t[kind]
        row(f"TorchModel.transform vs bare mapInArrow with the network built, MLP {shape}, "
            f"{t['rows']:,} rows, rows/s, {kind}", side["sparkdist_rows_per_s"],
            side["bare_rows_per_s"], side["ratio"], t["target"], "rows/s", t["definition"])
    for kind in ("cold", "warm"):
        side = t[kind]
        row(f"TorchModel transform int8 vs float32, MLP {shape}, rows/s, {kind} (speed-up)",
            side["int8_rows_per_s"], side["sparkdist_rows_per_s"], side["int8_speedup"], "-",
            "rows/s", t["definition"])
    load = f["load"]
    row(f"TorchModel model load per task on a hit, seconds, median of {load['later_tasks']} "
        f"tasks ({load['later_hits']} hits; reference: the target {load['target']} s; first "
        f"load {load['first_s']} s)", load["later_s"],
        float(load["target"].split()[-1]), load["ratio_to_target"], "<= 1.0", "s",
        load["definition"])
    classical = f["classical"]
    for kind in ("cold", "warm"):
        side = classical[kind]
        row(f"LogisticRegressionModel.transform vs the MLlib model it wraps, "
            f"{classical['rows']:,} rows, seconds, {kind}", side["sparkdist_s"],
            side["mllib_s"], side["ratio"], classical["target"], "s", classical["definition"])
    udf = f["udf"]
    row(f"TorchModel.transform UDF, pickled bytes, {udf['model_bytes'] / 1e6:,.0f} MB model "
        f"(reference: the target, 1 MiB)", udf["udf_bytes"], udf["target_bytes"],
        udf["ratio_to_target"], "<= 1.0", "bytes", udf["definition"])


def _tuning_rows(f: dict[str, Any], row: Any) -> None:
    """bench/tuning.py: Tuner against TrainValidationSplit over the same configurations, 2-worker
    trials queueing on 2 task slots, and the seconds a pruned fit takes to stop."""
    s = f["search"]
    what = (f"Tuner ({s['trials']} trials, TPE, asha) vs TrainValidationSplit (all "
            f"{s['configurations']} configurations), digits MLP, parallelism 2")
    kinds = [(kind, s[kind]) for kind in ("cold", "warm") if s.get(kind)]
    for kind, side in kinds:
        row(f"{what}: seconds, {kind}", side["sparkdist_s"], side["reference_s"],
            side["ratio"], s["target"], "s", s["definition"])
    for kind, side in kinds:
        row(f"{what}: best validation accuracy, points below the reference's, {kind} (test "
            f"accuracy {side['sparkdist_test_accuracy']} vs {side['reference_test_accuracy']})",
            side["sparkdist_best_validation_accuracy"],
            side["reference_best_validation_accuracy"], side["accuracy_gap_points"],
            s["accuracy_target"], "accuracy", s["definition"])
    q = f["queueing"]
    trials = ", ".join(f"{n} {state}" for state, n in q["trials"].items()) or "none"
    row(f"Tuner, 2-worker trials at parallelism 3 on 2 task slots: studies finished of "
        f"{q['studies']} (reference: all; trials {trials}; median {q['median_study_s']} s a "
        f"study)", q["finished"], q["studies"], q["finished_share"], q["target"], "studies",
        q["definition"])
    p = f["pruning"]
    if p.get("median_prune_s") is not None:  # else no trial was pruned during its fit: the
        # result's pruning figures say how many were pruned and whether pruneSeconds existed
        row(f"Tuner pruning during a fit: seconds from the decision to the pruned fit's tasks "
            f"ended, median of {p['pruned_during_fit']} pruned trials (reference: the target "
            f"{p['target_s']} s; max {p['max_prune_s']} s; median "
            f"{p['median_pruned_epochs']} of {p['epochs_budget']} epochs reported)",
            p["median_prune_s"], p["target_s"], p["ratio_to_target"], "<= 1.0", "s",
            p["definition"])


#: A time-to-a-level row whose sparkdist side never reached the level: its value and ratio.
NOT_REACHED = "not reached"


def _ps_async_rows(measured: list[dict[str, Any]], row: Any) -> None:
    """bench/ps.py's async_vs_sync: time to the same AUC, rank 1 slowed 2x."""
    for a in measured:
        best = {mode: max(f["test_auc"] for f in per.values())
                for mode, per in a["per_epochs"].items()}
        epochs = (f"async at {a['async_epochs']} epoch(s)" if a["async_epochs"] else
                  "async: not within 4 epochs")
        row(f"strategy='ps' asynchronous (maxStaleness={a['staleness']}) vs synchronous, "
            f"rank 1 slowed {a['slowed']['factor']:g}x, learningRate {a['learning_rate']}: "
            f"seconds to test AUC {a['target_auc']} (sync's best {best['sync']} - 0.002; "
            f"async's best {best['async']}; sync at {a['sync_epochs']} epoch(s), {epochs})",
            NOT_REACHED if a["async_s"] is None else a["async_s"], a["sync_s"],
            NOT_REACHED if a["async_s"] is None else a["time_ratio"], a["target"], "s",
            a["definition"])


def _ps_rows(f: dict[str, Any], row: Any) -> None:
    """bench/ps.py: strategy="ps" against ddp on a 2^20-row table, and sparse logistic
    regression on hashed features against MLlib's."""
    c = f["click"]
    what = (f"strategy='ps' vs ddp, ClickModel with one table of {sum(c['model']['tables']):,} "
            f"rows x {c['model']['dim']}, optimizer adagrad, 2 workers")
    row(f"{what}: MiB sent per step by the busiest rank (ratio: ddp's over ps's)",
        c["ps"]["sent_mb_per_step"], c["ddp"]["sent_mb_per_step"], c["bytes_ratio"],
        c["bytes_target"], "MiB", c["definition"])
    for kind in ("first", "later"):
        row(f"{what}: samples/s, {kind}", c["ps"][f"samples_per_s_{kind}"],
            c["ddp"][f"samples_per_s_{kind}"], c[f"throughput_ratio_{kind}"],
            c["throughput_target"], "samples/s", c["definition"])
    row(f"{what}: test AUC, difference (ps {c['ps']['test_auc']}, ddp {c['ddp']['test_auc']})",
        c["ps"]["test_auc"], c["ddp"]["test_auc"], c["auc_difference"], c["auc_target"],
        "difference", c["definition"])
    _ps_async_rows(f.get("async_vs_sync", []), row)  # [] in results from before async
    lr = f["sparse_lr"]
    what = (f"nets.HashedLogistic under ps vs MLlib LogisticRegression, {lr['rows']:,} rows of "
            f"{lr['ids_per_row']} ids in {lr['features']:,} hashed features")
    for kind in ("first", "later"):
        row(f"{what}: seconds, {kind}", lr["sparkdist"][f"{kind}_s"], lr["mllib"][f"{kind}_s"],
            lr[f"time_ratio_{kind}"], "-", "s", lr["definition"])
    row(f"{what}: test log-loss", lr["sparkdist"]["test_log_loss"],
        lr["mllib"]["test_log_loss"], round(lr["sparkdist"]["test_log_loss"]
                                           / lr["mllib"]["test_log_loss"], 3), "-", "loss",
        lr["definition"])


def _deep_rows(f: dict[str, Any], row: Any) -> None:
    """bench/deep.py's figures; one whose ratio could not be measured is left out."""
    def ok(key: str) -> dict | None:
        value = f.get(key)
        return value if isinstance(value, dict) and value.get("ratio") is not None else None

    if feed := ok("feed"):
        row(f"TorchEstimator 1-epoch fit vs bare barrier mapInArrow (same vector_to_array, "
            f"float32 matrices), rows/s, {feed['rows']:,} rows", feed["fit_rows_per_s"],
            feed["bare_rows_per_s"], feed["ratio"], feed["target"], "rows/s",
            feed.get("definition"))
    if memory := ok("memory"):
        row(f"TorchEstimator peak worker RSS, {memory['rows_4n']:,} vs {memory['rows_n']:,} "
            "rows", memory["peak_rss_mb_4n"], memory["peak_rss_mb_n"], memory["ratio"],
            memory["target"], "MiB", memory.get("definition"))
    if scaling := ok("scaling"):
        ceiling, default = scaling["machine_ceiling"], scaling["batch_size_default"]
        for key, batch in (("at_defaults", default), ("batch_8192", 8192)):
            s = scaling[key]
            what = "defaults" if key == "at_defaults" else "batchSize 8192"
            row(f"TorchEstimator 2 workers vs 1, samples/s, {what} (batchSize {batch} per "
                f"worker; machine ceiling {ceiling[str(batch)]['ratio']})",
                s["samples_per_s_workers_2"], s["samples_per_s_workers_1"], s["ratio"],
                scaling["target"] if key == "at_defaults" else "-", "samples/s",
                scaling.get("definition"))
    if tta := ok("time_to_accuracy"):
        row(f"TorchEstimator 2 workers vs 1, time to {tta['threshold']} validation accuracy, "
            "both at the defaults", tta["seconds_workers_2"], tta["seconds_workers_1"],
            tta["ratio"], tta["target"], definition=tta.get("definition"))
        if (rec := tta.get("recommended")) and rec.get("ratio") is not None:
            settings = ", ".join(f"{k}={v!r}" for k, v in rec["settings_workers_2"].items())
            row(f"TorchEstimator 2 workers ({settings}) vs 1, time to {tta['threshold']} "
                "validation accuracy", rec["seconds_workers_2"], rec["seconds_workers_1"],
                rec["ratio"], rec["target"], definition=rec.get("definition"))
    if "overhead" in f and "error" not in f["overhead"]:
        for kind in ("cold", "warm"):
            o = f["overhead"][kind]
            row(f"TorchEstimator 1-step fit vs TorchDistributor.run, {kind}",
                o["sparkdist_s"], o["torch_distributor_s"], o["ratio"], o["target"],
                definition=o.get("definition"))
        for builder, o in (f["overhead"].get("cold_local_cluster") or {}).items():
            if o.get("ratio") is not None:
                row(f"TorchEstimator 1-step fit vs TorchDistributor.run, cold, {o['master']}, "
                    f"session built by {builder}", o["sparkdist_s"], o["torch_distributor_s"],
                    o["ratio"], o["target"], definition=o.get("definition"))
        syncs = f["barrier_syncs"]["per_fit"]
        row("Spark barrier syncs per fit", syncs,
            f["overhead"]["warm"]["torch_distributor_barrier_syncs"], syncs, "<= 2", "syncs",
            f["barrier_syncs"].get("definition"))
    if recovery := ok("recovery"):
        row("Recovery: extra time of a fit with a SIGKILLed worker vs (cold 1-step fit + one "
            "checkpoint interval)", recovery["extra_s"], recovery["budget_s"],
            recovery["ratio"], recovery["target"], definition=recovery.get("definition"))
    _ddp_rows(f, row)


def _ddp_rows(f: dict[str, Any], row: Any) -> None:
    """bench/deep.py: the 2-worker fit against plain torchrun DDP outside Spark, and its
    per-step gradient wait against plain DDP's and a bare gloo all-reduce's."""
    ddp = f.get("ddp_reference")
    if not isinstance(ddp, dict) or "error" in ddp:
        return
    for kind in ("cold", "warm"):
        d = ddp[kind]
        row(f"TorchEstimator 2 workers vs plain torchrun DDP (2 gloo ranks, outside Spark), "
            f"samples/s, {kind} (DDP steady in its ranks: {d['ddp_steady_samples_per_s']:,}, "
            f"sparkdist's: {d['sparkdist_steady_samples_per_s']:,})",
            d["sparkdist_samples_per_s"], d["ddp_samples_per_s"], d["ratio"], d["target"],
            "samples/s", d.get("definition"))
    ours, reduce = ddp.get("sparkdist_communication_ms_per_step"), f.get("allreduce")
    if not ours or not isinstance(reduce, dict) or "threads_1" not in reduce:
        return
    one, mine = reduce["threads_1"], max(ours)
    size = f"{reduce['gradient_bytes'] / 1000:,.0f} KB"
    wait, bare = one["step"]["wait"]["mean_ms"], one["allreduce"][str(
        reduce["gradient_numel"])]["median_ms"]
    row(f"Gradient wait per step (bucket ready to backward's end), TorchEstimator's ranks vs "
        f"plain DDP with the same hook outside Spark, {size}, 1 thread (plain DDP's: "
        f"{one['wait_split']['peer']['mean_ms']} ms for the other rank, "
        f"{one['wait_split']['after_both_ready']['mean_ms']} ms after both were ready)", mine,
        wait, round(mine / wait, 3) if wait else None, "-", "ms",
        "mean ms per step, the slower rank's: sparkdist's communication_s / train_steps of the "
        "ddp_reference fit's ranks; plain DDP's from bench/allreduce.py")
    two = (reduce.get("threads_2") or {}).get("allreduce", {}).get(
        str(reduce["gradient_numel"]), {}).get("median_ms")
    row(f"Gradient wait per step, TorchEstimator's ranks vs one bare gloo all_reduce of the "
        f"same {size} outside Spark (1 thread; 2 threads: {two} ms)",
        mine, bare, round(mine / bare, 3) if bare else None, "-", "ms",
        "sparkdist's mean ms per step as above over the median ms of back-to-back "
        "dist.all_reduce calls on 2 gloo ranks (bench/allreduce.py)")




# -- publishing: the table, the page and the chart ----------------------------------------

def judged(rows: list[dict[str, Any]], results: dict[str, tuple[dict[str, Any], Path]]
           ) -> list[dict[str, Any]]:
    """The rows with their target verdict and their benchmark's provenance and status."""
    statuses = {name: status(provenance(name, figures, path), measured_paths(name))
                for name, (figures, path) in results.items()}
    return [{**r, "met": met(r), **statuses[r["benchmark"]]} for r in rows]


def met(row: dict[str, Any]) -> bool | None:
    """Whether the ratio meets the row's target (not where sparkdist's side never reached
    the level the row times: ratio NOT_REACHED); None without a target."""
    match = re.fullmatch(r"(<=|>=) *([-+\d.eE]+)", str(row["target"]).strip())
    if match and row["ratio"] == NOT_REACHED:
        return False
    if not match or not isinstance(row["ratio"], (int, float)):
        return None
    bound = float(match.group(2))
    return row["ratio"] <= bound if match.group(1) == "<=" else row["ratio"] >= bound


def verdict(row: dict[str, Any]) -> str:
    """met / missed / '-', then STALE and NOISY where they apply."""
    marks = ["-" if row["met"] is None else "met" if row["met"] else "**missed**"]
    marks += ["STALE" for _ in [row["stale"]] if row["stale"]]
    marks += ["NOISY" for _ in [row["noisy"]] if row["noisy"]]
    return ", ".join(marks)


def _shown(value: Any, unit: str) -> str:
    return f"{value:,} {unit}" if isinstance(value, (int, float)) else str(value)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The comparison table: every figure, its verdict, commit, date and load."""
    lines = ["| comparison | sparkdist | reference | ratio | target | verdict | commit | date "
             "| load (1 min) |", "|---|---:|---:|---:|---|---|---|---|---|"]
    lines += [f"| {r['comparison']} | {_shown(r['sparkdist'], r['unit'])} | "
              f"{_shown(r['reference'], r['unit'])} | {r['ratio']} | {r['target']} | "
              f"{verdict(r)} | {r['commit']} | {r['date']} | {r['load']} |" for r in rows]
    return "\n".join(lines) + "\n"


def page(rows: list[dict[str, Any]], results: dict[str, tuple[dict[str, Any], Path]]) -> str:
    """docs/performance.md: the published results, the runs that are not results, and what
    each benchmark measures."""
    quiet = [r for r in rows if not r["noisy"]]
    loud = [r for r in rows if r["noisy"]]
    parts = [PAGE_HEAD.format(load=NOISY_LOAD, others=f"{NOISY_OTHERS:.0%}"), "## Results", "",
             markdown(quiet) if quiet else "No benchmark run on this code was quiet "
             "enough to publish: every stored run is listed below as noise.\n",
             "![sparkdist against the tools it replaces](../bench/results/latest.png)", "",
             "## Runs that are not results (NOISY)", "",
             "Measured on a busy machine, or with no record of the load: listed so that nothing is "
             "hidden, not to be quoted.",
             "", markdown(loud) if loud else "None.\n", "## Each benchmark's run",
             ""]
    for name in results:
        first = next((r for r in rows if r["benchmark"] == name), None)
        if first:
            reasons = "; ".join(x for x in (first["stale"], first["noisy"]) if x) or "-"
            paths = measured_paths(name)
            measured = [p for p in paths if not p.startswith(":(exclude)")]
            but = [p.removeprefix(":(exclude)") for p in paths if p not in measured]
            parts.append(f"- `bench/{name}.py` (measures {', '.join(measured)}"
                         + (f"; not {', '.join(but)}" if but else "") + ") "
                         f"on {machine(results[name][0])}: "
                         f"{reasons}")
    parts += ["", "## Definitions", ""]
    for name, (figures, _) in results.items():
        parts.append(f"### {name}\n")
        parts.append(f"{summary(name)}\n")
        if figures.get("definition"):
            parts.append(f"{figures['definition']}\n")
        for r in rows:
            if r["benchmark"] == name and r["definition"]:
                parts.append(f"- {r['comparison']}: {r['definition']}")
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


PAGE_HEAD = """# Performance

<!-- Generated by bench/report.py from bench/results/*.json: do not edit; run `make docs`. -->

Each ratio is sparkdist's figure over a reference measured in the same process, on the same
cached data, both sides timed by wall clock on the driver around the whole call, median of 3
after a warm-up, the sides alternating (`make bench` runs them all; `bench/results/*.json`
holds each figure's definition next to it; the analysis of earlier runs is in
[performance-notes.md](performance-notes.md)).

Every figure carries the commit it was measured on, the date, and the 1-minute load average
during the run (at the start and the highest sample) with the busiest other process's share of
a core where the run recorded it:

- **STALE**: code the benchmark measures (its `MEASURES`) changed since that commit, or was
  uncommitted when it ran: the figure describes older code.
- **NOISY**: the load exceeded {load} before the run started (or at any sample, for runs that
  did not record other processes), another process used more than {others} of a core during
  it, or the run recorded no load at all (it cannot show that the machine was quiet): the run
  is listed below the results, never as one.
- verdict **missed**: the figure as measured, against a target that was not changed after
  the miss.
"""


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    """Every ratio as "times better than the reference" (> 1: sparkdist better), log scale:
    green met, red missed, blue no target; a black tick marks the target; hatched STALE,
    faded NOISY."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # accuracy and AUC rows compare to a target by a difference or a level, not a ratio, and
    # a studies row is the share of studies that finished
    shown = [r for r in rows if r["unit"] not in ("accuracy", "AUC", "syncs", "difference",
                                                  "studies")
             and isinstance(r["ratio"], (int, float)) and r["ratio"] > 0][::-1]
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(shown) + 2))
    for y, r in enumerate(shown):
        value = better(r, float(r["ratio"]))
        colour = {True: "#55a868", False: "#c44e52", None: "#4c72b0"}[r.get("met")]
        ax.barh(y, value, color=colour, alpha=0.35 if r.get("noisy") else 1.0,
                hatch="//" if r.get("stale") else None, edgecolor="white")
        right = value
        if r.get("met") is not None:
            target = better(r, float(str(r["target"]).split()[-1]))
            ax.plot([target, target], [y - 0.42, y + 0.42], color="black", linewidth=2)
            right = max(value, target * 1.03)  # the label clear of the tick
        marks = " ".join(m for m, on in (("STALE", r.get("stale")), ("NOISY", r.get("noisy")))
                         if on)
        ax.text(right, y, f" {value:.2f}x {marks}", va="center", fontsize=8)
    ax.set_yticks(range(len(shown)),
                  [textwrap.fill(r["comparison"], 70) for r in shown], fontsize=7)
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")  # 0.1x to 20x: equal factors look equal
    ax.set_xlabel("times better than the reference (log scale; > 1: sparkdist better; "
                  "black tick: target)")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color="#55a868", label="target met"),
                       Patch(color="#c44e52", label="target missed"),
                       Patch(color="#4c72b0", label="no target"),
                       Patch(facecolor="#4c72b0", hatch="//", edgecolor="white",
                             label="STALE: measured code changed since"),
                       Patch(color="#4c72b0", alpha=0.35, label="NOISY: busy machine, not a "
                             "result")], loc="upper center", bbox_to_anchor=(0.5, -0.04 -
                             0.9 / (len(shown) + 4)), ncol=3, fontsize=8, frameon=False)
    ax.set_title("sparkdist against the tools it replaces: green met, red missed, blue no "
                 "target;\nhatched STALE (code changed since), faded NOISY (busy machine)",
                 fontsize=10)
    fig.savefig(path, dpi=100, bbox_inches="tight")  # tight: no label or title cut off
    plt.close(fig)


def machine(figures: dict[str, Any]) -> str:
    """The machine a result names (its own line, else its provenance's host)."""
    return str(figures.get("machine") or figures.get("provenance", {}).get("host")
               or "an unrecorded machine")


def better(row: dict[str, Any], value: float) -> float:
    """``value`` (a ratio or target of ``row``) as times better than the reference."""
    return 1 / value if row["better"] == "lower" else value


def publish(results: dict[str, tuple[dict[str, Any], Path]]) -> str:
    """Write latest.{json,md,png} and docs/performance.md from the stored results."""
    for name, (figs, path) in results.items():
        if "provenance" not in figs:  # an older result: keep what git says of it, once
            figs["provenance"] = provenance(name, figs, path)
            (RESULTS / f"{name}.json").write_text(json.dumps(figs) + "\n")
    figures = {name: figs for name, (figs, _) in results.items()}
    rows = judged(table(figures), results)
    LATEST.write_text(json.dumps({"table": rows, "benchmarks": figures}, indent=1) + "\n")
    text = markdown(rows)
    (RESULTS / "latest.md").write_text(text)
    chart(rows, RESULTS / "latest.png")
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text(page(rows, results))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="comma-separated subset of " + ",".join(SCRIPTS))
    parser.add_argument("--page", action="store_true",
                        help="run nothing: rewrite the report and docs/performance.md")
    args = parser.parse_args()
    names = [] if args.page else args.only.split(",") if args.only else list(SCRIPTS)
    RESULTS.mkdir(exist_ok=True)
    for name in names:  # each result replaces its file, which the page then reads
        (RESULTS / f"{name}.json").write_text(json.dumps(run(name)) + "\n")
    print(publish(stored()))
    print("written: bench/results/latest.{json,md,png}, docs/performance.md")


if __name__ == "__main__":
    main()
