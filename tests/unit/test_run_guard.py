"""The run guard's lock and records on local disk (no Spark): simultaneous takeovers of an
expired lock (threads and processes), a paused driver's heartbeat, tampered lock.json and
run.json, and control files that are not regular files or are too large (round 3: N5-N7)."""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sparkdist import store
from sparkdist.exceptions import ParamError
from sparkdist.models import _recovery
from sparkdist.models._recovery import RunGuard

FINGERPRINT = {"epochs": 2, "lr": 0.1}


def _guard(run: Path) -> RunGuard:
    return RunGuard(str(run), "night", FINGERPRINT, "epochs")


def _expired(run: Path) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "lock.json").write_text('{"fit_id": "dead", "host": "h", "pid": 1, "expires": 0}')


def _holder(run: Path) -> str:
    return json.loads((run / "lock.json").read_text())["fit_id"]


# --------------------------------------------------------------------------- N5: takeovers
def _take_over_together(run: Path, takers: int) -> tuple[list[RunGuard], list[Exception]]:
    """``takers`` threads take over the expired lock at the same moment."""
    guards = [_guard(run) for _ in range(takers)]
    won: list[RunGuard] = []
    refused: list[Exception] = []
    start = threading.Barrier(takers)

    def take(guard: RunGuard) -> None:
        start.wait()
        try:
            guard.lock()
            won.append(guard)
        except ParamError as err:
            refused.append(err)

    threads = [threading.Thread(target=take, args=(guard,)) for guard in guards]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return won, refused


def test_n5_of_simultaneous_takeovers_of_an_expired_lock_exactly_one_wins(tmp_path):
    for round_ in range(30):
        run = tmp_path / f"run-{round_}"
        _expired(run)
        won, refused = _take_over_together(run, 6)
        try:
            assert len(won) == 1, f"round {round_}: {len(won)} fits hold the lock"
            assert _holder(run) == won[0].fit_id
            assert len(refused) == 5
            assert all("is in use by another fit" in str(err) for err in refused)
        finally:
            for guard in won:
                guard.unlock()


def _take_in_process(run: str, start: object, wins: object) -> None:
    start.wait()  # type: ignore[attr-defined]
    try:
        _guard(Path(run)).lock()
    except ParamError:
        return
    with wins.get_lock():  # type: ignore[attr-defined]
        wins.value += 1  # type: ignore[attr-defined]


