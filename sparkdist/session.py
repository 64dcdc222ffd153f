"""The SparkSession sparkdist works in: the active one, a local one with sane defaults, or a
Spark Connect session (``remote=`` or ``$SPARK_REMOTE``)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkdist.exceptions import ClusterConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG = logging.getLogger(__name__)
#: Environment variables read by :func:`get_spark` (arguments win over them).
ENV_MASTER = "SPARKDIST_MASTER"
ENV_LOG_LEVEL = "SPARKDIST_LOG_LEVEL"
ENV_CONF_PREFIX = "SPARKDIST_CONF_"  # SPARKDIST_CONF_spark__executor__memory=2g
ENV_REMOTE = "SPARK_REMOTE"  # pyspark's own variable: sc://host:port, or local[N]
ENV_CONNECT_TIMEOUT = "SPARKDIST_CONNECT_TIMEOUT_S"
ENV_PRELOAD = "SPARKDIST_PRELOAD"  # 0: pyspark's own Python daemon (no torch preload)
#: How long :func:`get_spark` waits for a Spark Connect server to answer before giving up.
CONNECT_TIMEOUT_S = 10.0
#: Spark conf that acts only where the driver's JVM starts (its command line, or spark-submit's
#: own work before the JVM runs the driver): set on a running JVM, it changes nothing.
LAUNCH_KEYS = ("spark.driver.memory", "spark.driver.extraJavaOptions",
               "spark.driver.defaultJavaOptions", "spark.driver.extraClassPath",
               "spark.driver.extraLibraryPath", "spark.jars", "spark.jars.packages",
               "spark.jars.repositories", "spark.jars.excludes", "spark.jars.ivy",
               "spark.jars.ivySettings")
#: How long :func:`get_spark` waits for the executors' Python to try importing the daemon.
PROBE_TIMEOUT_S = 60.0


def get_spark(
    master: str | None = None,
    app_name: str = "sparkdist",
    conf: Mapping[str, str] | None = None,
    log_level: str | None = None,
    remote: str | None = None,
) -> SparkSession:
    """Return the active SparkSession, or build a local one, or connect to a Connect server.

    On Databricks or in a notebook that already has ``spark``, the active session is
    returned untouched. Otherwise a session is built, and what the launcher set is never
    overridden: spark-submit's ``--master`` and ``--conf``, ``spark-defaults.conf`` and
    ``PYSPARK_SUBMIT_ARGS`` (:func:`launcher_conf`) win over every argument here. The master
    is the launcher's, else ``master``, else ``$SPARKDIST_MASTER``, else ``local[*]``. Keys
    the launcher left unset are filled in: ``conf`` and ``SPARKDIST_CONF_<key with '.'
    written '__'>``, then Arrow enabled, the driver bound to 127.0.0.1 in local modes,
    shuffle partitions sized to the cores, no console progress bar, and where the executors
    run on this machine (or ``$SPARKDIST_PRELOAD=1``) the Python daemon that preloads torch
    (:func:`preload_conf`). Keys that act only when the
    driver's JVM starts (:data:`LAUNCH_KEYS`: ``spark.driver.memory``,
    ``spark.driver.extraJavaOptions``, ``spark.jars.packages``, ...) go on the JVM's command
    line when this call starts it, as pyspark's builder does (``spark-defaults.conf`` and
    ``PYSPARK_SUBMIT_ARGS`` still win); where the JVM runs already, a warning names each one
    that did not take effect. Logs at WARN: the JVM's
    from its start when this process starts it (:func:`jvm_log_options`), py4j's and
    xgboost.spark's (:func:`quiet_logs`); ``log_level`` or ``$SPARKDIST_LOG_LEVEL`` sets
    the JVM's after start-up.

    ``remote`` (else ``$SPARK_REMOTE``, pyspark's own variable) asks for a Spark Connect
    session instead: ``sc://host:15002`` connects to a running server (checked within
    ``$SPARKDIST_CONNECT_TIMEOUT_S``, default 10 s), ``local[2]`` starts a local one. Needs
    the ``connect`` extra (``pip install sparkdist[connect]``).

    Raises
    ------
    ClusterConfigError : the Connect server does not answer, or the extra is missing.

    Examples
    --------
    >>> spark = get_spark(master="local[2]", conf={"spark.ui.enabled": "false"})
    >>> remote = get_spark(remote="sc://localhost:15002")  # a Connect server  # doctest: +SKIP
    """
    from pyspark.sql import SparkSession

    remote = remote or (os.environ.get(ENV_REMOTE) if master is None else None)
    active = SparkSession.getActiveSession()
    if active is not None and (is_connect(active) or (master is None and remote is None)):
        return active
    if remote:
        return _stopped_at_exit(_connect(remote, app_name, conf))
    launched = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit or a notebook's launcher
    _prepare_launch(master)
    quiet_logs()
    asked = {**_env_conf(), **dict(conf or {})}
    with _quiet_jvm():  # the gateway's JVM starts here, unless it runs already
        launcher = launcher_conf(launch=_launch_conf(asked))
    master = _choose_master(launcher.get("spark.master"), master)
    _local_env(master)
    _warn_overridden(launcher, asked)
    _warn_launch_ignored(launcher, asked)
    builder = SparkSession.builder.master(master)
    defaults = {**_default_conf(master), **preload_conf(master, {**launcher, **asked}),
                "spark.app.name": app_name, **asked}
    for key, value in defaults.items():
        if key not in launcher:  # fill in what the launcher left unset, override nothing
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level or os.environ.get(ENV_LOG_LEVEL, "WARN"))
    return spark if launched else _stopped_at_exit(spark)


def _stopped_at_exit(spark: SparkSession) -> SparkSession:
    """Stop a session sparkdist created when the interpreter exits, before Python tears down
    its objects: with pyspark 4.3.0, a Spark Connect client's ML objects release their server
    cache in ``__del__`` during that teardown, and the gRPC call there starts a thread, which
    blocks forever, so a script that never called ``spark.stop()`` would hang at exit. A stopped
    client skips those calls. Sessions sparkdist did not create are never stopped."""
    import atexit

    def stop() -> None:
        try:
            spark.stop()
        except Exception as err:  # exiting anyway: say why, never raise
            _LOG.debug("stopping the Spark session at exit failed: %s", err)

    atexit.register(stop)
    return spark


def launcher_conf(launch: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark conf the launcher set for this driver before any session exists.

    spark-submit's ``--master``/``--conf``, ``spark-defaults.conf`` and ``PYSPARK_SUBMIT_ARGS``
    all reach the driver JVM as ``spark.*`` system properties, which ``SparkConf()`` loads.
    Starts the JVM gateway (as ``getOrCreate`` would), with ``launch`` as ``--conf`` options
    before ``PYSPARK_SUBMIT_ARGS`` (which therefore wins) when this call starts it; they are
    then part of the answer. Leaves out the two values that mean "nobody chose":
    spark-submit's fallback master ``local[*]`` and the app name ``pyspark-shell`` pyspark
    gives a gateway it starts itself.

    Examples
    --------
    >>> conf = launcher_conf()  # a plain Python process: no launcher chose a master
    >>> "spark.master" in conf, conf["spark.submit.deployMode"]
    (False, 'client')

    With ``PYSPARK_SUBMIT_ARGS="--master local[1] pyspark-shell"`` set before the JVM
    starts, ``conf["spark.master"]`` is ``'local[1]'``.
    """
    from pyspark import SparkConf

    from sparkdist._internals import start_gateway

    # pyspark passes a conf to the gateway it launches as --conf (ignored if one runs)
    start_gateway(SparkConf(loadDefaults=False).setAll(list((launch or {}).items()))
                  if launch else None)
    found = dict(SparkConf().getAll())
    # spark-submit turns the console progress bar on for a shell ("pyspark-shell": the gateway
    # pyspark starts itself) unless told otherwise: a fallback too, not a choice.
    if (found.get("spark.app.name") == "pyspark-shell"
            and found.get(_PROGRESS_BAR) == "true" and not _named_by_user(_PROGRESS_BAR)):
        del found[_PROGRESS_BAR]
    for key, unset in (("spark.master", "local[*]"), ("spark.app.name", "pyspark-shell")):
        if found.get(key) == unset:
            del found[key]
    return found


