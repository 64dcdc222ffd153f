"""Checkpointed XGBoost fits: boosting in chunks of ``checkpointEvery`` rounds.

Each chunk is one ``xgboost.spark`` fit with ``n_estimators`` = the chunk's rounds and
``xgb_model`` = the booster so far (xgboost then boosts that many rounds *more*). After each
chunk the booster is saved as UBJSON in :class:`sparkdist.store.Checkpoints`, with the number
of rounds done as the step. A chunk that fails (its barrier stage is never retried by Spark)
is run again from the newest intact checkpoint, at most ``maxRetries`` times in all; a fit
that the driver's run guard lets resume an earlier run (``HasRecovery.guarded_run``)
continues from that run's newest checkpoint.

A failed chunk's error names its root cause: the job error Spark raises carries whichever task
failed first, often a rank whose collective only lost its peer, so the failed tasks of the
chunk's jobs are read back from Spark's status store and a failure that is not such a
symptom is preferred. Spark may kill the rank that started it (the barrier stage is cancelled
on the first failure) before that rank's own error arrives; the error then says which ranks
were killed, whose executor logs hold the cause.

Elastic fits (``ChunkPlan.elastic``: minWorkers, slotWaitSeconds): every chunk starts on the
most workers the free task slots allow, between ``min_workers`` and ``num_workers``
(:meth:`sparkdist.launch.elastic.ElasticPlan.best_world`), waiting up to ``slot_wait_s`` for
``min_workers`` slots before a TrainingError naming the slots needed and found. While a chunk
runs, the task slots are watched: when they drop below the chunk's workers (an executor gone
for good, where xgboost.spark's barrier job would wait for slots forever), its job is cancelled
and the chunk is retried, from the newest checkpoint, on the slots there are. A later chunk
grows back to ``num_workers`` once slots return. The summary's ``worker_counts`` has the first
chunk's workers and those of each retry or change, e.g. ``[3, 2]``. A booster boosted partly on
another number of workers may differ slightly from an uninterrupted one (the histogram cuts
are sketched over other partitions).

One window is not covered: an executor lost after a chunk's slot check but noticed by Spark
only once xgboost.spark submits its barrier job. Spark then re-checks that job's slots every
``spark.scheduler.barrier.maxConcurrentTasksCheck.interval`` (15 s), up to
``...maxFailures`` (40) times, and a job in that state cannot be cancelled (it is not active
yet), so the chunk fails, and is retried on fewer workers, only after those checks (10 minutes
by default; lower the two confs to bound it). A loss while the chunk's job runs is noticed
within a second.

Chunk boundaries are the multiples of ``checkpointEvery`` (and ``n_estimators``), whatever
the history of failures and re-runs, so a resumed fit rebuilds exactly the same chunks. Without
row or column sampling the result is the same booster as one uninterrupted fit.

With validation rows, each chunk's per-round validation values (:func:`round_records`) make
the fit's history, rounds numbered from the start of the whole fit. A fit run under an
observer (:mod:`sparkdist.launch.observe`: a Tuner's pruner) passes it each round's record
once a chunk has succeeded; when it says stop, the chunk's checkpoint is saved and the fit
raises :class:`~sparkdist.exceptions.FitStopped` (the chunk's barrier job has ended: its
slots are free at once).

This module imports xgboost: import it only inside a fit.

Examples
--------
>>> from functools import partial
>>> from xgboost.spark import SparkXGBClassifier
>>> plan = ChunkPlan(location=f"{tmp}/run-1", run_id="run-1", rounds=4, every=2, keep=3,
...                  max_retries=3)
>>> new_inner = partial(SparkXGBClassifier, label_col="cancelled_within_week", num_workers=1)
>>> raw, summary, history = fit_in_chunks(new_inner, assembled_train, plan)
>>> summary
{'run_id': 'run-1', 'checkpoint_dir': '.../run-1', 'resumed_from_round': None, 'retries': 0}
>>> history  # per-round validation values: none without validation rows
[]
>>> Checkpoints(plan.location, keep=3).latest()[0]  # rounds done at the newest checkpoint
4
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import xgboost
from py4j.protocol import Py4JError, Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame

from sparkdist import _internals, failpoints
from sparkdist.exceptions import FitStopped, ParamError, TrainingError
from sparkdist.launch import observe
from sparkdist.launch.barrier import worker_message
from sparkdist.launch.elastic import ElasticPlan
from sparkdist.launch.preflight import live_slots
from sparkdist.store import Checkpoints

_LOG = logging.getLogger(__name__)
BOOSTER_FORMAT = "ubj"
#: Built-in callbacks that keep per-training round counts, which restart in every chunk.
_ROUND_COUNTING = (xgboost.callback.EarlyStopping, xgboost.callback.LearningRateScheduler)
#: In a task's error, xgboost's collective code (allreduce, ...) reporting a lost peer.
_PEER_LOSS = "/collective/"
_JOB_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


@dataclass(frozen=True)
class ChunkPlan:
    """What a checkpointed fit does: ``rounds`` in all, in chunks of ``every``, its checkpoints
    under ``location`` (``keep`` newest kept), at most ``max_retries`` failed chunks retried."""

    location: str
    run_id: str
    rounds: int
    every: int
    keep: int
    max_retries: int
    #: minWorkers/slotWaitSeconds, and the configured num_workers: None keeps num_workers
    num_workers: int = 0
    elastic: ElasticPlan | None = None


def check_chunkable(rounds: int, early_stopping_rounds: int | None,
                    callbacks: list[Any] | None) -> None:
    """Refuse settings that chunked boosting would silently change.

    Raises
    ------
    ParamError
        For n_estimators < 1, early_stopping_rounds, or an EarlyStopping or
        LearningRateScheduler callback: each chunk is a new xgboost training whose round
        count (patience, schedule) starts again at 0.
    """
    if rounds < 1:
        raise ParamError(f"n_estimators={rounds}: use 1 or more.")
    why = ("a fit with checkpointDir boosts in chunks of checkpointEvery rounds, each a new "
           "xgboost training that counts rounds from 0 again")
    if early_stopping_rounds:
        raise ParamError(f"early_stopping_rounds={early_stopping_rounds} cannot be combined "
                         f"with checkpointDir: {why}, so early stopping would never see its "
                         "full patience. Unset early_stopping_rounds or checkpointDir.")
    counting = sorted({type(c).__name__ for c in callbacks or () if isinstance(c, _ROUND_COUNTING)})
    if counting:
        raise ParamError(f"callbacks {counting} cannot be combined with checkpointDir: {why}. "
                         "Drop those callbacks or unset checkpointDir.")


def chunk_end(done: int, rounds: int, every: int) -> int:
    """The round the chunk starting after ``done`` rounds ends at: the next multiple of
    ``every``, or ``rounds``.

    >>> [chunk_end(d, 10, 4) for d in (0, 4, 5, 8)]
    [4, 8, 8, 10]
    """
    return min(rounds, (done // every + 1) * every)


def fit_in_chunks(new_inner: Callable[[], Any], dataset: DataFrame, plan: ChunkPlan,
                  failpoint: failpoints.Failpoint | None = None
                  ) -> tuple[bytes, dict[str, Any], list[dict[str, Any]]]:
    """Boost ``plan.rounds`` rounds in checkpointed chunks, resuming and retrying as needed.

    Parameters
    ----------
    new_inner : makes the configured ``xgboost.spark`` estimator (one per chunk).
    dataset : the training rows; persisted for the fit when it takes several chunks.
    plan : rounds, chunking, checkpoint location and retry budget.
    failpoint : the estimator's armed failpoint (:mod:`sparkdist.failpoints`), else None.

    Returns
    -------
    The final booster as UBJSON; a summary: run_id, checkpoint_dir, resumed_from_round
    (rounds taken from an earlier fit's checkpoint, or None) and retries; and the history:
    one record per round this fit boosted (:func:`round_records`), [] without validation rows.

    Raises
    ------
    TrainingError
        When more than ``plan.max_retries`` chunks failed, with the last failure's cause.
    FitStopped
        When this thread's observer (:func:`sparkdist.launch.observe.current`) asked to stop,
        after the checkpoint of the chunk that holds that round was saved.
    """
    store = Checkpoints(plan.location, plan.keep)
    done, raw = _resume(store, plan)
    reporter = _Reporter(observe.current())
    # Per round, numbered from the start of the whole fit. Rounds resumed from an earlier
    # fit's checkpoint have no record (their values were not kept): the history starts at the
    # first round this fit boosted. A round boosted again after a retry replaces its record.
    history: dict[int, dict[str, Any]] = {}
    summary: dict[str, Any] = {"run_id": plan.run_id, "checkpoint_dir": plan.location,
                               "resumed_from_round": done or None, "retries": 0}
    if plan.elastic is not None:
        summary["worker_counts"] = []
    cache = dataset.storageLevel == StorageLevel.NONE and plan.rounds - done > plan.every
    if cache:
        dataset.persist(StorageLevel.MEMORY_AND_DISK)
    failed = False
    try:
        while done < plan.rounds:
            end = chunk_end(done, plan.rounds, plan.every)
            inner, workers = _chunk_inner(new_inner, dataset, plan, summary, failed)
            _note(plan, f"chunk of rounds {done + 1}-{end} on {workers} workers")
            try:
                raw, records = _fit_chunk(inner, dataset, raw, done, end, failpoint, workers,
                                          plan.elastic)
            except _ChunkFailed as err:
                _note(plan, f"chunk of rounds {done + 1}-{end} failed")
                summary["retries"] += 1
                _retry_or_raise(summary["retries"], plan, done, end, err)
                done, raw = _resume(store, plan)
                failed = True
                continue
            failed = False
            store.save(end, raw)
            _note(plan, f"{end} rounds done")
            _LOG.info("XGBoost run %s: %d of %d rounds done (checkpoint saved)", plan.run_id,
                      end, plan.rounds)
            history.update((record["epoch"], record) for record in records)
            done = end
            stop = reporter.stop_round(records)
            if stop is not None:
                _note(plan, f"stopped by its observer after round {stop}")
                raise FitStopped(f"XGBoost run {plan.run_id!r}: stopped by its observer after "
                                 f"round {stop} (its checkpoint after round {end} stays in "
                                 f"{plan.location})", epoch=stop, free_seconds=0.0)
    finally:
        if cache:
            dataset.unpersist()
    assert raw is not None  # rounds >= 1 (check_chunkable)
    return raw, summary, [history[n] for n in sorted(history)]


def round_records(training_summary: Any, first_round: int = 0) -> list[dict[str, Any]]:
    """One record per boosting round of an ``xgboost.spark`` fit with validation rows, from
    its model's ``training_summary``: ``epoch`` (``first_round`` + 1, ...), ``loss`` and each
    training metric by xgboost's name, ``val_loss`` and ``val_<name>`` for each validation
    metric (``val_loss``: the first metric's value); [] without validation rows.

    >>> from xgboost.spark.summary import XGBoostTrainingSummary
    >>> round_records(XGBoostTrainingSummary({"logloss": [0.6, 0.5]},
    ...                                      {"logloss": [0.65, 0.58]}), first_round=4)[-1]
    {'epoch': 6, 'loss': 0.5, 'logloss': 0.5, 'val_loss': 0.58, 'val_logloss': 0.58}
    """
    validation = dict(getattr(training_summary, "validation_objective_history", None) or {})
    if not validation:
        return []
    training = dict(getattr(training_summary, "train_objective_history", None) or {})
    records = []
    for index in range(max(len(values) for values in validation.values())):
        record: dict[str, Any] = {"epoch": first_round + index + 1}
        for prefix, metrics in (("", training), ("val_", validation)):
            values = {name: float(series[index]) for name, series in metrics.items()
                      if index < len(series)}
            if values:
                record[f"{prefix}loss"] = next(iter(values.values()))
                record.update((f"{prefix}{name}", value) for name, value in values.items())
        records.append(record)
    return records


class _Reporter:
    """A checkpointed fit's rounds for this thread's observer, each round once and in order
    (rounds boosted again after a retry were reported already). An observer that raises is
    logged and ignored, as :class:`sparkdist.launch.observe.Stopper` does: watching must not
    fail the fit."""

    def __init__(self, observer: observe.Observer | None) -> None:
        self.observer, self.reported = observer, 0

    def stop_round(self, records: list[dict[str, Any]]) -> int | None:
        """Report ``records``; the round after which the observer asked to stop, or None."""
        if self.observer is None:
            return None
        for record in records:
            if record["epoch"] <= self.reported:
                continue
            self.reported = record["epoch"]
            try:
                stop = self.observer(dict(record))
            except Exception as err:
                _LOG.warning("the fit's observer failed on %s (%s); the fit goes on", record,
                             err)
                continue
            if stop:
                return int(record["epoch"])
        return None


def _note(plan: ChunkPlan, what: str) -> None:
    """On the elastic plan's timeline (measurements of the recovery), where there is one."""
    if plan.elastic is not None:
        plan.elastic.note(what)


def _chunk_inner(new_inner: Callable[[], Any], dataset: DataFrame, plan: ChunkPlan,
                 summary: dict[str, Any], after_failure: bool) -> tuple[Any, int | None]:
    """The next chunk's xgboost.spark estimator, and the workers it runs on where the fit is
    elastic (None otherwise): the most the free slots allow (waiting, bounded, for
    ``min_workers``); recorded in ``summary["worker_counts"]`` on a retry or a change."""
    inner = new_inner()
    elastic = plan.elastic
    if elastic is None:
        return inner, None
    workers = _chunk_workers(dataset.sparkSession, plan, elastic)
    counts = summary["worker_counts"]
    if not counts or after_failure or counts[-1] != workers:
        counts.append(workers)
    if workers != plan.num_workers:  # xgboost.spark repartitions to its num_workers
        inner._set(num_workers=workers, force_repartition=True)
    return inner, workers


def _chunk_workers(spark: Any, plan: ChunkPlan, elastic: ElasticPlan) -> int:
    """The most workers within [min_workers, num_workers] the task slots allow now; waits up
    to ``slot_wait_s`` for them, then raises the shortage TrainingError."""
    deadline = time.monotonic() + elastic.slot_wait_s
    while True:
        slots = live_slots(spark)
        if slots is None:  # the scheduler cannot be asked: as configured
            return plan.num_workers
        workers = elastic.best_world(slots, plan.num_workers)
        if workers is not None:
            return workers
        if time.monotonic() >= deadline:
            raise elastic.shortage(elastic.min_workers, slots)
        time.sleep(0.5)


class _ChunkFailed(Exception):
    """A chunk's training job failed; the message is its root cause (see _root_cause)."""


def _resume(store: Checkpoints, plan: ChunkPlan) -> tuple[int, bytes | None]:
    """(rounds done, booster) from the newest intact checkpoint, or (0, None)."""
    latest = store.latest()
    if latest is None:
        return 0, None
    step, raw = latest
    if step > plan.rounds:
        raise ParamError(f"runId={plan.run_id!r} already has a checkpoint after {step} rounds, "
                         f"more than n_estimators={plan.rounds}; set n_estimators={step} or "
                         "more to continue it, or use a new runId.")
    _LOG.info("XGBoost run %s resumes from its checkpoint after %d rounds", plan.run_id, step)
    return step, raw


def _fit_chunk(inner: Any, dataset: DataFrame, raw: bytes | None, done: int, end: int,
               failpoint: failpoints.Failpoint | None, workers: int | None = None,
               elastic: ElasticPlan | None = None) -> tuple[bytes, list[dict[str, Any]]]:
    """Boost rounds ``done+1..end`` on top of ``raw`` (None: from scratch); the new booster
    and its rounds' records (:func:`round_records`). Raises _ChunkFailed when a Spark job
    of the chunk fails, or (``workers`` given: an elastic fit) when the task slots drop below
    ``workers`` while it runs."""
    inner._set(n_estimators=end - done)
    if raw is not None:
        inner._set(xgb_model=_load(raw))
    if failpoint:
        callbacks = inner.getOrDefault("callbacks") or []
        inner._set(callbacks=[*callbacks, _FailpointCallback(failpoint, done)])
    sc = dataset.sparkSession.sparkContext
    with _job_group(sc, f"sparkdist XGBoost rounds {done + 1}-{end}") as group, \
            _slot_watch(dataset.sparkSession, group, workers, elastic) as lost:
        try:
            fitted = inner.fit(dataset)
        except (Py4JJavaError, PySparkException) as err:  # a failed job
            if lost:
                raise _ChunkFailed(f"the task slots dropped to {lost[0]}, below the chunk's "
                                   f"{workers} workers (an executor is gone); its job was "
                                   "cancelled") from err
            raise _ChunkFailed(_root_cause(sc, group, err)) from err
    return (bytes(fitted.get_booster().save_raw(BOOSTER_FORMAT)),
            round_records(getattr(fitted, "training_summary", None), done))


def _load(raw: bytes) -> Any:
    booster = xgboost.Booster()
    booster.load_model(bytearray(raw))
    return booster


def _retry_or_raise(failures: int, plan: ChunkPlan, done: int, end: int,
                    failed: _ChunkFailed) -> None:
    """Log a failed chunk that will be retried, or raise once the retries are used up."""
    if failures > plan.max_retries:
        raise TrainingError(
            f"XGBoost training failed on the executors: gave up after {failures} failed "
            f"attempt(s) (maxRetries={plan.max_retries}); the last one boosted rounds "
            f"{done + 1}-{end} of run {plan.run_id!r}, whose checkpoints stay in "
            f"{plan.location}. The last failure: {failed}") from failed.__cause__
    _LOG.warning("XGBoost rounds %d-%d failed (retry %d of maxRetries=%d); resuming from the "
                 "newest checkpoint. The failure: %s", done + 1, end, failures,
                 plan.max_retries, _last_line(str(failed)))


@contextlib.contextmanager
def _slot_watch(spark: Any, group: str, workers: int | None,
                elastic: ElasticPlan | None = None) -> Iterator[list[int]]:
    """While the block runs, cancel the job group ``group`` once the task slots drop below
    ``workers`` (None: no watch); the list yielded gets the slot count that ended it."""
    lost: list[int] = []
    if workers is None:
        yield lost
        return
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.5):
            slots = live_slots(spark)
            if slots is not None and slots < workers:
                lost.append(slots)
                if elastic is not None:
                    elastic.note(f"{slots} task slots for {workers} workers")
                _LOG.warning("XGBoost chunk: %d task slots left for %d workers; cancelling "
                             "its job to re-plan", slots, workers)
                spark.sparkContext.cancelJobGroup(group)
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield lost
    finally:
        stop.set()


# -- root cause of a failed chunk ------------------------------------------------------------
@contextlib.contextmanager
def _job_group(sc: Any, description: str) -> Iterator[str]:
    """Run the enclosed Spark jobs in a new job group; restore the caller's group after."""
    saved = [sc.getLocalProperty(key) for key in _JOB_PROPERTIES]
    group = f"sparkdist-xgboost-{uuid.uuid4().hex[:12]}"
    sc.setJobGroup(group, description)
    try:
        yield group
    finally:
        for key, value in zip(_JOB_PROPERTIES, saved):
            sc.setLocalProperty(key, value)


def _root_cause(sc: Any, group: str, err: BaseException) -> str:
    """The failure that started the group's failed jobs, as far as Spark recorded it."""
    try:
        ended = _ended_tasks(sc, group)
    except (Py4JError, AttributeError) as lookup:  # the status store is Spark-internal
        _LOG.debug("no task failures from Spark's status store: %s", lookup)
        ended = []
    return _cause(ended, str(err))


def _cause(ended: list[tuple[str, int, str]], job_error: str) -> str:
    """The first failed task's error that is not xgboost's collective reporting a lost peer.
    When every failure is such a symptom, the rank that started it was killed by Spark's
    barrier cancellation before its own error reached the driver (a race Spark settles
    either way): say which ranks were killed, whose executor logs hold it. Else the job's
    own error."""
    failures = [message for status, _, message in ended if status == "FAILED" and message]
    own = [message for message in failures if _PEER_LOSS not in message]
    killed = _ranks(ended, "KILLED")
    if own or not failures or not killed:
        return worker_message((own or failures or [job_error])[0])
    return (f"rank(s) {_ranks(ended, 'FAILED')} lost a peer in xgboost's collective "
            f"({_collective_reason(failures[0])}), and Spark killed the task(s) of rank(s) "
            f"{killed} before they reported their own error: the failure that started it is "
            "in the executor log of one of those ranks")


def _ranks(ended: list[tuple[str, int, str]], status: str) -> str:
    """The ranks whose tasks ended with ``status``, as "0, 2"."""
    return ", ".join(str(rank) for rank in sorted({rank for s, rank, _ in ended if s == status}))


def _collective_reason(message: str) -> str:
    """The first cause in xgboost's collective error (its lines read ``- [file:line|time]:
    cause``)."""
    found = re.search(r"^- \[[^\]]+\]: (.+)$", message, re.MULTILINE)
    return found.group(1).strip() if found else "a lost peer"


def _ended_tasks(sc: Any, group: str, wait_s: float = 15.0) -> list[tuple[str, int, str]]:
    """(status, partition index = xgboost rank, error message) of the tasks that failed or
    were killed in the group's failed jobs, first to end first. Spark's status store is
    updated asynchronously: waits (at most ``wait_s``) until the group's jobs and their
    stages' tasks are no longer running."""
    tracker, store = sc.statusTracker(), _internals.java_spark_context(sc).statusStore()
    deadline = time.monotonic() + wait_s
    jobs = _settled(lambda: [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)],
                    lambda infos: all(info is None or info.status != "RUNNING"
                                      for info in infos),
                    deadline)
    ended: list[tuple[int, str, int, str]] = []
    for stage_id in (stage for job in jobs if job and job.status == "FAILED"
                     for stage in job.stageIds):
        stage = tracker.getStageInfo(stage_id)
        if stage is None or stage.numTasks == 0:
            continue
        ended += [(task.launchTime().getTime() + _option(task.duration(), 0), task.status(),
                   task.index(), _option(task.errorMessage(), ""))
                  for task in _stage_tasks(store, stage, deadline)
                  if task.status() in ("FAILED", "KILLED")]
    return [(status, rank, message) for _, status, rank, message in sorted(ended)]


