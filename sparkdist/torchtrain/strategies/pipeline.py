"""``strategy="pipeline"``: the model's top-level children split into ``pipelineStages``
stages (:mod:`.pipeline_split`), run with ``torch.distributed.pipelining`` (GPipe or 1F1B
over ``microBatches`` micro-batches), combined with data parallelism when numWorkers is a
multiple of the stages.

Layout: rank ``r`` runs stage ``r % stages`` of replica ``r // stages``; the stages of a
replica are consecutive ranks (one pipeline group each), and the ranks of one stage in every
replica average their gradients over a data-parallel group of their own.

Data: every rank still reads its own partition's rows (the loop's feed), so that every row
trains. Each step the ranks of a replica gather their features on its first stage and their
labels on its last (``dist.gather``, padded to the largest part): the replica trains on the
rows of all its ranks, in rank order. Every rank learns every rank's batch size first (one
all-reduce), so all of them take the same decisions and none waits on a missing call, however
uneven or empty the batches are.

Shapes: a pipeline stage receives into buffers of a fixed shape, so a replica's rows go
through the pipeline in rounds of a fixed ``rows_per_round`` (``stages x (batchSize + 1)``
rounded up to a multiple of ``microBatches``): a round's rows are padded with zero-weight
rows (their loss is left out, so they add nothing to any gradient), and a replica with more
rows than that (uneven partitions) runs more rounds, accumulating the gradients; every replica
runs as many rounds as the one with the most rows. Padded rows do pass through the layers: a
BatchNorm in training mode would count them in its statistics.

Loss semantics: the last stage sums the loss over a round's real rows; after the rounds each
stage scales its gradients by ``1 / rows in this global step`` and sums them over its replicas,
so the gradient is exactly the mean over the global batch, as under ``ddp``.

Results: ``full_state`` gathers the stages of replica 0 on rank 0 and merges them by
parameter name (the stages keep the model's names), so ``TorchModel`` holds the whole model.
A checkpoint is one file per stage (model and optimizer state keyed by parameter name,
written by the stage itself, checked by SHA-256 on reading), indexed in the checkpoint rank 0
commits; it loads into another split, another number of stages or workers, and a whole-model
(``ddp``) checkpoint loads into stages.
"""

from __future__ import annotations

import hashlib
import io
import math
from typing import TYPE_CHECKING, Any

from sparkdist.exceptions import ParamError, TrainingError
from sparkdist.torchtrain import strategies
from sparkdist.torchtrain.network import dummy_inputs, forward, loss_sum, rows_of
from sparkdist.torchtrain.strategies.base import WholeModel

if TYPE_CHECKING:
    import torch

    from sparkdist.torchtrain.inputs import Inputs, Target
    from sparkdist.torchtrain.spec import TrainSpec

#: The ``format`` of the training state this strategy puts into checkpoints: an index of one
#: file per stage.
FORMAT = "pipeline-stage-files"

SUPPORTS = strategies.Supports(
    backends=("torch",), why="the pipeline runs on torch.distributed (its pipelining module), "
    "which Horovod does not provide", typed_inputs=True)


def usable(spec: TrainSpec) -> Any:
    """``world -> bool``: a launch needs a multiple of the stages."""
    import functools

    return functools.partial(_multiple_of, spec.strategy.pipeline_stages)


def _multiple_of(stages: int, world: int) -> bool:
    return world % stages == 0


def check(spec: TrainSpec, module: torch.nn.Module) -> None:
    """Driver preflight: ParamError naming the Param and the fix."""
    from sparkdist.torchtrain.strategies import pipeline_split

    chosen = spec.strategy
    stages, workers = chosen.pipeline_stages, spec.launch.num_workers
    if workers % stages:
        raise ParamError(f"numWorkers={workers} is not a multiple of pipelineStages={stages}: "
                         f"every stage needs the same number of workers (data-parallel "
                         f"replicas); set numWorkers to a multiple of {stages}, or "
                         f"pipelineStages to a divisor of {workers}.")
    if chosen.pipeline_schedule == "1f1b" and chosen.micro_batches < stages:
        raise ParamError(f"pipelineSchedule='1f1b' needs microBatches >= pipelineStages; got "
                         f"microBatches={chosen.micro_batches} for {stages} stages: raise "
                         f"microBatches to {stages} or more, or use pipelineSchedule='gpipe'.")
    pipeline_split.split_plan(module, stages, list(chosen.pipeline_split_points))
    pipeline_split.check_sequential(module, spec.model.input_dim, spec.model.inputs)


