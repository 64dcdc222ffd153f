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
from sparkdist.session import _env_conf, _local_cores


def test_import_loads_no_heavy_library():
    code = (
        "import sys, sparkdist, sparkdist.features, sparkdist.datasets;"
        "heavy = [m for m in ('torch', 'xgboost', 'mlflow') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_top_level_import_is_lazy_about_spark():
    code = "import sys, sparkdist; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


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
    ("master", "cores"),
    [("local[3]", 3), ("local", 1), ("local[4, 2]", 4), ("local-cluster[2,1,1024]", 2)],
)
def test_local_cores(master, cores):
    assert _local_cores(master) == cores


def test_env_conf(monkeypatch):
    monkeypatch.setenv("SPARKDIST_CONF_spark__executor__memory", "3g")
    assert _env_conf()["spark.executor.memory"] == "3g"
