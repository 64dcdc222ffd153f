"""Package-level contracts that need no Spark."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sparkdist.exceptions import (
    ClusterConfigError,
    ParamError,
    SchemaError,
    SparkdistError,
    TrainingError,
)
from sparkdist.session import _env_conf, local_layout

HEAVY = ("torch", "xgboost", "mlflow")
#: What runs in a fresh interpreter, and the modules it must not load.
LIGHT_IMPORTS = {
    "top_level": ("import sparkdist", ("pyspark", *HEAVY)),
    "features_datasets": ("import sparkdist, sparkdist.features, sparkdist.datasets", HEAVY),
    "notebook": ("import sparkdist.notebook", ("pyspark", "matplotlib", *HEAVY)),
    "xgboost_construction": ("import sparkdist.models as m; m.XGBoostClassifier(max_depth=3); "
                             "m.XGBoostRegressor(num_workers=2).copy()", ("xgboost",)),
}


@pytest.mark.parametrize(("code", "heavy"), LIGHT_IMPORTS.values(), ids=LIGHT_IMPORTS.keys())
def test_import_loads_nothing_heavy(code, heavy):
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_public_names_resolve():
    import sparkdist

    for name in sparkdist.__all__:
        assert getattr(sparkdist, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = sparkdist.nope


@pytest.mark.parametrize(
    ("error", "builtin"),
    [(SchemaError, ValueError), (ParamError, ValueError),
     (ClusterConfigError, RuntimeError), (TrainingError, RuntimeError)],
)
def test_errors_are_typed(error, builtin):
    assert issubclass(error, SparkdistError) and issubclass(error, builtin)


@pytest.mark.parametrize(
    ("master", "layout"),
    [("local[3]", (1, 3)), ("local", (1, 1)), ("local[4, 2]", (1, 4)),
     ("local-cluster[2,1,1024]", (2, 1))],
)
def test_local_layout(master, layout):
    assert local_layout(master) == layout


def test_env_conf(monkeypatch):
    monkeypatch.setenv("SPARKDIST_CONF_spark__executor__memory", "3g")
    assert _env_conf()["spark.executor.memory"] == "3g"
