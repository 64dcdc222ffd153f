"""Typed errors: every exception class sparkdist raises, all exported from ``sparkdist``.
Each subclasses the built-in type a caller would catch anyway. The modules that raise them
re-export them under their old names (``sparkdist.store.StoreError``, ...).

(A private signal that never leaves its module, such as the XGBoost chunk loop's
``_ChunkFailed``, is not an error of sparkdist's API and stays there.)
"""

from __future__ import annotations


class SparkdistError(Exception):
    """Base class of every error sparkdist raises on purpose."""


class SchemaError(SparkdistError, ValueError):
    """The DataFrame does not fit: a missing column, a wrong type, nulls, no rows."""


class ParamError(SparkdistError, ValueError):
    """A parameter value is out of range or inconsistent with another one."""


class ConfigError(ParamError):
    """The config file is unreadable, or a key is missing, unknown or of the wrong type."""


class ClusterConfigError(SparkdistError, RuntimeError):
    """The Spark cluster is configured in a way the requested work cannot run on."""


class TrainingError(SparkdistError, RuntimeError):
    """Training failed on the executors; the message carries the root cause."""


class FitStopped(TrainingError):
    """The fit was stopped on purpose by its observer (a Tuner's pruner), after ``epoch``
    epochs; ``free_seconds``: from the decision to its tasks having ended (None: not seen)."""

    def __init__(self, message: str, epoch: int, free_seconds: float | None) -> None:
        super().__init__(message)
        self.epoch, self.free_seconds = epoch, free_seconds


class ModelLoadError(SparkdistError, ValueError):
    """A path does not hold a model this class can load (or holds one it refuses to)."""


class PathExistsError(SparkdistError, FileExistsError):
    """The target path exists and overwriting was not asked for."""


class StoreError(SparkdistError, OSError):
    """The store refused a request or could not be reached (credentials, endpoint, a path
    that is not a directory); the message names the path."""


class NotebookError(SparkdistError, RuntimeError):
    """A notebook cell failed; the message names the notebook, the cell and the cause."""


class FailpointError(RuntimeError):
    """The failure an armed failpoint (:mod:`sparkdist.failpoints`) raised. Deliberately no
    SparkdistError: it stands for a crash sparkdist did not mean, and must be handled as one."""
