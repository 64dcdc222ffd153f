"""TorchEstimator with several typed inputs (issue 27), end to end on Spark: images with a
shape, ids into embedding tables, token sequences with a mask, dense features with hashed ids;
under ddp and fsdp, saved, loaded and scored; resumed after a killed rank to the uninterrupted
weights; and each bad input refused with a typed error naming the column or argument."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
import torch
from pyspark import cloudpickle

from sparkdist.exceptions import ParamError, SchemaError, TrainingError
from sparkdist.failpoints import arm
from sparkdist.models import TorchEstimator, TorchModel
from sparkdist.torchtrain import nets

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Bag travels by value
COMMON = {"progress": False, "numWorkers": 2, "seed": 11, "rendezvousTimeoutSeconds": 60}


def _accuracy(model, df) -> float:
    return model.transform(df).where("prediction = label").count() / df.count()


def _same_weights(a, b) -> bool:
    first, second = a.module().state_dict(), b.module().state_dict()
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k])
                                                  for k in first)


# ----------------------------------------------------------------------------- images
@pytest.fixture(scope="module")
def digits(spark, cached):
    from sklearn.datasets import load_digits

    data = load_digits()
    frame = pd.DataFrame({"pixels": list(data.data / 16.0), "label": data.target})
    df = spark.createDataFrame(frame).repartition(2)
    with cached(df) as df:
        yield df.randomSplit([0.8, 0.2], seed=3)


CNN = {"model": nets.ImageCNN, "modelKwargs": {"channels": 1, "size": 8, "classes": 10},
       "inputCols": {"image": "pixels"}, "inputShapes": {"image": [1, 8, 8]},
       "loss": "cross_entropy", "batchSize": 32, "learningRate": 3e-3}


@pytest.fixture(scope="module")
def digits_model(digits):
    train, _ = digits
    return TorchEstimator(epochs=8, **CNN, **COMMON).fit(train)


def test_a_cnn_learns_digits_from_an_array_column_reshaped_to_images(digits, digits_model,
                                                                     tmp_path):
    _, test = digits
    assert _accuracy(digits_model, test) >= 0.95
    assert [f.shape for f in digits_model.inputFields()] == [(1, 8, 8)]
    digits_model.write().save(str(tmp_path / "cnn"))
    loaded = TorchModel.load(str(tmp_path / "cnn"))
    first, second = (m.transform(test).orderBy("pixels").select("probability").collect()
                     for m in (digits_model, loaded))
    assert [r[0] for r in first] == [r[0] for r in second]


def test_fsdp_trains_the_same_typed_inputs(digits):
    train, test = digits
    model = TorchEstimator(epochs=3, strategy="fsdp", **CNN, **COMMON).fit(train)
    assert model.trainingSummary["strategy"] == "fsdp" and _accuracy(model, test) >= 0.85


def test_a_killed_rank_resumes_a_typed_input_fit_to_the_uninterrupted_weights(digits,
                                                                              tmp_path):
    train, _ = digits
    settings = {**CNN, **COMMON, "epochs": 3}
    clean = TorchEstimator(checkpointDir=str(tmp_path / "clean"), **settings).fit(train)
    killed = arm(TorchEstimator(checkpointDir=str(tmp_path / "ckpt"), **settings),
                 str(tmp_path), rank=1, epoch=2, step=3, action="kill").fit(train)
    assert killed.trainingSummary["resumed_from_epoch"] == 1
    assert _same_weights(killed, clean)


# -------------------------------------------------------------------- ids and sequences
@pytest.fixture(scope="module")
def ratings(spark, cached):
    """The ratings sample's rows (data/ratings_sample.parquet) with integer ids."""
    from sparkdist.datasets import ratings as make

    df = make(spark, partitions=2, density=0.3, seed=0, string_ids=False).selectExpr(
        "int(user_id) AS user", "int(item_id) AS item", "double(rating) AS rating")
    with cached(df) as df:
        yield df