def rows_per_round(stages: int, batch_size: int, micro_batches: int) -> int:
    """Rows a replica pushes through its pipeline at once: its ranks' batches (each at most
    ``batchSize + 1`` rows when the partitions are even) rounded up to whole micro-batches."""
    return micro_batches * math.ceil(stages * (batch_size + 1) / micro_batches)


class Strategy(WholeModel):
    name = "pipeline"

    def setup(self, module: torch.nn.Module) -> None:
        """Create the groups, keep this rank's stage of ``module`` and build its schedules."""
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        from sparkdist.torchtrain.strategies import pipeline_split

        chosen, rank = self.spec.strategy, self.context.rank
        self.stages = chosen.pipeline_stages
        self.replicas = self.context.world_size // self.stages
        self.stage, self.replica = rank % self.stages, rank // self.stages
        self.first, self.last = self.stage == 0, self.stage == self.stages - 1
        plan = pipeline_split.split_plan(module, self.stages,
                                         list(chosen.pipeline_split_points))
        self.all_names = [name for name, _ in module.named_parameters()]
        self.tail, self.out_dtype = _output_shape(module, self.spec)
        self.pipe_group, self.dp_group = self._groups()
        self.module = self.model = pipeline_split.stage_module(module, plan,
                                                               self.stage).to(self.device)
        micro = chosen.micro_batches
        self.rows = rows_per_round(self.stages, self.spec.optim.batch_size, micro)
        schedule = Schedule1F1B if chosen.pipeline_schedule == "1f1b" else ScheduleGPipe
        self.schedule = schedule(self._stage(PipelineStage), micro, loss_fn=self._loss,
                                 scale_grads=False)
        # forward only (validation): a schedule of its own, so switching between training and
        # evaluation never re-runs the stages' shape inference
        self.forward_only = ScheduleGPipe(self._stage(PipelineStage), micro)
        self.context.log(f"pipeline: {plan.describe()}; rank {rank} runs stage {self.stage} "
                         f"of replica {self.replica} ({self.replicas} replicas); rounds of "
                         f"{self.rows} rows in {micro} micro-batches, "
                         f"{chosen.pipeline_schedule}")

    def _stage(self, stage_class: Any) -> Any:
        return stage_class(self.module, self.stage, self.stages, self.device,
                           group=self.pipe_group)

    def _groups(self) -> tuple[Any, Any]:
        """Every replica's pipeline group, then every stage's data-parallel group: created on
        every rank in the same order (``new_group`` is collective); this rank's two kept."""
        import torch.distributed as dist

        pipe = data_parallel = None
        for replica in range(self.replicas):
            group = dist.new_group(self._pipeline_ranks(replica))
            if replica == self.replica:
                pipe = group
        if self.replicas > 1:
            for stage in range(self.stages):
                group = dist.new_group([r * self.stages + stage for r in range(self.replicas)])
                if stage == self.stage:
                    data_parallel = group
        return pipe, data_parallel

    def _pipeline_ranks(self, replica: int) -> list[int]:
        return [replica * self.stages + stage for stage in range(self.stages)]

    def _global(self, stage: int) -> int:
        """The global rank of ``stage`` of this rank's replica."""
        return self.replica * self.stages + stage

    # ------------------------------------------------------------------------- training
    def train_step(self, features: Inputs, target: Target, scale: float,
                   optimizer: Any) -> torch.Tensor:
        """The rounds of this step through the pipeline, then the gradients scaled to the
        mean over the global batch and summed over the replicas; the replica's summed loss
        on its last stage (zero elsewhere)."""
        import torch

        sizes = self._sizes(rows_of(features))
        mine = sizes[self.replica * self.stages:(self.replica + 1) * self.stages]
        inputs = self._gather_inputs(features, mine)
        labels = self._gather_rows(_packed(target), mine, self.stages - 1)
        self.clock.tock("communication")  # the batch sizes and the rows to their stages
        optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        for start in range(0, self._rounds(sizes) * self.rows, self.rows):
            losses += self._train_round(inputs, labels, start)
        self.clock.tock("compute")  # the stages' sends and receives included
        self._reduce_gradients(scale / self.context.world_size)
        self.clock.tock("communication")
        optimizer.step()
        if not losses:
            return torch.zeros((), dtype=torch.float64, device=self.device)
        return torch.stack(losses).sum().detach().double()

    def _train_round(self, inputs: Inputs | None, labels: torch.Tensor | None,
                     start: int) -> list[torch.Tensor]:
        args, kwargs = self._round_inputs(inputs, start)
        if not self.last:
            self.schedule.step(*args, return_outputs=False, **kwargs)
            return []
        losses: list[torch.Tensor] = []
        assert labels is not None  # the last stage gathered them
        self.schedule.step(*args, target=self._padded(labels, start), losses=losses,
                           return_outputs=False, **kwargs)
        return losses

    def _round_inputs(self, inputs: Inputs | None, start: int) -> tuple[tuple[Any, ...],
                                                                         dict[str, Any]]:
        """One round's inputs for the first stage: one tensor, or the typed inputs by
        keyword (none on the other stages)."""
        if not self.first:
            return (), {}
        if isinstance(inputs, dict):
            return (), {name: self._padded(rows, start) for name, rows in inputs.items()}
        return (self._padded(inputs, start),), {}

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The summed loss of a micro-batch's real rows (``target``: the label values, then
        the row's weight: 1, or ``weightCol``'s; a padding row has weight 0 and is left out,
        so it adds nothing to the gradient)."""
        from sparkdist.torchtrain.inputs import Target

        model, weighted = self.spec.model, bool(self.spec.rules.weight_col)
        keep = target[:, -1] > 0
        label = target[keep, :-1] if model.label_width else target[keep, 0]
        return loss_sum(model.loss_fn, output[keep],
                        Target(label, target[keep, -1] if weighted else None),
                        model.label_names)

    def _reduce_gradients(self, factor: float) -> None:
        """Scale this stage's gradients by ``factor`` (1 / rows in the global step) and sum
        them over its replicas, in one all-reduce of one flat buffer."""
        import torch
        import torch.distributed as dist

        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return
        if self.dp_group is None:
            torch._foreach_mul_(grads, factor)
            return
        flat = torch.cat([grad.reshape(-1) for grad in grads]).mul_(factor)
        dist.all_reduce(flat, group=self.dp_group)
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    # ---------------------------------------------------------------------- evaluation
    def predict(self, features: Inputs) -> torch.Tensor | None:
        """This rank's own rows through the pipeline: the replica's rows go in at its first
        stage, and the last stage hands each rank the outputs of its rows, so the loop's
        metrics count every validation row once (None where a rank has no rows)."""
        import torch

        sizes = self._sizes(rows_of(features))
        mine = sizes[self.replica * self.stages:(self.replica + 1) * self.stages]
        inputs = self._gather_inputs(features, mine)
        outputs = []
        for start in range(0, self._rounds(sizes) * self.rows, self.rows):
            args, kwargs = self._round_inputs(inputs, start)
            output = self.forward_only.step(*args, **kwargs)
            if self.last:
                outputs.append(output)
        merged = torch.cat(outputs)[:sum(mine)] if self.last and outputs else None
        return self._scatter_rows(merged, mine)

    # ------------------------------------------------------------------- moving rows
    def _sizes(self, rows: int) -> list[int]:
        """Every rank's batch size (one all-reduce)."""
        import torch

        table = torch.zeros(self.context.world_size, dtype=torch.float64)
        table[self.context.rank] = rows
        return [int(n) for n in self.backend.all_reduce_sum(table).tolist()]

    def _rounds(self, sizes: list[int]) -> int:
        """Rounds this step takes: as many as the replica with the most rows needs."""
        most = max(sum(sizes[r * self.stages:(r + 1) * self.stages])
                   for r in range(self.replicas))
        return math.ceil(most / self.rows)

    def _gather_inputs(self, features: Inputs, mine: list[int]) -> Inputs | None:
        """The replica's inputs on its first stage (None on the others): one features
        tensor, or each typed input, a sequence (and its mask) padded to ``max_length`` so
        that every round has the same shape."""
        model = self.spec.model
        if not isinstance(features, dict):
            return self._gather_rows(features.reshape(len(features), model.input_dim), mine, 0)
        longest = {name: field.max_length for field in model.inputs if field.sequence
                   for name in (field.arg, f"{field.arg}_mask")}
        gathered = {name: self._gather_rows(_widened(rows, longest.get(name, 0)), mine, 0)
                    for name, rows in features.items()}
        return gathered if self.first else None

    def _gather_rows(self, rows: torch.Tensor, mine: list[int],
                     stage: int) -> torch.Tensor | None:
        """The rows of every rank of this replica, in stage order, on ``stage`` (None on the
        others); ``mine`` are the replica's batch sizes."""
        import torch
        import torch.distributed as dist

        if self.stages == 1:
            return rows
        most = max(mine)
        if most == 0:
            return rows[:0] if self.stage == stage else None
        padded = torch.zeros((most, *rows.shape[1:]), dtype=rows.dtype, device=self.device)
        padded[:len(rows)] = rows
        parts = ([torch.empty_like(padded) for _ in range(self.stages)]
                 if self.stage == stage else None)
        dist.gather(padded, parts, dst=self._global(stage), group=self.pipe_group)
        if parts is None:
            return None
        return torch.cat([part[:n] for part, n in zip(parts, mine)])

    def _scatter_rows(self, merged: torch.Tensor | None, mine: list[int]) -> torch.Tensor | None:
        """Hand every rank of the replica the outputs of its own rows from the last stage."""
        import torch
        import torch.distributed as dist

        own = mine[self.stage]
        if self.stages == 1:
            return merged if own else None
        most = max(mine)
        if most == 0:
            return None
        parts = None
        if merged is not None:
            starts = [sum(mine[:s]) for s in range(self.stages)]
            parts = [self._pad(merged[at:at + n], most) for at, n in zip(starts, mine)]
        received = torch.empty((most, *self.tail), dtype=self.out_dtype, device=self.device)
        dist.scatter(received, parts, src=self._global(self.stages - 1), group=self.pipe_group)
        return received[:own] if own else None

    @staticmethod
    def _pad(rows: torch.Tensor, length: int) -> torch.Tensor:
        import torch

        padded = torch.zeros((length, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        padded[:len(rows)] = rows
        return padded.contiguous()

    def _padded(self, rows: torch.Tensor | None, start: int) -> torch.Tensor:
        """One round's inputs: ``rows[start:start + rows_per_round]`` padded with zero rows."""
        assert rows is not None  # the first stage gathered them
        return self._pad(rows[start:start + self.rows], self.rows)

    # ------------------------------------------------------------------ state and checkpoints
    def full_state(self) -> dict[str, Any] | None:
        """Every stage's state dict of replica 0, merged on rank 0 by parameter name."""
        parts = self._collect({"model": _cpu(self.module.state_dict())})
        if parts is None:
            return None
        return {name: value for part in parts for name, value in part["model"].items()}

    def save_training_state(self, optimizer: Any, where: str) -> dict[str, Any] | None:
        """Each stage of replica 0 writes its model and optimizer state, keyed by parameter
        name, into a file of its own under ``where`` (atomically, through the store); rank 0
        returns the index of the files (name, SHA-256, the names each holds), which the loop
        commits in the checkpoint. No rank holds more than its stage. Collective."""
        from sparkdist import store

        entry = None
        if self.replica == 0:  # the replicas hold the same
            data = _to_bytes({"model": _cpu(self.module.state_dict()),
                              "optimizer": named_optimizer_state(optimizer, self.module)})
            name = f"stage-{self.stage:04d}-of-{self.stages:04d}.pt"
            store.write_bytes(f"{where}/{name}", data)  # replaces what a killed save left
            entry = {"file": name, "sha256": hashlib.sha256(data).hexdigest(),
                     "names": list(self.module.state_dict())}
        parts = self._collect(entry) if entry is not None else None
        if parts is None:
            return None
        return {"format": FORMAT, "where": where, "stages": parts}

    def load_training_state(self, saved: dict[str, Any], optimizer: Any) -> None:
        """This stage's part of a checkpoint written by any split (only the stage files that
        hold its names are read, each checked against its SHA-256), or of a whole-model one
        (``ddp``'s: its optimizer state by position)."""
        wanted = list(self.module.state_dict())
        if saved.get("format") == FORMAT:
            saved = _read_stage_files(saved, set(wanted))
        else:
            saved = {"model": saved["model"], "optimizer": by_name(saved["optimizer"],
                                                                   self.all_names)}
        missing = [name for name in wanted if name not in saved["model"]]
        if missing:
            raise TrainingError(f"the checkpoint has no {', '.join(missing[:5])} for pipeline "
                                f"stage {self.stage}: it was written for another model; use "
                                f"a new runId or another checkpointDir.")
        self.module.load_state_dict({name: saved["model"][name] for name in wanted})
        load_named_optimizer_state(optimizer, self.module, saved["optimizer"])

    def _collect(self, payload: dict[str, Any]) -> list[dict[str, Any]] | None:
        """``payload`` of every stage of replica 0, in stage order, on rank 0 (None on every
        other rank): point-to-point, as bytes ``torch.load(weights_only=True)`` reads."""
        if self.replica != 0:
            return None
        if self.context.rank != 0:
            self._send_object(payload, 0)
            return None
        return [payload, *(self._receive_object(stage) for stage in range(1, self.stages))]

    def _send_object(self, payload: dict[str, Any], destination: int) -> None:
        import torch
        import torch.distributed as dist

        data = torch.frombuffer(bytearray(_to_bytes(payload)), dtype=torch.uint8)
        dist.send(torch.tensor([data.numel()], device=self.device), dst=destination)
        dist.send(data.to(self.device), dst=destination)

    def _receive_object(self, source: int) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.recv(size, src=source)
        data = torch.empty(int(size[0]), dtype=torch.uint8, device=self.device)
        dist.recv(data, src=source)
        return _from_bytes(data.cpu().numpy().tobytes())


def _to_bytes(payload: dict[str, Any]) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def _from_bytes(data: bytes) -> Any:
    """Tensors and plain values only: ``weights_only`` never unpickles other classes."""
    import torch

    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def _read_stage_files(saved: dict[str, Any], wanted: set[str]) -> dict[str, Any]:
    """The model and optimizer state (by name) of the stage files that hold any of
    ``wanted``, each checked against the SHA-256 the checkpoint recorded."""
    from sparkdist import store

    model: dict[str, Any] = {}
    optimizer: dict[str, Any] = {"state": {}, "param_groups": []}
    for entry in saved["stages"]:
        if not wanted & set(entry["names"]):
            continue
        url = f"{saved['where']}/{entry['file']}"
        try:
            data = store.read_bytes(url)
        except FileNotFoundError as err:
            raise TrainingError(f"the checkpoint's stage file {url} is missing; the "
                                f"checkpoint cannot be resumed from: use a new runId.") from err
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise TrainingError(f"the checkpoint's stage file {url} does not hold the bytes "
                                f"its checkpoint recorded (damaged or replaced): use a new "
                                f"runId or another checkpointDir.")
        part = _from_bytes(data)
        model.update(part["model"])
        optimizer["state"].update(part["optimizer"]["state"])
        optimizer["param_groups"] = optimizer["param_groups"] or part["optimizer"]["param_groups"]
    return {"model": model, "optimizer": optimizer}


# ---------------------------------------------------------------------- optimizer by name
def named_optimizer_state(optimizer: Any, module: torch.nn.Module) -> dict[str, Any]:
    """``optimizer.state_dict()`` with parameter names in place of positions (on CPU)."""
    state = optimizer.state_dict()
    index_name = _index_names(optimizer, module, state["param_groups"])
    return {"state": {index_name[i]: {key: _detach(value) for key, value in entry.items()}
                      for i, entry in state["state"].items()},
            "param_groups": [{**group, "params": [index_name[i] for i in group["params"]]}
                             for group in state["param_groups"]]}


def load_named_optimizer_state(optimizer: Any, module: torch.nn.Module,
                               named: dict[str, Any]) -> None:
    """Load the entries of ``named`` (from :func:`named_optimizer_state`, any split) that
    belong to ``module``'s parameters into ``optimizer``."""
    names = {id(p): name for name, p in module.named_parameters()}
    state, groups, position = {}, [], 0
    if len(named["param_groups"]) != len(optimizer.param_groups):
        raise TrainingError(f"the checkpoint's optimizer has {len(named['param_groups'])} "
                            f"parameter groups, this one {len(optimizer.param_groups)}: it was "
                            f"written for another optimizer; use a new runId.")
    for live, saved in zip(optimizer.param_groups, named["param_groups"]):
        positions = []
        for parameter in live["params"]:
            name = names[id(parameter)]
            if name in named["state"]:
                state[position] = named["state"][name]
            positions.append(position)
            position += 1
        groups.append({**{k: v for k, v in saved.items() if k != "params"},
                       "params": positions})
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def by_name(positional: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A whole-model optimizer state dict (positions in ``names``' order, as ``ddp``'s
    optimizer over ``module.parameters()`` writes it) keyed by parameter name."""
    return {"state": {names[i]: entry for i, entry in positional["state"].items()},
            "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                             for group in positional["param_groups"]]}


def _index_names(optimizer: Any, module: torch.nn.Module,
                 groups: list[dict[str, Any]]) -> dict[int, str]:
    names = {id(p): name for name, p in module.named_parameters()}
    return {index: names[id(parameter)]
            for live, group in zip(optimizer.param_groups, groups)
            for parameter, index in zip(live["params"], group["params"])}


def _detach(value: Any) -> Any:
    return value.detach().cpu().clone() if hasattr(value, "detach") else value


def _cpu(state_dict: dict[str, Any]) -> dict[str, Any]:
    return {name: value.detach().cpu().clone() for name, value in state_dict.items()}


def _output_shape(module: torch.nn.Module, spec: TrainSpec) -> tuple[tuple[int, ...], Any]:
    """The shape of one row's output and its dtype (from two rows of zeros, in eval mode):
    what the ranks before the last stage receive their rows' outputs into."""
    import torch

    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            output = forward(module, dummy_inputs(spec.model.input_dim, spec.model.inputs))
    finally:
        module.train(was_training)
    return tuple(output.shape[1:]), output.dtype


def _packed(target: Target) -> torch.Tensor:
    """A step's labels and row weights as one float32 ``[rows, values + 1]`` tensor (the
    weight last: 1 where rows are unweighted, 0 marks a padding row), to gather on the last
    stage."""
    import torch

    label = target.label if target.label.dim() > 1 else target.label.unsqueeze(1)
    weight = torch.ones_like(label[:, :1]) if target.weight is None else \
        target.weight.unsqueeze(1)
    return torch.cat([label, weight.to(label.dtype)], 1)


def _widened(rows: torch.Tensor, length: int) -> torch.Tensor:
    """A padded sequence (or its mask) padded on the right to ``length`` (0 or False); any
    other input as it is."""
    import torch.nn.functional as F

    if not length or rows.shape[1] >= length:
        return rows
    return F.pad(rows, (0, length - rows.shape[1]))
