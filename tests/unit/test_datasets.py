"""Synthetic datasets: schema, determinism and the ground truth they claim (no Spark)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sparkdist import datasets
from sparkdist.datasets import (
    CHURN_COEFFICIENTS,
    CHURN_COUNTS,
    CHURN_INTERCEPT,
    CHURN_LABEL,
    PLANS,
    REGIONS,
    make_churn,
    make_ratings,
)


# -- churn -----------------------------------------------------------------------------------
def test_make_churn_schema_and_dtypes(seed):
    n = 3_000
    df = make_churn(n, seed=seed)
    assert list(df.columns) == ["customer_id", "signup_ts", "plan", "region", *CHURN_COUNTS,
                                CHURN_LABEL]
    assert len(df) == n
    assert pd.api.types.is_string_dtype(df["customer_id"])
    assert pd.api.types.is_datetime64_ns_dtype(df["signup_ts"])
    for col in [*CHURN_COUNTS, CHURN_LABEL]:
        assert df[col].dtype == np.int32, col
    assert df["customer_id"].is_unique
    assert set(df["plan"]) == set(PLANS)
    assert set(df["region"]) == set(REGIONS)
    assert set(df[CHURN_LABEL]) == {0, 1}
    assert df["signup_ts"].between(pd.Timestamp("2024-01-01"), pd.Timestamp("2025-01-01"),
                                   inclusive="left").all()
    month, week, day = (df[c] for c in CHURN_COUNTS)
    assert (day >= 0).all() and (day <= week).all() and (week <= month).all()


def test_make_churn_plan_mix_matches_plans(seed):
    shares = make_churn(50_000, seed=seed)["plan"].value_counts(normalize=True)
    for plan, share in PLANS.items():
        assert shares[plan] == pytest.approx(share, abs=0.01), plan


def test_make_churn_is_deterministic(seed):
    first = make_churn(2_000, seed=seed)
    pd.testing.assert_frame_equal(first, make_churn(2_000, seed=seed))
    other = make_churn(2_000, seed=seed + 1)
    assert not first.equals(other)
    assert not np.array_equal(first["month_interaction_count"], other["month_interaction_count"])
    assert not np.array_equal(first[CHURN_LABEL], other[CHURN_LABEL])


def test_make_churn_label_rate(seed):
    rate = make_churn(10_000, seed=seed)[CHURN_LABEL].mean()
    assert 0.1 < rate < 0.5


def test_make_churn_recovers_ground_truth_coefficients(seed):
    from sklearn.linear_model import LogisticRegression

    df = make_churn(50_000, seed=seed)
    # Plan is one-hot with "standard" as the baseline, as CHURN_COEFFICIENTS are defined.
    names = [*CHURN_COUNTS, "plan=basic", "plan=premium"]
    X = np.column_stack([df[c].to_numpy(float) for c in CHURN_COUNTS]
                        + [(df["plan"] == p).to_numpy(float) for p in ("basic", "premium")])
    fit = LogisticRegression(C=1e10, max_iter=10_000).fit(X, df[CHURN_LABEL])
    assert set(CHURN_COEFFICIENTS) == set(names)
    for name, estimate in zip(names, fit.coef_[0]):
        tolerance = 0.01 if name == "month_interaction_count" else 0.1
        assert estimate == pytest.approx(CHURN_COEFFICIENTS[name], abs=tolerance), name
    assert fit.intercept_[0] == pytest.approx(CHURN_INTERCEPT, abs=0.15)


def test_region_is_a_distractor(seed):
    df = make_churn(50_000, seed=seed)
    rates = df.groupby("region")[CHURN_LABEL].mean()
    assert rates.max() - rates.min() < 0.03


# -- ratings ---------------------------------------------------------------------------------
def test_make_ratings_ranges_and_coverage(seed):
    n_users, n_items = 300, 120
    df = make_ratings(n_users=n_users, n_items=n_items, seed=seed)
    assert list(df.columns) == ["user_id", "item_id", "rating", "ts"]
    assert df["rating"].dtype == np.float32
    assert df["rating"].between(1.0, 5.0).all()
    per_user = df.groupby("user_id").size()
    assert len(per_user) == n_users  # every user appears
    assert per_user.min() >= 3
    assert not df.duplicated(["user_id", "item_id"]).any()
    assert df["item_id"].nunique() <= n_items
    assert df.attrs["user_factors"].shape == (n_users, 4)
    assert df.attrs["item_factors"].shape == (n_items, 4)


def test_make_ratings_sparse_still_gives_three_per_user(seed):
    df = make_ratings(n_users=200, n_items=50, density=0.005, seed=seed)
    assert df.groupby("user_id").size().min() >= 3
    assert not df.duplicated(["user_id", "item_id"]).any()


def test_make_ratings_follow_low_rank_truth(seed):
    df = make_ratings(seed=seed, string_ids=False)
    users, items = df.attrs["user_factors"], df.attrs["item_factors"]
    truth = np.clip(3.0 + np.einsum("ij,ij->i", users[df["user_id"]], items[df["item_id"]]),
                    1.0, 5.0)
    residual = df["rating"].to_numpy(float) - truth
    assert np.sqrt(np.mean(residual**2)) < 0.3  # noise=0.25, clipping only shrinks it


def test_make_ratings_string_vs_int_ids(seed):
    as_str = make_ratings(seed=seed, string_ids=True)
    as_int = make_ratings(seed=seed, string_ids=False)
    assert as_str["user_id"].str.fullmatch(r"u\d{5}").all()
    assert as_str["item_id"].str.fullmatch(r"i\d{4}").all()
    assert as_int["user_id"].dtype == np.int64
    assert as_int["item_id"].dtype == np.int64
    # Same draws, only the id spelling differs.
    assert (as_str["user_id"] == as_int["user_id"].map(lambda k: f"u{k:05d}")).all()
    assert (as_str["item_id"] == as_int["item_id"].map(lambda k: f"i{k:04d}")).all()
    np.testing.assert_array_equal(as_str["rating"], as_int["rating"])


def test_make_ratings_is_deterministic(seed):
    pd.testing.assert_frame_equal(make_ratings(seed=seed), make_ratings(seed=seed))
    assert not make_ratings(seed=seed)["rating"].equals(make_ratings(seed=seed + 1)["rating"])


def test_write_samples(tmp_path):
    paths = datasets.write_samples(tmp_path / "data")
    assert [p.name for p in paths] == ["churn_sample.parquet", "ratings_sample.parquet"]
    churn = pd.read_parquet(paths[0])
    pd.testing.assert_frame_equal(churn, make_churn(5_000, seed=0), check_dtype=False)
