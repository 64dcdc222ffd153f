"""TorchModel with quantization='int8' in local[2]: its predictions against float32's on a
problem an MLP separates well, the Param through setQuantization, copy and save/load, the
refusals (a bad value, a network without Linear layers), and the MLflow int8 variant."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from pyspark import cloudpickle

from sparkdist.exceptions import ParamError
from sparkdist.models import TorchEstimator, TorchModel

# Scale travels to the executors by value (this module is not importable there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Scale(torch.nn.Module):
    """A network without a Linear layer: nothing for int8 quantization to act on."""

    def __init__(self, input_dim: int, output_dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(input_dim))
        self.output_dim = output_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.weight).sum(1, keepdim=True).repeat(1, self.output_dim)


@pytest.fixture(scope="module")
def data(nonlinear):
    return nonlinear


@pytest.fixture(scope="module")
def model(data) -> TorchModel:
    """An MLP that reaches about 0.95 test accuracy on make_nonlinear."""
    return TorchEstimator(modelKwargs={"hidden": [64, 64]}, epochs=12, batchSize=64,
                          learningRate=0.01, seed=5, progress=False).fit(data[0])


def _scores(model: TorchModel, df) -> list:
    rows = model.transform(df).select("label", "prediction", "probability").collect()
    return [(row.label, row.prediction, row.probability[1]) for row in rows]


def _fitted(network: type, **params) -> TorchModel:
    """A TorchModel around a freshly initialised network (no training needed to test the
    checks); params are set as on a fitted model."""
    model = TorchModel._fitted(network(input_dim=8, output_dim=1).state_dict(),
                               {"input_dim": 8, "output_dim": 1, "num_classes": 2})
    return model._set(model=f"{network.__module__}.{network.__qualname__}", loss="bce", **params)


@pytest.mark.slow
def test_int8_predictions_agree_with_float32_on_99_percent_of_rows(model, data):
    fp32 = _scores(model, data[1])
    int8_model = model.copy({model.quantization: "int8"})
    int8 = _scores(int8_model, data[1])
    agree = np.mean([a[1] == b[1] for a, b in zip(fp32, int8)])
    assert agree >= 0.99, f"int8 agrees with float32 on {agree:.2%} of rows"
    differences = np.abs([a[2] - b[2] for a, b in zip(fp32, int8)])
    # int8 really ran (the probabilities move), and only a little
    assert 0 < differences.max() < 0.1 and differences.mean() < 0.01
    accuracy = [np.mean([row[0] == row[1] for row in rows]) for rows in (fp32, int8)]
    assert accuracy[0] > 0.9 and abs(accuracy[0] - accuracy[1]) <= 0.01
    assert model.getOrDefault("quantization") == "none"  # copy left the original alone


@pytest.mark.slow
def test_module_is_the_network_transform_scores_with(model, data):
    model = model.copy()
    network = model.setQuantization("int8").module()
    assert "Int8" in type(network.layers[0].weight).__name__
    rows = model.transform(data[1]).select("features", "rawPrediction").limit(200).collect()
    with torch.no_grad():
        local = network(torch.tensor(np.array([row.features for row in rows]), dtype=torch.float32))
    spark = torch.tensor([row.rawPrediction[1] for row in rows], dtype=torch.float32)
    assert torch.allclose(local[:, 0], spark, atol=1e-5)


@pytest.mark.slow
def test_save_and_load_keep_int8(model, data, tmp_path):
    int8_model = model.copy().setQuantization("int8")
    path = str(tmp_path / "int8")
    int8_model.write().save(path)
    loaded = TorchModel.load(path)
    assert loaded.getOrDefault("quantization") == "int8"
    assert _scores(loaded, data[1]) == _scores(int8_model, data[1])


def test_a_bad_value_is_refused_naming_quantization(spark):
    from sparkdist.torchtrain.nets import MLP

    model = _fitted(MLP)
    frame = spark.createDataFrame([([0.0] * 8,)], "features array<float>")
    with pytest.raises(ParamError, match="quantization='int4' is not one of"):
        model.copy().setQuantization("int4").transform(frame)
    for bad in ("fp16", "INT8"):
        with pytest.raises(ParamError, match=f"quantization='{bad}'"):
            model.copy({model.quantization: bad}).transform(frame)
    with pytest.raises(ParamError, match="quantization='fp16'"):
        model.copy({model.quantization: "fp16"}).module()


def test_a_network_without_linear_layers_is_refused_before_any_job(spark):
    model = _fitted(Scale, quantization="int8")
    frame = spark.createDataFrame([([0.0] * 8,)], "features array<float>")
    with pytest.raises(ParamError, match="quantization='int8'.*has none.*quantization='none'"):
        model.transform(frame)
    with pytest.raises(ParamError, match="has none"):
        model.module()
    float32 = model.copy({model.quantization: "none"})
    assert float32.transform(frame).columns[-1] == "probability"  # planned, not refused
    assert float32.module()(torch.ones(2, 8)).tolist() == [[8.0], [8.0]]


@pytest.mark.slow
def test_mlflow_logs_the_int8_variant(model, data, tmp_path):
    import mlflow
    import mlflow.pytorch

    from sparkdist import tracking

    uri = f"sqlite:///{tmp_path}/mlruns.db"
    int8_model = model.copy().setQuantization("int8")
    with tracking.workflow_run("int8", "workflow", uri=uri):
        run_id = tracking.log_model_run("TorchEstimator", {"quantization": "int8"},
                                        {"auc": 0.9}, int8_model, ["features"], {}, {})
    logged = tracking.load_model(run_id, uri=uri)  # the Spark flavour keeps the Param
    assert logged.stages[-1].getOrDefault("quantization") == "int8"
    features = torch.tensor(np.array(
        [row.features for row in data[1].select("features").limit(100).collect()]),
        dtype=torch.float32)
    with torch.no_grad():
        int8 = mlflow.pytorch.load_model(f"runs:/{run_id}/torch_model_int8")(features)
        fp32 = mlflow.pytorch.load_model(f"runs:/{run_id}/torch_model")(features)
        assert torch.allclose(int8, int8_model.module()(features), atol=1e-5)
        assert torch.allclose(fp32, model.module()(features), atol=1e-6)
    assert not torch.equal(int8, fp32)  # two networks, the same decisions
    assert ((int8 > 0) == (fp32 > 0)).float().mean() >= 0.97
