"""L-BFGS (strong-Wolfe line search) and OWL-QN (L1 by orthant-wise steps) in numpy float64.

Deterministic: the same objective values give the same iterates, so every rank of the
all-reduce solver runs this on the same all-reduced values and holds the same point. The
stopping rules are Breeze's ``defaultConvergenceCheck``, which MLlib's LogisticRegression
uses: ``maxIter`` iterations, or the objective moved by at most ``tol * |f(x0)|`` over the
last 20 iterations, or ``||(pseudo-)gradient|| <= max(tol * f, 1e-8)``, or a failed line
search.

>>> import numpy as np
>>> result = minimize(lambda x: (float(((x - 3) ** 2).sum()), 2 * (x - 3)), np.zeros(2),
...                   max_iter=50, tol=1e-9)
>>> np.round(result.x, 6).tolist(), result.reason
([3.0, 3.0], 'gradient')
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

#: ``x -> (f(x), gradient of f at x)``: the smooth part of the objective.
Objective = Callable[[np.ndarray], "tuple[float, np.ndarray]"]
_C1, _C2 = 1e-4, 0.9  # sufficient decrease and curvature constants
_MEMORY, _FVAL_MEMORY, _LINE_EVALS = 10, 20, 20


@dataclass
class Result:
    """Where the optimiser stopped and why."""

    x: np.ndarray
    iterations: int
    reason: str  # "max iterations", "function values", "gradient" or "line search failed"
    history: list[float] = field(default_factory=list)  # objective (with L1) per iterate


def minimize(fun: Objective, x0: np.ndarray, *, max_iter: int, tol: float,
             l1: np.ndarray | None = None, memory: int = _MEMORY) -> Result:
    """Minimise ``fun(x) + sum(l1 * |x|)`` from ``x0`` (L-BFGS, or OWL-QN where ``l1`` has a
    positive entry)."""
    l1 = l1 if l1 is not None and np.any(l1 > 0) else None
    x = np.array(x0, dtype=np.float64)
    f, g = fun(x)
    big_f = f + _l1_value(l1, x)
    first, history, fvals = big_f, [big_f], [np.inf]
    pairs: deque[tuple[np.ndarray, np.ndarray, float]] = deque(maxlen=memory)
    iteration, pg = 0, _pseudo_gradient(x, g, l1)
    reason = _converged(iteration, max_iter, tol, big_f, first, pg, fvals)
    while reason is None:
        d = -_two_loop(pg, pairs)
        if l1 is not None:
            d[d * pg >= 0] = 0.0  # OWL-QN: keep the components that descend along -pg
        if d @ pg >= 0:  # not a descent direction: restart from steepest descent
            pairs.clear()
            d = -pg
        step = 1.0 / max(float(np.linalg.norm(d)), 1e-300) if iteration == 0 else 1.0
        found = (_wolfe(fun, x, f, g, d, step) if l1 is None
                 else _orthant_backtrack(fun, x, big_f, pg, d, l1, step, iteration))
        if found is None:
            reason = "line search failed"
            break
        x_new, f_new, g_new = found
        s, y = x_new - x, g_new - g
        if (sy := float(s @ y)) > 1e-12 * float(np.linalg.norm(s) * np.linalg.norm(y)):
            pairs.append((s, y, sy))
        x, f, g = x_new, f_new, g_new
        big_f = f + _l1_value(l1, x)
        iteration += 1
        pg = _pseudo_gradient(x, g, l1)
        history.append(big_f)
        fvals = (fvals + [big_f])[-_FVAL_MEMORY:]
        reason = _converged(iteration, max_iter, tol, big_f, first, pg, fvals)
    return Result(x=x, iterations=iteration, reason=reason, history=history)


def _l1_value(l1: np.ndarray | None, x: np.ndarray) -> float:
    return 0.0 if l1 is None else float(l1 @ np.abs(x))


def _pseudo_gradient(x: np.ndarray, g: np.ndarray, l1: np.ndarray | None) -> np.ndarray:
    """The gradient, or with L1 the minimum-norm subgradient of ``f + l1 |x|``."""
    if l1 is None:
        return g
    right, left = g + l1, g - l1  # one-sided derivatives at x == 0
    at_zero = np.where(right < 0, right, np.where(left > 0, left, 0.0))
    return np.where(x > 0, right, np.where(x < 0, left, at_zero))


def _converged(iteration: int, max_iter: int, tol: float, value: float, first: float,
               pg: np.ndarray, fvals: list[float]) -> str | None:
    if iteration >= max_iter:
        return "max iterations"
    if len(fvals) >= 2 and abs(value - max(fvals)) <= tol * abs(first):
        return "function values"
    if float(np.linalg.norm(pg)) <= max(tol * value, 1e-8):
        return "gradient"
    return None


def _two_loop(g: np.ndarray, pairs: deque[tuple[np.ndarray, np.ndarray, float]]) -> np.ndarray:
    """``H g`` for the L-BFGS inverse-Hessian approximation of the stored pairs."""
    q, alphas = g.copy(), []
    for s, y, sy in reversed(pairs):
        alpha = float(s @ q) / sy
        alphas.append(alpha)
        q -= alpha * y
    if pairs:
        s, y, sy = pairs[-1]
        q *= sy / float(y @ y)
    for (s, y, sy), alpha in zip(pairs, reversed(alphas)):
        q += (alpha - float(y @ q) / sy) * s
    return q


_Point = tuple[float, float, float, np.ndarray, np.ndarray]  # step, f, slope, x, gradient


def _wolfe(fun: Objective, x: np.ndarray, f0: float, g0: np.ndarray, d: np.ndarray,
           step: float) -> tuple[np.ndarray, float, np.ndarray] | None:
    """A step satisfying the strong Wolfe conditions (Nocedal & Wright, alg. 3.5/3.6)."""
    slope0 = float(g0 @ d)

    def at(a: float) -> _Point:
        xa = x + a * d
        fa, ga = fun(xa)
        return a, fa, float(ga @ d), xa, ga

    prev: _Point = (0.0, f0, slope0, x, g0)
    for evals in range(1, _LINE_EVALS + 1):
        cur = at(step)
        if not np.isfinite(cur[1]) or cur[1] > f0 + _C1 * step * slope0 or \
                (evals > 1 and cur[1] >= prev[1]):
            return _zoom(at, prev, cur, f0, slope0, _LINE_EVALS - evals)
        if abs(cur[2]) <= -_C2 * slope0:
            return cur[3], cur[1], cur[4]
        if cur[2] >= 0:
            return _zoom(at, cur, prev, f0, slope0, _LINE_EVALS - evals)
        prev, step = cur, step * 2.0
    return prev[3], prev[1], prev[4]


def _zoom(at: Callable[[float], _Point], lo: _Point, hi: _Point, f0: float, slope0: float,
          evals: int) -> tuple[np.ndarray, float, np.ndarray] | None:
    for _ in range(max(evals, 0)):
        a = _cubic_step(lo, hi)
        cur = at(a)
        if not np.isfinite(cur[1]) or cur[1] > f0 + _C1 * a * slope0 or cur[1] >= lo[1]:
            hi = cur
        else:
            if abs(cur[2]) <= -_C2 * slope0:
                return cur[3], cur[1], cur[4]
            if cur[2] * (hi[0] - lo[0]) >= 0:
                hi = lo
            lo = cur
        if abs(hi[0] - lo[0]) <= 1e-16 * max(abs(lo[0]), 1.0):
            break
    # out of evaluations: lo satisfies sufficient decrease (a usable step) unless it is x
    return (lo[3], lo[1], lo[4]) if lo[0] > 0 else None


def _cubic_step(lo: _Point, hi: _Point) -> float:
    """The minimiser of the cubic through both ends' values and slopes, kept inside the
    middle 80 % of the interval (bisection where the cubic has no minimiser)."""
    (a0, f0, d0, *_), (a1, f1, d1, *_) = lo, hi
    width, left = abs(a1 - a0), min(a0, a1)
    t1 = d0 + d1 - 3.0 * (f0 - f1) / (a0 - a1)
    root = t1 * t1 - d0 * d1
    a = (a0 + a1) / 2.0
    if root >= 0 and np.isfinite(root):
        t2 = np.copysign(np.sqrt(root), a1 - a0)
        denom = d1 - d0 + 2.0 * t2
        if denom != 0:
            a = a1 - (a1 - a0) * (d1 + t2 - t1) / denom
    if not np.isfinite(a):
        a = (a0 + a1) / 2.0
    return float(min(max(a, left + 0.1 * width), left + 0.9 * width))


def _orthant_backtrack(fun: Objective, x: np.ndarray, big_f: float, pg: np.ndarray,
                       d: np.ndarray, l1: np.ndarray, step: float,
                       iteration: int) -> tuple[np.ndarray, float, np.ndarray] | None:
    """OWL-QN's backtracking: points projected onto the orthant of ``x`` (of ``-pg`` where
    ``x`` is 0), sufficient decrease measured along the pseudo-gradient."""
    orthant = np.where(x != 0, np.sign(x), np.sign(-pg))
    shrink = 0.1 if iteration == 0 else 0.5  # Breeze's OWLQN
    for _ in range(_LINE_EVALS):
        xa = x + step * d
        xa[np.sign(xa) != orthant] = 0.0
        fa, ga = fun(xa)
        if np.isfinite(fa) and fa + _l1_value(l1, xa) <= big_f + _C1 * float(pg @ (xa - x)):
            return xa, fa, ga
        step *= shrink
    return None
