"""Fine-tuning: a fit that starts from trained weights (``initialWeights``) and trains only the
parameters ``freeze`` leaves out. The same functions run on the driver (the checks, before
launch) and on every rank (after the network is built from the seed), so a rank applies what
the driver checked.

A pattern of ``freeze`` matches a parameter by its name (``top.0.weight``), or by the name of
a module holding it (``top.0``, ``encoder.*``), as ``fnmatch`` matches. A frozen parameter has
``requires_grad`` False: it gets no gradient, so DDP and FSDP leave it out of their all-reduce
and reduce-scatter buckets, and the optimizer is made over the trainable parameters only.
The initial weights are read with ``torch.load(weights_only=True)``: tensors and plain
containers, never a pickled object.

Adapters (``adapter="lora"``): peft's LoRA layers are injected into the modules
``adapterTargets`` names (``inject_adapter_in_model``: the network keeps its class and its
names, each target's weights moving under ``<name>.base_layer``), and every parameter but the
adapters' is frozen. Checkpoints and the fitted model then hold the adapters only; the base
weights come from ``initialWeights``, checked by their SHA-256.

Frozen parameters stay out of checkpoints too: a resume takes them from ``initialWeights``
again, as the first attempt did.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import re
from typing import TYPE_CHECKING, Any

from sparkdist.exceptions import ParamError

if TYPE_CHECKING:
    import torch

    from sparkdist.torchtrain.spec import FineTuneSpec


def matches(name: str, pattern: str) -> bool:
    """Whether ``pattern`` names the parameter ``name`` or a module holding it."""
    parts = name.split(".")
    return any(fnmatch.fnmatchcase(".".join(parts[:end]), pattern)
               for end in range(1, len(parts) + 1))


def state_of(payload: bytes, source: str) -> dict[str, torch.Tensor]:
    """A state dict from ``torch.save``'d bytes, loaded without unpickling any object:
    ParamError naming ``initialWeights`` for anything else."""
    import torch

    try:
        state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception as err:
        raise ParamError(f"initialWeights={source!r} is not a torch state dict that loads "
                         f"with weights_only=True ({type(err).__name__}: {str(err)[:300]}); "
                         f"save the weights with torch.save(module.state_dict(), path) or "
                         f"give a saved TorchModel's directory.") from err
    if not (isinstance(state, dict) and state and all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())):
        raise ParamError(f"initialWeights={source!r} holds {type(state).__name__}, not a state "
                         f"dict of names to tensors; save module.state_dict().")
    return state


def state_sha256(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a state dict's names, dtypes, shapes and values (not of a file's bytes,
    which torch.save does not keep the same for the same tensors)."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def prepare(module: torch.nn.Module, spec: FineTuneSpec) -> torch.nn.Module:
    """``module`` with the initial weights loaded (every name and shape as the network's:
    ParamError otherwise), the parameters ``spec.freeze`` matches frozen (ParamError for a
    pattern that matches nothing, or for nothing left to train) and the adapters added."""
    if spec.base:
        _load(module, state_of(spec.base, spec.source), spec.source)
    if spec.freeze:
        _freeze(module, spec.freeze)
    return add_adapters(module, spec)


#: The layer types peft's LoRA adapts (their subclasses too; a target of another type is
#: refused by name).
_ADAPTABLE = ("Linear", "Embedding", "Conv1d", "Conv2d")


def add_adapters(module: torch.nn.Module, spec: FineTuneSpec) -> torch.nn.Module:
    """``module`` with peft's LoRA layers on the modules ``spec.adapter_targets`` names and
    everything else frozen (as it is where ``spec.adapter`` is 'none')."""
    if spec.adapter == "none":
        return module
    from peft import LoraConfig, inject_adapter_in_model

    names = adapter_targets(module, spec.adapter_targets)
    # a regex is matched against the whole name (a list would also match name suffixes)
    exactly = "|".join(re.escape(name) for name in names)
    config = LoraConfig(r=spec.adapter_rank, lora_alpha=spec.adapter_alpha,
                        lora_dropout=spec.adapter_dropout, target_modules=exactly)
    inject_adapter_in_model(config, module)
    for name, parameter in module.named_parameters():
        parameter.requires_grad_(is_adapter(name))
    return module


def adapter_targets(module: torch.nn.Module, patterns: tuple[str, ...]) -> list[str]:
    """The names of the modules ``patterns`` match (fnmatch on the module's name) of a type
    LoRA adapts: ParamError for a pattern that matches none."""
    from torch import nn

    kinds = tuple(getattr(nn, kind) for kind in _ADAPTABLE)
    adaptable = [name for name, sub in module.named_modules() if name and isinstance(sub, kinds)]
    found: list[str] = []
    for pattern in patterns:
        hits = [name for name in adaptable if fnmatch.fnmatchcase(name, pattern)]
        if not hits:
            raise ParamError(f"adapterTargets={list(patterns)}: {pattern!r} matches no "
                             f"{'/'.join(_ADAPTABLE)} module of the network (those: "
                             f"{adaptable[:8]}{'...' if len(adaptable) > 8 else ''}); name "
                             f"modules it has.")
        found += [name for name in hits if name not in found]
    return found


def is_adapter(name: str) -> bool:
    """Whether a parameter or state-dict entry belongs to a LoRA adapter."""
    return ".lora_" in f".{name}"


def trained(module: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (the module's state dict) without its frozen parameters: what a checkpoint
    keeps (buffers stay: they are not initial weights)."""
    frozen = {name for name, p in module.named_parameters() if not p.requires_grad}
    return {name: value for name, value in state.items() if name not in frozen}


def load_trained(module: torch.nn.Module, state: dict[str, Any]) -> None:
    """Load what :func:`trained` kept: every entry but the frozen parameters must be there."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    frozen = {name for name, p in module.named_parameters() if not p.requires_grad}
    wrong = sorted(set(missing) - frozen) + sorted(unexpected)
    if wrong:
        raise ParamError(f"the checkpoint does not fit this network and its frozen parameters "
                         f"({wrong[:6]}); resume from another runId.")


def merged(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with each LoRA adapter merged into its layer's weights and the layer put
    back in its place: the plain network, scoring as the adapted one did."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, sub in list(module.named_modules()):
        if isinstance(sub, BaseTunerLayer):
            sub.merge()
            parent, _, child = name.rpartition(".")
            setattr(module.get_submodule(parent) if parent else module, child,
                    sub.get_base_layer())
    return module


def _load(module: torch.nn.Module, state: dict[str, Any], source: str) -> None:
    own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [f"{name}: {tuple(state[name].shape)} here, {tuple(own[name].shape)} in the "
              f"network" for name in sorted(set(own) & set(state))
              if state[name].shape != own[name].shape]
    if missing or unexpected or shapes:
        found = [f"missing {missing[:4]}"] * bool(missing) + \
            [f"not in the network {unexpected[:4]}"] * bool(unexpected) + shapes[:4]
        raise ParamError(f"initialWeights={source!r} does not fit the network: "
                         f"{'; '.join(found)}; give the weights of this network (model and "
                         f"modelKwargs as when they were trained).")
    module.load_state_dict(state)


def _freeze(module: torch.nn.Module, patterns: tuple[str, ...]) -> None:
    names = [name for name, _ in module.named_parameters()]
    unmatched = [p for p in patterns if not any(matches(name, p) for name in names)]
    if unmatched:
        raise ParamError(f"freeze={list(patterns)}: {unmatched} match no parameter or module "
                         f"of the network (its parameters: {names[:8]}"
                         f"{'...' if len(names) > 8 else ''}); name modules or parameters "
                         f"it has.")
    frozen = 0
    for name, parameter in module.named_parameters():
        if any(matches(name, p) for p in patterns):
            parameter.requires_grad_(False)
            frozen += 1
    if frozen == len(names):
        raise ParamError(f"freeze={list(patterns)} freezes every parameter of the network: "
                         f"nothing would train; leave some modules out of freeze.")
