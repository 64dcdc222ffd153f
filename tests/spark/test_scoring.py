"""TorchModel.transform's scoring path in local[2]: each Python worker's network cache (a hit
on later tasks and transforms, a bound that evicts, a model saved again under the same path
read anew), predictions equal to the network's own on the driver for each model kind, the
UDF carrying no weights, the typed error of a worker that cannot build the network, and the
scoring Params (inferenceBatchSize, inferencePrecision, inferenceCacheBytes)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from pyspark import cloudpickle
from pyspark.errors import PythonException
from pyspark.sql import functions as F

from sparkdist.exceptions import ParamError
from sparkdist.models import TorchModel
from sparkdist.torchtrain import modelcache
from sparkdist.torchtrain.nets import MLP

# The networks below travel to the executors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class BuildsOnlyOnTheDriver(MLP):
    """An MLP whose constructor fails in a Spark task: a worker that cannot build it."""

    def __init__(self, **kwargs: object) -> None:
        from pyspark import TaskContext

        if TaskContext.get() is not None:
            raise RuntimeError("this worker lacks what the network needs")
        super().__init__(**kwargs)


def _fitted(seed: int, network: type = MLP, **params: object) -> TorchModel:
    """A TorchModel around a freshly initialised 8-16-1 MLP (weights from ``seed``)."""
    torch.manual_seed(seed)
    weights = network(input_dim=8, output_dim=1, hidden=[16]).state_dict()
    model = TorchModel._fitted(weights, {"input_dim": 8, "output_dim": 1, "num_classes": 2})
    return model._set(model=f"{network.__module__}.{network.__qualname__}", loss="bce",
                      modelKwargs={"hidden": [16]}, **params)


@pytest.fixture(scope="module")
def rows(nonlinear):
    """1000 rows in 4 partitions: four scoring tasks per job."""
    return nonlinear[1].repartition(4).cache()


def _run(model: TorchModel, df) -> None:
    """A job that needs the predictions (a count alone would prune the scoring column)."""
    model.transform(df).agg(F.sum("prediction")).collect()


def _probabilities(model: TorchModel, df) -> np.ndarray:
    return np.array([row.probability[1] for row in
                     model.transform(df).orderBy("features").select("probability").collect()])


def _expected(model: TorchModel, df) -> np.ndarray:
    """The network's own probabilities on the driver, in the same row order."""
    features = np.array([row.features for row in df.orderBy("features").collect()],
                        np.float32)
    with torch.no_grad():
        return torch.sigmoid(model.module()(torch.from_numpy(features))[:, 0]).numpy()


def test_later_tasks_and_transforms_reuse_the_worker_s_network(rows):
    model = _fitted(1)
    _run(model, rows)
    first = model.scoringLoads
    assert len(first) == 4 and not all(load["hit"] for load in first)
    _run(model, rows)  # a second job
    assert [load["hit"] for load in model.scoringLoads] == [True] * 4
    # A copy with the same weights and network (a new Param value elsewhere) is the same key.
    copy = model.copy({model.inferenceBatchSize: 7})
    _run(copy, rows)
    assert all(load["hit"] for load in copy.scoringLoads)
    np.testing.assert_allclose(_probabilities(copy, rows), _expected(model, rows), atol=1e-6)


def test_the_cache_bound_evicts_and_zero_keeps_nothing(rows):
    none = _fitted(2, inferenceCacheBytes=0)
    for _ in range(2):
        _run(none, rows)
        assert [(load["hit"], load["cached_bytes"]) for load in none.scoringLoads] == \
            [(False, 0)] * 4
    first, second = _fitted(3), _fitted(4)
    size = _state_size(first)
    for model in (first, second, first):  # a bound with room for one of the two networks
        scored = model.copy({model.inferenceCacheBytes: size})
        _run(scored, rows)
        assert all(load["cached_bytes"] <= size for load in scored.scoringLoads)


def _state_size(model: TorchModel) -> int:
    from sparkdist.torchtrain.inference import weights_bytes

    return len(weights_bytes(model._weights))


