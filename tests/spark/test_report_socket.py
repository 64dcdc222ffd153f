"""The driver's report socket takes records only from the fit's own tasks.

Any process on the driver host can connect to it (its port shows in /proc/net/tcp). Before
each fit carried a secret, a forged ``{"failure": ...}`` line per retry cancelled a healthy
fit with the forger's text in the TrainingError (issue 11, S1)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import select
import socket
import subprocess
import sys
import threading
import time

import pytest
from pyspark import cloudpickle

from sparkdist.launch import report
from sparkdist.launch.barrier import run_barrier
from sparkdist.models import TorchEstimator

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers travel by value

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
        with caplog.at_level(logging.WARNING, logger=report.__name__):
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


#: Another local process's slow loris (round 3, N2): it holds ``IDLE`` connections to the
#: port it reads from stdin, each sent a "{" and then a byte every 3 s (within any per-read
#: timeout), reconnecting any the server closes; it prints the monotonic time once it first
#: holds them all, and how many it opened.
SLOW_LORIS = """
import socket, sys, time
port, idle = int(sys.stdin.readline()), int(sys.argv[1])
held, opened, announced = [None] * idle, 0, False
while True:
    for i in range(idle):
        if held[i] is None:
            try:
                held[i] = socket.create_connection(("127.0.0.1", port), timeout=2)
                held[i].sendall(b"{")
                opened += 1
            except OSError:
                held[i] = None
    if not announced and all(held):
        print("holding", time.monotonic(), flush=True)
        announced = True
    print("opened", opened, flush=True)
    time.sleep(3)
    for i, connection in enumerate(held):
        try:
            connection.sendall(b" ")
        except (OSError, AttributeError):
            held[i] = None
"""
IDLE = 10  # more than the 2 * numWorkers + 4 = 8 connections a 2-worker fit admits at once


@pytest.mark.slow
def test_a_fit_succeeds_while_another_process_holds_idle_connections(nonlinear):
    """Round 3, N2: idle connections took every slot of the report socket, so the ranks'
    rendezvous through it (local masters) was turned away and every attempt failed ("The
    last failure: None")."""
    train, _ = nonlinear
    before = _own_listeners()
    loris = subprocess.Popen([sys.executable, "-c", SLOW_LORIS, str(IDLE)], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    aimed = threading.Event()

    def aim() -> None:  # give the slow loris the fit's report port as soon as it listens
        while not aimed.wait(0.02):
            found = _own_listeners() - before
            if found:
                loris.stdin.write(f"{min(found)}\n")
                loris.stdin.flush()
                aimed.set()

    aiming = threading.Thread(target=aim, daemon=True)
    aiming.start()
    try:
        model = TorchEstimator(numWorkers=2, epochs=3, maxRetries=1, progress=False,
                               batchSize=8, seed=3).fit(train)
        fitted_at = time.monotonic()
    finally:
        aimed.set()
        loris.kill()
        output = loris.communicate(timeout=30)[0].split("\n")
    holding = [float(line.split()[1]) for line in output if line.startswith("holding")]
    opened = [int(line.split()[1]) for line in output if line.startswith("opened")]
    assert holding and opened[-1] >= IDLE, output
    # the connections were held before training began (the rendezvous comes before it)
    assert holding[0] < fitted_at - sum(row["seconds"] for row in model.history)
    assert [row["epoch"] for row in model.history] == [1, 2, 3]


# -- the server alone: real sockets, no Spark ------------------------------------------------
@contextlib.contextmanager
def _server(max_connections: int):
    """A report server; yields (port, token, records seen)."""
    seen: list[dict] = []
    token = "a" * 32
    with report.report_server("127.0.0.1", token, seen.append, max_connections) as address:
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


def test_authenticated_connections_beyond_the_cap_are_dropped(capped_server):
    port, token, seen = capped_server
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]  # the cap
    try:
        for connection in held:  # authenticated, and kept open: each holds a slot
            connection.sendall(_line({"epoch": 0, "token": token}))
        _wait_for(lambda: len(seen) == 2)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as third:
            third.sendall(_line({"epoch": 1, "token": token}))
            try:  # closed by the server: an orderly close or a reset
                assert third.recv(1) == b""
            except ConnectionResetError:
                pass
    finally:
        for connection in held:
            connection.close()
    for _ in range(10):  # slots free again once the server has seen the held ones close
        _send(port, _line({"epoch": 2, "token": token}))
        _wait_for(lambda: len(seen) > 2, 2.0)
        if len(seen) > 2:
            break
    assert seen[:2] == [{"epoch": 0}] * 2 and seen[2:] and \
        all(record == {"epoch": 2} for record in seen[2:]), seen


def test_idle_connections_take_no_slot_and_the_oldest_waiting_are_evicted(monkeypatch, caplog):
    """Round 3, N2: idle connections (a "{" and no line end) filled the cap of authenticated
    ones; now they wait apart, at most MAX_PENDING of them, the oldest evicted first."""
    monkeypatch.setattr(report, "MAX_PENDING", 4)
    with caplog.at_level(logging.WARNING, logger=report.__name__), \
            _server(max_connections=2) as (port, token, seen):
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
        try:
            for connection in idle:
                connection.sendall(b"{")
            for _ in range(10):  # accepted after the idle ones (queued before it, if not yet)
                _send(port, _line({"epoch": 1, "token": token}))
                _wait_for(lambda: bool(seen), 2.0)
                if seen:
                    break
            assert seen and seen[0] == {"epoch": 1}
            assert any(_closed_by_server(connection) for connection in idle[:4])
        finally:
            for connection in idle:
                connection.close()
    [message] = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "evicted while waiting for its first line" in message


def _closed_by_server(connection: socket.socket, wait_s: float = 5.0) -> bool:
    """Whether the server closed ``connection`` (it never sends to a client that has not
    authenticated, so any readable state means closed)."""
    if not select.select([connection], [], [], wait_s)[0]:
        return False
    try:
        return connection.recv(1) == b""
    except OSError:
        return True


def test_a_trickled_first_line_is_cut_off_at_its_deadline(monkeypatch, caplog):
    """A client that sends a byte more often than any per-read timeout still loses its
    connection once the first line's total deadline has passed (1 s here, 10 s in fits)."""
    monkeypatch.setattr(report, "FIRST_LINE_S", 1.0)
    with caplog.at_level(logging.WARNING, logger=report.__name__), \
            _server(max_connections=2) as (port, token, seen):
        with socket.create_connection(("127.0.0.1", port)) as connection:
            connection.sendall(b"{")
            closed, started = False, time.monotonic()
            while not closed and time.monotonic() - started < 30:  # 5 bytes a second
                try:
                    connection.sendall(b" ")
                except OSError:  # the server's reset of the connection it closed
                    break
                closed = _closed_by_server(connection, 0.2)
            else:
                assert closed, "a trickling connection kept its place for 30 s"
        _send(port, _line({"epoch": 1, "token": token}))  # the server still serves
        _wait_for(lambda: bool(seen))
        assert seen == [{"epoch": 1}]
    [message] = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "no whole first line within 1 s" in message


def test_a_deeply_nested_line_is_a_counted_drop_not_a_thread_traceback(caplog):
    """Round 3, N2 (E4): ``json.loads`` raises RecursionError on a 60,000-deep line."""
    crashed: list[BaseException] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: crashed.append(args.exc_value)  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.WARNING, logger=report.__name__), \
                report.report_server("127.0.0.1", "d" * 32, lambda r: None, 4) as address:
            _send(address[1], b"[" * 60_000 + b"\n")
            _send(address[1], b'{"token": "' + b"\\ud800" + b'"}\n')  # a token that is no text
            time.sleep(0.5)
    finally:
        threading.excepthook = hook
    assert crashed == []
    [message] = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "dropped 2 " in message and "'not JSON': 2" in message


