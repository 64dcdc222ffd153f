"""The one place that starts a Spark barrier stage (every distributed fit goes through here).

``run_barrier(df, worker, args, num_workers)`` runs the module-level function
``worker(context, batches, args)`` in ``num_workers`` barrier tasks, one per partition of
``df``, and returns the bytes that rank 0 returned. Around that call:

- The stage ends in a shuffle (``.repartition(1)`` before the collect), which makes it a
  ShuffleMapStage: Spark retries a failed barrier stage as a whole, where a barrier stage that
  ends in a collect is never retried (../shared/design.md, section 4).
- Rendezvous is one ``allGather`` per attempt (about 1 s each): rank 0 reserves free ports on
  its own host and every task learns them. Nothing else uses Spark's barrier calls.
- Every wait is bounded: the rendezvous (on the executors), the collectives (the backend's
  own timeout, from ``collective_timeout_s``) and the whole job (cancelled on the driver:
  its job group on classic Spark, its session tag, ``spark.interruptTag``, on Spark Connect;
  classic ``interruptTag`` only sees the tags of the calling thread, so a timer cannot use it).
- Rank 0 may send progress records (small dicts) to the driver while the stage runs, over a
  socket the driver listens on; ``on_report`` receives them in a driver thread.
- Spark Connect: the stage is launched with DataFrame calls only (no SparkContext, no RDD).
  The executors can reach the client only when the Connect server and its executors run on
  the client's host (``local[...]`` masters): then progress and failure reports work as on
  classic Spark; elsewhere there is no report channel (``on_report`` is not called).
  ``max_retries`` is enforced from the ranks' failure reports there (the status tracker is
  classic-only), so on a remote Connect server only Spark's own
  ``spark.stage.maxConsecutiveAttempts`` bounds the retries.
- Results travel as bytes and are never unpickled on the driver; a failure becomes a
  :class:`TrainingError` carrying the failed worker's message and output tail.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkdist.exceptions import TrainingError
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


@dataclass(frozen=True)
class BarrierSettings:
    """Plain values the executor side needs (shipped with the task, never ``self``)."""

    rendezvous_timeout_s: float = 120.0
    collective_timeout_s: float = 600.0
    report_address: tuple[str, int] | None = None
    num_ports: int = 2
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Rendezvous:
    """What every rank learns from the single allGather."""

    master_addr: str
    ports: tuple[int, ...]
    hosts: tuple[str, ...]


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
        self._failure_reported = False
        self.scratch = tempfile.mkdtemp(prefix=f"sparkdist-rank{self.rank}-")
        #: Names this stage attempt in failure reports: the lowest task id of the attempt once
        #: the rendezvous told it, this task's id before (ids of a retry are all higher).
        self.attempt_key: int = task.taskAttemptId()

    def rendezvous(self) -> Rendezvous:
        """One allGather: rank 0's host and free ports reach every rank (bounded wait)."""
        host = self._task.getTaskInfos()[self.rank].address.rsplit(":", 1)[0]
        ports = _free_ports(host, self.settings.num_ports) if self.rank == 0 else []
        message = json.dumps({"host": host, "ports": ports, "task": self.attempt_key})
        self.log(f"{SYNC_LOG_PREFIX}: rendezvous of {self.world_size} (task attempt "
                 f"{self._task.taskAttemptId()})")
        gathered = _with_timeout(lambda: self._task.allGather(message),
                                 self.settings.rendezvous_timeout_s,
                                 f"rank {self.rank}: not every one of the {self.world_size} "
                                 f"workers reached the rendezvous within "
                                 f"{self.settings.rendezvous_timeout_s:.0f} s")
        peers = [json.loads(item) for item in gathered]
        self.attempt_key = min(peer["task"] for peer in peers)
        return Rendezvous(master_addr=peers[0]["host"], ports=tuple(peers[0]["ports"]),
                          hosts=tuple(peer["host"] for peer in peers))

    def log(self, message: str) -> None:
        """Print to the executor's stderr and keep the line for the error tail."""
        line = f"[sparkdist rank {self.rank}] {message}"
        self._tail.append(line)
        print(line, file=sys.stderr, flush=True)

    def tail(self) -> str:
        return "\n".join(self._tail)

    def report(self, record: dict[str, Any]) -> None:
        """Send a progress record to the driver (rank 0 only; best effort, never fails)."""
        address = self.settings.report_address
        if self.rank != 0 or address is None:
            return
        try:
            if self._report_socket is None:
                self._report_socket = socket.create_connection(address, timeout=5)
            self._report_socket.sendall((json.dumps(record) + "\n").encode())
        except OSError as err:
            self.log(f"progress report to the driver failed ({err}); training goes on")
            self.settings = BarrierSettings(**{**self.settings.__dict__,
                                               "report_address": None})

    def failure_message(self, err: BaseException) -> str:
        """What the driver and the user see of this rank's failure: the error, where it was
        raised, and the tail of this rank's output."""
        where = traceback.extract_tb(err.__traceback__)[-1]
        return (f"rank {self.rank} of {self.world_size} failed: {type(err).__name__}: {err} "
                f"(at {where.filename}:{where.lineno})\n"
                f"--- output tail of rank {self.rank} ---\n{self.tail()}")

    def report_failure(self, message: str) -> None:
        """Tell the driver why this rank failed (any rank, once; best effort). A worker may
        report before its own cleanup, so that the root cause arrives before its peers'
        reports of the lost connection."""
        address = self.settings.report_address
        if address is None or self._failure_reported:
            return
        self._failure_reported = True
        record = {"failure": message, "rank": self.rank,
                  "attempt": self.attempt_key, "world_size": self.world_size}
        with contextlib.suppress(OSError), \
                socket.create_connection(address, timeout=5) as connection:
            connection.sendall((json.dumps(record) + "\n").encode())

    def close(self) -> None:
        if self._report_socket is not None:
            with contextlib.suppress(OSError):
                self._report_socket.close()
        import shutil

        shutil.rmtree(self.scratch, ignore_errors=True)


