"""All-or-nothing directory writes (no Spark needed)."""

from __future__ import annotations

import pytest

from sparkdist.store import PathExistsError, atomic_directory, exists, remove


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
