"""``strategy="tensor"``: tensor (intra-layer) parallelism with DTensor's
``parallelize_module`` over a 1-D device mesh of all barrier ranks (Megatron-LM's MLP split).

The plan comes from the model itself: its Linear layers, in the order the forward pass calls
them, are paired; the first of a pair is split by output features (``ColwiseParallel``: each
rank holds ``out_features / world`` rows of the weight), the second by input features
(``RowwiseParallel``: the matching columns; its partial outputs are summed by one all-reduce).
What runs between the two sees only the rank's slice of the hidden units, so it must be
elementwise (ReLU, GELU, Dropout, ...); the preflight checks that with the modules it sees
called (a functional op in ``forward`` it cannot see). A trailing odd Linear (usually the small
output layer, whose width, e.g. 1 for ``bce``, seldom divides by the workers) stays whole on
every rank, as do all non-Linear parameters: every rank computes the same gradient for them.

Tensor-parallel ranks must see the same rows, so each step all-gathers the rows of every
rank's feed and every rank computes the whole global batch (``batchSize x numWorkers`` rows,
as under ddp). The loss is the sum over the global batch divided by its rows, so the gradient
is the global batch's mean: with the same seed the losses equal ddp's to float tolerance
(the sums run in another order, which Adam amplifies over later epochs). Dropout
follows Megatron's rule: rank 0's step seed wherever activations are replicated (so replicas
stay equal), the rank's own seed inside a split pair (independent masks per slice).

Checkpoints are sharded (:mod:`sparkdist.torchtrain.sharded`, DCP): every rank writes its own
slices, and a checkpoint loads into any number of workers the plan divides.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from sparkdist.exceptions import ParamError
from sparkdist.torchtrain import resume, strategies
from sparkdist.torchtrain.network import build_module, loss_sum
from sparkdist.torchtrain.strategies.base import WholeModel

if TYPE_CHECKING:
    import torch

    from sparkdist.torchtrain.inputs import Target
    from sparkdist.torchtrain.spec import TrainSpec

SUPPORTS = strategies.Supports(
    backends=("torch",), why="DTensor splits the layers through torch.distributed collectives "
    "(all-gather, all-reduce on a device mesh), which Horovod does not provide")

#: Modules that act on each hidden unit separately: they may run on a rank's slice.
ELEMENTWISE = ("ReLU", "ReLU6", "GELU", "SiLU", "Mish", "Tanh", "Sigmoid", "Hardtanh",
               "Hardswish", "Hardsigmoid", "LeakyReLU", "ELU", "SELU", "CELU", "Softplus",
               "Softsign", "Tanhshrink", "Dropout", "AlphaDropout", "Identity")

_MIX = 1_000_003  # spreads a rank's per-pair seeds apart


@dataclasses.dataclass
class Plan:
    """Linear layers by qualified name: ``pairs`` of (colwise, rowwise), then the rest."""

    pairs: list[tuple[str, str]]
    whole: list[str]

    def styles(self) -> dict[str, Any]:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        plan: dict[str, Any] = {}
        for colwise, rowwise in self.pairs:
            plan[colwise], plan[rowwise] = ColwiseParallel(), RowwiseParallel()
        return plan


def check(spec: TrainSpec, module: torch.nn.Module) -> None:
    """ParamError for a model tensor parallelism cannot train, before launch."""
    tied = strategies.shared_parameters(module)
    if tied:  # parallelize_module would split (or replicate) each holder's copy on its own
        raise strategies.tied_error("tensor", tied[0], "tensor parallelism splits each "
                                    "module's parameters on their own")
    plan_of(module, spec.model.input_dim, spec.launch.num_workers)


def usable(spec: TrainSpec) -> Any:
    """``world -> bool``: whether a launch on ``world`` workers can split the model (each
    split width a multiple of ``world``), for an elastic restart on fewer workers."""
    import torch

    model = spec.model
    module = build_module(model.module, model.module_kwargs, model.input_dim,
                          model.output_dim)
    calls = _trace(module, model.input_dim)
    linears = [sub for _, sub in calls if isinstance(sub, torch.nn.Linear)]
    widths = [layer.out_features for layer in linears[0:2 * (len(linears) // 2):2]]
    return lambda world: all(width % world == 0 for width in widths)


def plan_of(module: torch.nn.Module, input_dim: int, world: int) -> Plan:
    """The split of ``module``'s Linear layers over ``world`` ranks, or ParamError."""
    import torch

    calls = _trace(module, input_dim)
    linears = [name for name, sub in calls if isinstance(sub, torch.nn.Linear)]
    if not linears:
        raise ParamError("strategy='tensor' splits nn.Linear layers, and this model calls "
                         "none in its forward pass; use strategy='ddp' (or 'fsdp' to shard "
                         "other layers).")
    repeated = sorted({name for name in linears if linears.count(name) > 1})
    if repeated:
        raise ParamError(f"strategy='tensor': the forward pass calls Linear {repeated} more "
                         "than once, and a shared layer cannot be split as both halves of a "
                         "pair; use strategy='ddp' or 'fsdp'.")
    pairs = list(zip(linears[0::2], linears[1::2]))
    layers = dict(module.named_modules())
    for colwise, rowwise in pairs:
        _check_pair(calls, layers, colwise, rowwise, world)
    return Plan(pairs, linears[2 * len(pairs):])


