"""What each strategy declares (backends, gradient compression, local steps, the worker counts
an elastic restart may take it to), and the one check that reads the declarations; no Spark."""

from __future__ import annotations

import pytest

from sparkdist.exceptions import ParamError
from sparkdist.torchtrain import strategies
from sparkdist.torchtrain.compression import COMPRESSIONS
from tests.torchfits import train_spec


def test_every_strategy_module_implements_the_declared_interface():
    for name in strategies.STRATEGIES:
        module = strategies.strategy_module(name)
        assert isinstance(module, strategies.StrategyModule), name
        assert isinstance(module.SUPPORTS, strategies.Supports), name
        assert set(module.SUPPORTS.backends) <= {"torch", "horovod"}, name
        assert set(module.SUPPORTS.compressions) <= set(COMPRESSIONS), name
        assert issubclass(module.Strategy, strategies.base.WholeModel), name


def test_ddp_and_fsdp_run_on_any_count():
    for name in ("ddp", "fsdp"):
        assert [strategies.usable(train_spec(name))(world) for world in (1, 2, 3)] == [True] * 3


def test_pipeline_needs_a_multiple_of_its_stages():
    usable = strategies.usable(train_spec("pipeline", pipeline_stages=2))
    assert [world for world in range(1, 7) if usable(world)] == [2, 4, 6]


def test_tensor_needs_a_count_that_divides_its_split_widths():
    usable = strategies.usable(train_spec("tensor"))  # the pair 5 -> 12 -> 6 splits 12 columns
    assert [world for world in range(1, 7) if usable(world)] == [1, 2, 3, 4, 6]


def test_the_settings_every_strategy_and_backend_declare_pass():
    for name in strategies.STRATEGIES:
        strategies.check_compatible(train_spec(name))
    for kind in COMPRESSIONS:
        strategies.check_compatible(train_spec("ddp", gradient_compression=kind))
    strategies.check_compatible(train_spec("ddp", sync_every=4, max_staleness=2))


@pytest.mark.parametrize(("strategy", "changes", "match"), [
    ("fsdp", {"backend": "horovod"}, r"strategy='fsdp' with backend='horovod': FSDP shards "
                                     r".*Horovod does not provide; set backend='torch'\."),
    ("pipeline", {"backend": "horovod"}, r"strategy='pipeline' with backend='horovod'.*"
                                         r"set backend='torch'"),
    ("tensor", {"backend": "horovod"}, r"DTensor splits .*; set backend='torch'"),
    ("fsdp", {"sync_every": 2}, r"syncEvery=2 need\(s\) strategy='ddp'.*not strategy='fsdp'"),
    ("tensor", {"gradient_compression": "powersgd"},
     r"gradientCompression='powersgd' need\(s\) strategy='ddp'"),
    ("ddp", {"backend": "horovod", "gradient_compression": "bf16"},
     r"gradientCompression='bf16' has no Horovod equivalent.*backend='torch'"),
    ("ddp", {"backend": "horovod", "max_staleness": 3},
     r"maxStaleness=3 needs backend='torch'"),
    ("ddp", {"gradient_compression": "int4"}, r"gradientCompression"),
    ("ddp", {"backend": "mpi"}, r"backend"),
])
def test_the_one_compatibility_check_names_the_param_and_the_fix(strategy, changes, match):
    with pytest.raises(ParamError, match=match):
        strategies.check_compatible(train_spec(strategy, **changes))


def test_an_unknown_strategy_is_refused_by_name():
    with pytest.raises(ParamError, match="strategy"):
        strategies.check_compatible(train_spec("zero3"))
