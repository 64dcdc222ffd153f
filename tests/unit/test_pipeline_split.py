"""strategy='pipeline' without Spark: how a model is cut into stages (parameter names kept,
balanced or at named children), the driver's preflight errors, and optimizer state keyed by
parameter name moving between splits."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from sparkdist.exceptions import ParamError  # noqa: E402
from sparkdist.torchtrain.nets import MLP  # noqa: E402
from sparkdist.torchtrain.strategies import pipeline, pipeline_split  # noqa: E402
from tests.torchfits import train_spec  # noqa: E402


def _spec(**changes):
    return train_spec("pipeline", **{"pipeline_stages": 2, "num_workers": 2,
                                     "micro_batches": 4, "input_dim": 6, **changes})


def _net(hidden=(16, 16, 16)):
    torch.manual_seed(0)
    return MLP(input_dim=6, output_dim=3, hidden=list(hidden), dropout=0.1)


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_stages_keep_the_models_names_and_chain_to_its_output(stages):
    net = _net()
    net.eval()
    plan = pipeline_split.split_plan(net, stages)
    parts = [pipeline_split.stage_module(net, plan, s) for s in range(stages)]
    keys = [list(part.state_dict()) for part in parts]
    assert sum(keys, []) == list(net.state_dict())  # disjoint, in the model's order
    x = torch.randn(5, 6)
    value = x
    for part in parts:
        value = part(value)
    assert torch.equal(value, net(x))
    assert all(p is q for p, q in zip(sum((list(part.parameters()) for part in parts), []),
                                      net.parameters()))  # the same tensors, not copies


def test_the_balanced_split_evens_out_parameters_and_keeps_activations_with_their_layer():
    plan = pipeline_split.split_plan(_net(), 2)
    # children: Linear(6,16) ReLU Dropout Linear(16,16) ReLU Dropout Linear(16,16) ReLU
    # Dropout Linear(16,3): 112 | 272 | 272 | 51 parameters
    assert plan.path == ("layers",)
    assert plan.groups == [["0", "1", "2", "3", "4", "5"], ["6", "7", "8", "9"]]
    assert pipeline_split._balanced_cuts([10, 0, 5, 5], 3) == [2, 3]
    assert pipeline_split._balanced_cuts([1, 1, 1, 1, 1, 1], 3) == [2, 4]


def test_split_points_name_children_with_or_without_the_path():
    assert pipeline_split.split_plan(_net(), 3, ["3", "layers.6"]).groups == [
        ["0", "1", "2"], ["3", "4", "5"], ["6", "7", "8", "9"]]


class TopLevel(nn.Module):
    """Children as attributes, run in order by forward: split at the top level."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder, self.act, self.head = nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.act(self.encoder(x)))


class Residual(TopLevel):
    def forward(self, x):
        hidden = self.act(self.encoder(x))
        return self.head(hidden + hidden.mean())


class Loose(TopLevel):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return super().forward(x) * self.scale


class Whole(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(6, 2))

    def forward(self, x):
        return x @ self.weight


def test_a_model_of_attributes_splits_at_its_top_level():
    net = TopLevel()
    plan = pipeline_split.split_plan(net, 2, ["head"])
    assert (plan.path, plan.groups) == ((), [["encoder", "act"], ["head"]])
    assert list(pipeline_split.stage_module(net, plan, 1).state_dict()) == ["head.weight",
                                                                           "head.bias"]
    pipeline.check(_spec(input_dim=6, pipeline_split_points=["head"]), net)


@pytest.mark.parametrize(("net", "spec", "match"), [
    (Residual(), {}, r"needs a model whose forward runs its top-level children in order; "
                     r"this model's output differs from running encoder, act, head"),
    (Loose(), {}, r"holds parameters or buffers outside its children \(scale\)"),
    (Whole(), {}, r"the model has no children to split into stages"),
    (MLP(6, 1, hidden=[]), {},
     r"pipelineStages=2: the model has only 1 child to split \(layers\)"),
    (TopLevel(), {"pipeline_stages": 4, "num_workers": 4},
     r"pipelineStages=4: .*only 3 children"),
    (TopLevel(), {"pipeline_split_points": ["decoder"]},
     r"pipelineSplitPoints: 'decoder' is not a child.*\['encoder', 'act', 'head'\]"),
    (TopLevel(), {"pipeline_split_points": ["encoder"]}, r"none of them the first"),
    (TopLevel(), {"pipeline_split_points": ["act", "head"]}, r"pipelineStages=2 needs 1"),
    (TopLevel(), {"pipeline_split_points": ["act", "head"], "pipeline_stages": 3,
                  "num_workers": 3}, r"pipelineStages=3: stage 1 would run only act"),
    (TopLevel(), {"num_workers": 3}, r"numWorkers=3 is not a multiple of pipelineStages=2"),
    (TopLevel(), {"pipeline_schedule": "1f1b", "micro_batches": 1},
     r"pipelineSchedule='1f1b' needs microBatches >= pipelineStages"),
])
def test_the_preflight_names_the_param_and_the_fix(net, spec, match):
    with pytest.raises(ParamError, match=match):
        pipeline.check(_spec(**spec), net)


def test_gpipe_takes_fewer_micro_batches_than_stages():
    pipeline.check(_spec(pipeline_schedule="gpipe", micro_batches=1), TopLevel())


def test_rows_per_round_are_whole_micro_batches_of_every_stages_batch():
    assert pipeline.rows_per_round(2, 64, 4) == 132
    assert pipeline.rows_per_round(3, 10, 4) == 36
    assert pipeline.rows_per_round(1, 1, 8) == 8


def _adam_after_a_step(net):
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    net(torch.randn(7, 6)).square().sum().backward()
    optimizer.step()
    return optimizer


def test_optimizer_state_by_name_moves_between_splits_and_from_ddp():
    """Two stages' optimizer states, merged by name, load into three stages (and a whole
    model's positional one too): each stage gets its parameters' moments and step."""
    net = _net()
    whole = _adam_after_a_step(net)
    two = pipeline_split.split_plan(net, 2)
    merged = {"state": {}, "param_groups": None}
    for stage in range(2):
        part = pipeline_split.stage_module(net, two, stage)
        optimizer = torch.optim.Adam(part.parameters(), lr=0.01)
        # this stage's slice of the whole model's state, as if it had trained itself
        named = pipeline.by_name(whole.state_dict(), [n for n, _ in net.named_parameters()])
        pipeline.load_named_optimizer_state(optimizer, part, named)
        saved = pipeline.named_optimizer_state(optimizer, part)
        merged["state"].update(saved["state"])
        merged["param_groups"] = saved["param_groups"]
    three = pipeline_split.split_plan(net, 3)
    for stage in range(3):
        part = pipeline_split.stage_module(net, three, stage)
        optimizer = torch.optim.Adam(part.parameters(), lr=0.01)
        pipeline.load_named_optimizer_state(optimizer, part, merged)
        for parameter in part.parameters():
            mine, reference = optimizer.state[parameter], whole.state[parameter]
            assert set(mine) == {"step", "exp_avg", "exp_avg_sq"}
            assert all(torch.equal(mine[key], reference[key]) for key in mine)
