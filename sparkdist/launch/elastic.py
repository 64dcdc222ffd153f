"""Elastic fits: a barrier job that lost task slots for good goes on with fewer workers.

A barrier stage needs all of its tasks running at once. When an executor is gone for good (a
spot instance reclaimed, a node drained), Spark resubmits the failed stage with the same
number of tasks and waits for slots that never come: the fit hangs until its timeout, however
many checkpoints it wrote. :func:`supervise` watches the scheduler's task slots
(:func:`sparkdist.launch.preflight.live_slots`, twice a second) while each barrier job runs:

- fewer slots than the job's tasks, but at least ``min_workers``: cancel the job and launch a
  new one on the slots there are (the input repartitioned across them, the worker's args
  re-planned by :attr:`ElasticPlan.for_world`); the workers resume from their checkpoint;
- fewer than ``min_workers``: wait for slots up to ``slot_wait_s`` (Spark's own retry runs in
  place if they come back), then cancel and raise a :class:`TrainingError` naming the slots
  needed and found;
- a restart of a job that runs on fewer than ``num_workers`` while more slots are free:
  relaunch on up to ``num_workers`` (grow back), never more.

Every re-plan counts as a failed attempt against ``maxRetries``. The first launch is on
``num_workers`` (the caller's preflight checked the slots). On Spark Connect the scheduler
cannot be asked: a fit there keeps Spark's retries only.

Examples
--------
>>> plan = ElasticPlan(min_workers=2, slot_wait_s=60)
>>> run_barrier(df, worker, args, 3, elastic=plan)  # doctest: +SKIP
>>> plan.worker_counts  # an executor died for good during the fit  # doctest: +SKIP
[3, 2]
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkdist.exceptions import TrainingError
from sparkdist.launch.attempts import Fit, Launch, cancel
from sparkdist.launch.preflight import live_slots

_LOG = logging.getLogger(__name__)
#: How often the task slots are read while a job runs (one scheduler call each).
POLL_S = 0.5


def _same_args(args: Any, world: int) -> Any:
    return args


def _any_world(world: int) -> bool:
    return True


@dataclass
class ElasticPlan:
    """How a fit may change its worker count, and what it did.

    Attributes
    ----------
    min_workers : the fewest workers a restart may run on (>= 1).
    slot_wait_s : the longest wait for ``min_workers`` slots before the fit fails.
    for_world : ``(args, world) -> args`` of a launch on ``world`` workers (e.g. the
        per-worker batch size); the default keeps the args.
    usable : whether the fit can run on ``world`` workers at all (e.g. a multiple of the
        pipeline stages); the largest usable count within the free slots is taken.
    param, wait_param : the Param names quoted in errors.
    worker_counts : filled in: the world size of each attempt that started training.
    timeline : filled in: ``(time.time(), what)`` of each slot change, decision and start.
    """

    min_workers: int
    slot_wait_s: float
    for_world: Callable[[Any, int], Any] = _same_args
    usable: Callable[[int], bool] = _any_world
    param: str = "minWorkers"
    wait_param: str = "slotWaitSeconds"
    worker_counts: list[int] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)

    def note(self, what: str) -> None:
        """Add to the timeline; also logged (INFO, ``sparkdist.launch.elastic``)."""
        self.timeline.append((time.time(), what))
        _LOG.info("sparkdist elastic: %s", what)

    def best_world(self, slots: int, num_workers: int) -> int | None:
        """The most workers a launch can use on ``slots`` slots, or None below the minimum."""
        fitting = [w for w in range(self.min_workers, min(slots, num_workers) + 1)
                   if self.usable(w)]
        return max(fitting) if fitting else None

    def shortage(self, needed: int, found: int) -> TrainingError:
        return TrainingError(
            f"the training stage needs at least {needed} task slots ({self.param}={needed}) "
            f"but the cluster has {found} after waiting {self.slot_wait_s:.0f} s "
            f"({self.wait_param}={self.slot_wait_s:g}): an executor is gone and has not come "
            f"back. Add executors, lower {self.param} to {max(found, 1)} or raise "
            f"{self.wait_param}.")


def supervise(spark: Any, launch: Callable[..., list[Any]], args: Any,
              num_workers: int, plan: ElasticPlan, timeout_s: float | None,
              fit: Fit) -> list[Any]:
    """Run ``launch(args, world, timeout_s, number)`` (one barrier job) under the slot watch;
    re-launch on the world the watch picks until a job finishes (its rows) or the fit fails."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    world, number = num_workers, 0
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TrainingError(f"the fit ran past its timeout of {timeout_s:.0f} s while "
                                "re-planning on fewer workers.")
        stop = threading.Event()
        watch = _SlotWatch(spark, fit, plan, num_workers, number)
        threading.Thread(target=watch.run, args=(stop,), daemon=True).start()
        plan.note(f"launch {number} on {world} workers")
        try:
            return launch(args if world == num_workers else plan.for_world(args, world),
                          world, remaining, number)
        except TrainingError:
            current = fit.current
            outcome = current.outcome if current is not None else None
            if current is None or outcome is None:
                raise
            if isinstance(outcome, TrainingError):
                raise outcome from None
            world, number = _next_launch(fit, current, int(outcome))
        finally:
            stop.set()


