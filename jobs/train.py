"""Train the churn model: `python jobs/train.py` or `spark-submit jobs/train.py [options]`.

Reads the churn Parquet sample (or generates rows when --rows is given), runs
sparkdist.workflows.churn_baseline and prints the test metrics, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parent.parent / "data" / "churn_sample.parquet"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="train", description=__doc__)
    parser.add_argument("--data", default=str(DEFAULT_DATA),
                        help="churn data (Parquet path or URL); default: the committed sample")
    parser.add_argument("--rows", type=int, default=None,
                        help="generate this many churn rows instead of reading --data")
    parser.add_argument("--seed", type=int, default=42, help="split and generator seed")
    parser.add_argument("--max-iter", type=int, default=10, help="LogisticRegression maxIter")
    parser.add_argument("--save", default=None, help="save the fitted PipelineModel here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from sparkdist.datasets import churn
    from sparkdist.session import get_spark
    from sparkdist.workflows import churn_baseline

    spark = get_spark(app_name="sparkdist-train")
    df = churn(spark, n=args.rows, seed=args.seed) if args.rows else spark.read.parquet(args.data)
    result = churn_baseline(df, seed=args.seed, max_iter=args.max_iter)
    if args.save:
        result.model.write().overwrite().save(args.save)
    counts = result.split["counts"]
    print(f"churn logistic regression: train {counts['train']} rows, test {counts['test']} rows")
    print(f"  test AUC      {result.metrics['auc']:.4f}")
    print(f"  test accuracy {result.metrics['accuracy']:.4f}")
    print(json.dumps({"metrics": result.metrics, "split": result.split}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
