"""Stores, whole-or-nothing files, the paths a save may replace, and checkpoints (no Spark)."""

from __future__ import annotations

import os
import threading

import pytest

from sparkdist.exceptions import ParamError
from sparkdist.store import (
    Checkpoints,
    PathExistsError,
    check_target,
    create_exclusive,
    exists,
    listdir,
    locate,
    read_bytes,
    remove,
    write_bytes,
)


# ------------------------------------------------------------------------------ paths
@pytest.mark.parametrize("path", ["", "  ", "/", "file:/", "file:///"])
def test_empty_and_root_paths_are_refused(path):
    with pytest.raises(ParamError, match="empty|root"):
        check_target(path)


def test_the_working_directory_and_its_parents_are_refused(tmp_path, monkeypatch):
    work = tmp_path / "project" / "run"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    for path in (".", "./", str(work), "..", str(tmp_path), f"file://{tmp_path}"):
        with pytest.raises(ParamError, match="working directory"):
            check_target(path)
    assert check_target("models/churn").path == str(work / "models" / "churn")


@pytest.mark.parametrize("path", ["s3://bucket", "s3a://bucket/", "gs://bucket"])
def test_bucket_roots_are_refused(path):
    pytest.importorskip("s3fs")
    if path.startswith("gs"):
        pytest.importorskip("gcsfs")
    with pytest.raises(ParamError, match="root of a bucket"):
        check_target(path)


@pytest.mark.parametrize("path", ["ftp://host/models", "foo://bucket/m", "http://x/y"])
def test_unsupported_schemes_name_the_supported_ones(path):
    with pytest.raises(ParamError, match=r"cannot read or write.*s3a://.*gs://.*abfss://"):
        locate(path, "checkpointDir")


def test_object_store_schemes_map_to_their_fsspec_filesystem():
    pytest.importorskip("s3fs")
    for url in ("s3://bucket/models/m", "s3a://bucket/models/m", "s3n://bucket/models/m"):
        where = locate(url)
        assert "s3" in where.fs.protocol and where.path == "bucket/models/m"


def test_a_missing_filesystem_package_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_adlfs(name, *args, **kwargs):
        if name.startswith("adlfs"):
            raise ImportError("No module named 'adlfs'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_adlfs)
    with pytest.raises(ParamError, match=r"adlfs.*sparkdist\[azure\]"):
        locate("abfss://container@account.dfs.core.windows.net/models")


def test_dbfs_and_volume_paths_are_local_paths():
    assert locate("dbfs:/ml/ckpt").path == "/dbfs/ml/ckpt"
    where = locate("/Volumes/main/default/ckpt/run-1")
    assert where.local and where.path == "/Volumes/main/default/ckpt/run-1"


# ------------------------------------------------------------------------------ files
def test_write_bytes_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = str(tmp_path / "dir" / "file")
    write_bytes(target, b"old")
    write_bytes(target, b"new")
    assert read_bytes(target) == b"new" and listdir(str(tmp_path / "dir")) == ["file"]
    remove(str(tmp_path / "dir"))
    assert not exists(str(tmp_path / "dir")) and listdir(str(tmp_path / "dir")) == []


def test_create_exclusive_lets_exactly_one_racing_writer_win(tmp_path):
    target = str(tmp_path / "metadata" / "part-00000")
    start, outcomes = threading.Barrier(8), []

    def writer(i: int) -> None:
        start.wait()
        try:
            create_exclusive(target, f"writer {i}".encode())
            outcomes.append(i)
        except PathExistsError:
            outcomes.append(-1)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [i for i in outcomes if i >= 0]
    assert len(winners) == 1 and read_bytes(target) == f"writer {winners[0]}".encode()
    assert os.listdir(tmp_path / "metadata") == ["part-00000"]


# ------------------------------------------------------------------------------ checkpoints
def test_checkpoints_keep_the_newest_and_read_back(tmp_path):
    checkpoints = Checkpoints(str(tmp_path / "run"), keep=2)
    assert checkpoints.latest() is None and checkpoints.steps() == []
    for step in (1, 2, 3):
        checkpoints.save(step, f"state {step}".encode())
    assert checkpoints.steps() == [2, 3]
    assert checkpoints.latest() == (3, b"state 3")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "ckpt-0000000002", "ckpt-0000000003"]  # no temporaries left


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_a_damaged_latest_checkpoint_falls_back_with_a_warning(tmp_path, caplog, damage):
    checkpoints = Checkpoints(str(tmp_path), keep=3)
    checkpoints.save(1, b"one" * 100)
    checkpoints.save(2, b"two" * 100)
    latest = tmp_path / "ckpt-0000000002"
    body = latest.read_bytes()
    latest.write_bytes({"truncate": body[:-7], "flip": body[:-1] + b"X", "empty": b""}[damage])
    assert checkpoints.latest() == (1, b"one" * 100)
    assert "damaged" in caplog.text and "ckpt-0000000002" in caplog.text


def test_a_save_cut_short_is_never_read(tmp_path):
    checkpoints = Checkpoints(str(tmp_path))
    checkpoints.save(1, b"good")
    (tmp_path / "ckpt-0000000002.tmp-1234abcd").write_bytes(b"half a checkpoint")
    assert checkpoints.steps() == [1] and checkpoints.latest() == (1, b"good")


def test_an_unwritable_directory_names_the_param(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ParamError, match="checkpointDir=.*not writable"):
        Checkpoints(str(blocker / "run")).check_writable()
