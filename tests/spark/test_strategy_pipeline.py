"""strategy='pipeline' in local[2] (2 barrier ranks, gloo): the MLP's layers split into 2
stages learn what ddp learns, with ddp's loss curve, under 1F1B and GPipe, for about half of
ddp's per-rank parameter, gradient and optimizer bytes; a SIGKILLed rank resumes to the
uninterrupted weights (dropout included); a 2-stage checkpoint loads into 1 worker; the fitted
TorchModel saves, loads and scores as any; bad configurations fail before launch. The
2 stages x 2 replicas layout runs in tests/unit/test_pipeline_ranks.py (real gloo ranks) and
tests/cluster/test_pipeline_four_workers.py (a local[4] fit)."""

from __future__ import annotations

import sys

import pytest
import torch
from pyspark import cloudpickle
from torch import nn

from sparkdist.exceptions import ParamError
from sparkdist.failpoints import arm
from sparkdist.models import TorchEstimator, TorchModel
from sparkdist.torchtrain.nets import MLP
from tests.torchfits import accuracy, same_weights, train_stage

# Classes defined here travel to the executors by value (the test module is not importable
# there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SETTINGS = {"progress": False, "batchSize": 64, "learningRate": 0.01, "numWorkers": 2,
            "seed": 7, "rendezvousTimeoutSeconds": 60}
#: Linear(8,128) + Linear(128,128) | Linear(128,128) + Linear(128,1): 17,664 and 16,641
#: parameters, the balanced split's two stages.
BALANCED = {"hidden": [128, 128, 128]}
DROPOUT = {"hidden": [32, 16], "dropout": 0.1}


@pytest.fixture(scope="module")
def data(nonlinear):
    return nonlinear


@pytest.fixture(scope="module")
def ddp_model(data):
    return TorchEstimator(epochs=4, validationFraction=0.2, modelKwargs=BALANCED,
                          **SETTINGS).fit(data[0])


@pytest.fixture(scope="module")
def pipeline_model(data):
    """1F1B (the default schedule), 4 micro-batches (the default)."""
    return TorchEstimator(epochs=4, validationFraction=0.2, modelKwargs=BALANCED,
                          strategy="pipeline", **SETTINGS).fit(data[0])


@pytest.fixture(scope="module")
def gpipe_model(data):
    return TorchEstimator(epochs=4, validationFraction=0.2, modelKwargs=BALANCED,
                          strategy="pipeline", pipelineSchedule="gpipe", microBatches=3,
                          **SETTINGS).fit(data[0])


@pytest.fixture(scope="module")
def dropout_model(data, tmp_path_factory):
    """3 uninterrupted epochs with dropout, checkpointed: what a resumed fit must end with."""
    directory = str(tmp_path_factory.mktemp("pipeline"))
    return TorchEstimator(epochs=3, strategy="pipeline", modelKwargs=DROPOUT,
                          checkpointDir=directory, checkpointEverySteps=10,
                          **SETTINGS).fit(data[0])




@pytest.mark.slow
def test_pipeline_follows_ddps_loss_curve_and_reaches_itsaccuracy(ddp_model, pipeline_model,
                                                                   data):
    """Same seed, same initial weights, same global batches: the replica trains on both
    ranks' rows and each step's gradient is the mean over them, as ddp's, summed in another
    order (micro-batches, padded rounds). Adam amplifies those float differences (a
    near-zero gradient still moves its weight by about the learning rate: with SGD the
    weights agree to 1e-7, next test), so the first epoch is compared within 0.2 % and the
    end by the accuracy reached. Validation counts every rank's rows (the outputs go back to
    them)."""
    summary = pipeline_model.trainingSummary
    assert (summary["strategy"], summary["world_size"]) == ("pipeline", 2)
    ddp, pipeline = ddp_model.history, pipeline_model.history
    assert pipeline[0]["loss"] == pytest.approx(ddp[0]["loss"], rel=1e-4)
    for name in ("val_loss", "val_accuracy"):
        assert pipeline[0][name] == pytest.approx(ddp[0][name], rel=2e-3)
    assert pipeline[-1]["loss"] < 0.7 * pipeline[0]["loss"]
    ddp_accuracy = accuracy(ddp_model, data[1])
    assert ddp_accuracy > 0.85 and accuracy(pipeline_model, data[1]) >= ddp_accuracy - 0.01