_PROGRESS_BAR = "spark.ui.showConsoleProgress"


def _launch_conf(asked: Mapping[str, str]) -> dict[str, str]:
    """The launch-time keys of ``asked`` that ``spark-defaults.conf`` leaves unset (its values
    come from the launcher, and win)."""
    chosen = _defaults_file_keys()
    return {key: value for key, value in asked.items()
            if key in LAUNCH_KEYS and key not in chosen}


def _defaults_file_keys() -> set[str]:
    """The keys ``spark-defaults.conf`` sets (a Java properties file: ``key value`` or
    ``key=value`` lines, ``#``/``!`` comments)."""
    conf_dir = _spark_conf_dir()
    try:
        text = (conf_dir / "spark-defaults.conf").read_text(errors="replace") if conf_dir else ""
    except OSError:
        return set()
    lines = (line.strip() for line in text.splitlines())
    return {re.split(r"[\s=:]", line, maxsplit=1)[0] for line in lines
            if line and not line.startswith(("#", "!"))}


def _named_by_user(key: str) -> bool:
    """Whether ``PYSPARK_SUBMIT_ARGS`` or a ``spark-defaults.conf`` mentions ``key``."""
    if key in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        return True
    conf_dir = _spark_conf_dir()
    try:
        return conf_dir is not None and key in (conf_dir / "spark-defaults.conf").read_text(
            errors="replace")
    except OSError:
        return False


