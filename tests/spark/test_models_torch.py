"""TorchEstimator / TorchModel in local[2]: learning, reproducibility, worker counts, skew,
persistence, Pipeline, and every bad input the issue lists."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
import torch
from pyspark import cloudpickle
from pyspark.ml import Pipeline
from pyspark.ml.linalg import Vectors
from pyspark.sql import functions as F

from sparkdist.evaluation import evaluate
from sparkdist.exceptions import ClusterConfigError, ParamError, SchemaError, TrainingError
from sparkdist.models import TorchEstimator, TorchModel

# Classes defined here travel to the executors by value (the test module is not importable
# there); pyspark pickles tasks with its own copy of cloudpickle.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

FAST = {"progress": False, "batchSize": 128, "learningRate": 0.01,
        "modelKwargs": {"hidden": [32, 16]}}


@pytest.fixture(scope="module")
def data(nonlinear):
    return nonlinear


def _accuracy(model, df) -> float:
    return model.transform(df).where("prediction = label").count() / df.count()


def _weights(model) -> dict[str, torch.Tensor]:
    return model.module().state_dict()


@pytest.fixture(scope="module")
def two_worker_model(data, seed=11):
    return TorchEstimator(numWorkers=2, epochs=8, seed=seed, **{**FAST, "batchSize": 64}).fit(
        data[0])


@pytest.mark.slow
def test_two_workers_learn_and_beat_the_baseline(two_worker_model, data):
    losses = [epoch["loss"] for epoch in two_worker_model.history]
    assert len(losses) == 8 and losses[-1] < 0.6 * losses[0]
    majority = max(data[1].where("label = 1").count(), data[1].where("label = 0").count())
    accuracy = _accuracy(two_worker_model, data[1])
    assert accuracy > majority / 1000 + 0.2 and accuracy > 0.85


@pytest.mark.slow
def test_same_seed_and_world_size_give_identical_weights(two_worker_model, data):
    again = TorchEstimator(numWorkers=2, epochs=8, seed=11, **{**FAST, "batchSize": 64}).fit(
        data[0])
    first, second = _weights(two_worker_model), _weights(again)
    assert all(torch.equal(first[name], second[name]) for name in first)
    other = TorchEstimator(numWorkers=2, epochs=1, seed=12, **FAST).fit(data[0])
    assert not torch.equal(_weights(other)["layers.0.weight"], first["layers.0.weight"])


@pytest.mark.slow
def test_one_worker_with_the_same_global_batch_reaches_the_same_accuracy(two_worker_model,
                                                                        data):
    """batchSize is per worker: 1 worker at 2 x 64 rows a step takes the same global steps
    as 2 workers at 64 each."""
    summary = two_worker_model.trainingSummary
    assert (summary["batch_size"], summary["global_batch_size"]) == (64, 128)
    one = TorchEstimator(numWorkers=1, epochs=8, seed=11, **FAST).fit(data[0])
    assert one.trainingSummary["steps_per_epoch"] == summary["steps_per_epoch"]
    assert abs(_accuracy(one, data[1]) - _accuracy(two_worker_model, data[1])) <= 0.01


@pytest.mark.slow
def test_each_rank_reports_where_its_time_went(two_worker_model):
    ranks = two_worker_model.trainingSummary["ranks"]
    assert [rank["rank"] for rank in ranks] == [0, 1]
    for rank in ranks:
        assert rank["compute_s"] > 0 and rank["data_s"] > 0 and rank["peak_rss_mb"] > 50
        assert rank["communication_s"] >= 0 and rank["other_s"] >= 0
    # every rank holds a whole replica (its weights, gradients and Adam's two moments: 4x the
    # parameters' bytes) and sends at least its gradients every step
    module = two_worker_model.module()
    param_mb = sum(p.numel() * p.element_size() for p in module.parameters()) / 2**20
    steps = two_worker_model.trainingSummary["steps_per_epoch"] * len(two_worker_model.history)
    for rank in ranks:
        assert rank["state_mb"] == pytest.approx(4 * param_mb, rel=1e-3, abs=1e-3)
        assert rank["sent_mb"] >= steps * param_mb * 0.9
    assert two_worker_model.trainingSummary["strategy"] == "ddp"


@pytest.mark.slow
def test_skewed_partitions_with_one_empty_train_without_hanging(spark, data):
    skewed = data[0].repartition(2, F.lit(0))  # every row hashes to the same partition
    sizes = skewed.rdd.glom().map(len).collect()
    assert sorted(sizes) == [0, 4000]
    model = TorchEstimator(numWorkers=2, epochs=4, seed=3, timeoutSeconds=300,
                           **FAST).fit(skewed)
    assert model.history[-1]["loss"] < model.history[0]["loss"]
    assert _accuracy(model, data[1]) > 0.8


@pytest.mark.slow
def test_save_load_transform_round_trip(two_worker_model, data, tmp_path):
    path = str(tmp_path / "torch-model")
    two_worker_model.write().save(path)
    loaded = TorchModel.load(path)
    assert loaded.history == two_worker_model.history
    assert loaded.getOrDefault("modelKwargs") == {"hidden": [32, 16]}
    before = two_worker_model.transform(data[1]).select("probability").collect()
    after = loaded.transform(data[1]).select("probability").collect()
    assert [r[0] for r in before] == [r[0] for r in after]
    metrics = evaluate(loaded, data[1])
    assert metrics["auc"] > 0.9 and metrics["accuracy"] > 0.85


def test_estimator_save_load_keeps_params(tmp_path):
    est = TorchEstimator(loss="cross_entropy", epochs=3, numWorkers=2,
                         modelKwargs={"hidden": [4]}, validationFraction=0.2)
    est.write().save(str(tmp_path / "est"))
    loaded = TorchEstimator.load(str(tmp_path / "est"))
    assert loaded.extractParamMap() == {loaded.getParam(p.name): v
                                        for p, v in est.extractParamMap().items()}


@pytest.mark.slow
def test_breast_cancer_mlp_in_a_pipeline_reaches_095(spark):
    """Quality bar: an MLP after FeatureAssembler on scikit-learn's breast-cancer data."""
    from sklearn.datasets import load_breast_cancer

    from sparkdist.features import FeatureAssembler, split

    bunch = load_breast_cancer(as_frame=True)
    frame = bunch.frame.rename(columns=lambda c: c.replace(" ", "_"))
    frame["row_id"] = range(len(frame))
    df = spark.createDataFrame(frame)
    parts = split(df, method="stratified", labelCol="target", keyCols=["row_id"],
                  fractions={"train": 0.75, "test": 0.25}, seed=5)
    features = [c for c in frame.columns if c not in ("target", "row_id")]
    pipeline = Pipeline(stages=[
        FeatureAssembler(numericCols=features, labelCol="target", standardize=True),
        TorchEstimator(labelCol="target", numWorkers=2, epochs=30, batchSize=32,
                       learningRate=0.003, seed=5, progress=False,
                       modelKwargs={"hidden": [32]})])
    model = pipeline.fit(parts["train"].repartition(2))
    metrics = evaluate(model, parts["test"])
    assert metrics["accuracy"] >= 0.95, metrics


