"""Sample data with a known ground truth: churn (logistic), ratings (low-rank) and a
non-linear problem for networks.

The ``make_*`` functions return pandas DataFrames (no Spark needed); :func:`churn` and
:func:`ratings` return Spark DataFrames. ``python -m sparkdist.datasets DIR`` writes the
committed samples in ``data/``.

Examples
--------
>>> df = churn(spark, n=1_000, seed=0)
>>> df.columns[:3]
['customer_id', 'signup_ts', 'plan']
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CHURN_LABEL = "cancelled_within_week"
CHURN_COUNTS = ["month_interaction_count", "week_interaction_count", "day_interaction_count"]
#: The true logit: intercept + sum(coefficient * value); plan is relative to "standard".
CHURN_INTERCEPT = 1.0
CHURN_COEFFICIENTS = {
    "month_interaction_count": -0.04,
    "week_interaction_count": -0.12,
    "day_interaction_count": -0.45,
    "plan=basic": 0.6,
    "plan=premium": -0.6,
}
PLANS = {"basic": 0.5, "standard": 0.35, "premium": 0.15}
REGIONS = ["east", "north", "south", "west"]  # no effect on churn: a distractor


def make_churn(n: int = 10_000, seed: int = 0) -> pd.DataFrame:
    """Customers with interaction counts, plan, region and a logistic churn label."""
    rng = np.random.default_rng(seed)
    month = rng.poisson(rng.gamma(2.0, 15.0, n))
    week = rng.binomial(month, 0.25)
    day = rng.binomial(week, 0.2)
    plan = rng.choice(list(PLANS), size=n, p=list(PLANS.values()))
    logit = (CHURN_INTERCEPT
             + CHURN_COEFFICIENTS["month_interaction_count"] * month
             + CHURN_COEFFICIENTS["week_interaction_count"] * week
             + CHURN_COEFFICIENTS["day_interaction_count"] * day
             + np.select([plan == "basic", plan == "premium"],
                         [CHURN_COEFFICIENTS["plan=basic"], CHURN_COEFFICIENTS["plan=premium"]]))
    label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype("int32")
    signup = pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 365 * 86400, n), "s")
    return pd.DataFrame({
        "customer_id": [f"C{i:07d}" for i in range(n)],
        "signup_ts": signup,
        "plan": plan,
        "region": rng.choice(REGIONS, size=n),
        "month_interaction_count": month.astype("int32"),
        "week_interaction_count": week.astype("int32"),
        "day_interaction_count": day.astype("int32"),
        CHURN_LABEL: label,
    })


def make_ratings(n_users: int = 300, n_items: int = 120, rank: int = 4, density: float = 0.1,
                 noise: float = 0.25, seed: int = 0, string_ids: bool = True) -> pd.DataFrame:
    """Explicit ratings ``3 + u.v + noise`` clipped to [1, 5], from rank-``rank`` factors.

    Every user rates at least 3 items. ``string_ids`` gives ids like ``"u00042"``/``"i0007"``,
    otherwise ints. ``user_factors``/``item_factors`` are in ``df.attrs`` for checks.
    """
    rng = np.random.default_rng(seed)
    users = rng.normal(0.0, 1.0, (n_users, rank)) / rank**0.25
    items = rng.normal(0.0, 1.0, (n_items, rank)) / rank**0.25
    per_user = np.maximum(3, rng.binomial(n_items, density, n_users))
    u = np.repeat(np.arange(n_users), per_user)
    i = np.concatenate([rng.choice(n_items, k, replace=False) for k in per_user])
    true = 3.0 + np.einsum("ij,ij->i", users[u], items[i])
    rating = np.clip(true + rng.normal(0.0, noise, len(u)), 1.0, 5.0)
    ts = pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 365 * 86400, len(u)), "s")
    df = pd.DataFrame({
        "user_id": [f"u{k:05d}" for k in u] if string_ids else u.astype("int64"),
        "item_id": [f"i{k:04d}" for k in i] if string_ids else i.astype("int64"),
        "rating": rating.astype("float32"),
        "ts": ts,
    })
    df.attrs.update(user_factors=users, item_factors=items)
    return df


def make_nonlinear(n: int = 4000, seed: int = 0, dim: int = 8) -> pd.DataFrame:
    """``features`` (float32 arrays of ``dim``) and a 0/1 ``label`` from an interaction, a
    sine and a linear term: a linear model tops out near 0.75 accuracy, an MLP nears 0.95."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, max(dim, 4))).astype("float32")
    y = (x[:, 0] * x[:, 1] + np.sin(2 * x[:, 2]) + 0.3 * x[:, 3] > 0).astype("float32")
    return pd.DataFrame({"features": list(x), "label": y})


def churn(spark: SparkSession | None = None, n: int = 10_000, seed: int = 0,
          partitions: int | None = None) -> DataFrame:
    """:func:`make_churn` as a Spark DataFrame."""
    return _to_spark(make_churn(n, seed), spark, partitions)


def ratings(spark: SparkSession | None = None, partitions: int | None = None,
            **kwargs: object) -> DataFrame:
    """:func:`make_ratings` as a Spark DataFrame (same keyword arguments)."""
    return _to_spark(make_ratings(**kwargs), spark, partitions)  # type: ignore[arg-type]


def _to_spark(pdf: pd.DataFrame, spark: SparkSession | None,
              partitions: int | None) -> DataFrame:
    from sparkdist.session import get_spark

    pdf = pdf.copy()
    pdf.attrs = {}  # factor arrays are for local checks, not for Arrow metadata
    df = (spark or get_spark()).createDataFrame(pdf)
    return df.repartition(partitions) if partitions else df


def write_samples(directory: str | Path) -> list[Path]:
    """Write the committed samples (Parquet, seed 0) into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    samples = {"churn_sample.parquet": make_churn(5_000, seed=0),
               "ratings_sample.parquet": make_ratings(density=0.3, seed=0)}
    paths = []
    for name, pdf in samples.items():
        pdf.attrs = {}
        pdf.to_parquet(out / name, index=False, coerce_timestamps="us")
        paths.append(out / name)
    return paths


if __name__ == "__main__":
    for written in write_samples(sys.argv[1] if len(sys.argv) > 1 else "data"):
        print(written)
