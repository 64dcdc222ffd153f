"""The driver's report socket: where a fit's barrier tasks send progress records, failure
reports and (on local masters) their rendezvous (:mod:`sparkdist.launch.barrier`).

Any process that reaches the driver host can connect (the port shows in the world-readable
``/proc/net/tcp``), so the socket admits a connection in two steps:

- **Unauthenticated**: one thread (a selector, no thread per connection) reads each new
  connection's first line, which must arrive whole within :data:`FIRST_LINE_S` seconds in
  total (a deadline, not a per-read timeout: a client trickling a byte at a time is cut off
  all the same). At most :data:`MAX_PENDING` wait at once; a newer connection evicts the
  oldest, so idle connections cannot keep a rank's out.
- **Authenticated**: a first line carrying the fit's token (and within
  :data:`REPORT_LINE_LIMIT`) moves the connection to a thread of its own, one of at most
  ``max_connections``; only the fit's own tasks hold the token, so only they take these slots.

Whatever is refused (no or a wrong token, an oversized or malformed line, however deeply
nested, no first line in time, a connection over a cap) is dropped, counted and logged once
when the server stops; no client can raise in the server's threads.
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import io
import json
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

_LOG = logging.getLogger(__name__)
#: The longest report line the driver reads (bytes); a longer one ends its connection.
REPORT_LINE_LIMIT = 64 << 10
#: A connection's first, token-bearing line must have arrived whole this many seconds after
#: the connection was accepted.
FIRST_LINE_S = 10.0
#: Connections whose first line has not arrived yet, at most; a newer one evicts the oldest.
MAX_PENDING = 64
_POLL_S = 0.5  # how often the accepting thread looks at its stop event

#: Called with each authentic record; an asking record (``"ask": true``) gets what it returns
#: (True: stop) as its answer.
Dispatch = Callable[[dict[str, Any]], Any]


class _Gate:
    """Who may report: a line must carry this fit's token and fit :data:`REPORT_LINE_LIMIT`;
    at most ``max_connections`` authenticated connections are read at once. Counts what it
    drops."""

    def __init__(self, token: str, max_connections: int) -> None:
        self._token = token.encode()
        self.slots = threading.BoundedSemaphore(max_connections)
        self.dropped: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def authentic(self, record: Any) -> bool:
        token = record.pop("token", None) if isinstance(record, dict) else None
        return isinstance(token, str) and hmac.compare_digest(token.encode(), self._token)

    def drop(self, why: str) -> None:
        with self._lock:
            self.dropped[why] += 1


@contextlib.contextmanager
def report_server(host: str | None, token: str, dispatch: Dispatch,
                  max_connections: int) -> Iterator[tuple[str, int] | None]:
    """Listen on ``host`` (the driver's) while the block runs; pass every authentic record to
    ``dispatch`` (a rendezvous record joins the rendezvous instead). Yields the address to
    give the tasks, or None when ``host`` is None (no report channel)."""
    if host is None:
        yield None
        return
    gate = _Gate(token, max_connections)
    server = socket.create_server((host, 0))
    server.setblocking(False)
    stop = threading.Event()
    doorman = _Doorman(server, gate, dispatch, _Gatherer())
    thread = threading.Thread(target=doorman.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        yield host, server.getsockname()[1]
    finally:
        stop.set()
        with contextlib.suppress(OSError):  # wakes the select now, not at its next poll
            server.shutdown(socket.SHUT_RDWR)
        thread.join(5)
        server.close()
        if gate.dropped:
            _LOG.warning("the report socket dropped %d unauthenticated or oversized "
                         "report(s)/connection(s) from %s: %s", sum(gate.dropped.values()),
                         host, dict(gate.dropped))


@dataclass
class _Pending:
    """A connection whose first line has not arrived whole yet."""

    deadline: float
    received: bytearray = field(default_factory=bytearray)


class _Doorman:
    """Accepts connections and reads their first line, all in one thread (non-blocking
    sockets, a selector); hands each authenticated connection to a reader thread."""

    def __init__(self, server: socket.socket, gate: _Gate, dispatch: Dispatch,
                 gatherer: _Gatherer) -> None:
        self.server, self.gate, self.dispatch, self.gatherer = server, gate, dispatch, gatherer
        self.selector = selectors.DefaultSelector()
        #: Oldest first: the one a new connection evicts when :data:`MAX_PENDING` wait.
        self.pending: collections.OrderedDict[socket.socket, _Pending] = (
            collections.OrderedDict())

    def serve(self, stop: threading.Event) -> None:
        self.selector.register(self.server, selectors.EVENT_READ)
        try:
            while not stop.is_set():
                now = time.monotonic()
                wait = min([_POLL_S] + [p.deadline - now for p in self.pending.values()])
                for key, _ in self.selector.select(max(0.0, wait)):
                    if key.fileobj is self.server:
                        self._accept()
                    else:  # read what arrived before expiring: a late wake-up drops nothing
                        self._read(key.fileobj)  # type: ignore[arg-type]
                self._expire()
        finally:
            for connection in list(self.pending):
                self._close(connection)
            self.selector.close()

    def _accept(self) -> None:
        try:
            connection, _ = self.server.accept()
        except OSError:  # no connection after all, or the server is shutting down
            return
        if len(self.pending) >= MAX_PENDING:
            self._close(next(iter(self.pending)), "evicted while waiting for its first line")
        connection.setblocking(False)
        self.pending[connection] = _Pending(time.monotonic() + FIRST_LINE_S)
        self.selector.register(connection, selectors.EVENT_READ)

    def _read(self, connection: socket.socket) -> None:
        waiting = self.pending.get(connection)
        if waiting is None:  # closed earlier in this round (evicted)
            return
        try:
            chunk = connection.recv(REPORT_LINE_LIMIT)
        except BlockingIOError:
            return
        except OSError:
            self._close(connection, "connection reset")
            return
        if not chunk:  # closed before a whole line (an empty connection is not counted)
            self._close(connection, "connection closed mid-line" if waiting.received else None)
            return
        waiting.received += chunk
        end = waiting.received.find(b"\n")
        if end < 0:
            if len(waiting.received) > REPORT_LINE_LIMIT:
                self._close(connection, f"line over {REPORT_LINE_LIMIT} bytes")
            return
        record = check_line(bytes(waiting.received[:end + 1]), self.gate)
        if isinstance(record, str):
            self._close(connection, record)
            return
        self._admit(connection, record, bytes(waiting.received[end + 1:]))

    def _admit(self, connection: socket.socket, record: dict[str, Any], rest: bytes) -> None:
        """An authenticated connection: its own reader thread, if a slot is free."""
        self.selector.unregister(connection)
        del self.pending[connection]
        if not self.gate.slots.acquire(blocking=False):
            self.gate.drop("connection over the cap")
            connection.close()
            return
        connection.setblocking(True)  # authenticated: rank 0 reports once an epoch
        threading.Thread(target=_read_reports, daemon=True,
                         args=(connection, record, rest, self.gate, self.dispatch,
                               self.gatherer)).start()

    def _expire(self) -> None:
        now = time.monotonic()
        for connection in [c for c, p in self.pending.items() if p.deadline <= now]:
            self._close(connection, f"no whole first line within {FIRST_LINE_S:.0f} s")

    def _close(self, connection: socket.socket, why: str | None = None) -> None:
        if why is not None:
            self.gate.drop(why)
        self.pending.pop(connection, None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(connection)
        connection.close()


class _Replay(io.RawIOBase):
    """A socket's bytes, starting with those already read from it."""

    def __init__(self, head: bytes, connection: socket.socket) -> None:
        super().__init__()
        self._head, self._connection = head, connection

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size], self._head = self._head[:size], self._head[size:]
            return size
        return self._connection.recv_into(buffer)


