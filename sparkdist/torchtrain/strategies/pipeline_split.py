"""How ``strategy="pipeline"`` cuts a network into stages, without any process group: the
driver's preflight and every rank use the same functions, so the rank's split is the one the
driver checked.

The pipeline runs the model's top-level children one after another. A model whose only child
holds children of its own (``MLP.layers``, an ``nn.Sequential``) is split through that child.
With typed inputs (``inputCols``) the first child takes them, by keyword, as the model's
``forward`` does, and hands the next child one tensor.
A stage is a module holding its children under their original names, nested under the same
path, so its ``state_dict`` keys (and parameter names) are the whole model's: the stages'
state dicts merge back into the model's, and a checkpoint keyed by those names loads into any
other split.

>>> from sparkdist.torchtrain.nets import MLP
>>> net = MLP(input_dim=4, output_dim=1, hidden=[8, 8])
>>> plan = split_plan(net, 2)
>>> plan.groups
[['0', '1'], ['2', '3', '4']]
>>> list(stage_module(net, plan, 1).state_dict())
['layers.2.weight', 'layers.2.bias', 'layers.4.weight', 'layers.4.bias']
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sparkdist.exceptions import ParamError
from sparkdist.torchtrain import network, strategies
from sparkdist.torchtrain.spec import InputField

_NEEDS_SEQUENCE = ("strategy='pipeline' needs a model whose forward runs its top-level "
                   "children in order")
_TYPED = " (the first taking the typed inputs of inputCols by keyword)"


def _sample(input_dim: int, fields: tuple[InputField, ...]) -> torch.Tensor | dict[str, Any]:
    """Four rows of random input: floats from a seeded normal, ids 0, sequences 3 long."""
    generator = torch.Generator().manual_seed(0)
    if not fields:
        return torch.randn(4, input_dim, generator=generator)
    sample = network.dummy_inputs(input_dim, fields, rows=4)
    for field in fields:
        if field.sequence:
            sample[field.arg] = torch.zeros(4, 3, dtype=torch.int64)
            if field.mask:
                sample[f"{field.arg}_mask"] = torch.ones(4, 3, dtype=torch.bool)
        elif field.dtype == "float32":
            sample[field.arg] = torch.randn(sample[field.arg].shape, generator=generator)
    return sample


@dataclass(frozen=True)
class SplitPlan:
    """Where the children live (``path``: the attribute names from the model down to their
    parent, empty for top-level children) and which of them each stage runs."""

    path: tuple[str, ...]
    groups: list[list[str]]

    def describe(self) -> str:
        prefix = "".join(f"{name}." for name in self.path)
        return "; ".join(f"stage {index}: {prefix}{group[0]}..{prefix}{group[-1]}"
                         for index, group in enumerate(self.groups))


def splittable(module: nn.Module) -> tuple[tuple[str, ...], list[tuple[str, nn.Module]]]:
    """The children a pipeline splits and the path to their parent: the model's top-level
    children, or those of its only child while the model (or that child) has just one."""
    path: list[str] = []
    node = module
    children = list(node.named_children())
    while len(children) == 1 and len(list(children[0][1].children())) >= 2:
        path.append(children[0][0])
        node = children[0][1]
        children = list(node.named_children())
    return tuple(path), children


def _outside_children(module: nn.Module, path: tuple[str, ...]) -> list[str]:
    """Parameters and buffers held by the model or a container on ``path`` themselves (not
    by a child that a stage runs): no stage would hold them."""
    names, node, prefix = [], module, ""
    for step in (*path, None):
        names += [prefix + name for name, _ in node.named_parameters(recurse=False)]
        names += [prefix + name for name, _ in node.named_buffers(recurse=False)]
        if step is None:
            break
        node, prefix = getattr(node, step), f"{prefix}{step}."
    return names


def split_plan(module: nn.Module, stages: int, split_points: list[str] | None = None) -> SplitPlan:
    """The children of each of ``stages`` stages: cut before the named ``split_points``, or
    balanced by parameter count, never between two children that share a Parameter (each
    stage would train its own copy). ParamError naming the Param and the fix where the model
    cannot be split so."""
    path, children = splittable(module)
    names = [name for name, _ in children]
    where = "the model" if not path else f"the model's {'.'.join(path)}"
    if not children:
        raise ParamError(f"strategy='pipeline': {where} has no children to split into stages "
                         f"(its forward is one piece); give a model built from layers "
                         f"(an nn.Sequential or attributes run in order), or use "
                         f"strategy='ddp'.")
    if len(children) < stages:
        count = f"{len(children)} child" + ("ren" if len(children) > 1 else "")
        raise ParamError(f"pipelineStages={stages}: {where} has only {count} to split "
                         f"({', '.join(names)}); use pipelineStages <= {len(children)} (and "
                         f"numWorkers a multiple of it), or a model with more layers.")
    outside = _outside_children(module, path)
    if outside:
        raise ParamError(f"strategy='pipeline': {where} holds parameters or buffers outside "
                         f"its children ({', '.join(outside)}), which no stage would run; move "
                         f"them into a child module, or use strategy='ddp'.")
    cuts = _cuts(module, path, children, stages, split_points or [])
    bounds = [0, *cuts, len(names)]
    plan = SplitPlan(path, [names[a:b] for a, b in zip(bounds, bounds[1:])])
    _require_parameters(plan, dict(children))
    return plan


def _cuts(module: nn.Module, path: tuple[str, ...], children: list[tuple[str, nn.Module]],
          stages: int, split_points: list[str]) -> list[int]:
    """Where stages start: before the named ``split_points``, else balanced; never between
    two children that share a Parameter (ParamError naming them)."""
    names = [name for name, _ in children]
    ties = _tied_spans(module, path, names)
    if split_points:
        cuts = _named_cuts(split_points, names, path, stages)
        broken = _broken_tie(ties, cuts)
        if broken:
            raise strategies.tied_error(
                "pipeline", broken, f"pipelineSplitPoints={split_points} cuts between them",
                "pipelineSplitPoints that keep them in one stage, ")
        return cuts
    balanced = _balanced_cuts([_numel(child) for _, child in children], stages,
                              {cut for first, last, _ in ties for cut in range(first + 1,
                                                                               last + 1)})
    if balanced is None:  # the ties leave too few places to cut
        raise strategies.tied_error(
            "pipeline", _broken_tie(ties, None) or [], f"no split into pipelineStages={stages} "
            "stages keeps them in one stage", "fewer pipelineStages, ")
    return balanced


def _tied_spans(module: nn.Module, path: tuple[str, ...],
                names: list[str]) -> list[tuple[int, int, list[str]]]:
    """``(first, last, names)`` for each Parameter that children ``first`` and ``last`` (by
    index in ``names``) both hold: the children from first to last must share a stage."""
    prefix = "".join(f"{name}." for name in path)
    index = {name: at for at, name in enumerate(names)}
    spans = []
    for group in strategies.shared_parameters(module):
        children = [name[len(prefix):].split(".")[0] for name in group
                    if name.startswith(prefix)]
        held = sorted({index[child] for child in children if child in index})
        if len(held) > 1:
            spans.append((held[0], held[-1], group))
    return spans


def _broken_tie(ties: list[tuple[int, int, list[str]]],
                cuts: list[int] | None) -> list[str] | None:
    """The names of the widest tie ``cuts`` breaks (None: the widest of all), else None."""
    for first, last, group in sorted(ties, key=lambda tie: tie[0] - tie[1]):
        if cuts is None or any(first < cut <= last for cut in cuts):
            return group
    return None


def _require_parameters(plan: SplitPlan, children: dict[str, nn.Module]) -> None:
    """ParamError for a stage with nothing to train (only activations): a worker that only
    passes tensors on, and an optimizer with no parameters."""
    for index, group in enumerate(plan.groups):
        if not any(p.requires_grad for name in group for p in children[name].parameters()):
            raise ParamError(f"pipelineStages={len(plan.groups)}: stage {index} would run "
                             f"only {', '.join(group)}, which hold no trainable parameters; "
                             f"use fewer stages, or pipelineSplitPoints that give every stage "
                             f"a layer with parameters.")


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _named_cuts(points: list[str], names: list[str], path: tuple[str, ...],
                stages: int) -> list[int]:
    """Indices of the children ``points`` name (with or without the path prefix)."""
    if len(points) != stages - 1:
        raise ParamError(f"pipelineSplitPoints={points} names {len(points)} children, but "
                         f"pipelineStages={stages} needs {stages - 1}: name the first child "
                         f"of each stage after the first, or leave pipelineSplitPoints empty "
                         f"to split by parameter count.")
    prefix = "".join(f"{name}." for name in path)
    cuts = []
    for point in points:
        name = point[len(prefix):] if prefix and point.startswith(prefix) else point
        if name not in names:
            raise ParamError(f"pipelineSplitPoints: {point!r} is not a child the pipeline "
                             f"splits; the children are {[prefix + n for n in names]}.")
        cuts.append(names.index(name))
    if cuts != sorted(set(cuts)) or cuts[0] == 0:
        raise ParamError(f"pipelineSplitPoints={points}: give distinct children in model "
                         f"order, none of them the first ({prefix + names[0]!r}), so that "
                         f"every stage runs at least one child.")
    return cuts


def _balanced_cuts(sizes: list[int], stages: int,
                   forbidden: set[int] | None = None) -> list[int] | None:
    """Cut points of a contiguous split of ``sizes`` into ``stages`` non-empty groups whose
    largest sum is the smallest possible, then with the fewest groups of no parameters
    (dynamic programming, O(stages x n^2)); among equal splits the later cut, so parameterless
    children (activations) stay with the layer before them. No cut before an index in
    ``forbidden``; None when no split is left."""
    forbidden = forbidden or set()
    n = len(sizes)
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    worst = (float("inf"), n)
    # best[k][j]: (largest group sum, groups without parameters) of the first j children in
    # k groups; cut[k][j]: where the last of those groups starts
    best = [[worst] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0, 0)
    for k in range(1, stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                if i in forbidden:
                    continue
                group = prefix[j] - prefix[i]
                value = (max(best[k - 1][i][0], group), best[k - 1][i][1] + (group == 0))
                if value <= best[k][j]:
                    best[k][j], cut[k][j] = value, i
    if best[stages][n][0] == float("inf"):
        return None
    cuts, j = [], n
    for k in range(stages, 1, -1):
        j = cut[k][j]
        cuts.append(j)
    return cuts[::-1]


class Wrapper(nn.Module):
    """One named child, called as it is: keeps the model's path in the parameter names."""

    def __init__(self, name: str, child: nn.Module) -> None:
        super().__init__()
        self.child_name = name
        self.add_module(name, child)

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        return self._modules[self.child_name](*args, **kwargs)  # type: ignore[misc]


