"""Paths on any filesystem pyarrow knows (local, file://, hdfs://, s3://, gs://; dbfs:/ and
/Volumes through Databricks' local mounts), all-or-nothing directory writes, and numbered
checkpoints that are never read half-written.

Examples
--------
>>> checkpoints = Checkpoints("/tmp/ckpt/run-1", keep=2)
>>> checkpoints.save(3, b"weights...")
>>> checkpoints.latest()
(3, b'weights...')
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow
from pyarrow import fs as pafs

from sparkdist.exceptions import ParamError, SparkdistError

_LOG = logging.getLogger(__name__)


class PathExistsError(SparkdistError, FileExistsError):
    """The target path exists and overwriting was not asked for."""


def resolve(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of ``path`` and the path inside it (relative local paths made absolute)."""
    if path.startswith("dbfs:/"):  # Databricks mounts DBFS at /dbfs on every node
        path = "/dbfs/" + path[len("dbfs:/"):].lstrip("/")
    if "://" not in path and not path.startswith("file:"):
        path = os.path.abspath(path)
    return pafs.FileSystem.from_uri(path)


def exists(path: str) -> bool:
    filesystem, inner = resolve(path)
    return filesystem.get_file_info(inner).type != pafs.FileType.NotFound


def remove(path: str) -> None:
    filesystem, inner = resolve(path)
    info = filesystem.get_file_info(inner)
    if info.type == pafs.FileType.Directory:
        filesystem.delete_dir(inner)
    elif info.type != pafs.FileType.NotFound:
        filesystem.delete_file(inner)


@contextmanager
def atomic_directory(path: str, overwrite: bool = False) -> Iterator[str]:
    """Yield a temporary sibling of ``path`` to write into; on success it replaces ``path``.

    A failure part-way leaves ``path`` as it was (the temporary directory is removed), so
    readers never see a half-written directory.
    """
    path = path.rstrip("/")
    if exists(path) and not overwrite:
        raise PathExistsError(f"'{path}' already exists; choose a new path, or overwrite it "
                              "explicitly (model.write().overwrite().save(path)).")
    temp = f"{path}._tmp-{uuid.uuid4().hex[:8]}"
    try:
        yield temp
        if exists(path):
            remove(path)
        filesystem, inner = resolve(temp)
        filesystem.move(inner, resolve(path)[1])
    finally:
        if exists(temp):
            remove(temp)


class Checkpoints:
    """Numbered checkpoints (``ckpt-<step>``) in one directory, the last ``keep`` kept.

    A checkpoint is written to a temporary name and renamed into place, and carries its length
    and SHA-256: a write cut short by a kill is never picked up, and a damaged file is skipped
    with a warning in favour of the one before it.
    """

    MAGIC = b"sparkdist-ckpt-1\n"
    _NAME = re.compile(r"ckpt-(\d{10})$")

    def __init__(self, root: str, keep: int = 3) -> None:
        self.root, self.keep = root.rstrip("/"), max(1, keep)
        self.filesystem, self.inner = resolve(self.root)

    def check_writable(self, param: str = "checkpointDir") -> None:
        """Create the directory and write, read and delete a probe file, or raise ParamError."""
        probe = f"{self.inner}/.probe-{uuid.uuid4().hex[:8]}"
        try:
            self.filesystem.create_dir(self.inner, recursive=True)
            with self.filesystem.open_output_stream(probe) as out:
                out.write(b"ok")
            self.filesystem.delete_file(probe)
        except (OSError, pyarrow.ArrowException) as err:
            raise ParamError(f"{param}='{self.root}' is not writable ({err}); choose a "
                             f"directory this driver and every executor can write.") from err

    def steps(self) -> list[int]:
        """Steps of the checkpoints present, oldest first."""
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(self.inner))
        except FileNotFoundError:
            return []
        found = (self._NAME.match(info.base_name) for info in infos)
        return sorted(int(match.group(1)) for match in found if match)

    def save(self, step: int, payload: bytes) -> None:
        """Write checkpoint ``step`` atomically, then drop all but the newest ``keep``."""
        body = (self.MAGIC + len(payload).to_bytes(8, "big")
                + hashlib.sha256(payload).digest() + payload)
        final = self._path(step)
        temp = f"{final}.tmp-{uuid.uuid4().hex[:8]}"
        self.filesystem.create_dir(self.inner, recursive=True)
        try:
            with self.filesystem.open_output_stream(temp) as out:
                out.write(body)
            self.filesystem.move(temp, final)
        finally:
            if self.filesystem.get_file_info(temp).type != pafs.FileType.NotFound:
                self.filesystem.delete_file(temp)
        for old in self.steps()[:-self.keep]:
            self.filesystem.delete_file(self._path(old))

    def latest(self) -> tuple[int, bytes] | None:
        """The newest checkpoint that reads back whole, or None; damaged ones are skipped."""
        for step in reversed(self.steps()):
            payload = self.read(step)
            if payload is not None:
                return step, payload
        return None

    def read(self, step: int) -> bytes | None:
        with self.filesystem.open_input_stream(self._path(step)) as stream:
            body = stream.read()
        head = len(self.MAGIC)
        size = int.from_bytes(body[head:head + 8], "big")
        digest, payload = body[head + 8:head + 40], body[head + 40:]
        if (body[:head] != self.MAGIC or len(payload) != size
                or hashlib.sha256(payload).digest() != digest):
            _LOG.warning("checkpoint %s is damaged (truncated or altered); using the one "
                         "before it", self._path(step))
            return None
        return payload

    def _path(self, step: int) -> str:
        return f"{self.inner}/ckpt-{step:010d}"
