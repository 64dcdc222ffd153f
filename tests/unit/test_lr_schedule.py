"""The learning-rate rule of several workers (learningRateScaling, warmupSteps): the schedule's
values, the Params' checks, the typed spec (also after an elastic re-plan), the resume
fingerprint and the step count a checkpoint keeps. No Spark session."""

from __future__ import annotations

import math

import pytest

from sparkdist.exceptions import ParamError
from sparkdist.models import TorchEstimator
from sparkdist.torchtrain import resume, schedule
from tests.torchfits import train_spec


@pytest.mark.parametrize("scaling, workers, expected", [
    ("none", 4, 0.1), ("linear", 4, 0.4), ("sqrt", 4, 0.2), ("sqrt", 2, 0.1 * math.sqrt(2)),
    ("none", 1, 0.1), ("linear", 1, 0.1), ("sqrt", 1, 0.1)])
def test_the_scaled_rate_is_the_rate_times_k_or_sqrt_k(scaling, workers, expected):
    assert schedule.scaled_rate(0.1, scaling, workers) == pytest.approx(expected)
    # no warm-up: the scaled rate from the first step on
    assert schedule.rate_at(0.1, scaling, workers, 0, 0) == pytest.approx(expected)
    assert schedule.rate_at(0.1, scaling, workers, 0, 10_000) == pytest.approx(expected)


@pytest.mark.parametrize("scaling, target", [("linear", 0.8), ("sqrt", 0.1 * math.sqrt(8))])
def test_the_warm_up_ramps_linearly_from_the_rate_to_the_scaled_rate(scaling, target):
    def rate(step: int) -> float:
        return schedule.rate_at(0.1, scaling, 8, 200, step)

    assert rate(0) == 0.1  # the first step: the unscaled rate
    assert rate(50) == pytest.approx(0.1 + (target - 0.1) / 4)
    assert rate(100) == pytest.approx((0.1 + target) / 2)  # mid-ramp
    assert rate(199) == pytest.approx(0.1 + (target - 0.1) * 199 / 200)
    assert rate(200) == pytest.approx(target) and rate(5000) == pytest.approx(target)
    assert all(rate(s) < rate(s + 1) for s in range(200))  # rising, then flat


@pytest.mark.parametrize("scaling", ["none", "linear", "sqrt"])
def test_one_worker_keeps_the_rate_through_and_after_the_warm_up(scaling):
    assert {schedule.rate_at(0.01, scaling, 1, 100, s) for s in (0, 1, 50, 99, 100, 10**6)} \
        == {0.01}


def test_apply_sets_every_parameter_group():
    import torch

    weights = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
    optimizer = torch.optim.SGD([{"params": weights[:1]}, {"params": weights[1:]}], lr=0.1)
    schedule.apply(optimizer, 0.25)
    assert [group["lr"] for group in optimizer.param_groups] == [0.25, 0.25]


def test_the_spec_carries_the_params_and_the_configured_worker_count():
    optim = TorchEstimator(numWorkers=4, learningRate=0.01, learningRateScaling="linear",
                           warmupSteps=10)._spec_parts()["optim"]
    assert (optim.lr_scaling, optim.warmup_steps, optim.lr_workers) == ("linear", 10, 4)
    assert optim.rate_at(0) == 0.01 and optim.rate_at(5) == pytest.approx(0.025)
    assert optim.rate_at(10) == pytest.approx(0.04)
    default = TorchEstimator(numWorkers=4)._spec_parts()["optim"]
    assert (default.lr_scaling, default.warmup_steps) == ("none", 0)
    assert default.rate_at(0) == default.rate_at(10**6) == default.learning_rate


def test_an_elastic_re_plan_keeps_the_global_batch_and_so_the_rate():
    spec = train_spec(lr_scaling="linear", lr_workers=4, warmup_steps=0)
    replanned = spec.for_world(2)
    assert replanned.launch.num_workers == 2 and replanned.optim.batch_size == 16
    assert replanned.optim.lr_workers == 4
    assert replanned.optim.rate_at(0) == spec.optim.rate_at(0) == pytest.approx(4e-3)


@pytest.mark.parametrize("params, match", [
    ({"learningRateScaling": "quadratic"}, r"learningRateScaling='quadratic' is not one of "
                                           r"\['none', 'linear', 'sqrt'\]"),
    ({"learningRateScaling": "Linear"}, "Did you mean 'linear'"),
    ({"learningRateScaling": "linear", "warmupSteps": -1}, "warmupSteps=-1: use 0 or more"),
    ({"warmupSteps": 100}, r"warmupSteps=100 .* learningRateScaling='none' does not scale it: "
                           r"set learningRateScaling='linear' or 'sqrt', or warmupSteps=0"),
])
def test_a_bad_value_is_a_param_error_naming_the_param_and_the_fix(params, match):
    with pytest.raises(ParamError, match=match):
        TorchEstimator(numWorkers=2, **params)._spec_parts()


def test_the_fingerprint_holds_the_params_unless_the_rate_is_unscaled():
    plain = TorchEstimator(checkpointDir="/tmp/ckpt", runId="r")._fingerprint_params()
    assert not {"learningRateScaling", "warmupSteps"} & set(plain)  # older runs still resume
    scaled = TorchEstimator(checkpointDir="/tmp/ckpt", runId="r", learningRateScaling="sqrt",
                            warmupSteps=30)._fingerprint_params()
    assert (scaled["learningRateScaling"], scaled["warmupSteps"]) == ("sqrt", 30)
    other = TorchEstimator(checkpointDir="/tmp/ckpt", runId="r", learningRateScaling="sqrt",
                           warmupSteps=40)._fingerprint_params()
    assert other != scaled  # a change of the ramp is a different trajectory: no resume


def test_a_checkpoint_keeps_the_step_count_and_an_older_one_reads_as_none():
    import io

    import torch

    spec = train_spec(lr_scaling="linear", lr_workers=4, warmup_steps=100)
    payload = resume.encode(2, 3, {"model": {}, "optimizer": {}}, [], None, False, 0.5, spec,
                            global_step=23)
    state = resume.decode(payload, spec, "here")
    assert (state["epoch"], state["step"], state["global_step"]) == (2, 3, 23)
    older = torch.load(io.BytesIO(payload), weights_only=True)
    del older["global_step"]
    buffer = io.BytesIO()
    torch.save(older, buffer)
    assert resume.decode(buffer.getvalue(), spec, "here")["global_step"] is None
