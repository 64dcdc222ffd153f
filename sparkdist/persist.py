"""Save/load for sparkdist models: Spark ML metadata JSON plus the model's own artifacts.

A model class mixes in :class:`PersistentModel` and implements ``_state()`` (a JSON-able
dict stored in the metadata), ``_save_artifacts(path)`` and ``_from_state(state, path)``.
Nothing on the load path unpickles.
"""

from __future__ import annotations

from typing import Any

from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from sparkdist.exceptions import SparkdistError
from sparkdist.store import atomic_directory, exists

STATE_KEY = "sparkdistState"


class ModelLoadError(SparkdistError, ValueError):
    """The path does not hold a saved model of the expected kind."""


def load_model(path: str, spark: Any = None) -> Any:
    """Load any saved Spark ML or sparkdist stage (PipelineModel included) from ``path``.

    Examples
    --------
    >>> model = load_model("models/churn/LogisticRegression")
    """
    from pyspark.sql import SparkSession

    _require_model_dir(path)
    return DefaultParamsReader.loadParamsInstance(path, spark or SparkSession.active())


def _require_model_dir(path: str) -> None:
    if not exists(f"{path.rstrip('/')}/metadata"):
        raise ModelLoadError(f"'{path}' is not a saved model: it has no metadata/ directory. "
                             "Point at the directory a model's save(path) wrote.")


class _ModelWriter(MLWriter):
    def __init__(self, instance: Any) -> None:  # a Params that is a PersistentModel
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        """Write everything into a temporary directory that replaces ``path`` at the end, so a
        failure never leaves a half-written model (and never destroys the old one)."""
        with atomic_directory(path, overwrite=self.shouldOverwrite) as temp:
            self.saveImpl(temp)

    def saveImpl(self, path: str) -> None:
        self.instance._save_artifacts(path)
        state = {STATE_KEY: self.instance._state()}
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession, state)


class _ModelReader(MLReader):
    def __init__(self, cls: type[PersistentModel]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> PersistentModel:
        expected = f"{self.cls.__module__}.{self.cls.__name__}"
        _require_model_dir(path)
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        if metadata["class"] != expected or STATE_KEY not in metadata:
            raise ModelLoadError(f"'{path}' holds a {metadata['class']}, not a {expected}; "
                                 "load it with sparkdist.persist.load_model(path).")
        instance: Any = self.cls._from_state(metadata[STATE_KEY], path)
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        return instance


class PersistentModel(MLReadable, MLWritable):
    """Mixin giving a model ``write()``/``read()`` built on its state and artifacts."""

    def write(self) -> MLWriter:
        return _ModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _ModelReader(cls)

    def _state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _save_artifacts(self, path: str) -> None:
        """Write artifacts under ``path`` (default: none)."""

    @classmethod
    def _from_state(cls, state: dict[str, Any], path: str) -> PersistentModel:
        raise NotImplementedError
