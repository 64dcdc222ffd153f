"""A test and benchmark hook (:mod:`sparkdist.hooks`, the registry failpoints share): make one
rank of a TorchEstimator's fits a straggler, to rehearse what a slow executor does to training
(``maxStaleness``, bench/communication.py). Not a Param: off unless armed in this process.

The straggler is slow at its own work: after each train step it computes it sleeps
``sleep_s`` seconds plus ``factor - 1`` times the seconds it spent on that step itself (reading
the batch, forward, backward, optimizer step; not the time it waited on other ranks), so
``factor=2`` makes each of its steps take twice as long. A step it skips (``maxStaleness``: a
rank that lags drops a batch to catch up) computes nothing and so costs nothing extra. The
loop wraps the straggler's step around the strategy's from outside, whatever the strategy.

>>> from sparkdist.models import TorchEstimator
>>> estimator = arm(TorchEstimator(), rank=1, factor=2.0)
>>> armed(estimator).rank
1
>>> disarm(estimator)
>>> armed(estimator) is None
True
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from sparkdist import hooks
from sparkdist.torchtrain.network import rows_of


@dataclasses.dataclass(frozen=True)
class Straggle:
    """Which rank is slow, and how slow (see the module docstring)."""

    rank: int
    sleep_s: float = 0.0
    factor: float = 1.0

    def wrap_step(self, call: Callable[..., Any], clock: Any) -> Callable[..., Any]:
        straggler = Straggler(self, clock)

        def step(epoch: int, number: int, features: Any, *args: Any) -> Any:
            straggler.begin()
            skipped = clock.skipped_steps
            loss = call(epoch, number, features, *args)
            straggler.end(loss is not None and rows_of(features) > 0
                          and clock.skipped_steps == skipped)
            return loss

        return step


def arm(estimator: Any, *, rank: int, sleep_s: float = 0.0, factor: float = 1.0) -> Any:
    """Slow ``rank`` of ``estimator``'s fits down (see the module docstring)."""
    if sleep_s < 0 or factor < 1:
        raise ValueError(f"sleep_s={sleep_s}, factor={factor}: use sleep_s >= 0, factor >= 1")
    return hooks.arm(estimator, Straggle(int(rank), float(sleep_s), float(factor)))


def disarm(estimator: Any) -> None:
    hooks.disarm(estimator, Straggle)


def armed(estimator: Any) -> Straggle | None:
    """``estimator``'s straggler, or None."""
    found: Straggle | None = hooks.of_kind(hooks.armed(estimator), Straggle)
    return found


class Straggler:
    """One rank's side of the hook: :meth:`begin` and :meth:`end` around each train step;
    ``clock`` is the rank's StepClock, whose data seconds include each step's batch."""

    def __init__(self, settings: Straggle, clock: Any) -> None:
        self.settings, self.clock = settings, clock
        self._started = self._communication = 0.0
        self._data: float | None = None

    def begin(self) -> None:
        self._started = time.perf_counter()
        self._communication = self.clock.seconds["communication"]

    def end(self, computed: bool) -> None:
        """After a train step: sleep if it was computed."""
        data = self.clock.seconds["data"]
        if computed:
            busy = (data - self._data if self._data is not None else 0.0) + (
                time.perf_counter() - self._started) - (
                self.clock.seconds["communication"] - self._communication)
            pause = self.settings.sleep_s + (self.settings.factor - 1.0) * max(0.0, busy)
            if pause > 0:
                time.sleep(pause)
        self._data = data
