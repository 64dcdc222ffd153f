"""Params for fits that survive failures: checkpoints, a run id to resume, bounded retries;
and the driver's guard of a run (its record, its fingerprint, its lock).

A run lives in ``checkpointDir/runId``: the checkpoints, ``run.json`` (the fingerprint of the
fit that started it, and whether it completed) and, while a fit holds it, ``lock.json``.
Before launching anything the driver takes the lock, compares this fit's fingerprint with the
run's, and decides (see :class:`RunGuard`): start fresh, resume, or refuse with a ParamError
naming every differing setting. Spark's own stage retries within one fit never pass through
here: their ranks simply resume from the newest checkpoint.

The fingerprint policy: every estimator classifies each of its Params in ``_trajectory``
(True: it shapes the training trajectory, so it is in the resume fingerprint; False: it does
not, e.g. the checkpoint Params, output columns, the device), and the fingerprint holds the
True ones (:meth:`HasRecovery._trajectory_values`). tests/unit/test_fingerprint_policy.py
fails for a Param left unclassified, so a new Param cannot slip out of the mismatch check.

:class:`HasElastic` holds the Params of a fit that goes on with fewer workers when task slots
are lost (TorchEstimator and the XGBoost estimators).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, NoReturn

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.sql import functions as F

from sparkdist import store
from sparkdist.columns import check_one_of, check_timeout
from sparkdist.exceptions import ClusterConfigError, ParamError
from sparkdist.store import Checkpoints, PathExistsError

_LOG = logging.getLogger(__name__)

#: Spark's default for spark.stage.maxConsecutiveAttempts: a stage runs at most this often.
SPARK_STAGE_ATTEMPTS = 4
RESUME_MODES = ("auto", "never", "required")
#: A run id is one path segment: no separators, no "..", no leading dot or dash.
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
RUN_FILE, LOCK_FILE = "run.json", "lock.json"
#: A lock not renewed for this long belongs to a dead driver and may be taken over.
LEASE_SECONDS = 120.0
HEARTBEAT_SECONDS = 30.0
_UNITS = {"epochs": "epochs", "n_estimators": "rounds"}
#: The recovery and elastic Params do not shape the trajectory (a resumed run may keep fewer
#: checkpoints, run on fewer workers, ...); an estimator whose chunking does overrides one.
RECOVERY_TRAJECTORY: dict[str, bool] = dict.fromkeys(
    ("checkpointDir", "checkpointEvery", "keepCheckpoints", "runId", "resume", "maxRetries"),
    False)
ELASTIC_TRAJECTORY: dict[str, bool] = {"minWorkers": False, "slotWaitSeconds": False}


class HasElastic(Params):
    """minWorkers and slotWaitSeconds: a fit that loses task slots for good goes on with
    fewer workers (at least minWorkers), waiting at most slotWaitSeconds for them."""

    minWorkers: Param[int] = Param(
        Params._dummy(), "minWorkers",
        "the fewest workers a retried fit (or checkpointed chunk) may go on with when task "
        "slots are lost for good, >= 0; 0: all the workers (never fewer)",
        typeConverter=TypeConverters.toInt)
    slotWaitSeconds: Param[float] = Param(
        Params._dummy(), "slotWaitSeconds",
        "longest wait in seconds for minWorkers free task slots before a retry fails: > 0 "
        "and at most 31536000 (one year; inf is refused)", typeConverter=TypeConverters.toFloat)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(minWorkers=0, slotWaitSeconds=300.0)

    def check_elastic(self, workers_param: str) -> None:
        """ParamError unless 0 <= minWorkers <= the workers (``workers_param``) and
        slotWaitSeconds is a finite number of seconds above 0."""
        least, workers = self.getOrDefault("minWorkers"), self.getOrDefault(workers_param)
        if not 0 <= least <= workers:
            raise ParamError(f"minWorkers={least}: use 0 (all {workers_param}) to "
                             f"{workers_param}={workers}.")
        check_timeout("slotWaitSeconds", self.getOrDefault("slotWaitSeconds"))

    def elastic_plan(self, workers_param: str, **extra: Any) -> Any:
        """The Params as a :class:`sparkdist.launch.elastic.ElasticPlan` (``extra``: its
        other fields)."""
        from sparkdist.launch.elastic import ElasticPlan

        get = self.getOrDefault
        return ElasticPlan(min_workers=get("minWorkers") or get(workers_param),
                           slot_wait_s=get("slotWaitSeconds"), param="minWorkers", **extra)


class HasRecovery(Params):
    """checkpointDir, checkpointEvery, keepCheckpoints, runId, resume and maxRetries."""

    #: Every Param of the estimator: True when it shapes the training trajectory (in the
    #: resume fingerprint), False when not (see the module docstring).
    _trajectory: ClassVar[dict[str, bool]] = {}

    checkpointDir: Param[str] = Param(
        Params._dummy(), "checkpointDir",
        "directory for checkpoints (local path, file://, hdfs://, s3://, dbfs:/, /Volumes/...) "
        "that the driver and every executor can reach; unset: no checkpoints",
        typeConverter=TypeConverters.toString)
    checkpointEvery: Param[int] = Param(
        Params._dummy(), "checkpointEvery", "checkpoint interval (epochs or rounds), >= 1",
        typeConverter=TypeConverters.toInt)
    keepCheckpoints: Param[int] = Param(
        Params._dummy(), "keepCheckpoints", "newest checkpoints kept per run, >= 1",
        typeConverter=TypeConverters.toInt)
    runId: Param[str] = Param(
        Params._dummy(), "runId",
        "names the run's checkpoints (letters, digits, '.', '_', '-'); see resume; "
        "unset: a new id per fit", typeConverter=TypeConverters.toString)
    resume: Param[str] = Param(
        Params._dummy(), "resume",
        "what a fit does with an earlier run of its runId: 'auto' continues an interrupted "
        "run with the same settings and data (a mismatch is refused) and trains a completed "
        "one again from scratch; 'never' always starts from scratch, dropping the run's "
        "checkpoints; 'required' fails unless there is a run to continue, and may raise "
        "epochs/n_estimators to continue a completed one", typeConverter=TypeConverters.toString)
    maxRetries: Param[int] = Param(
        Params._dummy(), "maxRetries", "retries of a failed training stage, >= 0",
        typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(checkpointEvery=1, keepCheckpoints=3, maxRetries=3, resume="auto")

    def _trajectory_values(self) -> dict[str, Any]:
        """{name: value} of the defined Params that shape the trajectory: the Params part of
        the resume fingerprint."""
        return {name: self.getOrDefault(name) for name, shapes in self._trajectory.items()
                if shapes and self.isDefined(name)}

    def checkpoint_location(self, spark: Any,
                            spark_retries: bool = True) -> tuple[str | None, str]:
        """Check the recovery Params against the cluster and return (this run's checkpoint
        directory or None, run id). Raises before anything is launched or written.

        ``spark_retries``: True when the retries are Spark's own stage retries, so maxRetries
        must fit in spark.stage.maxConsecutiveAttempts; False for an estimator that retries
        on the driver (XGBoost), where that Spark setting does not apply."""
        get = self.getOrDefault
        for name, low in (("checkpointEvery", 1), ("keepCheckpoints", 1), ("maxRetries", 0)):
            if get(name) < low:
                raise ParamError(f"{name}={get(name)}: use {low} or more.")
        check_one_of("resume", get("resume"), RESUME_MODES)
        attempts = int(spark.conf.get("spark.stage.maxConsecutiveAttempts",
                                      str(SPARK_STAGE_ATTEMPTS)))
        if spark_retries and get("maxRetries") + 1 > attempts:
            raise ClusterConfigError(
                f"maxRetries={get('maxRetries')} needs {get('maxRetries') + 1} stage attempts "
                f"but Spark allows {attempts}; set spark.stage.maxConsecutiveAttempts="
                f"{get('maxRetries') + 1} when the session starts, or lower maxRetries.")
        run_id = get("runId") if self.isDefined("runId") and get("runId") else \
            uuid.uuid4().hex[:16]
        if not RUN_ID.match(run_id) or ".." in run_id:
            raise ParamError(f"runId={run_id!r} is not a plain name: it becomes a directory "
                             "under checkpointDir, so use letters, digits, '.', '_' and '-' "
                             "(starting with a letter or digit, no '..'), e.g. 'churn-nightly'.")
        if not (self.isDefined("checkpointDir") and get("checkpointDir")):
            return None, run_id
        location = f"{get('checkpointDir').rstrip('/')}/{run_id}"
        Checkpoints(location).check_writable("checkpointDir")
        return location, run_id

    @contextmanager
    def guarded_run(self, location: str | None, run_id: str, fingerprint: dict[str, Any],
                    total: str, resizable: tuple[str, ...] = ()) -> Iterator[RunGuard | None]:
        """Hold the run for the enclosed fit (None without checkpointDir): lock it, refuse a
        mismatch, prepare its checkpoints; the caller marks it complete on success.
        ``total`` names the Param that counts epochs or rounds; ``resume='required'`` may
        change it and the ``resizable`` Params (those whose checkpoints load into any value,
        such as the worker count)."""
        if location is None:
            yield None
            return
        guard = RunGuard(location, run_id, fingerprint, total, resizable)
        guard.lock()
        try:
            guard.start(self.getOrDefault("resume"))
            yield guard
        finally:
            guard.unlock()


# ------------------------------------------------------------------------ data identity
def content_hash(*columns: Any) -> Any:
    """An aggregate: an order-independent hash of the rows (sum of xxhash64, as a decimal so
    the sum never overflows). Fold it into a pass the fit already makes."""
    return F.sum(F.xxhash64(*columns).cast("decimal(20,0)")).alias("content_hash")


def data_identity(schema: Any, stats: Any) -> dict[str, Any]:
    """The fingerprint entries of the training data: the schema of the columns read, the row
    count and the content hash from the stats row."""
    return {"data schema": schema.simpleString(), "data rows": int(stats["rows"]),
            "data content hash": str(stats["content_hash"])}


# ------------------------------------------------------------------------ the run guard
class RunGuard:
    """One fit's hold on ``checkpointDir/runId``.

    The lock is ``lock.json``, created exclusively (:func:`sparkdist.store.create_exclusive`:
    of two racing fits one wins) and holding this fit's id, host, pid and an expiry that a
    daemon thread renews every HEARTBEAT_SECONDS; a lock whose expiry passed (a killed driver)
    is taken over. Every change of an existing lock (a takeover, a renewal, the release) is a
    conditional write on the very lease read (:func:`sparkdist.store.replace_if`): of several
    fits taking over one expired lease exactly one wins, and a driver that paused past its
    lease finds another fit's lease and stops renewing instead of overwriting it. No lease
    outlasts LEASE_SECONDS after its last write, whatever expiry it names. ``run.json`` holds
    the fingerprint, the state ('running' or 'complete') and the epochs/rounds done at
    completion. Either file in a shape sparkdist never writes is refused with a ParamError.
    """

    def __init__(self, location: str, run_id: str, fingerprint: dict[str, Any],
                 total: str, resizable: tuple[str, ...] = ()) -> None:
        self.location, self.run_id, self.total = location, run_id, total
        self.resizable = resizable
        self.fingerprint = _canonical(fingerprint)
        self.fit_id = uuid.uuid4().hex[:12]
        self.resumed = False
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._lock_path = f"{location}/{LOCK_FILE}"

    # -- the lock
    def lock(self) -> None:
        """Take the run's lock, or raise ParamError naming the fit that holds it."""
        try:
            store.create_exclusive(self._lock_path, self._lease())
        except PathExistsError:
            self._take_over()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True,
                                      name=f"sparkdist-lock-{self.run_id}")
        self._beat.start()

    def _take_over(self) -> None:
        """Take over an expired lease by a write conditional on that lease; refuse a live one,
        and the takeover another fit won."""
        try:
            found = store.read_tagged(self._lock_path, store.CONTROL_LIMIT)
        except FileNotFoundError:  # released meanwhile
            self._create_or_refuse()
            return
        held = self._lease_in(found)
        if held["expires"] > time.time():
            raise ParamError(self._held_message(held))
        _LOG.warning("runId %r: taking over the lock of fit %s, which expired (its "
                     "driver stopped renewing it)", self.run_id, held["fit_id"])
        if not store.replace_if(self._lock_path, found.tag, self._lease()):
            self._refuse()  # another fit took it over (or it was released) first

    def _create_or_refuse(self) -> None:
        try:
            store.create_exclusive(self._lock_path, self._lease())
        except PathExistsError:
            self._refuse()

    def _refuse(self) -> NoReturn:
        try:
            held = self._lease_in(store.read_tagged(self._lock_path, store.CONTROL_LIMIT))
        except FileNotFoundError:
            held = {}
        raise ParamError(self._held_message(held))

    def unlock(self) -> None:
        """Stop renewing, and remove the lock if it is still this fit's (never raises: the
        fit's own outcome matters more; an unremoved lock expires)."""
        self._stop.set()
        if self._beat is not None:  # a renewal under way would change the tag removed here
            self._beat.join(10)
        try:
            found = self._own_lease()
            if found is not None:
                store.remove_if(self._lock_path, found.tag)
        except (OSError, ValueError) as err:
            _LOG.warning("runId %r: cannot release the lock %s: %s", self.run_id,
                         self._lock_path, err)

    def _own_lease(self) -> store.Tagged | None:
        """lock.json as read, when it holds this fit's lease; None when another's or none."""
        try:
            found = store.read_tagged(self._lock_path, store.CONTROL_LIMIT)
        except FileNotFoundError:
            return None
        return found if self._lease_in(found)["fit_id"] == self.fit_id else None

    def _lease(self) -> bytes:
        return json.dumps({"fit_id": self.fit_id, "host": socket.gethostname(),
                           "pid": os.getpid(), "expires": time.time() + LEASE_SECONDS}).encode()

    def _lease_in(self, found: store.Tagged) -> dict[str, Any]:
        """The lease in lock.json, its expiry capped at LEASE_SECONDS after the file was
        written (the store's clock; now where the store does not say); ParamError for a file
        that is no lease."""
        lease = _json_object(self._lock_path, found.data, self._foreign_lock)
        expires = lease.get("expires")
        if not isinstance(lease.get("fit_id"), str) or not _finite(expires):
            raise ParamError(self._foreign_lock("its fit_id is not a string or its expires "
                                                "not a finite number"))
        written = time.time() if found.modified is None else found.modified
        return {**lease, "expires": min(float(lease["expires"]), written + LEASE_SECONDS)}

    def _foreign_lock(self, why: str) -> str:
        return (f"{self._lock_path} is not a lock sparkdist wrote ({why}). If no fit of "
                f"runId={self.run_id!r} is running, delete it; or use another runId.")

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                found = self._own_lease()
                if found is not None and store.replace_if(self._lock_path, found.tag,
                                                          self._lease()):
                    continue
            except Exception as err:  # a store hiccup: the lease lasts LEASE_SECONDS anyway
                _LOG.warning("runId %r: cannot renew the lock: %s", self.run_id, err)
                continue
            if not self._stop.is_set():  # (not released by unlock meanwhile)
                _LOG.error("runId %r: fit %s lost its lock %s to another fit (this driver "
                           "did not renew it for %.0f s); both fits may now write the run's "
                           "checkpoints: stop one of them.", self.run_id, self.fit_id,
                           self._lock_path, LEASE_SECONDS)
            return

    def _held_message(self, held: dict[str, Any]) -> str:
        until = (time.strftime("%H:%M:%S", time.localtime(held["expires"]))
                 if "expires" in held else f"at most {LEASE_SECONDS:.0f} s from now")
        return (f"runId={self.run_id!r} is in use by another fit (fit {held.get('fit_id')} "
                f"on host {held.get('host')}, pid {held.get('pid')}; its lock "
                f"{self._lock_path} is renewed while it runs and expires at "
                f"{until} if its driver died). Wait for it, or use another runId.")

    # -- the run record
    def start(self, mode: str) -> None:
        """Decide between a fresh start and a resume (or refuse), then record the run."""
        record = self._record() if mode != "never" else None
        steps = Checkpoints(self.location).steps()
        self.resumed = mode != "never" and self._resumable(record, steps, mode)
        if not self.resumed:
            self._clear(steps)
        self._write({"fingerprint": self.fingerprint, "state": "running",
                     "fit_id": self.fit_id, "started": time.time()})

    def complete(self, done: int) -> None:
        """Record that the run finished after ``done`` epochs or rounds."""
        self._write({"fingerprint": self.fingerprint, "state": "complete",
                     "fit_id": self.fit_id, "finished": time.time(), "done": done})

    def _resumable(self, record: dict[str, Any] | None, steps: list[int], mode: str) -> bool:
        """True to resume; False to start fresh; ParamError to refuse."""
        fix = (f"use a new runId, or resume='never' to train runId={self.run_id!r} again from "
               "scratch (its checkpoints are dropped)")
        if record is None:
            if steps:
                raise ParamError(f"runId={self.run_id!r} has checkpoints in {self.location} "
                                 f"but no {RUN_FILE} saying which fit wrote them (an older "
                                 f"sparkdist, or copied by hand); {fix}.")
            if mode == "required":
                raise ParamError(f"resume='required' but runId={self.run_id!r} has no run in "
                                 f"{self.location} to resume; use resume='auto'.")
            return False
        complete = record.get("state") == "complete"
        if complete and mode == "auto":
            _LOG.warning("runId %r completed earlier; training it again from scratch "
                         "(resume='required' with more %s continues it instead)",
                         self.run_id, self.total)
            return False
        ignore = {self.total, *self.resizable} if mode == "required" else set()
        changed = _differences(record.get("fingerprint", {}), self.fingerprint, ignore)
        if changed:
            state = "a completed" if complete else "an interrupted"
            raise ParamError(f"runId={self.run_id!r} holds {state} run with other settings or "
                             f"data: {'; '.join(changed)}. Resuming it would mix two "
                             f"trainings; {fix}.")
        if mode == "required":
            self._check_continuable(record, steps, complete)
        return True

    def _check_continuable(self, record: dict[str, Any], steps: list[int],
                           complete: bool) -> None:
        """resume='required': refuse when there is nothing to resume or continue, or when
        the run already went past this fit's total."""
        total, done = self.fingerprint[self.total], max(steps, default=0)
        unit = _UNITS.get(self.total, self.total)
        if not steps:
            raise ParamError(f"resume='required' but runId={self.run_id!r} has no checkpoint "
                             f"in {self.location} to resume from; use resume='auto'.")
        if total < done:
            raise ParamError(f"runId={self.run_id!r} already has a checkpoint after {done} "
                             f"{unit}, more than {self.total}={total}; set {self.total}={done} "
                             "or more to continue it, or use a new runId.")
        stopped_early = record.get("done", 0) < record["fingerprint"].get(self.total, 0)
        if complete and (stopped_early or total == done):
            raise ParamError(f"resume='required' but runId={self.run_id!r} completed after "
                             f"{record.get('done')} {unit}: nothing to continue. Raise "
                             f"{self.total} above {done} to train more (not after an early "
                             "stop), or use resume='auto' to train it again.")

    def _clear(self, steps: list[int]) -> None:
        """Drop the run's record and checkpoints, the record first: a fit killed in between
        leaves checkpoints without a record, which the next fit refuses to resume."""
        store.remove(f"{self.location}/{RUN_FILE}")
        for step in steps:
            store.remove(f"{self.location}/ckpt-{step:010d}")

    def _record(self) -> dict[str, Any] | None:
        """run.json, checked (None when absent); ParamError for a file of another shape."""
        path = f"{self.location}/{RUN_FILE}"
        try:
            data = store.read_bytes(path, store.CONTROL_LIMIT)
        except FileNotFoundError:
            return None
        record = _json_object(path, data, self._foreign_record)
        fingerprint = record.get("fingerprint")
        if not (isinstance(fingerprint, dict) and isinstance(record.get("state"), str)
                and _whole(record.get("done", 0)) and _whole(fingerprint.get(self.total, 0))):
            raise ParamError(self._foreign_record(
                f"it needs a 'fingerprint' object, a 'state' string and whole numbers of "
                f"{self.total} and 'done'"))
        return record

    def _foreign_record(self, why: str) -> str:
        return (f"{self.location}/{RUN_FILE} is not a run record sparkdist wrote ({why}). "
                f"Use resume='never' to train runId={self.run_id!r} again from scratch (the "
                "file and the run's checkpoints are replaced), or use another runId.")

    def _write(self, record: dict[str, Any]) -> None:
        store.write_bytes(f"{self.location}/{RUN_FILE}",
                          json.dumps(record, sort_keys=True).encode())


def _canonical(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint as JSON would give it back (tuples become lists, and so on)."""
    return dict(json.loads(json.dumps(fingerprint, sort_keys=True, default=repr)))


def _differences(old: dict[str, Any], new: dict[str, Any], ignore: set[str]) -> list[str]:
    """'name: old -> new' for each setting that differs (compared as JSON, so NaN == NaN)."""
    return [f"{name}: {old.get(name, '(unset)')!r} -> {new.get(name, '(unset)')!r}"
            for name in sorted((set(old) | set(new)) - ignore)
            if json.dumps(old.get(name)) != json.dumps(new.get(name))]


def _json_object(url: str, data: bytes, foreign: Callable[[str], str]) -> dict[str, Any]:
    """The JSON object in ``data`` (read from ``url``), or ParamError(foreign(why)). Both
    files are written whole (never torn), so anything else is not sparkdist's."""
    try:
        value = json.loads(data)
    except ValueError as err:  # UnicodeDecodeError included
        raise ParamError(foreign(f"not JSON: {err}")) from None
    if not isinstance(value, dict):
        raise ParamError(foreign(f"a JSON {type(value).__name__}, not an object"))
    return value


def _finite(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int beyond any float
        return False


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
