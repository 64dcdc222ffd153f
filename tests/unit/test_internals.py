"""sparkdist._internals against the pyspark and xgboost of constraints.txt, without Spark:
the private names it uses exist with the signatures it calls, and no other module of sparkdist
touches a private name of either (the rule in the module docstring). The calls that need a
session are in tests/spark/test_internals_spark.py."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import sparkdist

ROOT = Path(sparkdist.__file__).parent
#: The Params protocol pyspark.ml's own subclasses use: allowed anywhere (see _internals).
PARAMS_PROTOCOL = {"_dummy", "_set", "_setDefault", "_copyValues", "_resetUid", "_paramMap",
                   "_defaultParamMap", "_input_kwargs"}
#: Private names of pyspark and xgboost that sparkdist uses, all through _internals.
PRIVATE_ATTRIBUTES = {"_jvm", "_jsc", "_jdf", "_gateway", "_java_obj", "_conf",
                      "_ensure_initialized", "_find_spark_home", "_get_metadata_to_save",
                      "_create_model", "_transfer_params_to_java", "_validate_params",
                      "_get_distributed_train_params", "_active_spark_context",
                      "_get_spark_session"}


def _pinned(package: str) -> str:
    text = (ROOT.parent / "constraints.txt").read_text()
    found = re.search(rf"^{package}==(\S+)$", text, re.MULTILINE)
    assert found, f"{package} is not pinned in constraints.txt"
    return found.group(1)


@pytest.mark.parametrize("package", ["pyspark", "xgboost"])
def test_the_pinned_versions_are_the_ones_checked(package):
    module = pytest.importorskip(package)
    assert module.__version__ == _pinned(package), (
        f"{package} {module.__version__} is installed but constraints.txt pins "
        f"{_pinned(package)}: review sparkdist/_internals.py against it, run this file and "
        "tests/spark/test_internals_spark.py, then update constraints.txt")


def test_private_signatures_are_the_ones_called():
    from pyspark import SparkContext
    from pyspark.ml.util import DefaultParamsWriter
    from pyspark.ml.wrapper import JavaEstimator, JavaParams

    assert list(inspect.signature(DefaultParamsWriter._get_metadata_to_save).parameters) == [
        "instance", "sc", "extraMetadata", "paramMap"]
    assert "conf" in inspect.signature(SparkContext._ensure_initialized).parameters
    assert hasattr(SparkContext, "_gateway")
    assert list(inspect.signature(JavaEstimator._create_model).parameters) == [
        "self", "java_model"]
    assert list(inspect.signature(JavaParams._transfer_params_to_java).parameters) == ["self"]


def test_spark_home_holds_spark():
    from sparkdist._internals import spark_home

    assert (Path(spark_home()) / "jars").is_dir()


@pytest.mark.parametrize(("mixin", "param"), [
    ("PredictorParams", "labelCol"), ("ProbabilisticClassifierParams", "probabilityCol"),
    ("RandomForestClassifierParams", "numTrees"), ("RandomForestRegressorParams", "numTrees"),
    ("LogisticRegressionParams", "elasticNetParam"), ("ALSParams", "rank"),
    ("ALSModelParams", "coldStartStrategy")])
def test_mllib_params_mixins_carry_their_params(mixin, param):
    from pyspark.ml.param import Param, Params

    from sparkdist import _internals

    cls = getattr(_internals, mixin)
    assert issubclass(cls, Params) and isinstance(getattr(cls, param), Param)


def test_xgboost_private_methods_read_what_the_override_answers():
    xgboost_spark = pytest.importorskip("xgboost.spark")
    estimator = xgboost_spark.SparkXGBClassifier
    assert callable(estimator._validate_params)
    source = inspect.getsource(estimator._get_distributed_train_params)
    # _internals._CountedLabel answers exactly this read of the DataFrame
    assert "dataset.select(countDistinct(alias.label)).collect()[0][0]" in source
    assert source.count("dataset") == 2  # the parameter, and that one read


def test_xgboost_transform_asks_the_session_of_the_function_replaced_in_a_task():
    core = pytest.importorskip("xgboost.spark.core")
    assert callable(core._get_spark_session)
    # _internals.xgboost_session_in_a_task replaces core's name: the transform calls that one
    for method in (core._SparkXGBModel._transform, core._SparkXGBModel._run_on_gpu):
        source = inspect.getsource(method)
        assert "_get_spark_session()" in source and "utils._get_spark_session" not in source


def _private_uses(path: Path) -> list[str]:
    """'line: name' of each private pyspark/xgboost name the module touches."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
                "pyspark", "xgboost"):
            found += [f"{node.lineno}: {node.module}.{alias.name}" for alias in node.names
                      if alias.name.startswith("_")]
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Attribute) and re.fullmatch(r"_[A-Z]\w*Params", node.attr):
            found.append(f"{node.lineno}: .{node.attr}")  # mllib._XxxParams
    return found


def test_private_api_is_used_in_internals_only():
    uses = {str(path.relative_to(ROOT)): _private_uses(path) for path in ROOT.rglob("*.py")
            if path.name != "_internals.py"}
    assert {path: found for path, found in uses.items() if found} == {}, (
        "use sparkdist._internals (add a named function there, with a test) instead")
    assert _private_uses(ROOT / "_internals.py")  # the scan does find them
