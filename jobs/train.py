"""Train the models of a workflow config: `spark-submit jobs/train.py [CONFIG] [--no-tracking]
[--import MODULE ...]`.

With CONFIG: the same workflow as `sparkdist train CONFIG` (the comparison table, then the
result as one JSON line); the modules that define your own classes are named in the config
(`imports: [mypkg.nets]`) or by `--import`, and shipped to the executors with `--py-files`.
Without: the make demo, every model family in one Spark session:
jobs/configs/churn.yaml (logistic regression, random forest, XGBoost and an MLP trained by
TorchEstimator on 2 Spark tasks), then jobs/configs/ratings_als.yaml (ALS: RMSE and
ranking@10). It prints sparkdist's progress lines, then a report: each job's comparison table
and its MLflow run.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).resolve().parent / "configs"
DEMO_CONFIGS = (CONFIGS / "churn.yaml", CONFIGS / "ratings_als.yaml")


def main(argv: list[str] | None = None) -> int:
    from sparkdist.cli import main as cli

    argv = list(sys.argv[1:] if argv is None else argv)
    if [a for a in argv if not a.startswith("-")]:
        return cli(["train", *argv])
    unknown = [a for a in argv if a != "--no-tracking"]
    if unknown:
        print(f"jobs/train.py: unknown option {unknown[0]} (usage: jobs/train.py [CONFIG] "
              "[--no-tracking])", file=sys.stderr)
        return 2
    return demo(tracking="--no-tracking" not in argv)


def demo(tracking: bool = True) -> int:
    """Run :data:`DEMO_CONFIGS` one after the other; print the report at the end."""
    from sparkdist.config import load_config
    from sparkdist.exceptions import SparkdistError
    from sparkdist.launch.barrier import ENV_QUIET_RANKS
    from sparkdist.workflows import run

    # Local tasks print on this console: the ranks' log lines would repeat the progress lines
    # (they are kept for the error report). Set before the JVM starts: its tasks inherit it.
    os.environ.setdefault(ENV_QUIET_RANKS, "1")
    start = time.perf_counter()

    def progress(job: str) -> Any:
        return lambda line: print(f"{time.perf_counter() - start:6.1f}s  {job}: {line}",
                                  flush=True)

    results = []
    try:
        for path in DEMO_CONFIGS:
            config = load_config(path)
            if not tracking:
                config.tracking.enabled = False
            results.append((path, run(config, progress=progress(config.name))))
    except SparkdistError as err:
        print(f"jobs/train.py: {err}", file=sys.stderr)
        return 2
    print(report(results, time.perf_counter() - start))
    return 0


def report(results: list[tuple[Path, Any]], seconds: float) -> str:
    """Each job's split, comparison table and MLflow run."""
    from sparkdist import tracking

    lines = ["", f"sparkdist demo: {len(results)} jobs, "
             f"{sum(len(r.models) for _, r in results)} models in {seconds:.0f} s", ""]
    for path, result in results:
        counts = ", ".join(f"{name} {n}" for name, n in result.split["counts"].items())
        lines += [f"{result.config.name} ({path.relative_to(CONFIGS.parent.parent)}): "
                  f"{result.split['method']} split, rows {counts}", result.table()]
        if result.run_id:
            lines.append(f"MLflow run {result.run_id} "
                         f"({tracking.tracking_uri(result.config.tracking.uri)})")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
