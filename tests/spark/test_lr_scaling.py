"""learningRateScaling and warmupSteps in real fits (issue 32): the ranks train at the scaled
rate (each epoch's record holds the rate of its last step), the warm-up ramps across epochs,
a fit killed mid-warm-up resumes on the ramp's step to the uninterrupted weights, Keras'
optimizers scale too, and a bad value is a ParamError before launch."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import pytest  # noqa: E402
import torch  # noqa: E402

from sparkdist.datasets import make_nonlinear  # noqa: E402
from sparkdist.exceptions import ParamError  # noqa: E402
from sparkdist.failpoints import arm  # noqa: E402
from sparkdist.models import TorchEstimator  # noqa: E402
from sparkdist.torchtrain import schedule  # noqa: E402

#: 2000 rows, 2 workers of 200 rows a step: 5 steps per epoch.
SETTINGS = {"progress": False, "batchSize": 200, "learningRate": 0.01, "numWorkers": 2,
            "modelKwargs": {"hidden": [16], "dropout": 0.1}, "seed": 5,
            "rendezvousTimeoutSeconds": 60}
STEPS = 5
WARMUP = {"learningRateScaling": "linear", "warmupSteps": 15}  # over 3 epochs


@pytest.fixture(scope="module")
def data(spark, cached):
    with cached(spark.createDataFrame(make_nonlinear(2000, 3)).repartition(2)) as df:
        yield df


def _ramp(epochs: int) -> list[float]:
    """The rate of each epoch's last step under WARMUP with SETTINGS."""
    return [schedule.rate_at(0.01, "linear", 2, 15, (epoch + 1) * STEPS - 1)
            for epoch in range(epochs)]


@pytest.mark.slow
def test_the_ranks_train_at_the_linearly_scaled_rate(data):
    model = TorchEstimator(epochs=2, learningRateScaling="linear", **SETTINGS).fit(data)
    assert model.trainingSummary["steps_per_epoch"] == STEPS
    assert [record["epoch"] for record in model.history] == [1, 2]
    assert [record["lr"] for record in model.history] == [pytest.approx(0.02)] * 2
    assert all(record["loss"] > 0 for record in model.history)


@pytest.mark.slow
def test_the_warm_up_ramps_across_epochs_and_a_kill_mid_ramp_resumes_on_it(data, tmp_path):
    """A kill before step 3 of epoch 3 resumes after its step 2 (checkpointEverySteps=2):
    step 12 of the 15-step ramp; the resumed fit ends with the uninterrupted one's weights."""
    clean = TorchEstimator(epochs=4, checkpointDir=str(tmp_path / "clean"), **WARMUP,
                           **SETTINGS).fit(data)
    assert [record["lr"] for record in clean.history] == pytest.approx(_ramp(4))
    assert clean.history[0]["lr"] < clean.history[1]["lr"] < clean.history[2]["lr"] < 0.02
    assert clean.history[3]["lr"] == pytest.approx(0.02)  # the ramp is over

    killed = arm(TorchEstimator(epochs=4, checkpointDir=str(tmp_path / "ckpt"),
                                checkpointEverySteps=2, **WARMUP, **SETTINGS),
                 str(tmp_path), rank=1, epoch=3, step=3, action="kill").fit(data)
    summary = killed.trainingSummary
    assert (tmp_path / "fired-1.pid").exists()
    assert (summary["resumed_from_epoch"], summary["resumed_from_step"]) == (2, 2)
    assert [record["lr"] for record in killed.history] == pytest.approx(_ramp(4))
    assert [record["loss"] for record in killed.history] == pytest.approx(
        [record["loss"] for record in clean.history], rel=1e-6)
    first, second = killed.module().state_dict(), clean.module().state_dict()
    assert all(torch.equal(first[name], second[name]) for name in first)


@pytest.mark.slow
def test_a_keras_optimizer_s_own_rate_is_scaled(data):
    keras = pytest.importorskip("keras")
    from sparkdist.models import KerasEstimator

    model = KerasEstimator(optimizer=keras.optimizers.SGD(learning_rate=0.05), epochs=1,
                           learningRateScaling="sqrt", loss="binary_crossentropy",
                           modelKwargs={"hidden": [8]},
                           **{k: v for k, v in SETTINGS.items()
                              if k not in ("learningRate", "modelKwargs")}).fit(data)
    assert model.history[0]["lr"] == pytest.approx(0.05 * 2 ** 0.5)


@pytest.mark.parametrize("params, match", [
    ({"learningRateScaling": "square"}, "learningRateScaling='square' is not one of"),
    ({"learningRateScaling": "linear", "warmupSteps": -5}, "warmupSteps=-5: use 0 or more"),
    ({"warmupSteps": 10}, "learningRateScaling='none' does not scale it"),
])
def test_a_bad_value_is_refused_before_launch(data, params, match):
    with pytest.raises(ParamError, match=match):
        TorchEstimator(epochs=1, **{**SETTINGS, **params}).fit(data)
