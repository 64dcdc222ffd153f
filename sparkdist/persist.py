"""Save/load for every stage sparkdist writes or reads: one commit protocol, one allowlist.

**Saving** (:func:`save_model`, and ``write().save(path)`` of every sparkdist stage) never
renames a directory, so it is all-or-nothing on object stores too. Everything the stage holds
is written into a fresh version directory ``path/v-<time>-<id>/``; then one small file,
``path/metadata/part-00000`` (the Spark ML metadata JSON plus the version's name), is written
in one step: that write is the commit. A crash before it leaves the previous model (or
nothing) loadable; after it, the new one. A save without overwrite commits only if no other
writer committed first (an exclusive create), so a concurrent writer is refused, never
deleted. The version an overwrite replaced stays for :data:`REPLACED_GRACE_S` (an hour)
after it, so that processes which loaded it keep working (ALS reads its factors lazily); a
later save of the same path removes it after that. Versions nobody committed (a killed save)
are removed by a later save once they are an hour old; nothing reads them before that. A
path that is empty, a root, the working directory or one of its parents, an existing
directory that is not a saved model, a path with Hadoop glob characters (``{}[]*?``), a
relative ``file:`` URL, a path under a file or on a read-only filesystem, or one in a bucket
that does not exist, is refused before anything is written (sparkdist never creates a
bucket). A store failure while saving is a :class:`~sparkdist.store.StoreError` naming the
path.

**Loading** (:func:`load_model`, ``Cls.load(path)``) reads the metadata JSON with the store,
not with Spark, and loads only classes on an allowlist, looked up by name *before* anything is
imported: sparkdist's own stages, PipelineModel (whose stages are loaded by this same function,
uids checked to be plain names) and pyspark.ml's own feature and model classes that are read
by their JVM readers (:data:`PYSPARK_MODULES`). Anything else is a :class:`ModelLoadError`.
Artifacts are in non-executable formats (JSON, Parquet, MLlib's formats, UBJSON, torch state
dicts read with ``weights_only=True``). A load whose version an overwrite removed after the
load read the commit retries once with the new commit; a store, JVM or malformed-directory
failure is a ModelLoadError naming the path.

A model mixes in :class:`PersistentModel` and implements ``_state()`` (a JSON-able dict kept
in the metadata), ``_save_artifacts(path)`` and ``_from_state(state, path)``; an estimator
mixes in :class:`ParamsPersistence`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.ml.param import Params
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

from sparkdist import store
from sparkdist._internals import params_metadata
from sparkdist._params import StageParams
from sparkdist.exceptions import ModelLoadError, ParamError

_LOG = logging.getLogger(__name__)
_T = TypeVar("_T")
_PACKAGE_DIR = Path(__file__).resolve().parent

STATE_KEY = "sparkdistState"
#: The committed version directory of a stage, relative to the stage's path.
DATA_KEY = "sparkdistData"
RECORD = "metadata/part-00000"
#: Everything Spark ML's DefaultParamsWriter and sparkdist put in metadata; anything else
#: (e.g. xgboost.spark's pickled callbacks) is refused.
METADATA_KEYS = {"class", "timestamp", "sparkVersion", "uid", "paramMap", "defaultParamMap",
                 STATE_KEY, DATA_KEY}
#: sparkdist's modules whose Params classes a saved directory may name, besides the public
#: modules of :data:`MODELS_PACKAGE` (:func:`own_stage_module`).
SPARKDIST_MODULES = ("sparkdist.features.assembly", "sparkdist.tuning.tuner")
MODELS_PACKAGE = "sparkdist.models"
PYSPARK_MODULES = ("pyspark.ml.feature", "pyspark.ml.classification", "pyspark.ml.regression",
                   "pyspark.ml.clustering", "pyspark.ml.recommendation", "pyspark.ml.fpm")
#: pyspark stages whose readers load further stages by the class names in their files.
_NESTING = {"OneVsRest", "OneVsRestModel", "RFormula", "RFormulaModel"}
_PIPELINE_MODELS = {"pyspark.ml.pipeline.PipelineModel", "org.apache.spark.ml.PipelineModel"}
_UID = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_VERSION = re.compile(r"^v-(\d{13})-[0-9a-f]{8}$")
#: A version directory that no commit names is swept once it is this old (a killed save).
ORPHAN_AGE_S = 3600.0
#: The version an overwrite replaced is swept (by a later save) once it was replaced this
#: long ago: a process that loaded it should load the path again within this time. 0
#: removes it at once.
REPLACED_GRACE_S = 3600.0
#: In a replaced version: when the overwrite committed (milliseconds since the epoch).
REPLACED = "_replaced"


# ------------------------------------------------------------------------------------ save
def save_model(stage: Any, path: str, overwrite: bool = False, spark: Any = None) -> None:
    """Save any Spark ML or sparkdist stage (PipelineModel included) under ``path``.

    Raises
    ------
    ParamError : ``path`` is empty, a root, the working directory or a parent of it, an
        unsupported scheme, an existing directory that is not a saved model, has glob
        characters, lies under a file, cannot be written or is in a missing bucket.
    PathExistsError : ``path`` holds a model (or another writer committed one first) and
        ``overwrite`` is False.
    StoreError : the store failed while saving (nothing was committed).

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
    except BaseException as err:
        with contextlib.suppress(Exception):  # else a later save sweeps it as an orphan
            store.remove(f"{path}/{version}")
        if isinstance(err, Exception) and _store_failure(err):
            raise store.failure(path, err, "saving (nothing was committed)") from err
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
        return json.loads(params_metadata(cast(Params, stage), spark, extra))
    if isinstance(stage, PipelineModel):
        for index, inner in enumerate(stage.stages):
            save_model(inner, _stage_path(data, index, len(stage.stages), inner.uid),
                       spark=spark)
        params = {"stageUids": [inner.uid for inner in stage.stages], "language": "Python"}
        return json.loads(params_metadata(stage, spark, None, params))
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
    """After a commit: mark the version the previous commit named as replaced now (or
    remove it, when :data:`REPLACED_GRACE_S` is 0), and remove what no commit names any
    more: versions replaced over the grace period ago, versions of killed saves over
    :data:`ORPHAN_AGE_S` old, and a directory's files written before versions. A version of
    a save still under way is young and unmarked, so it is left alone. The save is
    committed: a failure here is logged, never raised."""
    replaced = (previous or {}).get(DATA_KEY)
    now_ms = time.time() * 1000
    try:
        if isinstance(replaced, str) and _VERSION.match(replaced) and replaced != keep:
            if REPLACED_GRACE_S <= 0:
                store.remove(f"{path}/{replaced}")
            elif store.exists(f"{path}/{replaced}"):  # a stage without files has none
                store.write_bytes(f"{path}/{replaced}/{REPLACED}", b"%d" % now_ms)
        for name in store.listdir(path):
            match = _VERSION.match(name)
            legacy = match is None and previous is not None and replaced is None
            if name not in (keep, "metadata", replaced) and (
                    legacy or (match is not None and _expired(path, name, now_ms))):
                store.remove(f"{path}/{name}")
        for name in store.listdir(f"{path}/metadata"):  # Spark's part file, _SUCCESS, .crc
            if name != "part-00000" and not name.startswith(".part-00000.tmp-"):
                store.remove(f"{path}/metadata/{name}")
    except Exception as err:  # committed already; the next save sweeps what is left
        _LOG.warning("'%s' is saved, but removing replaced versions failed: %s", path, err)


