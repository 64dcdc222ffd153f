"""Base classes for sparkdist estimators that delegate the optimisation to MLlib.

A wrapper declares the MLlib estimator it drives and reuses that estimator's own Params mixin,
so every MLlib Param keeps its name, doc and default; sparkdist adds Params of its own on top.
``_fit`` copies the shared Params onto a fresh MLlib estimator, fits it, and wraps the fitted
MLlib model. Persistence stores sparkdist's metadata plus the MLlib model in its own format.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pyspark.ml import Estimator, Model
from pyspark.ml.param import Params
from pyspark.ml.wrapper import JavaEstimator, JavaModel
from pyspark.sql import DataFrame, SparkSession

from sparkdist import store
from sparkdist.persist import ParamsPersistence, PersistentModel

MLLIB_DIR = "mllib"  # where the wrapped MLlib model lives inside a saved sparkdist model


def copy_shared_params(source: Params, target: Params) -> Params:
    """Copy every Param of ``source`` that ``target`` also has: set values as set, defaults as
    defaults (so MLlib's threshold/thresholds consistency check sees only real choices)."""
    for param, value in source.extractParamMap().items():
        if target.hasParam(param.name):
            if source.isSet(param):
                target._set(**{param.name: value})
            else:
                target._setDefault(**{param.name: value})
    return target


class MLlibEstimator(Estimator, ParamsPersistence):
    """An Estimator that fits ``_mllib_estimator`` and returns ``_model_class``."""

    _mllib_estimator: ClassVar[type[JavaEstimator]]
    _model_class: ClassVar[type[MLlibModel]]

    def _fit(self, dataset: DataFrame) -> MLlibModel:
        self._validate(dataset)
        prepared = self._prepare(dataset)
        inner = self._fit_mllib(prepared)
        model = self._model_class(inner)
        self._copyValues(model)
        self._finish(model, prepared)
        return model

    def _fit_mllib(self, dataset: DataFrame, **overrides: Any) -> JavaModel:
        inner = copy_shared_params(self, self._mllib_estimator())
        inner._set(**overrides)
        return inner.fit(dataset)

    # Hooks: validation first thing, input preparation, and work after the MLlib fit.
    def _validate(self, dataset: DataFrame) -> None:
        """Raise a typed sparkdist error for bad input before any Spark job runs."""

    def _prepare(self, dataset: DataFrame) -> DataFrame:
        return dataset

    def _finish(self, model: MLlibModel, dataset: DataFrame) -> None:
        """Set anything the model learns beyond the MLlib fit (e.g. a tuned threshold)."""


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
    def mllib_model(self) -> JavaModel:
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
        model = cls(cls._mllib_model.load(
            store.jvm_input(SparkSession.active(), f"{path}/{MLLIB_DIR}")))
        model._load_state(state)
        return model

    def _load_state(self, state: dict[str, Any]) -> None:
        """Restore what ``_state`` saved (subclasses with state override both)."""
