"""Paths on any filesystem pyarrow knows (local, file://, hdfs://, s3://, gs://), with
all-or-nothing directory writes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from pyarrow import fs as pafs

from sparkdist.exceptions import SparkdistError


class PathExistsError(SparkdistError, FileExistsError):
    """The target path exists and overwriting was not asked for."""


def resolve(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of ``path`` and the path inside it (relative local paths made absolute)."""
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
