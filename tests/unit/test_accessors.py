"""The Params accessors are source, not made at run time (issue 26 item 6): the generated files
match their generator, every Param of every public stage has a getter and a setter written in
a module, and mypy sees them with their types, as it sees pyspark's own."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparkdist._params import accessor_suffix, class_params
from sparkdist.models import _accessors_gen

ROOT = Path(__file__).resolve().parents[2]
STAGES = _accessors_gen.public_stages()


@pytest.fixture(scope="module")
def files():
    return _accessors_gen.generated()


def test_the_generated_files_are_current(files):
    stale = [str(path.relative_to(ROOT)) for path, text in files.items()
             if not path.exists() or path.read_text() != text]
    left = [str(path.relative_to(ROOT)) for path in _accessors_gen.stale(files)]
    assert (stale, left) == ([], []), ("generated accessors are out of date (or left over); "
                                       "run make accessors")


def test_the_generated_files_stay_under_the_module_size_limit(files):
    sizes = {path.name: text.count("\n") for path, text in files.items()}
    assert {name: n for name, n in sizes.items() if n > 600} == {}


@pytest.mark.parametrize("cls", STAGES, ids=lambda cls: cls.__name__)
def test_every_param_has_a_getter_and_setter(cls):
    """A Param added without ``make accessors`` (and without a hand-written accessor) fails
    here (and in test_params_surface.py): nothing makes accessors at run time."""
    missing = []
    for param in class_params(cls):
        for prefix in ("get", "set"):
            name = prefix + accessor_suffix(param.name)
            value = inspect.getattr_static(cls, name, None)
            func = value.fget if isinstance(value, property) else value
            if not callable(func):
                missing.append(name)
    assert missing == []


def test_every_accessor_comes_from_exactly_one_class():
    """The generator writes only what no hand-written (or MLlib) accessor provides."""
    shadowing = []
    for cls in STAGES:
        for klass in cls.__mro__:
            if not getattr(klass, _accessors_gen.MARK, False):
                continue
            for name in (n for n in vars(klass) if n[:3] in ("get", "set")):
                owners = [k for k in cls.__mro__ if name in vars(k)]
                if len(owners) > 1:
                    shadowing.append(f"{cls.__name__}.{name}: {owners}")
    assert shadowing == []


#: From the packages users import from (their exports resolve on first use: the generated
#: ``__init__.pyi`` stubs tell mypy what they are).
_IMPORTS = """\
from sparkdist import FeatureAssembler, FeatureAssemblerModel
from sparkdist.models import (
    ALS,
    ALSModel,
    KerasEstimator,
    KerasModel,
    LogisticRegression,
    LogisticRegressionModel,
    RandomForestClassificationModel,
    RandomForestClassifier,
    RandomForestRegressionModel,
    RandomForestRegressor,
    TorchEstimator,
    TorchModel,
    XGBoostClassificationModel,
    XGBoostClassifier,
    XGBoostRegressionModel,
    XGBoostRegressor,
)
from sparkdist.tuning import Tuner, TunerModel
"""

#: What a user writes; a line marked "# E" must be reported, every other line must pass.
_USER_CODE = """\
lr: LogisticRegression = LogisticRegression().setMaxIter(5).setRegParam(0.1)
iterations: int = lr.getMaxIter()
lrm: LogisticRegressionModel = LogisticRegressionModel().setFeaturesCol("f").setThreshold(0.4)
fa: FeatureAssembler = FeatureAssembler().setNumericCols(["a"]).setStandardize(True)
columns: list[str] = fa.getNumericCols()
fam: FeatureAssemblerModel = FeatureAssemblerModel().setOutputCol("v")
als: ALS = ALS().setRank(4).setUserCol("u").setImplicitPrefs(True)
alsm: ALSModel = ALSModel().setColdStartStrategy("nan")
rfc: RandomForestClassifier = RandomForestClassifier().setNumTrees(5).setMaxDepth(3)
rfcm: RandomForestClassificationModel = RandomForestClassificationModel().setThresholds([0.5, 0.5])
rfr: RandomForestRegressor = RandomForestRegressor().setSubsamplingRate(0.5).setSeed(1)
rfrm: RandomForestRegressionModel = RandomForestRegressionModel().setPredictionCol("p")
te: TorchEstimator = TorchEstimator().setEpochs(2).setBatchSize(64).setModel(object)
built: TorchEstimator = TorchEstimator(epochs=2, learningRate=0.1, validationCol="v", model=object)
tm: TorchModel = TorchModel().setBatchSize(32)
ke: KerasEstimator = KerasEstimator(epochs=2, loss="mse").setBatchSize(64).setEpochs(3)
km: KerasModel = KerasModel().setBatchSize(32)
xc: XGBoostClassifier = XGBoostClassifier().setMaxDepth(3).setNumWorkers(2)
depth: int | None = xc.getMaxDepth()
xcm: XGBoostClassificationModel = XGBoostClassificationModel().setProbabilityCol("p")
xr: XGBoostRegressor = XGBoostRegressor().setObjective("reg:logistic").setNEstimators(10)
xrm: XGBoostRegressionModel = XGBoostRegressionModel().setLearningRate(0.1)
LogisticRegression().setMaxIter("five")  # E
XGBoostClassifier().setNumWorkers(2.5)  # E
FeatureAssembler().setNumericCols("a")  # E
ALS().setRank("4")  # E
TorchEstimator().setEpochs("2")  # E
TorchEstimator(epochs="2")  # E
TorchEstimator(learningRte=0.1)  # E (a misspelt keyword)
wrong: str = LogisticRegression().getMaxIter()  # E
unset: int = XGBoostClassifier().getMaxDepth()  # E (None: xgboost's own default)
"""


def _every_accessor() -> str:
    """One line per stage naming each of its getters and setters (mypy: attr-defined)."""
    lines = []
    for cls in STAGES:
        names = [f"{cls.__name__}.{p}{accessor_suffix(param.name)}"
                 for param in class_params(cls) for p in ("get", "set")]
        lines.append(f"_{cls.__name__} = [{', '.join(names)}]")
    return "\n".join(lines) + "\n"


def test_mypy_sees_every_accessor_with_its_type(tmp_path):
    """mypy with the project's configuration and cache (``make lint`` fills it first, so this
    takes seconds; cold, under a minute)."""
    snippet = tmp_path / "user_code.py"
    snippet.write_text(_IMPORTS + _USER_CODE + _every_accessor())
    expected = {i for i, line in enumerate(snippet.read_text().splitlines(), 1)
                if re.search(r"# E\b", line)}
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary",
                           "--hide-error-context", str(snippet)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    # any directory: mypy's cache may report an unchanged snippet under the path it had then
    errors = re.findall(r"^\S*user_code\.py:(\d+): error: (.*)$", done.stdout, re.MULTILINE)
    found = {int(line) for line, _ in errors}
    assert (found, done.stderr) == (expected, ""), done.stdout


def test_a_module_whose_accessors_outgrow_the_limit_is_split_into_files_that_import():
    stages = [cls for cls in STAGES if cls.__module__ == "sparkdist.models.xgboost"]
    files = _accessors_gen.render("sparkdist.models.xgboost", stages, limit=200)
    first, *parts = files
    assert len(parts) >= 2 and [p.name for p in parts][:1] == ["_accessors_xgboost_2.py"]
    assert all(text.count("\n") <= 200 for text in files.values())
    defined = {name for text in files.values() for name in re.findall(r"^class (\w+)\(",
                                                                        text, re.MULTILINE)}
    for path, text in files.items():
        compile(text, str(path), "exec")
        tree = ast.parse(text)
        used = {n.id for c in tree.body if isinstance(c, ast.ClassDef) for n in c.bases
                if isinstance(n, ast.Name)} - {"Params"}
        assert used <= defined
    imported = {a.name for node in ast.parse(files[first]).body
                if isinstance(node, ast.ImportFrom) and "_accessors_" in (node.module or "")
                for a in node.names}
    assert imported == {n for path in parts for n in re.findall(r"^class (\w+)\(",
                                                                files[path], re.MULTILINE)}


def test_a_generated_constructor_takes_every_param_and_alias_and_checks_its_keywords():
    """TorchEstimator's keywords come from ``make accessors``: adding a Param adds its keyword,
    and an unknown one is still a ParamError naming the closest (pyspark's would be a bare
    TypeError)."""
    from sparkdist.exceptions import ParamError
    from sparkdist.models import TorchEstimator

    signature = inspect.signature(TorchEstimator.__init__)
    assert set(signature.parameters) - {"self"} == \
        {p.name for p in class_params(TorchEstimator)} | {"validationCol"}
    est = TorchEstimator(epochs=3, learningRate=0.5)
    assert (est.getEpochs(), est.getLearningRate(), est.isSet("batchSize")) == (3, 0.5, False)
    with pytest.raises(ParamError, match="Did you mean 'learningRate'"):
        TorchEstimator(learningRte=0.1)