class Chain(nn.Sequential):
    """Children run in order; the first takes the stage's inputs as they come (one tensor, or
    the typed inputs by keyword on the first stage)."""

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        return run_chain(list(self), args, kwargs)


def run_chain(children: list[nn.Module], args: tuple[torch.Tensor, ...],
              kwargs: dict[str, torch.Tensor]) -> torch.Tensor:
    value = children[0](*args, **kwargs)
    for child in children[1:]:
        value = child(value)
    return value


def stage_module(module: nn.Module, plan: SplitPlan, stage: int) -> nn.Module:
    """Stage ``stage`` of ``module``: its children (the same objects, not copies) in a
    :class:`Chain` keyed by their original names, nested under the model's path."""
    chosen = dict(splittable(module)[1])
    body: nn.Module = Chain(OrderedDict((name, chosen[name]) for name in plan.groups[stage]))
    for name in reversed(plan.path):
        body = Wrapper(name, body)
    return body


def check_sequential(module: nn.Module, input_dim: int,
                     fields: tuple[InputField, ...] = ()) -> None:
    """ParamError unless the model's output equals its children run in order on a random
    input (the pipeline runs exactly that)."""
    _, children = splittable(module)
    sample = _sample(input_dim, fields)
    args, kwargs = ((), sample) if isinstance(sample, dict) else ((sample,), {})
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            expected = network.forward(module, sample)
            value = run_chain([child for _, child in children], args, kwargs)
    except Exception as err:
        raise ParamError(f"{_NEEDS_SEQUENCE}{_TYPED * bool(fields)}; running them in order "
                         f"fails on input of shape ({network.describe_inputs(sample)}): "
                         f"{type(err).__name__}: {err}. Make the forward a chain of children "
                         f"(nn.Sequential), or use strategy='ddp'.") from err
    finally:
        module.train(was_training)
    if not (isinstance(expected, torch.Tensor) and isinstance(value, torch.Tensor)
            and expected.shape == value.shape
            and torch.allclose(expected, value, rtol=1e-5, atol=1e-6)):
        raise ParamError(f"{_NEEDS_SEQUENCE}; this model's output differs from running "
                         f"{', '.join(name for name, _ in children)} one after another (a "
                         f"skip connection, a reshape or a function in forward?). Make the "
                         f"forward a chain of children (nn.Sequential), or use "
                         f"strategy='ddp'.")