def _expired(path: str, version: str, now_ms: float) -> bool:
    """Whether an uncommitted version may go: replaced over the grace period ago, or never
    committed and older than :data:`ORPHAN_AGE_S`."""
    try:
        mark = store.read_bytes(f"{path}/{version}/{REPLACED}", limit=64)
        since, grace = float(mark), REPLACED_GRACE_S
    except (FileNotFoundError, ValueError):  # unmarked (a killed or running save), or not ours
        since, grace = float(version.split("-")[1]), ORPHAN_AGE_S
    return now_ms - since > grace * 1000


# ------------------------------------------------------------------------------------ load
def load_model(path: str, spark: Any = None) -> Any:
    """Load any saved Spark ML or sparkdist stage (PipelineModel included) from ``path``,
    refusing any class that is not on the allowlist (see the module docstring).

    Raises
    ------
    ModelLoadError : ``path`` is not a saved model, names a class sparkdist does not load,
        or cannot be read (the store, or Spark's reader, failed: the message says why).

    Examples
    --------
    >>> save_model(pipeline_model, f"{tmp}/models/churn")
    >>> model = load_model(f"{tmp}/models/churn")
    >>> [type(stage).__name__ for stage in model.stages]
    ['FeatureAssemblerModel', 'LogisticRegressionModel']
    """
    spark = spark or _active_spark()
    path = path.rstrip("/")
    return _load_committed(path, lambda record: _load_stage(path, record, spark))


