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


@pytest.mark.slow
def test_set_params_copy_and_set_train_the_class_asked_for(train):
    est = _estimator()
    assert _trained_class(est.copy({est.model: Wide}).fit(train)) is Wide
    assert _trained_class(est.fit(train, {est.model: Wide})) is Wide
    est.setParams(model=Wide)
    assert _trained_class(est.fit(train)) is Wide
    est.set(est.model, Narrow)
    assert _trained_class(est.fit(train)) is Narrow


@pytest.mark.slow
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


def test_a_notebook_class_scores_in_session_and_says_how_to_load_it_elsewhere(
        train, tmp_path, caplog):
    """Report case T7: a class defined in a notebook or script lives in ``__main__``, which
    the executors' Python workers do not have."""
    from sparkdist.exceptions import ModelLoadError
    from sparkdist.models import TorchModel
    from sparkdist.torchtrain import network

    main_net = type("MainNet", (Narrow,), {"__module__": "__main__", "width": 4})
    model = TorchEstimator(model=main_net, epochs=1, batchSize=512, progress=False).fit(train)
    scored = model.transform(train).where("prediction IS NOT NULL").count()
    assert scored == train.count()  # transform ran the class on the executors
    path = str(tmp_path / "model")
    model.write().save(path)
    assert "notebook or script (__main__)" in caplog.text and "into a module" in caplog.text
    network._REGISTRY.pop("__main__.MainNet")  # as in a new process, where the cell never ran
    with pytest.raises(ModelLoadError, match=r"__main__.MainNet.*notebook or script.*module"):
        TorchModel.load(path)
