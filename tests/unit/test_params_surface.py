"""One Params surface (issue 13 item 5), checked on every public sparkdist stage class, found
by walking the packages' exports (a new stage is covered without editing this file): a getter
and a setter for every Param, help() listing every Param with its doc, and a ParamError that
names the closest keyword for a typo in the constructor or setParams. No Spark needed; the
fitted-model uid is checked in tests/spark/test_fitted_uid.py."""

from __future__ import annotations

import inspect
import math
import pydoc
import re

import pytest
from pyspark.ml.linalg import Matrices
from pyspark.ml.param import Param, Params

from sparkdist.exceptions import ParamError
from tests.stages import public_classes

#: Where MLlib's own model shadows a Param getter with a property (``getNumTrees`` is the
#: number of trees in the ensemble), sparkdist's forest models keep MLlib's shape.
PROPERTY_GETTERS = {("RandomForestClassificationModel", "numTrees"),
                    ("RandomForestRegressionModel", "numTrees")}


STAGES = public_classes(Params)


def test_discovery_finds_every_family():
    names = {cls.__name__ for cls in STAGES}
    assert {"FeatureAssembler", "FeatureAssemblerModel", "LogisticRegression",
            "LogisticRegressionModel", "RandomForestClassifier", "RandomForestRegressor",
            "ALS", "ALSModel", "TorchEstimator", "TorchModel", "XGBoostClassifier",
            "XGBoostRegressionModel", "KerasEstimator", "KerasModel"} <= names
    assert len(STAGES) == 18


def camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _candidates(current: object) -> list[object]:
    """Values to set, a changed one first, then one per common Param type."""
    first: list[object] = []
    if isinstance(current, bool):
        first = [not current]
    elif isinstance(current, int):
        first = [current + 1]
    elif isinstance(current, float):
        first = [0.5 if math.isnan(current) else current / 2 + 0.125]
    elif isinstance(current, str):
        first = [current + "x"]
    elif isinstance(current, list):
        first = [current + current[:1]] if current else []
    elif isinstance(current, dict):
        first = [{**current, "extra": 1}]
    return first + [3, 0.5, "x", True, ["a", "b"], [0.5], [1, 2], {"a": 1}, {"a": "b"},
                    {"a": [1, 2]}, Matrices.dense(1, 1, [0.5])]


def _round_trip(stage: Params, param: Param) -> str | None:
    """Set a new value with ``setX`` and read it back with ``getX``; a problem in words."""
    cls = type(stage)
    getter, setter = f"get{camel(param.name)}", f"set{camel(param.name)}"
    if not callable(getattr(stage, setter, None)):
        return f"no {setter}"
    if (cls.__name__, param.name) in PROPERTY_GETTERS:
        assert isinstance(inspect.getattr_static(cls, getter), property)
    elif not callable(getattr(stage, getter, None)):
        return f"no {getter}"
    current = stage.getOrDefault(param) if stage.isDefined(param) else None
    for value in _candidates(current):
        try:
            expected = param.typeConverter(value)
        except (TypeError, ValueError):
            continue
        if current is not None and expected == current:
            continue
        returned = getattr(stage, setter)(value)
        if returned is not stage:
            return f"{setter} returns {returned!r}, not the stage"
        if not stage.isSet(param.name):
            return f"{setter}({value!r}) left {param.name} unset"
        got = (stage.getOrDefault(param.name) if (cls.__name__, param.name) in PROPERTY_GETTERS
               else getattr(stage, getter)())
        return None if got == expected else f"{setter}({value!r}) then {getter}() = {got!r}"
    return f"found no value to set for {param.name}"


@pytest.mark.parametrize("cls", STAGES, ids=lambda cls: cls.__name__)
def test_every_param_has_a_getter_and_setter_that_round_trip(cls):
    stage = cls()
    problems = {p.name: _round_trip(stage, p) for p in stage.params}
    assert {name: problem for name, problem in problems.items() if problem} == {}


def test_the_issue_examples():
    from sparkdist.models import LogisticRegression, TorchEstimator, XGBoostClassifier

    assert LogisticRegression().setMaxIter(7).getMaxIter() == 7
    assert TorchEstimator().setEpochs(2).getEpochs() == 2
    xgb = XGBoostClassifier().setMaxDepth(3).setNumWorkers(2)
    assert (xgb.getMaxDepth(), xgb.getNumWorkers(), xgb.getNEstimators()) == (3, 2, 100)


@pytest.mark.parametrize("cls", STAGES, ids=lambda cls: cls.__name__)
def test_help_lists_every_param_with_its_doc_and_accessors(cls):
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    flat = " ".join(" ".join(re.sub(r"^\s*\|", "", line).split())
                    for line in text.splitlines())
    missing = [p.name for p in cls().params
               if " ".join(p.doc.split()) not in flat
               or f"get{camel(p.name)}" not in flat or f"set{camel(p.name)}" not in flat]
    assert missing == []


def _keywords(func: object) -> list[str]:
    return [name for name, p in list(inspect.signature(func).parameters.items())[1:]
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _typo_target(cls: type) -> str:
    """A Param name to misspell: the longest one the constructor takes, else any."""
    params = sorted((p.name for p in cls().params), key=lambda n: (-len(n), n))
    keywords = set(_keywords(cls.__init__))
    return next((n for n in params if n in keywords), params[0])


@pytest.mark.parametrize("cls", STAGES, ids=lambda cls: cls.__name__)
def test_constructor_typo_names_the_closest_parameter(cls):
    right = _typo_target(cls)
    wrong = right + right[-1]
    with pytest.raises(ParamError) as info:
        cls(**{wrong: 1})
    assert f"{cls.__name__}: unknown parameter '{wrong}'. Did you mean '{right}'?" \
        == str(info.value)
    if hasattr(cls, "setParams"):
        with pytest.raises(ParamError, match=f"Did you mean '{right}'"):
            cls().setParams(**{wrong: 1})


def test_a_param_the_constructor_leaves_out_points_at_its_setter():
    from sparkdist.models import LogisticRegression

    with pytest.raises(ParamError, match=r"'maxBlockSizeInMB' is not a keyword here; set it "
                                         r"with setMaxBlockSizeInMB\(\.\.\.\)"):
        LogisticRegression(maxBlockSizeInMB=1.0)
    assert LogisticRegression().setMaxBlockSizeInMB(1.0).getMaxBlockSizeInMB() == 1.0


def test_valid_keywords_and_aliases_still_work():
    from sparkdist.models import ALS, XGBoostClassifier

    assert ALS(rank=3).getRank() == 3
    assert XGBoostClassifier(features_col="f").getFeaturesCol() == "f"
    with pytest.raises(TypeError, match="forces keyword arguments"):
        ALS(3)