def test_a_two_tower_recommender_trains_on_id_columns_and_beats_the_mean(ratings):
    counts = ratings.agg({"user": "max", "item": "max", "rating": "avg"}).first()
    train, test = ratings.randomSplit([0.8, 0.2], seed=1)
    model = TorchEstimator(
        model=nets.TwoTower, inputCols={"user": "user", "item": "item"}, labelCol="rating",
        modelKwargs={"num_users": counts["max(user)"] + 1, "num_items": counts["max(item)"] + 1,
                     "dim": 16, "mean": counts["avg(rating)"]},
        loss="mse", epochs=6, batchSize=128, learningRate=0.01, **COMMON).fit(train)
    scored = model.transform(test).selectExpr("prediction", "rating").toPandas()
    rmse = float(np.sqrt(((scored.prediction - scored.rating) ** 2).mean()))
    baseline = float(np.sqrt(((counts["avg(rating)"] - scored.rating) ** 2).mean()))
    assert rmse < baseline, (rmse, baseline)
    assert [f.dtype for f in model.inputFields()] == ["int64", "int64"]


@pytest.fixture(scope="module")
def sequences(spark, cached):
    """Token sequences of 2-12 ids in 1..19; the label: whether token 7 occurs."""
    rng = np.random.default_rng(4)
    tokens = [rng.integers(1, 20, rng.integers(2, 13)).tolist() for _ in range(3000)]
    frame = pd.DataFrame({"words": tokens, "label": [float(7 in t) for t in tokens]})
    with cached(spark.createDataFrame(frame).repartition(2)) as df:
        yield df.randomSplit([0.8, 0.2], seed=2)


def test_a_transformer_trains_on_variable_length_sequences_with_a_mask(sequences, tmp_path):
    train, test = sequences
    model = TorchEstimator(
        model=nets.SequenceClassifier, inputCols={"tokens": "words"}, maxSequenceLength=16,
        modelKwargs={"vocab": 20, "classes": 2, "dim": 32, "heads": 2, "layers": 1,
                     "max_length": 16},
        loss="cross_entropy", epochs=4, batchSize=64, learningRate=3e-3, **COMMON).fit(train)
    (field,) = model.inputFields()
    assert (field.sequence, field.mask, field.num_embeddings) == (True, True, 20)
    assert _accuracy(model, test) >= 0.9
    # transform's Arrow path scores as the network does on the driver
    import pyarrow as pa

    from sparkdist.torchtrain import inference

    got = model.transform(test.limit(64)).select("words", "rawPrediction").collect()
    inputs = inference.typed_rows(model.inputFields(), (pa.array([r.words for r in got]),))
    expected = inference.score(model.module(), inputs, 1024, 2, fields=model.inputFields())
    np.testing.assert_allclose([r.rawPrediction.toArray() for r in got], expected.numpy(),
                               atol=1e-5)
    model.write().save(str(tmp_path / "seq"))
    assert _accuracy(TorchModel.load(str(tmp_path / "seq")), test) == _accuracy(model, test)


def test_a_dlrm_style_click_model_takes_dense_features_and_hashed_ids(spark, tmp_path):
    rng = np.random.default_rng(5)
    dense, ids = rng.normal(size=(1200, 13)), rng.integers(0, 1000, (1200, 26))
    logit = dense[:, 0] - dense[:, 1] + (ids[:, 0] % 2) - 0.5
    frame = pd.DataFrame({"dense": list(dense), "ids": list(ids),
                          "label": (rng.random(1200) < 1 / (1 + np.exp(-logit))).astype(float)})
    df = spark.createDataFrame(frame).repartition(2)
    model = TorchEstimator(
        model=nets.ClickModel, inputCols={"dense": "dense", "ids": "ids"},
        inputShapes={"ids": [26]}, modelKwargs={"tables": [1000] * 26, "dim": 4,
                                                "hidden": [16]},
        loss="bce", epochs=1, batchSize=128, **COMMON).fit(df)
    assert [f.shape for f in model.inputFields()] == [(13,), (26,)]
    model.write().save(str(tmp_path / "click"))
    first, second = (m.transform(df).select("probability").collect()
                     for m in (model, TorchModel.load(str(tmp_path / "click"))))
    assert first == second
    int8 = model.copy().setQuantization("int8").transform(df).select("prediction").toPandas()
    float32 = model.transform(df).select("prediction").toPandas()
    assert (int8.prediction == float32.prediction).mean() >= 0.95


