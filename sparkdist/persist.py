"""Save/load for every stage sparkdist writes or reads: one commit protocol, one allowlist.

**Saving** (:func:`save_model`, and ``write().save(path)`` of every sparkdist stage) never
renames a directory, so it is all-or-nothing on object stores too. Everything the stage holds
is written into a fresh version directory ``path/v-<time>-<id>/``; then one small file,
``path/metadata/part-00000`` (the Spark ML metadata JSON plus the version's name), is written
in one step: that write is the commit. A crash before it leaves the previous model (or
nothing) loadable; after it, the new one. A save without overwrite commits only if no other
writer committed first (an exclusive create), so a concurrent writer is refused, never
deleted. Versions nobody committed (a killed save) are removed by a later save of the same
path once they are an hour old; nothing reads them before that. A path that is empty, a root,
the working directory or one of its parents, or an existing directory that is not a saved
model, is refused before anything is written.

**Loading** (:func:`load_model`, ``Cls.load(path)``) reads the metadata JSON with the store,
not with Spark, and loads only classes on an allowlist, looked up by name *before* anything is
imported: sparkdist's own stages, PipelineModel (whose stages are loaded by this same function,
uids checked to be plain names) and pyspark.ml's own feature and model classes that are read
by their JVM readers (:data:`PYSPARK_MODULES`). Anything else is a :class:`ModelLoadError`.
Artifacts are in non-executable formats (JSON, Parquet, MLlib's formats, UBJSON, torch state
dicts read with ``weights_only=True``).

A model mixes in :class:`PersistentModel` and implements ``_state()`` (a JSON-able dict kept
in the metadata), ``_save_artifacts(path)`` and ``_from_state(state, path)``; an estimator
mixes in :class:`ParamsPersistence`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import re
import time
import uuid
from typing import Any, cast

from pyspark.ml.param import Params
from pyspark.ml.util import DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from sparkdist import store
from sparkdist._params import StageParams
from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.models import MODULES as MODELS

STATE_KEY = "sparkdistState"
#: The committed version directory of a stage, relative to the stage's path.
DATA_KEY = "sparkdistData"
RECORD = "metadata/part-00000"
#: Everything Spark ML's DefaultParamsWriter and sparkdist put in metadata; anything else
#: (e.g. xgboost.spark's pickled callbacks) is refused.
METADATA_KEYS = {"class", "timestamp", "sparkVersion", "uid", "paramMap", "defaultParamMap",
                 STATE_KEY, DATA_KEY}
#: Modules whose Params classes may be named in a saved directory.
SPARKDIST_MODULES = ("sparkdist.features.assembly", *MODELS)
PYSPARK_MODULES = ("pyspark.ml.feature", "pyspark.ml.classification", "pyspark.ml.regression",
                   "pyspark.ml.clustering", "pyspark.ml.recommendation", "pyspark.ml.fpm")
#: pyspark stages whose readers load further stages by the class names in their files.
_NESTING = {"OneVsRest", "OneVsRestModel", "RFormula", "RFormulaModel"}
_PIPELINE_MODELS = {"pyspark.ml.pipeline.PipelineModel", "org.apache.spark.ml.PipelineModel"}
_UID = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_VERSION = re.compile(r"^v-(\d{13})-[0-9a-f]{8}$")
#: A version directory that no commit names is swept once it is this old (a killed save).
ORPHAN_AGE_S = 3600.0


# ------------------------------------------------------------------------------------ save
def save_model(stage: Any, path: str, overwrite: bool = False, spark: Any = None) -> None:
    """Save any Spark ML or sparkdist stage (PipelineModel included) under ``path``.

    Raises
    ------
    ParamError : ``path`` is empty, a root, the working directory or a parent of it, an
        unsupported scheme, or an existing directory that is not a saved model.
    PathExistsError : ``path`` holds a model (or another writer committed one first) and
        ``overwrite`` is False.

    Examples
    --------
    >>> save_model(pipeline_model, f"{tmp}/models/churn")  # or s3://bucket/models/churn, ...
    >>> save_model(pipeline_model, f"{tmp}/models/churn", overwrite=True)  # replaces it
    """
    store.check_target(path)
    spark = spark or _active_spark()
    path = path.rstrip("/")
    previous = _committed_record(path)
    if previous is None and _foreign_entries(path):
        raise (store.PathExistsError if not overwrite else ParamError)(
            f"'{path}' exists and is not a saved model; sparkdist saves into a new path or "
            "replaces a saved model only. Choose another path (or delete it yourself).")
    if previous is not None and not overwrite:
        raise store.PathExistsError(f"'{path}' already exists; choose a new path, or overwrite "
                                    "it explicitly (model.write().overwrite().save(path)).")
    version = f"v-{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}"
    try:
        record = {**_write_stage(stage, f"{path}/{version}", spark), DATA_KEY: version}
        body = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        commit = store.create_exclusive if previous is None else store.write_bytes
        commit(f"{path}/{RECORD}", body)
    except BaseException:
        store.remove(f"{path}/{version}")
        raise
    _sweep(path, version, previous)


def _write_stage(stage: Any, data: str, spark: Any) -> dict[str, Any]:
    """Write what ``stage`` holds under ``data``; return its metadata record."""
    from pyspark.ml import PipelineModel
    from pyspark.ml.util import JavaMLWritable

    if isinstance(stage, ParamsPersistence):
        require_json_params(stage)
        extra = None
        if isinstance(stage, PersistentModel):
            stage._save_artifacts(data)
            extra = {STATE_KEY: stage._state()}
        return json.loads(DefaultParamsWriter._get_metadata_to_save(
            cast(Params, stage), spark, extra))
    if isinstance(stage, PipelineModel):
        for index, inner in enumerate(stage.stages):
            save_model(inner, _stage_path(data, index, len(stage.stages), inner.uid),
                       spark=spark)
        params = {"stageUids": [inner.uid for inner in stage.stages], "language": "Python"}
        return json.loads(DefaultParamsWriter._get_metadata_to_save(stage, spark, None, params))
    if isinstance(stage, JavaMLWritable):
        with store.jvm_output(spark, data) as out:
            stage.write().save(out)
        return _read_record(data)
    raise ParamError(f"cannot save a {type(stage).__name__}: sparkdist saves its own stages, "
                     "PipelineModels and pyspark.ml's JVM-backed stages.")


def _foreign_entries(path: str) -> list[str]:
    """What is at ``path`` besides versions and metadata (a file at ``path`` counts)."""
    if store.is_file(path):
        return [path]
    return [n for n in store.listdir(path) if n != "metadata" and not _VERSION.match(n)]


def _sweep(path: str, keep: str, previous: dict[str, Any] | None) -> None:
    """Remove what no commit names any more: the version the previous commit named (or, for
    a directory written before versions, its files), and versions of killed saves. A version
    of a save still under way is young and not the previous one, so it is left alone."""
    replaced = (previous or {}).get(DATA_KEY)
    now_ms = time.time() * 1000
    for name in store.listdir(path):
        match = _VERSION.match(name)
        stale = match is not None and now_ms - int(match.group(1)) > ORPHAN_AGE_S * 1000
        legacy = match is None and previous is not None and replaced is None
        if name not in (keep, "metadata") and (name == replaced or stale or legacy):
            store.remove(f"{path}/{name}")
    for name in store.listdir(f"{path}/metadata"):  # Spark's part file, _SUCCESS, .crc
        if name != "part-00000" and not name.startswith(".part-00000.tmp-"):
            store.remove(f"{path}/metadata/{name}")


# ------------------------------------------------------------------------------------ load
def load_model(path: str, spark: Any = None) -> Any:
    """Load any saved Spark ML or sparkdist stage (PipelineModel included) from ``path``,
    refusing any class that is not on the allowlist (see the module docstring).

    Raises
    ------
    ModelLoadError : ``path`` is not a saved model, or names a class sparkdist does not load.

    Examples
    --------
    >>> save_model(pipeline_model, f"{tmp}/models/churn")
    >>> model = load_model(f"{tmp}/models/churn")
    >>> [type(stage).__name__ for stage in model.stages]
    ['FeatureAssemblerModel', 'LogisticRegressionModel']
    """
    spark = spark or _active_spark()
    path = path.rstrip("/")
    record = _read_record(path)
    name = str(record.get("class"))
    if name in _PIPELINE_MODELS:
        return _load_pipeline(path, record, spark)
    cls = allowed_class(name, path)
    if issubclass(cls, ParamsPersistence):
        return cls.read().session(spark).load(path)
    return cls.load(store.jvm_input(spark, data_root(path, record)))


def allowed_class(name: str, path: str) -> type[Any]:
    """The class a saved directory names, if sparkdist loads it; else ModelLoadError. Only
    modules on the allowlist are imported, and only after the name matched one."""
    module, _, attr = name.replace("org.apache.spark", "pyspark").rpartition(".")
    if module in SPARKDIST_MODULES:
        cls = getattr(importlib.import_module(module), attr, None)
        if (inspect.isclass(cls) and issubclass(cls, ParamsPersistence)
                and cls.__module__ == module):
            return cls
    elif attr in _pyspark_stages().get(module, {}):
        return _pyspark_stages()[module][attr]
    raise ModelLoadError(f"'{path}' names the class {name!r}, which sparkdist does not load "
                         "(it loads its own stages, PipelineModels and pyspark.ml's feature "
                         "and model classes); refusing to import or run it.")


@functools.cache
def _pyspark_stages() -> dict[str, dict[str, type[Any]]]:
    from pyspark.ml.util import JavaMLReadable

    allowed: dict[str, dict[str, type[Any]]] = {}
    for module_name in PYSPARK_MODULES:
        module = importlib.import_module(module_name)
        allowed[module_name] = {
            name: cls for name, cls in vars(module).items()
            if inspect.isclass(cls) and cls.__module__ == module_name
            and issubclass(cls, JavaMLReadable) and name not in _NESTING}
    return allowed


def _load_pipeline(path: str, record: dict[str, Any], spark: Any) -> Any:
    from pyspark.ml import PipelineModel

    uids = (record.get("paramMap") or {}).get("stageUids")
    if not isinstance(uids, list) or not all(isinstance(u, str) and _UID.match(u)
                                             for u in uids):
        raise ModelLoadError(f"'{path}': its stageUids {uids!r} are not a list of plain stage "
                             "names; refusing to read stages from elsewhere.")
    root = data_root(path, record)
    stages = [load_model(_stage_path(root, i, len(uids), uid), spark)
              for i, uid in enumerate(uids)]
    model = PipelineModel(stages)
    model._resetUid(str(record["uid"]))
    return model


def _stage_path(root: str, index: int, count: int, uid: str) -> str:
    """pyspark's own layout: ``stages/<zero-padded index>_<uid>``."""
    return f"{root}/stages/{str(index).zfill(len(str(count)))}_{uid}"


