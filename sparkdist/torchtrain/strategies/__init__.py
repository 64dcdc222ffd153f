"""How a network is spread over the barrier ranks: one module per strategy behind one declared
interface, so the training loop (:mod:`sparkdist.torchtrain.loop`) is written once.

- ``ddp`` (:mod:`.ddp`): a whole replica per rank; the gradients are averaged (DDP or Horovod).
- ``fsdp`` (:mod:`.fsdp`): parameters, gradients and optimizer state sharded across the ranks.
- ``pipeline`` (:mod:`.pipeline`): the model's top-level children split into stages.
- ``tensor`` (:mod:`.tensor`): each Linear layer's matrices split across the ranks.
- ``ps`` (:mod:`.ps`): embedding tables held by parameter servers, the rest as ``ddp``.

A strategy module implements :class:`StrategyModule`: it declares what it supports
(``SUPPORTS``: backends, gradient compression, local steps; ``usable``: the world sizes an
elastic restart may take it to), which :func:`check_compatible` alone reads; it gives the
driver's preflight ``check(spec, module)`` (``module`` built on the driver); and its
``Strategy`` class implements :class:`Strategy` on every rank (:class:`.base.WholeModel` is
the behaviour of a whole model on every rank, which the others refine). The loop calls, on
every rank and in this order: ``setup(module)``, ``optimizer()``, then per step
``train_step`` and per validation batch ``predict`` (every rank the same number of times),
and ``full_state`` / ``save_training_state`` / ``load_training_state`` for results and
checkpoints (collective).

A Parameter two modules share (weight tying) must stay one tensor: ``ddp`` keeps it whole
on every rank, ``pipeline`` keeps the modules holding it in one stage, ``fsdp`` in one unit,
and ``tensor`` refuses it. The strategies find ties with :func:`shared_parameters` and
refuse them with :func:`tied_error`, in their ``check`` (the driver's preflight).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sparkdist.columns import check_one_of
from sparkdist.exceptions import ParamError

if TYPE_CHECKING:
    import torch

    from sparkdist.launch.barrier import WorkerContext
    from sparkdist.torchtrain.clock import StepClock
    from sparkdist.torchtrain.inputs import Inputs, Target
    from sparkdist.torchtrain.spec import TrainSpec

STRATEGIES = ("ddp", "fsdp", "pipeline", "tensor", "ps")


@dataclasses.dataclass(frozen=True)
class Supports:
    """What a strategy can train with; :func:`check_compatible` refuses anything else."""

    #: the communication backends (:mod:`sparkdist.torchtrain.backends`) it runs on
    backends: tuple[str, ...] = ("torch",)
    #: why it cannot run on the others, for the ParamError
    why: str = ""
    #: ``gradientCompression`` modes (:mod:`sparkdist.torchtrain.compression`)
    compressions: tuple[str, ...] = ("none",)
    #: local steps and model averaging (``syncEvery`` > 1, ``maxStaleness`` > 0)
    local_steps: bool = False
    #: several typed inputs by keyword (``inputCols``), labels of several values per row
    #: (an array ``labelCol``, ``labelCols``) and row weights (``weightCol``), not only one
    #: features tensor and one label
    typed_inputs: bool = False
    #: LoRA adapters (``adapter``) on a frozen base
    adapters: bool = False
    #: embedding tables built on the meta device (no rank holds them whole)
    meta_tables: bool = False


@runtime_checkable
class Strategy(Protocol):
    """One rank's part of a strategy: what the training loop calls."""

    name: str
    module: Any  # this rank's part of the network
    model: Any  # what a training step calls

    def setup(self, module: torch.nn.Module) -> None: ...

    def optimizer(self) -> Any: ...

    def train_step(self, features: Inputs, target: Target, scale: float,
                   optimizer: Any) -> torch.Tensor: ...

    def predict(self, features: Inputs) -> torch.Tensor | None: ...

    def full_state(self) -> dict[str, Any] | None: ...

    def save_training_state(self, optimizer: Any, where: str) -> dict[str, Any] | None: ...

    def load_training_state(self, saved: dict[str, Any], optimizer: Any) -> None: ...

    def state_bytes(self, optimizer: Any) -> int: ...


@runtime_checkable
class StrategyModule(Protocol):
    """What every strategy module declares and defines."""

    SUPPORTS: Supports
    Strategy: Callable[..., Strategy]

    def check(self, spec: TrainSpec, module: torch.nn.Module) -> None:
        """The driver's preflight with the network built: ParamError naming the Param."""

    def usable(self, spec: TrainSpec) -> Callable[[int], bool]:
        """``world -> bool``: the worker counts a launch may run this strategy on."""


