"""strategy='tensor' in local[2] (2 barrier ranks, gloo): the paired Linear layers split over
the ranks with DTensor learn what ddp learns, with the same loss curve, for about half of
ddp's per-rank parameter, gradient and optimizer bytes; a SIGKILLed rank resumes to the
uninterrupted weights (dropout included) from its sharded checkpoint; a 2-worker checkpoint
loads into 1 worker; the fitted TorchModel saves, loads and scores as any; bad configurations
fail before launch."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from pyspark import cloudpickle
from torch import nn

from sparkdist.exceptions import ParamError
from sparkdist.failpoints import arm
from sparkdist.models import TorchEstimator, TorchModel
from tests.torchfits import accuracy, same_weights, train_spec, train_stage

# Classes defined here travel to the executors by value (the test module is not importable
# there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SETTINGS = {"progress": False, "batchSize": 64, "learningRate": 0.01, "numWorkers": 2,
            "seed": 7, "rendezvousTimeoutSeconds": 60}
#: Widths 256 and 128 split over 2 ranks; the output layer (128 -> 1) stays whole.
WIDE = {"hidden": [256, 128]}
DROPOUT = {"hidden": [32, 16], "dropout": 0.1}


@pytest.fixture(scope="module")
def data(nonlinear):
    return nonlinear


@pytest.fixture(scope="module")
def ddp_model(data):
    return TorchEstimator(epochs=4, validationFraction=0.2, modelKwargs=WIDE,
                          **SETTINGS).fit(data[0])


@pytest.fixture(scope="module")
def tensor_model(data):
    return TorchEstimator(epochs=4, validationFraction=0.2, modelKwargs=WIDE, strategy="tensor",
                          **SETTINGS).fit(data[0])


@pytest.fixture(scope="module")
def dropout_model(data, tmp_path_factory):
    """3 uninterrupted epochs with dropout, checkpointed: what a resumed fit must end with."""
    directory = str(tmp_path_factory.mktemp("tensor"))
    return TorchEstimator(epochs=3, strategy="tensor", modelKwargs=DROPOUT,
                          checkpointDir=directory, checkpointEverySteps=10,
                          **SETTINGS).fit(data[0])




@pytest.mark.slow
def test_tensor_follows_ddps_loss_curve_and_reaches_itsaccuracy(ddp_model, tensor_model,
                                                                 data):
    """Same seed, same global batches: every rank computes the whole batch's mean loss on
    its slices of the layers, so each step's gradient is ddp's averaged one, summed in
    another order. The curves agree to float tolerance while those differences are tiny;
    Adam then amplifies them (a near-zero gradient still moves its weight by about the
    learning rate), so later epochs are compared by the accuracy reached."""
    summary = tensor_model.trainingSummary
    assert (summary["strategy"], summary["world_size"]) == ("tensor", 2)
    ddp, tensor = ddp_model.history, tensor_model.history
    for name in ("loss", "val_loss"):
        assert tensor[0][name] == pytest.approx(ddp[0][name], rel=1e-5)
        assert tensor[1][name] == pytest.approx(ddp[1][name], rel=1e-4)
    assert tensor[-1]["loss"] < 0.7 * tensor[0]["loss"]
    ddp_accuracy, tensor_accuracy = accuracy(ddp_model, data[1]), accuracy(tensor_model,
                                                                             data[1])
    assert ddp_accuracy > 0.85 and tensor_accuracy >= ddp_accuracy - 0.01


@pytest.mark.slow
def test_each_rank_holds_about_half_of_ddps_state_bytes(ddp_model, tensor_model):
    """Parameters, gradients and Adam's two moments of the split layers are halved; the
    output layer and the row-split layer's bias stay whole on both ranks."""
    ddp = [rank["state_mb"] for rank in ddp_model.trainingSummary["ranks"]]
    tensor = [rank["state_mb"] for rank in tensor_model.trainingSummary["ranks"]]
    assert ddp[0] == ddp[1] and tensor[0] == tensor[1]
    assert 0.45 <= tensor[0] / ddp[0] <= 0.55


@pytest.mark.slow
def test_a_rank_killed_mid_fit_resumes_to_thesame_weights(data, dropout_model, tmp_path):
    """checkpointEverySteps=10 (32 steps an epoch): a SIGKILL at step 13 of epoch 3 resumes
    after its step 10 from the ranks' shards, and the dropout masks (rank 0's seed
    for the whole activations, each rank's own inside a split pair) are drawn again alike."""
    estimator = arm(TorchEstimator(epochs=3, strategy="tensor", modelKwargs=DROPOUT,
                                   checkpointDir=str(tmp_path / "ckpt"), checkpointEverySteps=10,
                                   **SETTINGS), str(tmp_path), rank=1, epoch=3, step=13,
                    action="kill")
    model = estimator.fit(data[0])
    summary = model.trainingSummary
    assert (tmp_path / "fired-1.pid").exists()
    assert (summary["resumed_from_epoch"], summary["resumed_from_step"]) == (2, 10)
    assert [epoch["loss"] for epoch in model.history] == pytest.approx(
        [epoch["loss"] for epoch in dropout_model.history], rel=1e-6)
    assert same_weights(model, dropout_model)
    assert dropout_model.history[-1]["loss"] < 0.8 * dropout_model.history[0]["loss"]
    run = tmp_path / "ckpt" / summary["run_id"]
    shards = [run / name for name in os.listdir(run) if name.startswith("shards-")]
    assert shards and all(  # every rank wrote its own file in each
        len([name for name in os.listdir(where) if name.endswith(".distcp")]) == 2
        for where in shards)


