"""Asynchronous parameter servers (``strategy="ps"`` with ``maxStaleness > 0``).

The rows are split as in :mod:`sparkdist.torchtrain.tables` (row ``i`` on server ``i % k``
at ``i // k``), but no exchange is collective. Each server rank runs a serving thread that
answers requests as they come, on two process groups of their own (requests on one, answers
on the other, so neither pairs up with the loop's collectives): a pull sends the ids a server
holds and waits for their rows; a push sends the ids and their gradients and goes on, and the
server applies it alone, as one sparse optimizer step (Adagrad, or Adam's rule), at the rate
and scale the push carries. Messages from one rank arrive in order, so a rank's next pull
sees its own pushes; what it sees of the others' depends on timing. The staleness is bounded
by the dense layers' bounded-staleness averaging (:mod:`sparkdist.torchtrain.localsgd`): a
rank more than ``maxStaleness // 2`` steps behind the fastest skips steps, and so pushes
nothing for them. Such a fit is not reproducible.

:meth:`AsyncTables.settle` (collective: before the tables are gathered for a checkpoint, a
best model or the fitted one) sends every server a stop after its last push; a server's
thread ends once it has a stop from every other rank, so every push made before is applied.
The next pull starts the thread again. The groups rendezvous through the fit's store, like
the default group: nothing listens that the fit did not authenticate.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from typing import Any

import torch
import torch.distributed as dist

from sparkdist.exceptions import TrainingError
from sparkdist.torchtrain.tables import Tables, _position, pulled_gradient

PULL, PUSH, STOP = 0, 1, 2
HEADER, IDS, GRADS, ROWS = 1, 2, 3, 4  # message tags
#: a request's header: operation, table, ids, learning rate, scale (float64: the rate's)
HEADER_SIZE = 5


@dataclasses.dataclass
class AsyncPulled:
    """What a pull asked each server for, kept until the step's push."""

    table: str
    parts: list[tuple[int, torch.Tensor, torch.Tensor]]  # server, positions, its local ids
    rows: torch.Tensor  # the pulled rows (a leaf: the backward pass fills its grad)
    padding: int | None


