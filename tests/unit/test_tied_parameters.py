"""A Parameter two modules share (weight tying) stays one tensor under every strategy, or the
driver's preflight refuses it naming both modules (round 3, N1); no Spark. The 2-worker ddp
fit that keeps the tie is tests/spark/test_tied_parameters.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from sparkdist.exceptions import ParamError  # noqa: E402
from sparkdist.torchtrain import strategies  # noqa: E402
from sparkdist.torchtrain.nets import MLP  # noqa: E402
from sparkdist.torchtrain.strategies import pipeline_split  # noqa: E402
from tests.torchfits import train_spec  # noqa: E402

BOTH = r"'layers\.0' and 'layers\.2' share one Parameter \(layers\.0\.weight is layers\.2\.weight"


class Tied(nn.Module):
    """N1's network: the second Linear's weight is the first one's."""

    def __init__(self, input_dim: int = 4, output_dim: int = 1) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(input_dim, input_dim), nn.ReLU(),
                                    nn.Linear(input_dim, input_dim), nn.ReLU(),
                                    nn.Linear(input_dim, output_dim))
        self.layers[2].weight = self.layers[0].weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _spec(strategy: str, **changes):
    return train_spec(strategy, **{"pipeline_stages": 2, "num_workers": 2, "micro_batches": 4,
                                   "input_dim": 4, **changes})


def test_shared_parameters_names_every_tie_and_nothing_else():
    assert strategies.shared_parameters(Tied()) == [["layers.0.weight", "layers.2.weight"]]
    assert strategies.shared_parameters(MLP(4, 1, hidden=[8, 8])) == []


def test_ddp_accepts_the_tie_and_keeps_one_parameter():
    net = Tied()
    strategies.check(_spec("ddp"), net)
    assert net.layers[0].weight is net.layers[2].weight


@pytest.mark.parametrize(("strategy", "spec", "fix"), [
    ("tensor", {}, r"use strategy='ddp'.*or untie the modules"),
    ("fsdp", {}, r"units 'layers\.0' and 'layers\.2'.*use strategy='ddp'.*fsdpWrap naming"),
    ("pipeline", {"pipeline_split_points": ("layers.2",)},
     r"pipelineSplitPoints=\['layers\.2'\] cuts between them.*use strategy='ddp'"),
    ("pipeline", {"pipeline_stages": 4, "num_workers": 4},
     r"no split into pipelineStages=4 stages keeps them in one stage.*fewer pipelineStages"),
])
def test_a_strategy_that_would_train_two_copies_refuses_naming_both_modules(strategy, spec,
                                                                            fix):
    with pytest.raises(ParamError, match=f"strategy='{strategy}': {BOTH}.*{fix}"):
        strategies.check(_spec(strategy, **spec), Tied())


def test_fsdp_accepts_a_tie_inside_one_unit():
    """fsdpWrap=['Sequential'] makes ``layers`` one unit: FSDP2 shards the Parameter once."""
    strategies.check(_spec("fsdp", fsdp_wrap=("Sequential",)), Tied())


def test_pipeline_keeps_tied_layers_in_one_stage_holding_one_parameter():
    net = Tied()
    strategies.check(_spec("pipeline"), net)  # the balanced split alone would cut at 2
    plan = pipeline_split.split_plan(net, 2)
    assert plan.groups == [["0", "1", "2", "3"], ["4"]]
    stage = pipeline_split.stage_module(net, plan, 0)
    assert stage.layers[0].weight is stage.layers[2].weight
    assert len(list(stage.parameters())) == 3  # one tied weight, two biases
    assert pipeline_split._balanced_cuts([20, 0, 20, 0, 5], 2) == [2]  # untied: between


def test_pipeline_named_split_points_that_keep_the_tie_are_accepted():
    plan = pipeline_split.split_plan(Tied(), 2, ["layers.4"])
    assert plan.groups == [["0", "1", "2", "3"], ["4"]]