def _spark_conf_dir() -> Path | None:
    """``$SPARK_CONF_DIR``, else the conf directory of the Spark pyspark launches."""
    if os.environ.get("SPARK_CONF_DIR"):
        return Path(os.environ["SPARK_CONF_DIR"])
    try:
        from sparkdist._internals import spark_home

        return Path(spark_home()) / "conf"
    except Exception:  # no Spark home found: pyspark will say so when it starts
        return None


#: The JVM's logging until ``setLogLevel``: Spark's default profile, at WARN from the start
#: (so none of Spark's start-up INFO lines and "Setting default log level" notes), and
#: Hadoop's "Unable to load native-hadoop library" warning (every local run has it) off.
_LOG4J2 = """\
# Written by sparkdist.session.quiet_logs: Spark's log4j2-defaults.properties at WARN.
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = warn
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
logger.jetty2.name = org.sparkproject.jetty.util.component.AbstractLifeCycle
logger.jetty2.level = error
logger.metastore.name = org.apache.hadoop.hive.metastore.RetryingHMSHandler
logger.metastore.level = fatal
logger.metastore2.name = org.apache.hadoop.hive.metastore.ObjectStore
logger.metastore2.level = error
logger.parquet.name = org.apache.parquet.CorruptStatistics
logger.parquet.level = error
logger.parquet2.name = parquet.CorruptStatistics
logger.parquet2.level = error
logger.hadoopnative.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoopnative.level = error
"""
#: Python loggers of the libraries sparkdist drives that log INFO by default.
_QUIET_LOGGERS = ("py4j", "XGBoost-PySpark")
#: netlib (Spark ML's BLAS, LAPACK, ARPACK): the system library each tries to load natively.
_NETLIB = {"blas": "libblas.so.3", "lapack": "liblapack.so.3", "arpack": "libarpack.so.2"}


def quiet_logs() -> None:
    """py4j's and xgboost.spark's Python loggers at WARN, unless their level is set
    (xgboost.spark passes the driver's level of ``XGBoost-PySpark`` to its tasks)."""
    import logging

    for name in _QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


@contextmanager
def _quiet_jvm() -> Iterator[None]:
    """While this process starts its own JVM (not under spark-submit or a notebook's
    launcher), ``$SPARK_SUBMIT_OPTS`` gets :func:`jvm_log_options`; restored afterwards."""
    from sparkdist._internals import jvm_started

    if jvm_started() or "PYSPARK_GATEWAY_PORT" in os.environ:
        yield  # the JVM runs already, or a launcher starts it
        return
    before = os.environ.get("SPARK_SUBMIT_OPTS")
    added = jvm_log_options()
    if added:
        os.environ["SPARK_SUBMIT_OPTS"] = " ".join([*added, before or ""]).strip()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SPARK_SUBMIT_OPTS", None)
        else:
            os.environ["SPARK_SUBMIT_OPTS"] = before


