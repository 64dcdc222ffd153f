"""Split + feature assembly throughput: sparkdist vs plain VectorAssembler + randomSplit.

Both sides read the same cached churn DataFrame, split it 80/20, assemble the three
interaction counts and write every assembled row to Spark's no-op sink; each side runs
--repeats times (alternating, after one warm-up each) and the median counts. Prints one
JSON line (rows/s and the time ratio).

    python bench/split_assembly.py [--rows 500000] [--repeats 3]
"""

from __future__ import annotations

import argparse

from _common import alternating, machine, start_spark, write_result
from pyspark.ml.feature import VectorAssembler
from pyspark.sql import DataFrame

from sparkdist.datasets import CHURN_COUNTS, CHURN_LABEL, churn
from sparkdist.features import FeatureAssembler, split

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/features",)



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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spark = start_spark("sparkdist-bench-split-assembly")
    df = churn(spark, n=args.rows, seed=0, partitions=4).cache()
    df.count()
    # the warm-up (JIT and Python workers) and the timed calls alternate between the sides
    medians = alternating({"ours": lambda: sparkdist_side(df), "ref": lambda: reference_side(df)},
                          args.repeats)
    ours, ref = medians["ours"], medians["ref"]
    write_result("split_assembly", {
        "rows": args.rows, "repeats": args.repeats,
        "sparkdist_s": round(ours, 3), "reference_s": round(ref, 3),
        "sparkdist_rows_per_s": round(args.rows / ours),
        "reference_rows_per_s": round(args.rows / ref),
        "time_ratio": round(ours / ref, 3), "machine": machine(spark)})


if __name__ == "__main__":
    main()
