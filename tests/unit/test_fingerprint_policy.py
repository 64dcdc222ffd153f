"""The fingerprint policy (sparkdist.models._recovery): every Param of every public estimator
is classified as shaping the training trajectory or not, so a new Param cannot be left out
of the resume mismatch check unnoticed. No Spark session: estimators are only constructed."""

from __future__ import annotations

import pytest

import sparkdist.models as models
from sparkdist.models._recovery import HasRecovery


@pytest.mark.parametrize("name", models.ESTIMATORS)
def test_every_param_is_classified(name):
    estimator = getattr(models, name)()
    declared = {param.name for param in estimator.params}
    classified = set(getattr(type(estimator), "_trajectory", {}))
    assert not declared - classified, (
        f"{name}: classify these Params in {name}._trajectory (True: they shape the training "
        f"trajectory and belong in the resume fingerprint; False: they do not): "
        f"{sorted(declared - classified)}")
    assert not classified - declared, f"{name}._trajectory names no Param: " \
        f"{sorted(classified - declared)}"
    assert all(isinstance(shapes, bool) for shapes in type(estimator)._trajectory.values())


@pytest.mark.parametrize("name", ["TorchEstimator", "XGBoostClassifier", "XGBoostRegressor"])
def test_fingerprint_holds_the_trajectory_params(name):
    estimator = getattr(models, name)(checkpointDir="/tmp/ckpt", runId="policy")
    assert isinstance(estimator, HasRecovery)
    values = estimator._trajectory_values()
    shaping = {n for n, shapes in type(estimator)._trajectory.items() if shapes}
    assert set(values) == {n for n in shaping if estimator.isDefined(n)}
    assert not {"checkpointDir", "runId", "resume", "maxRetries"} & set(values)
    assert all(repr(values[n]) == repr(estimator.getOrDefault(n)) for n in values)  # NaN
