"""TorchEstimator's labels and weights (issue 27), end to end on Spark: an array label (several
outputs), several label columns handed to a loss function as a dict, row weights that weigh
the mean; resumed after a killed rank to the uninterrupted weights; each bad label or weight
refused with a typed error naming the column or Param."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from mlflow.types import DataType
from mlflow.types.schema import Array
from pyspark import cloudpickle
from pyspark.sql import functions as F_sql

from sparkdist import tracking
from sparkdist.exceptions import ParamError, SchemaError
from sparkdist.failpoints import arm
from sparkdist.models import TorchEstimator, TorchModel
from sparkdist.torchtrain import nets

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the losses travel by value
COMMON = {"progress": False, "numWorkers": 2, "seed": 5, "rendezvousTimeoutSeconds": 60,
          "featureCols": ["x1", "x2"], "model": nets.MLP, "modelKwargs": {"hidden": [16]},
          "learningRate": 0.02, "batchSize": 32}


@pytest.fixture(scope="module")
def rows(spark, cached):
    """x1, x2 in [-1, 1]; ``sums`` = [x1 + x2, x1 - x2]; ``size`` a regression target and
    ``big`` its 0/1 class; ``group`` 0 or 1, with ``contradicted`` its label (0 or 1) and
    ``w`` its weight (3 or 1)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (512, 2))
    group = np.arange(512) % 2
    frame = pd.DataFrame({"x1": x[:, 0], "x2": x[:, 1],
                          "sums": list(np.stack([x[:, 0] + x[:, 1], x[:, 0] - x[:, 1]], 1)),
                          "size": 2 * x[:, 0], "big": (x[:, 1] > 0).astype(float),
                          "group": group, "contradicted": group.astype(float),
                          "w": np.where(group == 0, 3.0, 1.0)})
    with cached(spark.createDataFrame(frame).repartition(2)) as df:
        yield df


def test_an_array_label_trains_several_outputs_and_scores_them_as_an_array(rows, tmp_path):
    model = TorchEstimator(labelCol="sums", loss="mse", epochs=15, **COMMON).fit(rows)
    assert model.history[-1]["loss"] < 0.01
    scored = model.transform(rows).select("sums", "prediction").toPandas()
    predicted, wanted = np.stack(scored["prediction"]), np.stack(scored["sums"])
    assert predicted.shape == (512, 2) and np.abs(predicted - wanted).mean() < 0.1
    (output,) = tracking._signature(model).outputs.inputs  # MLflow's signature says so too
    assert model.labelWidth == 2 and output.type == Array(DataType.double)
    model.write().save(str(tmp_path / "sums"))
    again = TorchModel.load(str(tmp_path / "sums")).transform(rows).select("prediction")
    assert [list(r[0]) for r in again.collect()] == [list(p) for p in scored["prediction"]]


def test_a_vector_of_0_1_labels_trains_multi_label_with_each_ones_probability(rows):
    from pyspark.ml.functions import array_to_vector

    df = rows.withColumn("signs", array_to_vector(F_sql.array(
        (F_sql.col("x1") > 0).cast("double"), (F_sql.col("x2") > 0).cast("double"))))
    model = TorchEstimator(labelCol="signs", loss="bce", epochs=15, **COMMON).fit(df)
    scored = model.transform(df).select("signs", "prediction", "probability",
                                        "rawPrediction").toPandas()
    wanted = np.stack(scored["signs"].map(lambda v: v.toArray()))
    predicted = np.stack(scored["prediction"])
    probability = np.stack(scored["probability"].map(lambda v: v.toArray()))
    raw = np.stack(scored["rawPrediction"].map(lambda v: v.toArray()))
    assert predicted.shape == probability.shape == raw.shape == (512, 2)
    assert (predicted == wanted).mean() > 0.95
    np.testing.assert_allclose(probability, 1 / (1 + np.exp(-raw)), rtol=1e-6)
    assert ((probability > 0.5) == (predicted == 1)).all()


def multitask(output: torch.Tensor, labels: dict[str, torch.Tensor]) -> torch.Tensor:
    """A regression head and a 0/1 head: one loss per row."""
    return (F.mse_loss(output[:, 0], labels["size"], reduction="none")
            + F.binary_cross_entropy_with_logits(output[:, 1], labels["big"], reduction="none"))


