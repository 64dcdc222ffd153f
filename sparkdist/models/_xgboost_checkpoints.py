"""Checkpointed XGBoost fits: boosting in chunks of ``checkpointEvery`` rounds.

Each chunk is one ``xgboost.spark`` fit with ``n_estimators`` = the chunk's rounds and
``xgb_model`` = the booster so far (xgboost then boosts that many rounds *more*). After each
chunk the booster is saved as UBJSON in :class:`sparkdist.store.Checkpoints`, with the number
of rounds done as the step. A chunk that fails (its barrier stage is never retried by Spark)
is run again from the newest intact checkpoint, at most ``maxRetries`` times in all; a fit
started with the runId of an earlier one continues from that run's newest checkpoint.

Chunk boundaries are the multiples of ``checkpointEvery`` (and ``n_estimators``), whatever
the history of failures and re-runs, so a resumed fit rebuilds exactly the same chunks. Without
row or column sampling the result is the same booster as one uninterrupted fit.

This module imports xgboost: import it only inside a fit.

Examples
--------
>>> plan = ChunkPlan(location="/ckpt/run-1", run_id="run-1", rounds=100, every=10, keep=3,
...                  max_retries=3)
>>> raw, summary = fit_in_chunks(lambda: SparkXGBClassifier(num_workers=2), train, plan)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import xgboost
from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame

from sparkdist.exceptions import ParamError, TrainingError
from sparkdist.launch.barrier import worker_message
from sparkdist.store import Checkpoints
from sparkdist.testing import trip

_LOG = logging.getLogger(__name__)
BOOSTER_FORMAT = "ubj"
#: Built-in callbacks that keep per-training round counts, which restart in every chunk.
_ROUND_COUNTING = (xgboost.callback.EarlyStopping, xgboost.callback.LearningRateScheduler)


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
                  fault: dict[str, Any] | None = None) -> tuple[bytes, dict[str, Any]]:
    """Boost ``plan.rounds`` rounds in checkpointed chunks, resuming and retrying as needed.

    Parameters
    ----------
    new_inner : makes the configured ``xgboost.spark`` estimator (one per chunk).
    dataset : the training rows; persisted for the fit when it takes several chunks.
    plan : rounds, chunking, checkpoint location and retry budget.
    fault : a test's injected fault (:func:`sparkdist.testing.inject_fault`), else None.

    Returns
    -------
    The final booster as UBJSON, and a summary: run_id, checkpoint_dir,
    resumed_from_round (rounds taken from an earlier fit's checkpoint, or None) and retries.

    Raises
    ------
    TrainingError
        When more than ``plan.max_retries`` chunks failed, with the last failure's cause.
    """
    store = Checkpoints(plan.location, plan.keep)
    done, raw = _resume(store, plan)
    summary: dict[str, Any] = {"run_id": plan.run_id, "checkpoint_dir": plan.location,
                               "resumed_from_round": done or None, "retries": 0}
    cache = dataset.storageLevel == StorageLevel.NONE and plan.rounds - done > plan.every
    if cache:
        dataset.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        while done < plan.rounds:
            end = chunk_end(done, plan.rounds, plan.every)
            try:
                raw = _fit_chunk(new_inner(), dataset, raw, done, end, fault)
            except (Py4JJavaError, PySparkException) as err:  # a failed training job
                summary["retries"] += 1
                _retry_or_raise(summary["retries"], plan, done, end, err)
                done, raw = _resume(store, plan)
                continue
            store.save(end, raw)
            done = end
    finally:
        if cache:
            dataset.unpersist()
    assert raw is not None  # rounds >= 1 (check_chunkable)
    return raw, summary


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
               fault: dict[str, Any] | None) -> bytes:
    """Boost rounds ``done+1..end`` on top of ``raw`` (None: from scratch); the new booster."""
    inner._set(n_estimators=end - done)
    if raw is not None:
        inner._set(xgb_model=_load(raw))
    if fault:
        callbacks = inner.getOrDefault("callbacks") or []
        inner._set(callbacks=[*callbacks, _FaultCallback(fault, done)])
    fitted = inner.fit(dataset)
    return bytes(fitted.get_booster().save_raw(BOOSTER_FORMAT))


def _load(raw: bytes) -> Any:
    booster = xgboost.Booster()
    booster.load_model(bytearray(raw))
    return booster


def _retry_or_raise(failures: int, plan: ChunkPlan, done: int, end: int,
                   err: BaseException) -> None:
    """Log a failed chunk that will be retried, or raise once the retries are used up."""
    cause = worker_message(err)
    if failures > plan.max_retries:
        raise TrainingError(
            f"XGBoost training failed on the executors: gave up after {failures} failed "
            f"attempt(s) (maxRetries={plan.max_retries}); the last one boosted rounds "
            f"{done + 1}-{end} of run {plan.run_id!r}, whose checkpoints stay in "
            f"{plan.location}. The last failure: {cause}") from err
    _LOG.warning("XGBoost rounds %d-%d failed (retry %d of maxRetries=%d); resuming from the "
                 "newest checkpoint. The failure: %s", done + 1, end, failures,
                 plan.max_retries, _last_line(cause))


def _last_line(message: str) -> str:
    """The last informative line of a failed job's message (the exception, for a traceback)."""
    lines = [line.strip() for line in message.splitlines()
             if line.strip() and not line.strip().startswith("SQLSTATE")]
    return lines[-1] if lines else message


class _FaultCallback(xgboost.callback.TrainingCallback):
    """Test hook for :func:`sparkdist.testing.inject_fault`, added only when a test set a
    fault: after each boosting round, trips the fault with ``epoch`` = that round's number
    counted from the start of the whole fit (1-based) and ``step`` = 0."""

    def __init__(self, fault: dict[str, Any], first_round: int) -> None:
        super().__init__()
        self.fault, self.first_round = fault, first_round

    def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
        trip(self.fault, xgboost.collective.get_rank(), epoch=self.first_round + epoch + 1)
        return False
