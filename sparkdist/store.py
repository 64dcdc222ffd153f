"""Files on every store sparkdist users have, written so that no reader sees half a write.

Paths are local (relative ones made absolute), ``file:``, ``dbfs:/`` and ``/Volumes``
(Databricks' local mounts), ``hdfs://``, and the object stores of Databricks, EMR, Dataproc
and HDInsight: ``s3://``/``s3a://``/``s3n://`` (s3fs), ``gs://``/``gcs://`` (gcsfs),
``abfs[s]://``/``wasb[s]://``/``az://`` (adlfs), through fsspec. Any other scheme is refused
with a :class:`ParamError` before anything is written; a scheme whose fsspec package is
missing names the extra to install. Credentials and endpoints come from each library's own
configuration (for S3: the AWS variables and files, ``AWS_ENDPOINT_URL`` included).

A file is written whole or not at all (:func:`write_bytes`: temp + rename where the store can
rename, one PUT on object stores); :func:`create_exclusive` refuses a file another writer
created first (a hard link locally, a conditional ``If-None-Match`` PUT on S3);
:func:`replace_if`/:func:`remove_if` change a file only if it still holds the version read
(:func:`read_tagged`). Reads refuse what is not a regular file (a FIFO, a device) before
reading, and a ``limit`` bounds what a small control file may hold.

Examples
--------
>>> write_bytes(f"{tmp}/a.txt", b"hello")  # or s3://bucket/a.txt, gs://..., abfss://...
>>> read_bytes(f"{tmp}/a.txt")
b'hello'
>>> checkpoints = Checkpoints(f"{tmp}/run-1", keep=2)
>>> checkpoints.save(3, b"weights...")
>>> checkpoints.latest()
(3, b'weights...')
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sparkdist import _fs
from sparkdist.exceptions import ParamError, PathExistsError, SparkdistError, StoreError

_LOG = logging.getLogger(__name__)

#: URL scheme -> (fsspec protocol, the pip package that provides it).
SCHEMES: dict[str, tuple[str, str]] = {
    "file": ("file", "fsspec"), "dbfs": ("file", "fsspec"), "hdfs": ("hdfs", "pyarrow"),
    "s3": ("s3", "s3fs"), "s3a": ("s3", "s3fs"), "s3n": ("s3", "s3fs"),
    "gs": ("gcs", "gcsfs"), "gcs": ("gcs", "gcsfs"),
    "abfs": ("abfs", "adlfs"), "abfss": ("abfs", "adlfs"), "az": ("abfs", "adlfs"),
    "wasb": ("abfs", "adlfs"), "wasbs": ("abfs", "adlfs"),
}
_EXTRAS = {"s3fs": "sparkdist[s3]", "gcsfs": "sparkdist[gcs]", "adlfs": "sparkdist[azure]"}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


#: The most a control file (a metadata record, run.json, lock.json) may hold: far above what
#: sparkdist writes (a metadata record with 100,000 feature names is ~3 MiB), far below memory.
CONTROL_LIMIT = 16 * 2**20


@dataclass(frozen=True)
class Location:
    """A path resolved to its fsspec filesystem: ``fs`` and the path inside it."""

    fs: Any
    path: str
    url: str

    @property
    def local(self) -> bool:
        return "file" in _protocols(self.fs)

    def child(self, name: str) -> str:
        return f"{self.url.rstrip('/')}/{name}"


def locate(url: str, param: str = "path") -> Location:
    """The filesystem of ``url`` and the path inside it, or ParamError for a scheme sparkdist
    does not support (``param`` names the argument in the message)."""
    import fsspec

    scheme = _scheme(url)
    if scheme is None:  # a local path; dbfs:/ is mounted at /dbfs on every Databricks node
        return Location(fsspec.filesystem("file"), os.path.abspath(url), url)
    if scheme not in SCHEMES:
        raise ParamError(f"{param}={url!r}: sparkdist cannot read or write '{scheme}://' "
                         f"paths; use a local path or one of "
                         f"{', '.join(s + '://' for s in SCHEMES)}.")
    protocol, package = SCHEMES[scheme]
    rest = url[len(scheme) + 1:]
    if scheme == "file":
        return Location(fsspec.filesystem("file"), _file_url_path(url, rest, param), url)
    if scheme == "dbfs":
        local = "/dbfs/" + rest.lstrip("/")
        return Location(fsspec.filesystem("file"), os.path.abspath(local), url)
    try:
        # fsspec's instance cache (reset in a forked child) keeps one client per process: a
        # new S3 client per call costs ~0.15 s, and on EC2 a credentials lookup each time.
        fs = fsspec.filesystem(protocol, use_listings_cache=False)
    except ImportError as err:
        raise ParamError(f"{param}={url!r} needs the '{package}' package ({err}); install it "
                         f"with `pip install {_EXTRAS.get(package, package)}`.") from err
    return Location(fs, fs._strip_protocol(f"{protocol}:{rest}").rstrip("/"), url)


def _file_url_path(url: str, rest: str, param: str) -> str:
    """The local path of a ``file:`` URL, read as Hadoop reads it (``file:/p``,
    ``file:///p``); a relative ``file:p`` or one naming a host is refused, because sparkdist
    and Spark would put it in different places."""
    if rest.startswith("//"):
        host, _, tail = rest[2:].partition("/")
        if host:
            raise ParamError(f"{param}={url!r} names the host {host!r}; a file: URL is "
                             f"local: write file:///{tail} or a plain absolute path.")
        rest = "/" + tail
    if not rest.startswith("/"):
        raise ParamError(f"{param}={url!r} is a relative file: URL, which Spark refuses "
                         f"('Relative path in absolute URI'); write it as a plain path "
                         f"({rest!r}) or an absolute one (file:///abs/path).")
    return os.path.abspath(rest)


def check_target(url: str, param: str = "path") -> Location:
    """A path that a save may replace: never empty, a filesystem or bucket root, the working
    directory or one of its parents (ParamError), so ``save("")`` or ``save("/")`` cannot
    delete more than a model. Nor a path that Spark's readers would read elsewhere (Hadoop
    glob characters ``{}[]*?``), or that cannot be written: under a file, unwritable (a
    read-only filesystem), or in a bucket that does not exist (sparkdist never creates one).
    StoreError when the store cannot be asked."""
    if not url or not url.strip():
        raise ParamError(f"{param} is empty; give the directory to save into, e.g. "
                         "'models/churn'.")
    where = locate(url, param)
    if where.local:
        cwd = os.path.realpath(os.getcwd())
        target = os.path.realpath(where.path)
        if target == os.path.dirname(target) or cwd == target or cwd.startswith(target + os.sep):
            raise ParamError(f"{param}={url!r} is {target!r}, the filesystem root, the working "
                             "directory or a parent of it; save into a directory of its own, "
                             "e.g. 'models/churn'.")
    elif "/" not in where.path.strip("/"):
        raise ParamError(f"{param}={url!r} is the root of a bucket or container; save into a "
                         f"directory in it, e.g. '{url.rstrip('/')}/models/churn'.")
    glob = _GLOB.search(where.path)
    if glob:
        raise ParamError(f"{param}={url!r} (at {where.path!r}) contains {glob.group()!r}: "
                         "Spark's readers take {}[]*? as a file pattern and would not find "
                         "the model there again; choose a path without these characters.")
    if where.local:
        _check_local_target(where, url, param)
    else:
        check_bucket(where, url, param)
    return where


_GLOB = re.compile(r"[{}\[\]*?]")


def _check_local_target(where: Location, url: str, param: str) -> None:
    """ParamError when a local target lies under a file, or its directory is not writable."""
    existing = where.path
    while not os.path.lexists(existing) and existing != os.path.dirname(existing):
        existing = os.path.dirname(existing)
    if existing != where.path and not os.path.isdir(existing):
        raise ParamError(f"{param}={url!r} lies under {existing!r}, which is not a directory "
                         "(a file); choose a path in a directory.")
    directory = existing if os.path.isdir(existing) else os.path.dirname(existing)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ParamError(f"{param}={url!r}: {directory!r} is not writable (a read-only "
                         "filesystem, or no permission); choose a directory this process "
                         "can write.")


def check_bucket(where: Location, url: str, param: str = "path") -> None:
    """ParamError when the bucket (container) of an object-store path does not exist:
    sparkdist never creates one, so a mistyped name never becomes a new bucket. StoreError
    when the store cannot be asked (rejected credentials, an unreachable endpoint)."""
    if not _object_store(where.fs):
        return
    bucket = where.path.strip("/").split("/", 1)[0]
    try:
        where.fs.info(bucket)
    except FileNotFoundError:
        raise ParamError(f"{param}={url!r}: the bucket (or container) {bucket!r} does not "
                         "exist. sparkdist never creates one, so that a mistyped name does "
                         "not become a new bucket: correct the name, or create the bucket "
                         "first.") from None
    except Exception as err:
        if not is_store_error(err):
            raise
        raise failure(url, err, f"checking its bucket {bucket!r}") from err


def is_store_error(err: BaseException) -> bool:
    """Whether ``err`` is a store's own failure (an OSError, or an error of the cloud client
    libraries, e.g. botocore's EndpointConnectionError), not one sparkdist raised."""
    if isinstance(err, SparkdistError):
        return False
    root = type(err).__module__.partition(".")[0]
    return isinstance(err, OSError) or root in {"botocore", "aiobotocore", "google", "azure"}


