"""All-or-nothing directory writes and checkpoints (no Spark needed)."""

from __future__ import annotations

import pytest

from sparkdist.exceptions import ParamError
from sparkdist.store import Checkpoints, PathExistsError, atomic_directory, exists, remove, resolve


def _write(directory: str, text: str) -> None:
    from pathlib import Path

    Path(directory).mkdir(parents=True)
    (Path(directory) / "part").write_text(text)


def test_success_moves_the_directory_into_place(tmp_path):
    target = str(tmp_path / "model")
    with atomic_directory(target) as temp:
        assert temp != target and not exists(target)
        _write(temp, "new")
    assert (tmp_path / "model" / "part").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary left


def test_existing_path_is_refused_without_overwrite(tmp_path):
    _write(str(tmp_path / "model"), "old")
    with pytest.raises(PathExistsError, match="overwrite"), \
            atomic_directory(str(tmp_path / "model")):
        pytest.fail("the block must not run")
    assert (tmp_path / "model" / "part").read_text() == "old"


def test_failure_keeps_the_old_directory_and_leaves_no_temporary(tmp_path):
    _write(str(tmp_path / "model"), "old")
    with pytest.raises(RuntimeError, match="disk full"), \
            atomic_directory(str(tmp_path / "model"), overwrite=True) as temp:
        _write(temp, "half")
        raise RuntimeError("disk full")
    assert (tmp_path / "model" / "part").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_overwrite_replaces_and_relative_paths_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write("model", "old")
    with atomic_directory("model/", overwrite=True) as temp:
        _write(temp, "new")
    assert (tmp_path / "model" / "part").read_text() == "new"
    remove("model")
    assert not exists("model")


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


def test_dbfs_paths_map_to_the_local_mount():
    assert resolve("dbfs:/ml/ckpt")[1] == "/dbfs/ml/ckpt"


def test_unity_catalog_volume_paths_are_local_paths():
    filesystem, inner = resolve("/Volumes/main/default/ckpt/run-1")
    assert inner == "/Volumes/main/default/ckpt/run-1"
    assert filesystem.type_name == "local"
