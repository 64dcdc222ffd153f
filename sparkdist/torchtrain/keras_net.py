"""Keras 3 models on sparkdist's torch machinery (:class:`sparkdist.models.KerasEstimator`).

With ``KERAS_BACKEND=torch`` a ``keras.Model`` is a ``torch.nn.Module`` whose variables are
torch Parameters, so the ranks train it as any network, under the same launcher, feed, DDP,
checkpoints and recovery. What this module adds:

- :class:`KerasNetwork`: the network the ranks, the driver's checks and scoring build: the
  Keras model made from its JSON config (checked by :func:`check_config`, deserialized in
  Keras' safe mode, never from code or a pickle), under a fixed seed and layer names, so that
  every process holds the same variables with the same names and initial values;
- :class:`KerasLoss`: a Keras loss (a name, or a ``keras.losses.Loss``'s config) as the
  per-row loss the training loop takes;
- :func:`torch_optimizer`: a Keras optimizer (name or config) as torch.optim's equivalent.

A model whose loss takes probabilities (``from_logits=False``, Keras' default) ends in a
sigmoid or softmax; :class:`KerasNetwork` hands the loop its logits (``log p - log(1 - p)``,
``log p``), so that validation accuracy and scoring (prediction, probability, rawPrediction)
read it as any sparkdist network, and :class:`KerasLoss` turns them back into the
probabilities Keras' loss takes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from sparkdist.exceptions import ParamError

BACKEND_VARIABLE = "KERAS_BACKEND"
#: Keras' own clipping of probabilities in its cross-entropies.
EPSILON = 1e-7
#: How Keras' losses map to the built-in loss whose labels, outputs and metrics they share.
BINARY = ("binary_crossentropy", "binary_focal_crossentropy", "BinaryCrossentropy",
          "BinaryFocalCrossentropy")
CLASSES = ("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy")
ONE_HOT = ("categorical_crossentropy", "categorical_focal_crossentropy",
           "CategoricalCrossentropy", "CategoricalFocalCrossentropy")
#: Keras optimizers and torch.optim's equivalents: the torch keyword of each Keras setting.
OPTIMIZERS: dict[str, tuple[str, dict[str, str]]] = {
    "adam": ("adam", {"beta_1": "beta1", "beta_2": "beta2", "epsilon": "eps",
                      "amsgrad": "amsgrad"}),
    "adamw": ("adamw", {"beta_1": "beta1", "beta_2": "beta2", "epsilon": "eps",
                        "amsgrad": "amsgrad", "weight_decay": "weight_decay"}),
    "sgd": ("sgd", {"momentum": "momentum", "nesterov": "nesterov"}),
    "rmsprop": ("rmsprop", {"rho": "alpha", "epsilon": "eps", "momentum": "momentum",
                            "centered": "centered"}),
}
#: Keras optimizer settings torch.optim has no equivalent of: refused unless at the default.
_UNMAPPED = {"clipnorm": None, "global_clipnorm": None, "clipvalue": None, "use_ema": False,
             "loss_scale_factor": None, "gradient_accumulation_steps": None}
#: Keras layers whose config holds code or names a file to load: never built from a config.
CODE_LAYERS = ("Lambda", "TorchModuleWrapper", "JaxLayer", "FlaxLayer", "TFSMLayer")
#: Markers in a Keras config that hold data, not a class to build.
_DATA_MARKERS = ("__keras_tensor__", "__tensor__", "__numpy__", "__bytes__")


def import_keras() -> Any:
    """``keras``, on the torch backend (set where ``KERAS_BACKEND`` is unset). ParamError where
    Keras runs, or is about to run, another backend in this process."""
    os.environ.setdefault(BACKEND_VARIABLE, "torch")
    if "keras" not in sys.modules and os.environ[BACKEND_VARIABLE] != "torch":
        raise ParamError(f"{BACKEND_VARIABLE}={os.environ[BACKEND_VARIABLE]!r}: sparkdist "
                         f"trains Keras models on the torch backend; set {BACKEND_VARIABLE}="
                         f"torch before Keras is first imported.")
    import keras

    if keras.backend.backend() != "torch":
        raise ParamError(f"Keras in this process runs the {keras.backend.backend()!r} backend "
                         f"({BACKEND_VARIABLE}); sparkdist trains Keras models on torch: set "
                         f"{BACKEND_VARIABLE}=torch before Keras is first imported (restart "
                         f"the process or notebook).")
    return keras


# ------------------------------------------------------------------ the network and its config
def check_config(config: Any, error: type[Exception], where: str) -> None:
    """Refuse (``error``, naming the class) a model config that names anything but Keras' own
    layers, initializers, regularizers, constraints and dtype policies and the classes the
    user registered (``keras.saving.register_keras_serializable``, in a module this process
    imported): a Lambda layer (Python bytecode), a function, a class of another module.
    Nothing is imported or called: a class is looked up in modules already imported."""
    keras = import_keras()
    allowed = (keras.layers.Layer, keras.initializers.Initializer,
               keras.regularizers.Regularizer, keras.constraints.Constraint, keras.DTypePolicy)
    registered = keras.saving.get_custom_objects()
    for node in _class_nodes(config):
        name, module = node["class_name"], node.get("module")
        if name in _DATA_MARKERS:
            continue
        found = registered.get(node.get("registered_name")) if node.get("registered_name") \
            in registered else _keras_attribute(module, name)
        if name in CODE_LAYERS or not (isinstance(found, type) and issubclass(found, allowed)):
            why = f" (a {name} layer holds or loads code: write a registered Layer subclass " \
                "instead)" if name in CODE_LAYERS else ""
            raise error(f"{where} names {module}.{name}, which sparkdist does not build{why}: "
                        f"it builds Keras' own layers and the classes registered with "
                        f"keras.saving.register_keras_serializable in an imported module.")


def _class_nodes(config: Any) -> Iterator[dict[str, Any]]:
    if isinstance(config, dict):
        if "class_name" in config:
            yield config
        for value in config.values():
            yield from _class_nodes(value)
    elif isinstance(config, list):
        for value in config:
            yield from _class_nodes(value)


def _keras_attribute(module: Any, name: str) -> Any:
    if not isinstance(module, str) or module.partition(".")[0] != "keras":
        return None
    return getattr(sys.modules.get(module), name, None)


@contextlib.contextmanager
def _seeded(keras: Any, seed: int) -> Iterator[None]:
    """Keras' random seed ``seed`` and layer names as in a new process (``dense``,
    ``dense_1``...), this process' random states and names restored after."""
    import random

    import numpy as np
    from keras.src.backend.common import global_state

    keys = ("object_name_uids", "global_random_seed", "global_seed_generator")
    saved = {key: global_state.get_global_attribute(key) for key in keys}
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng():
        global_state.set_global_attribute("object_name_uids", None)
        keras.utils.set_random_seed(seed)
        try:
            yield
        finally:
            for key, value in saved.items():
                global_state.set_global_attribute(key, value)
            random.setstate(python)
            np.random.set_state(numpy)


