"""sparkdist: Spark ML Estimators for distributed training, on one feature and split layer.

Importing sparkdist is cheap: it loads no Spark, torch, xgboost or mlflow. The public
names below are resolved on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "get_spark": "sparkdist.session",
    "FeatureAssembler": "sparkdist.features",
    "FeatureAssemblerModel": "sparkdist.features",
    "split": "sparkdist.features",
    # every class in sparkdist.exceptions (tests/unit/test_package.py checks)
    "SparkdistError": "sparkdist.exceptions",
    "SchemaError": "sparkdist.exceptions",
    "ParamError": "sparkdist.exceptions",
    "ConfigError": "sparkdist.exceptions",
    "ClusterConfigError": "sparkdist.exceptions",
    "TrainingError": "sparkdist.exceptions",
    "FitStopped": "sparkdist.exceptions",
    "ModelLoadError": "sparkdist.exceptions",
    "PathExistsError": "sparkdist.exceptions",
    "StoreError": "sparkdist.exceptions",
    "NotebookError": "sparkdist.exceptions",
    "FailpointError": "sparkdist.exceptions",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sparkdist' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
