"""Base classes for sparkdist estimators that delegate the optimisation to MLlib.

A wrapper declares the MLlib estimator it drives and reuses that estimator's own Params mixin,
so every MLlib Param keeps its name, doc and default; sparkdist adds Params of its own on top.
``_fit`` copies the shared Params onto a fresh MLlib estimator, fits it, and wraps the fitted
MLlib model. Persistence stores sparkdist's metadata plus the MLlib model in its own format.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Params
from pyspark.ml.wrapper import JavaEstimator, JavaModel
from pyspark.sql import DataFrame, SparkSession

from sparkdist import store
from sparkdist.columns import suggest
from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.persist import ParamsPersistence, PersistentModel, error_line

MLLIB_DIR = "mllib"  # where the wrapped MLlib model lives inside a saved sparkdist model

# -- MLlib's Param validators ----------------------------------------------------------------
# MLlib validates Params in the JVM, at fit time (after any data work) and with an untyped
# IllegalArgumentException; pyspark's Params carry no validators. This table restates them so
# they are checked on the driver before anything runs, with no session (a config is checked
# before Spark starts) and on Spark Connect alike. tests/spark/test_models_lr_forest.py
# compares every rule with the JVM's own validator.
#: A rule returns None for a valid value, else the allowed range in words.
Rule = Callable[[Params, Any], "str | None"]


def _between(low: float, high: float = math.inf, low_open: bool = False,
             high_open: bool = False) -> Rule:
    text = (f">= {low}" if high == math.inf else
            f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}")

    def rule(stage: Params, value: Any) -> str | None:
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        return None if above and below else text
    return rule


def _one_of(choices: Callable[[Params], list[str]]) -> Rule:
    def rule(stage: Params, value: Any) -> str | None:  # MLlib compares lower-cased names
        allowed = choices(stage)
        if str(value).lower() in allowed:
            return None
        return f"one of {allowed}.{suggest(str(value), allowed)}"
    return rule


def _subset_strategy(stage: Params, value: Any) -> str | None:
    """A named strategy, a whole number of features > 0, or a fraction in (0, 1]."""
    text = str(value)
    if text.lower() in stage.supportedFeatureSubsetStrategies:  # type: ignore[attr-defined]
        return None
    for kind, ok in ((int, lambda n: n > 0), (float, lambda x: 0 < x <= 1)):
        try:
            if ok(kind(text)):
                return None
        except ValueError:
            pass
    return (f"one of {stage.supportedFeatureSubsetStrategies}, a whole number > 0 or a "  # type: ignore[attr-defined]
            "fraction in (0, 1]")


def _thresholds(stage: Params, value: Any) -> str | None:
    ok = all(t >= 0 for t in value) and sum(t == 0 for t in value) <= 1
    return None if ok else "a list of values >= 0 with at most one 0"


_STORAGE_LEVELS = ["DISK_ONLY", "DISK_ONLY_2", "DISK_ONLY_3", "MEMORY_ONLY", "MEMORY_ONLY_2",
                   "MEMORY_ONLY_SER", "MEMORY_ONLY_SER_2", "MEMORY_AND_DISK",
                   "MEMORY_AND_DISK_2", "MEMORY_AND_DISK_SER", "MEMORY_AND_DISK_SER_2",
                   "OFF_HEAP"]


def _storage_level(allow_none: bool) -> Rule:
    allowed = _STORAGE_LEVELS + (["NONE"] if allow_none else [])
    return lambda stage, value: None if value in allowed else f"one of {allowed}"


PARAM_RULES: dict[str, Rule] = {
    # shared by several estimators
    "maxIter": _between(0), "regParam": _between(0), "tol": _between(0),
    "checkpointInterval": lambda stage, value: None if value == -1 or value >= 1
    else "-1 (never) or >= 1",
    "thresholds": _thresholds,
    # logistic regression
    "elasticNetParam": _between(0, 1), "threshold": _between(0, 1),
    "aggregationDepth": _between(2), "maxBlockSizeInMB": _between(0),
    "family": _one_of(lambda stage: ["auto", "binomial", "multinomial"]),
    # random forests
    "maxDepth": _between(0, 30), "maxBins": _between(2), "minInstancesPerNode": _between(1),
    "minInfoGain": _between(0), "maxMemoryInMB": _between(0), "numTrees": _between(1),
    "subsamplingRate": _between(0, 1, low_open=True),
    "minWeightFractionPerNode": _between(0, 0.5, high_open=True),
    "impurity": _one_of(lambda stage: stage.supportedImpurities),  # type: ignore[attr-defined]
    "featureSubsetStrategy": _subset_strategy,
    # ALS
    "rank": _between(1), "numUserBlocks": _between(1), "numItemBlocks": _between(1),
    "alpha": _between(0), "blockSize": _between(1),
    "coldStartStrategy": _one_of(lambda stage: ["nan", "drop"]),
    "intermediateStorageLevel": _storage_level(allow_none=False),
    "finalStorageLevel": _storage_level(allow_none=True),
}


def check_mllib_params(stage: Params) -> None:
    """ParamError naming the first Param whose value MLlib would refuse, and its range."""
    for param, value in stage.extractParamMap().items():
        rule = PARAM_RULES.get(param.name)
        allowed = rule(stage, value) if rule is not None and value is not None else None
        if allowed is not None:
            what = re.sub(r"\s*\(.*?\)", "", param.doc.split(". ")[0]).rstrip(".")
            raise ParamError(f"{param.name}={value!r} is out of range: {type(stage).__name__} "
                             f"needs {param.name} {allowed} ({what}).")


_P = TypeVar("_P", bound=Params)

def copy_shared_params(source: Params, target: _P) -> _P:
    """Copy every Param of ``source`` that ``target`` also has: set values as set, defaults as
    defaults (so MLlib's threshold/thresholds consistency check sees only real choices)."""
    for param, value in source.extractParamMap().items():
        if target.hasParam(param.name):
            if source.isSet(param):
                target._set(**{param.name: value})
            else:
                target._setDefault(**{param.name: value})
    return target


def delegated(name: str, doc: str) -> Any:
    """A read-only property that reads ``name`` from the fitted MLlib model (the wrapper's
    ``mllib_model``), documented by ``doc``."""
    return property(lambda self: getattr(self.mllib_model, name), doc=doc)


class MLlibEstimator(Estimator, ParamsPersistence):
    """An Estimator that fits ``_mllib_estimator`` and returns ``_model_class``."""

    _mllib_estimator: ClassVar[type[JavaEstimator]]
    _model_class: ClassVar[type[MLlibModel]]
    #: Every Param classified by the fingerprint policy (see ``_recovery``): True when it
    #: shapes the fitted model. No MLlib fit resumes today; the classification keeps the
    #: policy whole, so a resumable MLlib fit starts from it.
    _trajectory: ClassVar[dict[str, bool]]

    def _fit(self, dataset: DataFrame) -> MLlibModel:
        self._check_params()
        self._validate(dataset)
        model = self._model_class(self._fit_mllib(dataset))
        self._copyValues(model)
        return model

    def _fit_mllib(self, dataset: DataFrame, **overrides: Any) -> JavaModel:
        inner = copy_shared_params(self, self._mllib_estimator())
        inner._set(**overrides)
        return inner.fit(dataset)

    # Hooks: Param checks, then input checks, before the MLlib fit.
    def _check_params(self) -> None:
        """ParamError for a Param value out of range; no data needed (a config build calls
        it before Spark starts)."""
        check_mllib_params(self)

    def _validate(self, dataset: DataFrame) -> None:
        """Raise a typed sparkdist error for bad input before training (schema checks, and at
        most one aggregation job over the input)."""


class MLlibModel(Model, PersistentModel):
    """A fitted wrapper: delegates ``transform`` to the MLlib model, with this model's Params
    (output column names, threshold, ...) pushed down first."""

    _mllib_model: ClassVar[type[JavaModel]]
    #: "classification", "regression" or "recommendation": how evaluation scores it.
    task: ClassVar[str]

    def __init__(self, inner: JavaModel | None = None) -> None:
        super().__init__()
        self._inner = inner

    @property
    def mllib_model(self) -> Any:  # the MLlib model class of each wrapper
        """The wrapped MLlib model (coefficients, trees, summaries)."""
        assert self._inner is not None, f"{type(self).__name__} is not fitted"
        return copy_shared_params(self, self._inner.copy())

    def _transform(self, dataset: DataFrame) -> DataFrame:
        return self.mllib_model.transform(dataset)

    def _state(self) -> dict[str, Any]:
        return {}

    def _save_artifacts(self, path: str) -> None:
        with store.jvm_output(SparkSession.active(), f"{path}/{MLLIB_DIR}") as out:
            self.mllib_model.write().save(out)

    @classmethod
    def _from_state(cls, state: dict[str, Any], path: str) -> MLlibModel:
        model = cls(load_mllib(cls._mllib_model, path))
        model._load_state(state)
        return model

    def _load_state(self, state: dict[str, Any]) -> None:
        """Restore what ``_state`` saved (subclasses with state override both)."""


def load_mllib(model_class: Any, path: str) -> Any:
    """The MLlib model saved under ``path/mllib``; ModelLoadError when that directory is
    missing or MLlib cannot read it (a directory copied in part, or edited)."""
    source = f"{path}/{MLLIB_DIR}"
    if not store.exists(source):
        raise ModelLoadError(f"'{path}' is incomplete: it has no {MLLIB_DIR}/ directory (the "
                             "fitted MLlib model). Save the model again.")
    try:
        return model_class.load(store.jvm_input(SparkSession.active(), source))
    except (Py4JJavaError, PySparkException) as err:
        raise ModelLoadError(f"'{source}' is not a readable MLlib {model_class.__name__} "
                             f"({error_line(err)}). Save the model again.") from err
