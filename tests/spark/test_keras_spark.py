"""KerasEstimator (issue 29): Keras 3 models trained on the torch backend by sparkdist's
launcher, feed, DDP and checkpoints; binary, multi-class and regression fits; save/load as a
JSON config plus weights; a 1-worker fit against Keras' own ``fit``; resume after a killed
rank; planted archives refused without running anything; each bad input a typed error."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

keras = pytest.importorskip("keras")

from pyspark import cloudpickle  # noqa: E402

from sparkdist.exceptions import ModelLoadError, ParamError  # noqa: E402
from sparkdist.failpoints import arm  # noqa: E402
from sparkdist.models import KerasEstimator, KerasModel  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Scale travels by value

COMMON = {"progress": False, "numWorkers": 2, "seed": 5, "rendezvousTimeoutSeconds": 60,
          "featureCols": ["x1", "x2", "x3"], "batchSize": 32, "learningRate": 0.01}


def mlp(input_dim, hidden=16, outputs=1, activation="sigmoid"):
    """Dense, BatchNormalization (non-trainable moving statistics), Dense."""
    inputs = keras.Input((input_dim,))
    hidden_layer = keras.layers.Dense(hidden, activation="relu")(inputs)
    normed = keras.layers.BatchNormalization(momentum=0.9)(hidden_layer)
    return keras.Model(inputs, keras.layers.Dense(outputs, activation=activation)(normed))


@pytest.fixture(scope="module")
def data(spark, cached):
    """x1..x3 uniform in [-1, 1]; ``label`` = x1 + x2 > 0, ``klass`` = which third of x1 + x2
    (0, 1, 2), ``target`` = x1 - 2 x2 + noise."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (1000, 3))
    s = x[:, 0] + x[:, 1]
    frame = pd.DataFrame({"x1": x[:, 0], "x2": x[:, 1], "x3": x[:, 2],
                          "label": (s > 0).astype(float),
                          "klass": np.digitize(s, [-0.6, 0.6]).astype(float),
                          "target": x[:, 0] - 2 * x[:, 1] + rng.normal(0, 0.05, 1000)})
    with cached(spark.createDataFrame(frame).repartition(2)) as df:
        yield df


@pytest.fixture(scope="module")
def binary(data):
    return KerasEstimator(model=mlp, loss="binary_crossentropy", epochs=8,
                          validationFraction=0.2, earlyStoppingPatience=3, **COMMON).fit(data)


def _accuracy(model, df, label="label"):
    return model.transform(df).where(f"prediction = {label}").count() / df.count()


def test_a_binary_fit_scores_as_the_keras_model_and_reloads(binary, data, tmp_path):
    assert binary.history[-1]["loss"] < 0.5 * binary.history[0]["loss"]
    assert binary.history[-1]["val_accuracy"] > 0.85  # validation as TorchEstimator's
    assert _accuracy(binary, data) > 0.9
    rows = binary.transform(data).select("x1", "x2", "x3", "probability",
                                         "rawPrediction").toPandas()
    keras_model = binary.keras_model()
    assert isinstance(keras_model, keras.Model)
    with torch.no_grad():  # the Keras model's sigmoid output is the probability of 1
        expected = keras_model(torch.tensor(rows[["x1", "x2", "x3"]].to_numpy(),
                                            dtype=torch.float32), training=False)
    probability = np.array([p[1] for p in rows.probability])
    np.testing.assert_allclose(probability, expected.numpy()[:, 0], atol=1e-6)
    raw = np.array([r[1] for r in rows.rawPrediction])  # its logit
    np.testing.assert_allclose(1 / (1 + np.exp(-raw)), probability, atol=1e-6)
    # saved as the JSON config and a weights state dict: no pickle, no builder needed
    binary.write().save(str(tmp_path / "model"))
    record = json.loads((tmp_path / "model" / "metadata" / "part-00000").read_text())
    config = json.loads(record["sparkdistState"]["keras"]["config"])
    assert config["class_name"] == "Functional"
    loaded = KerasModel.load(str(tmp_path / "model"))
    assert loaded.transform(data).select("probability").collect() == \
        binary.transform(data).select("probability").collect()
    moving = [w for w in loaded.keras_model().weights if "moving_mean" in w.path]
    assert moving and float(np.abs(keras.ops.convert_to_numpy(moving[0].value)).sum()) > 0


def test_multiclass_and_regression_fits(data):
    classes = KerasEstimator(model=mlp, modelKwargs={"outputs": 3, "activation": "softmax"},
                             loss="sparse_categorical_crossentropy", labelCol="klass",
                             epochs=8, **COMMON).fit(data)
    assert classes.numClasses == 3 and _accuracy(classes, data, "klass") > 0.8
    scored = classes.transform(data).select("probability").first()[0]
    assert len(scored) == 3 and abs(sum(scored) - 1) < 1e-6
    regression = KerasEstimator(
        model=mlp, modelKwargs={"activation": None}, labelCol="target", epochs=8,
        loss=keras.losses.Huber(delta=0.5),
        optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
        **{k: v for k, v in COMMON.items() if k != "learningRate"}).fit(data)
    assert regression.task == "regression"
    frame = regression.transform(data).select("prediction", "target").toPandas()
    assert np.corrcoef(frame.prediction, frame.target)[0, 1] > 0.95
    logits = KerasEstimator(model=mlp, modelKwargs={"activation": None}, epochs=8,
                            loss=keras.losses.BinaryCrossentropy(from_logits=True),
                            **COMMON).fit(data)
    assert _accuracy(logits, data) > 0.9