def _next_launch(fit: Fit, current: Launch, world: int) -> tuple[int, int]:
    """Count the cancelled launch's failed attempt(s) against maxRetries; the next launch."""
    attempts = current.attempts
    fit.failed_before = max(attempts.failed, fit.failed_before + 1)
    if fit.max_retries is not None and fit.failed_before > fit.max_retries:
        raise TrainingError(f"gave up after {fit.failed_before} failed attempt(s) "
                            f"(maxRetries={fit.max_retries}) while re-planning on {world} "
                            f"workers. The last failure: {attempts.last}")
    _LOG.warning("sparkdist: the training stage on %d workers lost task slots; re-planning "
                 "on %d workers (failed attempts so far: %d)", current.world, world,
                 fit.failed_before)
    return world, current.number + 1


class _SlotWatch:
    """Polls the task slots while launch ``number`` runs and decides (module docstring)."""

    def __init__(self, spark: Any, fit: Fit, plan: ElasticPlan, num_workers: int,
                 number: int) -> None:
        self.spark, self.fit, self.plan = spark, fit, plan
        self.num_workers, self.number = num_workers, number
        self.short_since: float | None = None

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(POLL_S):
            current = self.fit.current
            if current is None or current.number != self.number:
                continue  # not launched yet
            if current.outcome is not None:
                return
            try:
                slots = live_slots(self.spark)
            except Exception as err:  # a py4j hiccup must not end the watch
                _LOG.debug("task slot poll failed: %s", err)
                continue
            if slots is None:
                return  # Spark Connect: nothing to watch, Spark's retries only
            self.decide(current, slots)

    def decide(self, current: Launch, slots: int) -> None:
        plan = self.plan
        if slots >= current.world:
            if self.short_since is not None:
                plan.note(f"{slots} task slots again")
            self.short_since = None
            bigger = plan.best_world(slots, self.num_workers)
            restarting = current.attempts.failed > current.attempts.failed_before
            if restarting and bigger is not None and bigger > current.world:
                self.end(current, bigger, f"grow to {bigger} workers on {slots} slots")
            return
        if self.short_since is None:
            self.short_since = time.monotonic()
            plan.note(f"{slots} task slots for {current.world} workers")
        target = plan.best_world(slots, self.num_workers)
        if target is not None:
            self.end(current, target, f"shrink to {target} workers on {slots} slots")
        elif time.monotonic() - self.short_since >= plan.slot_wait_s:
            self.end(current, plan.shortage(plan.min_workers, slots),
                     f"gave up waiting for {plan.min_workers} slots ({slots} found)")

    def end(self, current: Launch, outcome: int | TrainingError, why: str) -> None:
        """Cancel the launch's job; :func:`supervise` reads ``outcome`` once it ends."""
        self.plan.note(why)
        _LOG.warning("sparkdist elastic: cancelling the training job: %s", why)
        current.outcome = outcome
        cancel(self.spark, current.tag)
