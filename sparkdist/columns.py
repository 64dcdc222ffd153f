"""Checks shared by every stage: columns that exist (with suggestions), type families, Param
values from a fixed set, non-empty input, and references to user-named columns that are safe
for any name."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

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

from sparkdist.exceptions import ParamError, SchemaError


def suggest(name: str, choices: Iterable[str]) -> str:
    """Return " Did you mean 'x'?" for the closest choice, or "" when none is close."""
    choices = list(choices)
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" Did you mean '{by_lower[close[0]]}'?" if close else ""


def one_of_message(param: str, value: Any, allowed: Iterable[Any]) -> str:
    """``"param=value is not one of [...]."`` plus a "did you mean" for a near miss, for
    errors of any type (executor-side code raises its own).

    >>> one_of_message("nullPolicy", "skp", ("error", "skip", "impute"))
    "nullPolicy='skp' is not one of ['error', 'skip', 'impute']. Did you mean 'skip'?"
    """
    choices = list(allowed)
    names = [str(c) for c in choices if c is not None]
    return f"{param}={value!r} is not one of {choices}.{suggest(str(value), names)}"


def check_one_of(param: str, value: Any, allowed: Iterable[Any]) -> None:
    """Raise ParamError (:func:`one_of_message`) unless ``value`` is one of ``allowed``
    (include None in ``allowed`` where None is a value of its own).

    >>> check_one_of("device", "cpu", ("cpu", "cuda"))
    >>> check_one_of("device", "disk", ("cpu", "cuda"))
    Traceback (most recent call last):
    ...
    sparkdist.exceptions.ParamError: device='disk' is not one of ['cpu', 'cuda'].
    """
    choices = list(allowed)
    if value not in choices:
        raise ParamError(one_of_message(param, value, choices))


#: The longest timeout a Param may ask for: one year. Far below what the waits they reach
#: accept (threading.TIMEOUT_MAX, about 292 years; a deadline of now + timeout in int64
#: nanoseconds in torch.distributed), so every value allowed works; inf is refused.
MAX_TIMEOUT_S = 365 * 86400.0


def check_timeout(param: str, seconds: float) -> None:
    """Raise ParamError unless ``seconds`` is above 0 and at most :data:`MAX_TIMEOUT_S`.

    >>> check_timeout("slotWaitSeconds", float("inf"))
    Traceback (most recent call last):
    ...
    sparkdist.exceptions.ParamError: slotWaitSeconds=inf: use a number of seconds above 0 ...
    """
    if not 0 < seconds <= MAX_TIMEOUT_S:  # inf and NaN too
        raise ParamError(f"{param}={seconds}: use a number of seconds above 0 and at most "
                         f"{MAX_TIMEOUT_S:.0f} (one year, the longest wait allowed; inf is "
                         "not accepted).")


def empty_data_error(owner: str) -> SchemaError:
    """The SchemaError for a fit (or split) given no rows; ``owner`` names the call, e.g.
    ``"ALS.fit"``.

    >>> error = empty_data_error("split")
    >>> type(error).__name__, str(error).split(";")[0]
    ('SchemaError', 'split got an empty DataFrame (0 rows)')
    """
    return SchemaError(f"{owner} got an empty DataFrame (0 rows); check the filter or split "
                       "that produced it.")


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


def require_numeric(schema: StructType, name: str, param: str, fix: str) -> None:
    """Raise SchemaError unless column ``name`` (which exists) holds numbers; ``fix`` says what
    to do instead, e.g. how to index a string label.

    >>> from pyspark.sql.types import StringType, StructField
    >>> require_numeric(StructType([StructField("plan", StringType())]), "plan", "label",
    ...                 "index it.")
    Traceback (most recent call last):
    ...
    sparkdist.exceptions.SchemaError: label: column 'plan' has type string, not numeric; index it.
    """
    if not is_numeric(schema[name].dataType):
        raise SchemaError(f"{param}: column '{name}' has type "
                          f"{schema[name].dataType.simpleString()}, not numeric; {fix}")


def is_numeric(dtype: DataType) -> bool:
    return isinstance(dtype, (NumericType, BooleanType))


def is_discrete(dtype: DataType) -> bool:
    """Types whose values are categories as they stand (no binning needed)."""
    return isinstance(dtype, (StringType, BooleanType, IntegralType))


def is_temporal(dtype: DataType) -> bool:
    return isinstance(dtype, (TimestampType, TimestampNTZType, DateType))
