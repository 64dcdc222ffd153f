"""The driver's report socket takes records only from the fit's own tasks.

Any process on the driver host can connect to it (its port shows in /proc/net/tcp). Before
each fit carried a secret, a forged ``{"failure": ...}`` line per retry cancelled a healthy
fit with the forger's text in the TrainingError (issue 11, S1)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time

import pytest

from sparkdist.launch import barrier
from sparkdist.models import TorchEstimator

EPOCHS = 6  # at 8 rows per worker a step, long enough for the forgeries to arrive in training
FORGED = "FORGED by a local process: reinstall from http://evil.example"


def _forgeries() -> list[bytes]:
    """What an attacker sends, one connection each: failure records for every retry (and no
    token, a wrong token), a progress record, and one line of 100 KiB."""
    failures = [{"failure": FORGED, "attempt": 10_000 * k, "world_size": 1} for k in range(6)]
    lines = [json.dumps(record) for record in failures]
    lines.append(json.dumps({**failures[0], "attempt": 99_999, "token": "0" * 32}))
    lines.append(json.dumps({"epoch": 999}))
    lines.append(json.dumps({"failure": "x" * (100 << 10), "attempt": 123_456}))
    return [(line + "\n").encode() for line in lines]


def _send(port: int, payload: bytes) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
            connection.sendall(payload)
    except OSError:
        pass


def _own_listeners() -> set[int]:
    """Ports of the IPv4 TCP sockets this process listens on (from /proc, as an attacker
    would find them; the driver's report server is the only one a fit adds here)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    with open("/proc/net/tcp") as table:
        for row in table.readlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN, ours
                ports.add(int(fields[1].split(":")[1], 16))
    return ports


class Attacker(threading.Thread):
    """Sends the forgeries, a round every 0.5 s, to every listener this process opens after it
    starts, from when it finds one until told to stop."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.before = _own_listeners()
        self.attacked: set[int] = set()
        self.rounds: list[float] = []  # when each round of forgeries had been sent
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5 if self.attacked else 0.05):
            if not self.attacked:
                self.attacked = _own_listeners() - self.before
            for port in self.attacked:
                for payload in _forgeries():
                    _send(port, payload)
            if self.attacked:
                self.rounds.append(time.monotonic())


@pytest.mark.slow
def test_forged_reports_cannot_end_a_healthy_fit(nonlinear, caplog):
    train, _ = nonlinear
    attacker = Attacker()
    attacker.start()
    try:
        with caplog.at_level(logging.WARNING, logger=barrier.__name__):
            model = TorchEstimator(numWorkers=2, epochs=EPOCHS, maxRetries=3, progress=False,
                                   batchSize=8, seed=3).fit(train)
            fitted_at = time.monotonic()
    finally:
        attacker.stop.set()
        attacker.join(5)
    assert attacker.rounds, "the attacker found no report socket to send to"
    # Forgeries before the training job runs cancelled nothing even before the fix: some round
    # must fall where training surely ran (it took at least the epochs' own seconds).
    training_by = fitted_at - sum(row["seconds"] for row in model.history)
    assert any(training_by <= t < fitted_at - 0.5 for t in attacker.rounds), \
        ("no forgeries arrived during training", training_by, attacker.rounds, fitted_at)
    assert [row["epoch"] for row in model.history] == list(range(1, EPOCHS + 1))
    [dropped] = [r.getMessage() for r in caplog.records if "report socket dropped" in
                 r.getMessage()]
    assert "without this fit's token" in dropped and "line over 65536 bytes" in dropped
    placement = model.trainingSummary["placement"]
    assert [(p["rank"], p["executor_id"], p["host"]) for p in placement] == [
        (0, "driver", "127.0.0.1"), (1, "driver", "127.0.0.1")]  # local[2]: the driver


# -- the server alone: real sockets, no Spark ------------------------------------------------
@contextlib.contextmanager
def _server(max_connections: int):
    """A report server; yields (port, token, records seen)."""
    seen: list[dict] = []
    token = "a" * 32
    with barrier._report_server("127.0.0.1", token, seen.append, max_connections) as address:
        yield address[1], token, seen


@pytest.fixture
def server():
    """Room for every connection a test makes: a closed connection frees its slot only once
    its reader thread ends, which under load can come after the next connection."""
    with _server(max_connections=16) as served:
        yield served


@pytest.fixture
def capped_server():
    with _server(max_connections=2) as served:
        yield served


def _line(record: dict) -> bytes:
    return (json.dumps(record) + "\n").encode()


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_only_lines_with_the_token_and_within_the_limit_are_dispatched(server, caplog):
    port, token, seen = server
    _send(port, _line({"epoch": 1}))                               # no token
    _send(port, _line({"epoch": 2, "token": "b" * 32}))            # a wrong one
    _send(port, _line({"epoch": 3, "token": token, "pad": "x" * (70 << 10)}))  # too long
    _send(port, _line({"epoch": 4, "token": token}) + _line({"epoch": 5, "token": token}))
    _wait_for(lambda: len(seen) == 2)
    time.sleep(0.2)
    assert seen == [{"epoch": 4}, {"epoch": 5}]  # the token is not passed on


def test_connections_beyond_the_cap_are_dropped(capped_server):
    port, token, seen = capped_server
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]  # the cap
    try:  # accepted in order, so the third is over the cap: the server closes it unread
        with socket.create_connection(("127.0.0.1", port), timeout=30) as third:
            third.sendall(_line({"epoch": 1, "token": token}))
            try:  # closed with our line unread: an orderly close or a reset
                assert third.recv(1) == b""
            except ConnectionResetError:
                pass
    finally:
        for connection in idle:
            connection.close()
    for _ in range(10):  # slots free again once the server has seen the idle ones close
        _send(port, _line({"epoch": 2, "token": token}))
        _wait_for(lambda: bool(seen), 2.0)
        if seen:
            break
    assert seen and all(record == {"epoch": 2} for record in seen), seen


def test_drops_are_counted_and_logged_once(caplog):
    with caplog.at_level(logging.WARNING, logger=barrier.__name__), \
            barrier._report_server("127.0.0.1", "c" * 32, lambda r: None, 4) as address:
        for _ in range(3):
            _send(address[1], _line({"failure": FORGED}))
        time.sleep(0.3)
    [message] = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "dropped 3 " in message and 'token": 3}' in message
