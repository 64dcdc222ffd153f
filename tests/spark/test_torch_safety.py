"""A TorchEstimator's or TorchModel's ``model`` and ``loss`` never run code that is not an
``nn.Module`` subclass (or a loss given as an object in code), on any entry point: fit, use
of a fitted model, and loading a saved one (``TorchModel.load``, ``persist.load_model``, the
``sparkdist predict`` command). Each planted payload writes a marker file if it ever runs."""

from __future__ import annotations

import importlib
import re
import sys
import uuid

import pandas as pd
import pytest
import torch
from pyspark import cloudpickle

from sparkdist.cli import main as cli
from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.models import TorchEstimator, TorchModel
from sparkdist.persist import load_model

# The losses defined here travel to the executors by value (this module is not importable
# there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

QUIET = {"progress": False, "batchSize": 8, "epochs": 1}


@pytest.fixture(scope="module")
def tiny(spark):
    frame = pd.DataFrame({"features": [[0.0, 1.0], [1.0, 0.0]] * 20, "label": [0.0, 1.0] * 20})
    return spark.createDataFrame(frame).repartition(2).cache()


@pytest.fixture(scope="module")
def fitted(tiny):
    return TorchEstimator(**QUIET).fit(tiny)


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "payload-ran"
    yield path
    assert not path.exists(), "a planted payload ran"


@pytest.fixture
def payloads(spark, tmp_path, marker, monkeypatch):
    """Two payload modules importable on the driver and the executors: ``called`` writes the
    marker when its ``plant`` is called, ``imported`` when the module is imported."""
    names = {}
    for kind, body in (("called", "def plant(*args, **kwargs):\n    _write()\n"),
                       ("imported", "_write()\nclass Net:\n    pass\n")):
        name = f"sparkdist_payload_{kind}_{uuid.uuid4().hex[:8]}"
        path = tmp_path / f"{name}.py"
        path.write_text(f"def _write():\n    open({str(marker)!r}, 'a').write('ran')\n{body}")
        spark.sparkContext.addPyFile(str(path))
        names[kind] = name
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(names["called"])  # already imported: only the class check refuses
    yield names
    for name in names.values():
        sys.modules.pop(name, None)


def _shell(marker) -> dict:
    return {"command": f"touch {marker}"}


def test_fit_refuses_a_model_that_is_not_an_nn_module_class(tiny, marker, payloads):
    planted = [("os.system", _shell(marker)),
               ("subprocess.Popen", {"args": ["touch", str(marker)]}),
               (f"{payloads['called']}.plant", {})]
    for model, kwargs in planted:
        with pytest.raises(ParamError, match=rf"model='{model}' is .*not an nn.Module subclass"):
            TorchEstimator(model=model, modelKwargs=kwargs, **QUIET).fit(tiny)


def test_fit_refuses_a_loss_function_named_only_in_a_param(tiny, marker, payloads):
    for loss in (f"{payloads['called']}.plant", "os.system"):
        with pytest.raises(ParamError, match=rf"loss='{loss}' is .*pass a function"):
            TorchEstimator(loss=loss, **QUIET).fit(tiny)


def test_fit_never_imports_a_module_named_in_a_param(tiny, marker, payloads):
    for params in ({"model": f"{payloads['imported']}.Net"},
                   {"loss": f"{payloads['imported']}.Net"}):
        with pytest.raises(ParamError, match="cannot be imported.*is not imported in this"):
            TorchEstimator(**params, **QUIET).fit(tiny)
    assert payloads["imported"] not in sys.modules


def test_a_fitted_model_whose_params_name_a_payload_refuses_use(fitted, tiny, marker):
    planted = fitted.copy({fitted.model: "os.system", fitted.modelKwargs: _shell(marker)})
    with pytest.raises(ParamError, match="model='os.system' is .*not an nn.Module subclass"):
        planted.module()
    with pytest.raises(ParamError, match="model='os.system'"):
        planted.transform(tiny).collect()


@pytest.mark.parametrize("kind", ["os.system", "imported"])
def test_loading_a_saved_model_that_names_a_payload_is_refused(fitted, tiny, marker, payloads,
                                                               tmp_path, kind, capsys):
    model = "os.system" if kind == "os.system" else f"{payloads['imported']}.Net"
    path = str(tmp_path / "planted")
    # What a tampered directory holds, written through the ordinary writer (so the test
    # does not depend on the directory layout).
    fitted.copy({fitted.model: model, fitted.modelKwargs: _shell(marker)}).write().save(path)
    with pytest.raises(ModelLoadError, match=re.escape(f"'{path}': model='{model}'")):
        TorchModel.load(path)
    with pytest.raises(ModelLoadError, match=rf"model='{model}'"):
        load_model(path)
    data = str(tmp_path / "data.parquet")
    tiny.write.parquet(data)
    for command in (["predict", path, data, str(tmp_path / "out")], ["evaluate", path, data]):
        assert cli(command) == 2
        assert f"model='{model}'" in capsys.readouterr().err
    assert payloads["imported"] not in sys.modules


def test_a_loaded_estimator_whose_params_name_a_payload_refuses_to_fit(tiny, marker, payloads,
                                                                        tmp_path):
    for params in ({"model": "os.system", "modelKwargs": _shell(marker)},
                   {"loss": f"{payloads['called']}.plant"}):
        path = str(tmp_path / f"planted-{len(params)}")
        TorchEstimator(**params, **QUIET).write().save(path)
        with pytest.raises(ParamError, match="not an nn.Module subclass|pass a function"):
            TorchEstimator.load(path).fit(tiny)


class PerRowL1(torch.nn.Module):
    """A loss module class: made without arguments, returns per-row losses."""

    def forward(self, output, label):
        return (output.reshape(-1) - label).abs()


def per_row_squared(output, label):
    return (output.reshape(-1) - label) ** 2


@pytest.mark.parametrize("loss", [PerRowL1, per_row_squared], ids=["module", "function"])
def test_a_loss_given_in_code_trains(tiny, loss):
    model = TorchEstimator(loss=loss, **QUIET).fit(tiny)
    assert model.getOrDefault("loss") == f"{__name__}.{loss.__qualname__}"
    assert model.task == "regression" and model.history[0]["loss"] > 0
