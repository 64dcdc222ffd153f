"""The elastic re-planning rules without Spark: which world a restart takes on the slots
there are, when the fit waits and when it fails, the batch policy on a smaller world, and
that a cancelled launch's late reports are not counted against the next one."""

from __future__ import annotations

import json
import time

import pytest

from sparkdist.exceptions import TrainingError
from sparkdist.launch.attempts import Attempts, Fit, Launch
from sparkdist.launch.elastic import ElasticPlan, _next_launch, _SlotWatch
from sparkdist.torchtrain.launch import with_header
from tests.torchfits import train_spec


class _Context:
    """The SparkContext side of a job-group cancel: records the groups cancelled."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancelJobGroup(self, tag: str) -> None:  # noqa: N802 (Spark's name)
        self.cancelled.append(tag)


class _Session:
    def __init__(self) -> None:
        self.sparkContext = _Context()


def _watch(plan: ElasticPlan, world: int = 3, num_workers: int = 3, failed: int = 0):
    session, fit = _Session(), Fit(3, None, plan)
    attempts = Attempts(3, lambda: None)
    attempts._failed = failed
    launch = Launch(number=0, world=world, tag="sparkdist-test", attempts=attempts)
    fit.current = launch
    return _SlotWatch(session, fit, plan, num_workers, 0), launch, session


def test_best_world_takes_the_most_usable_workers_within_the_slots():
    plan = ElasticPlan(min_workers=2, slot_wait_s=10)
    assert [plan.best_world(slots, 4) for slots in (0, 1, 2, 3, 4, 9)] == [None, None, 2, 3,
                                                                          4, 4]
    even = ElasticPlan(min_workers=1, slot_wait_s=10, usable=lambda w: w % 2 == 0)
    assert even.best_world(3, 4) == 2 and even.best_world(1, 4) is None


def test_fewer_slots_than_workers_but_enough_shrinks_at_once():
    watch, launch, session = _watch(ElasticPlan(min_workers=2, slot_wait_s=60))
    watch.decide(launch, slots=2)
    assert launch.outcome == 2 and session.sparkContext.cancelled == ["sparkdist-test"]


def test_too_few_slots_waits_then_fails_naming_needed_and_found():
    plan = ElasticPlan(min_workers=3, slot_wait_s=0.2)
    watch, launch, session = _watch(plan)
    watch.decide(launch, slots=2)
    assert launch.outcome is None and not session.sparkContext.cancelled  # waiting
    time.sleep(0.25)
    watch.decide(launch, slots=2)
    assert isinstance(launch.outcome, TrainingError)
    message = str(launch.outcome)
    assert "needs at least 3 task slots (minWorkers=3)" in message
    assert "has 2 after waiting" in message and "slotWaitSeconds" in message


def test_slots_back_within_the_wait_leave_sparks_retry_alone():
    watch, launch, session = _watch(ElasticPlan(min_workers=3, slot_wait_s=0.2))
    watch.decide(launch, slots=2)
    watch.decide(launch, slots=3)  # the executor came back
    time.sleep(0.25)
    watch.decide(launch, slots=3)
    assert launch.outcome is None and not session.sparkContext.cancelled


def test_a_restart_grows_back_to_num_workers_never_beyond():
    plan = ElasticPlan(min_workers=2, slot_wait_s=60)
    healthy, launch, _ = _watch(plan, world=2, num_workers=3)
    healthy.decide(launch, slots=5)
    assert launch.outcome is None  # no failure: a running fit is not disturbed
    restarting, launch, session = _watch(plan, world=2, num_workers=3, failed=1)
    restarting.decide(launch, slots=5)
    assert launch.outcome == 3 and session.sparkContext.cancelled


def test_each_replan_counts_against_max_retries():
    plan = ElasticPlan(min_workers=1, slot_wait_s=60)
    fit = Fit(1, None, plan)
    launch = Launch(0, 3, "t", Attempts(1, lambda: None))
    assert _next_launch(fit, launch, 2) == (2, 1) and fit.failed_before == 1
    launch = Launch(1, 2, "t", Attempts(1, lambda: None, failed_before=1))
    with pytest.raises(TrainingError, match="gave up after 2 failed attempt"):
        _next_launch(fit, launch, 1)


def test_late_reports_of_a_cancelled_launch_are_dropped():
    plan = ElasticPlan(min_workers=2, slot_wait_s=60)
    seen: list[dict] = []
    fit = Fit(3, seen.append, plan)
    fit.current = Launch(1, 2, "t", Attempts(3, lambda: None, failed_before=1))
    fit.dispatch({"failure": "rank 1 lost its peer", "attempt": 7, "world_size": 3,
                  "launch": 0})
    fit.dispatch({"started": 3, "launch": 0})
    assert fit.current.attempts.failed == 1 and plan.worker_counts == []
    fit.dispatch({"started": 2, "launch": 1})
    fit.dispatch({"failure": "boom", "attempt": 20, "world_size": 2, "launch": 1})
    fit.dispatch({"epoch": 3, "launch": 1})
    assert plan.worker_counts == [2] and fit.current.attempts.failed == 2
    assert seen == [{"epoch": 3, "launch": 1}]


def test_a_smaller_world_keeps_the_global_batch():
    spec = train_spec(batch_size=64, num_workers=3, epochs=2)
    smaller = spec.for_world(2)
    assert (smaller.optim.batch_size, smaller.launch.num_workers) == (96, 2)
    assert smaller.optim.epochs == 2 and spec.for_world(3) == spec
    odd = train_spec(batch_size=10, num_workers=4).for_world(3)
    assert odd.optim.batch_size == 14  # ceil(40 / 3): the global batch is at least 40


def test_with_header_adds_keys_and_keeps_the_tensor_bytes():
    head = json.dumps({"history": [1]}).encode()
    payload = len(head).to_bytes(8, "big") + head + b"\x00tensors\x01"
    out = with_header(payload, worker_counts=[3, 2])
    size = int.from_bytes(out[:8], "big")
    assert json.loads(out[8:8 + size]) == {"history": [1], "worker_counts": [3, 2]}
    assert out[8 + size:] == b"\x00tensors\x01"


def test_xgboost_elastic_params_are_range_checked_and_named_in_the_error():
    pytest.importorskip("xgboost")
    from sparkdist.exceptions import ParamError
    from sparkdist.models import XGBoostClassifier

    with pytest.raises(ParamError, match="minWorkers=3: use 0 .* to num_workers=2"):
        XGBoostClassifier(num_workers=2, minWorkers=3)._check_params()
    with pytest.raises(ParamError, match="slotWaitSeconds=0"):
        XGBoostClassifier(num_workers=2, slotWaitSeconds=0)._check_params()
    plan = XGBoostClassifier(num_workers=3, minWorkers=2,
                             slotWaitSeconds=9).elastic_plan("num_workers")
    assert (plan.min_workers, plan.slot_wait_s) == (2, 9)
    plan = XGBoostClassifier(num_workers=3).elastic_plan("num_workers")
    assert plan.min_workers == 3  # 0: num_workers
