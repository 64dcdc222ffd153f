"""sparkdist.launch.gpus without Spark or GPUs: the device plan for every case, and apply()
on this CPU-only torch (the CUDA call is skipped, the environment is still set)."""

from __future__ import annotations

import os

import pytest

from sparkdist.exceptions import TrainingError
from sparkdist.launch import gpus
from sparkdist.launch.gpus import device_plan


@pytest.mark.parametrize("address, count, device", [("0", 1, "cuda:0"), ("1", 2, "cuda:1"),
                                                     ("3", 8, "cuda:3")])
def test_the_assigned_gpu_is_the_device(address, count, device):
    for use_gpu in (True, "auto"):
        plan = device_plan([address], use_gpu, cuda_available=True, cuda_count=count)
        assert plan.device == device and plan.index == int(address) and plan.is_cuda
        assert plan.addresses == (address,)
        assert plan.cuda_visible_devices == address and plan.child_device == "cuda:0"
        assert plan.backend == "nccl" and f"GPU {address}" in plan.reason


def test_several_gpus_per_task_the_first_is_the_device_children_see_all():
    plan = device_plan(["2", "3"], True, True, 4)
    assert plan.device == "cuda:2" and plan.cuda_visible_devices == "2,3"
    assert plan.child_device == "cuda:0"


@pytest.mark.parametrize("visible, address, device", [
    ("2,3", "3", "cuda:1"),  # the executor inherited a restricted list: index in that list
    ("2,3", "2", "cuda:0"),
    ("GPU-aa,GPU-bb", "GPU-bb", "cuda:1"),  # UUIDs work when they are listed
    (" 5 , 7 ", "7", "cuda:1"),
])
def test_inherited_visible_devices_remap_the_index(visible, address, device):
    plan = device_plan([address], True, True, 2, visible_devices=visible)
    assert plan.device == device and plan.cuda_visible_devices == address


def test_an_empty_visible_list_means_unrestricted():
    assert device_plan(["1"], True, True, 2, visible_devices="").device == "cuda:1"


def test_use_gpu_false_is_the_cpu_even_with_a_gpu():
    plan = device_plan(["0"], False, True, 1)
    assert plan.device == "cpu" and plan.index is None and not plan.is_cuda
    assert plan.cuda_visible_devices is None and plan.child_device is None
    assert plan.backend == "gloo" and plan.addresses == ("0",)


@pytest.mark.parametrize("addresses, available, count, why", [
    ([], True, 2, "no GPU"),  # no task GPU amount configured
    ([], False, 0, "no GPU"),
    (["0"], False, 0, "no CUDA device"),  # CPU-only torch
    (["0"], True, 0, "no CUDA device"),
    (["2"], True, 2, "beyond the 2 CUDA device(s)"),
    (["GPU-aa"], True, 2, "neither a CUDA index"),
])
def test_auto_falls_back_to_the_cpu_and_says_why(addresses, available, count, why):
    plan = device_plan(addresses, "auto", available, count)
    assert plan.device == "cpu" and plan.backend == "gloo"
    assert plan.cuda_visible_devices is None
    assert why in plan.reason and "useGpu='auto'" in plan.reason


@pytest.mark.parametrize("addresses, available, count, why", [
    ([], True, 2, "Spark assigned no GPU"),
    (["0"], False, 0, "torch sees no CUDA device"),
    (["2"], True, 2, "beyond the 2 CUDA device(s)"),
])
def test_use_gpu_true_without_a_usable_gpu_names_the_conf(addresses, available, count, why):
    with pytest.raises(TrainingError, match="spark.task.resource.gpu.amount") as caught:
        device_plan(addresses, True, available, count)
    assert why in str(caught.value) and "useGpu=True" in str(caught.value)


def test_an_address_outside_the_inherited_list_is_an_error():
    with pytest.raises(TrainingError, match=r"CUDA_VISIBLE_DEVICES=2,3"):
        device_plan(["0"], True, True, 2, visible_devices="2,3")


@pytest.mark.parametrize("value, device", [("true", "cuda:0"), ("AUTO", "cuda:0"),
                                           ("False", "cpu")])
def test_use_gpu_strings_as_the_param_converter_leaves_them(value, device):
    assert device_plan(["0"], value, True, 1).device == device


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_use_gpu_other_values_are_refused(value):
    with pytest.raises(TrainingError, match=r"not one of \[True, False, 'auto'\]"):
        device_plan(["0"], value, True, 1)


def test_task_gpus_outside_a_task_is_empty():
    assert gpus.task_gpus() == []


@pytest.fixture
def clean_env(monkeypatch):
    """Neither variable set, and both restored afterwards, also when apply() sets them (a
    plain delenv of an absent name records nothing to undo, and the values would leak into
    later tests and the Spark processes they start)."""
    for name in (gpus.CUDA_VISIBLE_DEVICES, gpus.INHERITED_ENV):
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    return monkeypatch


def test_apply_a_cpu_plan_leaves_the_environment_alone(clean_env):
    torch = pytest.importorskip("torch")
    assert gpus.apply(device_plan(["0"], "auto", False, 0)) == torch.device("cpu")
    assert gpus.CUDA_VISIBLE_DEVICES not in os.environ


def test_apply_exports_for_children_and_remembers_the_inherited_list(clean_env):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only path (the CUDA call skipped)")
    clean_env.setenv(gpus.CUDA_VISIBLE_DEVICES, "2,3")
    first = device_plan(["3"], True, True, 2, visible_devices=gpus.inherited_visible_devices())
    assert gpus.apply(first) == torch.device("cuda", 1)
    assert os.environ[gpus.CUDA_VISIBLE_DEVICES] == "3"  # children see only the task's GPU
    # The next task in this (reused) worker still plans against the inherited list.
    assert gpus.inherited_visible_devices() == "2,3"
    second = device_plan(["2"], True, True, 2, visible_devices=gpus.inherited_visible_devices())
    assert gpus.apply(second) == torch.device("cuda", 0)
    assert os.environ[gpus.CUDA_VISIBLE_DEVICES] == "2"
    assert os.environ[gpus.INHERITED_ENV] == "2,3"


def test_apply_remembers_an_unset_inherited_list(clean_env):
    pytest.importorskip("torch")
    gpus.apply(device_plan(["1"], True, True, 2))
    assert gpus.inherited_visible_devices() is None
    assert device_plan(["0"], True, True, 2,
                       visible_devices=gpus.inherited_visible_devices()).device == "cuda:0"


def test_the_apply_tests_leave_nothing_behind():
    """What apply() sets would reach the Spark processes later tests start (it did)."""
    assert gpus.INHERITED_ENV not in os.environ


def test_plan_for_task_on_this_machine(clean_env):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    assert gpus.plan_for_task("auto", ["0"]).device == "cpu"
    with pytest.raises(TrainingError, match="spark.task.resource.gpu.amount"):
        gpus.plan_for_task(True, ["0"])
