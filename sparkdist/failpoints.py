"""Failpoints: named places in sparkdist's distributed training where a rank can be made to
fail on purpose, to rehearse recovery before a real cluster does it (as storage engines let
operators and tests do).

A failpoint is a hook (:mod:`sparkdist.hooks`, the one registry of test and benchmark hooks):
armed on one estimator, its fit carries it to the ranks in its spec, and the rank it names
fails when it reaches the point. Off is the default and costs nothing: an unarmed fit carries
no hook, and nothing wraps the rendezvous or the step.

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
>>> armed(estimator).point
'torch.step'
>>> disarm(estimator)
>>> armed(estimator) is None
True
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from sparkdist import hooks
from sparkdist.exceptions import FailpointError

POINTS = ("torch.rendezvous", "torch.step", "xgboost.round")
ACTIONS = ("raise", "kill", "hang")


@dataclasses.dataclass(frozen=True)
class Failpoint:
    """Where one rank fails (see the module docstring), and how often."""

    point: str
    rank: int
    epoch: int
    step: int
    action: str
    times: int
    state_dir: str

    def hit(self, point: str, rank: int, epoch: int = 0, step: int = 0) -> None:
        """Fail here if this failpoint names the place and has firings left."""
        if (point, rank, epoch, step) != (self.point, self.rank, self.epoch, self.step):
            return
        firing = _claim_firing(self.state_dir, self.times)
        if firing is None:
            return
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.action == "hang":
            while True:
                time.sleep(1)
        raise FailpointError(f"failpoint {point} fired ({firing}): rank {rank}, epoch {epoch}, "
                             f"step {step}")

    def wrap_rendezvous(self, call: Callable[..., Any]) -> Callable[..., Any]:
        if self.point != "torch.rendezvous":
            return call

        def rendezvous(*args: Any) -> Any:
            self.hit("torch.rendezvous", self.rank)
            return call(*args)

        return rendezvous

    def wrap_step(self, call: Callable[..., Any], clock: Any) -> Callable[..., Any]:
        if self.point != "torch.step":
            return call

        def step(epoch: int, number: int, *args: Any) -> Any:
            self.hit("torch.step", self.rank, epoch + 1, number)
            return call(epoch, number, *args)

        return step


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
    return hooks.arm(estimator, Failpoint(point, rank, epoch, step, action, times,
                                          str(state_dir)))


def disarm(estimator: Any) -> None:
    hooks.disarm(estimator, Failpoint)


def armed(estimator: Any) -> Failpoint | None:
    """``estimator``'s failpoint, or None."""
    found: Failpoint | None = hooks.of_kind(hooks.armed(estimator), Failpoint)
    return found


def hit(failpoint: Failpoint | None, point: str, rank: int, epoch: int = 0,
        step: int = 0) -> None:
    """Called at ``point`` (XGBoost's round callback): fail here if ``failpoint`` says so."""
    if failpoint is not None:
        failpoint.hit(point, rank, epoch, step)


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