def _load_stage(path: str, record: dict[str, Any], spark: Any) -> Any:
    name = str(record.get("class"))
    if name in _PIPELINE_MODELS:
        return _load_pipeline(path, record, spark)
    cls = allowed_class(name, path)
    if issubclass(cls, ParamsPersistence):  # its own reader (TorchModel's checks more)
        return cls.read().session(spark).load(path)
    return cls.load(store.jvm_input(spark, data_root(path, record)))


def _load_committed(path: str, load: Callable[[dict[str, Any]], _T]) -> _T:
    """``load(record)`` of the commit at ``path``, retried once with the new commit when an
    overwrite removed the version after this load read the commit. A failure of the store,
    of Spark's readers or a runaway recursion is a ModelLoadError naming ``path``."""
    try:
        record = _read_record(path)
        try:
            return load(record)
        except Exception:
            newer = _newer_commit(path, record)
            if newer is None:
                raise
            _LOG.info("'%s' was overwritten while loading; loading the new version", path)
            return load(newer)
    except Exception as err:
        if not _io_failure(err):
            raise
        detail = error_line(err)
        raise ModelLoadError(f"'{path}' could not be read ({detail}). Check that it is the "
                             "directory save(path) wrote, intact, and that the store is "
                             "reachable with these credentials.") from err


def _newer_commit(path: str, record: dict[str, Any]) -> dict[str, Any] | None:
    """The commit at ``path`` now, if it names another version and the one ``record`` named
    is gone (an overwrite swept it); else None."""
    try:
        current = _committed_record(path)
        version = record.get(DATA_KEY)
        if (current is None or version is None or current.get(DATA_KEY) == version
                or store.exists(data_root(path, record))):
            return None
        return current
    except Exception:  # the original error says more
        return None


def _store_failure(err: Exception) -> bool:
    """An error of the store, or of Spark's JVM (its writers and readers), unwrapped."""
    return store.is_store_error(err) or isinstance(err, (Py4JJavaError, CapturedException))


def _io_failure(err: Exception) -> bool:
    """What a load reports as 'could not be read': a store or JVM failure (a StoreError
    too), or a runaway recursion; not an error sparkdist raised on purpose."""
    return (isinstance(err, (store.StoreError, PySparkException, RecursionError))
            or _store_failure(err))


def error_line(err: BaseException) -> str:
    """The first telling line of ``err`` (a Py4JJavaError's first line names only the call)."""
    lines = [line.strip(" \t:") for line in str(err).splitlines() if line.strip(" \t:")]
    lines = [line for line in lines if not line.startswith("An error occurred while")]
    return f"{type(err).__name__}: {(lines or [''])[0][:300]}"