def _trace(module: torch.nn.Module, input_dim: int) -> list[tuple[str, torch.nn.Module]]:
    """The leaf modules in the order one forward pass of two rows of zeros calls them."""
    import torch

    calls: list[tuple[str, torch.nn.Module]] = []
    handles = [sub.register_forward_pre_hook(
        lambda layer, _args, name=name: calls.append((name, layer)))
        for name, sub in module.named_modules() if not list(sub.children())]
    device = next(module.parameters(), torch.zeros(0)).device
    training = module.training
    try:
        module.eval()  # no dropout draws: the step seeds decide every random number
        with torch.no_grad():
            module(torch.zeros(2, input_dim, device=device))
    finally:
        module.train(training)
        for handle in handles:
            handle.remove()
    return calls


def _check_pair(calls: list[tuple[str, Any]], layers: dict[str, Any], colwise: str,
                rowwise: str, world: int) -> None:
    import torch

    first, second = layers[colwise], layers[rowwise]
    names = [name for name, _ in calls]
    between = calls[names.index(colwise) + 1:names.index(rowwise)]
    elementwise = tuple(getattr(torch.nn, kind) for kind in ELEMENTWISE)
    alien = [f"{name!r} ({type(sub).__name__})" for name, sub in between
             if not isinstance(sub, elementwise)]
    if alien or first.out_features != second.in_features:
        found = (f"{', '.join(alien)} runs between them" if alien else
                 f"{colwise!r} gives {first.out_features} features, {rowwise!r} takes "
                 f"{second.in_features}")
        raise ParamError(f"strategy='tensor' pairs consecutive Linear layers {colwise!r} "
                         f"(split by output features) and {rowwise!r} (split by input "
                         f"features), and only elementwise modules may run on the split "
                         f"hidden units between them, but {found}; use strategy='ddp' or "
                         f"'fsdp' for this model.")
    if first.out_features % world:
        raise ParamError(f"strategy='tensor' splits the {first.out_features} output features "
                         f"of Linear {colwise!r} (and the input features of {rowwise!r}) "
                         f"over numWorkers={world} ranks, which does not divide them; set "
                         f"numWorkers to a divisor of {first.out_features}, or make that "
                         f"width a multiple of {world} (modelKwargs).")


