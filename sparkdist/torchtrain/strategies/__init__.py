"""How a network is spread over the barrier ranks: one module per strategy behind one small
interface, so the training loop (:mod:`sparkdist.torchtrain.loop`) is written once.

- ``ddp`` (:mod:`.ddp`): a whole replica per rank; the gradients are averaged (DDP or Horovod).
- ``fsdp`` (:mod:`.fsdp`): parameters, gradients and optimizer state sharded across the ranks.
- ``pipeline`` (:mod:`.pipeline`): the model's top-level children split into stages.
- ``tensor`` (:mod:`.tensor`): each Linear layer's matrices split across the ranks.

A strategy module defines ``Strategy`` (a subclass of :class:`Strategy`) and
``check(spec, module)``, the driver's preflight (``module`` built on the driver). The loop
calls, on every rank and in this order: ``setup(module)``, ``optimizer()``, then per step
``train_step`` and per validation batch ``predict`` (every rank the same number of times),
and ``full_state`` / ``save_training_state`` / ``load_training_state`` for results and
checkpoints (collective).

A Parameter two modules share (weight tying) must stay one tensor: ``ddp`` keeps it whole
on every rank, ``pipeline`` keeps the modules holding it in one stage, ``fsdp`` in one unit,
and ``tensor`` refuses it. The strategies find ties with :func:`shared_parameters` and
refuse them with :func:`tied_error`, in their ``check`` (the driver's preflight).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparkdist.columns import check_one_of
from sparkdist.exceptions import ParamError

if TYPE_CHECKING:
    import torch

    from sparkdist.launch.barrier import WorkerContext

STRATEGIES = ("ddp", "fsdp", "pipeline", "tensor")


def strategy_module(name: str) -> Any:
    """The module of strategy ``name`` (only the fixed names above are ever imported)."""
    check_one_of("strategy", name, STRATEGIES)
    return importlib.import_module(f"{__name__}.{name}")


def make_strategy(context: WorkerContext, backend: Any, device: torch.device,
                  args: dict[str, Any], clock: Any) -> Strategy:
    return strategy_module(args.get("strategy", "ddp")).Strategy(context, backend, device,
                                                                 args, clock)


def check(spec: dict[str, Any], module: torch.nn.Module) -> None:
    """The chosen strategy's preflight on the driver: ParamError naming the Param and the fix
    for a configuration that cannot train (before anything is launched)."""
    strategy_module(spec.get("strategy", "ddp")).check(spec, module)


def shared_parameters(module: torch.nn.Module) -> list[list[str]]:
    """The names of each Parameter that more than one name reaches (weight tying, e.g.
    ``self.b.weight = self.a.weight``), in the model's order; a module registered twice
    counts too.

    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    >>> net[2].weight = net[0].weight
    >>> shared_parameters(net)
    [['0.weight', '2.weight']]
    """
    names: dict[int, list[str]] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def holder(name: str) -> str:
    """The module that holds parameter ``name``, as a user reads it."""
    owner = name.rpartition(".")[0]
    return repr(owner) if owner else "the model itself"


def tied_error(strategy: str, names: list[str], why: str, fix: str = "") -> ParamError:
    """ParamError for a Parameter the modules holding ``names`` share, which ``strategy``
    would train as separate copies (``why``); ``fix`` is a strategy's own way out."""
    modules = " and ".join(holder(name) for name in names[:2])
    return ParamError(f"strategy={strategy!r}: {modules} share one Parameter ("
                      f"{' is '.join(names)}, weight tying), and {why}, so the tie would "
                      f"be broken; use strategy='ddp' (which keeps it one tensor), {fix}or "
                      f"untie the modules (give each its own Parameter).")


def usable(spec: dict[str, Any]) -> Callable[[int], bool]:
    """``world -> bool``: the worker counts an elastic restart may run the chosen strategy
    on (its module's ``usable(spec)`` where it limits them, e.g. pipeline, tensor)."""
    limit = getattr(strategy_module(spec.get("strategy", "ddp")), "usable", None)
    return limit(spec) if limit else _any_world


def _any_world(world: int) -> bool:
    return True


class Strategy:
    """The interface, with the behaviour of a whole model on every rank."""

    name = "base"

    def __init__(self, context: WorkerContext, backend: Any, device: torch.device,
                 args: dict[str, Any], clock: Any) -> None:
        self.context, self.backend, self.device, self.args = context, backend, device, args
        self.clock = clock  # sparkdist.torchtrain.loop.StepClock
        self.module: Any = None  # this rank's part of the network (all of it here)
        self.model: Any = None  # what a training step calls

    def setup(self, module: torch.nn.Module) -> None:
        """Place, wrap or split ``module`` (built from the same seed on every rank)."""
        self.module = self.model = module.to(self.device)

    def optimizer(self) -> Any:
        """The optimizer over the parameters this rank holds."""
        from sparkdist.torchtrain.loop import make_optimizer

        args = self.args
        return make_optimizer(args["optimizer"], self.module.parameters(),
                              args["learning_rate"], args["weight_decay"])

    def train_step(self, features: torch.Tensor, label: torch.Tensor, scale: float,
                   optimizer: Any) -> torch.Tensor:
        """Forward, backward (the loss sum times ``scale``) and the optimizer step; returns
        the unscaled loss sum of this rank's rows, detached (zero where a rank computes no
        loss)."""
        from sparkdist.torchtrain.loop import loss_sum

        output = self.model(features)
        loss = loss_sum(self.args["loss_fn"], output, label)
        optimizer.zero_grad()
        (loss * scale).backward()
        self.clock.backward_done()
        optimizer.step()
        return loss.detach()

    def predict(self, features: torch.Tensor) -> torch.Tensor | None:
        """Evaluation outputs for ``features`` (no grad, eval mode set by the caller), or
        None on a rank that produces none (a pipeline stage before the last)."""
        return self.module(features)

    def full_state(self) -> dict[str, Any] | None:
        """The whole model's state dict, on CPU, on rank 0 (None elsewhere). Collective."""
        if self.context.rank != 0:
            return None
        return {name: value.detach().cpu().clone()
                for name, value in self.module.state_dict().items()}

    def save_training_state(self, optimizer: Any, where: str) -> dict[str, Any] | None:
        """What a checkpoint keeps of the model and optimizer: rank 0's whole state dicts
        here (None elsewhere). A sharded strategy writes every rank's shard under the
        directory ``where`` and returns what finds it again. Collective."""
        if self.context.rank != 0:
            return None
        return {"model": self.full_state(), "optimizer": optimizer.state_dict()}

    def state_bytes(self, optimizer: Any) -> int:
        """Bytes this rank holds of parameters, gradients and optimizer state (its shards
        only, for a sharded or split model): the memory a strategy divides."""
        tensors = [*self.module.parameters(),
                   *(p.grad for p in self.module.parameters() if p.grad is not None),
                   *(value for state in optimizer.state.values() for value in state.values()
                     if hasattr(value, "element_size"))]
        local = (t.to_local() if hasattr(t, "to_local") else t for t in tensors)
        return sum(t.numel() * t.element_size() for t in local)

    def load_training_state(self, saved: dict[str, Any], optimizer: Any) -> None:
        """Restore what :meth:`save_training_state` returned (read back by every rank)."""
        self.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
