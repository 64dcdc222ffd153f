"""strategy='fsdp' in local[2] (2 barrier ranks, gloo): it learns what ddp learns, with the
same loss curve; a SIGKILLed rank resumes from the sharded checkpoint to the uninterrupted
weights; a 2-worker sharded checkpoint loads into 1 worker; the fitted TorchModel saves, loads
and scores as any; bad configurations fail before launch."""

from __future__ import annotations

import os

import pytest
import torch

from sparkdist.exceptions import ParamError
from sparkdist.failpoints import arm
from sparkdist.models import TorchEstimator, TorchModel
from tests.torchfits import accuracy, same_weights, train_spec, train_stage

SETTINGS = {"progress": False, "batchSize": 100, "learningRate": 0.01, "numWorkers": 2,
            "modelKwargs": {"hidden": [32, 16], "dropout": 0.1}, "seed": 7,
            "rendezvousTimeoutSeconds": 60, "validationFraction": 0.1}


@pytest.fixture(scope="module")
def data(nonlinear):
    return nonlinear


@pytest.fixture(scope="module")
def ddp_model(data):
    return TorchEstimator(epochs=4, **SETTINGS).fit(data[0])


@pytest.fixture(scope="module")
def fsdp_model(data, tmp_path_factory):
    """4 uninterrupted fsdp epochs, checkpointed: the weights a resumed fit must end with."""
    directory = str(tmp_path_factory.mktemp("fsdp"))
    return TorchEstimator(epochs=4, strategy="fsdp", checkpointDir=directory,
                          checkpointEverySteps=10, **SETTINGS).fit(data[0])




@pytest.mark.slow
def test_fsdp_follows_ddps_loss_curve_and_reaches_itsaccuracy(ddp_model, fsdp_model, data):
    """Same seed: FSDP2 averages the reduce-scattered gradients over the ranks as DDP's
    all-reduce does, so the per-epoch losses agree to float tolerance."""
    assert fsdp_model.trainingSummary["world_size"] == 2
    ddp_losses = [epoch["loss"] for epoch in ddp_model.history]
    fsdp_losses = [epoch["loss"] for epoch in fsdp_model.history]
    assert len(fsdp_losses) == 4 and fsdp_losses[-1] < 0.7 * fsdp_losses[0]
    assert fsdp_losses == pytest.approx(ddp_losses, rel=1e-5)
    # validation runs the sharded forward on every rank; the best epoch's weights are kept
    assert [epoch["val_loss"] for epoch in fsdp_model.history] == pytest.approx(
        [epoch["val_loss"] for epoch in ddp_model.history], rel=1e-5)
    assert fsdp_model.trainingSummary["best_epoch"] == ddp_model.trainingSummary["best_epoch"]
    ddp_accuracy, fsdp_accuracy = accuracy(ddp_model, data[1]), accuracy(fsdp_model, data[1])
    assert ddp_accuracy > 0.8 and fsdp_accuracy >= ddp_accuracy - 0.01


@pytest.mark.slow
def test_a_rank_killed_mid_fit_resumes_from_the_shards_to_thesame_weights(
        data, fsdp_model, tmp_path):
    """checkpointEverySteps=10 (20 steps an epoch): a SIGKILL at step 13 of epoch 3 resumes
    after its step 10, from every rank's shard."""
    checkpoint_dir = tmp_path / "ckpt"
    estimator = arm(TorchEstimator(epochs=4, strategy="fsdp", checkpointDir=str(checkpoint_dir),
                                   checkpointEverySteps=10, **SETTINGS),
                    str(tmp_path), rank=1, epoch=3, step=13, action="kill")
    model = estimator.fit(data[0])
    summary = model.trainingSummary
    assert (tmp_path / "fired-1.pid").exists()
    assert (summary["resumed_from_epoch"], summary["resumed_from_step"]) == (2, 10)
    assert [epoch["loss"] for epoch in model.history] == pytest.approx(
        [epoch["loss"] for epoch in fsdp_model.history], rel=1e-6)
    assert same_weights(model, fsdp_model)
    run = sorted(os.listdir(checkpoint_dir / summary["run_id"]))
    # the kept checkpoints and only their shard directories (pruned with them)
    assert [name for name in run if name.startswith(("ckpt-", "shards-"))] == [
        "ckpt-0000000002", "ckpt-0000000003", "ckpt-0000000004",
        "shards-0000000002-0000000010", "shards-0000000003-0000000010",
        "shards-0000000004-0000000000"]


