"""Split + feature assembly throughput: sparkdist vs plain VectorAssembler + randomSplit.

Both sides read the same cached churn DataFrame, split it 80/20, assemble the three
interaction counts and write every assembled row to Spark's no-op sink; each side runs
--repeats times and the median counts. Prints one JSON line (rows/s and the time ratio).

    python bench/split_assembly.py [--rows 500000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from pyspark.ml.feature import VectorAssembler
from pyspark.sql import DataFrame

from sparkdist.datasets import CHURN_COUNTS, CHURN_LABEL, churn
from sparkdist.features import FeatureAssembler, split
from sparkdist.session import get_spark


def sparkdist_side(df: DataFrame) -> None:
    parts = split(df, {"train": 0.8, "test": 0.2}, seed=42, keyCols=["customer_id"])
    model = FeatureAssembler(numericCols=CHURN_COUNTS, labelCol=CHURN_LABEL).fit(parts["train"])
    for name in ("train", "test"):
        model.transform(parts[name]).select("features", CHURN_LABEL).write.format("noop").mode(
            "overwrite").save()


def reference_side(df: DataFrame) -> None:
    train, test = df.randomSplit([0.8, 0.2], seed=42)
    assembler = VectorAssembler(inputCols=CHURN_COUNTS, outputCol="features")
    for part in (train, test):
        assembler.transform(part).select("features", CHURN_LABEL).write.format("noop").mode(
            "overwrite").save()


def median_seconds(fn, df: DataFrame, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(df)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spark = get_spark(master=os.environ.get("SPARKDIST_MASTER", "local[2]"),
                      conf={"spark.ui.enabled": "false"})
    df = churn(spark, n=args.rows, seed=0, partitions=4).cache()
    df.count()
    sparkdist_side(df)  # warm-up: JIT and Python workers, for both sides alike
    reference_side(df)
    ours = median_seconds(sparkdist_side, df, args.repeats)
    ref = median_seconds(reference_side, df, args.repeats)
    print(json.dumps({
        "benchmark": "split_assembly", "rows": args.rows, "repeats": args.repeats,
        "sparkdist_s": round(ours, 3), "reference_s": round(ref, 3),
        "sparkdist_rows_per_s": round(args.rows / ours),
        "reference_rows_per_s": round(args.rows / ref),
        "time_ratio": round(ours / ref, 3),
        "machine": f"{os.cpu_count()} cores, {platform.python_version()}, "
                   f"Spark {spark.version}, master {spark.sparkContext.master}",
    }))


if __name__ == "__main__":
    main()