def test_drops_are_counted_and_logged_once(caplog):
    with caplog.at_level(logging.WARNING, logger=report.__name__), \
            report.report_server("127.0.0.1", "c" * 32, lambda r: None, 4) as address:
        for _ in range(3):
            _send(address[1], _line({"failure": FORGED}))
        time.sleep(0.3)
    [message] = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "dropped 3 " in message and 'token": 3}' in message


# -- what a rank returns --------------------------------------------------------------------
def _echo(context, batches, args):
    for _ in batches:
        pass
    return args["payload"]


class _Planted:
    """Unpickled, it creates the directory ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_rank_results_come_back_as_bytes_never_unpickled(spark, tmp_path):
    """docs/deep-models.md's claim: what rank 0 returns reaches the caller as the same bytes, and
    nothing in them is unpickled on the driver (Spark's collect wraps them in its own
    pickle stream; a plain ``pickle.loads`` of them would create ``planted``)."""
    planted = tmp_path / "planted"
    payload = pickle.dumps(_Planted(str(planted)))
    result = run_barrier(spark.range(2, numPartitions=2), _echo, {"payload": payload}, 2)
    assert result == payload and not planted.exists()


def test_an_asking_record_is_answered_on_its_connection_and_others_are_not():
    """Rank 0 of a fit under a Tuner asks after each epoch whether to stop: the answer is
    what the dispatch returned (True only for stop), on the asking connection."""
    token = "c" * 32
    answers = iter([None, True])
    with report.report_server("127.0.0.1", token, lambda record: next(answers), 4) as address, \
            socket.create_connection(address, timeout=5) as connection, \
            connection.makefile("rb") as lines:
        connection.sendall(_line({"epoch": 1, "token": token}))  # a plain report: no answer
        connection.sendall(_line({"epoch": 2, "ask": True, "token": token}))
        assert json.loads(lines.readline()) == {"stop": True}
        connection.sendall(_line({"epoch": 3, "ask": True, "token": token}))  # raises inside
        assert json.loads(lines.readline()) == {"stop": False}
