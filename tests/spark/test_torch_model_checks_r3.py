"""Robustness round 3, TorchEstimator/TorchModel checks: int8 scoring of a network torchao
cannot quantize (N13), the timeout Params' range (N14), and a loaded model's weights against
the network its metadata describes, checked without allocating that network (N17)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from pyspark import cloudpickle

from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.models import TorchEstimator, TorchModel
from sparkdist.persist import RECORD
from sparkdist.torchtrain.nets import MLP

# DropRates travels to the executors by value (this module is not importable there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ONE_YEAR = 365 * 86400.0
TIMEOUTS = ("timeoutSeconds", "rendezvousTimeoutSeconds", "slotWaitSeconds")


def _model(network: torch.nn.Module, input_dim: int, **params) -> TorchModel:
    """A TorchModel around a freshly initialised network (no fit needed for the checks)."""
    model = TorchModel._fitted(network.state_dict(),
                               {"input_dim": input_dim, "output_dim": 1, "num_classes": 2})
    return model._set(model=type(network), loss="bce", **params)


# --------------------------------------------------------------------------------- N13
def test_int8_refuses_a_network_torchao_cannot_quantize_on_the_driver():
    one_feature = _model(MLP(input_dim=1, output_dim=1), 1, quantization="int8")
    with pytest.raises(ParamError, match=r"quantization='int8' cannot quantize model=.*MLP' "
                       r"\(its layer\(s\) \['layers.0'\] take a single input feature.*"
                       r"RuntimeError: .*Score it with quantization='none'"):
        one_feature.module()
    assert one_feature.setQuantization("none").module()(torch.zeros(2, 1)).shape == (2, 1)
    # a Linear(n, 1) is fine: the network still quantizes and scores
    two_features = _model(MLP(input_dim=2, output_dim=1), 2, quantization="int8").module()
    assert "Int8" in type(two_features.layers[0].weight).__name__
    assert two_features(torch.zeros(3, 2)).shape == (3, 1)


# --------------------------------------------------------------------------------- N14
@pytest.mark.parametrize("name", TIMEOUTS)
def test_timeouts_are_finite_and_at_most_one_year(name):
    for value in (float("inf"), float("nan"), ONE_YEAR + 1, 0.0, -1.0):
        with pytest.raises(ParamError, match=rf"{name}={value}: use a number of seconds above "
                           r"0 and at most 31536000 \(one year.*inf is not accepted"):
            TorchEstimator(**{name: value})._spec_parts()
    TorchEstimator(**{name: ONE_YEAR})._spec_parts()


@pytest.mark.slow
def test_a_fit_with_every_timeout_at_the_longest_allowed_trains(spark):
    """The cap is below every limit the waits have (threading.Timer, TCPStore, gloo); a
    second more is refused before launch."""
    frame = spark.createDataFrame([([float(i % 2), 1.0], float(i % 2)) for i in range(32)],
                                  ["features", "label"])
    params = {"epochs": 1, "batchSize": 8, "numWorkers": 2, "progress": False}
    model = TorchEstimator(**params, **dict.fromkeys(TIMEOUTS, ONE_YEAR)).fit(frame)
    assert len(model.history) == 1
    with pytest.raises(ParamError, match="timeoutSeconds=31536001.0"):
        TorchEstimator(**params, timeoutSeconds=ONE_YEAR + 1).fit(frame)


# --------------------------------------------------------------------------------- N17
class DropRates(torch.nn.Module):
    """A constructor the meta device cannot run: it reads values (``.item()``), as timm's
    drop-path schedules do."""

    def __init__(self, input_dim: int, output_dim: int, depth: int = 3) -> None:
        super().__init__()
        self.rates = [rate.item() for rate in torch.linspace(0, 0.1, depth)]
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(input_dim, input_dim)
                                          for _ in range(depth))
        self.head = torch.nn.Linear(input_dim, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def _saved(model: TorchModel, path, model_kwargs: dict | None = None) -> str:
    model.write().save(str(path))
    if model_kwargs is not None:
        record = json.loads((path / RECORD).read_text())
        record["paramMap"]["modelKwargs"] = model_kwargs
        (path / RECORD).write_text(json.dumps(record) + "\n")
    return str(path)


def test_a_network_built_from_values_loads_and_its_edited_kwargs_are_bounded(spark, tmp_path):
    model = _model(DropRates(2, 1), 2)
    assert TorchModel.load(_saved(model, tmp_path / "ok")).module()(torch.zeros(2, 2)).shape \
        == (2, 1)
    # tensor objects (a 10**8-long schedule) and memory (a 10**6-wide layer) the weights
    # cannot need are refused before they are made
    for name, kwargs in (("long", {"depth": 10**8}), ("wide", {"input_dim": 10**6})):
        path = _saved(model, tmp_path / name, kwargs)
        with pytest.raises(ModelLoadError, match=rf"'{path}': model=.*DropRates' with "
                           r"modelKwargs=.* cannot be built \(MemoryError: .*more memory or "
                           r"tensor operations than its weights can need.*Save the model again"):
            TorchModel.load(path)


def test_edited_kwargs_that_build_fine_but_do_not_fit_the_weights_are_refused(spark,
                                                                               tmp_path):
    path = _saved(_model(DropRates(2, 1), 2), tmp_path / "m", {"depth": 5})
    with pytest.raises(ModelLoadError, match=r"weights do not fit .*the network has 33 values "
                       r"in 12 tensors, the weights 21 in 8 \('blocks.3.weight' missing"):
        TorchModel.load(path)