def mlp(input_dim: int, output_dim: int, hidden: tuple[int, ...] = (32,),
        activation: str | None = "sigmoid") -> Any:
    """KerasEstimator's default model: Dense layers of ``hidden`` units (ReLU), then
    ``output_dim`` units with ``activation`` (sigmoid for the default loss,
    binary_crossentropy; softmax for sparse_categorical_crossentropy; None for logits and
    regression)."""
    keras = import_keras()
    inputs = keras.Input((input_dim,))
    layer = inputs
    for units in hidden:
        layer = keras.layers.Dense(units, activation="relu")(layer)
    return keras.Model(inputs, keras.layers.Dense(output_dim, activation=activation)(layer))


def built_config(builder: Callable[..., Any], kwargs: dict[str, Any], input_dim: int,
                 seed: int, width: int, loss: str) -> str:
    """The JSON config of the model ``builder`` makes (``input_dim`` and ``output_dim``, the
    ``width`` outputs per row ``loss`` needs, filled in where it takes them and ``kwargs``
    does not give them), checked: a ``keras.Model``, not compiled, ``width`` outputs per row,
    every class buildable by :class:`KerasNetwork`. ParamError otherwise."""
    from sparkdist.torchtrain.network import build_module

    keras = import_keras()
    name = getattr(builder, "__qualname__", builder)
    try:
        with _seeded(keras, seed):
            model = build_module(builder, kwargs, input_dim, width)
    except Exception as err:
        raise ParamError(f"model={name!r} with modelKwargs={kwargs} fails: "
                         f"{type(err).__name__}: {err}") from err
    if not isinstance(model, keras.Model):
        raise ParamError(f"model={name!r} returned {type(model).__name__}, not a keras.Model; "
                         f"return the uncompiled model (KerasEstimator gives the loss and "
                         f"optimizer).")
    if model.compiled:
        raise ParamError(f"model={name!r} returned a compiled keras.Model; return it "
                         f"uncompiled: the loss and optimizer are KerasEstimator's Params.")
    config = keras.saving.serialize_keras_object(model)
    check_config(config, ParamError, f"model={name!r}'s model")
    with torch.no_grad():
        shape = tuple(model(torch.zeros(2, input_dim), training=False).shape)
    if shape not in ((2, width), (2,) * (width == 1)):
        raise ParamError(f"model={name!r}'s model outputs {shape} for 2 rows, but loss="
                         f"{loss!r} needs {width} per row: give its last layer {width} "
                         f"unit{'s' * (width > 1)}.")
    return json.dumps(config)


