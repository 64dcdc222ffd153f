"""Run every benchmark in bench/ and write the report: ``bench/results/latest.json`` (all
figures plus the comparison table), ``latest.md`` (the table, as the README shows it) and
``latest.png`` (one chart: each ratio against its target).

Each benchmark runs as its own process (its own SparkSession) and prints one JSON line; a
ratio is always measured against a reference run in the same process, on the same data, so
the figures compare tools rather than machines.

    python bench/report.py                   # what `make bench` runs
    python bench/report.py --only classical  # rerun one; the others' figures are kept
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
LATEST = RESULTS / "latest.json"
SCRIPTS = ("split_assembly", "classical", "deep", "parallel", "communication", "quantization")


def run(name: str) -> dict[str, Any]:
    """The JSON line the benchmark printed last."""
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


def table(figures: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per comparison: what, sparkdist's figure, the reference's, ratio, target."""
    rows: list[dict[str, Any]] = []

    def row(what: str, ours: Any, reference: Any, ratio: float, target: str,
            unit: str = "s") -> None:
        rows.append({"comparison": what, "sparkdist": ours, "reference": reference,
                     "unit": unit, "ratio": ratio, "target": target})

    if "split_assembly" in figures:
        f = figures["split_assembly"]
        row(f"FeatureAssembler + split vs VectorAssembler + randomSplit ({f['rows']:,} rows)",
            f["sparkdist_s"], f["reference_s"], f["time_ratio"], "-")
    if "classical" in figures:
        f = figures["classical"]
        for key, what, target in (
                ("logistic_regression", "LogisticRegression vs MLlib", "<= 1.05"),
                ("random_forest", "RandomForestClassifier vs MLlib", "<= 1.05"),
                ("xgboost", "XGBoostClassifier vs xgboost.spark", "<= 1.05"),
                ("als", "ALS vs MLlib", "<= 1.10")):
            row(f"{what}, fit time", f[key]["sparkdist_s"], f[key]["wrapped_s"],
                f[key]["ratio"], target)
        _allreduce_rows(f.get("logistic_regression_allreduce", {}), row)
        single = f["xgboost_2_workers_vs_single_process"]
        row("XGBoost on 2 Spark workers vs single-process xgboost, fit time",
            single["distributed_s"], single["single_s"], single["time_ratio"], "-")
    if "deep" in figures:
        _deep_rows(figures["deep"], row)
    if "parallel" in figures:
        _parallel_rows(figures["parallel"], row)
    if "communication" in figures:
        _communication_rows(figures["communication"], row)
    if "quantization" in figures:
        _quantization_rows(figures["quantization"], row)
    return rows


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
            f"difference {side['logloss_difference']:.0e})", side["allreduce_s"],
            side["mllib_s"], round(side["allreduce_s"] / side["mllib_s"], 3), "<= 0.33")
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
        if best and best["mode"]:
            straggler = f[key]["per_mode"]
            row(f"One rank slowed 2x, {model}: best mode ({best['mode']}) vs fp32 DDP, time "
                "to accuracy", straggler[best["mode"]]["time_to_accuracy_s"],
                straggler["fp32"]["time_to_accuracy_s"], best["ratio"], best["target"])


def _quantization_rows(f: dict[str, Any], row: Any) -> None:
    """bench/quantization.py: int8 scoring against float32."""
    size, accuracy = f["size"], f["accuracy"]
    row("TorchModel int8 vs float32, saved network size", size["int8_bytes"],
        size["fp32_bytes"], size["int8_to_fp32"], "-", "bytes")
    row("TorchModel int8 vs float32, test accuracy (difference in points)",
        accuracy["int8"], accuracy["fp32"], accuracy["difference_pp"],
        accuracy["target_pp"], "accuracy")
    for kind in ("warm", "cold"):
        side = f[kind]
        row(f"TorchModel int8 vs float32 transform, rows/s, {kind} (speed-up)",
            side["int8_rows_per_s"], side["fp32_rows_per_s"], side["int8_speedup"], "-",
            "rows/s")


