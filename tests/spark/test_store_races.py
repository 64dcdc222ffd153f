"""Races on S3, against a real S3 API server (moto) on AWS_ENDPOINT_URL: simultaneous exclusive
creates (the commit of a save without overwrite) and simultaneous takeovers of an expired run
lock each have exactly one winner; a paused driver's heartbeat leaves the new holder's lock
alone (round 3: N5 and docs/reliability.md's "refused instead of deleted").

The server is the one tests/spark/test_object_store.py starts on that port (session-scoped)
when it runs first; otherwise this module starts one there for itself. No Spark needed."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable

import pytest

from sparkdist import store
from sparkdist.exceptions import ParamError
from sparkdist.models import _recovery
from sparkdist.models._recovery import RunGuard
from sparkdist.store import PathExistsError

BUCKET = "sparkdist-races"
TAKERS = 8


@pytest.fixture(scope="module")
def s3(moto_s3) -> object:
    """The moto S3 server (tests/conftest.py) with BUCKET: an s3fs filesystem."""
    if not moto_s3.exists(BUCKET):
        moto_s3.mkdir(BUCKET)
    return moto_s3


@pytest.fixture
def prefix(s3) -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"


def _together(actions: list[Callable[[], None]]) -> tuple[int, list[Exception]]:
    """Run ``actions`` in threads released at the same moment: (how many returned, errors)."""
    start, wins, errors = threading.Barrier(len(actions)), [], []

    def run(action: Callable[[], None]) -> None:
        start.wait()
        try:
            action()
            wins.append(1)
        except Exception as err:  # collected: the test checks their types
            errors.append(err)

    threads = [threading.Thread(target=run, args=(action,)) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return len(wins), errors


def test_of_simultaneous_exclusive_creates_on_s3_exactly_one_wins(s3, prefix):
    for round_ in range(10):
        url = f"{prefix}/metadata-{round_}"
        wins, errors = _together([lambda i=i, u=url: store.create_exclusive(u, b"%d" % i)
                                  for i in range(TAKERS)])
        assert wins == 1, f"round {round_}: {wins} writers committed"
        assert len(errors) == TAKERS - 1
        assert all(isinstance(err, PathExistsError) for err in errors), errors


def _guard(run: str) -> RunGuard:
    return RunGuard(run, "night", {"epochs": 2}, "epochs")


def test_n5_of_simultaneous_takeovers_on_s3_exactly_one_wins(s3, prefix):
    for round_ in range(6):
        run = f"{prefix}/run-{round_}"
        store.write_bytes(f"{run}/lock.json", b'{"fit_id": "dead", "expires": 0}')
        guards = [_guard(run) for _ in range(TAKERS)]
        wins, errors = _together([guard.lock for guard in guards])
        holder = json.loads(store.read_bytes(f"{run}/lock.json"))["fit_id"]
        for guard in guards:
            guard.unlock()
        assert wins == 1, f"round {round_}: {wins} fits hold the lock"
        assert all(isinstance(err, ParamError) and "in use by another fit" in str(err)
                   for err in errors), errors
        assert holder in {guard.fit_id for guard in guards}
        assert not s3.exists(f"{run}/lock.json")  # released by its holder


def test_n5_a_paused_drivers_heartbeat_leaves_the_new_holders_lock_on_s3(s3, prefix,
                                                                        monkeypatch):
    """As tests/unit/test_run_guard.py: every lease expires at once, so the first fit stands
    for a driver paused past its lease; the second takes the lock over."""
    monkeypatch.setattr(_recovery, "LEASE_SECONDS", 0.0)
    monkeypatch.setattr(_recovery, "HEARTBEAT_SECONDS", 0.05)
    run = f"{prefix}/run"
    paused, taker = _guard(run), _guard(run)
    paused.lock()
    try:
        for _ in range(200):
            try:
                taker.lock()
                break
            except ParamError:  # the paused fit's heartbeat renewed first
                continue
        assert taker._beat is not None and paused._beat is not None
        paused._beat.join(60)
        assert not paused._beat.is_alive(), "the first fit kept renewing a lock it lost"
        assert json.loads(store.read_bytes(f"{run}/lock.json"))["fit_id"] == taker.fit_id
    finally:
        paused.unlock()
        taker.unlock()
    assert not s3.exists(f"{run}/lock.json")