def failure(url: str, err: BaseException, doing: str) -> StoreError:
    """``err`` raised by the store while ``doing`` something with ``url``, as a StoreError
    that names the path and what to check."""
    detail = (str(err).strip().splitlines() or [""])[0][:300]
    return StoreError(f"'{url}': {doing} failed ({type(err).__name__}: {detail}). Check the "
                      "path and, on an object store, its credentials (e.g. "
                      "AWS_ACCESS_KEY_ID) and endpoint (e.g. AWS_ENDPOINT_URL).")


def exists(url: str) -> bool:
    """Whether ``url`` exists; StoreError when the store cannot be asked."""
    where = locate(url)
    try:
        return bool(where.fs.exists(where.path))
    except Exception as err:
        if not is_store_error(err):
            raise
        raise failure(url, err, "checking that it exists") from err


def is_file(url: str) -> bool:
    where = locate(url)
    return bool(where.fs.isfile(where.path))


def listdir(url: str) -> list[str]:
    """Names of the entries directly in ``url`` (empty when it does not exist, or lies under
    a file); StoreError when the store cannot be asked (a symlink loop, credentials)."""
    where = locate(url)
    try:
        return sorted(os.path.basename(p.rstrip("/")) for p in where.fs.ls(where.path,
                                                                            detail=False))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except Exception as err:
        if not is_store_error(err):
            raise
        raise failure(url, err, "listing it") from err


