"""The search space of a :class:`~sparkdist.tuning.Tuner`, checked against the estimator before
any trial runs: Param names (with a did-you-mean), distribution types against each Param's
type converter, a ``ParamGridBuilder`` grid as Optuna's grid, and the sampler and pruner by
name. Optuna is imported inside the functions (the ``tuning`` extra)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.ml import Pipeline
from pyspark.ml.param import Param, Params

from sparkdist.columns import check_one_of, suggest
from sparkdist.exceptions import ParamError

PRUNERS = ("none", "median", "asha")
SAMPLERS = ("tpe", "random")
#: The metrics of :func:`sparkdist.evaluation.evaluate` a Tuner optimises by name, and
#: whether larger is better.
METRICS = {"auc": True, "pr_auc": True, "accuracy": True, "f1": True, "logloss": False,
           "rmse": False, "mae": False, "r2": True}
_GRID_TYPES = (type(None), bool, int, float, str)


def optuna_module() -> Any:
    try:
        import optuna
    except ImportError:
        raise ImportError('sparkdist.tuning needs the tuning extra: pip install '
                          '"sparkdist[tuning]"') from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def stages(estimator: Any) -> list[Any]:
    """The stages of a (nested) Pipeline, the last one first; a lone estimator alone."""
    if isinstance(estimator, Pipeline):
        found: list[Any] = []
        for stage in estimator.getStages():
            found = stages(stage) + found
        return found
    return [estimator]


def find_param(estimator: Any, name: str, where: str) -> tuple[Any, Param[Any]]:
    """The stage (the last one that has it) and Param called ``name``, or ParamError."""
    for stage in stages(estimator):
        if isinstance(stage, Params) and stage.hasParam(name):
            return stage, stage.getParam(name)
    names = sorted({p.name for s in stages(estimator) if isinstance(s, Params)
                    for p in s.params})
    raise ParamError(f"{where} names the Param {name!r}, which {type(estimator).__name__} does "
                     f"not have.{suggest(name, names)} Name a Param of the estimator (or of a "
                     "stage of the Pipeline).")


def samples(distribution: Any) -> list[Any]:
    """Values a distribution can yield, to try on the Param's type converter."""
    optuna = optuna_module()
    dists = optuna.distributions
    if isinstance(distribution, dists.CategoricalDistribution):
        return list(distribution.choices)
    if isinstance(distribution, dists.IntDistribution):
        return [int(distribution.low), int(distribution.high)]
    if isinstance(distribution, dists.FloatDistribution):
        return [float(distribution.low), (distribution.low + distribution.high) / 2 + 0.1234567]
    raise ParamError(f"{type(distribution).__name__} is not an Optuna distribution: use "
                     "FloatDistribution, IntDistribution or CategoricalDistribution.")


def check_space(estimator: Any, space: Any) -> dict[str, Any]:
    """``space`` (Param name -> Optuna distribution) checked against ``estimator``."""
    optuna = optuna_module()
    if not isinstance(space, Mapping) or not space:
        raise ParamError(f"space={space!r}: give a dict of Param name -> Optuna distribution, "
                         "e.g. {'regParam': FloatDistribution(1e-4, 1.0, log=True)}, or a "
                         "ParamGridBuilder().addGrid(...).build() grid.")
    checked: dict[str, Any] = {}
    for name, distribution in space.items():
        where = f"space[{name!r}]"
        stage, param = find_param(estimator, str(name), where)
        if not isinstance(distribution, optuna.distributions.BaseDistribution):
            raise ParamError(f"{where}={distribution!r} is not an Optuna distribution; wrap "
                             f"the values, e.g. CategoricalDistribution({distribution!r}).")
        for value in samples(distribution):
            try:
                param.typeConverter(value)
            except (TypeError, ValueError) as err:
                raise ParamError(
                    f"{where}: {type(distribution).__name__} yields {value!r}, which "
                    f"{type(stage).__name__}.{name} does not take ({err}). Use a distribution "
                    f"of the Param's type (doc: {param.doc})") from err
        checked[str(name)] = distribution
    return checked


