"""Spark's Python daemon with torch already imported, so that a TorchEstimator task starts in a
forked worker that needs no ``import torch`` of its own.

Spark starts Python workers by forking them from one daemon per executor (``python -m
pyspark.daemon``). Each forked worker then imports whatever its task needs: for a
TorchEstimator fit, torch (about 1.5 s here, far more on a busy host), ``torch.distributed``,
``torch._dynamo`` (which ``DistributedDataParallel`` imports when it wraps the first model:
another 2-4 s, sympy included) and sparkdist's training modules. With
``spark.python.daemon.module=sparkdist.launch.daemon`` the daemon imports them once, before its
first fork, and every worker inherits them.

Forking is safe only from a process that runs no other threads. The modules in
:data:`PRELOAD` start none: torch starts its intra-op pool on first use, not at import, and
the one thread OpenBLAS (under numpy) starts at load is shut down by its own ``pthread_atfork``
handler before each fork. pyarrow and pandas are left out on purpose: pyarrow starts
jemalloc's background thread at import (pyspark's own daemon avoids both for that reason).

Where Spark limits a worker's address space (``spark.executor.pyspark.memory``, which
reaches the daemon as ``$PYSPARK_EXECUTOR_MEMORY_MB``) nothing is preloaded: torch's
libraries would count against every worker's limit, torch tasks or not.

A module that fails to import is skipped (the daemon works as pyspark's own does; torch is an
optional extra), and nothing a module prints at import reaches the daemon's stdout, which
carries its port to the JVM.

:func:`sparkdist.session.get_spark` sets the conf (:data:`CONF`) by default where the
executors run on this machine (local masters, a standalone master on loopback) in this very
Python environment or one that imports this module, on other masters only with
``$SPARKDIST_PRELOAD=1``, and never with ``$SPARKDIST_PRELOAD=0``
(:func:`sparkdist.session.preload_conf`). The cost: every worker maps torch's libraries,
about 200 MB more RSS than a plain pyspark worker (mostly pages shared with the daemon, but
pyspark's spill threshold ``spark.python.worker.memory`` compares RSS).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Iterator

#: The Spark conf key, and this module's name as its value.
CONF = "spark.python.daemon.module"
MODULE = __name__ if __name__ != "__main__" else "sparkdist.launch.daemon"
#: Set in the daemon's environment to the modules it preloaded; its workers inherit it.
ENV_PRELOADED = "SPARKDIST_DAEMON_PRELOADED"
#: Imported once in the daemon, inherited by every worker it forks.
PRELOAD = (
    "pyspark.worker",
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.optim",
    "torch._dynamo",  # DistributedDataParallel imports it on first use: seconds, sympy included
    "sparkdist.torchtrain.nets",
    "sparkdist.torchtrain.loop",
    "sparkdist.torchtrain.backends",
    "sparkdist.launch.barrier",
)


def preload(names: tuple[str, ...] = PRELOAD) -> list[str]:
    """Import ``names`` (stdout sent to stderr meanwhile); return those that imported."""
    loaded = []
    with _stdout_to_stderr():
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as err:  # torch missing or broken: the daemon still works
                print(f"sparkdist daemon: not preloading {name} ({err})", file=sys.stderr)
                continue
            loaded.append(name)
    return loaded


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 points at 2 meanwhile: C code that prints cannot corrupt the port
    the daemon writes to the JVM on its stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def main() -> None:
    """Preload, then run pyspark's own daemon loop (it reads the same ``sys.argv``). The
    preloaded objects are frozen out of the garbage collector: a worker's collections then
    neither walk them (torch and sympy make about ten times the objects of a plain worker) nor
    write their headers, which would copy the daemon's shared pages into every worker."""
    if not os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB"):
        os.environ[ENV_PRELOADED] = ",".join(preload())
        gc.freeze()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