def remove(url: str) -> None:
    where = locate(url)
    with contextlib.suppress(FileNotFoundError):
        where.fs.rm(where.path, recursive=True)


def read_bytes(url: str, limit: int | None = None) -> bytes:
    """The bytes of ``url``. ParamError when it is not a regular file (a FIFO would block the
    read for ever, ``/dev/zero`` never ends; refused before reading) or, with ``limit``, when it
    holds more than ``limit`` bytes (at most ``limit + 1`` are read). Pass ``limit`` (e.g.
    :data:`CONTROL_LIMIT`) for small control files; artifacts (weights, checkpoints) pass none."""
    where = locate(url)
    if where.local:
        return _within(url, _fs.read_local(where.path, url, limit)[0], limit)
    if limit is None:  # an artifact: fsspec's own read (ranged GETs in parallel, retried)
        return bytes(where.fs.cat_file(where.path))
    return read_tagged(url, limit).data


@dataclass(frozen=True)
class Tagged:
    """A file's bytes, the tag of that version (S3's ETag, elsewhere a SHA-256 of the bytes)
    for :func:`replace_if`/:func:`remove_if`, and when it was written (seconds since the epoch,
    by the store's clock; None where the store does not say)."""

    data: bytes
    tag: str
    modified: float | None


def read_tagged(url: str, limit: int | None = CONTROL_LIMIT) -> Tagged:
    """:func:`read_bytes` with the version's tag and write time (FileNotFoundError when absent)."""
    where = locate(url)
    if where.local:
        data, modified = _fs.read_local(where.path, url, limit)
        tagged = Tagged(data, hashlib.sha256(data).hexdigest(), modified)
    elif "s3" in _protocols(where.fs):
        tagged = Tagged(*_fs.s3_get(where.fs, where.path, limit))
    else:
        with where.fs.open(where.path, "rb") as file:
            data = file.read() if limit is None else file.read(limit + 1)
        tagged = Tagged(data, hashlib.sha256(data).hexdigest(),
                        _fs.modified(where.fs, where.path))
    _within(url, tagged.data, limit)
    return tagged


