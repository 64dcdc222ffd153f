"""Embedding tables held in shards by parameter-server ranks (``strategy="ps"``).

Row ``i`` of a table lives on server ``i % k`` (the first ``k`` ranks), at ``i // k``. In a
step every rank pulls the rows its batch touches from their servers (:meth:`Tables.pull`,
inside the network's forward) and, after the backward pass, pushes their gradients back
(:meth:`Tables.push`); a server sums the pushes for each of its rows over all ranks and
applies a sparse optimizer to those rows alone: Adagrad, or Adam on the rows a step touches
(the rule of ``torch.optim.SparseAdam``). Each exchange is one ``all_to_all_single`` over
all ranks (counts, ids, then rows or gradients), so a step waits for every push: the result
is the one a single process gets from the same global batch with the same sparse optimizer.
Only the distinct ids of a batch and their rows travel, never a whole table or its gradient.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import tempfile
import zlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from sparkdist import store
from sparkdist.exceptions import TrainingError
from sparkdist.torchtrain.shardfiles import check_shape, checked_file, shard_file
from sparkdist.torchtrain.spec import PS_OPTIMIZERS

#: per-row optimizer state a server holds, in copies of its rows (besides the rows)
STATE_COPIES = dict(zip(PS_OPTIMIZERS, (1, 2), strict=True))
EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)


@dataclasses.dataclass
class Shard:
    """One table's rows on this rank (none on a rank that serves no rows)."""

    rows: int  # the whole table's
    weight: torch.Tensor  # [rows held here, dim]
    state: dict[str, torch.Tensor]  # the optimizer's, row for row with ``weight``
    step: int = 0  # pushes applied (Adam's bias correction)


@dataclasses.dataclass
class Pulled:
    """What a pull sent and received, kept until the step's push."""

    table: str
    order: torch.Tensor  # sent position -> position among the batch's distinct ids
    sent: list[int]  # ids sent to each rank
    received: list[int]  # ids received from each rank
    local: torch.Tensor  # the received ids' rows in this rank's shard
    rows: torch.Tensor  # the pulled rows (a leaf: the backward pass fills its grad)
    padding: int | None  # the padding row's position among the distinct ids