@pytest.mark.slow
def test_multiclass_validation_and_early_stopping(spark):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3000, 4)).astype("float32")
    y = np.digitize(x[:, 0] + x[:, 1], [-0.7, 0.7]).astype("float32")  # 3 classes
    df = spark.createDataFrame(pd.DataFrame({"x": list(x), "y": y})).repartition(2)
    model = TorchEstimator(featuresCol="x", labelCol="y", loss="cross_entropy", numWorkers=2,
                           epochs=40, validationFraction=0.2, earlyStoppingPatience=2,
                           seed=4, **{**FAST, "learningRate": 0.05}).fit(df)
    history = model.history
    assert len(history) < 40  # stopped early
    assert {"loss", "val_loss", "val_accuracy", "seconds"} <= set(history[-1])
    assert max(h["val_accuracy"] for h in history) > 0.9
    out = model.transform(df).select("prediction", "probability").first()
    assert out.prediction in (0.0, 1.0, 2.0) and len(out.probability) == 3


def test_regression_from_numeric_columns(spark):
    rng = np.random.default_rng(8)
    frame = pd.DataFrame(rng.normal(size=(2000, 3)), columns=["a", "b", "c"])
    frame["target"] = 2 * frame.a - frame.b + 0.5
    df = spark.createDataFrame(frame).repartition(2)
    model = TorchEstimator(featureCols=["a", "b", "c"], labelCol="target", loss="mse",
                           numWorkers=2, epochs=15, seed=8, **FAST).fit(df)
    assert model.task == "regression"
    metrics = evaluate(model, df)
    assert metrics["rmse"] < 0.3 * float(frame.target.std())


