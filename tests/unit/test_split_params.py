"""Split parameter validation and column-name suggestions: pure Python, no SparkSession."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from sparkdist.columns import require_columns, suggest
from sparkdist.datasets import CHURN_COUNTS, CHURN_LABEL
from sparkdist.exceptions import ParamError, SchemaError, SparkdistError
from sparkdist.features.split import _check_fractions

#: The fix every fractions error shows.
EXAMPLE = "fractions={'train': 0.8, 'test': 0.2}"
CHURN_COLUMNS = ["customer_id", "signup_ts", "plan", "region", *CHURN_COUNTS, CHURN_LABEL]

BAD_FRACTIONS = {
    "negative": {"train": 1.2, "test": -0.2},
    "zero": {"train": 1.0, "test": 0.0},
    "nan": {"train": float("nan"), "test": 0.2},
    "inf": {"train": float("inf"), "test": 0.2},
    "not-a-number": {"train": "0.8", "test": 0.2},
    "none-value": {"train": 0.8, "test": None},
    "sum-below-1": {"train": 0.7, "test": 0.2},
    "sum-above-1": {"train": 0.8, "test": 0.3},
    "three-not-summing": {"train": 0.6, "valid": 0.2, "test": 0.1},
    "one-entry": {"train": 1.0},
    "empty": {},
    "list": [0.8, 0.2],
    "pairs": [("train", 0.8), ("test", 0.2)],
    "string": "train",
    "none": None,
}


@pytest.mark.parametrize("fractions", list(BAD_FRACTIONS.values()), ids=list(BAD_FRACTIONS))
def test_bad_fractions_raise_param_error_with_example(fractions):
    with pytest.raises(ParamError) as info:
        _check_fractions(fractions)
    err = info.value
    assert isinstance(err, ValueError)
    assert isinstance(err, SparkdistError)
    message = str(err)
    assert "fractions" in message
    assert EXAMPLE in message


@pytest.mark.parametrize(
    ("fractions", "bad_name"),
    [({"train": 1.2, "test": -0.2}, "test"), ({"train": 0.0, "test": 1.0}, "train"),
     ({"train": 0.5, "holdout": float("nan")}, "holdout")],
)
def test_fraction_error_names_the_offending_split(fractions, bad_name):
    with pytest.raises(ParamError, match=rf"fractions\['{bad_name}'\]"):
        _check_fractions(fractions)


def test_sum_error_reports_the_actual_sum():
    with pytest.raises(ParamError) as info:
        _check_fractions({"train": 0.8, "test": 0.3})
    assert "sum to 1.1" in str(info.value)


def test_fewer_than_two_entries_says_so():
    with pytest.raises(ParamError, match="at least two"):
        _check_fractions({"train": 1.0})


@pytest.mark.parametrize(
    "fractions",
    [
        {"train": 0.8, "test": 0.2},
        {"test": 0.2, "train": 0.8},  # order is the caller's, not alphabetical
        {"train": 0.7, "valid": 0.1, "test": 0.2},  # sums to 1 only up to rounding
        {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4},
        {"left": 1, "right": 1e-12, "rest": 1e-12},  # ints accepted, sum within 1e-6
    ],
)
def test_valid_fractions_return_names_and_fractions_in_order(fractions):
    names, fracs = _check_fractions(fractions)
    assert names == list(fractions)
    assert fracs == [float(v) for v in fractions.values()]
    assert all(isinstance(f, float) for f in fracs)


def test_numpy_float32_fractions_are_numbers():
    fractions = {"train": np.float32(0.75), "test": np.float32(0.25)}
    assert _check_fractions(fractions) == (["train", "test"], [0.75, 0.25])


def test_numpy_float64_fractions_accepted():
    names, fracs = _check_fractions({"train": np.float64(0.75), "test": np.float64(0.25)})
    assert (names, fracs) == (["train", "test"], [0.75, 0.25])


# -- suggest / require_columns ---------------------------------------------------------------
def test_suggest_finds_close_column():
    assert suggest("week_interactions_count", CHURN_COLUMNS) == (
        " Did you mean 'week_interaction_count'?")


def test_suggest_is_case_insensitive_but_returns_original_spelling():
    assert suggest("PLAN", CHURN_COLUMNS) == " Did you mean 'plan'?"
    assert suggest("Cancelled_Within_Weak", CHURN_COLUMNS) == (
        f" Did you mean '{CHURN_LABEL}'?")


@pytest.mark.parametrize("garbage", ["zzqx_9", "", "42", "@@@@@@@@@@@@"])
def test_suggest_returns_empty_for_garbage(garbage):
    assert suggest(garbage, CHURN_COLUMNS) == ""


def test_suggest_with_no_choices():
    assert suggest("plan", []) == ""
    assert suggest("plan", iter([])) == ""


def test_require_columns_names_param_column_and_suggestion():
    schema = StructType([StructField("customer_id", StringType()),
                         StructField("week_interaction_count", IntegerType())])
    require_columns(schema, ["customer_id", "week_interaction_count"], "keyCols")  # no error
    with pytest.raises(SchemaError) as info:
        require_columns(schema, ["customer_id", "week_interactions_count"], "numericCols")
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert message.startswith("numericCols: column 'week_interactions_count'")
    assert "Did you mean 'week_interaction_count'?" in message
    assert "customer_id" in message  # lists the available columns