class AsyncTables(Tables):
    """This rank's shards, served by a thread of their own, and its requests to the others.
    Created on every rank in the same order (it creates two process groups)."""

    def __init__(self, servers: int, rank: int, world: int, optimizer: str,
                 timeout_s: float) -> None:
        super().__init__(servers, rank, world, optimizer)
        timeout = datetime.timedelta(seconds=timeout_s)
        self.requests = dist.new_group(backend="gloo", timeout=timeout)
        self.answers = dist.new_group(backend="gloo", timeout=timeout)
        self.lock = threading.Lock()  # the shards, between the server and this rank's steps
        self.server: threading.Thread | None = None
        self.failure: BaseException | None = None
        self.requested: list[AsyncPulled] = []

    # ----------------------------------------------------------------- this rank's steps
    def pull(self, name: str, ids: torch.Tensor,
             padding_idx: int | None = None) -> tuple[torch.Tensor, torch.Tensor, int | None]:
        """As :meth:`Tables.pull`, from the servers' rows as they are now; not collective."""
        self.serve()
        shard = self.shards[name]
        distinct, index = torch.unique(self._checked(name, ids), return_inverse=True)
        rows = shard.weight.new_empty((distinct.numel(), shard.weight.shape[1]))
        parts = self._parts(distinct)
        table = list(self.shards).index(name)
        answers: list[Any] = []  # (positions, rows, the receive in flight)
        for server, where, local in parts:
            if server == self.rank:
                with self.lock:
                    rows[where] = shard.weight[local]
                continue
            self._request(PULL, table, server, local)
            got = rows.new_empty((local.numel(), rows.shape[1]))
            answers.append((where, got, dist.irecv(got, src=server, group=self.answers,
                                                   tag=ROWS)))
        for where, got, work in answers:
            work.wait()
            rows[where] = got
        padding = _position(distinct, padding_idx)
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            self.requested.append(AsyncPulled(name, parts, rows, padding))
        return rows, index.view(ids.shape), padding

    def _parts(self, distinct: torch.Tensor) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        owner = distinct % self.servers
        parts = []
        for server in range(self.servers):
            where = (owner == server).nonzero().squeeze(1)
            if where.numel():
                parts.append((server, where, distinct[where] // self.servers))
        return parts

    def push(self, scale: float, rate: float) -> None:
        """Send each server the summed gradients of its rows pulled since the last push; it
        applies them as one step, without waiting for the other ranks. Not collective."""
        if self.failure is not None:
            raise TrainingError(f"a parameter server failed: {self.failure!r}")
        grouped: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for pull in self.requested:
            grad = pulled_gradient(pull.rows, pull.padding)
            table = list(self.shards).index(pull.table)
            for server, where, local in pull.parts:
                grouped.setdefault((table, server), []).append((local, grad[where]))
        self.requested.clear()
        sends: list[Any] = []
        for (table, server), pieces in grouped.items():
            local = torch.cat([ids for ids, _ in pieces])
            grads = torch.cat([grad for _, grad in pieces]).contiguous()
            if server == self.rank:
                with self.lock:
                    self._apply(list(self.shards.values())[table], local, grads, scale, rate)
                continue
            sends += self._request(PUSH, table, server, local, rate, scale, wait=False)
            sends.append(dist.isend(grads, dst=server, group=self.requests, tag=GRADS))
            self.bytes_sent += grads.numel() * grads.element_size()
        for work in sends:
            work.wait()

    def _request(self, op: int, table: int, server: int, local: torch.Tensor,
                 rate: float = 0.0, scale: float = 0.0, wait: bool = True) -> list[Any]:
        header = torch.tensor([op, table, local.numel(), rate, scale], dtype=torch.float64)
        sends: list[Any] = [dist.isend(header, dst=server, group=self.requests, tag=HEADER)]
        if local.numel():
            sends.append(dist.isend(local.contiguous(), dst=server, group=self.requests,
                                    tag=IDS))
            self.bytes_sent += local.numel() * local.element_size()
        if wait:
            for work in sends:
                work.wait()
            return []
        return sends

    def settle(self) -> None:
        """Every push made so far applied, and no server thread running until the next pull.
        Collective."""
        self.serve()  # this rank's server takes the others' stops
        for server in range(self.servers):
            if server != self.rank:
                self._request(STOP, 0, server, torch.empty(0, dtype=torch.int64))
        if self.server is not None:
            self.server.join()
            self.server = None
        if self.failure is not None:
            raise TrainingError(f"a parameter server failed: {self.failure!r}")
        # no rank pulls or pushes again before every server has stopped (or one still
        # serving a rank that has settled could take a push into rows being gathered)
        dist.barrier()

    # ------------------------------------------------------------------- the server side
    def serve(self) -> None:
        """Start answering the others' requests (the first pull after a settle does)."""
        if self.server is None and self.rank < self.servers and self.world > 1:
            self.server = threading.Thread(target=self._answer, name="sparkdist-ps-server",
                                           daemon=True)
            self.server.start()

    def _answer(self) -> None:
        """Answer requests until every other rank has sent its stop."""
        header = torch.empty(HEADER_SIZE, dtype=torch.float64)
        shards = list(self.shards.values())
        stops = 0
        try:
            while stops < self.world - 1:
                source = dist.recv(header, group=self.requests, tag=HEADER)
                op, table, count = (int(x) for x in header[:3])
                if op == STOP:
                    stops += 1
                    continue
                if op not in (PULL, PUSH) or not 0 <= table < len(shards) or count < 0:
                    raise TrainingError(f"rank {source} sent a malformed request "
                                        f"{header.tolist()}")
                self._answer_one(source, op, shards[table], count,
                                 float(header[3]), float(header[4]))
        except BaseException as err:  # the rank's next push or settle raises it
            self.failure = err

    def _answer_one(self, source: int, op: int, shard: Any, count: int, rate: float,
                    scale: float) -> None:
        local = torch.empty(count, dtype=torch.int64)
        if count:
            dist.recv(local, src=source, group=self.requests, tag=IDS)
        if count and (int(local.min()) < 0 or int(local.max()) >= shard.weight.shape[0]):
            raise TrainingError(f"rank {source} asked for rows this server does not hold")
        if op == PULL:
            with self.lock:
                rows = shard.weight[local]
                self.bytes_sent += rows.numel() * rows.element_size()
            dist.send(rows, dst=source, group=self.answers, tag=ROWS)
            return
        grads = shard.weight.new_empty((count, shard.weight.shape[1]))
        if count:
            dist.recv(grads, src=source, group=self.requests, tag=GRADS)
        with self.lock:
            self._apply(shard, local, grads, scale, rate)