def data_root(path: str, record: dict[str, Any]) -> str:
    """Where a stage's files are: its committed version directory (``path`` itself for
    directories written by Spark or by sparkdist before versions)."""
    version = record.get(DATA_KEY)
    if version is None:
        return path
    if not isinstance(version, str) or not _VERSION.match(version):
        raise ModelLoadError(f"'{path}': its metadata names the data directory {version!r}, "
                             "which is not one sparkdist writes.")
    return f"{path}/{version}"


def data_dir(path: str) -> str:
    """Where the files of the stage saved at ``path`` are (its committed version)."""
    path = path.rstrip("/")
    return data_root(path, _read_record(path))


def _read_record(path: str) -> dict[str, Any]:
    """The metadata JSON of a saved stage, or ModelLoadError."""
    record = _committed_record(path)
    if record is None:
        raise ModelLoadError(f"'{path}' is not a saved sparkdist model: it has no metadata/ "
                             "file. Point at the directory that save(path) wrote.")
    return record


def _committed_record(path: str) -> dict[str, Any] | None:
    """The metadata JSON at ``path``: sparkdist's commit record, else the one part file Spark
    writes; None when there is none."""
    names = [n for n in store.listdir(f"{path}/metadata") if not n.startswith(("_", "."))]
    if not names:
        return None
    name = "part-00000" if "part-00000" in names else names[0]
    try:
        text = store.read_bytes(f"{path}/metadata/{name}").decode()
        record = json.loads(text.splitlines()[0])
    except Exception as err:  # unreadable or not JSON: refuse, never guess
        raise ModelLoadError(f"'{path}': its metadata is not JSON ({err}).") from err
    if not isinstance(record, dict) or "uid" not in record:
        raise ModelLoadError(f"'{path}': its metadata is not a Spark ML metadata object.")
    return record


