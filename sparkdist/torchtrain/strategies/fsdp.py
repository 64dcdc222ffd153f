"""``strategy="fsdp"``: fully sharded data parallelism with FSDP2
(``torch.distributed.fsdp.fully_shard``) over a 1-D device mesh of all barrier ranks.

Each rank keeps ``1/world`` of every parameter, of its gradient and of the optimizer state
(ZeRO-3): a wrapped unit's parameters are all-gathered for its forward and backward and freed
after, and its gradients are reduce-scattered (averaged over the ranks, as DDP averages them),
so the base class's ``train_step`` and its loss scaling hold unchanged: with the same seed the
loss curve equals ddp's.

Units (``fsdpWrap``): the modules of the named classes, else each top-level child that holds
parameters (through a lone ``nn.Sequential``/``ModuleList`` wrapper such as
:class:`sparkdist.torchtrain.nets.MLP`'s ``layers``, whose layers then become the units); then
the root. Checkpoints are sharded (:mod:`sparkdist.torchtrain.sharded`): every rank writes its
own part, and a checkpoint loads into another number of workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkdist.exceptions import ParamError
from sparkdist.torchtrain import strategies
from sparkdist.torchtrain.strategies.base import WholeModel

if TYPE_CHECKING:
    import torch

    from sparkdist.torchtrain.spec import TrainSpec

SUPPORTS = strategies.Supports(
    backends=("torch",), why="FSDP shards through torch.distributed collectives (all-gather, "
    "reduce-scatter), which Horovod does not provide", typed_inputs=True, adapters=True)
usable = strategies.any_world

CPU_MIXED_PRECISION = (
    "mixedPrecision=True needs GPU executors: on CPU, bfloat16 matrix products have no "
    "hardware support in most CPUs (they run slower than float32) and FSDP2's float32 "
    "master weights and reductions would save no memory; set mixedPrecision=False, or "
    "useGpu=True on a cluster with GPUs.")


def check(spec: TrainSpec, module: torch.nn.Module) -> None:
    """ParamError for a model or setting FSDP cannot train, before launch."""
    if spec.strategy.mixed_precision and spec.launch.use_gpu is False:
        raise ParamError(CPU_MIXED_PRECISION)
    units = wrap_units(module, list(spec.strategy.fsdp_wrap))  # ParamError: unknown name
    check_ties(module, units)


def check_ties(module: torch.nn.Module, units: list[torch.nn.Module]) -> None:
    """ParamError for a Parameter shared by modules in two units (FSDP2 refuses it only when
    the ranks shard the model: torch's ValueError, in every task). A tie inside one unit stays
    one sharded Parameter."""
    ids = {id(unit) for unit in units}
    for names in strategies.shared_parameters(module):
        owner = _unit_of(module, names[0], ids)
        other = next((name for name in names if _unit_of(module, name, ids) != owner), None)
        if other is not None:
            raise strategies.tied_error(
                "fsdp", [names[0], other], "FSDP shards each unit's parameters on their own "
                f"(units {_describe(owner)} and {_describe(_unit_of(module, other, ids))})",
                "fsdpWrap naming the class of a module that holds both (one unit), ")


def _unit_of(module: torch.nn.Module, name: str, unit_ids: set[int]) -> str:
    """The unit that manages parameter ``name`` ('' the root): the innermost unit on its path
    (FSDP2's rule: a unit manages its modules except those inside a unit of their own)."""
    node, path, owner = module, "", ""
    for step in name.split(".")[:-1]:
        node, path = getattr(node, step), f"{path}.{step}".lstrip(".")
        if id(node) in unit_ids:
            owner = path
    return owner


def _describe(unit: str) -> str:
    return repr(unit) if unit else "the root"


def wrap_units(module: torch.nn.Module, names: list[str]) -> list[torch.nn.Module]:
    """The submodules sharded as units of their own (innermost first), root excluded."""
    if names:
        present = {_class_names(sub) for sub in module.modules()}
        known = {name for pair in present for name in pair}
        missing = [name for name in names if name not in known]
        if missing:
            raise ParamError(f"fsdpWrap={names}: {missing} name no module class of the model; "
                             f"its classes are {sorted(pair[0] for pair in present)}. Give "
                             "class names (or qualified names) from that list, or leave "
                             "fsdpWrap empty to shard each top-level child.")
        matched = [sub for sub in module.modules()
                   if sub is not module and set(_class_names(sub)) & set(names)]
        return list(reversed(matched))  # descendants before their ancestors
    return _default_units(module)


def _default_units(module: torch.nn.Module) -> list[torch.nn.Module]:
    import torch.nn as nn

    children = [child for child in module.children() if _has_parameters(child)]
    while len(children) == 1 and isinstance(children[0], nn.Sequential | nn.ModuleList):
        children = [child for child in children[0].children() if _has_parameters(child)]
    return children


def _has_parameters(module: torch.nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _class_names(module: torch.nn.Module) -> tuple[str, str]:
    kind = type(module)
    return kind.__name__, f"{kind.__module__}.{kind.__qualname__}"


class Strategy(WholeModel):
    name = "fsdp"

    def setup(self, module: torch.nn.Module) -> None:
        """Shard every unit, then the root, over a mesh of all ranks (the process group is
        the backend's). Every rank built ``module`` from the same seed, so each keeps its
        slice of the same weights."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from sparkdist.torchtrain.sharded import fresh_dtensor_caches

        if self.spec.strategy.mixed_precision and self.device.type != "cuda":
            raise ParamError(CPU_MIXED_PRECISION)
        fresh_dtensor_caches()  # this reused worker may have held another rank before
        module = module.to(self.device)
        mesh = init_device_mesh(self.device.type, (self.context.world_size,))
        policy = self._mixed_precision()
        for unit in wrap_units(module, list(self.spec.strategy.fsdp_wrap)):
            fully_shard(unit, mesh=mesh, mp_policy=policy)
        fully_shard(module, mesh=mesh, mp_policy=policy)
        self.module = self.model = module

    def _mixed_precision(self) -> Any:
        """bfloat16 compute, float32 gradient reduction and outputs (the loss is computed
        in float32) with mixedPrecision; else FSDP2's default (everything float32)."""
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if not self.spec.strategy.mixed_precision:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                    output_dtype=torch.float32)

    def full_state(self) -> dict[str, Any] | None:
        """The consolidated state dict, gathered unit by unit to rank 0's CPU memory (the
        other ranks get nothing). Collective. The gradients are dropped first (the next step
        starts with ``zero_grad``, which drops them anyway): rank 0 needs room for the whole
        model here, and after the last epoch for its serialised copies too."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        for parameter in self.module.parameters():
            parameter.grad = None
        state: dict[str, Any] = get_model_state_dict(self.module, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
        if self.context.rank != 0:
            return None
        return {name: value.detach().cpu() for name, value in state.items()}

    def save_training_state(self, optimizer: Any, where: str) -> dict[str, Any] | None:
        """Every rank writes its shard under ``where``; rank 0 returns where they are and
        their SHA-256 digests. Collective."""
        from sparkdist.torchtrain import sharded

        return sharded.save(where, self.module, optimizer, bool(self.spec.finetune.base))

    def load_training_state(self, saved: dict[str, Any], optimizer: Any) -> None:
        """Verify the shards' digests, then read this rank's slices (resharded when the
        checkpoint was written by another number of workers). Collective."""
        from sparkdist.torchtrain import sharded

        sharded.load(saved, self.module, optimizer, bool(self.spec.finetune.base))