def test_n5_of_simultaneous_takeovers_by_processes_exactly_one_wins(tmp_path):
    context = multiprocessing.get_context("fork")
    for round_ in range(8):
        run = tmp_path / f"run-{round_}"
        _expired(run)
        start, wins = context.Barrier(4), context.Value("i", 0)
        processes = [context.Process(target=_take_in_process, args=(str(run), start, wins))
                     for _ in range(4)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(60)
        assert [p.exitcode for p in processes] == [0] * 4
        assert wins.value == 1, f"round {round_}: {wins.value} fits took over the lock"


def test_n5_a_paused_drivers_heartbeat_does_not_overwrite_the_new_holder(tmp_path,
                                                                        monkeypatch):
    """Every lease expires at once (LEASE_SECONDS=0): the first fit stands for a driver paused
    past its lease. When the second takes the lock over, the first's heartbeat finds another
    fit's lease, stops, and leaves it alone."""
    monkeypatch.setattr(_recovery, "LEASE_SECONDS", 0.0)
    monkeypatch.setattr(_recovery, "HEARTBEAT_SECONDS", 0.01)
    run = tmp_path / "run"
    paused, taker = _guard(run), _guard(run)
    paused.lock()
    try:
        for _ in range(1000):  # the paused fit's heartbeat may win a takeover race
            try:
                taker.lock()
                break
            except ParamError:
                continue
        assert taker._beat is not None, "the second fit never took the expired lock over"
        assert paused._beat is not None
        paused._beat.join(60)
        assert not paused._beat.is_alive(), "the first fit kept renewing a lock it lost"
        assert _holder(run) == taker.fit_id
        paused.unlock()  # not its lock any more: left alone
        assert _holder(run) == taker.fit_id
    finally:
        paused.unlock()
        taker.unlock()
    assert not (run / "lock.json").exists()


# ----------------------------------------------------------------------- N6: tampered files
@pytest.mark.parametrize("text, why", [
    ("[1, 2]", "a JSON list, not an object"),
    ("garbage", "not JSON"),
    ('{"fit_id": "x", "expires": null}', "expires not a finite number"),
    ('{"fit_id": "x", "expires": "soon"}', "expires not a finite number"),
    ('{"fit_id": "x", "expires": "inf"}', "expires not a finite number"),
    ('{"fit_id": "x", "expires": Infinity}', "expires not a finite number"),
    ('{"fit_id": "x", "expires": 1' + "0" * 400 + "}", "expires not a finite number"),
    ('{"fit_id": 7, "expires": 0}', "fit_id is not a string"),
])
def test_n6_a_lock_json_sparkdist_never_writes_is_named(tmp_path, text, why):
    run = tmp_path / "run"
    run.mkdir()
    (run / "lock.json").write_text(text)
    with pytest.raises(ParamError, match=rf"{run}/lock.json is not a lock sparkdist wrote "
                                         rf"\(.*{why}.*\)\. If no fit of runId='night' is "
                                         "running, delete it"):
        _guard(run).lock()
    assert (run / "lock.json").read_text() == text


def test_n6_a_far_future_lease_lasts_one_lease_after_its_write(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lock = run / "lock.json"
    lock.write_text('{"fit_id": "x", "host": "h", "pid": 1, "expires": 1e300}')
    with pytest.raises(ParamError, match=r"in use by another fit \(fit x .* expires at "
                                         r"\d\d:\d\d:\d\d if its driver died"):
        _guard(run).lock()
    written = time.time() - _recovery.LEASE_SECONDS - 1
    os.utime(lock, (written, written))  # last renewed more than a lease ago
    guard = _guard(run)
    guard.lock()
    try:
        assert _holder(run) == guard.fit_id
    finally:
        guard.unlock()


@pytest.mark.parametrize("text, why", [
    ("5", "a JSON int, not an object"),
    ("{bad", "not JSON"),
    ('{"fingerprint": [1], "state": "running"}', "needs a 'fingerprint' object"),
    ('{"fingerprint": "x", "state": "running"}', "needs a 'fingerprint' object"),
    ('{"fingerprint": {}, "state": 3}', "'state' string"),
    ('{"fingerprint": {"epochs": 2}, "state": "complete", "done": "2"}', "whole numbers"),
    ('{"fingerprint": {"epochs": "2"}, "state": "complete", "done": 2}', "whole numbers"),
])
@pytest.mark.parametrize("mode", ["auto", "required"])
def test_n6_a_run_json_sparkdist_never_writes_is_named(tmp_path, text, why, mode):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(text)
    guard = _guard(run)
    with pytest.raises(ParamError, match=rf"{run}/run.json is not a run record sparkdist "
                                         rf"wrote \(.*{why}.*\)\. Use resume='never'"):
        guard.start(mode)
    assert (run / "run.json").read_text() == text


def test_n6_resume_never_replaces_a_foreign_run_json(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("5")
    guard = _guard(run)
    guard.start("never")
    assert json.loads((run / "run.json").read_text())["fit_id"] == guard.fit_id


# --------------------------------------------------------- N7: files that are not files
@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["lock.json", "run.json"])
def test_n7_a_fifo_is_refused_without_blocking(tmp_path, name):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / name)
    with pytest.raises(ParamError, match=rf"{run}/{name}' is not a regular file.*Remove it"):
        _guard(run).lock() if name == "lock.json" else _guard(run).start("auto")


@contextmanager
def memory_capped(extra: int = 2**30) -> Iterator[None]:
    """Cap this process's address space at its current size plus ``extra`` for the block: a
    regression that reads /dev/zero ends in a MemoryError, not in the machine's OOM killer."""
    pages = int(open("/proc/self/statm").read().split()[0])
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (pages * os.sysconf("SC_PAGE_SIZE") + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["lock.json", "run.json"])
def test_n7_a_link_to_dev_zero_is_refused_before_reading(tmp_path, name):
    run = tmp_path / "run"
    run.mkdir()
    os.symlink("/dev/zero", run / name)
    guard = _guard(run)
    with memory_capped(), pytest.raises(ParamError, match=rf"{run}/{name}' is not a regular "
                                                          "file"):
        guard.lock() if name == "lock.json" else guard.start("auto")


@pytest.mark.timeout(60)
def test_n7_a_huge_run_json_is_refused_after_the_limit(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "run.json", "wb") as huge:  # sparse: no disk used
        huge.truncate(store.CONTROL_LIMIT * 20)
    guard = _guard(run)
    with memory_capped(), pytest.raises(ParamError, match=rf"run.json' holds more than "
                                                          rf"{store.CONTROL_LIMIT} bytes"):
        guard.start("auto")


def test_n7_store_reads_refuse_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name in ("fifo", "dir"):
        with pytest.raises(ParamError, match="is not a regular file"):
            store.read_bytes(str(tmp_path / name))
    (tmp_path / "ten").write_bytes(b"0123456789")
    assert store.read_bytes(str(tmp_path / "ten"), limit=10) == b"0123456789"
    with pytest.raises(ParamError, match="holds more than 9 bytes"):
        store.read_bytes(str(tmp_path / "ten"), limit=9)
    with pytest.raises(FileNotFoundError):
        store.read_bytes(str(tmp_path / "absent"))
