"""How TorchEstimator's ``model`` and ``loss`` names resolve (no Spark): registry first, then
modules already imported (or sparkdist's own), then the nn.Module check; and the estimator's
default seed is the same in every process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from sparkdist.exceptions import ParamError
from sparkdist.torchtrain import network


class Net(torch.nn.Module):
    pass


def test_a_class_given_in_code_resolves_by_its_name_even_when_not_importable():
    def make() -> type:
        class Local(torch.nn.Module):
            pass
        return Local

    local = make()
    name = network.to_name(local)
    assert name == f"{__name__}.test_a_class_given_in_code_resolves_by_its_name_even_when_" \
                   "not_importable.<locals>.make.<locals>.Local"
    assert network.resolve_model(name) is local
    assert network.resolve_model("sparkdist.torchtrain.nets.MLP").__name__ == "MLP"


def test_a_model_saved_under_the_old_package_name_still_resolves():
    from sparkdist.torchtrain.nets import MLP

    assert network.resolve_model("sparkdist.train.nets.MLP") is MLP


@pytest.mark.parametrize("name", ["os.system", "builtins.print", "subprocess.Popen",
                                  "sparkdist.torchtrain.network.build_module"])
def test_anything_but_an_nn_module_class_is_refused_as_model(name):
    with pytest.raises(ParamError, match=rf"model='{name}' is .*not an nn.Module subclass"):
        network.resolve_model(name)


def test_a_module_named_only_in_a_param_is_never_imported(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "planted_module_xyz.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nimport torch\n"
        "class Net(torch.nn.Module):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for resolve in (network.resolve_model, network.resolve_loss):
        with pytest.raises(ParamError, match="'planted_module_xyz.Net' cannot be imported .*"
                                             "import planted_module_xyz"):
            resolve("planted_module_xyz.Net")
    assert not marker.exists() and "planted_module_xyz" not in sys.modules


def per_row(output, label):
    return (output - label) ** 2


def test_losses_builtin_module_classes_and_functions_given_in_code():
    assert network.resolve_loss("bce") == "bce"
    assert isinstance(network.resolve_loss(network.to_name(torch.nn.L1Loss)), torch.nn.L1Loss)
    assert isinstance(network.resolve_loss(f"{__name__}.Net"), Net)
    name = network.to_name(per_row)
    assert network.resolve_loss(name) is per_row
    for refused in ("os.system", "torch.nn.functional.l1_loss"):
        with pytest.raises(ParamError, match=rf"loss='{refused}' is .*pass a function"):
            network.resolve_loss(refused)


def test_objects_that_are_neither_class_nor_function_are_refused_by_the_param():
    from sparkdist.models import TorchEstimator

    with pytest.raises(TypeError, match="expected a class, a function or its qualified name"):
        TorchEstimator(loss=torch.nn.L1Loss())


@pytest.mark.slow  # two interpreters import torch
def test_default_seed_is_the_same_in_every_process():
    probe = "from sparkdist.models import TorchEstimator; print(TorchEstimator().getSeed())"
    seeds = {subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                            text=True, env={**os.environ, "PYTHONHASHSEED": salt},
                            timeout=120).stdout.split()[-1] for salt in ("1", "2")}
    assert len(seeds) == 1, seeds