def strategy_module(name: str) -> StrategyModule:
    """The module of strategy ``name`` (only the fixed names above are ever imported)."""
    check_one_of("strategy", name, STRATEGIES)
    found: StrategyModule = importlib.import_module(f"{__name__}.{name}")  # type: ignore[assignment]
    return found


def make_strategy(context: WorkerContext, backend: Any, device: torch.device,
                  spec: TrainSpec, clock: StepClock) -> Strategy:
    return strategy_module(spec.strategy.name).Strategy(context, backend, device, spec, clock)


def check(spec: TrainSpec, module: torch.nn.Module) -> None:
    """The chosen strategy's preflight on the driver: ParamError naming the Param and the fix
    for a configuration that cannot train (before anything is launched)."""
    chosen = strategy_module(spec.strategy.name)
    meta = [name for name, parameter in module.named_parameters() if parameter.is_meta]
    if meta and not chosen.SUPPORTS.meta_tables:
        raise ParamError(f"strategy={spec.strategy.name!r}: the parameters {meta} are on the "
                         "meta device (no memory behind them); only strategy='ps' trains "
                         "such tables (its servers draw the rows). Use strategy='ps', or "
                         "build them on the CPU.")
    chosen.check(spec, module)


def usable(spec: TrainSpec) -> Callable[[int], bool]:
    """``world -> bool``: the worker counts an elastic restart may run the chosen strategy
    on (its module's declaration)."""
    return strategy_module(spec.strategy.name).usable(spec)


def any_world(spec: TrainSpec) -> Callable[[int], bool]:
    """``usable`` of a strategy that runs on any number of workers."""
    return _any_world


def _any_world(world: int) -> bool:
    return True


def check_compatible(spec: TrainSpec) -> None:
    """The one check of strategy, backend and communication settings against what the
    strategy (``SUPPORTS``) and the backend (its class's ``compressions``/``local_steps``)
    declare: ParamError naming the Param and the fix."""
    from sparkdist.torchtrain import backends, compression

    name, comm = spec.strategy.name, spec.comm
    supports = strategy_module(name).SUPPORTS
    backend = backends.backend_class(comm.backend)  # ParamError: unknown backend
    check_one_of("gradientCompression", comm.gradient_compression, compression.COMPRESSIONS)
    typed = [asked for asked, used in (
        ("inputCols (several typed inputs)", spec.model.inputs),
        ("labels of several values (labelCols or an array labelCol)", spec.model.label_width),
        ("weightCol (row weights)", spec.rules.weight_col)) if used]
    if spec.finetune.adapter != "none" and not supports.adapters:
        raise ParamError(f"adapter={spec.finetune.adapter!r} with strategy={name!r}: adapters "
                         f"train under strategy='ddp' or 'fsdp'.")
    if typed and not supports.typed_inputs:
        raise ParamError(f"{typed[0]} with strategy={name!r}: this strategy feeds one "
                         f"features tensor and one label; use strategy='ddp' or 'fsdp' (or "
                         f"assemble the inputs into one vector: featuresCol).")
    if comm.backend not in supports.backends:
        raise ParamError(f"strategy={name!r} with backend={comm.backend!r}: {supports.why}; "
                         f"set backend={supports.backends[0]!r}.")
    local = [f"{param}={value!r}" for param, value, off in (
        ("syncEvery", comm.sync_every, 1), ("maxStaleness", comm.max_staleness, 0))
        if value != off]
    asked = [f"gradientCompression={comm.gradient_compression!r}"] * (
        comm.gradient_compression not in supports.compressions) + (
        local if not supports.local_steps else [])
    if asked:
        raise ParamError(f"{', '.join(asked)} need(s) strategy='ddp' (a whole replica per "
                         f"worker), not strategy={name!r}: use strategy='ddp' or leave "
                         "gradientCompression='none', syncEvery=1, maxStaleness=0.")
    _check_backend(backend, comm.gradient_compression, local)


def _check_backend(backend: Any, compression: str, local: list[str]) -> None:
    from sparkdist.torchtrain.backends import HOROVOD_INSTALL, horovod_available

    if compression not in backend.compressions:
        raise ParamError(f"gradientCompression={compression!r} has no {backend.title} "
                         f"equivalent: use one of {list(backend.compressions)}, or "
                         "backend='torch'.")
    if local and not backend.local_steps:
        raise ParamError(f"{', '.join(local)} needs backend='torch' (local steps and model "
                         f"averaging are not built for {backend.title}): set syncEvery=1, "
                         "maxStaleness=0 or backend='torch'.")
    if backend.name == "horovod" and not horovod_available():
        raise ParamError(f"backend='horovod': {HOROVOD_INSTALL}")


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
