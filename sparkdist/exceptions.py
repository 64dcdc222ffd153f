"""Typed errors. Each subclasses the built-in type a caller would catch anyway."""

from __future__ import annotations


class SparkdistError(Exception):
    """Base class of every error sparkdist raises on purpose."""


class SchemaError(SparkdistError, ValueError):
    """The DataFrame does not fit: a missing column, a wrong type, nulls, no rows."""


class ParamError(SparkdistError, ValueError):
    """A parameter value is out of range or inconsistent with another one."""


class ClusterConfigError(SparkdistError, RuntimeError):
    """The Spark cluster is configured in a way the requested work cannot run on."""


class TrainingError(SparkdistError, RuntimeError):
    """Training failed on the executors; the message carries the root cause."""


class ModelLoadError(SparkdistError, ValueError):
    """A path does not hold a model this class can load (or holds one it refuses to)."""
