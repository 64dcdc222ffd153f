"""The one registry of test and benchmark hooks (sparkdist.hooks) without Spark: arming by
estimator, what a fit carries, and the wrapping of a rank's rendezvous and steps, which leaves
them untouched where no hook is armed for the rank."""

from __future__ import annotations

import pytest

from sparkdist import failpoints, hooks
from sparkdist.models import TorchEstimator
from sparkdist.torchtrain import straggle


def _step(epoch, step, features, label):
    return step


def test_hooks_of_both_kinds_share_one_registry_by_estimator():
    estimator, other = TorchEstimator(), TorchEstimator()
    failpoints.arm(estimator, "/tmp/unused", rank=1, epoch=2, step=3)
    straggle.arm(estimator, rank=0, factor=2.0)
    assert {type(hook) for hook in hooks.armed(estimator)} == {failpoints.Failpoint,
                                                               straggle.Straggle}
    assert hooks.armed(other) == ()
    assert hooks.armed(estimator.copy()) == hooks.armed(estimator)  # the uid is kept
    straggle.disarm(estimator)
    assert straggle.armed(estimator) is None and failpoints.armed(estimator).step == 3
    hooks.disarm(estimator)
    assert hooks.armed(estimator) == ()


def test_nothing_is_wrapped_for_a_rank_without_a_hook():
    armed = (failpoints.Failpoint("torch.step", 1, 1, 0, "raise", 1, "/tmp/unused"),
             straggle.Straggle(rank=1))
    assert hooks.around_step(_step, (), 0, clock=None) is _step
    assert hooks.around_step(_step, armed, 0, clock=None) is _step
    assert hooks.around_rendezvous(_step, armed, 0) is _step
    assert hooks.around_rendezvous(_step, armed, 1) is _step  # a step failpoint only


def test_a_step_failpoint_fires_at_its_epoch_and_step_as_often_as_armed(tmp_path):
    armed = (failpoints.Failpoint("torch.step", 1, 2, 3, "raise", 1, str(tmp_path)),)
    step = hooks.around_step(_step, armed, 1, clock=None)
    assert [step(0, 3, None, None), step(1, 2, None, None)] == [3, 2]  # epochs are 0-based
    with pytest.raises(failpoints.FailpointError, match="rank 1, epoch 2, step 3"):
        step(1, 3, None, None)
    assert step(1, 3, None, None) == 3  # fired its one time
    assert (tmp_path / "fired-1.pid").exists()


def test_a_rendezvous_failpoint_wraps_the_rendezvous(tmp_path):
    armed = (failpoints.Failpoint("torch.rendezvous", 0, 0, 0, "raise", 2, str(tmp_path)),)
    joined = []
    rendezvous = hooks.around_rendezvous(lambda *args: joined.append(args), armed, 0)
    for _ in range(2):
        with pytest.raises(failpoints.FailpointError, match="torch.rendezvous fired"):
            rendezvous("context", "device")
    rendezvous("context", "device")
    assert joined == [("context", "device")]
    assert hooks.around_step(_step, armed, 0, clock=None) is _step
