"""A real Spark standalone cluster for tests: one master and N workers on 127.0.0.1.

Started from the installed pyspark with ``$SPARK_HOME/sbin/spark-daemon.sh`` (the pip package
has no start-master.sh), on free ports, with every log, pid, work and scratch directory under
the given base directory. Each daemon is launched in a session of its own, so every process
it ever starts (the Worker's executor JVMs, their Python daemons and workers, even ones that
were re-parented after their parent died) carries that session id; :meth:`stop` ends them with
``spark-daemon.sh stop`` and then SIGKILLs whatever of the session is left.

    with StandaloneCluster(tmp_path, workers=2) as cluster:
        subprocess.run([spark_submit, "--master", cluster.master_url, ...])
        cluster.executor_pids(1)   # the executor JVMs worker 1 runs now

Nothing here is specific to sparkdist; the test module next to this file uses it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
DAEMON = SPARK_HOME / "sbin" / "spark-daemon.sh"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ----------------------------------------------------------------------------------- /proc
def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, session id) of a live process, None when it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[3])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (what a process started with start_new_session and
    all its descendants belong to, unless one of them calls setsid itself)."""
    return [pid for pid in _all_pids() if (stat := _stat(pid)) and stat[1] == sid]


def alive(pid: int) -> bool:
    return _stat(pid) is not None


def kill_all(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pids: Iterable[int], timeout_s: float) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the timeout."""
    pending = list(pids)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        time.sleep(0.2)
        pending = [pid for pid in pending if alive(pid)]
    return [pid for pid in pending if alive(pid)]


def stop_session(sid: int, timeout_s: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process of session ``sid``; return survivors (none)."""
    kill_all(session_pids(sid), signal.SIGTERM)
    left = wait_gone(session_pids(sid), timeout_s)
    kill_all(left)
    return wait_gone(session_pids(sid), 5.0)


# -------------------------------------------------------------------------------- cluster
@dataclass
class Daemon:
    """One spark-daemon.sh instance: its class, instance number, session and JVM pid."""

    cls: str
    instance: int
    sid: int
    pid: int | None = None
    log: Path | None = None

    @property
    def name(self) -> str:
        return f"{self.cls.rsplit('.', 1)[-1]} {self.instance}"