def test_a_model_saved_again_under_the_same_path_is_read_anew(rows, tmp_path):
    path = str(tmp_path / "model")
    before, after = _fitted(5), _fitted(6)
    before.save(path)
    _run(TorchModel.load(path), rows)
    after.write().overwrite().save(path)
    loaded = TorchModel.load(path)
    scores = _probabilities(loaded, rows)
    assert not all(load["hit"] for load in loaded.scoringLoads)
    np.testing.assert_allclose(scores, _expected(after, rows), atol=1e-6)
    assert np.abs(scores - _expected(before, rows)).max() > 1e-3


@pytest.mark.parametrize("params", [{}, {"quantization": "int8"},
                                    {"inferenceBatchSize": 3}])
def test_transform_scores_as_the_network_does_on_the_driver(rows, params):
    model = _fitted(7, **params)
    np.testing.assert_allclose(_probabilities(model, rows), _expected(model, rows),
                               atol=1e-6)


def test_bf16_scores_close_to_float32_and_refuses_int8(rows):
    model = _fitted(8)
    assert (model.getInferenceBatchSize(), model.getInferencePrecision(),
            model.getInferenceCacheBytes()) == (1024, "float32", 2 << 30)  # as the docs say
    bf16 = _probabilities(model.copy({model.inferencePrecision: "bf16"}), rows)
    np.testing.assert_allclose(bf16, _expected(model, rows), atol=2e-2)
    with pytest.raises(ParamError, match="int8.*inferencePrecision='bf16'"):
        model.copy({model.inferencePrecision: "bf16", model.quantization: "int8"}
                   ).transform(rows)
    for bad, match in [({model.inferencePrecision: "half"}, "inferencePrecision"),
                       ({model.inferenceBatchSize: 0}, "inferenceBatchSize=0"),
                       ({model.inferenceCacheBytes: -1}, "inferenceCacheBytes=-1")]:
        with pytest.raises(ParamError, match=match):
            model.copy(bad).transform(rows)


def test_the_udf_holds_no_weights(spark):
    """A 40 MB network's scoring UDF pickles to well under 1 MB: the weights are a
    broadcast that only a worker without the network reads."""
    from sparkdist.torchtrain import inference
    from sparkdist.torchtrain.spec import ScoreSpec

    data = inference.weights_bytes(MLP(input_dim=8, output_dim=1, hidden=[3200, 3200])
                                   .state_dict())
    assert len(data) > 40e6
    broadcast = spark.sparkContext.broadcast(data)
    spec = ScoreSpec(module=MLP, module_kwargs={"hidden": [3200, 3200]}, weights_sha256="0",
                     weights_size=len(data), input_dim=8, output_dim=1, loss="bce",
                     batch_size=1024, use_gpu=False, cache_bytes=1 << 30)
    try:
        udf = inference.predict_udf(spec, "classification", broadcast)
        assert len(cloudpickle.dumps(udf.func)) < 1e6
    finally:
        spark.sparkContext._pickled_broadcast_vars.clear()
        broadcast.unpersist()


def test_a_worker_that_cannot_build_the_network_fails_with_the_typed_error(rows):
    model = _fitted(9, network=BuildsOnlyOnTheDriver)
    with pytest.raises(PythonException) as failed:
        _run(model, rows)
    message = str(failed.value)
    assert "ModelLoadError" in message and "cannot build the network" in message
    assert "BuildsOnlyOnTheDriver" in message and "lacks what the network needs" in message


def test_the_cache_keeps_the_most_recent_within_its_bound():
    modelcache.clear()
    try:
        built = []

        def build(name: str):
            return lambda: built.append(name) or name

        assert modelcache.network("a", 40, 100, build("a")) == ("a", False)
        assert modelcache.network("b", 40, 100, build("b")) == ("b", False)
        assert modelcache.network("a", 40, 100, build("a")) == ("a", True)  # a most recent
        assert modelcache.network("c", 40, 100, build("c")) == ("c", False)  # evicts b
        assert modelcache.cached_bytes() == 80
        assert modelcache.network("b", 40, 100, build("b")) == ("b", False)
        assert modelcache.network("big", 200, 100, build("big")) == ("big", False)
        assert modelcache.network("big", 200, 100, build("big")) == ("big", False)
        assert built == ["a", "b", "c", "b", "big", "big"] and modelcache.cached_bytes() <= 100
    finally:
        modelcache.clear()