def _within(url: str, data: bytes, limit: int | None) -> bytes:
    if limit is not None and len(data) > limit:
        raise ParamError(f"'{url}' holds more than {limit} bytes, more than sparkdist ever "
                         "writes there: it is not sparkdist's file. Remove or replace it.")
    return data


def replace_if(url: str, tag: str, data: bytes) -> bool:
    """Replace ``url`` with ``data`` (whole) only if it still holds the version ``tag`` (from
    :func:`read_tagged`); False when it changed or went. Of several callers with the same
    ``tag`` exactly one succeeds: locally under a lock on the directory, on S3 by a PUT with
    ``If-Match``. HDFS, GCS and Azure: checked, then written (two within the same instant can
    both succeed)."""
    where = locate(url)
    if "s3" in _protocols(where.fs):
        return _fs.s3_conditional(lambda: where.fs.pipe_file(where.path, data, IfMatch=tag))
    with _fs.directory_lock(where.path, where.local):
        if _current_tag(url) != tag:
            return False
        write_bytes(url, data)
        return True


def remove_if(url: str, tag: str) -> bool:
    """Remove ``url`` only if it still holds the version ``tag``; False otherwise. Atomic as
    :func:`replace_if` (S3: a DELETE with ``If-Match``)."""
    where = locate(url)
    if "s3" in _protocols(where.fs):
        bucket, key, _ = where.fs.split_path(where.path)
        return _fs.s3_conditional(lambda: where.fs.call_s3("delete_object", Bucket=bucket,
                                                            Key=key, IfMatch=tag))
    with _fs.directory_lock(where.path, where.local):
        if _current_tag(url) != tag:
            return False
        remove(url)
        return True


def _current_tag(url: str) -> str | None:
    try:
        return read_tagged(url).tag
    except FileNotFoundError:
        return None


def write_bytes(url: str, data: bytes) -> None:
    """Write ``url`` whole or not at all: temp + rename on stores that rename files atomically
    (local, HDFS), one PUT on object stores (a PUT is never seen half-written)."""
    _write_whole(url, lambda fs, path: fs.pipe_file(path, data))


def write_file(url: str, local: str) -> None:
    """Write the local file ``local`` to ``url`` whole or not at all, as :func:`write_bytes`
    does, without reading it into memory (a server's shard may be most of its budget); an
    object store's multipart upload shows the object only once it is complete."""
    _write_whole(url, lambda fs, path: fs.put_file(local, path))