def _read_reports(connection: socket.socket, first: dict[str, Any], rest: bytes, gate: _Gate,
                  dispatch: Dispatch, gatherer: _Gatherer) -> None:
    """Handle an authenticated connection's records, ``first`` and then each later line,
    until it closes or sends a bad line (which ends it)."""
    try:
        with connection, io.BufferedReader(_Replay(rest, connection)) as lines:
            record: dict[str, Any] | str = first
            while isinstance(record, dict):
                _handle(record, connection, gate, dispatch, gatherer)
                line = lines.readline(REPORT_LINE_LIMIT + 1)
                record = check_line(line, gate) if line else ""
            if record:
                gate.drop(record)
    except OSError:
        gate.drop("connection reset")
    except Exception as err:  # a record this code did not foresee: never a thread traceback
        gate.drop("malformed record")
        _LOG.debug("report connection ended: %r", err)
    finally:
        gatherer.leave(connection)
        gate.slots.release()


def _handle(record: dict[str, Any], connection: socket.socket, gate: _Gate,
            dispatch: Dispatch, gatherer: _Gatherer) -> None:
    if "rendezvous" in record:  # the gatherer answers on this connection
        if not gatherer.join(record, connection):
            gate.drop("malformed rendezvous")
        return
    answer = None
    try:
        answer = dispatch(record)
    except Exception as err:  # a bad record must not stop training
        _LOG.warning("ignoring a progress record: %s", err)
    if record.get("ask") is True:  # rank 0 waits for the answer on this connection
        connection.sendall(json.dumps({"stop": answer is True}).encode() + b"\n")