@pytest.mark.slow
def test_with_sgd_the_pipeline_takes_ddps_steps(data):
    """Plain SGD does not amplify the summation-order differences: after an epoch of 32
    steps the weights agree with ddp's to float rounding."""
    sgd = {**SETTINGS, "optimizer": "sgd", "learningRate": 0.05, "epochs": 1,
           "modelKwargs": BALANCED}
    ddp = TorchEstimator(**sgd).fit(data[0])
    pipeline = TorchEstimator(strategy="pipeline", **sgd).fit(data[0])
    assert pipeline.history[0]["loss"] == pytest.approx(ddp.history[0]["loss"], rel=1e-6)
    first, second = ddp.module().state_dict(), pipeline.module().state_dict()
    assert max(float((first[k] - second[k]).abs().max()) for k in first) < 1e-6
    torch.manual_seed(SETTINGS["seed"])  # the ranks' initial weights: they moved far more
    initial = MLP(input_dim=8, output_dim=1, **BALANCED).state_dict()
    assert max(float((first[k] - initial[k]).abs().max()) for k in first) > 1e-3


@pytest.mark.slow
def test_gpipe_and_1f1b_train_the_same_model(pipeline_model, gpipe_model, data):
    """The two schedules order the same micro-batch computations differently (and here with
    3 micro-batches against 4): the same gradients up to float rounding, which Adam
    amplifies over the epochs (see above)."""
    gpipe, one_f_one_b = gpipe_model.history, pipeline_model.history
    assert gpipe[0]["loss"] == pytest.approx(one_f_one_b[0]["loss"], rel=1e-4)
    assert gpipe[-1]["loss"] == pytest.approx(one_f_one_b[-1]["loss"], rel=0.05)
    assert gpipe[-1]["loss"] < 0.7 * gpipe[0]["loss"]
    assert abs(accuracy(gpipe_model, data[1]) - accuracy(pipeline_model, data[1])) <= 0.01


@pytest.mark.slow
def test_each_rank_holds_about_half_of_ddps_state_bytes(ddp_model, pipeline_model):
    """Each stage holds its layers' parameters, gradients and Adam moments only."""
    ddp = [rank["state_mb"] for rank in ddp_model.trainingSummary["ranks"]]
    pipeline = [rank["state_mb"] for rank in pipeline_model.trainingSummary["ranks"]]
    assert ddp[0] == ddp[1]
    assert max(pipeline) / ddp[0] <= 0.55
    assert sum(pipeline) == pytest.approx(ddp[0], abs=0.002)  # the two stages make the model