def _write_whole(url: str, put: Callable[[Any, str], None]) -> None:
    where = locate(url)
    parent = os.path.dirname(where.path)
    if not _renames_atomically(where.fs):
        put(where.fs, where.path)
        return
    where.fs.makedirs(parent, exist_ok=True)
    temp = f"{parent}/.{os.path.basename(where.path)}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        put(where.fs, temp)
        where.fs.mv(temp, where.path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            where.fs.rm_file(temp)


def create_exclusive(url: str, data: bytes) -> None:
    """Write ``url`` whole, or raise PathExistsError when it already exists, also when another
    writer creates it at the same moment (one of two racing writers wins)."""
    where = locate(url)
    if where.local:
        parent = os.path.dirname(where.path)
        os.makedirs(parent, exist_ok=True)
        temp = f"{parent}/.{os.path.basename(where.path)}.tmp-{uuid.uuid4().hex[:8]}"
        with open(temp, "wb") as out:
            out.write(data)
        try:
            os.link(temp, where.path)  # atomic, and fails if the name exists
        except FileExistsError as err:
            raise PathExistsError(f"'{url}' was created by another writer.") from err
        finally:
            os.unlink(temp)
        return
    if "s3" in _protocols(where.fs):
        try:
            where.fs.pipe_file(where.path, data, mode="create")  # PUT with If-None-Match: *
        except OSError as err:  # FileExistsError; 409: another conditional PUT in flight
            if _fs.s3_code(err) == "ConditionalRequestConflict" or where.fs.exists(where.path):
                raise PathExistsError(f"'{url}' was created by another writer.") from err
            raise
        return
    # Stores without a conditional create here (HDFS, GCS, Azure): check, then write; two
    # writers within the same instant can both pass the check.
    if where.fs.exists(where.path):
        raise PathExistsError(f"'{url}' was created by another writer.")
    write_bytes(url, data)


def _protocols(fs: Any) -> set[str]:
    return {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)


def _renames_atomically(fs: Any) -> bool:
    return bool({"file", "hdfs", "arrow_hdfs"} & _protocols(fs))


def _object_store(fs: Any) -> bool:
    return bool({"s3", "s3a", "gcs", "gs", "abfs", "abfss", "az"} & _protocols(fs))


def _scheme(url: str) -> str | None:
    match = _SCHEME.match(url)
    if match is None or (len(match.group(1)) == 1 and os.name == "nt"):  # C:\ on Windows
        return None
    return match.group(1).lower()


# --------------------------------------------------------------------- Spark's own writers
def jvm_can_write(spark: Any, url: str) -> bool:
    """Whether Spark's JVM (Hadoop FileSystem) handles ``url``'s scheme: always for local
    paths; on Spark Connect the server is asked nothing and assumed to."""
    scheme = _scheme(url)
    if scheme in (None, "file", "dbfs"):
        return True
    from sparkdist.session import is_connect

    if is_connect(spark):
        return True
    from sparkdist import _internals

    try:
        _internals.jvm(spark).org.apache.hadoop.fs.FileSystem.getFileSystemClass(
            scheme, _internals.hadoop_conf(spark))
        return True
    except Exception:
        return False


def jvm_path(url: str) -> str:
    """``url`` as Spark's JVM should see it (Databricks paths through their local mount)."""
    where = locate(url)
    return where.path if where.local else url


@contextlib.contextmanager
def jvm_output(spark: Any, url: str) -> Iterator[str]:
    """A path for Spark's own writers (MLlib models, Pipelines) whose files end up at
    ``url``: ``url`` itself when the JVM can write there; otherwise, on a local master (whose
    executors share this disk), a local directory uploaded to ``url`` afterwards."""
    if jvm_can_write(spark, url):
        yield jvm_path(url)
        return
    staging = _staging_dir(spark, url)
    try:
        yield staging
        _upload(staging, locate(url))
    finally:
        shutil.rmtree(os.path.dirname(staging), ignore_errors=True)


def jvm_input(spark: Any, url: str) -> str:
    """A path Spark's own readers can load ``url`` from: ``url`` itself, or (as for
    :func:`jvm_output`) a local copy kept until this process exits, because some MLlib models
    (ALS) read their files lazily."""
    if jvm_can_write(spark, url):
        return jvm_path(url)
    staging = _staging_dir(spark, url)
    atexit.register(shutil.rmtree, os.path.dirname(staging), True)
    where = locate(url)
    where.fs.get(where.path.rstrip("/") + "/", staging, recursive=True)
    return staging


def _upload(local: str, where: Location) -> None:
    """Copy the directory ``local`` to ``where``; on object stores file by file, because
    fsspec's recursive put calls makedirs, which creates a missing bucket."""
    if not _object_store(where.fs):
        where.fs.put(local.rstrip("/") + "/", where.path, recursive=True)
        return
    files = [os.path.join(root, name) for root, _, names in os.walk(local) for name in names]
    if files:
        where.fs.put(files, [f"{where.path}/{os.path.relpath(f, local)}" for f in files])


def _staging_dir(spark: Any, url: str) -> str:
    master = spark.conf.get("spark.master", "") or ""
    if not master.startswith("local"):
        raise ParamError(f"'{url}': Spark on this cluster has no Hadoop filesystem for "
                         f"'{_scheme(url)}://' (add its connector, e.g. hadoop-aws for s3a://, "
                         "or use a path Spark can write).")
    return os.path.join(tempfile.mkdtemp(prefix="sparkdist-stage-"), "data")


# ---------------------------------------------------------------------------- checkpoints
class Checkpoints:
    """Numbered checkpoints (``ckpt-<step>``) in one directory, the last ``keep`` kept.

    A checkpoint is written whole or not at all (:func:`write_bytes`) and carries its length
    and SHA-256: a write cut short by a kill is never picked up, and a damaged file is skipped
    with a warning in favour of the one before it.

    A sharded strategy writes every rank's part of checkpoint ``N`` into a directory
    (:meth:`shard_dir`) before rank 0 commits ``ckpt-N`` naming it. :meth:`save` then keeps
    only the shard directories that kept checkpoints may name: a directory of a dropped
    checkpoint goes, and so do the other directories of number ``N`` (the one ``ckpt-N``
    named before, and any a killed save left uncommitted).
    """

    MAGIC = b"sparkdist-ckpt-1\n"
    _NAME = re.compile(r"ckpt-(\d{10})$")
    _SHARDS = re.compile(r"shards-(\d{10})-(\d{10})$")

    def __init__(self, root: str, keep: int = 3) -> None:
        self.root, self.keep = root.rstrip("/"), max(1, keep)
        self.location = locate(self.root, "checkpointDir")
        self._pending: str | None = None  # the shard directory the next save() commits

    def check_writable(self, param: str = "checkpointDir") -> None:
        """Write, read and delete a probe file, or raise ParamError (StoreError when the
        store cannot be asked); never in a bucket that does not exist."""
        check_bucket(self.location, self.root, param)
        probe = f"{self.root}/.probe-{uuid.uuid4().hex[:8]}"
        try:
            write_bytes(probe, b"ok")
            read_bytes(probe)
            remove(probe)
        except Exception as err:  # any store error: the directory is not usable
            raise ParamError(f"{param}='{self.root}' is not writable ({err}); choose a "
                             f"directory this driver and every executor can write.") from err

    def steps(self) -> list[int]:
        """Steps of the checkpoints present, oldest first."""
        found = (self._NAME.match(name) for name in listdir(self.root))
        return sorted(int(match.group(1)) for match in found if match)

    def save(self, step: int, payload: bytes) -> None:
        """Write checkpoint ``step`` whole, then drop all but the newest ``keep`` and the
        shard directories no kept checkpoint names."""
        body = (self.MAGIC + len(payload).to_bytes(8, "big")
                + hashlib.sha256(payload).digest() + payload)
        write_bytes(self._path(step), body)
        for old in self.steps()[:-self.keep]:
            remove(self._path(old))
        self._prune_shards(step)

    def _prune_shards(self, step: int) -> None:
        """Remove shard directories of checkpoints no longer kept, and those of ``step``
        other than the one just committed (when this object handed it out). A directory of
        another kept number that a killed save left stays until that number is dropped."""
        committed = self._pending
        self._pending = None
        kept = set(self.steps())
        for name in listdir(self.root):
            match = self._SHARDS.match(name)
            if match is None:
                continue
            number, path = int(match.group(1)), f"{self.root}/{name}"
            if number not in kept or (number == step and committed not in (None, path)):
                remove(path)

    def latest(self) -> tuple[int, bytes] | None:
        """The newest checkpoint that reads back whole, or None; damaged ones are skipped."""
        for step in reversed(self.steps()):
            payload = self.read(step)
            if payload is not None:
                return step, payload
        return None

    def read(self, step: int) -> bytes | None:
        body = read_bytes(self._path(step))
        head = len(self.MAGIC)
        size = int.from_bytes(body[head:head + 8], "big")
        digest, payload = body[head + 8:head + 40], body[head + 40:]
        if (body[:head] != self.MAGIC or len(payload) != size
                or hashlib.sha256(payload).digest() != digest):
            _LOG.warning("checkpoint %s is damaged (truncated or altered); using the one "
                         "before it", self._path(step))
            return None
        return payload

    def shard_dir(self, step: int, substep: int = 0) -> str:
        """Where a sharded strategy writes every rank's part of checkpoint ``step`` (after
        ``substep`` steps of the next epoch); the checkpoint file itself names it, and the
        next :meth:`save` of this object commits it."""
        self._pending = f"{self.root}/shards-{step:010d}-{substep:010d}"
        return self._pending

    def _path(self, step: int) -> str:
        return f"{self.root}/ckpt-{step:010d}"