def check_line(line: bytes, gate: _Gate) -> dict[str, Any] | str:
    """The authentic record in ``line``, or why it is dropped."""
    if len(line) > REPORT_LINE_LIMIT:
        return f"line over {REPORT_LINE_LIMIT} bytes"
    try:
        record = json.loads(line)
        authentic = gate.authentic(record)
    except Exception:  # not JSON, nested past the recursion limit, a token that is not text
        return "not JSON"
    return record if authentic else "without this fit's token"


class _Gatherer:
    """The driver's side of the rendezvous: keeps each rank's connection until every rank of
    its stage attempt has sent its message, then answers them all with the messages by rank.

    Ranks gather by stage id (pyspark's task context has no stage attempt number) and task
    id: the task ids of one attempt lie within ``world_size`` of each other and a retry's are
    all higher (as barrier's ``_Attempts`` assumes), so a rank of a newer attempt evicts what
    an older attempt's ranks left waiting, and an older attempt's late rank is turned away. A
    connection that closes first leaves its group (its task died)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, dict[int, tuple[int, str, socket.socket]]] = {}

    def join(self, record: dict[str, Any], connection: socket.socket) -> bool:
        """Add a rank's rendezvous record; False for a malformed or stale one."""
        try:
            key, rank, world = str(record["key"]), int(record["rank"]), int(record["world_size"])
            task, message = int(record["task"]), str(record["rendezvous"])
        except (KeyError, TypeError, ValueError, OverflowError):
            return False
        if not 0 <= rank < world:
            return False
        with self._lock:
            group = self._waiting.setdefault(key, {})
            if any(task <= other - world for other, _, _ in group.values()):
                return False  # a rank of an earlier attempt, arriving late
            stale = [r for r, (other, _, _) in group.items() if other <= task - world]
            evicted = [group.pop(r)[2] for r in stale]
            group[rank] = (task, message, connection)
            done = len(group) == world
            if done:
                del self._waiting[key]
        for old in evicted:  # their task is gone or about to be: do not leave them waiting
            with contextlib.suppress(OSError):
                old.shutdown(socket.SHUT_RDWR)
        if done:
            line = (json.dumps([group[r][1] for r in range(world)]) + "\n").encode()
            for _, _, waiting in group.values():
                with contextlib.suppress(OSError):  # that rank is gone: its peers time out
                    waiting.sendall(line)
        return True

    def leave(self, connection: socket.socket) -> None:
        with self._lock:
            for key, group in list(self._waiting.items()):
                for rank in [r for r, (_, _, c) in group.items() if c is connection]:
                    del group[rank]
                if not group:
                    del self._waiting[key]
