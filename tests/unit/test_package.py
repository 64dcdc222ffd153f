"""Package-level contracts that need no Spark."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import sparkdist
from sparkdist import exceptions
from sparkdist.exceptions import (
    ClusterConfigError,
    ConfigError,
    ModelLoadError,
    NotebookError,
    ParamError,
    PathExistsError,
    SchemaError,
    SparkdistError,
    StoreError,
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
    [(SchemaError, ValueError), (ParamError, ValueError), (ConfigError, ParamError),
     (ClusterConfigError, RuntimeError), (TrainingError, RuntimeError),
     (ModelLoadError, ValueError), (PathExistsError, FileExistsError), (StoreError, OSError),
     (NotebookError, RuntimeError)],
)
def test_errors_are_typed(error, builtin):
    assert issubclass(error, SparkdistError) and issubclass(error, builtin)


def _defined_errors() -> dict[str, str]:
    """{class name: module file} of every public exception class sparkdist's source
    defines (a class whose base's name ends in Error or Exception)."""
    found = {}
    for path in Path(sparkdist.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and any(
                    ast.unparse(base).endswith(("Error", "Exception")) for base in node.bases):
                found[node.name] = str(path)
    return found


def test_every_error_lives_in_exceptions_and_is_exported():
    defined = _defined_errors()
    assert {name: file for name, file in defined.items()
            if not file.endswith("exceptions.py")} == {}, "move these to sparkdist/exceptions.py"
    classes = {name for name, value in vars(exceptions).items()
               if inspect.isclass(value) and issubclass(value, BaseException)}
    assert classes == set(defined)
    assert classes <= set(sparkdist.__all__)
    assert all(getattr(sparkdist, name) is getattr(exceptions, name) for name in classes)


def test_old_error_locations_still_import():
    from sparkdist import config, failpoints, notebook, store

    assert (store.StoreError, store.PathExistsError, config.ConfigError,
            notebook.NotebookError, failpoints.FailpointError) == (
        StoreError, PathExistsError, ConfigError, NotebookError, exceptions.FailpointError)


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
