"""Keras 3 models on Spark: :class:`KerasEstimator` trains an uncompiled ``keras.Model`` on the
torch backend in TorchEstimator's barrier stage, feed, DDP, checkpoints and recovery;
:class:`KerasModel` scores as TorchModel does and saves the model as its JSON config plus its
weights. How a Keras model runs there: :mod:`sparkdist.torchtrain.keras_net`."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pyspark.ml.param import Param, Params

from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.models._accessors_keras import (
    _KerasEstimatorAccessors,
    _KerasEstimatorInit,
    _KerasModelAccessors,
)
from sparkdist.models.torch import TorchEstimator, TorchModel
from sparkdist.torchtrain import keras_net, network
from sparkdist.torchtrain.spec import DataRules, InputField, ModelSpec, TrainSpec

#: TorchEstimator Params a Keras fit refuses away from their defaults, and why.
_UNSUPPORTED = {
    "strategy": ("ddp", "Keras variables hold their own torch tensors, which fsdp, pipeline "
                        "and tensor replace; train with strategy='ddp'"),
    "backend": ("torch", "KerasEstimator trains with torch.distributed (backend='torch')"),
    "adapter": ("none", "adapters are for TorchEstimator's networks"),
    "freeze": ([], "freeze the layers in the builder instead (layer.trainable = False)"),
    "initialWeights": ("", "load weights in the builder instead (model.load_weights)"),
    "inputCols": ({}, "a Keras model takes one features column (featuresCol or featureCols)"),
    "labelCols": ([], "give one label column (labelCol)"),
}


class _KerasParams(Params):
    """model, loss and optimizer as Keras takes them (in place of TorchEstimator's)."""

    model: Param[str] = Param(
        Params._dummy(), "model",
        "a function or class that builds an uncompiled keras.Model from modelKwargs (and "
        "input_dim, the features per row, and output_dim, the outputs the loss needs, where it "
        "takes them), or its qualified name in a module this process has imported (default: "
        "sparkdist's MLP, sparkdist.torchtrain.keras_net.mlp)", typeConverter=network.to_name)
    loss: Param[str] = Param(
        Params._dummy(), "loss",
        "a Keras loss: a name ('binary_crossentropy', 'sparse_categorical_crossentropy', "
        "'mse', 'huber'...) or a keras.losses.Loss (stored as its config)",
        typeConverter=keras_net.stored_loss)
    optimizer: Param[str] = Param(
        Params._dummy(), "optimizer",
        f"a Keras optimizer: {sorted(keras_net.OPTIMIZERS)} or an optimizer of those classes "
        "(stored as its config; it carries its own learning rate and weight decay, so "
        "learningRate and weightDecay are then refused), run as torch.optim's equivalent with "
        "Keras' settings", typeConverter=keras_net.stored_optimizer)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(model="sparkdist.torchtrain.keras_net.mlp",
                         loss="binary_crossentropy", optimizer="adam")

    def _loss_kind(self) -> str:
        return keras_net.loss_kind(self.getOrDefault("loss"))[0]


class KerasEstimator(_KerasEstimatorInit, _KerasParams, TorchEstimator,
                     _KerasEstimatorAccessors):
    """Train a Keras 3 model data-parallel on ``numWorkers`` Spark tasks, on the torch backend.

    ``model`` builds the uncompiled ``keras.Model``; ``loss`` and ``optimizer`` are Keras'
    (names or objects); everything else is TorchEstimator's: batchSize per worker, epochs,
    validation, early stopping, checkpoints, resume and retries. Each rank builds the model
    from its JSON config with Keras' seed ``seed``; a fit is DDP over the model's trainable
    weights, and its non-trainable state (BatchNorm's moving statistics) travels in
    checkpoints and the fitted model.

    Examples
    --------
    >>> est = KerasEstimator(labelCol="cancelled_within_week", loss="binary_crossentropy",
    ...                      modelKwargs={"hidden": [16]}, epochs=1, numWorkers=1)
    >>> model = est.fit(assembled_train)  # sparkdist's Keras MLP: any builder will do
    >>> model.transform(assembled_test).columns[-3:]
    ['prediction', 'rawPrediction', 'probability']
    >>> type(model.keras_model()).__name__
    'Functional'
    """

    _generated_init = True

    def _spec_parts(self) -> dict[str, Any]:
        for name, (default, fix) in _UNSUPPORTED.items():
            if self.getOrDefault(name) != default:
                raise ParamError(f"KerasEstimator: {name}={self.getOrDefault(name)!r} is not "
                                 f"supported; {fix}.")
        return super()._spec_parts()

    def _resolve_network(self) -> type:
        network.resolve_builder(self.getOrDefault("model"))
        self._loss_kind()
        return keras_net.KerasNetwork

    def _optimizer(self) -> tuple[str, float, float, tuple[tuple[str, Any], ...]]:
        """A name: learningRate and weightDecay apply (Keras' AdamW decay where weightDecay
        is unset). An optimizer object: its own settings, so setting either is refused."""
        name, rate, options = keras_net.torch_optimizer(self.getOrDefault("optimizer"))
        keras_decay = options.pop("weight_decay", None)
        if rate is None:
            decay = self.getOrDefault("weightDecay") if self.isSet("weightDecay") \
                or keras_decay is None else keras_decay
            return name, self.getOrDefault("learningRate"), decay, tuple(sorted(options.items()))
        for param in ("learningRate", "weightDecay"):
            if self.isSet(param):
                raise ParamError(f"{param} is set and optimizer is a Keras optimizer, which "
                                 f"carries its own; set it on the optimizer.")
        return name, rate, keras_decay or 0.0, tuple(sorted(options.items()))

    def _data_rules(self, source: list[str]) -> DataRules:
        return dataclasses.replace(super()._data_rules(source), loss=self._loss_kind())

    def _model_spec(self, input_dim: int, num_classes: int,
                    inputs: tuple[InputField, ...] = (), label_width: int = 0,
                    label_names: tuple[str, ...] = ()) -> ModelSpec:
        loss = self.getOrDefault("loss")
        kind, outputs = keras_net.loss_kind(loss)
        width = label_width or network.output_width(kind, num_classes)
        seed = self.getOrDefault("seed") % 2**31
        config = keras_net.built_config(network.resolve_builder(self.getOrDefault("model")),
                                        dict(self.getOrDefault("modelKwargs") or {}),
                                        input_dim, seed, width, loss)
        return ModelSpec(module=keras_net.network_class(keras_net.registered(
                             json.loads(config))),
                         module_name=network.qualified_name(keras_net.KerasNetwork),
                         module_kwargs={"config": config, "seed": seed, "outputs": outputs},
                         loss=kind, loss_fn=keras_net.KerasLoss(loss, outputs),
                         input_dim=input_dim, output_dim=width, num_classes=num_classes,
                         inputs=inputs, label_width=label_width, label_names=label_names)

    def _fitted_model(self, state: dict[str, Any], info: dict[str, Any],
                      spec: TrainSpec) -> TorchModel:
        keras = {**spec.model.module_kwargs, "kind": spec.model.loss}
        return KerasModel._fitted(state, {**info, "keras": keras})


class KerasModel(_KerasParams, TorchModel, _KerasModelAccessors):
    """A trained Keras model; ``transform`` scores as TorchModel's (prediction, and for
    classification probability and rawPrediction: the logits, computed from the model's
    probabilities where it outputs them). ``keras_model()`` is the trained ``keras.Model``.
    Saved as its JSON config (only Keras' own and registered classes load) plus weights."""

    _loads_model_param = False  # but from the saved config

    def __init__(self) -> None:  # (where sparkdist checks the keywords, as TorchModel's)
        super().__init__()

    def _loss_kind(self) -> str:
        return str(self._info["keras"]["kind"])

    def _network_parts(self) -> tuple[Any, dict[str, Any]]:
        saved = self._info["keras"]
        objects = keras_net.registered(json.loads(saved["config"]))
        return keras_net.network_class(objects), {key: saved[key] for key in
                                                  ("config", "seed", "outputs")}

    def keras_model(self) -> Any:
        """The trained ``keras.Model`` (as the builder made it: probabilities where its loss
        takes them)."""
        return self._trained().eval().keras_model()

    @classmethod
    def _from_state(cls, state: dict[str, Any], path: str) -> TorchModel:
        saved: Any = state.get("keras")
        try:
            config = json.loads(saved["config"])
            checked = (saved["kind"] in network.LOSSES and isinstance(saved["seed"], int)
                       and saved["outputs"] in ("logits", "sigmoid", "softmax"))
        except (TypeError, KeyError, ValueError) as err:
            raise ModelLoadError(f"'{path}': its Keras model record was edited ({err!r}); "
                                 f"save the model again.") from err
        if not checked:
            raise ModelLoadError(f"'{path}': its Keras model record was edited; save the "
                                 f"model again.")
        keras_net.check_config(config, ModelLoadError, f"'{path}'")
        return super()._from_state(state, path)
