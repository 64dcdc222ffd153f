"""``strategy="ps"``: embedding tables on parameter servers, the rest data-parallel.

The tables (``psTables``: module names; empty: every ``nn.Embedding`` and
``nn.EmbeddingBag``) are split by row over the first ``parameterServers`` ranks (0: all of
them); every rank trains on its rows of the data. In a step a rank pulls the rows its batch
touches, and after the backward pass pushes their gradients, which the servers apply with a
sparse optimizer (``psOptimizer``, at ``psLearningRate``) to those rows only
(:mod:`sparkdist.torchtrain.tables`); the dense layers are averaged by DDP as under ``ddp``.
By default a step waits for every push (synchronous), so with ``optimizer="adagrad"`` and
``psOptimizer="adagrad"`` at the same rate a fit equals the same fit under ``ddp``, while a
step sends only the touched rows instead of all-reducing every table's whole gradient.
With ``maxStaleness > 0`` the servers are asynchronous
(:mod:`sparkdist.torchtrain.tables_async`): a push is applied when it arrives, no step waits
for the other ranks', and the dense layers use ``ddp``'s bounded-staleness averaging, whose
skipped steps bound how far behind a slow rank falls.

Servers and trainers share the barrier ranks (as in TorchRec's row-wise sharding): Spark
gives every barrier task a partition of the data, so every rank trains, and ``k`` of them also
serve. The model is built once on every rank; then each server keeps its rows and their
optimizer state (1/k of them) and the rest frees the whole tables. A table built on the meta
device is never whole on any rank: each server draws its own rows (``psInitStd``). In a
checkpoint each server writes its own rows and their optimizer state through the store
(:meth:`Tables.write`), and a resume reads them back on any number of servers. The fitted
model holds the whole tables, gathered to rank 0, so the fitted TorchModel scores like any
other; the rows of meta tables the servers write under checkpointDir instead, and the driver
puts them together (:mod:`sparkdist.torchtrain.shardfiles`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparkdist import store
from sparkdist.exceptions import ParamError, TrainingError
from sparkdist.torchtrain import strategies
from sparkdist.torchtrain.shardfiles import (
    STORED_ROWS,
    new_model_dir,
    remove_model_dirs,
    stored_rows,
)
from sparkdist.torchtrain.strategies import ddp
from sparkdist.torchtrain.tables import EMBEDDINGS, STATE_COPIES, RemoteEmbedding, Tables
from sparkdist.torchtrain.tables_async import AsyncTables

if TYPE_CHECKING:
    import torch

    from sparkdist.torchtrain.inputs import Inputs, Target
    from sparkdist.torchtrain.spec import TrainSpec

SUPPORTS = strategies.Supports(
    backends=("torch",), why="the parameter servers exchange rows with torch.distributed's "
    "all_to_all, send and recv, which Horovod does not provide", typed_inputs=True,
    local_steps=True, meta_tables=True)


def usable(spec: TrainSpec) -> Callable[[int], bool]:
    """Any worker count that has room for the servers."""
    return functools.partial(_room_for, spec.strategy.parameter_servers)


def _room_for(servers: int, world: int) -> bool:
    return world >= servers


def check(spec: TrainSpec, module: torch.nn.Module) -> None:
    """ParamError for tables the servers cannot hold or train, before launch."""
    names = table_names(module, list(spec.strategy.ps_tables))
    servers, workers = spec.strategy.parameter_servers, spec.launch.num_workers
    if servers > workers:
        raise ParamError(f"parameterServers={servers} with numWorkers={workers}: the servers "
                         f"are ranks of the fit; use at most {workers} (0: every rank), or "
                         "raise numWorkers.")
    if spec.comm.sync_every > 1 and not spec.comm.max_staleness:
        raise ParamError(f"syncEvery={spec.comm.sync_every} with strategy='ps': synchronous "
                         "servers take every step together; set syncEvery=1, or "
                         "maxStaleness > 0 for asynchronous servers (whose dense layers "
                         "average every syncEvery steps).")
    if spec.launch.use_gpu is True:
        raise ParamError("strategy='ps' runs on CPU executors (the servers exchange rows "
                         "over gloo): set useGpu=False, or strategy='ddp' on GPUs.")
    for group in strategies.shared_parameters(module):
        tied = [name for name in group if name.rpartition(".")[0] in names]
        if tied:
            raise strategies.tied_error("ps", group, "the servers hold the table's rows "
                                        "apart from the other modules")
    _check_meta(spec, module, names)
    dense = [n for n, p in module.named_parameters()
             if p.requires_grad and n.rpartition(".")[0] not in names]
    if not dense:
        raise ParamError(f"strategy='ps': every trained parameter of the model is in "
                         f"psTables {names}; give it a dense parameter (a bias, a "
                         "Linear layer) for the workers' optimizer.")
    _check_budget(spec, module, names, servers or workers)


def _check_meta(spec: TrainSpec, module: torch.nn.Module, names: list[str]) -> None:
    """Tables built on the meta device (no rank holds them whole) are drawn by the servers
    and written by them for the fitted model: only tables, and only with checkpointDir."""
    meta = [n for n, p in module.named_parameters() if p.is_meta]
    other = [n for n in meta if n.rpartition(".")[0] not in names]
    if other:
        raise ParamError(f"strategy='ps': {other} are on the meta device, but only the "
                         f"tables the servers hold ({names}) may be: their servers draw the "
                         "rows; build the other parameters on the CPU.")
    if meta and not spec.checkpoint.directory:
        raise ParamError(f"strategy='ps': the tables {meta} are on the meta device, so no "
                         "rank ever holds them whole: the servers write their trained rows "
                         "through checkpointDir for the driver to put the fitted model "
                         "together; set checkpointDir (a directory every executor and the "
                         "driver can reach).")


def _check_budget(spec: TrainSpec, module: torch.nn.Module, names: list[str],
                  servers: int) -> None:
    budget = spec.strategy.server_budget
    copies = 1 + STATE_COPIES[spec.strategy.ps_optimizer]
    weights = [_weight(module, name) for name in names]
    table = sum(w.numel() * w.element_size() for w in weights)
    need = copies * table / servers
    if budget and need > budget:
        raise ParamError(
            f"strategy='ps': the tables {names} ({table / 2**20:.1f} MiB; with "
            f"psOptimizer={spec.strategy.ps_optimizer!r}'s state, {copies}x) need "
            f"{need / 2**20:.1f} MiB on each of {servers} server(s), over the "
            f"{budget / 2**20:.1f} MiB a worker may hold: raise parameterServers (and "
            "numWorkers), or the executors' memory (spark.executor.pyspark.memory).")


def _weight(module: torch.nn.Module, name: str) -> torch.Tensor:
    weight: torch.Tensor = module.get_submodule(name).weight  # type: ignore[assignment]
    return weight


def table_names(module: torch.nn.Module, names: list[str]) -> list[str]:
    """The modules the servers hold: ``names`` (checked), else every embedding module."""
    modules = dict(module.named_modules())
    found = [name for name, sub in modules.items() if isinstance(sub, EMBEDDINGS)]
    if not names:
        if not found:
            raise ParamError("strategy='ps' holds embedding tables on parameter servers, but "
                             "the model has no nn.Embedding or nn.EmbeddingBag: use "
                             "strategy='ddp'.")
        names = found
    missing = [name for name in names if name not in modules]
    if missing:
        raise ParamError(f"psTables={names}: {missing} name no module of the model; its "
                         f"embedding modules are {found}. Name those (or leave psTables "
                         "empty for all of them).")
    for name in names:
        sub = modules[name]
        if not isinstance(sub, EMBEDDINGS):
            raise ParamError(f"psTables: {name!r} is a {type(sub).__name__}, not an "
                             f"nn.Embedding or nn.EmbeddingBag; its embedding modules are "
                             f"{found}.")
        if sub.max_norm is not None or sub.scale_grad_by_freq:
            raise ParamError(f"psTables: {name!r} uses max_norm or scale_grad_by_freq, "
                             "which the servers do not apply; build it without them, or "
                             "use strategy='ddp'.")
        if not sub.weight.requires_grad:
            raise ParamError(f"psTables: {name!r} is frozen; leave it out of psTables (and "
                             "the servers), or unfreeze it.")
    return names


class Strategy(ddp.Strategy):
    """DDP's strategy for the dense layers (with its bounded-staleness averaging under
    ``maxStaleness``), the servers for the tables."""

    name = "ps"

    def setup(self, module: torch.nn.Module) -> None:
        """Keep this rank's rows of every table, put a :class:`RemoteEmbedding` in each
        table's place, and set the rest up as ``ddp`` does (weights broadcast from rank 0)."""
        if self.device.type != "cpu":
            raise ParamError("strategy='ps' runs on CPU executors: set useGpu=False.")
        self.keys = list(module.state_dict())  # the whole model's, in its order
        self.drawn: list[str] = []  # the tables built on the meta device
        self.stored: str | None = None  # where the servers last wrote them for the model
        self.tables = self._tables()
        for name in table_names(module, list(self.spec.strategy.ps_tables)):
            original = module.get_submodule(name)
            weight = _weight(module, name)
            if weight.is_meta:  # no rank holds it whole: each server draws its own rows
                self.drawn.append(name)
                rows, dim = weight.shape
                self.tables.hold_drawn(name, rows, dim, seed=self.spec.optim.seed,
                                       std=self.spec.strategy.ps_init_std,
                                       padding_idx=getattr(original, "padding_idx", None))
            else:
                self.tables.hold(name, weight)
            parent, _, child = name.rpartition(".")
            setattr(module.get_submodule(parent), child,
                    RemoteEmbedding(self.tables, name, original))
        if self.drawn and self.context.rank == 0:
            remove_model_dirs(str(self.spec.checkpoint.directory))
        super().setup(module)

    def _tables(self) -> Tables:
        servers = self.spec.strategy.parameter_servers or self.context.world_size
        args = (servers, self.context.rank, self.context.world_size,
                self.spec.strategy.ps_optimizer)
        if self.spec.comm.max_staleness:
            return AsyncTables(*args, self.context.settings.collective_timeout_s)
        return Tables(*args)

    def train_step(self, features: Inputs, target: Target, scale: float,
                   optimizer: Any) -> torch.Tensor:
        """The dense layers' step as under ``ddp``, then the rows' push (the servers'
        step) at psLearningRate, scaled as the schedule scales the dense layers' rate."""
        loss = super().train_step(features, target, scale, optimizer)
        base = self.spec.optim.learning_rate
        factor = optimizer.param_groups[0]["lr"] / base if base else 1.0
        rate = self.spec.strategy.ps_learning_rate or base
        self.tables.push(1.0 / self.context.world_size, rate * factor)  # as DDP averages
        return loss

    def full_state(self) -> dict[str, Any] | None:
        """The whole model's state dict on rank 0, its tables gathered from the servers.
        Collective."""
        self._same_model()
        if self.drawn:
            return self._stored_state()
        whole = self._gathered()
        if whole is None:
            return None
        return self._model_state(whole)

    def _gathered(self) -> dict[str, dict[str, torch.Tensor]] | None:
        """The whole tables' rows (not their optimizer state: the model holds no more)."""
        self.tables.settle()
        gathered = {name: self.tables.gather(name, state=False) for name in self.tables.shards}
        if self.context.rank != 0:
            return None
        return {name: tables for name, tables in gathered.items() if tables is not None}

    def _stored_state(self) -> dict[str, Any] | None:
        """The dense layers' state on rank 0 and, in the tables' place, where every server
        wrote its rows (a directory of its own under checkpointDir, the one of the last
        call removed: the loop keeps only the newest model state; the driver removes this
        one once it has read it). Collective."""
        import torch.distributed as dist

        self.tables.settle()
        where = [new_model_dir(str(self.spec.checkpoint.directory))]
        dist.broadcast_object_list(where, src=0)
        digests: list[str | None] = [None] * self.context.world_size
        dist.all_gather_object(digests, self.tables.write(where[0], state=False))
        if self.context.rank != 0:
            return None
        if self.stored is not None:
            store.remove(self.stored)
        self.stored = where[0]
        shapes = {name: (shard.rows, shard.weight.shape[1])
                  for name, shard in self.tables.shards.items()}
        return {**self._model_state({}), STORED_ROWS: stored_rows(
            where[0], [d for d in digests if d is not None], shapes, self.keys)}

    def _model_state(self, whole: dict[str, dict[str, torch.Tensor]]) -> dict[str, Any]:
        state = {name: value.detach().cpu().clone()
                 for name, value in self.module.state_dict().items()}
        state.update({f"{name}.weight": parts["weight"] for name, parts in whole.items()})
        return {key: state[key] for key in self.keys if key in state}

    def save_training_state(self, optimizer: Any, where: str) -> dict[str, Any] | None:
        """Every server writes its rows and their optimizer state under ``where``; rank 0
        returns the dense layers' state, the files' SHA-256 digests and the step count.
        Collective."""
        import torch.distributed as dist

        self._same_model(optimizer)
        self.tables.settle()
        if self.context.rank == 0:
            store.remove(where)  # what a killed save left under this name
        dist.barrier()
        digests: list[str | None] = [None] * self.context.world_size
        dist.all_gather_object(digests, self.tables.write(where))
        if self.context.rank != 0:
            return None
        return {"model": self._model_state({}), "optimizer": optimizer.state_dict(),
                "ps_shards": {"where": where, "files": [d for d in digests if d is not None]},
                "ddp": {"calls": self.calls}}

    def load_training_state(self, saved: dict[str, Any], optimizer: Any) -> None:
        """Each server takes its rows from the files that hold them (any number of servers
        wrote them), then the dense layers' state."""
        if "ps_shards" not in saved:
            raise TrainingError("this checkpoint holds no parameter-server shards: it was "
                                "written by another strategy or an older sparkdist; resume "
                                "from another runId, or resume='never'.")
        shards = saved["ps_shards"]
        self.tables.read(str(shards["where"]), [str(d) for d in shards["files"]])
        self.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        self.calls = int(saved.get("ddp", {}).get("calls", 0))

    def state_bytes(self, optimizer: Any) -> int:
        """As the base's, with this rank's rows and their optimizer state. Collective: the
        loop asks every rank once training is over, so the servers settle here, and then
        drop their rows' optimizer state (as the loop drops the dense layers' next: the last
        checkpoint has it), before rank 0 gathers the whole tables beside its own rows."""
        self.tables.settle()
        held = super().state_bytes(optimizer) + self.tables.held_bytes()
        self.tables.drop_state()
        return held
