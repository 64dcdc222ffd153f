"""A test and benchmark hook, armed like :mod:`sparkdist.failpoints`: make one rank of a
TorchEstimator's fits a straggler, to rehearse what a slow executor does to training
(``maxStaleness``, bench/communication.py). Not a Param: off unless armed in this process.

The straggler is slow at computing: after each train step it computes (forward, backward,
optimizer step) it sleeps ``sleep_s`` seconds, plus ``factor - 1`` times the seconds the step
took (``factor=2``: every step it computes takes twice as long). A step it skips
(``maxStaleness``: a rank that lags drops a batch to catch up) computes nothing and so
costs nothing extra.

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


def delay(settings: dict[str, Any] | None, rank: int, step_seconds: float) -> None:
    """Called by a rank after each step it computed, which took ``step_seconds``."""
    if settings is None or settings["rank"] != rank:
        return
    pause = settings["sleep_s"] + (settings["factor"] - 1.0) * step_seconds
    if pause > 0:
        time.sleep(pause)