def test_one_worker_with_sgd_matches_keras_fit_and_adam_differs_by_its_epsilon(spark):
    """One batch per step (the whole data), so the row order cannot differ. SGD: within
    1e-6. Adam: torch.optim adds epsilon after the bias correction, Keras before, which moves
    the weights whose gradients are near 1e-6 (docs/deep-models.md)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (256, 3)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("float32")
    df = spark.createDataFrame(pd.DataFrame({"x1": x[:, 0].astype(float),
                                             "x2": x[:, 1].astype(float),
                                             "x3": x[:, 2].astype(float),
                                             "label": y.astype(float)})).repartition(1)
    differences = {}
    for name in ("sgd", "adam"):
        ours = KerasEstimator(model=mlp, optimizer=name, epochs=5,
                              **{**COMMON, "numWorkers": 1, "seed": 7, "batchSize": 256}
                              ).fit(df).keras_model()
        keras.utils.set_random_seed(7)
        reference = mlp(3)
        reference.compile(optimizer=keras.optimizers.get(
            {"class_name": name, "config": {"learning_rate": 0.01}}),
            loss="binary_crossentropy")
        reference.fit(x, y, batch_size=256, epochs=5, shuffle=False, verbose=0)
        pairs = list(zip(ours.get_weights(), reference.get_weights()))
        assert len(pairs) == 8  # the moving statistics included
        differences[name] = max(float(np.abs(a - b).max()) for a, b in pairs)
    assert differences["sgd"] < 1e-6
    assert 1e-5 < differences["adam"] < 1e-2


def test_a_killed_rank_resumes_to_the_uninterrupted_weights(data, tmp_path):
    settings = {**COMMON, "model": mlp, "epochs": 3}
    clean = KerasEstimator(checkpointDir=str(tmp_path / "clean"), **settings).fit(data)
    killed = arm(KerasEstimator(checkpointDir=str(tmp_path / "ckpt"), **settings),
                 str(tmp_path), rank=1, epoch=2, step=3, action="kill").fit(data)
    assert killed.trainingSummary["resumed_from_epoch"] == 1
    first, second = clean.module().state_dict(), killed.module().state_dict()
    assert any("moving_variance" in k for k in first)
    differ = {k: float((first[k] - second[k]).abs().max()) for k in first
              if not torch.equal(first[k], second[k])}
    assert not differ


def compiled(input_dim):
    model = mlp(input_dim)
    model.compile(loss="mse")
    return model


def not_a_model(input_dim):
    return torch.nn.Linear(input_dim, 1)


def with_lambda(input_dim):
    inputs = keras.Input((input_dim,))
    return keras.Model(inputs, keras.layers.Lambda(lambda t: t[:, :1])(inputs))


@pytest.mark.parametrize(("params", "error", "message"), [
    ({"model": not_a_model}, ParamError, "not a keras.Model"),
    ({"model": compiled}, ParamError, "uncompiled"),
    ({"model": with_lambda}, ParamError, "Lambda layer holds or loads code"),
    ({"model": mlp, "loss": "no_such_loss"}, ParamError, "not a Keras loss"),
    ({"model": mlp, "loss": "categorical_crossentropy"}, ParamError,
     "sparse_categorical_crossentropy"),
    ({"model": mlp, "optimizer": "adagrad"}, ParamError, "torch.optim's equivalent"),
    ({"model": mlp, "loss": "sparse_categorical_crossentropy", "labelCol": "klass"},
     ParamError, "needs 3 per row"),
    ({"model": mlp, "strategy": "fsdp"}, ParamError, "strategy='ddp'"),
    ({"model": mlp, "optimizer": keras.optimizers.Adam(clipnorm=1.0)}, ParamError,
     "clipnorm"),
    ({"model": mlp, "modelKwargs": {"units": 3}}, ParamError, "units"),
])
def test_bad_input_is_refused_before_launch(data, params, error, message):
    with pytest.raises(error, match=message):
        KerasEstimator(**{**COMMON, **params}).fit(data)


def _plant(saved, tmp_path, edit):
    """A copy of a saved model whose Keras config ``edit`` changed."""
    import shutil

    planted = tmp_path / "planted"
    shutil.copytree(saved, planted)
    record_file = planted / "metadata" / "part-00000"
    record = json.loads(record_file.read_text())
    config = json.loads(record["sparkdistState"]["keras"]["config"])
    edit(config)
    record["sparkdistState"]["keras"]["config"] = json.dumps(config)
    record_file.write_text(json.dumps(record))
    return str(planted)


def test_planted_archives_are_refused_without_running_anything(binary, tmp_path,
                                                               monkeypatch):
    mark = tmp_path / "ran"
    binary.write().save(str(tmp_path / "model"))

    def callable_layer(config):  # a layer that names os.makedirs
        config["config"]["layers"][1].update(module="os", class_name="makedirs",
                                             registered_name=None)
        config["config"]["layers"][1]["config"] = {"name": str(mark)}

    def lambda_layer(config):  # a Lambda layer whose bytecode would make the mark
        source = compile(f"import os; os.makedirs({str(mark)!r})", "<planted>", "exec")
        import base64
        import marshal

        layer = config["config"]["layers"][1]
        layer.update(module="keras.layers", class_name="Lambda")
        layer["config"]["function"] = {"class_name": "__lambda__", "config": {
            "code": base64.b64encode(marshal.dumps(source)).decode(), "defaults": None,
            "closure": None}}

    for edit, refusal in ((callable_layer, "os.makedirs"), (lambda_layer, "Lambda")):
        with pytest.raises(ModelLoadError, match=refusal):
            KerasModel.load(_plant(tmp_path / "model", tmp_path / edit.__name__, edit))
    # a Keras HDF5 archive where the weights belong is not read as weights
    import h5py

    planted = tmp_path / "h5"
    import shutil

    shutil.copytree(tmp_path / "model", planted)
    [weights] = planted.rglob("weights.pt")
    weights.unlink()
    with h5py.File(weights, "w") as h5:
        h5.attrs["model_config"] = json.dumps({"class_name": "Lambda"})
    with pytest.raises(ModelLoadError, match="weights.pt"):
        KerasModel.load(str(planted))
    assert not mark.exists()


def test_a_process_set_for_another_keras_backend_is_told_which_variable():
    """Where KERAS_BACKEND names another backend before Keras is imported (no other backend is
    installed here to import)."""
    import subprocess
    import sys

    script = "from sparkdist.torchtrain.keras_net import import_keras\nimport_keras()\n"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "KERAS_BACKEND": "jax"}, timeout=120)
    assert run.returncode != 0 and "ParamError" in run.stderr
    assert "KERAS_BACKEND='jax'" in run.stderr and "KERAS_BACKEND=torch" in run.stderr


def test_mlflow_logs_the_spark_model_signed_and_the_keras_model(binary, data, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from sparkdist import tracking

    uri = f"sqlite:///{tmp_path}/mlruns.db"
    rows = data.limit(20).toPandas()
    with tracking.workflow_run("keras", "workflow", uri=uri):
        run_id = tracking.log_model_run("model", {}, {}, binary, [], {}, {}, rows=rows)
    info = mlflow.models.get_model_info(f"runs:/{run_id}/model")
    assert [spec["name"] for spec in info.signature.inputs.to_dict()] == ["x1", "x2", "x3"]
    scored = mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(rows)  # the Spark model
    assert list(scored) == [r.prediction for r in binary.transform(data.limit(20)).collect()]
    features = torch.tensor(rows[["x1", "x2", "x3"]].to_numpy(), dtype=torch.float32)
    logged = mlflow.keras.load_model(f"runs:/{run_id}/keras_model")
    with torch.no_grad():
        expected = binary.keras_model()(features, training=False).numpy()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(logged(features, training=False)),
                               expected, atol=1e-6)


@keras.saving.register_keras_serializable(package="sparkdist_tests")
class Scale(keras.layers.Layer):
    """A registered layer: one trainable factor."""

    def build(self, input_shape):
        self.factor = self.add_weight(shape=(), initializer="ones")

    def call(self, inputs):
        return inputs * self.factor


class Unregistered(Scale):
    pass


def with_layer(input_dim, layer="registered"):
    inputs = keras.Input((input_dim,))
    scaled = (Scale() if layer == "registered" else Unregistered())(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(scaled))


def test_registered_layers_train_save_and_load_and_others_are_refused(data, tmp_path):
    with pytest.raises(ParamError, match="Unregistered.*register_keras_serializable"):
        KerasEstimator(model=with_layer, modelKwargs={"layer": "other"}, **COMMON).fit(data)
    model = KerasEstimator(model=with_layer, epochs=2, **COMMON).fit(data)
    model.write().save(str(tmp_path / "model"))
    loaded = KerasModel.load(str(tmp_path / "model"))
    assert loaded.transform(data).select("probability").collect() == \
        model.transform(data).select("probability").collect()

    def unknown(config):  # a class registered in no imported module
        config["config"]["layers"][1]["registered_name"] = "elsewhere>Scale"
        config["config"]["layers"][1]["module"] = "elsewhere"

    with pytest.raises(ModelLoadError, match="elsewhere.Scale"):
        KerasModel.load(_plant(tmp_path / "model", tmp_path / "unknown", unknown))
