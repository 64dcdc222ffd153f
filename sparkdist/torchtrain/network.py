"""The network, its loss and its optimizer, shared by the driver and the ranks.

The ``model`` and ``loss`` Params hold names; the driver resolves them here and ships the
resolved objects to the executors (by reference when importable, else by value through
cloudpickle), so executors never resolve a name. The ranks build the network
(:func:`build_module`), sum its loss (:func:`loss_sum`) and make its optimizer
(:func:`make_optimizer`) from the typed spec (:mod:`sparkdist.torchtrain.spec`).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparkdist.exceptions import ParamError

if TYPE_CHECKING:
    import torch

    from sparkdist.torchtrain.inputs import Target
    from sparkdist.torchtrain.spec import InputField


LOSSES = {"bce": "classification", "cross_entropy": "classification", "mse": "regression"}
OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "rmsprop": "RMSprop",
              "adagrad": "Adagrad"}


#: This package's name in models saved before it was renamed (``sparkdist.train.nets.MLP``).
_OLD_PACKAGE = "sparkdist.train."

#: Classes and functions given as objects in this process, by the name their Param holds.
_REGISTRY: dict[str, Any] = {}


def qualified_name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def to_name(value: Any) -> str:
    """The typeConverter of the ``model`` and ``loss`` Params: a name stays as it is; a class
    or function given in code is recorded under its qualified name, so that this process
    resolves the name to that object wherever it was defined (``__main__``, a notebook, a
    test module). A later object under the same name replaces the earlier, as in Python."""
    if isinstance(value, str):
        return value
    if inspect.isclass(value) or inspect.isroutine(value):
        name = qualified_name(value)
        _REGISTRY[name] = value
        return name
    raise TypeError(f"expected a class, a function or its qualified name, got {value!r}")


def resolve_model(name: str) -> type[torch.nn.Module]:
    """The ``nn.Module`` subclass ``model`` names; ParamError for anything else, before
    anything is called."""
    import torch

    found = _lookup(name, "model")
    if not (inspect.isclass(found) and issubclass(found, torch.nn.Module)):
        raise ParamError(f"model={name!r} is {found!r}, not an nn.Module subclass; give "
                         f"the network class or its qualified name.")
    return found


def resolve_builder(name: str) -> Any:
    """The function or class ``model`` names (a Keras model builder); ParamError for anything
    else, before anything is called."""
    found = _lookup(name, "model")
    if not callable(found):
        raise ParamError(f"model={name!r} is {found!r}, not a function or class; give the "
                         f"builder or its qualified name.")
    return found


def resolve_loss(name: str) -> Any:
    """What the training loop calls for ``loss``: a built-in name stays a name; otherwise an
    instance of the ``nn.Module`` subclass it names (made without arguments), or a function
    given as an object in this process. Anything else (a function named only in a file,
    ``os.system``) is refused by construction, not by a denylist."""
    import torch

    if name in LOSSES:
        return name
    found = _lookup(name, "loss")
    if inspect.isclass(found) and issubclass(found, torch.nn.Module):
        return found()
    if _REGISTRY.get(name) is found and callable(found):
        return found
    raise ParamError(f"loss={name!r} is {found!r}: use one of {sorted(LOSSES)}, an nn.Module "
                     f"loss class, or pass a function (output, label) -> per-row losses "
                     f"itself (loss=my_loss), not its name.")


def _lookup(name: str, param: str) -> Any:
    """Registry first; else an attribute of a module already imported in this process (or of
    sparkdist itself). A module named only in a Param is never imported: importing runs its
    top-level code, and Param values come from saved files too."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name.startswith(_OLD_PACKAGE):  # saved before the package was renamed
        name = "sparkdist.torchtrain." + name[len(_OLD_PACKAGE):]
    module_name, _, attribute = name.rpartition(".")
    own = module_name == "sparkdist" or module_name.startswith("sparkdist.")
    try:
        if module_name not in sys.modules and not own:
            raise ImportError(f"module {module_name!r} is not imported in this process, and "
                              "sparkdist imports no module a Param names")
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as err:
        if module_name == "__main__":
            raise ParamError(f"{param}={name!r} was defined in a notebook or script "
                             f"(__main__) that this process does not define it in; run that "
                             f"definition first, or move it into a module and import it before "
                             f"the fit or load.") from err
        raise ParamError(f"{param}={name!r} cannot be imported ({err}); pass the class "
                         f"itself, or import its module (import {module_name or name}) "
                         f"before the fit or load.") from err