class Tables:
    """This rank's shards of the tables and its half of every exchange."""

    def __init__(self, servers: int, rank: int, world: int, optimizer: str) -> None:
        self.servers, self.rank, self.world, self.optimizer = servers, rank, world, optimizer
        self.shards: dict[str, Shard] = {}
        self.pulled: list[Pulled] = []
        self.bytes_sent = 0  # ids, rows and gradients this rank sent to other ranks

    # ------------------------------------------------------------------ holding the rows
    def hold(self, name: str, weight: torch.Tensor) -> None:
        """Keep this rank's rows of ``weight`` (the whole table, the same on every rank)."""
        mine = weight.detach()[self.rank::self.servers] if self.rank < self.servers \
            else weight.detach()[:0]
        mine = mine.clone().contiguous()
        self.shards[name] = Shard(rows=weight.shape[0], weight=mine, state=self._fresh(mine))

    def hold_drawn(self, name: str, rows: int, dim: int, seed: int, std: float = 1.0,
                   padding_idx: int | None = None, block: int = 1 << 16) -> None:
        """Draw this rank's rows of a table no rank holds whole (built on the meta device):
        N(0, ``std``) (1: as ``nn.Embedding`` starts), the padding row zero. Block ``b`` of
        ``block`` rows comes from a generator seeded by (``seed``, the table's name, ``b``),
        so every number of servers draws the same table; a server holds one block at a time
        beside its own rows."""
        mine = torch.empty(0, dim)
        if self.rank < self.servers:
            mine = torch.empty(len(range(self.rank, rows, self.servers)), dim)
            salt = zlib.crc32(name.encode())
            for start in range(0, rows, block):
                generator = torch.Generator().manual_seed(hash_seed(seed, salt, start // block))
                drawn = torch.randn(min(block, rows - start), dim, generator=generator)
                first = (self.rank - start) % self.servers  # this rank's first row in it
                held = drawn[first::self.servers].mul_(std)
                at = (start + first) // self.servers
                mine[at:at + held.shape[0]] = held
            if padding_idx is not None and padding_idx % self.servers == self.rank:
                mine[padding_idx // self.servers] = 0
        self.shards[name] = Shard(rows=rows, weight=mine, state=self._fresh(mine))

    def _fresh(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        names = ("sum",) if self.optimizer == "adagrad" else ("exp_avg", "exp_avg_sq")
        return {key: torch.zeros_like(weight) for key in names}

    def drop_state(self) -> None:
        """Free the optimizer state of every row: training is over (no push may follow)."""
        for shard in self.shards.values():
            shard.state = {}

    def held_bytes(self) -> int:
        """Bytes of rows and optimizer state this rank holds."""
        return sum(t.numel() * t.element_size() for shard in self.shards.values()
                   for t in (shard.weight, *shard.state.values()))

    # -------------------------------------------------------------------- the exchanges
    def pull(self, name: str, ids: torch.Tensor,
             padding_idx: int | None = None) -> tuple[torch.Tensor, torch.Tensor, int | None]:
        """The rows of the distinct ``ids`` (from their servers), each id's position among
        them, and the position of row ``padding_idx`` (None where no id is it). Collective:
        every rank pulls from the same tables in the same order. Under autograd the rows are
        kept for :meth:`push`."""
        shard = self.shards[name]
        distinct, index = torch.unique(self._checked(name, ids), return_inverse=True)
        owner = distinct % self.servers
        order = torch.argsort(owner, stable=True)
        sent = torch.bincount(owner, minlength=self.world).tolist()
        received = self._exchange_counts(sent)
        asked = self._exchange(distinct[order], sent, received)
        local = asked // self.servers
        answer = self._exchange(shard.weight[local], received, sent)
        rows = torch.empty_like(answer)
        rows[order] = answer
        padding = _position(distinct, padding_idx)
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            self.pulled.append(Pulled(name, order, sent, received, local, rows, padding))
        return rows, index.view(ids.shape), padding

    def _checked(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` flat, as int64; TrainingError for one beyond table ``name``."""
        rows = self.shards[name].rows
        flat = ids.reshape(-1).to(torch.int64)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= rows):
            bad = int(flat.min()) if int(flat.min()) < 0 else int(flat.max())
            raise TrainingError(f"id {bad} is beyond table {name!r} (ids 0 to {rows - 1}): "
                                "re-index the column or enlarge the table (modelKwargs).")
        return flat

    def push(self, scale: float, rate: float) -> None:
        """Send the gradients of the rows pulled since the last push to their servers; each
        server sums them per row over every rank, times ``scale``, and updates those rows at
        learning rate ``rate``. Collective."""
        pushed: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for pull in self.pulled:
            grad = pulled_gradient(pull.rows, pull.padding)
            got = self._exchange(grad[pull.order], pull.sent, pull.received)
            pushed.setdefault(pull.table, []).append((pull.local, got))
        self.pulled.clear()
        for name, shard in self.shards.items():
            if name in pushed:
                local = torch.cat([local for local, _ in pushed[name]])
                grads = torch.cat([grad for _, grad in pushed[name]])
                self._apply(shard, local, grads, scale, rate)

    def settle(self) -> None:
        """Every push applied, so that the shards can be gathered: here each push is applied
        when it is made (collective, like the asynchronous servers' settle)."""

    def _exchange_counts(self, sent: list[int]) -> list[int]:
        received = torch.empty(self.world, dtype=torch.int64)
        dist.all_to_all_single(received, torch.tensor(sent, dtype=torch.int64))
        return received.tolist()

    def _exchange(self, tensor: torch.Tensor, sent: list[int],
                  received: list[int]) -> torch.Tensor:
        """``tensor``'s first ``sent[r]`` rows to rank r, the next to r + 1, ...; returns
        what the ranks sent here, in rank order."""
        out = tensor.new_empty((sum(received), *tensor.shape[1:]))
        dist.all_to_all_single(out, tensor.contiguous(), received, sent)
        row = tensor[0].numel() * tensor.element_size() if tensor.numel() else 0
        self.bytes_sent += row * (sum(sent) - sent[self.rank])
        return out

    # -------------------------------------------------------------------- the optimizers
    def _apply(self, shard: Shard, local: torch.Tensor, grads: torch.Tensor,
               scale: float, rate: float) -> None:
        """One sparse step on the rows ``local`` with the per-row sum of ``grads``."""
        shard.step += 1
        if not local.numel():
            return
        rows, where = torch.unique(local, return_inverse=True)
        grad = grads.new_zeros((rows.numel(), grads.shape[1])).index_add_(0, where, grads)
        grad.mul_(scale)
        if self.optimizer == "adagrad":  # torch.optim.Adagrad on a sparse gradient
            total = shard.state["sum"]
            total.index_add_(0, rows, grad * grad)
            shard.weight.index_add_(0, rows, -rate * grad / (total[rows].sqrt() + 1e-10))
            return
        beta1, beta2, eps = 0.9, 0.999, 1e-8  # torch.optim.SparseAdam's defaults
        first, second = shard.state["exp_avg"], shard.state["exp_avg_sq"]
        first.index_add_(0, rows, (grad - first[rows]) * (1 - beta1))
        second.index_add_(0, rows, (grad * grad - second[rows]) * (1 - beta2))
        size = rate * (1 - beta2 ** shard.step) ** 0.5 / (1 - beta1 ** shard.step)
        shard.weight.index_add_(0, rows, -size * first[rows] / (second[rows].sqrt() + eps))

    # ------------------------------------------------------------- whole tables, for rank 0
    def gather(self, name: str, state: bool = True) -> dict[str, torch.Tensor] | None:
        """The whole table and (with ``state``) its optimizer state on rank 0 (None
        elsewhere): each server sends its rows to rank 0. Collective."""
        shard = self.shards[name]
        parts = {"weight": shard.weight, **(shard.state if state else {})}
        if self.rank == 0:
            whole = {key: part.new_empty((shard.rows, part.shape[1]))
                     for key, part in parts.items()}
            for server in range(self.servers):
                for key, part in parts.items():
                    rows = whole[key][server::self.servers]
                    if server == 0:
                        rows.copy_(part)
                    else:
                        got = torch.empty_like(rows)
                        dist.recv(got, src=server)
                        rows.copy_(got)
            return whole
        if self.rank < self.servers:
            for part in parts.values():
                dist.send(part.contiguous(), dst=0)
        return None

    # ------------------------------------------------------- sharded checkpoints (store)
    def write(self, where: str, state: bool = True) -> str | None:
        """Write this server's rows (with ``state``: and their optimizer state) of every table
        to a file of its own under ``where`` (any store :mod:`sparkdist.store` supports);
        returns its SHA-256 (None on a rank that serves no rows). The tensors go to a local
        file first and from there to the store: never a second copy in memory."""
        if self.rank >= self.servers:
            return None
        payload = {name: {"rows": torch.tensor(shard.rows), "step": torch.tensor(shard.step),
                          "weight": shard.weight, **(shard.state if state else {})}
                   for name, shard in self.shards.items()}
        with tempfile.TemporaryDirectory(prefix="sparkdist-ps-") as local:
            path = os.path.join(local, "shard.pt")
            torch.save(payload, path)
            digest = hashlib.sha256()
            with open(path, "rb") as file:
                for chunk in iter(lambda: file.read(1 << 22), b""):
                    digest.update(chunk)
            store.write_file(f"{where}/{shard_file(self.rank)}", path)
        return digest.hexdigest()

    def read(self, where: str, digests: list[str]) -> None:
        """Take this rank's rows and optimizer state of every table from the files that
        ``len(digests)`` servers (any number) wrote under ``where``: only the files that hold
        some of them, one at a time, each checked against its SHA-256 and read as tensors
        only. Adam's step count is the highest among them (the same in a synchronous fit)."""
        if self.rank >= self.servers:
            return
        old = len(digests)
        fresh = {name: {key: torch.empty_like(value) for key, value in
                        (("weight", shard.weight), *shard.state.items())}
                 for name, shard in self.shards.items()}
        steps = dict.fromkeys(self.shards, 0)
        for server in range(old):
            if (self.rank - server) % math.gcd(old, self.servers):
                continue  # none of its rows is one of this rank's
            url = f"{where}/{shard_file(server)}"
            saved = checked_file(url, digests[server])
            for name, shard in self.shards.items():
                check_shape(url, saved, name, (shard.rows, shard.weight.shape[1]),
                             -(-(shard.rows - server) // old), shard.state)
                rows = server + torch.arange(saved[name]["weight"].shape[0]) * old
                mine = rows % self.servers == self.rank
                for key, value in fresh[name].items():
                    value[rows[mine] // self.servers] = saved[name][key][mine]
                steps[name] = max(steps[name], int(saved[name]["step"]))
        for name, shard in self.shards.items():
            shard.weight = fresh[name].pop("weight")
            shard.state, shard.step = fresh[name], steps[name]


def pulled_gradient(rows: torch.Tensor, padding: int | None) -> torch.Tensor:
    """The gradient the backward pass left on pulled ``rows`` (zeros where it left none),
    without the padding row's: that row never trains."""
    grad = rows.grad if rows.grad is not None else torch.zeros_like(rows)
    if padding is not None:
        grad[padding] = 0
    return grad


def hash_seed(*parts: int) -> int:
    """One 63-bit seed from several integers (the same in every process, unlike hash())."""
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _position(distinct: torch.Tensor, padding_idx: int | None) -> int | None:
    if padding_idx is None:
        return None
    found = (distinct == padding_idx).nonzero()
    return int(found[0, 0]) if found.numel() else None


class RemoteEmbedding(nn.Module):
    """Stands in for an ``nn.Embedding`` or ``nn.EmbeddingBag`` whose rows the servers hold:
    its forward pulls the rows the ids touch and looks them up as the original would."""

    def __init__(self, tables: Tables, name: str, original: nn.Module) -> None:
        super().__init__()
        self.tables, self.table = tables, name
        self.num_embeddings, self.embedding_dim = original.num_embeddings, \
            original.embedding_dim
        self.padding_idx: int | None = original.padding_idx  # type: ignore[assignment]
        self.bag = isinstance(original, nn.EmbeddingBag)
        self.mode = getattr(original, "mode", "mean")
        self.include_last_offset = getattr(original, "include_last_offset", False)

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        rows, index, padding = self.tables.pull(self.table, input, self.padding_idx)
        if not self.bag:
            return F.embedding(index, rows, padding)
        return F.embedding_bag(index, rows, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset,
                               padding_idx=padding)

    def extra_repr(self) -> str:
        return f"{self.table!r}, {self.num_embeddings}, {self.embedding_dim} (on the servers)"

