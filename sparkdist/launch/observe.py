"""Watching a fit from the driver thread that runs it: a callback on rank 0's per-epoch
reports that may stop the fit (a Tuner's pruner does).

An observer is never a Param and never saved: it is set for the calling thread only
(:func:`observing`), so concurrent fits from other threads (a Tuner's parallel trials) each
see their own. :func:`sparkdist.launch.barrier.run_barrier` reads it when the fit starts and
tells the ranks; rank 0 then waits for the driver's answer to each epoch's record. When the
callback asks to stop, the answer is stop and the ranks end the fit after that epoch (where
rank 0 did not ask, the fit's barrier job is cancelled), and the fit raises
:class:`sparkdist.exceptions.FitStopped` once its tasks have ended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: ``record -> stop?``: called in a driver thread with each progress record of rank 0 (a dict
#: with ``epoch``, ``loss`` and, with validation rows, ``val_loss`` / ``val_accuracy``).
Observer = Callable[[dict[str, Any]], bool]

_LOG = logging.getLogger(__name__)
_LOCAL = threading.local()


@contextmanager
def observing(observer: Observer) -> Iterator[None]:
    """Run the fits started in this block, in this thread, under ``observer``."""
    previous = current()
    _LOCAL.observer = observer
    try:
        yield
    finally:
        _LOCAL.observer = previous


def current() -> Observer | None:
    """This thread's observer, or None (every fit outside a Tuner)."""
    return getattr(_LOCAL, "observer", None)


class Stopper:
    """A fit's report callback under an observer: passes each record on to ``on_report``,
    then to the observer, and answers whether the fit is to stop. The first time the observer
    says stop it notes when and after which epoch; a record that asks (rank 0 waits for the
    answer, and the ranks end the fit after that epoch) is answered True, any other makes it
    call ``cancel`` (the fit's current barrier job). An observer that raises is logged and
    ignored: watching must not fail the fit."""

    def __init__(self, observer: Observer, on_report: Callable[[dict[str, Any]], Any] | None,
                 cancel: Callable[[], None]) -> None:
        self.observer, self.on_report, self.cancel = observer, on_report, cancel
        self.decided_at: float | None = None
        self.epoch = 0

    def __call__(self, record: dict[str, Any]) -> bool:
        if self.on_report is not None:
            self.on_report(record)
        if self.decided_at is None:
            try:
                stop = self.observer(record)
            except Exception as err:
                _LOG.warning("the fit's observer failed on %s (%s); the fit goes on", record,
                             err)
                return False
            if not stop:
                return False
            self.decided_at, self.epoch = time.monotonic(), int(record.get("epoch", 0))
            if not record.get("ask"):
                self.cancel()
        return True