class Strategy(WholeModel):
    name = "tensor"

    def setup(self, module: torch.nn.Module) -> None:
        """Split the paired Linear layers over a mesh of all ranks (rank 0's weights are
        scattered: every rank built the same ones from the seed anyway)."""
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor.parallel import parallelize_module

        from sparkdist.torchtrain.sharded import fresh_dtensor_caches

        fresh_dtensor_caches()  # this reused worker may have held another rank before
        module = module.to(self.device)
        world = self.context.world_size
        plan = plan_of(module, self.spec.model.input_dim, world)
        self.mesh = DeviceMesh(self.device.type, list(range(world)))
        self.module = self.model = parallelize_module(module, self.mesh, plan.styles())
        self._own_seed: int | None = None
        self._saved_rng: Any = None
        layers = dict(module.named_modules())
        for pair, (colwise, rowwise) in enumerate(plan.pairs):
            layers[colwise].register_forward_hook(
                lambda _m, _a, _o, pair=pair: self._enter_split(pair))
            layers[rowwise].register_forward_pre_hook(lambda _m, _a: self._leave_split())

    # ------------------------------------------------------------------ random numbers
    def _enter_split(self, pair: int) -> None:
        """After a colwise layer: this rank's own stream for its slice of hidden units."""
        import torch

        if self._own_seed is None or not self.module.training:
            return
        self._saved_rng = (torch.get_rng_state(), self._device_rng())
        resume.seed_torch((self._own_seed + _MIX * (pair + 1)) % 2**63, self.device)

    def _leave_split(self) -> None:
        """Before the rowwise layer: back to the stream every rank shares."""
        import torch

        if self._saved_rng is None:
            return
        host, device = self._saved_rng
        torch.set_rng_state(host)
        if device is not None:
            torch.cuda.set_rng_state(device, self.device)
        self._saved_rng = None

    def _device_rng(self) -> Any:
        import torch

        return torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None

    # ------------------------------------------------------------------ data
    def _gather(self, rows: torch.Tensor) -> tuple[torch.Tensor, list[int], int]:
        """Every rank's ``rows`` stacked in rank order (the same on every rank), the row
        counts and rank 0's torch seed. Counts first (they differ, empty included), then
        the rows padded to the largest count: gloo's all_gather wants equal shapes."""
        import torch
        import torch.distributed as dist

        world = self.context.world_size
        meta = torch.tensor([rows.shape[0], torch.initial_seed() % 2**63], dtype=torch.int64,
                            device=self.device)
        metas = [torch.empty_like(meta) for _ in range(world)]
        dist.all_gather(metas, meta)
        sizes = [int(m[0]) for m in metas]
        padded = rows.new_zeros((max(sizes), *rows.shape[1:]))
        padded[:rows.shape[0]] = rows
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)]), sizes, int(metas[0][1])

    def train_step(self, features: torch.Tensor, target: Target, scale: float,
                   optimizer: Any) -> torch.Tensor:
        """One step on the global batch. ``scale`` is ``world / global rows`` (the loop's
        rule for data-parallel ranks, which each hold a slice); here every rank holds the
        whole batch and computes the same loss, so the loss sum is scaled by
        ``scale / world`` and only rank 0 returns it (the loop sums over ranks)."""
        import torch

        from sparkdist.torchtrain.inputs import Target

        self._own_seed = torch.initial_seed()  # the loop's seed for this rank and step
        rows, _, shared = self._gather(torch.cat([features, target.label.unsqueeze(1)], dim=1))
        resume.seed_torch(shared, self.device)  # replicated activations: the same dropout
        output = self.model(rows[:, :-1])
        loss = loss_sum(self.spec.model.loss_fn, output, Target(rows[:, -1]))
        optimizer.zero_grad()
        (loss * (scale / self.context.world_size)).backward()
        self.clock.backward_done()
        optimizer.step()
        self._own_seed = None
        loss = loss.detach()
        return loss if self.context.rank == 0 else torch.zeros_like(loss)

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """Outputs for this rank's own rows (collective: every rank's rows go through the
        split layers together)."""
        rows, sizes, _ = self._gather(features)
        start = sum(sizes[:self.context.rank])
        return self.module(rows)[start:start + sizes[self.context.rank]]

    # ------------------------------------------------------------------ state
    def full_state(self) -> dict[str, Any] | None:
        """Every split parameter gathered whole (``DTensor.full_tensor``) onto rank 0."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        state = get_model_state_dict(self.module, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
        if self.context.rank != 0:
            return None
        return _copies(state)

    def save_training_state(self, optimizer: Any, where: str) -> dict[str, Any] | None:
        """Every rank writes its slices under ``where`` (DCP, through
        :mod:`sparkdist.torchtrain.sharded`); rank 0 returns where they are and their SHA-256
        digests. Collective."""
        from sparkdist.torchtrain import sharded

        return sharded.save(where, self.module, optimizer, bool(self.spec.finetune.base))

    def load_training_state(self, saved: dict[str, Any], optimizer: Any) -> None:
        """Verify the shards' digests, then read this rank's slices (re-split when the
        checkpoint was written by another number of workers). Collective."""
        from sparkdist.torchtrain import sharded

        sharded.load(saved, self.module, optimizer, bool(self.spec.finetune.base))

def _copies(state: Any) -> dict[str, Any]:
    """CPU copies: tensors that were never split come back as the live parameters."""
    return {name: value.detach().cpu().clone() for name, value in state.items()}