def _stage_tasks(store: Any, stage: Any, deadline: float) -> list[Any]:
    """The tasks (JVM TaskData) of a stage attempt, once none of them is running."""
    def fetch() -> list[Any]:
        tasks = store.taskList(stage.stageId, stage.currentAttemptId, stage.numTasks)
        return [tasks.apply(i) for i in range(tasks.size())]

    return _settled(fetch, lambda found: all(task.status() != "RUNNING" for task in found),
                    deadline)


def _settled(fetch: Callable[[], list[Any]], ready: Callable[[list[Any]], bool],
             deadline: float) -> list[Any]:
    """``fetch()`` again every 0.1 s until ``ready`` holds for it or the deadline passes."""
    while True:
        found = fetch()
        if ready(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _option(value: Any, default: Any) -> Any:
    """A Scala Option's value, or ``default``."""
    return value.get() if value.isDefined() else default


def _last_line(message: str) -> str:
    """The last informative line of a failure message (the exception, for a traceback)."""
    lines = [line.strip() for line in message.splitlines()
             if line.strip() and not line.strip().startswith("SQLSTATE")]
    return lines[-1] if lines else message


class _FailpointCallback(xgboost.callback.TrainingCallback):
    """The ``xgboost.round`` failpoint, added only when one is armed: after each boosting round,
    numbered from the start of the whole fit (1-based)."""

    def __init__(self, failpoint: failpoints.Failpoint, first_round: int) -> None:
        super().__init__()
        self.failpoint, self.first_round = failpoint, first_round

    def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
        failpoints.hit(self.failpoint, "xgboost.round", xgboost.collective.get_rank(),
                       self.first_round + epoch + 1)
        return False