def allowed_class(name: str, path: str) -> type[Any]:
    """The class a saved directory names, if sparkdist loads it; else ModelLoadError. Only
    modules on the allowlist are imported, and only after the name matched one."""
    module, _, attr = name.replace("org.apache.spark", "pyspark").rpartition(".")
    if own_stage_module(module):
        cls = getattr(importlib.import_module(module), attr, None)
        if (inspect.isclass(cls) and issubclass(cls, ParamsPersistence)
                and cls.__module__ == module):
            return cls
    elif attr in _pyspark_stages().get(module, {}):
        return _pyspark_stages()[module][attr]
    raise ModelLoadError(f"'{path}' names the class {name!r}, which sparkdist does not load "
                         "(it loads its own stages, PipelineModels and pyspark.ml's feature "
                         "and model classes); refusing to import or run it.")


def own_stage_module(module: str) -> bool:
    """Whether ``module`` is one of sparkdist's stage modules: one of
    :data:`SPARKDIST_MODULES`, or a public module directly in :data:`MODELS_PACKAGE`. Read
    from the package's files, not by importing it: persist lies below the models that mix it
    in, and a new model module needs no entry here."""
    package, _, leaf = module.rpartition(".")
    if module in SPARKDIST_MODULES:
        return True
    return (package == MODELS_PACKAGE and leaf.isidentifier() and not leaf.startswith("_")
            and (_PACKAGE_DIR / "models" / f"{leaf}.py").is_file())


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
        what = "is a file" if store.is_file(path) else "has no metadata/ file"
        raise ModelLoadError(f"'{path}' is not a saved sparkdist model: it {what}. Point at "
                             "the directory that save(path) wrote.")
    return record


def _committed_record(path: str) -> dict[str, Any] | None:
    """The metadata JSON at ``path``: sparkdist's commit record, else the one part file Spark
    writes; None when there is none."""
    names = [n for n in store.listdir(f"{path}/metadata") if not n.startswith(("_", "."))]
    if not names:
        return None
    name = "part-00000" if "part-00000" in names else names[0]
    try:
        text = store.read_bytes(f"{path}/metadata/{name}", limit=store.CONTROL_LIMIT).decode()
        record = json.loads(text.splitlines()[0])
    except Exception as err:  # unreadable or not JSON: refuse, never guess
        raise ModelLoadError(f"'{path}': its metadata could not be read as JSON ({err}).") from err
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
        return _load_committed(path, lambda record: _from_record(
            self.cls, path, _checked_metadata(path, record, self.cls)))


def _from_record(cls: type[Any], path: str, metadata: dict[str, Any]) -> Any:
    """An instance of ``cls`` from its checked metadata and its version's files."""
    instance: Any
    if issubclass(cls, PersistentModel):
        state = metadata.get(STATE_KEY) or {}
        if not isinstance(state, dict):
            raise ModelLoadError(f"'{path}': its {STATE_KEY} is not an object.")
        try:
            instance = cls._from_state(state, data_root(path, metadata))
        except KeyError as err:  # a state key the model needs was removed or renamed
            raise ModelLoadError(f"'{path}': its {STATE_KEY} lacks {err}; the directory "
                                 "is incomplete or was edited. Save the model again.") from err
    else:
        instance = cls()
    instance._resetUid(str(metadata["uid"]))
    restore_params(instance, metadata, path)
    return instance


class ParamsPersistence(StageParams, MLReadable, MLWritable):
    """Mixin of every sparkdist stage: committed, JSON-only ``write()`` and strict ``read()``
    for a Params class; through :class:`~sparkdist._params.StageParams`, the keyword checks,
    the fitted-model uid and the Params section of the docstring (the getters and setters are
    generated source: ``make accessors``)."""

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
    return _checked_metadata(path, _read_record(path), cls)


def _checked_metadata(path: str, metadata: dict[str, Any], cls: type) -> dict[str, Any]:
    """``metadata`` if it was saved for exactly ``cls`` by sparkdist, else ModelLoadError."""
    expected = f"{cls.__module__}.{cls.__name__}"
    where = f"'{path}' is not a saved sparkdist {cls.__name__}"
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
    known = ({p.name for p in instance.params} | set(getattr(instance, "_renamed_params", ()))
             ) - set(getattr(instance, "_transient_params", ()))  # renamed: old names load
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
