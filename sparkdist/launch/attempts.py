"""A fit's barrier jobs and their failed attempts, on the driver: which launch is current,
where each report of the ranks goes (:class:`Fit`), how many attempts failed and when to give
up (:class:`Attempts`), and cancelling a launch's job (:func:`cancel`). Shared by
:mod:`sparkdist.launch.barrier`, which starts the jobs, and :mod:`sparkdist.launch.elastic`,
which re-plans them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkdist.exceptions import ParamError, SchemaError, TrainingError
from sparkdist.session import is_connect

_LOG = logging.getLogger(__name__)
#: Errors a rank raises about the fit's input (the data or a Param), raised on the driver with
#: their own type, at once: a retry would read the same input.
INPUT_ERRORS = (SchemaError, ParamError)


@dataclass
class Launch:
    """One barrier job of a fit: the first, or a re-planned one of an elastic fit (a new
    job over ``world`` partitions, job group / tag ``tag``)."""

    number: int
    world: int
    tag: str
    attempts: Attempts
    #: Set by the elastic supervisor before it cancels the job: why (see elastic.py).
    outcome: Any = None


class Fit:
    """What one fit's report socket routes, across its launches: failure reports to the
    current launch's :class:`Attempts` (an earlier launch's late reports are dropped),
    rank 0's attempt-started records to the worker-count history, progress to
    ``on_report``."""

    def __init__(self, max_retries: int | None,
                 on_report: Callable[[dict[str, Any]], Any] | None, elastic: Any) -> None:
        self.max_retries, self.on_report, self.elastic = max_retries, on_report, elastic
        self.current: Launch | None = None
        #: Failed attempts of the launches before the current one (maxRetries spans them).
        self.failed_before = 0
        #: The world size of each attempt that reached its rendezvous, in order (the elastic
        #: plan's list, where there is one: the caller reads it there).
        self.worker_counts: list[int] = elastic.worker_counts if elastic is not None else []

    def dispatch(self, record: dict[str, Any]) -> Any:
        """Route ``record``; what ``on_report`` answers an asking progress record."""
        current = self.current
        if current is None or int(record.get("launch", current.number)) != current.number:
            return None  # a rank of a cancelled launch, reporting late
        if "failure" in record:
            current.attempts.record(record)
        elif "started" in record:
            self.worker_counts.append(int(record["started"]))
            if self.elastic is not None:
                self.elastic.note(f"rendezvous of {record['started']} done")
        elif self.on_report is not None:
            return self.on_report(record)
        return None


class Attempts:
    """Counts the failed attempts of the training stage and cancels the job once
    ``max_retries`` retries have failed too; keeps each attempt's root cause for the error.

    The ranks' failure reports count the attempts as they fail (:meth:`record`). On classic
    Spark the status tracker is watched as well (:meth:`watch`), for attempts whose ranks all
    died without a word (SIGKILL); Spark Connect has no status tracker."""

    def __init__(self, max_retries: int | None, cancel: Callable[[], None],
                 failed_before: int = 0) -> None:
        self.max_retries, self.cancel = max_retries, cancel
        self.last: str | None = None
        #: A rank's report that the input is bad: raised as is, no retry.
        self.input_error: SchemaError | ParamError | None = None
        self._attempt = -1
        #: Failed attempts, counting those of a fit's earlier launches (elastic re-plans).
        self._failed = self.failed_before = failed_before
        #: The highest stage attempt number seen by :meth:`watch` (0: the first).
        self.stage_attempt = 0
        self.gave_up = False

    @property
    def failed(self) -> int:
        """Failed attempts so far, this launch's (reported or seen retried) and before."""
        return max(self._failed, self.failed_before + self.stage_attempt)

    def record(self, record: dict[str, Any]) -> None:
        """Keep the first failure of the newest stage attempt: the root cause, where the ranks
        that fail after it only report losing their peer. The task ids of one attempt lie
        within ``world_size`` of each other; a retry's are all higher."""
        found = record.get("input_error")
        if isinstance(found, dict) and self.input_error is None:
            kind = {cls.__name__: cls for cls in INPUT_ERRORS}.get(str(found.get("type")))
            if kind is not None:
                self.input_error = kind(str(found.get("message")))
                self.give_up()
                return
        attempt = int(record.get("attempt", 0))
        if self.last is not None and attempt - self._attempt < int(record.get("world_size", 1)):
            self._attempt = min(self._attempt, attempt)  # the same attempt: keep its lowest id
            return
        self.last, self._attempt = str(record["failure"]), attempt
        self._failed += 1
        if self.max_retries is not None and self._failed > self.max_retries:
            self.give_up()

    def give_up(self) -> None:
        if not self.gave_up:
            self.gave_up = True
            self.cancel()

    def watch(self, sc: Any, group: str, stop: threading.Event) -> None:
        """Poll Spark's status tracker: attempt ``max_retries + 1`` of a stage means every
        allowed attempt before it failed. Classic Spark only (``sc`` is its SparkContext)."""
        while self.max_retries is not None and not stop.wait(0.5) and not self.gave_up:
            try:
                tracker = sc.statusTracker()
                stages = [stage for job in tracker.getJobIdsForGroup(group)
                          for stage in (tracker.getJobInfo(job) or NO_JOB).stageIds]
                infos = [tracker.getStageInfo(stage) for stage in stages]
            except Exception as err:  # a py4j hiccup must not end the watch
                _LOG.debug("status tracker poll failed: %s", err)
                continue
            self.stage_attempt = max([self.stage_attempt] + [
                info.currentAttemptId for info in infos if info])
            if self.failed > self.max_retries:
                self.give_up()

    def error(self, description: str) -> TrainingError:
        return TrainingError(f"{description}: gave up after {(self.max_retries or 0) + 1} failed "
                             f"attempt(s) (maxRetries={self.max_retries}). The last "
                             f"failure: {self.last}")


@dataclass(frozen=True)
class NoJob:
    stageIds: tuple[int, ...] = ()  # noqa: N815 (the name Spark's SparkJobInfo uses)


NO_JOB = NoJob()


def cancel(spark: Any, tag: str) -> None:
    """Cancel the job group ``tag`` (classic) or the operations tagged ``tag`` (Connect);
    never raises in the timer or watcher thread (the collect reports the cancellation)."""
    try:
        if is_connect(spark):
            spark.interruptTag(tag)
        else:
            spark.sparkContext.cancelJobGroup(tag)
    except Exception as err:
        _LOG.warning("could not cancel the sparkdist jobs %s: %s", tag, err)


def tasks_ended(spark: Any, tag: str, limit_s: float) -> bool:
    """Wait up to ``limit_s`` until no task of the jobs in group ``tag`` runs; whether that
    was seen (classic Spark's status tracker; False on Spark Connect, which has none)."""
    if is_connect(spark):
        return False
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            stages = [stage for job in tracker.getJobIdsForGroup(tag)
                      for stage in (tracker.getJobInfo(job) or NO_JOB).stageIds]
            if not any(getattr(tracker.getStageInfo(stage), "numActiveTasks", 0)
                       for stage in stages):
                return True
        except Exception as err:  # a py4j hiccup: poll again
            _LOG.debug("status tracker poll failed: %s", err)
        time.sleep(0.05)
    return False
