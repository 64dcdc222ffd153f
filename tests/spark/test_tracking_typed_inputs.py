"""MLflow logging of TorchModels (tracking.log_model_run) with real MLflow on a sqlite store:
the Spark model's signature lists one input per column the model reads, typed as transform
takes it (typed inputs, the features vector, featureCols, a FeatureAssembler's columns), and
the pyfunc flavour scores through it; a network with typed inputs is also logged with the
pytorch flavour (pt2, inputs by position in forward's order) and reproduces the TorchModel."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
import torch
from pyspark import cloudpickle
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import SQLTransformer

from sparkdist import tracking
from sparkdist.features import FeatureAssembler
from sparkdist.models import TorchEstimator

mlflow = pytest.importorskip("mlflow")
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Mixed travels by value
COMMON = {"progress": False, "numWorkers": 1, "epochs": 1, "batchSize": 8, "seed": 3}


class Mixed(torch.nn.Module):
    """Every kind of typed input: an id, a float, a fixed float shape, a token sequence with
    its mask (``forward``'s order differs from inputCols' order on purpose)."""

    def __init__(self, users: int = 5, vocab: int = 9) -> None:
        super().__init__()
        self.embedding_sizes = {"user": users, "tokens": vocab}
        self.users, self.tokens = torch.nn.Embedding(users, 4), torch.nn.Embedding(vocab, 4)
        self.dense = torch.nn.Linear(2 * 3 + 1, 4)
        self.head = torch.nn.Linear(12, 2)

    def forward(self, user: torch.Tensor, dense: torch.Tensor, tokens: torch.Tensor,
                tokens_mask: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
        mask = tokens_mask.unsqueeze(-1).float()
        bag = (self.tokens(tokens) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        flat = torch.cat([dense.flatten(1), score.unsqueeze(1)], 1)  # len() would fix the batch
        return self.head(torch.cat([self.users(user), bag, self.dense(flat)], 1))


@pytest.fixture(scope="module")
def frame(spark, cached):
    """32 rows of every kind of column, cached: each test reads the same rows in one order."""
    rng = np.random.default_rng(0)
    rows = 32
    data = pd.DataFrame({
        "words": [rng.integers(1, 9, rng.integers(1, 6)).tolist() for _ in range(rows)],
        "uid": rng.integers(0, 5, rows).astype("int32"),
        "pairs": list(rng.normal(size=(rows, 6))),
        "score": rng.normal(size=rows),
        "age": rng.normal(size=rows),
        "plan": rng.choice(["a", "b"], rows),
        "label": rng.integers(0, 2, rows).astype(float)})
    with cached(spark.createDataFrame(data).repartition(1)) as df:
        yield df


@pytest.fixture(scope="module")
def typed(frame):
    return TorchEstimator(model=Mixed, loss="cross_entropy", maxSequenceLength=8,
                          inputCols={"tokens": "words", "score": "score", "user": "uid",
                                     "dense": "pairs"},
                          inputShapes={"dense": [2, 3]}, **COMMON).fit(frame)


@pytest.fixture(scope="module")
def assembled(frame):
    """A FeatureAssembler and an MLP on its vector: the workflows' pipeline."""
    return Pipeline(stages=[
        FeatureAssembler(numericCols=["age", "score"], categoricalCols=["plan"]),
        TorchEstimator(**COMMON)]).fit(frame)


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlruns.db"


@pytest.fixture(scope="module")
def typed_run(typed, uri, frame):
    return _log(typed, uri, rows=frame.limit(5).toPandas())  # as the workflows log it


def _log(model, uri, rows=None):
    with tracking.workflow_run("typed", "workflow", uri=uri):
        return tracking.log_model_run("model", {}, {}, model, [], {}, {}, rows=rows)


def _columns(schema) -> list[tuple[str, str]]:
    return [(spec["name"], spec["type"] if spec["type"] != "array" else
             f"array<{spec['items']['type']}>") for spec in schema.to_dict()]


#: What MLflow's Spark pyfunc returns (a classifier's vectors too would break its predict).
OUTPUTS = [("prediction", "double")]


def test_a_typed_model_is_signed_with_one_input_per_column(typed, typed_run):
    info = mlflow.models.get_model_info(f"runs:/{typed_run}/model")
    assert _columns(info.signature.inputs) == [
        ("words", "array<long>"), ("score", "double"), ("uid", "long"),
        ("pairs", "array<double>")]
    assert _columns(info.signature.outputs) == OUTPUTS
    example = mlflow.artifacts.load_dict(f"runs:/{typed_run}/model/input_example.json")
    assert example["columns"] == ["words", "score", "uid", "pairs"]
    assert [len(row[3]) for row in example["data"]] == [6] * 5  # arrays as lists
    rows = pd.DataFrame({"score": np.arange(2, dtype=np.int64), "uid": np.arange(2)})
    signed = _columns(tracking._signature(typed, rows).inputs)  # int64 values: long
    assert signed[1] == ("score", "long") and signed[2] == ("uid", "long")