def test_several_label_columns_reach_a_loss_function_as_a_dict(rows):
    model = TorchEstimator(labelCols=["size", "big"], loss=multitask, epochs=15,
                           **COMMON).fit(rows)
    out = np.stack(model.transform(rows).select("prediction").toPandas()["prediction"])
    frame = rows.select("size", "big").toPandas()
    assert np.abs(out[:, 0] - frame["size"]).mean() < 0.1
    assert ((out[:, 1] > 0) == (frame["big"] > 0)).mean() > 0.95


def test_weights_weigh_the_mean_a_constant_weight_changes_nothing(rows):
    """Rows of the same features with labels 0 (weight 3) and 1 (weight 1): the mean squared
    error is least at the weighted mean 0.25 (unweighted: 0.5); weights of 1 change no bit."""
    settings = {**COMMON, "labelCol": "contradicted", "loss": "mse", "epochs": 10,
                "featureCols": ["x1"], "modelKwargs": {"hidden": []}, "learningRate": 0.05}
    weighted = TorchEstimator(weightCol="w", **settings).fit(rows)
    plain = TorchEstimator(**settings).fit(rows)
    assert abs(_mean_prediction(weighted, rows) - 0.25) < 0.03
    sharded = TorchEstimator(weightCol="w", strategy="fsdp", **settings).fit(rows)
    assert abs(_mean_prediction(sharded, rows) - 0.25) < 0.03
    assert abs(_mean_prediction(plain, rows) - 0.5) < 0.03
    assert abs(weighted.history[-1]["loss"] - 0.1875) < 0.01  # 3/4 x 1/16 + 1/4 x 9/16
    ones = TorchEstimator(weightCol="one", **settings).fit(rows.selectExpr("*", "1.0 AS one"))
    assert _same_weights(ones, plain)


def _mean_prediction(model, df) -> float:
    return float(model.transform(df).agg({"prediction": "avg"}).first()[0])


def _same_weights(a, b) -> bool:
    first, second = a.module().state_dict(), b.module().state_dict()
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k])
                                                  for k in first)


def test_a_killed_rank_resumes_a_weighted_array_label_fit_to_the_uninterrupted_weights(
        rows, tmp_path):
    settings = {**COMMON, "labelCol": "sums", "loss": "mse", "weightCol": "w", "epochs": 3}
    clean = TorchEstimator(checkpointDir=str(tmp_path / "clean"), **settings).fit(rows)
    killed = arm(TorchEstimator(checkpointDir=str(tmp_path / "ckpt"), **settings),
                 str(tmp_path), rank=1, epoch=2, step=3, action="kill").fit(rows)
    assert killed.trainingSummary["resumed_from_epoch"] == 1
    assert _same_weights(killed, clean)


def per_batch(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output[:, 0], label)  # one number for the batch: refused


@pytest.mark.parametrize(("params", "columns", "error", "message"), [
    ({"weightCol": "neg"}, "IF(group = 0, -1.0, 1.0) AS neg", SchemaError,
     "weightCol 'neg' holds 256 negative"),
    ({"weightCol": "zero"}, "0.0 AS zero", SchemaError, "weights sum to 0.0"),
    ({"weightCol": "name"}, "'a' AS name", SchemaError, "weightCol"),
    ({"labelCol": "ragged"}, "IF(x1 < -0.95, array(1.0), sums) AS ragged", SchemaError,
     r"labelCol 'ragged': \d+ rows hold a null inside the array or not 2 values"),
    ({"labelCol": "sums", "loss": "cross_entropy"}, None, SchemaError,
     "is an array, but loss='cross_entropy'"),
    ({"labelCols": ["size", "big"]}, None, ParamError, "labelCols=.* need a loss function"),
    ({"labelCols": ["size", "big"], "labelCol": "size", "loss": multitask}, None, ParamError,
     "both set"),
    ({"labelCols": ["size", "gone"], "loss": multitask}, None, SchemaError, "gone"),
    ({"loss": per_batch}, None, ParamError, "returns \\(\\) for 2 rows; return one loss per row"),
    ({"weightCol": "w", "strategy": "tensor"}, None, ParamError,
     "weightCol .* strategy='tensor'"),
    ({"labelCol": "sums", "strategy": "tensor"}, None, ParamError,
     r"labels of several values \(labelCols or an array labelCol\) with strategy='tensor'"),
])
def test_bad_labels_and_weights_are_refused_naming_the_column_or_param(rows, params, columns,
                                                                       error, message):
    df = rows.selectExpr("*", columns) if columns else rows
    settings = {**COMMON, "labelCol": "size", "loss": "mse", "epochs": 1, **params}
    if "labelCols" in params and "labelCol" not in params:
        del settings["labelCol"]
    with pytest.raises(error, match=message):
        TorchEstimator(**settings).fit(df)