class Exploding(torch.nn.Module):
    """Trains fine on the driver check (eval mode), fails in training on the executors."""

    def __init__(self, input_dim: int, output_dim: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(input_dim, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise RuntimeError("boom in forward")
        return self.linear(x)


@pytest.mark.slow
def test_a_failing_worker_ends_in_a_training_error_with_its_output(data):
    with pytest.raises(TrainingError) as err:
        TorchEstimator(model=Exploding, numWorkers=2, epochs=1, progress=False).fit(data[0])
    message = str(err.value)
    assert "boom in forward" in message and "output tail of rank" in message


# ------------------------------------------------------------------------------ bad input
def _small(spark, **columns):
    return spark.createDataFrame(pd.DataFrame(columns)).repartition(2)


@pytest.fixture(scope="module")
def tiny(spark):
    return _small(spark, features=[[0.0, 1.0], [1.0, 0.0]] * 20, label=[0.0, 1.0] * 20).cache()


def test_wrong_feature_type(spark):
    df = _small(spark, features=["a", "b"], label=[0.0, 1.0])
    with pytest.raises(SchemaError, match="featuresCol: column 'features' has type string"):
        TorchEstimator().fit(df)


def test_inconsistent_vector_lengths(spark):
    df = _small(spark, features=[[0.0, 1.0], [1.0]] * 5, label=[0.0, 1.0] * 5)
    with pytest.raises(SchemaError, match="between 1 and 2 values"):
        TorchEstimator(batchSize=2).fit(df)


def test_nan_features_error_by_default_and_drop_on_request(spark):
    rows = [[0.0, 1.0], [1.0, 0.0]] * 20 + [[float("nan"), 1.0], [float("inf"), 0.0]]
    df = _small(spark, features=rows, label=[0.0, 1.0] * 21)
    with pytest.raises(SchemaError, match="2 of 42 rows have NaN, infinite or null"):
        TorchEstimator(batchSize=4).fit(df)
    model = TorchEstimator(batchSize=4, epochs=1, nanPolicy="drop", progress=False).fit(df)
    assert model.history[0]["loss"] > 0


def test_labels_that_do_not_fit_the_loss(spark):
    df = _small(spark, features=[[0.0], [1.0], [2.0]] * 4, label=[0.0, 1.0, 2.0] * 4)
    with pytest.raises(SchemaError, match="use loss='cross_entropy'"):
        TorchEstimator(batchSize=2).fit(df)
    with pytest.raises(ParamError, match="numClasses=2"):
        TorchEstimator(batchSize=2, loss="cross_entropy", numClasses=2).fit(df)


def test_model_that_cannot_be_imported(tiny):
    with pytest.raises(ParamError, match="model='mypkg.nets.Missing' cannot be imported"):
        TorchEstimator(model="mypkg.nets.Missing", batchSize=2).fit(tiny)


def test_model_output_that_does_not_fit_the_label(tiny):
    with pytest.raises(ParamError, match=r"returns shape \(2, 3\).*needs 1 output"):
        TorchEstimator(modelKwargs={"output_dim": 3}, batchSize=2).fit(tiny)


def test_num_workers_above_the_task_slots(tiny):
    with pytest.raises(ClusterConfigError, match="numWorkers=8 exceeds the 2 task slots"):
        TorchEstimator(numWorkers=8, batchSize=2).fit(tiny)


def test_gpu_required_without_gpu_scheduling(tiny):
    with pytest.raises(ClusterConfigError, match="spark.task.resource.gpu.amount"):
        TorchEstimator(useGpu=True, batchSize=2).fit(tiny)


def test_batch_size_above_the_rows(tiny):
    with pytest.raises(ParamError, match="batchSize=100 exceeds the 40 usable rows"):
        TorchEstimator(batchSize=100).fit(tiny)


def test_bad_params_name_the_param_and_the_fix(tiny):
    with pytest.raises(ParamError, match="Did you mean 'adam'"):
        TorchEstimator(optimizer="adma").fit(tiny)
    with pytest.raises(ParamError, match="earlyStoppingPatience needs validation rows"):
        TorchEstimator(earlyStoppingPatience=2).fit(tiny)
    with pytest.raises(ParamError, match="epochs=0"):
        TorchEstimator(epochs=0).fit(tiny)


def test_validation_indicator_col_holds_out_the_marked_rows(spark):
    """pyspark's validationIndicatorCol (formerly validationCol): true rows validate only;
    a non-boolean column is refused by that name."""
    df = _small(spark, features=[[0.0, 1.0], [1.0, 0.0]] * 20, label=[0.0, 1.0] * 20,
                is_val=[False] * 30 + [True] * 10)
    model = TorchEstimator(validationIndicatorCol="is_val", batchSize=4, epochs=1,
                           progress=False).fit(df)
    assert model.trainingSummary["validation_rows"] == 10 and "val_loss" in model.history[0]
    with pytest.raises(SchemaError, match="validationIndicatorCol: column 'label' has type"):
        TorchEstimator(validationIndicatorCol="label", batchSize=4).fit(df)


def test_missing_column_suggests_the_name(tiny):
    with pytest.raises(SchemaError, match="Did you mean 'label'"):
        TorchEstimator(labelCol="lable").fit(tiny)


def test_vector_features_are_accepted(spark):
    df = spark.createDataFrame([(Vectors.dense([0.0, 1.0]), 1.0),
                                (Vectors.dense([1.0, 0.0]), 0.0)] * 10,
                               ["features", "label"]).repartition(1)
    model = TorchEstimator(batchSize=4, epochs=1, progress=False).fit(df)
    assert model.inputDim == 2


# -- TorchModel.transform on features that do not fit the network (report D12: T9) ----------
def _two_feature_model() -> TorchModel:
    """A TorchModel for 2 features (a fresh MLP's weights; no fit needed)."""
    from sparkdist.torchtrain.nets import MLP

    return TorchModel._fitted(MLP(input_dim=2, output_dim=1).state_dict(),
                              {"input_dim": 2, "output_dim": 1, "num_classes": 2})


def test_transform_refuses_a_known_wrong_width_before_any_job(spark):
    from sparkdist.features import FeatureAssembler

    frame = spark.createDataFrame([(1.0, 2.0, 3.0)], ["a", "b", "c"])
    three = FeatureAssembler(numericCols=["a", "b", "c"]).fit(frame).transform(frame)
    with pytest.raises(SchemaError, match="featuresCol: 'features' holds 3 features per row, "
                                          "but this TorchModel was trained on 2"):
        _two_feature_model().transform(three)
    with pytest.raises(SchemaError, match="'a', 'b', 'c' holds 3 features per row"):
        _two_feature_model()._set(featureCols=["a", "b", "c"]).transform(frame)


@pytest.mark.parametrize("rows, match", [
    ([[1.0, 2.0], None], "a row of featuresCol 'features' is null or holds a null"),
    ([[1.0, 2.0], [1.0, None]], "a row of featuresCol 'features' is null or holds a null"),
    ([[1.0, 2.0], [1.0, 2.0, 3.0]], "holds 3 values, but the model was trained on 2"),
])
@pytest.mark.slow
def test_transform_names_a_null_or_wrong_length_row(spark, rows, match):
    """Arrays carry no width in the schema: the job that reaches a bad row stops with a
    message naming the column and the fix (not a failure inside the network)."""
    df = spark.createDataFrame([(r,) for r in rows], "features array<double>")
    scored = _two_feature_model().transform(df)
    with pytest.raises(Exception, match=match):
        scored.collect()
    good = _two_feature_model().transform(df.limit(1)).collect()
    assert len(good) == 1 and good[0]["prediction"] in (0.0, 1.0)
