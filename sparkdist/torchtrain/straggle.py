"""A test and benchmark hook, armed like :mod:`sparkdist.failpoints`: make one rank of a
TorchEstimator's fits a straggler, to rehearse what a slow executor does to training
(``maxStaleness``, bench/communication.py). Not a Param: off unless armed in this process.

The straggler is slow at its own work: after each train step it computes it sleeps
``sleep_s`` seconds plus ``factor - 1`` times the seconds it spent on that step itself (reading
the batch, forward, backward, optimizer step; not the time it waited on other ranks), so
``factor=2`` makes each of its steps take twice as long. A step it skips (``maxStaleness``: a
rank that lags drops a batch to catch up) computes nothing and so costs nothing extra.

>>> from sparkdist.models import TorchEstimator
>>> estimator = arm(TorchEstimator(), rank=1, factor=2.0)
>>> armed(estimator)["rank"]
1
>>> disarm(estimator)
>>> armed(estimator) is None
True
"""

from __future__ import annotations

import time
from typing import Any

#: Armed stragglers by estimator uid (copies of an estimator keep its uid).
_ARMED: dict[str, dict[str, Any]] = {}


def arm(estimator: Any, *, rank: int, sleep_s: float = 0.0, factor: float = 1.0) -> Any:
    """Slow ``rank`` of ``estimator``'s fits down (see the module docstring)."""
    if sleep_s < 0 or factor < 1:
        raise ValueError(f"sleep_s={sleep_s}, factor={factor}: use sleep_s >= 0, factor >= 1")
    _ARMED[estimator.uid] = {"rank": int(rank), "sleep_s": float(sleep_s),
                             "factor": float(factor)}
    return estimator


def disarm(estimator: Any) -> None:
    _ARMED.pop(estimator.uid, None)


def armed(estimator: Any) -> dict[str, Any] | None:
    """What a fit of ``estimator`` ships to its ranks (the ``straggle`` args key), or None."""
    found = _ARMED.get(estimator.uid)
    return dict(found) if found else None


class Straggler:
    """One rank's side of the hook: :meth:`begin` and :meth:`end` around each train step."""

    def __init__(self, settings: dict[str, Any] | None, rank: int) -> None:
        self.settings = settings if settings and settings["rank"] == rank else None
        self._started = self._communication = 0.0
        self._data: float | None = None

    def begin(self, clock: Any) -> None:
        if self.settings:
            self._started = time.perf_counter()
            self._communication = clock.seconds["communication"]

    def end(self, clock: Any, computed: bool) -> None:
        """After a train step (``clock``: the rank's StepClock, whose data seconds include
        this step's batch): sleep if it was computed."""
        if not self.settings:
            return
        data = clock.seconds["data"]
        if computed:
            busy = (data - self._data if self._data is not None else 0.0) + (
                time.perf_counter() - self._started) - (
                clock.seconds["communication"] - self._communication)
            pause = self.settings["sleep_s"] + (self.settings["factor"] - 1.0) * max(0.0, busy)
            if pause > 0:
                time.sleep(pause)
        self._data = data
