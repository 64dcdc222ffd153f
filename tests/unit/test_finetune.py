"""The fine-tuning pieces without Spark: name patterns, the state hash, loading and freezing."""

from __future__ import annotations

import io

import pytest
import torch

from sparkdist.exceptions import ParamError
from sparkdist.torchtrain import finetune
from sparkdist.torchtrain.nets import MLP
from sparkdist.torchtrain.spec import FineTuneSpec


@pytest.mark.parametrize(("name", "pattern", "found"), [
    ("layers.0.weight", "layers.0", True),
    ("layers.0.weight", "layers.0.weight", True),
    ("layers.10.weight", "layers.1", False),
    ("encoder.block.2.bias", "encoder.*", True),
    ("top.bias", "*.bias", True),
    ("top.weight", "*.bias", False),
])
def test_a_pattern_names_a_parameter_or_a_module_holding_it(name, pattern, found):
    assert finetune.matches(name, pattern) is found


def _saved(module) -> bytes:
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    return buffer.getvalue()


def test_the_state_hash_follows_values_not_file_bytes():
    torch.manual_seed(0)
    net = MLP(input_dim=3, output_dim=1, hidden=[4])
    state = net.state_dict()
    same = {k: v.clone() for k, v in state.items()}
    assert finetune.state_sha256(state) == finetune.state_sha256(same)
    same["layers.0.bias"][0] += 1e-6
    assert finetune.state_sha256(state) != finetune.state_sha256(same)


def test_prepare_loads_the_weights_and_freezes_only_what_the_patterns_name():
    torch.manual_seed(0)
    trained = MLP(input_dim=3, output_dim=1, hidden=[4, 4])
    torch.manual_seed(1)
    fresh = MLP(input_dim=3, output_dim=1, hidden=[4, 4])
    finetune.prepare(fresh, FineTuneSpec(base=_saved(trained), source="w.pt",
                                         freeze=("layers.0",)))
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(),
                                                 trained.state_dict().values()))
    assert [n for n, p in fresh.named_parameters() if not p.requires_grad] == [
        "layers.0.weight", "layers.0.bias"]


def test_a_state_of_tensors_only_and_no_object():
    with pytest.raises(ParamError, match="holds list, not a state dict"):
        finetune.state_of(_list_bytes(), "w.pt")
    with pytest.raises(ParamError, match="not a torch state dict that loads with "
                                         "weights_only=True"):
        finetune.state_of(b"not a torch file", "w.pt")


def _list_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save([torch.zeros(1)], buffer)
    return buffer.getvalue()


def test_adapters_go_on_the_named_layers_only_and_merge_back_to_the_plain_network():
    torch.manual_seed(0)
    net = MLP(input_dim=3, output_dim=2, hidden=[8])
    spec = FineTuneSpec(adapter="lora", adapter_rank=2, adapter_alpha=4,
                        adapter_targets=("layers.0",))
    assert finetune.adapter_targets(net, ("layers.*",)) == ["layers.0", "layers.2"]
    with pytest.raises(ParamError, match="'layers.1' matches no Linear"):  # a ReLU
        finetune.adapter_targets(net, ("layers.1",))
    finetune.add_adapters(net, spec)
    trainable = [n for n, p in net.named_parameters() if p.requires_grad]
    assert trainable and all(finetune.is_adapter(n) and n.startswith("layers.0.")
                             for n in trainable)
    with torch.no_grad():  # a trained adapter: B no longer 0
        for name, parameter in net.named_parameters():
            if "lora_B" in name:
                parameter.normal_()
    x = torch.randn(5, 3)
    adapted = net(x)
    plain = finetune.merged(net)
    assert list(plain.state_dict()) == ["layers.0.weight", "layers.0.bias", "layers.2.weight",
                                        "layers.2.bias"]
    torch.testing.assert_close(plain(x), adapted, atol=1e-5, rtol=0)


def test_a_checkpoint_keeps_what_trains_and_its_load_refuses_a_missing_part():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2),
                              torch.nn.Linear(2, 1))
    finetune.prepare(net, FineTuneSpec(freeze=("0",)))
    kept = finetune.trained(net, net.state_dict())
    assert not any(name.startswith("0.") for name in kept)  # frozen: from initialWeights
    assert "1.running_mean" in kept and "2.weight" in kept  # buffers and what trains stay
    finetune.load_trained(net, kept)
    with pytest.raises(ParamError, match=r"does not fit this network .*2.weight"):
        finetune.load_trained(net, {k: v for k, v in kept.items() if k != "2.weight"})
