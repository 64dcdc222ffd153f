"""Spark ML Estimators of every sparkdist model family (resolved on first use, so importing
this package loads neither xgboost nor torch)."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LogisticRegression": "logistic",
    "LogisticRegressionModel": "logistic",
    "RandomForestClassifier": "forest",
    "RandomForestClassificationModel": "forest",
    "RandomForestRegressor": "forest",
    "RandomForestRegressionModel": "forest",
    "ALS": "als",
    "ALSModel": "als",
    "KerasEstimator": "keras",
    "KerasModel": "keras",
    "TorchEstimator": "torch",
    "TorchModel": "torch",
    "XGBoostClassifier": "xgboost",
    "XGBoostClassificationModel": "xgboost",
    "XGBoostRegressor": "xgboost",
    "XGBoostRegressionModel": "xgboost",
}
__all__ = sorted(_EXPORTS)
#: The estimators, by the names configs use for them.
ESTIMATORS = tuple(name for name in _EXPORTS if not name.endswith("Model"))
#: The modules that define them (the only ones a saved directory may name).
MODULES = tuple(sorted({f"sparkdist.models.{module}" for module in _EXPORTS.values()}))


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sparkdist.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sparkdist.models.{_EXPORTS[name]}"), name)
