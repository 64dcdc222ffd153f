"""Save/load for every sparkdist stage: Spark ML metadata JSON plus a model's own artifacts.

Writes are atomic (a temporary directory renamed into place) and refuse Param values JSON
cannot hold. Reads are strict: JSON metadata of exactly the expected class, only known Param
names, and artifacts in non-executable formats. Nothing on the load path unpickles or imports
a class named in the files.

A model mixes in :class:`PersistentModel` and implements ``_state()`` (a JSON-able dict kept
in the metadata), ``_save_artifacts(path)`` and ``_from_state(state, path)``; an estimator
mixes in :class:`ParamsPersistence`.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.ml.param import Params
from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.store import atomic_directory, exists

STATE_KEY = "sparkdistState"
#: Everything Spark ML's DefaultParamsWriter and sparkdist put in metadata; anything else
#: (e.g. xgboost.spark's pickled callbacks) is refused.
METADATA_KEYS = {"class", "timestamp", "sparkVersion", "uid", "paramMap", "defaultParamMap",
                 STATE_KEY}


def load_model(path: str, spark: Any = None) -> Any:
    """Load any saved Spark ML or sparkdist stage (PipelineModel included) from ``path``.

    Examples
    --------
    >>> model = load_model("models/churn/LogisticRegression")
    """
    from pyspark.sql import SparkSession

    _require_metadata_dir(path, "model")
    return DefaultParamsReader.loadParamsInstance(path, spark or SparkSession.active())


class _Writer(MLWriter):
    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        """Write into a temporary directory that replaces ``path`` at the end, so a failure
        never leaves a half-written directory (and never destroys the old one)."""
        require_json_params(self.instance)
        with atomic_directory(path, overwrite=self.shouldOverwrite) as temp:
            self.saveImpl(temp)

    def saveImpl(self, path: str) -> None:
        extra = None
        if isinstance(self.instance, PersistentModel):
            self.instance._save_artifacts(path)
            extra = {STATE_KEY: self.instance._state()}
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession, extra)


class _Reader(MLReader):
    def __init__(self, cls: type[Any]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        metadata = read_metadata(self.sparkSession, path, self.cls)
        if issubclass(self.cls, PersistentModel):
            instance = self.cls._from_state(metadata.get(STATE_KEY) or {}, path)
        else:
            instance = self.cls()
        instance._resetUid(str(metadata["uid"]))
        restore_params(instance, metadata, path)
        return instance


class ParamsPersistence(MLReadable, MLWritable):
    """Mixin: atomic, JSON-only ``write()`` and strict ``read()`` for a Params class."""

    #: Params that hold code (callbacks): never saved with a value, refused when loading.
    _transient_params: tuple[str, ...] = ()

    def write(self) -> MLWriter:
        return _Writer(self)

    @classmethod
    def read(cls) -> MLReader:
        return _Reader(cls)


class PersistentModel(ParamsPersistence):
    """Mixin for models: the Params plus the model's state and artifacts."""

    def _state(self) -> dict[str, Any]:
        return {}

    def _save_artifacts(self, path: str) -> None:
        """Write artifacts under ``path`` (default: none)."""

    @classmethod
    def _from_state(cls, state: dict[str, Any], path: str) -> PersistentModel:
        raise NotImplementedError


def require_json_params(instance: Params) -> None:
    """Raise ParamError for the first Param value JSON cannot hold (checked before writing)."""
    for param, value in {**instance._defaultParamMap, **instance._paramMap}.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as err:
            raise ParamError(
                f"{param.name}={value!r} cannot be saved: sparkdist saves Params as JSON and "
                f"never pickles ({err}). Clear it before saving (stage.clear(stage."
                f"{param.name})) and set it again after loading.") from err


def read_metadata(spark: Any, path: str, cls: type) -> dict[str, Any]:
    """The metadata JSON of a directory saved for exactly ``cls``, or ModelLoadError."""
    expected = f"{cls.__module__}.{cls.__name__}"
    where = f"'{path}' is not a saved sparkdist {cls.__name__}"
    _require_metadata_dir(path, cls.__name__)
    try:
        first = spark.read.text(f"{path.rstrip('/')}/metadata").first()
        metadata = json.loads(first[0]) if first is not None else None
    except Exception as err:  # unreadable or not JSON: refuse, never guess
        raise ModelLoadError(f"{where}: its metadata is not JSON ({err}).") from err
    if not isinstance(metadata, dict) or "uid" not in metadata:
        raise ModelLoadError(f"{where}: its metadata is not a Spark ML metadata object.")
    found = metadata.get("class")
    if found != expected:
        raise ModelLoadError(f"{where}: it holds a {found!r}, not a {expected!r}; load it "
                             "with sparkdist.persist.load_model(path) or that class.")
    foreign = sorted(set(metadata) - METADATA_KEYS)
    if foreign:
        raise ModelLoadError(f"{where}: its metadata has fields {foreign} that sparkdist never "
                             "writes (other libraries keep pickled code there); refusing it.")
    return metadata


def restore_params(instance: Params, metadata: dict[str, Any], path: str) -> None:
    """Set the saved Params on ``instance``; unknown names are refused, not ignored."""
    known = {p.name for p in instance.params} - set(getattr(instance, "_transient_params", ()))
    for section, setter in (("defaultParamMap", instance._setDefault),
                            ("paramMap", instance._set)):
        values = metadata.get(section, {})
        if not isinstance(values, dict):
            raise ModelLoadError(f"'{path}': metadata {section} is not an object.")
        unknown = sorted(set(values) - known)
        if unknown:
            raise ModelLoadError(f"'{path}': metadata {section} holds {unknown}, which "
                                 f"{type(instance).__name__} does not have.")
        try:
            setter(**values)
        except (TypeError, ValueError) as err:
            raise ModelLoadError(f"'{path}': bad value in metadata {section}: {err}") from err


def _require_metadata_dir(path: str, what: str) -> None:
    if not exists(f"{path.rstrip('/')}/metadata"):
        raise ModelLoadError(f"'{path}' is not a saved sparkdist {what}: it has no metadata/ "
                             "directory. "
                             "Point at the directory that save(path) wrote.")
