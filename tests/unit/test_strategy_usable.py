"""The worker counts an elastic restart may take each strategy to."""

from __future__ import annotations

from sparkdist.torchtrain import strategies
from sparkdist.torchtrain.nets import MLP


def _spec(strategy: str, **extra):
    return {"strategy": strategy, "num_workers": 4, "module": MLP,
            "module_kwargs": {"hidden": [12, 6]}, "input_dim": 5, "output_dim": 1, **extra}


def test_ddp_and_fsdp_run_on_any_count():
    for name in ("ddp", "fsdp"):
        assert [strategies.usable(_spec(name))(world) for world in (1, 2, 3)] == [True] * 3


def test_pipeline_needs_a_multiple_of_its_stages():
    usable = strategies.usable(_spec("pipeline", pipeline_stages=2))
    assert [world for world in range(1, 7) if usable(world)] == [2, 4, 6]


def test_tensor_needs_a_count_that_divides_its_split_widths():
    usable = strategies.usable(_spec("tensor"))  # the pair 5 -> 12 -> 6 splits 12 columns
    assert [world for world in range(1, 7) if usable(world)] == [1, 2, 3, 4, 6]