def _deep_rows(f: dict[str, Any], row: Any) -> None:
    """bench/deep.py's figures; one whose ratio could not be measured is left out."""
    def ok(key: str) -> dict | None:
        value = f.get(key)
        return value if isinstance(value, dict) and value.get("ratio") is not None else None

    if feed := ok("feed"):
        row(f"TorchEstimator 1-epoch fit vs bare barrier mapInArrow (same vector_to_array, "
            f"float32 matrices), rows/s, {feed['rows']:,} rows", feed["fit_rows_per_s"],
            feed["bare_rows_per_s"], feed["ratio"], feed["target"], "rows/s")
    if memory := ok("memory"):
        row(f"TorchEstimator peak worker RSS, {memory['rows_4n']:,} vs {memory['rows_n']:,} "
            "rows", memory["peak_rss_mb_4n"], memory["peak_rss_mb_n"], memory["ratio"],
            memory["target"], "MiB")
    if scaling := ok("scaling"):
        ceiling, default = scaling["machine_ceiling"], scaling["batch_size_default"]
        for key, batch in (("at_defaults", default), ("batch_8192", 8192)):
            s = scaling[key]
            what = "defaults" if key == "at_defaults" else "batchSize 8192"
            row(f"TorchEstimator 2 workers vs 1, samples/s, {what} (batchSize {batch} per "
                f"worker; machine ceiling {ceiling[str(batch)]['ratio']})",
                s["samples_per_s_workers_2"], s["samples_per_s_workers_1"], s["ratio"],
                scaling["target"] if key == "at_defaults" else "-", "samples/s")
    if tta := ok("time_to_accuracy"):
        row(f"TorchEstimator 2 workers vs 1, time to {tta['threshold']} validation accuracy",
            tta["seconds_workers_2"], tta["seconds_workers_1"], tta["ratio"], tta["target"])
    if "overhead" in f and "error" not in f["overhead"]:
        for kind in ("cold", "warm"):
            o = f["overhead"][kind]
            row(f"TorchEstimator 1-step fit vs TorchDistributor.run, {kind}",
                o["sparkdist_s"], o["torch_distributor_s"], o["ratio"], o["target"])
        syncs = f["barrier_syncs"]["per_fit"]
        row("Spark barrier syncs per fit", syncs,
            f["overhead"]["warm"]["torch_distributor_barrier_syncs"], syncs, "<= 2", "syncs")
    if recovery := ok("recovery"):
        row("Recovery: extra time of a fit with a SIGKILLed worker vs (cold 1-step fit + one "
            "checkpoint interval)", recovery["extra_s"], recovery["budget_s"],
            recovery["ratio"], recovery["target"])


def markdown(rows: list[dict[str, Any]], machine: str, rerun: list[str] | None = None) -> str:
    how = (f"`python bench/report.py --only {','.join(rerun)}` (the other rows from the last "
           "full `make bench`)" if rerun else "`make bench`")
    lines = [f"Measured by {how} on {machine}.", "",
             "| comparison | sparkdist | reference | ratio | target |", "|---|---:|---:|---:|---|"]
    lines += [f"| {r['comparison']} | {r['sparkdist']:,} {r['unit']} | {r['reference']:,} "
              f"{r['unit']} | {r['ratio']} | {r['target']} |" for r in rows]
    return "\n".join(lines) + "\n"


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    """Horizontal bars of the ratios; a tick marks each target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 0.5 * len(rows) + 1.5))
    labels = [r["comparison"] for r in rows][::-1]
    ratios = [float(r["ratio"]) for r in rows][::-1]
    ax.barh(labels, ratios, color="#4c72b0")
    for y, r in enumerate(rows[::-1]):
        if r["target"] != "-":
            target = float(r["target"].split()[-1])
            ax.plot([target, target], [y - 0.4, y + 0.4], color="#c44e52", linewidth=2)
        ax.text(float(r["ratio"]), y, f" {r['ratio']}", va="center", fontsize=8)
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")  # ratios from 0.1 to 20: equal factors look equal
    ax.set_xlabel("ratio, log scale (sparkdist / reference; red tick: target)")
    ax.tick_params(axis="y", labelsize=8)
    ax.set_title("sparkdist against the tools it replaces (same run, same data)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="comma-separated subset of " + ",".join(SCRIPTS))
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(SCRIPTS)
    started = time.monotonic()
    fresh = {name: run(name) for name in names}
    # --only: the other benchmarks keep their figures from the last report
    kept = json.loads(LATEST.read_text())["benchmarks"] if args.only and LATEST.exists() else {}
    figures = {name: fresh[name] if name in fresh else kept[name] for name in SCRIPTS
               if name in fresh or name in kept}
    machine = (f"{os.cpu_count()} cores, Python {platform.python_version()}, "
               f"{platform.system()} {platform.machine()}, Spark local[2], no GPU")
    rows = table(figures)
    RESULTS.mkdir(exist_ok=True)
    report = {"machine": machine, "seconds": round(time.monotonic() - started, 1),
              "rerun": names if args.only else None, "table": rows, "benchmarks": figures}
    LATEST.write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(rows, machine, names if args.only else None)
    (RESULTS / "latest.md").write_text(text)
    chart(rows, RESULTS / "latest.png")
    print(text)
    print(f"total {report['seconds']} s; written: bench/results/latest.{{json,md,png}}")


if __name__ == "__main__":
    main()