Worker = Callable[[WorkerContext, Iterator["pa.RecordBatch"], dict[str, Any]], "bytes | None"]


def run_barrier(df: DataFrame, worker: Worker, args: dict[str, Any], num_workers: int, *,
                settings: BarrierSettings | None = None, timeout_s: float | None = None,
                description: str = "sparkdist barrier stage",
                on_report: Callable[[dict[str, Any]], None] | None = None,
                max_retries: int | None = None) -> bytes:
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

    Raises
    ------
    TrainingError : a task failed (after the retries) or the job timed out; it carries the
        last failure's message and output tail.

    Examples
    --------
    >>> payload = run_barrier(df, my_worker, {"epochs": 3}, num_workers=2)
    """
    settings = settings or BarrierSettings()
    spark = df.sparkSession
    tag = f"sparkdist-{uuid.uuid4().hex[:12]}"  # the job group (classic) or tag (Connect)
    attempts = _Attempts(max_retries, functools.partial(_cancel, spark, tag))
    with _report_server(df, on_report, attempts) as address:
        if address is None and is_connect(spark) and max_retries is not None:
            _LOG.warning("%s: the executors cannot reach this Spark Connect client, so "
                         "maxRetries=%s is not enforced; spark.stage.maxConsecutiveAttempts "
                         "on the server bounds the retries.", description, max_retries)
        task_settings = BarrierSettings(**{**settings.__dict__, "report_address": address})
        task = functools.partial(_barrier_task, worker, args, task_settings)
        stage = (_with_partitions(df, num_workers)
                 .mapInArrow(task, _RESULT_SCHEMA, barrier=True)
                 .repartition(1))  # a shuffle after the barrier stage: Spark retries it
        rows = _collect(stage, tag, description, timeout_s, attempts)
    if not rows:
        raise TrainingError("the barrier stage finished but rank 0 returned no result.")
    return b"".join(row["payload"] for row in sorted(rows, key=lambda row: row["part"]))


class _Attempts:
    """Counts the failed attempts of the training stage and cancels the job once
    ``max_retries`` retries have failed too; keeps each attempt's root cause for the error.

    The ranks' failure reports count the attempts as they fail (:meth:`record`). On classic
    Spark the status tracker is watched as well (:meth:`watch`), for attempts whose ranks all
    died without a word (SIGKILL); Spark Connect has no status tracker."""

    def __init__(self, max_retries: int | None, cancel: Callable[[], None]) -> None:
        self.max_retries, self.cancel = max_retries, cancel
        self.last: str | None = None
        self._attempt = -1
        self._failed = 0
        self.gave_up = False

    def record(self, record: dict[str, Any]) -> None:
        """Keep the first failure of the newest stage attempt: the root cause, where the ranks
        that fail after it only report losing their peer. The task ids of one attempt lie
        within ``world_size`` of each other; a retry's are all higher."""
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
                          for stage in (tracker.getJobInfo(job) or _NO_JOB).stageIds]
                infos = [tracker.getStageInfo(stage) for stage in stages]
            except Exception as err:  # a py4j hiccup must not end the watch
                _LOG.debug("status tracker poll failed: %s", err)
                continue
            if any(info and info.currentAttemptId > self.max_retries for info in infos):
                self.give_up()

    def error(self, description: str) -> TrainingError:
        return TrainingError(f"{description}: gave up after {self.max_retries + 1} failed "
                             f"attempt(s) (maxRetries={self.max_retries}). The last "
                             f"failure: {self.last}")