@pytest.mark.slow
def test_a_checkpoint_of_two_workers_loads_into_one(data, tmp_path):
    """The ranks' resume path alone with numWorkers changed (the stage launched directly;
    the estimator's resume='required' path is in test_strategy_fsdp.py): the one rank takes
    the whole of every tensor the two ranks had split."""
    two = TorchEstimator(epochs=2, strategy="tensor", modelKwargs=WIDE,
                         checkpointDir=str(tmp_path), runId="r", **SETTINGS).fit(data[0])
    one = TorchEstimator(epochs=2, strategy="tensor", modelKwargs=WIDE,
                         **{**SETTINGS, "numWorkers": 1, "batchSize": 128})
    state, header = train_stage(one, data[0], str(tmp_path / "r"))
    assert header["world_size"] == 1 and header["resumed_from_epoch"] == 2
    assert header["history"] == two.history
    reference = two.module().state_dict()
    assert all(torch.equal(state[name], reference[name]) for name in reference)
    # and it trains on from there (Adam's moments re-split too): a third epoch on one worker
    state, header = train_stage(one, data[0], str(tmp_path / "r"), epochs=3)
    assert [epoch["epoch"] for epoch in header["history"]] == [1, 2, 3]
    assert header["history"][2]["loss"] < header["history"][1]["loss"]


@pytest.mark.slow
def test_the_fitted_model_saves_loads_and_scores(tensor_model, data, tmp_path):
    """TorchModel holds the whole state dict, gathered from the ranks' slices."""
    weights = tensor_model.module().state_dict()
    assert {name: tuple(value.shape) for name, value in weights.items()} == {
        "layers.0.weight": (256, 8), "layers.0.bias": (256,), "layers.2.weight": (128, 256),
        "layers.2.bias": (128,), "layers.4.weight": (1, 128), "layers.4.bias": (1,)}
    tensor_model.save(str(tmp_path / "model"))
    loaded = TorchModel.load(str(tmp_path / "model"))
    assert same_weights(loaded, tensor_model)
    before = tensor_model.transform(data[1]).select("probability").collect()
    after = loaded.transform(data[1]).select("probability").collect()
    assert before == after


@pytest.mark.slow
def test_an_empty_partition_trains_and_validates_without_hanging(data):
    """One rank's feed and validation rows are all empty: it still joins every step's
    all-gathers with zero rows, and computes the global batch like its peer."""
    from pyspark.sql import functions as F

    skewed = data[0].repartition(2, F.lit(0))  # every row hashes to the same partition
    assert sorted(skewed.rdd.glom().map(len).collect()) == [0, 4000]
    model = TorchEstimator(epochs=4, strategy="tensor", validationFraction=0.2,
                           modelKwargs={"hidden": [32, 16]}, timeoutSeconds=300,
                           **SETTINGS).fit(skewed)
    history = model.history
    assert history[-1]["loss"] < history[0]["loss"] and history[-1]["val_accuracy"] > 0.8
    assert accuracy(model, data[1]) > 0.8


class NoLinear(nn.Module):
    """A network without Linear layers: nothing for tensor parallelism to split."""

    def __init__(self, input_dim: int, output_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(input_dim, output_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


class NormedMLP(nn.Module):
    """LayerNorm between the two Linear layers of a pair needs the whole hidden vector."""

    def __init__(self, input_dim: int, output_dim: int) -> None:
        super().__init__()
        self.up, self.norm, self.down = (nn.Linear(input_dim, 16), nn.LayerNorm(16),
                                         nn.Linear(16, output_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.norm(self.up(x)))


def test_bad_tensor_configurations_fail_before_launch(data):
    with pytest.raises(ParamError, match="strategy='tensor' splits nn.Linear.*calls none"):
        TorchEstimator(strategy="tensor", model=NoLinear, **SETTINGS).fit(data[0])
    with pytest.raises(ParamError, match=r"33 output features of Linear 'layers.0'.*"
                                         r"numWorkers=2 ranks, which does not divide"):
        TorchEstimator(strategy="tensor", modelKwargs={"hidden": [33, 16]},
                       **SETTINGS).fit(data[0])
    with pytest.raises(ParamError, match=r"'norm' \(LayerNorm\) runs between them"):
        TorchEstimator(strategy="tensor", model=NormedMLP, **SETTINGS).fit(data[0])


def test_the_plan_pairs_linear_layers_in_call_order_and_refuses_horovod():
    """The driver's preflight (the estimator's checks refuse backend='horovod' earlier
    where Horovod is not installed)."""
    from sparkdist.torchtrain.nets import MLP
    from sparkdist.torchtrain.strategies import check_compatible, tensor

    net = MLP(input_dim=4, output_dim=3, hidden=[8, 6, 4], dropout=0.1)
    plan = tensor.plan_of(net, 4, 2)
    assert plan.pairs == [("layers.0", "layers.3"), ("layers.6", "layers.9")]
    assert plan.whole == []
    odd = tensor.plan_of(MLP(input_dim=4, output_dim=1, hidden=[8, 6]), 4, 2)
    assert (odd.pairs, odd.whole) == ([("layers.0", "layers.2")], ["layers.4"])
    with pytest.raises(ParamError, match="numWorkers=4 ranks.*set numWorkers to a divisor"):
        tensor.plan_of(MLP(input_dim=4, output_dim=1, hidden=[6, 6]), 4, 4)
    # an elastic restart may use the worker counts that divide the split widths (12 here)
    usable = tensor.usable(train_spec("tensor", input_dim=4))  # hidden [12, 6]
    assert [world for world in range(1, 13) if usable(world)] == [1, 2, 3, 4, 6, 12]
    spec = train_spec("tensor", backend="horovod", input_dim=4, num_workers=2)
    with pytest.raises(ParamError, match="backend='horovod'.*set backend='torch'"):
        check_compatible(spec)