@dataclass
class StandaloneCluster:
    """A master and ``workers`` workers (``cores`` cores, ``memory`` each) on 127.0.0.1.

    Attributes set by :meth:`start`: ``master_url`` (spark://...), ``ui_url`` (the master's
    web UI, whose ``/json/`` lists workers and applications), ``work_dirs`` (one per worker;
    executors run in ``<work_dir>/<app id>/<executor id>`` and write stdout/stderr there),
    ``timings`` (seconds: ``master``, ``workers``).
    """

    base: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    env: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 90.0

    def __post_init__(self) -> None:
        self.base = Path(self.base)
        self.daemons: list[Daemon] = []
        self.port = free_port()
        self.ui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.ui_url = f"http://127.0.0.1:{self.ui_port}"
        self.work_dirs = [self.base / f"work-{i}" for i in range(1, self.workers + 1)]
        self.timings: dict[str, float] = {}
        for name in ("conf", "logs", "pids", "local"):
            (self.base / name).mkdir(parents=True, exist_ok=True)

    # --- start
    def start(self) -> StandaloneCluster:
        try:
            started = time.monotonic()
            self._launch(MASTER_CLASS, 1, ["--host", "127.0.0.1", "--port", str(self.port),
                                           "--webui-port", str(self.ui_port)])
            self._wait(lambda state: state is not None, "the master's web UI to answer")
            self.timings["master"] = time.monotonic() - started
            # The workers start once the master listens: a worker that finds no master
            # retries only after 5-15 s.
            launches = [self._spawn_worker(i) for i in range(1, self.workers + 1)]
            for proc, daemon in launches:
                self._finish_launch(proc, daemon)
            self._wait_workers()
            self.timings["workers"] = time.monotonic() - started - self.timings["master"]
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn_worker(self, index: int) -> tuple[subprocess.Popen, Daemon]:
        return self._spawn(WORKER_CLASS, index, [
            "--host", "127.0.0.1", "--cores", str(self.cores), "--memory", self.memory,
            "--webui-port", str(free_port()), self.master_url],
            {"SPARK_WORKER_DIR": str(self.work_dirs[index - 1])})

    def _wait_workers(self) -> None:
        self._wait(lambda state: state is not None
                   and len(self.alive_workers(state)) >= self.workers,
                   f"{self.workers} workers to register with the master")

    def restart_worker(self, index: int) -> None:
        """Start worker ``index`` again if it is dead (a test killed it), then wait until
        every worker is registered and no application holds the cluster: several tests can
        share one cluster (a start costs 15-30 s)."""
        old = self.worker(index)
        if old.pid is not None and not alive(old.pid):
            old.pid = None  # replaced: its death no longer ends a wait (its session is kept)
            # the master must have seen the death first, or the old entry counts as alive
            self._wait(lambda state: state is not None
                       and len(self.alive_workers(state)) < self.workers,
                       f"the master to mark worker {index} dead")
            self._finish_launch(*self._spawn_worker(index))
            self._wait_workers()
        self._wait(lambda state: state is not None and not state.get("activeapps"),
                   "the previous application to leave the master")

    def _environment(self, extra: dict[str, str]) -> dict[str, str]:
        return {**os.environ, "SPARK_HOME": str(SPARK_HOME),
                "SPARK_CONF_DIR": str(self.base / "conf"),  # no stray spark-defaults/env
                "SPARK_LOG_DIR": str(self.base / "logs"),
                "SPARK_PID_DIR": str(self.base / "pids"),
                "SPARK_LOCAL_DIRS": str(self.base / "local"),
                "SPARK_LOCAL_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
                "SPARK_IDENT_STRING": "sparkdist-test",
                # The master's REST submission server would take the fixed port 6066.
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
                # Small, quick-starting daemon JVMs (the executors are not affected).
                "SPARK_DAEMON_MEMORY": "512m",
                "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                **self.env, **extra}

    def _spawn(self, cls: str, instance: int, args: list[str],
               extra: dict[str, str] | None = None) -> tuple[subprocess.Popen, Daemon]:
        """Run ``spark-daemon.sh start`` in a new session (it returns after ~2.5 s; the JVM
        it leaves behind keeps the session id)."""
        proc = subprocess.Popen([str(DAEMON), "start", cls, str(instance), *args],
                                env=self._environment(extra or {}), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        daemon = Daemon(cls, instance, sid=proc.pid)
        self.daemons.append(daemon)
        return proc, daemon

    def _finish_launch(self, proc: subprocess.Popen, daemon: Daemon) -> None:
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        pid_file = self.base / "pids" / f"spark-sparkdist-test-{daemon.cls}-{daemon.instance}.pid"
        if pid_file.exists():
            daemon.pid = int(pid_file.read_text().split()[0])
        logs = sorted((self.base / "logs").glob(f"*{daemon.cls}-{daemon.instance}-*.out"))
        daemon.log = logs[-1] if logs else None
        if proc.returncode != 0 or daemon.pid is None or not alive(daemon.pid):
            raise RuntimeError(f"spark-daemon.sh could not start {daemon.name} "
                               f"(exit {proc.returncode}):\n{out}\n{self.log_tail(daemon)}")

    def _launch(self, cls: str, instance: int, args: list[str]) -> None:
        self._finish_launch(*self._spawn(cls, instance, args))

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if ready(self.state()):
                return
            dead = [d.name for d in self.daemons if d.pid is not None and not alive(d.pid)]
            if dead:
                break
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {self.start_timeout_s:.0f} s waiting for {what}"
                           f" (master state: {self.state()}).\n" + self.logs_tail())

    # --- inspect
    def state(self) -> dict | None:
        """The master's JSON status, or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as response:
                return json.loads(response.read())
        except (OSError, ValueError):
            return None

    @staticmethod
    def alive_workers(state: dict) -> list[dict]:
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def worker(self, index: int) -> Daemon:
        """Worker ``index`` (1-based); the last one started, after :meth:`restart_worker`."""
        return [d for d in self.daemons if d.cls == WORKER_CLASS and d.instance == index][-1]

    def executor_pids(self, index: int) -> list[int]:
        """The executor JVMs worker ``index`` runs now: CoarseGrainedExecutorBackend
        processes whose parent is that worker's JVM (other clusters' executors are not)."""
        parent = self.worker(index).pid
        return [pid for pid in _all_pids()
                if (stat := _stat(pid)) and stat[0] == parent
                and EXECUTOR_CLASS in _cmdline(pid)]

    def executor_dir(self, pid: int) -> Path | None:
        """An executor's work directory (its cwd: ``<work_dir>/<app id>/<executor id>``)."""
        try:
            return Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            return None

    def executor_logs(self, name: str = "stderr") -> list[Path]:
        """Every executor's stderr (or stdout) so far, of any application, on any worker."""
        return sorted(p for d in self.work_dirs for p in d.glob(f"app-*/*/{name}"))

    def processes(self) -> list[int]:
        """Every live process the cluster started."""
        return sorted({pid for d in self.daemons for pid in session_pids(d.sid)})

    def log_tail(self, daemon: Daemon, lines: int = 30) -> str:
        if daemon.log is None or not daemon.log.exists():
            return f"({daemon.name}: no log)"
        text = daemon.log.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {daemon.log.name} ---\n" + "\n".join(text)

    def logs_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_tail(d, lines) for d in self.daemons)

    # --- stop
    def stop(self, timeout_s: float = 15.0) -> list[int]:
        """Stop the workers, then the master, with ``spark-daemon.sh stop`` (SIGTERM; a
        Worker kills its executors on the way out); after ``timeout_s``, SIGKILL the
        daemons' pids and every other process of their sessions. Returns the pids still
        alive afterwards (an empty list: nothing is left behind)."""
        order = sorted(self.daemons, key=lambda d: d.cls == MASTER_CLASS)  # workers first
        for daemon in order:
            if daemon.pid is not None and alive(daemon.pid):
                subprocess.run([str(DAEMON), "stop", daemon.cls, str(daemon.instance)],
                               env=self._environment({}), capture_output=True, timeout=30)
        left = wait_gone(self.processes(), timeout_s)
        if left:
            kill_all(d.pid for d in self.daemons if d.pid is not None)
            kill_all(left)
        survivors = wait_gone(self.processes(), 5.0)
        self.daemons = [d for d in self.daemons if session_pids(d.sid)]
        return survivors

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