# --------------------------------------------------------------------------- pipeline
class Pooled(torch.nn.Module):
    """The first child of :class:`Chained`: the mean embedding of a row's real tokens next to
    its user's."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.users = torch.nn.Embedding(20, 8), torch.nn.Embedding(50, 8)

    def forward(self, user: torch.Tensor, words: torch.Tensor,
                words_mask: torch.Tensor) -> torch.Tensor:
        mask = words_mask.unsqueeze(-1).float()
        pooled = (self.tokens(words) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return torch.cat([pooled, self.users(user)], 1)


class Chained(torch.nn.Module):
    """Typed inputs into a chain of children, the first taking them: pipeline-splittable."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = Pooled()
        self.hidden = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
        self.out = torch.nn.Linear(16, 2)

    def forward(self, user: torch.Tensor, words: torch.Tensor,
                words_mask: torch.Tensor) -> torch.Tensor:
        return self.out(self.hidden(self.embed(user, words, words_mask)))


def test_the_pipeline_feeds_typed_inputs_to_its_first_stage_and_takes_ddps_steps(spark):
    """Ids and variable-length sequences in, an array label and row weights out: 2 stages
    take plain SGD's steps as ddp does, to float rounding."""
    rng = np.random.default_rng(6)
    words = [rng.integers(1, 20, rng.integers(1, 9)).tolist() for _ in range(600)]
    frame = pd.DataFrame({"user": rng.integers(0, 50, 600), "words": words,
                          "targets": [[float(7 in w), len(w) / 8] for w in words],
                          "w": rng.uniform(0.5, 2.0, 600)})
    df = spark.createDataFrame(frame).repartition(2)
    settings = {**COMMON, "model": Chained, "inputCols": {"user": "user", "words": "words"},
                "maxSequenceLength": 12, "labelCol": "targets", "loss": "mse",
                "weightCol": "w", "optimizer": "sgd", "learningRate": 0.1, "epochs": 2,
                "batchSize": 32}
    ddp = TorchEstimator(**settings).fit(df)
    pipeline = TorchEstimator(strategy="pipeline", pipelineStages=2, microBatches=2,
                              **settings).fit(df)
    assert pipeline.trainingSummary["strategy"] == "pipeline"
    assert pipeline.history[-1]["loss"] == pytest.approx(ddp.history[-1]["loss"], rel=1e-5)
    assert pipeline.history[-1]["loss"] < 0.8 * pipeline.history[0]["loss"]
    first, second = ddp.module().state_dict(), pipeline.module().state_dict()
    assert max(float((first[k] - second[k]).abs().max()) for k in first) < 1e-5


def test_a_typed_network_whose_forward_is_no_chain_is_refused_by_the_pipeline(sequences):
    train, _ = sequences
    with pytest.raises(ParamError, match="the first taking the typed inputs of inputCols"):
        TorchEstimator(model=nets.SequenceClassifier, inputCols={"tokens": "words"},
                       modelKwargs={"vocab": 20, "dim": 8, "heads": 2, "layers": 1},
                       strategy="pipeline", pipelineStages=2, loss="cross_entropy",
                       **COMMON).fit(train)


