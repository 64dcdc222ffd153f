"""Failpoints: named places in sparkdist's distributed training where a rank can be made to
fail on purpose, to rehearse recovery before a real cluster does it (as storage engines let
operators and tests do).

A failpoint is armed on one estimator; its fit ships it to the ranks with the other task
arguments, and the rank it names fails when it reaches the point. Off is the default and costs
one comparison: an unarmed fit ships ``None``, and :func:`hit` returns at once.

Points
------
``torch.rendezvous``
    A TorchEstimator rank, before it joins the rendezvous (``epoch=0``).
``torch.step``
    A TorchEstimator rank at ``step`` (0-based) of ``epoch`` (1-based).
``xgboost.round``
    An XGBoost worker (rank = Spark partition id) after boosting round ``epoch``, counted
    from the start of the whole fit (1-based). Checkpointed fits (``checkpointDir``) only.

Actions: ``raise`` an exception, ``kill`` the rank's Python worker (SIGKILL, as the OOM killer
would), ``hang`` until killed. Each firing creates ``state_dir/fired-<n>.pid`` (holding the pid
that failed), which is also how firings are counted across processes and stage retries.

Examples
--------
>>> from sparkdist.models import TorchEstimator
>>> estimator = arm(TorchEstimator(epochs=3), "/tmp/fp", rank=1, epoch=2, step=3)
>>> armed(estimator)["point"]
'torch.step'
>>> disarm(estimator)
>>> armed(estimator) is None
True
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

POINTS = ("torch.rendezvous", "torch.step", "xgboost.round")
ACTIONS = ("raise", "kill", "hang")
#: Armed failpoints by estimator uid (a copy of an estimator, as Pipelines and tuning make,
#: keeps its uid and so its failpoint).
_ARMED: dict[str, dict[str, Any]] = {}


class FailpointError(RuntimeError):
    """The failure an armed failpoint raised."""


def arm(estimator: Any, state_dir: str, *, rank: int, epoch: int = 1, step: int = 0,
        action: str = "raise", times: int = 1) -> Any:
    """Make ``rank`` of ``estimator``'s fits fail at the point ``epoch``/``step`` name (see the
    module docstring) the first ``times`` times it gets there; returns ``estimator``."""
    if action not in ACTIONS:
        raise ValueError(f"action={action!r}: use one of {ACTIONS}")
    xgboost = type(estimator).__name__.startswith("XGBoost")
    point = "xgboost.round" if xgboost else "torch.step" if epoch else "torch.rendezvous"
    if xgboost and step:
        raise ValueError("xgboost.round has no steps: leave step=0")
    _ARMED[estimator.uid] = {"point": point, "rank": rank, "epoch": epoch, "step": step,
                             "action": action, "times": times, "state_dir": str(state_dir)}
    return estimator


def disarm(estimator: Any) -> None:
    _ARMED.pop(estimator.uid, None)


def armed(estimator: Any) -> dict[str, Any] | None:
    """What a fit of ``estimator`` ships to its ranks: its failpoint, or None."""
    found = _ARMED.get(estimator.uid)
    return dict(found) if found else None


def hit(failpoint: dict[str, Any] | None, point: str, rank: int, epoch: int = 0,
        step: int = 0) -> None:
    """Called by a rank at ``point``: fail here if the armed failpoint names this place and
    has firings left."""
    if failpoint is None or (point, rank, epoch, step) != (
            failpoint["point"], failpoint["rank"], failpoint["epoch"], failpoint["step"]):
        return
    firing = _claim_firing(failpoint["state_dir"], failpoint["times"])
    if firing is None:
        return
    if failpoint["action"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if failpoint["action"] == "hang":
        while True:
            time.sleep(1)
    raise FailpointError(f"failpoint {point} fired ({firing}): rank {rank}, epoch {epoch}, "
                         f"step {step}")


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
