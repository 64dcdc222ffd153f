"""The Keras side of KerasEstimator without Spark (:mod:`sparkdist.torchtrain.keras_net`): a
Keras loss as the built-in it follows, a Keras optimizer as torch.optim's equivalent with
Keras' settings, the config check, and the facts about Keras that docs/deep-models.md states."""

from __future__ import annotations

import json
import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import pytest  # noqa: E402
import torch  # noqa: E402

keras = pytest.importorskip("keras")

from sparkdist.exceptions import ModelLoadError, ParamError  # noqa: E402
from sparkdist.torchtrain import keras_net  # noqa: E402


@pytest.mark.parametrize(("loss", "kind"), [
    ("binary_crossentropy", ("bce", "sigmoid")),
    (keras_net.stored_loss(keras.losses.BinaryCrossentropy(from_logits=True)),
     ("bce", "logits")),
    ("sparse_categorical_crossentropy", ("cross_entropy", "softmax")),
    ("mse", ("mse", "logits")),
    (keras_net.stored_loss(keras.losses.Huber()), ("mse", "logits")),
])
def test_a_keras_loss_follows_the_built_in_of_its_labels(loss, kind):
    assert keras_net.loss_kind(loss) == kind


def test_the_per_row_loss_is_keras_own_on_the_model_output():
    loss = keras_net.KerasLoss("binary_crossentropy", "sigmoid")
    probability = torch.tensor([[0.9], [0.2], [0.6]])
    label = torch.tensor([1.0, 0.0, 0.0])
    logits = torch.log(probability) - torch.log1p(-probability)  # what KerasNetwork hands on
    expected = keras.losses.binary_crossentropy(label[:, None], probability)
    torch.testing.assert_close(loss(logits, label), expected, atol=1e-6, rtol=0)


def test_keras_optimizers_run_as_torch_equivalents_with_keras_settings():
    assert keras_net.torch_optimizer("adam") == ("adam", None, {
        "betas": (0.9, 0.999), "eps": 1e-07, "amsgrad": False})
    assert keras_net.torch_optimizer("rmsprop")[2] == {
        "alpha": 0.9, "eps": 1e-07, "momentum": 0.0, "centered": False}
    assert keras_net.torch_optimizer("adamw")[2]["weight_decay"] == 0.004
    name, rate, options = keras_net.torch_optimizer(keras_net.stored_optimizer(
        keras.optimizers.SGD(learning_rate=0.05, momentum=0.9, nesterov=True)))
    assert (name, round(rate, 6), options) == ("sgd", 0.05, {"momentum": 0.9,
                                                             "nesterov": True})
    for refused, match in (("adagrad", "torch.optim's equivalent"),
                           (keras.optimizers.Adam(clipvalue=1.0), "clipvalue"),
                           (keras.optimizers.SGD(weight_decay=0.1), "weight_decay"),
                           (keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(
                               0.1, 10, 0.9)), "schedule")):
        with pytest.raises(ParamError, match=match):
            keras_net.torch_optimizer(keras_net.stored_optimizer(refused))


def _config(layer: dict) -> dict:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    config = keras.saving.serialize_keras_object(model)
    config["config"]["layers"].append(layer)
    return config


@pytest.mark.parametrize(("layer", "named"), [
    ({"module": "builtins", "class_name": "eval", "config": {}}, "builtins.eval"),
    ({"module": "keras.utils", "class_name": "get_file", "config": {}}, "keras.utils.get_file"),
    ({"module": "keras.layers", "class_name": "Lambda", "config": {}}, "Lambda layer"),
    ({"module": "keras.layers", "class_name": "TorchModuleWrapper", "config": {}},
     "TorchModuleWrapper layer holds or loads code"),
    ({"module": "os", "class_name": "system", "registered_name": "os>system", "config": {}},
     "os.system"),
])
def test_a_config_naming_anything_but_keras_layers_is_refused(layer, named):
    with pytest.raises(ModelLoadError, match=named):
        keras_net.check_config(_config(layer), ModelLoadError, "the config")


def test_a_checked_config_builds_the_same_network_in_any_process_state():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    config = json.dumps(keras.saving.serialize_keras_object(model))
    first = keras_net.KerasNetwork(config, seed=4)
    keras.layers.Dense(5)  # names and random draws in between change nothing
    second = keras_net.KerasNetwork(config, seed=4)
    assert list(first.state_dict()) == list(second.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(),
                                                 second.state_dict().values()))


def test_keras_distribution_api_has_no_torch_implementation():
    """Why KerasEstimator wraps the model in DDP itself (docs/deep-models.md): Keras 3.15's
    distribution API is not implemented for the torch backend."""
    assert keras.__version__.startswith("3.15.")
    with pytest.raises(AttributeError):
        keras.distribution.list_devices()


_FSDP_PROBE = """
import json, os, socket
import keras, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from sparkdist.torchtrain import keras_net
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
network = keras_net.KerasNetwork(json.dumps(keras.saving.serialize_keras_object(
    keras_net.mlp(3, 1))), seed=1)
fully_shard(network, mesh=init_device_mesh("cpu", (1,)))
network(torch.randn(4, 3)).sum().backward()
print("grads:", [parameter.grad is not None for parameter in network.parameters()])
dist.destroy_process_group()
"""


def test_fsdp_would_leave_a_keras_model_untrained():
    """Why KerasEstimator refuses strategy='fsdp': fully_shard replaces the module's
    parameters with sharded ones, which Keras' variables do not use, so no gradient reaches
    them. (In a subprocess: a process group in pytest's process hangs later forks.)"""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _FSDP_PROBE], capture_output=True, text=True,
                         env={**os.environ, "KERAS_BACKEND": "torch",
                              "GLOO_SOCKET_IFNAME": "lo"}, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "grads: [False, False, False, False]" in run.stdout


def test_a_named_optimizer_takes_the_params_and_an_object_its_own_settings():
    from sparkdist.models import KerasEstimator

    assert KerasEstimator(optimizer="adamw")._optimizer()[1:3] == (1e-3, 0.004)
    assert KerasEstimator(optimizer="adamw", weightDecay=0.1,
                          learningRate=0.02)._optimizer()[1:3] == (0.02, 0.1)
    assert KerasEstimator(optimizer="adam", weightDecay=0.1)._optimizer()[2] == 0.1
    sgd = keras.optimizers.SGD(learning_rate=0.5)
    assert KerasEstimator(optimizer=sgd)._optimizer()[1:3] == (0.5, 0.0)
    with pytest.raises(ParamError, match="learningRate is set"):
        KerasEstimator(optimizer=sgd, learningRate=0.1)._optimizer()
