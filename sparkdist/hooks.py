"""The one registry of test and benchmark hooks: failpoints (:mod:`sparkdist.failpoints`) and
stragglers (:mod:`sparkdist.torchtrain.straggle`).

A hook is armed on one estimator, in this process (never a Param, so never saved): a fit
puts :func:`armed` into its spec (``TrainSpec.hooks``; the XGBoost chunks take their
failpoint), and the ranks apply the hooks by wrapping what they call from outside
(:func:`around_rendezvous`, :func:`around_step`). A fit with no hook armed wraps nothing: its
training step runs no hook code.

A hook is a frozen value with a ``rank`` and two optional methods, each returning ``call``
itself where the hook has nothing to do there:

- ``wrap_rendezvous(call)``: around the rank's joining of the process group;
- ``wrap_step(call, clock)``: around one training step,
  ``call(epoch, step, features, label) -> loss | None`` (``epoch`` 0-based; None: a step
  no rank has rows for).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Armed hooks by estimator uid, one per kind (a copy of an estimator, as Pipelines and
#: tuning make, keeps its uid and so its hooks).
_ARMED: dict[str, dict[type, Any]] = {}


def arm(estimator: Any, hook: Any) -> Any:
    """Arm ``hook`` on ``estimator``'s fits (replacing one of its kind); returns
    ``estimator``."""
    _ARMED.setdefault(estimator.uid, {})[type(hook)] = hook
    return estimator


def disarm(estimator: Any, kind: type | None = None) -> None:
    """Drop ``estimator``'s hook of ``kind``, or all of them."""
    if kind is None:
        _ARMED.pop(estimator.uid, None)
    else:
        _ARMED.get(estimator.uid, {}).pop(kind, None)


def armed(estimator: Any) -> tuple[Any, ...]:
    """The hooks a fit of ``estimator`` carries to its ranks (empty in production)."""
    return tuple(_ARMED.get(estimator.uid, {}).values())


def of_kind(hooks: tuple[Any, ...], kind: type) -> Any:
    """The hook of ``kind`` among ``hooks``, or None."""
    return next((hook for hook in hooks if isinstance(hook, kind)), None)


def around_rendezvous(call: Callable[..., Any], hooks: tuple[Any, ...],
                      rank: int) -> Callable[..., Any]:
    """``call`` (a rank's rendezvous) wrapped by the hooks armed for ``rank``."""
    for hook in _for_rank(hooks, rank, "wrap_rendezvous"):
        call = hook.wrap_rendezvous(call)
    return call


def around_step(call: Callable[..., Any], hooks: tuple[Any, ...], rank: int,
                clock: Any) -> Callable[..., Any]:
    """``call`` (a rank's training step, see the module docstring) wrapped by the hooks armed
    for ``rank``; ``clock`` is the rank's :class:`sparkdist.torchtrain.clock.StepClock`."""
    for hook in _for_rank(hooks, rank, "wrap_step"):
        call = hook.wrap_step(call, clock)
    return call


def _for_rank(hooks: tuple[Any, ...], rank: int, method: str) -> list[Any]:
    return [hook for hook in hooks if hook.rank == rank and hasattr(hook, method)]
