"""The learning rate of several workers: ``learningRateScaling`` and ``warmupSteps``.

``batchSize`` is per worker, so a fit on ``k = numWorkers`` workers averages each step over
``k`` times the rows and takes ``1/k`` of the steps per epoch. With the same learning rate it
then moves the weights less per epoch than one worker does. The rule scales the learning
rate with the global batch: ``learningRate x k`` (``"linear"``, Goyal et al. 2017,
"Accurate, Large Minibatch SGD") or ``x sqrt(k)`` (``"sqrt"``, the usual rule for Adam-like
optimizers), reached by a linear ramp from the unscaled ``learningRate`` over the first
``warmupSteps`` steps (Goyal et al.'s gradual warm-up), counted across epochs. ``k`` is the
configured ``numWorkers``: an elastic re-plan on fewer workers keeps the global batch
(``batchSize x numWorkers``), so it keeps the learning rate too.

Plain arithmetic on plain values: the loop sets the rate of the step it is about to take on
the optimizer's parameter groups (:func:`apply`), so every strategy, backend and KerasEstimator
(a torch.optim optimizer) gets it; the step count is in the checkpoints, so a fit resumed
mid-warm-up continues the ramp at its step.

>>> rate_at(0.1, "linear", workers=4, warmup_steps=100, step=0)
0.1
>>> round(rate_at(0.1, "linear", workers=4, warmup_steps=100, step=50), 6)
0.25
>>> rate_at(0.1, "linear", workers=4, warmup_steps=100, step=100)
0.4
>>> rate_at(0.1, "sqrt", workers=4, warmup_steps=0, step=0)
0.2
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: learningRateScaling's values: the factor on learningRate for ``k`` workers.
SCALINGS: dict[str, Callable[[int], float]] = {"none": lambda k: 1.0, "linear": float,
                                               "sqrt": math.sqrt}


def scaled_rate(rate: float, scaling: str, workers: int) -> float:
    """``rate`` scaled for ``workers`` workers by ``scaling`` (one of :data:`SCALINGS`)."""
    return rate * SCALINGS[scaling](workers)


def rate_at(rate: float, scaling: str, workers: int, warmup_steps: int, step: int) -> float:
    """The learning rate of the step numbered ``step`` (0 for the fit's first, counted across
    epochs): the scaled rate, reached by a linear ramp from ``rate`` over the first
    ``warmup_steps`` steps (step 0 takes ``rate``, step ``warmup_steps`` the scaled one)."""
    target = scaled_rate(rate, scaling, workers)
    if step >= warmup_steps:
        return target
    return rate + (target - rate) * step / warmup_steps


def apply(optimizer: Any, rate: float) -> None:
    """Set ``rate`` on every parameter group of ``optimizer`` (any torch.optim optimizer, or
    Horovod's wrapper of one)."""
    for group in optimizer.param_groups:
        group["lr"] = rate