@pytest.mark.slow
def test_a_sharded_checkpoint_of_two_workers_loads_into_one(data, tmp_path):
    """A 2-worker run continued on 1 worker: one rank reads both shards. First the ranks'
    resume path alone (epochs equal to the checkpoint's: the fit ends with exactly what it
    loaded), then through the estimator, resume='required' allowing the new worker count."""
    two = TorchEstimator(epochs=2, strategy="fsdp", checkpointDir=str(tmp_path), runId="r",
                         **SETTINGS).fit(data[0])
    one_worker = {**SETTINGS, "numWorkers": 1, "batchSize": 200}  # the same global batch
    one = TorchEstimator(epochs=2, strategy="fsdp", **one_worker)
    state, header = train_stage(one, data[0], str(tmp_path / "r"))
    assert header["world_size"] == 1 and header["resumed_from_epoch"] == 2
    assert header["history"] == two.history
    reference = two.module().state_dict()
    assert all(torch.equal(state[name], reference[name]) for name in reference)
    more = TorchEstimator(epochs=3, strategy="fsdp", checkpointDir=str(tmp_path), runId="r",
                          resume="required", **one_worker).fit(data[0])
    summary = more.trainingSummary
    assert (summary["world_size"], summary["resumed_from_epoch"]) == (1, 2)
    assert more.history[:2] == two.history
    assert more.history[2]["loss"] < more.history[0]["loss"]


@pytest.mark.slow
def test_the_fitted_model_saves_loads_and_scores(fsdp_model, data, tmp_path):
    """TorchModel holds the consolidated state dict, whatever the strategy."""
    weights = fsdp_model.module().state_dict()
    assert {name: tuple(value.shape) for name, value in weights.items()} == {
        "layers.0.weight": (32, 8), "layers.0.bias": (32,), "layers.3.weight": (16, 32),
        "layers.3.bias": (16,), "layers.6.weight": (1, 16), "layers.6.bias": (1,)}
    fsdp_model.save(str(tmp_path / "model"))
    loaded = TorchModel.load(str(tmp_path / "model"))
    assert same_weights(loaded, fsdp_model)
    before = fsdp_model.transform(data[1]).select("probability").collect()
    after = loaded.transform(data[1]).select("probability").collect()
    assert before == after


def test_bad_fsdp_configurations_fail_before_launch(data):
    with pytest.raises(ParamError, match=r"fsdpWrap=\['Block'\].*classes are .*'Linear'"):
        TorchEstimator(strategy="fsdp", fsdpWrap=["Block"], **SETTINGS).fit(data[0])
    with pytest.raises(ParamError, match="mixedPrecision=True needs GPU executors"):
        TorchEstimator(strategy="fsdp", mixedPrecision=True, useGpu=False,
                       **SETTINGS).fit(data[0])


def test_fsdp_refuses_horovod_and_wraps_the_named_classes():
    """backend='horovod' is refused by what fsdp declares it supports (the one
    compatibility check)."""
    from sparkdist.torchtrain.nets import MLP
    from sparkdist.torchtrain.strategies import check_compatible, fsdp

    net = MLP(input_dim=4, output_dim=1, hidden=[8, 8])
    with pytest.raises(ParamError, match="backend='horovod'.*set backend='torch'"):
        check_compatible(train_spec("fsdp", backend="horovod"))
    assert fsdp.wrap_units(net, []) == [net.layers[0], net.layers[2], net.layers[4]]
    assert fsdp.wrap_units(net, ["torch.nn.modules.linear.Linear"]) == [
        net.layers[4], net.layers[2], net.layers[0]]
