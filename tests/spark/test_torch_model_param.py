"""TorchEstimator's ``model`` Param is the single source of truth: whichever way it is set
(setParams, copy, set, a CrossValidator grid) the fit trains that class, and the fitted model
scores with it on the executors even when its class is not importable there."""

from __future__ import annotations

import sys

import pytest
import torch
from pyspark import cloudpickle
from pyspark.ml.evaluation import BinaryClassificationEvaluator
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

from sparkdist.models import TorchEstimator

# Not importable on the executors: these classes travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Narrow(torch.nn.Module):
    width = 3

    def __init__(self, input_dim: int, output_dim: int) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(input_dim, self.width)
        self.out = torch.nn.Linear(self.width, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


class Wide(Narrow):
    width = 5


@pytest.fixture(scope="module")
def train(nonlinear):
    return nonlinear[0]


def _estimator() -> TorchEstimator:
    return TorchEstimator(model=Narrow, epochs=1, batchSize=512, seed=3, progress=False)


def _trained_class(model) -> type:
    """The class the fitted weights belong to, checked against the saved Param."""
    network = model.module()
    assert model.getOrDefault("model") == f"{__name__}.{type(network).__qualname__}"
    assert model._weights["hidden.weight"].shape[0] == type(network).width
    return type(network)


def test_set_params_copy_and_set_train_the_class_asked_for(train):
    est = _estimator()
    assert _trained_class(est.copy({est.model: Wide}).fit(train)) is Wide
    assert _trained_class(est.fit(train, {est.model: Wide})) is Wide
    est.setParams(model=Wide)
    assert _trained_class(est.fit(train)) is Wide
    est.set(est.model, Narrow)
    assert _trained_class(est.fit(train)) is Narrow


def test_a_cross_validator_grid_over_two_model_classes_trains_each(train):
    est = _estimator()
    grid = ParamGridBuilder().addGrid(est.model, [Narrow, Wide]).build()
    cv = CrossValidator(estimator=est, estimatorParamMaps=grid, numFolds=2, seed=3,
                        evaluator=BinaryClassificationEvaluator(), collectSubModels=True)
    fitted = cv.fit(train)
    for fold in fitted.subModels:
        assert [_trained_class(model) for model in fold] == [Narrow, Wide]
    assert len(fitted.avgMetrics) == 2 and all(0 <= auc <= 1 for auc in fitted.avgMetrics)
    assert _trained_class(fitted.bestModel) in (Narrow, Wide)