def test_the_spark_models_pyfunc_scores_typed_columns_through_its_signature(typed, typed_run,
                                                                            frame):
    rows = frame.limit(5).toPandas()
    want = typed.transform(frame.limit(5)).select("prediction").toPandas().prediction
    pyfunc = mlflow.pyfunc.load_model(f"runs:/{typed_run}/model")
    scored = pyfunc.predict(rows.assign(other="dropped"))  # a column it does not read
    assert list(scored) == list(want)


def _positional(rows: pd.DataFrame) -> tuple[torch.Tensor, ...]:
    """Mixed's inputs for ``rows`` as transform builds them, in forward's order."""
    lengths = torch.tensor([len(w) for w in rows.words])
    tokens = torch.tensor([list(w) + [0] * (int(lengths.max()) - len(w)) for w in rows.words])
    return (torch.tensor(rows.uid.to_numpy(), dtype=torch.int64),
            torch.tensor(np.stack(rows.pairs), dtype=torch.float32).reshape(-1, 2, 3),
            tokens, torch.arange(tokens.shape[1]) < lengths[:, None],
            torch.tensor(rows.score.to_numpy(), dtype=torch.float32))


def test_the_typed_network_reproduces_the_torch_model_by_position(typed, typed_run, frame):
    logged = f"runs:/{typed_run}/torch_model"
    info = mlflow.models.get_model_info(logged)
    assert [(spec.name, spec.shape) for spec in info.signature.inputs.inputs] == [
        ("user", (-1,)), ("dense", (-1, 2, 3)), ("tokens", (-1, -1)), ("tokens_mask", (-1, -1)),
        ("score", (-1,))]
    rows = typed.transform(frame.limit(6)).toPandas()  # 6 rows, sequences of 1-5: both dynamic
    with torch.no_grad():
        network = mlflow.pytorch.load_model(logged)(*_positional(rows))
    raw = torch.tensor(np.stack([v.toArray() for v in rows.rawPrediction]), dtype=torch.float32)
    assert torch.allclose(network, raw, atol=1e-5)


def test_an_int8_typed_model_also_logs_its_int8_network(typed, frame, uri):
    int8 = typed.copy().setQuantization("int8")
    run_id = _log(int8, uri)
    inputs = _positional(frame.limit(6).toPandas())
    with torch.no_grad():
        logged = mlflow.pytorch.load_model(f"runs:/{run_id}/torch_model_int8")(*inputs)
        assert torch.allclose(logged, int8.module()(*inputs), atol=1e-5)
        fp32 = mlflow.pytorch.load_model(f"runs:/{run_id}/torch_model")(*inputs)
        assert torch.allclose(fp32, typed.module()(*inputs), atol=1e-6)


def test_a_features_model_is_signed_with_its_vector_or_its_columns(assembled, frame,
                                                                    uri):
    net = assembled.stages[-1]
    inputs = _columns(tracking._signature(net).inputs)
    assert inputs == [("features", "sparkml_vector")]
    inputs = _columns(tracking._signature(net.copy({net.featureCols: ["age", "score"]})).inputs)
    assert inputs == [("age", "double"), ("score", "double")]
    run_id = _log(assembled, uri)  # the workflows' pipeline reads the assembler's columns
    info = mlflow.models.get_model_info(f"runs:/{run_id}/model")
    assert _columns(info.signature.inputs) == [("age", "double"), ("score", "double"),
                                               ("plan", "string")]
    assert _columns(info.signature.outputs) == OUTPUTS
    rows = frame.limit(5)
    scored = mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(rows.toPandas())
    assert list(scored) == [r.prediction for r in assembled.transform(rows).collect()]
    unknown = PipelineModel(stages=[SQLTransformer(statement="SELECT * FROM __THIS__"), net])
    assert tracking._signature(unknown) is None  # its inputs are not known: none rather


def test_the_output_is_the_prediction_column(assembled):
    net = assembled.stages[-1]
    for params in ({net.getParam("loss"): "mse"}, {net.predictionCol: "score"}):
        assert _columns(tracking._signature(net.copy(params)).outputs) == [
            (net.copy(params).getPredictionCol(), "double")]