def jvm_log_options() -> list[str]:
    """The JVM options that keep a local driver's console quiet, where nobody chose otherwise.

    - Spark's log4j at WARN from the start (``-Dlog4j2.configurationFile``, :data:`_LOG4J2`),
      unless a log4j2 file is in Spark's conf directory or log4j is named in
      ``$SPARK_SUBMIT_OPTS``/``$PYSPARK_SUBMIT_ARGS``.
    - On Linux, netlib's native BLAS/LAPACK/ARPACK not tried where the system has no such
      library: the JVM would print "netlib-blas: JNI_OnLoad: dlopen(libblas.so.3) failed" and
      use its Java implementation anyway.

    ``spark.driver.extraJavaOptions`` come later on the JVM's command line, so they win.
    """
    named = (os.environ.get("SPARK_SUBMIT_OPTS", "") + " "
             + os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    options = []
    if "log4j" not in named and not _has_log4j_file(_spark_conf_dir()):
        options.append(f"-Dlog4j2.configurationFile={_log4j2_file()}")
    if sys.platform.startswith("linux"):
        for lib, soname in _NETLIB.items():
            if f"dev.ludovic.netlib.{lib}." not in named and not _loadable(soname):
                options.append(f"-Ddev.ludovic.netlib.{lib}.allowNative=false")
    return options


def _loadable(soname: str) -> bool:
    """Whether the dynamic loader finds ``soname``: in ``$LD_LIBRARY_PATH`` or the ldconfig
    cache (without loading it)."""
    from ctypes.util import find_library

    path = os.environ.get("LD_LIBRARY_PATH", "")
    if any((Path(d) / soname).exists() for d in path.split(os.pathsep) if d):
        return True
    return find_library(soname[3:].split(".so")[0]) is not None


def _has_log4j_file(conf_dir: Path | None) -> bool:
    return conf_dir is not None and any(conf_dir.glob("log4j2*.*"))


def _log4j2_file() -> Path:
    """:data:`_LOG4J2` in the temporary directory (one file per content and user)."""
    import hashlib
    import tempfile

    digest = hashlib.sha256(_LOG4J2.encode()).hexdigest()[:12]
    user = os.getuid() if hasattr(os, "getuid") else os.getpid()
    path = Path(tempfile.gettempdir()) / f"sparkdist-log4j2-{user}-{digest}.properties"
    if not path.is_file():
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(_LOG4J2)
        os.replace(partial, path)
    return path


def _prepare_launch(master: str | None) -> None:
    """Before this process starts the JVM (which reads ``SPARK_LOCAL_IP`` once): the local
    environment, unless a launcher may name another master (spark-submit started this
    process, or ``PYSPARK_SUBMIT_ARGS`` names one)."""
    from sparkdist._internals import jvm_started

    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    if (not jvm_started() and "PYSPARK_GATEWAY_PORT" not in os.environ
            and "--master" not in submit_args and "spark.master" not in submit_args):
        _local_env(master or os.environ.get(ENV_MASTER) or "local[*]")


def _choose_master(launched: str | None, asked: str | None) -> str:
    """The launcher's master if it chose one, else the argument, $SPARKDIST_MASTER, local[*]."""
    if launched:
        if asked and asked != launched:
            _LOG.warning("get_spark(master=%r) ignored: the launcher (spark-submit, "
                         "spark-defaults.conf or PYSPARK_SUBMIT_ARGS) set spark.master=%s.",
                         asked, launched)
        return launched
    return asked or os.environ.get(ENV_MASTER) or "local[*]"


def _warn_overridden(launcher: Mapping[str, str], asked: Mapping[str, str]) -> None:
    ignored = {key: launcher[key] for key, value in asked.items()
               if key in launcher and launcher[key] != value}
    if ignored:
        _LOG.warning("Spark conf kept as the launcher set it (conf=/$%s* values ignored): %s",
                     ENV_CONF_PREFIX, ignored)


def _warn_launch_ignored(launcher: Mapping[str, str], asked: Mapping[str, str]) -> None:
    """Launch-time keys the JVM never saw: it ran before this call (those the launcher set
    otherwise are :func:`_warn_overridden`'s)."""
    ignored = {key: value for key, value in asked.items()
               if key in LAUNCH_KEYS and key not in launcher}
    if ignored:
        _LOG.warning(
            "Spark conf ignored (conf=/$%s*): %s act only when the driver's JVM starts, and it "
            "runs already. Set them before it starts: in PYSPARK_SUBMIT_ARGS (e.g. '--conf "
            "spark.driver.memory=4g pyspark-shell'), spark-submit --conf or "
            "spark-defaults.conf, or call get_spark before anything else starts Spark.",
            ENV_CONF_PREFIX, ignored)


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` (a SparkSession, or a DataFrame) is a Spark Connect one: no
    SparkContext, no RDDs, no JVM handles on this side. Imports nothing.

    Examples
    --------
    >>> is_connect(get_spark(master="local[2]"))
    False
    """
    session = getattr(spark, "sparkSession", spark)
    return type(session).__module__.startswith("pyspark.sql.connect")


def require_classic(spark: Any, feature: str, fix: str) -> None:
    """Raise :class:`ClusterConfigError` when ``spark`` is a Spark Connect session:
    ``feature`` needs a SparkContext, which Connect clients do not have."""
    if is_connect(spark):
        raise ClusterConfigError(
            f"{feature} needs a SparkContext, which a Spark Connect session does not have; "
            f"{fix}")


def _connect(remote: str, app_name: str, conf: Mapping[str, str] | None) -> SparkSession:
    """A Spark Connect session on ``remote``: a reachable ``sc://`` server, or ``local[N]``
    (pyspark starts a local server in this process, with sparkdist's local defaults)."""
    try:
        from pyspark.sql.connect.client import DefaultChannelBuilder  # needs grpcio
    except ImportError as err:
        raise ClusterConfigError(
            f"Spark Connect ({remote!r}) needs pyspark's connect extra ({err}); install it "
            "with `pip install sparkdist[connect]` (or pyspark[connect]).") from err
    from pyspark.sql import SparkSession

    local = remote.startswith("local")
    if not local:
        _probe(DefaultChannelBuilder, remote)
    if local:
        _local_env(remote)
    asked = {**_env_conf(), **dict(conf or {})}
    defaults = {**_default_conf(remote), **preload_conf(remote, asked)} if local else {}
    settings = {**defaults, **asked}
    builder = SparkSession.builder.remote(remote).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _probe(channel_builder: Any, url: str) -> None:
    """Fail fast, naming ``url``, when no Spark Connect server answers there: pyspark's own
    client retries an unreachable server for about ten minutes before it reports it."""
    import socket

    import grpc

    timeout = float(os.environ.get(ENV_CONNECT_TIMEOUT, CONNECT_TIMEOUT_S))
    try:
        builder = channel_builder(url)
        host, port = builder.host, int(builder.endpoint.rsplit(":", 1)[1])
    except Exception as err:  # a malformed URL
        raise ClusterConfigError(
            f"Spark Connect URL {url!r} is not valid ({err}); write it as "
            "sc://host:port[/;param=value], e.g. sc://localhost:15002.") from err
    fix = (f"start a Spark Connect server there ($SPARK_HOME/sbin/start-connect-server.sh) "
           f"or fix the host/port in remote= or ${ENV_REMOTE}")
    try:  # a closed port or an unknown host fails at once, with the reason
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        raise ClusterConfigError(
            f"cannot reach the Spark Connect server at {url} ({err}); {fix}.") from err
    channel = builder.toChannel()
    try:  # something listens: the gRPC (and TLS) handshake must complete too
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError as err:
        raise ClusterConfigError(
            f"no Spark Connect server answered at {url} within {timeout:.0f} s; {fix}, or "
            f"raise ${ENV_CONNECT_TIMEOUT}.") from err
    finally:
        channel.close()


def _default_conf(master: str) -> dict[str, str]:
    # One progress display: the caller's (sparkdist's workflow prints its own lines).
    conf = {"spark.sql.execution.arrow.pyspark.enabled": "true", _PROGRESS_BAR: "false"}
    if master.startswith("local"):
        executors, cores = local_layout(master)
        conf["spark.sql.shuffle.partitions"] = str(executors * cores)
        # The hostname may resolve to an interface executors cannot reach; loopback always works.
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    return conf


def preload_conf(master: str, chosen: Mapping[str, str]) -> dict[str, str]:
    """``spark.python.daemon.module=sparkdist.launch.daemon``: Python workers fork from a
    daemon that imported torch once, so a TorchEstimator task does not pay the import
    (:mod:`sparkdist.launch.daemon`). Where the executors run on this machine (a local or
    local-cluster master, or a standalone master on loopback, whose workers can only be
    local), only when their Python (the ``spark.pyspark.python`` of ``chosen``, else
    ``$PYSPARK_PYTHON``) is this one or can import that module: a UDF would fail in every
    worker otherwise. On any other master, only when ``$SPARKDIST_PRELOAD`` is set to 1:
    its executors cannot be checked from here, so the user says they import sparkdist. Never
    when ``chosen`` names a daemon or ``$SPARKDIST_PRELOAD`` is 0 (pyspark's own daemon:
    workers without torch, about 200 MB less RSS each).

    Raises
    ------
    ClusterConfigError : ``$SPARKDIST_PRELOAD`` is neither 0 nor 1.
    """
    from sparkdist.launch import daemon

    if daemon.CONF in chosen or not _preload_wanted():
        return {}
    if not _executors_here(master):
        asked = os.environ.get(ENV_PRELOAD, "").strip().lower() in ("1", "true")
        return {daemon.CONF: daemon.MODULE} if asked else {}
    python = chosen.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON", "python3")
    if _is_this_python(python) or _imports(python, daemon.MODULE):
        return {daemon.CONF: daemon.MODULE}
    _LOG.info("The executors' Python (%s) cannot import %s: pyspark's own daemon starts its "
              "workers (no torch preloaded).", python, daemon.MODULE)
    return {}


def _executors_here(master: str) -> bool:
    """Whether ``master``'s executors run on this machine: local masters, and standalone
    masters on loopback (``spark://127.0.0.1:7077``), which no other machine can reach.

    >>> [_executors_here(m) for m in ("local[2]", "local-cluster[2,1,1024]",
    ...                              "spark://127.0.0.1:7077", "spark://10.0.0.5:7077", "yarn")]
    [True, True, True, False, False]
    """
    if master.startswith("local"):
        return True
    host = master.removeprefix("spark://").rsplit(":", 1)[0] if master.startswith(
        "spark://") else ""
    return host in ("127.0.0.1", "localhost", "[::1]")


def _preload_wanted() -> bool:
    value = os.environ.get(ENV_PRELOAD, "1")
    if value.strip().lower() not in ("0", "1", "false", "true", ""):
        raise ClusterConfigError(
            f"${ENV_PRELOAD}={value!r}: write 0 (pyspark's own Python daemon) or 1 "
            "(sparkdist.launch.daemon, torch preloaded: the default where the executors run "
            "on this machine; set it for other masters whose executors import sparkdist).")
    return value.strip().lower() not in ("0", "false")


def _is_this_python(python: str) -> bool:
    """Whether ``python`` runs this interpreter in this environment: the same file, reached
    from the same directory (a virtualenv's ``bin/python`` links to the base interpreter,
    whose own packages differ)."""
    found = shutil.which(python)
    if found is None:
        return False

    def where(path: str) -> tuple[str, str]:
        path = os.path.abspath(path)
        return os.path.realpath(os.path.dirname(path)), os.path.realpath(path)

    return where(found) == where(sys.executable)


def _imports(python: str, module: str) -> bool:
    """Whether ``python -c "import module"`` succeeds here (the local executors' environment
    and working directory are this process's)."""
    try:
        done = subprocess.run([python, "-c", f"import {module}"], capture_output=True,
                              timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        _LOG.debug("probing %s for %s failed: %s", python, module, err)
        return False
    return done.returncode == 0


def _local_env(master: str) -> None:
    """Local masters: bind to loopback (see :func:`_default_conf`), run this Python on the
    executors."""
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def local_layout(master: str) -> tuple[int, int]:
    """(executors, cores each) of a local master: local -> (1, 1), local[4] / local[4,2] ->
    (1, 4), local[*] -> (1, CPUs), local-cluster[2,3,M] -> (2, 3).

    >>> local_layout("local-cluster[2,3,1024]"), local_layout("local[4,2]")
    ((2, 3), (1, 4))
    """
    if "[" not in master:
        return 1, 1
    fields = master[master.find("[") + 1 : master.find("]")].split(",")
    if master.startswith("local-cluster"):
        return int(fields[0]), int(fields[1])
    head = fields[0].strip()
    return 1, int(head) if head.isdigit() else (os.cpu_count() or 1)


def _env_conf() -> dict[str, str]:
    return {
        key[len(ENV_CONF_PREFIX) :].replace("__", "."): value
        for key, value in os.environ.items()
        if key.startswith(ENV_CONF_PREFIX)
    }
