"""The primitives :mod:`sparkdist.store` builds its guarantees on where fsspec offers none: a
local read that refuses anything but a regular file and cannot block, a lock on a local
directory, and S3's conditional requests (a GET that returns its ETag, the answers of
``If-Match``/``If-None-Match`` requests). Private: use :mod:`sparkdist.store`."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterator
from datetime import timezone
from typing import Any

from sparkdist.exceptions import ParamError

_LOG = logging.getLogger(__name__)


def read_local(path: str, url: str, limit: int | None) -> tuple[bytes, float]:
    """A regular file's bytes (at most ``limit + 1``) and mtime; anything else is refused
    before it is read: by its stat before opening, and by the opened file's own stat (the name
    may be swapped in between; O_NONBLOCK: opening a FIFO then returns at once)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise _not_regular(url)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    with open(os.open(path, flags | getattr(os, "O_BINARY", 0)), "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(url)
        return (file.read() if limit is None else file.read(limit + 1)), info.st_mtime


def _not_regular(url: str) -> ParamError:
    return ParamError(f"'{url}' is not a regular file (a FIFO, device, socket or directory, "
                      "or a link to one): sparkdist reads only files it wrote there. Remove "
                      "it, or replace it with the file it stands for.")


@contextlib.contextmanager
def directory_lock(path: str, local: bool) -> Iterator[None]:
    """Hold an exclusive flock on the directory of ``path`` (local stores), so that compare-
    and-swaps of files in it run one at a time across threads and processes; it is released
    when the holder closes it or dies. Elsewhere (and where the mount refuses flock) nothing."""
    directory = os.path.dirname(path)
    if os.name == "nt" or not local or not os.path.isdir(directory):
        yield  # (no directory: no file to compare either)
        return
    import fcntl

    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as err:  # e.g. a FUSE mount without locks: checked, then written
            _LOG.debug("no flock on %s (%s)", path, err)
        yield
    finally:
        os.close(fd)


def modified(fs: Any, path: str) -> float | None:
    """When the store last wrote ``path`` (HDFS, GCS, Azure: fsspec's ``modified``), or None
    where it does not say. A naive time is the store's UTC."""
    try:
        when = fs.modified(path)
    except (NotImplementedError, OSError):
        return None
    return float((when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp())


def s3_get(fs: Any, path: str, limit: int | None) -> tuple[bytes, str, float]:
    """One GET: the bytes (at most ``limit + 1``), the ETag and LastModified (seconds since
    the epoch) of one version."""
    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(path)

    async def get() -> tuple[bytes, str, float]:
        response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
        try:
            data = await response["Body"].read(None if limit is None else limit + 1)
        finally:
            response["Body"].close()
        return bytes(data), str(response["ETag"]), response["LastModified"].timestamp()

    return sync(fs.loop, get)


def s3_conditional(request: Any) -> bool:
    """Run a conditional S3 request: False when S3 refused its condition (412), found the
    object gone (404), or saw a concurrent conditional write (409: another caller won)."""
    try:
        request()
    except FileNotFoundError:
        return False
    except OSError as err:
        if s3_code(err) in ("PreconditionFailed", "ConditionalRequestConflict"):
            return False
        raise
    return True


def s3_code(err: OSError) -> str | None:
    """The S3 error code behind an error s3fs translated (botocore's ClientError)."""
    return getattr(err.__cause__, "response", {}).get("Error", {}).get("Code")
