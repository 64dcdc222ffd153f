"""The one place where sparkdist starts a Spark barrier stage of its own (TorchEstimator's
fits and the GPU scheduling check; XGBoost's barrier stage is xgboost.spark's).

``run_barrier(df, worker, args, num_workers)`` runs the module-level function
``worker(context, batches, args)`` in ``num_workers`` barrier tasks, one per partition of
``df``, and returns the bytes that rank 0 returned. Around that call:

- The stage ends in a shuffle (``.repartition(1)`` before the collect), which makes it a
  ShuffleMapStage: Spark retries a failed barrier stage as a whole, where a barrier stage that
  ends in a collect is never retried ("Could not recover from a failed barrier ResultStage",
  Spark 4.3).
- Rendezvous is one gather per attempt: rank 0 first starts the backend's rendezvous server
  on port 0 (torch's ``TCPStore``, Horovod's HTTP store), then every task learns its host and
  port, and each rank's host and executor id (the fit's ``placement``). With a local master
  (the executors on the driver's host) the gather goes through the driver's report socket
  and returns as soon as the last rank arrives; elsewhere it is Spark's ``allGather``, which
  costs at least a second: the JVM's ``BarrierTaskContext`` checks its RPC once a second
  (``Thread.sleep(1000)``, Spark 4.3). Nothing else uses Spark's barrier calls. The Spark
  conf ``spark.sparkdist.rendezvous`` (:data:`RENDEZVOUS_CONF`, read at each fit) picks the
  path: ``auto`` (the default, as above), ``driver`` or ``spark`` (always ``allGather``: the
  path clusters take, so that a local test runs it too).
- Every wait is bounded: the rendezvous (on the executors), the collectives (the backend's
  own timeout, from ``collective_timeout_s``) and the whole job (cancelled on the driver:
  its job group on classic Spark, its session tag, ``spark.interruptTag``, on Spark Connect;
  classic ``interruptTag`` only sees the tags of the calling thread, so a timer cannot use it).
- Rank 0 may send progress records (small dicts) to the driver while the stage runs, over a
  socket the driver listens on (:mod:`sparkdist.launch.report`); ``on_report`` receives them
  in a driver thread. Any process that reaches the driver host can connect to it, so each fit
  draws a random token (``secrets``) that travels to the tasks inside the task closure; a
  connection whose first line does not bring it within 10 s, lines over 64 KiB and
  authenticated connections beyond ``2 * num_workers + 4`` are dropped, counted and logged
  once. Failure reports can therefore only come from the fit's own tasks, and idle
  connections take no slot of theirs. The token is as secret as Spark's task traffic:
  encrypted only where Spark's RPC is.
- Spark Connect: the stage is launched with DataFrame calls only (no SparkContext, no RDD).
  The executors can reach the client only when the Connect server and its executors run on
  the client's host (``local[...]`` masters): then progress and failure reports work as on
  classic Spark; elsewhere there is no report channel (``on_report`` is not called).
  ``max_retries`` is enforced from the ranks' failure reports there (the status tracker is
  classic-only), so on a remote Connect server only Spark's own
  ``spark.stage.maxConsecutiveAttempts`` bounds the retries.
- Results travel as bytes; on classic Spark the collect brings them inside a pickle stream
  that Spark's JVM writes (pyspark unpickles that; a rank's bytes are only its values, never
  pickle code). A failure becomes a :class:`TrainingError` carrying the failed worker's
  message and output tail.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import logging
import os
import secrets
import shutil
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkdist.exceptions import ClusterConfigError, FitStopped, TrainingError
from sparkdist.launch import observe
from sparkdist.launch.attempts import INPUT_ERRORS, Attempts, Fit, Launch, cancel, tasks_ended
from sparkdist.launch.elastic import supervise
from sparkdist.launch.executor import executor_id, make_scratch
from sparkdist.launch.report import FIRST_LINE_S, REPORT_LINE_LIMIT, report_server
from sparkdist.session import is_connect

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

_LOG = logging.getLogger(__name__)
_CHUNK = 64 << 20  # result bytes per output row, far below Arrow's 2 GiB cell limit
_RESULT_SCHEMA = "part INT, payload BINARY"
_LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
#: Counted by tests and bench: the Spark barrier syncs a fit makes (the rendezvous only).
SYNC_LOG_PREFIX = "sparkdist barrier sync"
#: Logged instead where the rendezvous goes through the driver (no Spark barrier sync).
DRIVER_RENDEZVOUS_LOG_PREFIX = "sparkdist rendezvous through the driver"
#: The Spark conf that picks the rendezvous path: auto (the default), driver or spark.
RENDEZVOUS_CONF = "spark.sparkdist.rendezvous"
RENDEZVOUS_PATHS = ("auto", "driver", "spark")
#: Set to 1 in the tasks' environment (in local mode: the driver's, before its JVM starts) and
#: ranks keep their log lines for the error report without printing them: the make demo, whose
#: local tasks print on the driver's console.
ENV_QUIET_RANKS = "SPARKDIST_QUIET_RANKS"
#: How long a stopped fit waits for its cancelled tasks to end before it raises anyway.
STOP_WAIT_S = 60.0
#: How long rank 0 waits for the driver's answer to an asking report (the observer's call).
ASK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class BarrierSettings:
    """Plain values the executor side needs (shipped with the task, never ``self``)."""

    rendezvous_timeout_s: float = 120.0
    collective_timeout_s: float = 600.0
    report_address: tuple[str, int] | None = None
    #: This fit's secret: the driver drops every report that does not carry it.
    report_token: str = ""
    env: dict[str, str] = field(default_factory=dict)
    #: Gather the rendezvous through the driver's report socket, not Spark's allGather (set
    #: by :func:`run_barrier` where every executor reaches the driver: local masters).
    driver_rendezvous: bool = False
    #: Which launch of the fit this stage is (0, then 1, 2... where an elastic fit re-plans):
    #: the driver drops the reports of an earlier launch's ranks.
    launch: int = 0
    #: The fit runs under an observer (:mod:`sparkdist.launch.observe`): rank 0 asks the
    #: driver after each epoch whether to stop (:meth:`WorkerContext.report` with ``ask``).
    observed: bool = False


@dataclass(frozen=True)
class Rendezvous:
    """What every rank learns from the single allGather."""

    master_addr: str
    ports: tuple[int, ...]
    hosts: tuple[str, ...]
    executors: tuple[str, ...] = ()

    def placement(self) -> list[dict[str, Any]]:
        """Where each rank ran: ``[{"rank": 0, "executor_id": "1", "host": "10.0.0.5"}, ...]``
        (``executor_id`` is "driver" in local mode)."""
        return [{"rank": rank, "executor_id": executor, "host": host}
                for rank, (executor, host) in enumerate(zip(self.executors, self.hosts))]


class WorkerContext:
    """A barrier task's view: rank, world size, resources, rendezvous, progress, output tail."""

    def __init__(self, task: Any, settings: BarrierSettings) -> None:
        self._task = task
        self.settings = settings
        self.rank: int = task.partitionId()
        self.world_size: int = len(task.getTaskInfos())
        self.cpus: int = task.cpus()
        self.gpus: tuple[str, ...] = _gpu_addresses(task)
        self._tail: collections.deque[str] = collections.deque(maxlen=40)
        self._report_socket: socket.socket | None = None
        self._answers: Any = None  # the driver's answers to asking reports, line by line
        self._failure_reported = False
        #: Each rank's executor id and host, once :meth:`rendezvous` has run.
        self.placement: list[dict[str, Any]] = []
        self.scratch = make_scratch(self.rank)
        #: Names this stage attempt in failure reports: the lowest task id of the attempt once
        #: the rendezvous told it, this task's id before (ids of a retry are all higher).
        self.attempt_key: int = task.taskAttemptId()

    def rendezvous(self, listen: Callable[[str], list[int]] | None = None) -> Rendezvous:
        """One gather (bounded wait): every rank learns rank 0's host, the ports of the
        servers rank 0 started before it with ``listen(host)``, and each rank's host and
        executor. ``listen`` binds port 0 and returns the ports the OS gave: no port is
        reserved, released and bound again (where another process could take it). Through
        the driver where ``settings.driver_rendezvous`` (:meth:`_gather_via_driver`), else
        Spark's allGather."""
        host = self._task.getTaskInfos()[self.rank].address.rsplit(":", 1)[0]
        ports = listen(host) if self.rank == 0 and listen is not None else []
        message = json.dumps({"host": host, "ports": ports, "task": self.attempt_key,
                              "executor": executor_id()})
        via_driver = self.settings.driver_rendezvous and self.settings.report_address
        prefix = DRIVER_RENDEZVOUS_LOG_PREFIX if via_driver else SYNC_LOG_PREFIX
        self.log(f"{prefix}: rendezvous of {self.world_size} (task attempt "
                 f"{self._task.taskAttemptId()})")
        gather = ((lambda: self._gather_via_driver(message)) if via_driver
                  else (lambda: self._task.allGather(message)))
        gathered = _with_timeout(gather, self.settings.rendezvous_timeout_s,
                                 f"rank {self.rank}: not every one of the {self.world_size} "
                                 f"workers reached the rendezvous within "
                                 f"{self.settings.rendezvous_timeout_s:.0f} s")
        peers = [json.loads(item) for item in gathered]
        self.attempt_key = min(peer["task"] for peer in peers)
        found = Rendezvous(master_addr=peers[0]["host"], ports=tuple(peers[0]["ports"]),
                           hosts=tuple(peer["host"] for peer in peers),
                           executors=tuple(peer["executor"] for peer in peers))
        self.placement = found.placement()
        if self.rank == 0:  # the driver's worker-count history: one entry per attempt
            self.report({"started": self.world_size, "launch": self.settings.launch})
        return found

    def _gather_via_driver(self, message: str) -> list[str]:
        """Every rank's ``message`` of this stage attempt, by rank, from the driver: one
        signed line out, one line back once the last rank's line has arrived."""
        address = self.settings.report_address
        assert address is not None
        record = {"rendezvous": message, "key": str(self._task.stageId()), "rank": self.rank,
                  "world_size": self.world_size, "task": self._task.taskAttemptId()}
        with socket.create_connection(address, timeout=FIRST_LINE_S) as connection:
            connection.sendall(self._signed(record))
            connection.settimeout(None)  # the caller bounds the wait
            with connection.makefile("rb") as lines:
                reply = lines.readline()
        if not reply:
            raise ConnectionError(f"rank {self.rank}: the driver closed the rendezvous "
                                  f"connection ({address[0]}:{address[1]})")
        return [str(item) for item in json.loads(reply)]

    def log(self, message: str) -> None:
        """Print to the executor's stderr (unless ``$SPARKDIST_QUIET_RANKS`` is 1) and keep the
        line for the error tail."""
        line = f"[sparkdist rank {self.rank}] {message}"
        self._tail.append(line)
        if os.environ.get(ENV_QUIET_RANKS) != "1":
            print(line, file=sys.stderr, flush=True)

    def tail(self) -> str:
        return "\n".join(self._tail)

    def report(self, record: dict[str, Any], ask: bool = False) -> bool:
        """Send a progress record to the driver (rank 0 only; best effort, never fails). With
        ``ask`` (a fit under an observer), wait for the driver's answer: whether the fit is to
        stop (False on the other ranks, and where the driver cannot answer: then rank 0 stops
        asking, and the driver falls back to cancelling the job)."""
        address = self.settings.report_address
        if self.rank != 0 or address is None:
            return False
        ask = ask and self.settings.observed
        try:
            if self._report_socket is None:
                self._report_socket = socket.create_connection(address, timeout=5)
                self._answers = self._report_socket.makefile("rb")
            self._report_socket.sendall(self._signed({**record, "ask": True} if ask else record))
            if ask:
                self._report_socket.settimeout(ASK_TIMEOUT_S)
                return bool(json.loads(self._answers.readline() or b"{}").get("stop"))
        except (OSError, ValueError) as err:
            self.log(f"progress report to the driver failed ({err}); training goes on")
            self.settings = BarrierSettings(**{**self.settings.__dict__,
                                               "report_address": None, "observed": False})
        return False

    def failure_message(self, err: BaseException) -> str:
        """What the driver and the user see of this rank's failure: the error, where it was
        raised, and the tail of this rank's output."""
        where = traceback.extract_tb(err.__traceback__)[-1]
        return (f"rank {self.rank} of {self.world_size} failed: {type(err).__name__}: {err} "
                f"(at {where.filename}:{where.lineno})\n"
                f"--- output tail of rank {self.rank} ---\n{self.tail()}")

    def report_failure(self, err: BaseException) -> None:
        """Tell the driver why this rank failed (any rank, once; best effort). A worker may
        report before its own cleanup, so that the root cause arrives before its peers'
        reports of the lost connection. A bad input (:data:`INPUT_ERRORS`: the data or a
        Param) travels with its type and message: the driver raises it as is, at once, since
        a retry would read the same input."""
        address = self.settings.report_address
        if address is None or self._failure_reported:
            return
        self._failure_reported = True
        record: dict[str, Any] = {"failure": self.failure_message(err), "rank": self.rank,
                                  "attempt": self.attempt_key, "world_size": self.world_size,
                                  "launch": self.settings.launch}
        if type(err) in INPUT_ERRORS:
            record["input_error"] = {"type": type(err).__name__, "message": str(err)}
        with contextlib.suppress(OSError), \
                socket.create_connection(address, timeout=5) as connection:
            connection.sendall(self._signed(record))

    def _signed(self, record: dict[str, Any]) -> bytes:
        """One report line with this fit's token, cut to fit the driver's line limit."""
        line = json.dumps({**record, "token": self.settings.report_token})
        if len(line) >= REPORT_LINE_LIMIT and "failure" in record:  # keep the message's end
            cut = {**record, "failure": "..." + str(record["failure"])[-(REPORT_LINE_LIMIT // 8):]}
            line = json.dumps({**cut, "token": self.settings.report_token})
        return (line + "\n").encode()

    def close(self) -> None:
        if self._report_socket is not None:
            with contextlib.suppress(OSError):
                self._report_socket.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


Worker = Callable[[WorkerContext, Iterator["pa.RecordBatch"], Any],
                 "bytes | memoryview | None"]


def run_barrier(df: DataFrame, worker: Worker, args: Any, num_workers: int, *,
                settings: BarrierSettings | None = None, timeout_s: float | None = None,
                description: str = "sparkdist barrier stage",
                on_report: Callable[[dict[str, Any]], None] | None = None,
                max_retries: int | None = None, elastic: Any = None) -> bytes:
    """Run ``worker`` in ``num_workers`` barrier tasks over ``df``; return rank 0's bytes.

    Parameters
    ----------
    df : the input; repartitioned to ``num_workers`` partitions unless it has that many.
    worker : a module-level function ``(context, batches, args) -> bytes | None``.
    args : plain, picklable values for the worker (read every Param into it on the driver).
    num_workers : the number of barrier tasks (check the task slots first: preflight).
    settings : timeouts and environment for the tasks.
    timeout_s : cancel the whole job after this many seconds (None: no limit).
    description : the Spark job description shown in the UI.
    on_report : called in a driver thread with each progress record rank 0 sends.
    max_retries : give up once this many retries of the stage have failed as well (None:
        Spark's own limit, ``spark.stage.maxConsecutiveAttempts``).
    elastic : a :class:`sparkdist.launch.elastic.ElasticPlan` (minWorkers, slotWaitSeconds):
        a restart finding fewer task slots than ``num_workers`` re-plans the fit on the slots
        there are (classic Spark); None: Spark's retries only, however long they wait.

    Raises
    ------
    TrainingError : a task failed (after the retries) or the job timed out; it carries the
        last failure's message and output tail.

    Examples
    --------
    >>> def count_rows(context, batches, args):
    ...     rows = sum(batch.num_rows for batch in batches)
    ...     message = f"{args['name']}: rank {context.rank} of {context.world_size}, {rows} rows"
    ...     return message.encode()
    >>> run_barrier(df, count_rows, {"name": "churn"}, num_workers=2)
    b'churn: rank 0 of 2, 1000 rows'
    """
    settings = settings or BarrierSettings()
    spark = df.sparkSession
    fit = Fit(max_retries, on_report, elastic)
    stopper = _stopper(spark, fit)
    token = secrets.token_hex(16)  # reaches the tasks inside the task closure, via Spark
    with report_server(_driver_host(df), token, fit.dispatch,
                       max_connections=2 * num_workers + 4) as address:
        if address is None and is_connect(spark) and max_retries is not None:
            _LOG.warning("%s: the executors cannot reach this Spark Connect client, so "
                         "maxRetries=%s is not enforced; spark.stage.maxConsecutiveAttempts "
                         "on the server bounds the retries.", description, max_retries)
        task_settings = BarrierSettings(**{**settings.__dict__, "report_address": address,
                                           "report_token": token,
                                           "driver_rendezvous":
                                           _through_driver(spark, address),
                                           "observed": stopper is not None})
        launch = functools.partial(_launch, df, worker, task_settings, description, fit)
        try:
            if elastic is None:
                rows = launch(args, num_workers, timeout_s, 0)
            else:
                rows = supervise(spark, launch, args, num_workers, elastic, timeout_s, fit)
        except TrainingError:
            if stopper is None or stopper.decided_at is None:
                raise
            raise _stopped(spark, fit, stopper, description) from None
        if stopper is not None and stopper.decided_at is not None:  # the ranks stopped
            raise FitStopped(f"{description}: stopped by its observer after epoch "
                             f"{stopper.epoch}", epoch=stopper.epoch,
                             free_seconds=time.monotonic() - stopper.decided_at)
    if not rows:
        raise TrainingError("the barrier stage finished but rank 0 returned no result.")
    return b"".join(row["payload"] for row in sorted(rows, key=lambda row: row["part"]))


def _stopper(spark: Any, fit: Fit) -> observe.Stopper | None:
    """Where this thread fits under an observer (:mod:`sparkdist.launch.observe`): the
    report callback that may cancel the fit's current launch."""
    observer = observe.current()
    if observer is None:
        return None

    def cancel_current() -> None:
        if fit.current is not None:
            cancel(spark, fit.current.tag)

    fit.on_report = observe.Stopper(observer, fit.on_report, cancel_current)
    return fit.on_report


def _stopped(spark: Any, fit: Fit, stopper: observe.Stopper,
             description: str) -> FitStopped:
    """The error of a fit its observer stopped, once its tasks have ended (so their slots are
    free when the caller goes on)."""
    tag = fit.current.tag if fit.current is not None else ""
    ended = tasks_ended(spark, tag, limit_s=STOP_WAIT_S)
    assert stopper.decided_at is not None
    free_s = time.monotonic() - stopper.decided_at if ended else None
    return FitStopped(f"{description}: stopped by its observer after epoch {stopper.epoch}",
                      epoch=stopper.epoch, free_seconds=free_s)


def _launch(df: DataFrame, worker: Worker, settings: BarrierSettings, description: str,
            fit: Fit, args: Any, world: int, timeout_s: float | None,
            number: int) -> list[Any]:
    """Run one barrier job of ``world`` tasks over ``df`` (repartitioned to ``world``) and
    collect rank 0's rows; ``fit.current`` describes it while it runs."""
    spark = df.sparkSession
    tag = f"sparkdist-{uuid.uuid4().hex[:12]}"  # the job group (classic) or tag (Connect)
    attempts = Attempts(fit.max_retries, functools.partial(cancel, spark, tag),
                         failed_before=fit.failed_before)
    fit.current = Launch(number, world, tag, attempts)
    task = functools.partial(_barrier_task, worker, args,
                             BarrierSettings(**{**settings.__dict__, "launch": number}))
    stage = (_with_partitions(df, world)
             .mapInArrow(task, _RESULT_SCHEMA, barrier=True)
             .repartition(1))  # a shuffle after the barrier stage: Spark retries it
    return _collect(stage, tag, description, timeout_s, attempts)


def worker_message(err: BaseException | str, limit: int = 3000) -> str:
    """The informative part of a failed job's (or task's) message: before the JVM stack,
    capped."""
    text = str(err).split("\n\tat ", 1)[0].strip()
    return text if len(text) <= limit else "..." + text[-limit:]


# ---------------------------------------------------------------------------- executor side
def _barrier_task(worker: Worker, args: Any, settings: BarrierSettings,
                  batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import BarrierTaskContext

    os.environ.update(settings.env)
    context = WorkerContext(BarrierTaskContext.get(), settings)
    try:
        result = worker(context, batches, args)
        if context.rank == 0 and result is not None:
            yield from _result_batches(result)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as err:  # not only Exception: DCP's CheckpointException is not one
        message = context.failure_message(err)
        context.report_failure(err)
        raise TrainingError(message) from err
    finally:
        context.close()


def _result_batches(result: bytes | memoryview) -> Iterator[pa.RecordBatch]:
    """Rank 0's result as one row per ``_CHUNK`` bytes, each an Arrow view of the result's
    own memory (no copy: the whole model may be in it, and the worker's memory is capped)."""
    import numpy as np
    import pyarrow as pa

    whole = pa.py_buffer(result)
    for part, start in enumerate(range(0, max(1, len(result)), _CHUNK)):
        size = min(_CHUNK, len(result) - start)
        offsets = pa.py_buffer(np.array([0, size], dtype=np.int32).tobytes())
        payload = pa.Array.from_buffers(pa.binary(), 1, [None, offsets,
                                                         whole.slice(start, size)])
        yield pa.RecordBatch.from_arrays([pa.array([part], pa.int32()), payload],
                                         names=["part", "payload"])


def _with_timeout(call: Callable[[], Any], timeout_s: float, message: str) -> Any:
    """Run a blocking call in a daemon thread; TimeoutError when it does not return in time."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as err:  # re-raised in the caller's thread
            outcome["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(message)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _gpu_addresses(task: Any) -> tuple[str, ...]:
    resources = task.resources()
    return tuple(resources["gpu"].addresses) if "gpu" in resources else ()


# ------------------------------------------------------------------------------ driver side
def _with_partitions(df: DataFrame, num_workers: int) -> DataFrame:
    """One partition per worker. Spark refuses a barrier stage whose narrow lineage changes
    the partition count (coalesce, union, limit), so anything else goes through a shuffle."""
    return df if _barrier_ready(df, num_workers) else df.repartition(num_workers)


def _barrier_ready(df: DataFrame, num_workers: int) -> bool:
    """Whether every RDD of the stage that would run has ``num_workers`` partitions: Spark's
    own barrier check, walked back to the previous shuffle (False on Spark Connect)."""
    if is_connect(df):  # no JVM handle to ask: one shuffle more, never a refused stage
        return False
    try:
        from sparkdist._internals import java_dataframe

        pending = [java_dataframe(df).queryExecution().toRdd()]
    except Exception:  # a session without the JVM internals this walk uses
        return False
    while pending:
        rdd = pending.pop()
        if rdd.getNumPartitions() != num_workers:
            return False
        dependencies = rdd.dependencies()
        for i in range(dependencies.size()):
            dependency = dependencies.apply(i)
            if dependency.getClass().getSimpleName() != "ShuffleDependency":
                pending.append(dependency.rdd())
    return True


def _collect(stage: DataFrame, tag: str, description: str, timeout_s: float | None,
             attempts: Attempts) -> list[Any]:
    """Collect the stage in the job group (classic) or under the session tag (Connect)
    ``tag``, which the timeout and the retry watcher cancel (:func:`cancel`)."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    spark = stage.sparkSession
    sc = None if is_connect(spark) else spark.sparkContext
    if sc is None:
        spark.addTag(tag)
    else:  # also the group the status tracker is asked for, and the UI description
        sc.setJobGroup(tag, description, interruptOnCancel=True)
    timer = threading.Timer(timeout_s, cancel, [spark, tag]) if timeout_s else None
    stop = threading.Event()
    watcher = (threading.Thread(target=attempts.watch, args=(sc, tag, stop), daemon=True)
               if sc is not None else None)
    started = time.monotonic()
    try:
        if timer:
            timer.start()
        if watcher:
            watcher.start()
        return stage.collect()
    except (Py4JJavaError, PySparkException) as err:
        if attempts.input_error is not None:
            raise attempts.input_error from None
        if attempts.gave_up:
            raise attempts.error(description) from err
        if timeout_s and time.monotonic() - started >= timeout_s:
            raise TrainingError(f"{description}: cancelled after the timeout of "
                                f"{timeout_s:.0f} s (raise it or find the stuck worker in "
                                f"the executor logs).") from err
        raise TrainingError(f"{description} failed on the executors: "
                            f"{worker_message(err)}") from err
    finally:
        stop.set()
        if timer:
            timer.cancel()
        if sc is None:
            spark.removeTag(tag)
        else:
            # None removes a property (pyspark's stubs say str only)
            sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]


def _driver_host(df: DataFrame) -> str | None:
    """Where the executors can reach this process: the driver host (classic); on Spark
    Connect, loopback when the server and its executors run on this host, else None."""
    spark = df.sparkSession
    if is_connect(spark):
        return "127.0.0.1" if _connect_is_local(spark) else None
    try:
        return spark.conf.get("spark.driver.host")
    except Exception:
        return None


def _through_driver(spark: Any, address: tuple[str, int] | None) -> bool:
    """Whether the ranks gather through the driver's report socket at ``address``, as
    :data:`RENDEZVOUS_CONF` says (``auto``: where there is a socket on a local master)."""
    path = str(spark.conf.get(RENDEZVOUS_CONF, "auto") or "auto").strip().lower()
    if path not in RENDEZVOUS_PATHS:
        raise ClusterConfigError(f"{RENDEZVOUS_CONF}={path!r}: write one of "
                                 f"{', '.join(RENDEZVOUS_PATHS)} (auto: through the driver on "
                                 "local masters, Spark's allGather elsewhere).")
    if path == "driver" and address is None:
        raise ClusterConfigError(f"{RENDEZVOUS_CONF}=driver, but the executors cannot reach "
                                 "this Spark Connect client; set it to auto or spark.")
    return path == "driver" or (path == "auto" and address is not None
                                and _local_master(spark))


def _local_master(spark: Any) -> bool:
    """Whether the executors run on the driver's host (``local[...]``, ``local-cluster``; a
    Connect server's only where it is local as well): there they reach the report socket
    for sure, so every rank can gather through it (none is left waiting in Spark's
    allGather while its peers wait on the driver)."""
    if is_connect(spark):
        return _connect_is_local(spark)
    try:
        return str(spark.conf.get("spark.master", "") or "").startswith("local")
    except Exception:
        return False


def _connect_is_local(spark: Any) -> bool:
    """A Connect server on a loopback address with a local master (local[N] or
    local-cluster): its executors run on this host and reach this client on loopback."""
    try:
        host = spark.client.host
        master = spark.conf.get("spark.master", "") or ""
    except Exception:
        return False
    return host in _LOOPBACK_HOSTS and master.startswith("local")
