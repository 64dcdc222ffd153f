"""Column checks shared by every stage: existence with suggestions, type families, and
references to user-named columns that are safe for any name."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    IntegralType,
    NumericType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from sparkdist.exceptions import SchemaError


def suggest(name: str, choices: Iterable[str]) -> str:
    """Return " Did you mean 'x'?" for the closest choice, or "" when none is close."""
    choices = list(choices)
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" Did you mean '{by_lower[close[0]]}'?" if close else ""


def quoted(name: str) -> str:
    """``name`` as a backtick-quoted identifier, for APIs that parse names (``select("a.b")``
    reads a struct field, ``Window.partitionBy``, ``df[...]``)."""
    return "`" + name.replace("`", "``") + "`"


def col(name: str) -> Column:
    """The top-level column called ``name``, even when it holds ``.`` or a backtick (plain
    ``F.col`` reads ``a.b`` as field ``b`` of struct ``a``). Use it for every user-given name."""
    return F.col(quoted(name))


def require_columns(schema: StructType, names: Iterable[str], param: str) -> None:
    """Raise SchemaError for the first of ``names`` that ``schema`` lacks."""
    present = schema.fieldNames()
    for name in names:
        if name not in present:
            raise SchemaError(
                f"{param}: column '{name}' is not in the DataFrame.{suggest(name, present)} "
                f"Available columns: {present}."
            )


def is_numeric(dtype: DataType) -> bool:
    return isinstance(dtype, (NumericType, BooleanType))


def is_discrete(dtype: DataType) -> bool:
    """Types whose values are categories as they stand (no binning needed)."""
    return isinstance(dtype, (StringType, BooleanType, IntegralType))


def is_temporal(dtype: DataType) -> bool:
    return isinstance(dtype, (TimestampType, TimestampNTZType, DateType))