def grid_space(estimator: Any, grid: Sequence[Mapping[Param[Any], Any]]) -> dict[str, Any]:
    """A ``ParamGridBuilder`` grid as categorical distributions for Optuna's GridSampler."""
    optuna = optuna_module()
    values: dict[str, list[Any]] = {}
    for point in grid:
        for param, value in point.items():
            find_param(estimator, param.name, f"the grid's Param {param.name!r}")
            if not isinstance(value, _GRID_TYPES):
                raise ParamError(f"the grid gives {param.name}={value!r}; Optuna's grid takes "
                                 "None, bool, int, float or str values only.")
            seen = values.setdefault(param.name, [])
            if value not in seen:
                seen.append(value)
    space = {name: optuna.distributions.CategoricalDistribution(choices)
             for name, choices in values.items()}
    return check_space(estimator, space)


def is_grid(space: Any) -> bool:
    """Whether ``space`` is a ParamGridBuilder grid (a list of Param maps)."""
    return (isinstance(space, (list, tuple)) and bool(space)
            and all(isinstance(p, Mapping) and all(isinstance(k, Param) for k in p)
                    for p in space))


def signature(space: Mapping[str, Any]) -> str:
    """The space as JSON: stored with the study, compared when a study is resumed."""
    optuna = optuna_module()
    to_json = optuna.distributions.distribution_to_json
    return json.dumps({name: json.loads(to_json(d)) for name, d in sorted(space.items())},
                      sort_keys=True)


def make_sampler(sampler: Any, space: Mapping[str, Any], grid: bool, seed: int) -> Any:
    """Optuna's sampler: a GridSampler for a grid, else the object given or one by name."""
    optuna = optuna_module()
    if grid:
        search = {name: list(d.choices) for name, d in space.items()}
        return _grid_sampler(optuna)(search, seed=seed)
    if isinstance(sampler, optuna.samplers.GridSampler):
        raise ParamError("sampler=GridSampler(...): give the grid as space (a ParamGridBuilder "
                         "grid); the Tuner then searches it exhaustively.")
    if isinstance(sampler, optuna.samplers.BaseSampler):
        return sampler
    check_one_of("sampler", sampler, SAMPLERS)
    if sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _grid_sampler(optuna: Any) -> Any:
    """Optuna's GridSampler without its ``after_trial``, which calls ``study.stop()`` once the
    grid is covered: allowed inside ``study.optimize`` only, and the Tuner runs trials with
    ask and tell (it asks for no more trials than the grid has points)."""
    class _Grid(optuna.samplers.GridSampler):  # type: ignore[name-defined, misc]
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None
    return _Grid


def make_pruner(pruner: Any) -> Any:
    """Optuna's pruner: the object given, or by name: asha -> SuccessiveHalvingPruner, median
    -> MedianPruner, none -> NopPruner (each with Optuna's defaults)."""
    optuna = optuna_module()
    if isinstance(pruner, optuna.pruners.BasePruner):
        return pruner
    check_one_of("pruner", pruner, PRUNERS)
    if pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner()
    if pruner == "median":
        return optuna.pruners.MedianPruner()
    return optuna.pruners.NopPruner()


def check_metric(evaluator: Any) -> tuple[str, bool]:
    """(metric name, larger is better) of a metric name or a pyspark Evaluator."""
    if isinstance(evaluator, str):
        if evaluator not in METRICS:
            raise ParamError(f"evaluator={evaluator!r} is not a metric sparkdist.evaluation "
                             f"computes; use one of {sorted(METRICS)} or a pyspark Evaluator."
                             f"{suggest(evaluator, METRICS)}")
        return evaluator, METRICS[evaluator]
    if not (hasattr(evaluator, "evaluate") and hasattr(evaluator, "isLargerBetter")):
        raise ParamError(f"evaluator={evaluator!r}: give a metric name ({sorted(METRICS)}) or "
                         "a pyspark.ml.evaluation Evaluator.")
    name = (evaluator.getOrDefault("metricName") if evaluator.hasParam("metricName")
            else type(evaluator).__name__)
    return str(name), bool(evaluator.isLargerBetter())