@dataclass(frozen=True)
class _NoJob:
    stageIds: tuple[int, ...] = ()  # noqa: N815 (the name Spark's SparkJobInfo uses)


_NO_JOB = _NoJob()


def worker_message(err: BaseException | str, limit: int = 3000) -> str:
    """The informative part of a failed job's (or task's) message: before the JVM stack,
    capped."""
    text = str(err).split("\n\tat ", 1)[0].strip()
    return text if len(text) <= limit else "..." + text[-limit:]


# ---------------------------------------------------------------------------- executor side
def _barrier_task(worker: Worker, args: dict[str, Any], settings: BarrierSettings,
                  batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa
    from pyspark import BarrierTaskContext

    os.environ.update(settings.env)
    context = WorkerContext(BarrierTaskContext.get(), settings)
    try:
        result = worker(context, batches, args)
    except Exception as err:
        message = context.failure_message(err)
        context.report_failure(message)
        raise TrainingError(message) from err
    finally:
        context.close()
    if context.rank == 0 and result is not None:
        chunks = [result[i:i + _CHUNK] for i in range(0, len(result), _CHUNK)] or [b""]
        yield pa.RecordBatch.from_pydict(
            {"part": pa.array(range(len(chunks)), pa.int32()),
             "payload": pa.array(chunks, pa.binary())})


def _free_ports(host: str, count: int) -> list[int]:
    """Ports the OS says are free now on ``host`` (held together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


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
        pending = [df._jdf.queryExecution().toRdd()]
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
             attempts: _Attempts) -> list[Any]:
    """Collect the stage in the job group (classic) or under the session tag (Connect)
    ``tag``, which the timeout and the retry watcher cancel (:func:`_cancel`)."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    spark = stage.sparkSession
    sc = None if is_connect(spark) else spark.sparkContext
    if sc is None:
        spark.addTag(tag)
    else:  # also the group the status tracker is asked for, and the UI description
        sc.setJobGroup(tag, description, interruptOnCancel=True)
    timer = threading.Timer(timeout_s, _cancel, [spark, tag]) if timeout_s else None
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
            sc.setLocalProperty("spark.jobGroup.id", None)
            sc.setLocalProperty("spark.job.description", None)


def _cancel(spark: Any, tag: str) -> None:
    """Cancel the job group ``tag`` (classic) or the operations tagged ``tag`` (Connect);
    never raises in the timer or watcher thread (the collect reports the cancellation)."""
    try:
        if is_connect(spark):
            spark.interruptTag(tag)
        else:
            spark.sparkContext.cancelJobGroup(tag)
    except Exception as err:
        _LOG.warning("could not cancel the sparkdist jobs %s: %s", tag, err)


@contextlib.contextmanager
def _report_server(df: DataFrame, on_report: Callable[[dict[str, Any]], None] | None,
                   attempts: _Attempts) -> Iterator[tuple[str, int] | None]:
    """Listen on the driver host, while the stage runs, for rank 0's progress records and
    any rank's failure report."""
    host = _driver_host(df)
    if host is None:
        yield None
        return

    def dispatch(record: dict[str, Any]) -> None:
        if "failure" in record:
            attempts.record(record)
        elif on_report is not None:
            on_report(record)

    server = socket.create_server((host, 0))
    server.settimeout(0.5)
    stop = threading.Event()
    thread = threading.Thread(target=_serve_reports, args=(server, stop, dispatch),
                              daemon=True)
    thread.start()
    try:
        yield host, server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


def _serve_reports(server: socket.socket, stop: threading.Event,
                   dispatch: Callable[[dict[str, Any]], None]) -> None:
    """Accept connections; each is read to its end in its own thread (ranks report at once)."""
    while not stop.is_set():
        try:
            connection, _ = server.accept()
        except (TimeoutError, OSError):
            continue
        threading.Thread(target=_read_reports, args=(connection, dispatch), daemon=True).start()


def _read_reports(connection: socket.socket, dispatch: Callable[[dict[str, Any]], None]) -> None:
    connection.settimeout(None)
    with connection, connection.makefile("r") as lines:
        for line in lines:
            try:
                dispatch(json.loads(line))
            except Exception as err:  # a bad record must not stop training
                _LOG.warning("ignoring a progress record: %s", err)


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


def _connect_is_local(spark: Any) -> bool:
    """A Connect server on a loopback address with a local master (local[N] or
    local-cluster): its executors run on this host and reach this client on loopback."""
    try:
        host = spark.client.host
        master = spark.conf.get("spark.master", "") or ""
    except Exception:
        return False
    return host in _LOOPBACK_HOSTS and master.startswith("local")