# ---------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def tiny(spark):
    frame = pd.DataFrame({"user": [0, 1, 2, 3] * 5, "words": [[1, 2], [3], [4, 5, 6], [1]] * 5,
                          "name": ["a", "b", "c", "d"] * 5, "label": [0.0, 1.0] * 10})
    return spark.createDataFrame(frame)


def _fit(df, **params):
    settings = {"model": nets.TwoTower, "modelKwargs": {"num_users": 4, "num_items": 10},
                "inputCols": {"user": "user", "item": "user"}, "epochs": 1, "batchSize": 4,
                "loss": "bce", **COMMON, **params}
    return TorchEstimator(**settings).fit(df)


@pytest.mark.parametrize(("params", "error", "message"), [
    ({"inputCols": {"user": "user", "item": "missing"}}, SchemaError, "missing"),
    ({"inputCols": {"user": "user", "item": "name"}}, SchemaError,
     r"inputCols\['item'\] \(column 'name'\) has type string"),
    ({"inputCols": {"user": "user", "item": "user", "other": "user"}}, ParamError,
     "argument 'other', but TwoTower.forward"),
    ({"inputCols": {"user": "user"}}, ParamError, r"needs \['item'\]"),
    ({"inputShapes": {"items": [2]}}, ParamError, r"inputShapes names \['items'\]"),
    ({"modelKwargs": {"num_users": 3, "num_items": 10}}, SchemaError,
     r"id 3, but the network's table for 'user' has 3 rows"),
    ({"strategy": "tensor"}, ParamError, "inputCols .* strategy='tensor'"),
    ({"featureCols": ["user"]}, ParamError, "inputCols and featureCols both set"),
    ({"inputShapes": {"user": [2]}}, ParamError,
     r"inputShapes\['user'\]=\[2\], but inputCols\['user'\] .* one number per row"),
    ({"maxSequenceLength": 0}, ParamError, "maxSequenceLength=0"),
])
def test_bad_typed_inputs_are_refused_naming_the_column_or_argument(tiny, params, error,
                                                                    message):
    with pytest.raises(error, match=message):
        _fit(tiny, **params)


class Bag(torch.nn.Module):
    """Two ids per row into one table: a fixed-shape integer input."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(10, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.bag(tokens)


def test_a_float_array_whose_first_row_is_empty_needs_a_shape(spark):
    df = spark.createDataFrame(pd.DataFrame({"dense": [[], [1.0, 2.0]], "label": [0.0, 1.0]}))
    with pytest.raises(SchemaError, match=r"inputCols\['dense'\].*set its shape in inputShapes"):
        TorchEstimator(model=nets.ClickModel, inputCols={"dense": "dense", "ids": "dense"},
                       **COMMON).fit(df)


def test_a_wrong_length_a_negative_id_or_a_null_element_stops_every_rank(spark, tiny):
    sequence = {"model": nets.SequenceClassifier, "inputCols": {"tokens": "words"},
                "modelKwargs": {"vocab": 10, "dim": 8, "heads": 2, "layers": 1}}
    with pytest.raises(SchemaError, match=r"inputCols\['tokens'\].*rows do not hold 2 values"):
        _fit(tiny, model=Bag, modelKwargs={}, inputCols={"tokens": "words"},
             inputShapes={"tokens": [2]}, loss="cross_entropy")
    negative = spark.createDataFrame(pd.DataFrame({"words": [[1, -2], [3]] * 4,
                                                   "label": [0.0, 1.0] * 4}))
    with pytest.raises(SchemaError, match=r"inputCols\['tokens'\].*negative id -2"):
        _fit(negative, **sequence, loss="cross_entropy")
    nulls = spark.createDataFrame(pd.DataFrame({"words": [[1, None], [3]] * 4,
                                                "label": [0.0, 1.0] * 4}))
    with pytest.raises((SchemaError, TrainingError), match=r"inputCols\['tokens'\].*null"):
        _fit(nulls, **sequence, loss="cross_entropy")