@pytest.mark.slow
def test_a_rank_killed_mid_fit_resumes_to_thesame_weights(data, dropout_model, tmp_path):
    """checkpointEverySteps=10 (32 steps an epoch): a SIGKILL of the last stage at step 13 of
    epoch 3 resumes after its step 10 from the merged checkpoint, and each stage's dropout
    masks are drawn again alike (every step reseeds every rank)."""
    estimator = arm(TorchEstimator(epochs=3, strategy="pipeline", modelKwargs=DROPOUT,
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


@pytest.mark.slow
def test_a_two_stage_checkpoint_loads_into_one_worker(data, tmp_path):
    """The ranks' resume path alone with numWorkers changed (the stage launched directly;
    the estimator's resume='required' path is in test_strategy_fsdp.py): the one rank, a
    single stage, takes every stage's weights and Adam moments by parameter name."""
    two = TorchEstimator(epochs=2, strategy="pipeline", modelKwargs=BALANCED,
                         checkpointDir=str(tmp_path), runId="r", **SETTINGS).fit(data[0])
    one = TorchEstimator(epochs=2, strategy="pipeline", modelKwargs=BALANCED,
                         **{**SETTINGS, "numWorkers": 1, "batchSize": 128})
    state, header = train_stage(one, data[0], str(tmp_path / "r"))
    assert header["world_size"] == 1 and header["resumed_from_epoch"] == 2
    assert header["history"] == two.history
    reference = two.module().state_dict()
    assert state.keys() == reference.keys()
    assert all(torch.equal(state[name], reference[name]) for name in reference)
    # and it trains on from there: a third epoch on one worker
    state, header = train_stage(one, data[0], str(tmp_path / "r"), epochs=3)
    assert [epoch["epoch"] for epoch in header["history"]] == [1, 2, 3]
    assert header["history"][2]["loss"] < header["history"][1]["loss"]


@pytest.mark.slow
def test_the_fitted_model_saves_loads_and_scores(pipeline_model, ddp_model, data, tmp_path):
    """TorchModel holds the whole state dict, merged from the stages by parameter name."""
    weights = pipeline_model.module().state_dict()
    assert {name: value.shape for name, value in weights.items()} == {
        name: value.shape for name, value in ddp_model.module().state_dict().items()}
    pipeline_model.save(str(tmp_path / "model"))
    loaded = TorchModel.load(str(tmp_path / "model"))
    assert same_weights(loaded, pipeline_model)
    before = pipeline_model.transform(data[1]).select("probability").collect()
    after = loaded.transform(data[1]).select("probability").collect()
    assert before == after


@pytest.mark.slow
def test_an_empty_partition_trains_and_validates_without_hanging(data):
    """All rows on the last stage's rank: each step the first stage gathers them from it
    (and gives nothing), and validation sends the outputs back to the rank that holds the
    rows."""
    from pyspark.sql import functions as F

    skewed = data[0].repartition(2, F.lit(0))  # every row hashes to the same partition
    assert sorted(skewed.rdd.glom().map(len).collect()) == [0, 4000]
    model = TorchEstimator(epochs=4, strategy="pipeline", validationFraction=0.2,
                           modelKwargs={"hidden": [32, 16]}, timeoutSeconds=300,
                           **SETTINGS).fit(skewed)
    history = model.history
    assert history[-1]["loss"] < history[0]["loss"] and history[-1]["val_accuracy"] > 0.8
    assert accuracy(model, data[1]) > 0.8


class Residual(nn.Module):
    """A skip connection: the output is not the children run one after another."""

    def __init__(self, input_dim: int, output_dim: int) -> None:
        super().__init__()
        self.up, self.act, self.down = (nn.Linear(input_dim, input_dim), nn.ReLU(),
                                        nn.Linear(input_dim, output_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(x + self.act(self.up(x)))


@pytest.mark.parametrize(("settings", "match"), [
    ({"model": Residual}, r"needs a model whose forward runs its top-level children in order"),
    ({"pipelineStages": 3}, r"numWorkers=2 is not a multiple of pipelineStages=3"),
    ({"modelKwargs": {"hidden": []}},
     r"pipelineStages=2: the model has only 1 child to split"),
    ({"pipelineSplitPoints": ["layers.9"]}, r"pipelineSplitPoints: 'layers.9' is not a child"),
    ({"microBatches": 1}, r"pipelineSchedule='1f1b' needs microBatches >= pipelineStages"),
    ({"backend": "horovod"}, r"strategy='pipeline' with backend='horovod'.*set backend='torch'"),
])
def test_bad_pipeline_configurations_fail_before_launch(data, settings, match):
    from sparkdist.torchtrain.backends import horovod_available

    if settings.get("backend") == "horovod" and not horovod_available():
        pytest.skip("the estimator refuses backend='horovod' earlier without Horovod")
    with pytest.raises(ParamError, match=match):
        TorchEstimator(strategy="pipeline", **{**SETTINGS, **settings}).fit(data[0])
