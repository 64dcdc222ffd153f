"""Fault injection for tests of failure handling; production code never sets a fault.

The training loop calls :func:`trip` at fixed points (before the rendezvous, at each step;
for XGBoost, after each boosting round); it does nothing unless a test attached a fault to the
estimator with :func:`inject_fault`.

Examples
--------
>>> estimator = inject_fault(TorchEstimator(...), tmp_dir, rank=1, epoch=2, step=3)
>>> estimator.fit(df)   # rank 1 fails once; the retried stage resumes and finishes
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

KINDS = ("raise", "kill", "hang")


class InjectedFault(RuntimeError):
    """The failure a test asked for."""


def inject_fault(estimator: Any, state_dir: str, *, rank: int, epoch: int = 1, step: int = 0,
                 kind: str = "raise", times: int = 1) -> Any:
    """Make ``rank`` fail at ``step`` of ``epoch`` (1-based; epoch 0: before the rendezvous)
    the first ``times`` times it gets there. ``kind``: 'raise' an exception, 'kill' the Python
    worker with SIGKILL, or 'hang' (sleep until killed). Each firing leaves
    ``state_dir/fired-<n>.pid`` holding the pid of the process that failed (also how the
    firings are counted across processes and stage attempts).

    For the XGBoost estimators (a fault fires only in a fit with ``checkpointDir``), ``rank``
    is the XGBoost worker rank (= Spark partition id), ``epoch`` the boosting round counted
    from the start of the whole fit (1-based; the fault fires after that round) and ``step``
    must be 0; a firing fails the current chunk, which the fit retries from its checkpoint."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: use one of {KINDS}")
    estimator._fault = {"rank": rank, "epoch": epoch, "step": step, "kind": kind,
                        "times": times, "state_dir": str(state_dir)}
    return estimator


def trip(fault: dict[str, Any] | None, rank: int, epoch: int, step: int = 0) -> None:
    """Fail here if the fault names this rank, epoch and step and has firings left."""
    if not fault or (rank, epoch, step) != (fault["rank"], fault["epoch"], fault["step"]):
        return
    firing = _claim_firing(fault["state_dir"], fault["times"])
    if firing is None:
        return
    if fault["kind"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault["kind"] == "hang":
        while True:
            time.sleep(1)
    raise InjectedFault(f"injected fault {firing}: rank {rank}, epoch {epoch}, step {step}")


def _claim_firing(state_dir: str, times: int) -> int | None:
    """The next firing number, claimed by creating its file exclusively; None when used up."""
    for firing in range(1, times + 1):
        try:
            descriptor = os.open(os.path.join(state_dir, f"fired-{firing}.pid"),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        with os.fdopen(descriptor, "w") as out:
            out.write(str(os.getpid()))
        return firing
    return None