def registered(config: Any) -> dict[str, Any]:
    """The classes registered in this process that ``config`` names, by registered name."""
    found = import_keras().saving.get_custom_objects()
    return {node["registered_name"]: found[node["registered_name"]]
            for node in _class_nodes(config) if node.get("registered_name") in found}


def network_class(objects: dict[str, Any]) -> type[KerasNetwork]:
    """:class:`KerasNetwork`, carrying the registered classes ``objects`` (:func:`registered`)
    where the config names some: they travel with it (cloudpickled in the spec) to the ranks
    and scoring tasks, which have not imported the user's modules."""
    if not objects:
        return KerasNetwork
    return type("KerasNetwork", (KerasNetwork,), {"objects": dict(objects)})


class KerasNetwork(torch.nn.Module):
    """A ``keras.Model`` built from its JSON ``config`` (checked, safe mode) with Keras' seed
    ``seed``: the same variables, names and initial values in every process. ``outputs``:
    'sigmoid' or 'softmax' where the model outputs probabilities (forward returns their
    logits), 'logits' otherwise."""

    #: registered classes the config names, registered here first (:func:`network_class`)
    objects: dict[str, Any] = {}

    def __init__(self, config: str, seed: int, outputs: str = "logits") -> None:
        from sparkdist.exceptions import ModelLoadError

        super().__init__()
        keras = import_keras()
        keras.saving.get_custom_objects().update(self.objects)
        parsed = json.loads(config)
        check_config(parsed, ModelLoadError, "the Keras model's config")
        with _seeded(keras, seed):
            self.net = keras.saving.deserialize_keras_object(parsed, safe_mode=True)
        self.outputs = outputs

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out = self.net(features, training=self.training)
        if self.outputs == "sigmoid":
            p = out.clamp(EPSILON, 1 - EPSILON)
            return torch.log(p) - torch.log1p(-p)
        if self.outputs == "softmax":
            return torch.log(out.clamp(min=EPSILON))
        return out

    def keras_model(self) -> Any:
        return self.net


# ----------------------------------------------------------------------------------- the loss
def stored_loss(value: Any) -> str:
    """The ``loss`` Param's value: a Keras loss name as it is, a ``keras.losses.Loss`` as its
    serialized config (JSON)."""
    return _stored(value, "losses", "Loss", "loss", "a Keras loss name ('binary_crossentropy', "
                   "'sparse_categorical_crossentropy', 'mse'...) or a keras.losses.Loss")


def _stored(value: Any, module: str, base: str, param: str, fix: str) -> str:
    """A name as it is; an instance of ``keras.<module>.<base>`` as its config (JSON)."""
    if isinstance(value, str):
        return value
    found = getattr(import_keras(), module)
    if isinstance(value, getattr(found, base)):
        return json.dumps(found.serialize(value))
    raise ParamError(f"{param}={value!r}: give {fix}.")


def keras_loss(stored: str) -> Any:
    """The Keras loss object ``stored`` (:func:`stored_loss`) names; ParamError for a name Keras
    does not know or a config naming anything but Keras' own losses and registered ones."""
    keras = import_keras()
    from keras.src.losses.losses import LossFunctionWrapper

    try:
        if stored.startswith("{"):
            config = json.loads(stored)
            _check_loss_config(keras, config)
            return keras.losses.deserialize(config)
        found = keras.losses.get(stored)
    except (ValueError, TypeError) as err:
        raise ParamError(f"loss={stored!r} is not a Keras loss ({err}); give one of Keras' "
                         f"loss names ('binary_crossentropy', 'sparse_categorical_"
                         f"crossentropy', 'mse', 'huber'...) or a keras.losses.Loss.") from err
    return found if isinstance(found, keras.losses.Loss) else LossFunctionWrapper(found)