def build_module(module_class: Callable[..., Any], kwargs: dict[str, Any], input_dim: int,
                 output_dim: int) -> Any:
    """Call a class from :func:`resolve_model` (or a builder from :func:`resolve_builder`);
    ``input_dim``/``output_dim`` are filled in from the data when it takes them and ``kwargs``
    leaves them out."""
    accepted = inspect.signature(module_class).parameters
    filled = {name: value for name, value in (("input_dim", input_dim),
                                              ("output_dim", output_dim))
              if name in accepted and name not in kwargs}
    return module_class(**filled, **kwargs)


def load_weights(module: Any, state: dict[str, Any]) -> None:
    """``state`` into ``module``, strictly. Tables the network builds on the meta device
    (``strategy="ps"``) take the state's tensors themselves: a meta tensor has no memory to
    copy into."""
    meta = any(parameter.is_meta for parameter in module.parameters())
    module.load_state_dict(state, assign=meta)


def forward(model: Any, inputs: Any) -> Any:
    """The network's outputs for a batch: one features tensor, or typed inputs by keyword
    (``inputCols``)."""
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def dummy_inputs(input_dim: int, fields: tuple[InputField, ...], rows: int = 2) -> Any:
    """Zeros in the form a step hands the network: ``[rows, input_dim]`` features, or each
    typed input (a sequence one token long, its mask True)."""
    import torch

    if not fields:
        return torch.zeros(rows, input_dim)
    found: dict[str, Any] = {}
    for field in fields:
        shape = (rows, 1) if field.sequence else (rows, *field.shape)
        found[field.arg] = torch.zeros(shape, dtype=torch.int64 if field.dtype == "int64"
                                       else torch.float32)
        if field.mask:
            found[f"{field.arg}_mask"] = torch.ones(rows, 1, dtype=torch.bool)
    return found


def describe_inputs(inputs: Any) -> str:
    """The shapes of a batch of inputs, for messages."""
    if isinstance(inputs, dict):
        return ", ".join(f"{name}: {tuple(value.shape)}" for name, value in inputs.items())
    return f"{tuple(inputs.shape)}"


def rows_of(inputs: Any) -> int:
    """The rows in a batch of inputs (a tensor, or tensors by name)."""
    return len(next(iter(inputs.values())) if isinstance(inputs, dict) else inputs)


def output_width(loss: str, num_classes: int) -> int:
    """Outputs per row the network must produce for ``loss``."""
    return num_classes if loss == "cross_entropy" else 1


def task_of_loss(loss: str) -> str:
    return LOSSES.get(loss, "regression")


def row_losses(loss: Any, output: torch.Tensor, label: torch.Tensor,
               label_names: tuple[str, ...] = ()) -> torch.Tensor:
    """The loss of each row of a batch, ``[rows]``; ``loss`` is what :func:`resolve_loss`
    returned. An array label (``[rows, k]``) gives each row the mean of its k losses;
    ``labelCols`` (``label_names``) hand a function the labels by column name."""
    import torch.nn.functional as F

    if label_names:
        return loss(output, dict(zip(label_names, label.unbind(1))))
    if loss == "cross_entropy":
        return F.cross_entropy(output, label.long(), reduction="none")
    if loss not in ("bce", "mse"):
        return loss(output, label)  # a callable giving per-row losses
    flat = output.reshape(label.shape)
    each = F.binary_cross_entropy_with_logits if loss == "bce" else F.mse_loss
    losses = each(flat, label, reduction="none")
    return losses.mean(1) if losses.dim() > 1 else losses


def loss_sum(loss: Any, output: torch.Tensor, target: Target,
             label_names: tuple[str, ...] = ()) -> torch.Tensor:
    """The summed (weighted) loss over the rows of a batch: the loop does the averaging."""
    losses = row_losses(loss, output, target.label, label_names)
    return losses.sum() if target.weight is None else (losses * target.weight).sum()


def correct_count(loss: str, output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Rows predicted right (an array label: the mean share of its values predicted
    right)."""
    if loss == "cross_entropy":
        return (output.argmax(dim=1) == label.long()).sum()
    right = ((output.reshape(label.shape) > 0).float() == label).double()
    return right.mean(1).sum() if right.dim() > 1 else right.sum()


def make_optimizer(name: str, parameters: Any, learning_rate: float, weight_decay: float,
                   options: tuple[tuple[str, Any], ...] = ()) -> Any:
    import torch

    return getattr(torch.optim, OPTIMIZERS[name])(parameters, lr=learning_rate,
                                                  weight_decay=weight_decay, **dict(options))