def _active_spark() -> Any:
    from pyspark.sql import SparkSession

    return SparkSession.active()


# ------------------------------------------------------------------- sparkdist's own stages
class _Writer(MLWriter):
    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        """Commit ``path`` with :func:`save_model` (all-or-nothing, never a rename)."""
        save_model(self.instance, path, overwrite=self.shouldOverwrite, spark=self.sparkSession)

    def saveImpl(self, path: str) -> None:
        self.save(path)


class _Reader(MLReader):
    def __init__(self, cls: type[Any]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        path = path.rstrip("/")
        metadata = read_metadata(path, self.cls)
        instance: Any
        if issubclass(self.cls, PersistentModel):
            state = metadata.get(STATE_KEY) or {}
            if not isinstance(state, dict):
                raise ModelLoadError(f"'{path}': its {STATE_KEY} is not an object.")
            try:
                instance = self.cls._from_state(state, data_root(path, metadata))
            except KeyError as err:  # a state key the model needs was removed or renamed
                raise ModelLoadError(f"'{path}': its {STATE_KEY} lacks {err}; the directory "
                                     "is incomplete or was edited. Save the model again.") from err
        else:
            instance = self.cls()
        instance._resetUid(str(metadata["uid"]))
        restore_params(instance, metadata, path)
        return instance


class ParamsPersistence(StageParams, MLReadable, MLWritable):
    """Mixin of every sparkdist stage: committed, JSON-only ``write()`` and strict ``read()``
    for a Params class; through :class:`~sparkdist._params.StageParams`, the getters, setters,
    keyword checks and fitted-model uid of the one Params surface."""

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


def require_json_params(instance: Any) -> None:
    """Raise ParamError for the first Param value JSON cannot hold (checked before writing)."""
    for param, value in {**instance._defaultParamMap, **instance._paramMap}.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as err:
            raise ParamError(
                f"{param.name}={value!r} cannot be saved: sparkdist saves Params as JSON and "
                f"never pickles ({err}). Clear it before saving (stage.clear(stage."
                f"{param.name})) and set it again after loading.") from err


def read_metadata(path: str, cls: type) -> dict[str, Any]:
    """The metadata JSON of a directory saved for exactly ``cls``, or ModelLoadError."""
    expected = f"{cls.__module__}.{cls.__name__}"
    where = f"'{path}' is not a saved sparkdist {cls.__name__}"
    metadata = _read_record(path)
    found = metadata.get("class")
    if found != expected:
        raise ModelLoadError(f"{where}: it holds a {found!r}, not a {expected!r}; load it "
                             "with sparkdist.persist.load_model(path) or that class.")
    foreign = sorted(set(metadata) - METADATA_KEYS)
    if foreign:
        raise ModelLoadError(f"{where}: its metadata has fields {foreign} that sparkdist never "
                             "writes (other libraries keep pickled code there); refusing it.")
    return metadata


def restore_params(instance: Any, metadata: dict[str, Any], path: str) -> None:
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