def _check_loss_config(keras: Any, config: Any) -> None:
    registered = keras.saving.get_custom_objects()
    for node in _class_nodes(config):
        found = registered.get(node.get("registered_name")) or _keras_attribute(
            node.get("module"), node["class_name"])
        if not (isinstance(found, type) and issubclass(found, keras.losses.Loss)):
            raise ParamError(f"loss names {node.get('module')}.{node['class_name']}, not a "
                             f"Keras loss or a registered keras.losses.Loss subclass.")


def loss_kind(stored: str) -> tuple[str, str]:
    """(the built-in loss a Keras loss shares labels, outputs and metrics with: 'bce',
    'cross_entropy' or 'mse'; what the model outputs: 'sigmoid', 'softmax' or 'logits')."""
    loss = keras_loss(stored)
    config = loss.get_config()
    name = type(loss).__name__ if type(loss).__name__ != "LossFunctionWrapper" else stored
    fn = getattr(loss, "fn", None)
    names = {name, getattr(fn, "__name__", "")}
    if names & set(ONE_HOT):
        raise ParamError(f"loss={stored!r} takes one-hot labels; sparkdist's labels are class "
                         f"indices: use 'sparse_categorical_crossentropy'.")
    logits = bool(config.get("from_logits", False))
    if names & set(BINARY):
        return "bce", "logits" if logits else "sigmoid"
    if names & set(CLASSES):
        return "cross_entropy", "logits" if logits else "softmax"
    return "mse", "logits"


class KerasLoss:
    """The per-row loss of a Keras loss (``stored``: :func:`stored_loss`) on the logits
    :class:`KerasNetwork` returns (``outputs``: what the Keras model outputs)."""

    def __init__(self, stored: str, outputs: str) -> None:
        self.stored, self.outputs = stored, outputs
        self._loss: Any = None

    def __call__(self, output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        if self._loss is None:
            self._loss = keras_loss(self.stored)
        if self.outputs == "sigmoid":
            output = torch.sigmoid(output)
        elif self.outputs == "softmax":
            output = torch.softmax(output, -1)
        return self._loss.call(label, output)

    def __getstate__(self) -> dict[str, Any]:
        return {"stored": self.stored, "outputs": self.outputs, "_loss": None}


# ------------------------------------------------------------------------------ the optimizer
def stored_optimizer(value: Any) -> str:
    """The ``optimizer`` Param's value: a name as it is, a Keras optimizer as its config."""
    return _stored(value, "optimizers", "Optimizer", "optimizer",
                   f"one of {sorted(OPTIMIZERS)} or a Keras optimizer of those classes")


def torch_optimizer(stored: str) -> tuple[str, float | None, dict[str, Any]]:
    """(torch.optim's name, the learning rate a Keras optimizer object sets or None for a
    name, the other settings as torch keywords, Keras' defaults included) for the
    ``optimizer`` Param's value."""
    keras = import_keras()
    saved = json.loads(stored) if stored.startswith("{") else None
    name = str(saved.get("class_name", "")).lower() if saved else stored.lower()
    if name not in OPTIMIZERS or (saved and str(saved.get("module")).partition(".")[0] != "keras"):
        raise ParamError(f"optimizer={stored!r}: KerasEstimator trains with {sorted(OPTIMIZERS)}"
                         f" (Keras names or optimizers of those classes), each run as "
                         f"torch.optim's equivalent.")
    config = saved["config"] if saved else keras.optimizers.get(name).get_config()
    torch_name, keywords = OPTIMIZERS[name]
    unmapped = {**_UNMAPPED, **({} if "weight_decay" in keywords else {"weight_decay": None})}
    odd = sorted(key for key, default in unmapped.items() if config.get(key, default) != default)
    if odd or isinstance(config.get("learning_rate"), dict):
        raise ParamError(f"optimizer={stored!r} sets {odd or ['a learning rate schedule']}, "
                         f"which KerasEstimator does not carry over to torch.optim; remove "
                         f"{'them' if len(odd) > 1 else 'it'}.")
    options = {torch_kw: config[keras_kw] for keras_kw, torch_kw in keywords.items()
               if config.get(keras_kw) is not None}
    if "beta1" in options:
        options["betas"] = (options.pop("beta1"), options.pop("beta2"))
    return torch_name, float(config["learning_rate"]) if saved else None, options
