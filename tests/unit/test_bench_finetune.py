"""bench/finetune.py's figures become the performance page's rows, each way round as the target
says; its trainable share counts the adapters only."""

from __future__ import annotations

from tests.benchscripts import load


def test_the_finetune_figures_make_page_rows_with_their_targets():
    report = load("report")
    speed = {"lora_samples_per_s": 900, "full_samples_per_s": 600, "ratio": 1.5}
    figures = {
        "trainable": {"adapter_params": 10, "model_params": 1000, "share": 0.01,
                      "target": "<= 0.02"},
        "optimizer": {"lora": 0.2, "full": 20.0, "ratio": 0.01, "target": "<= 0.05",
                      "what": "MiB of optimizer state"},
        "allreduce": {"lora": 1.0, "full": 100.0, "ratio": 0.01, "target": "<= 0.05",
                      "what": "bytes all-reduced per step"},
        "loss": {"before": 8.0, "after": 1.0, "ratio": 0.125, "target": "<= 0.5"},
        "speed": {"warm": speed, "cold": speed},
        "merged": {"max_abs_difference": 3e-6, "target": "<= 1e-5"},
        "setup": {"rows": 100, "epochs": 2}}
    rows = report.table({"finetune": figures})
    assert [(r["ratio"], r["better"]) for r in rows] == [
        (0.01, "lower"), (0.01, "lower"), (0.01, "lower"), (0.125, "lower"), (1.5, "higher"),
        (1.5, "higher"), (3e-6, "lower")]
    assert [r["unit"] for r in rows][-1] == "difference"
    assert report.met(rows[-1]) is True  # a target in scientific notation is judged too
    assert report.met({**rows[-1], "ratio": 1.2e-5}) is False


def test_trainable_share_counts_the_adapters_only():
    import torch

    from sparkdist.torchtrain import finetune, nets
    from sparkdist.torchtrain.spec import FineTuneSpec

    bench = load("finetune")
    net = nets.CausalLM(vocab=8, dim=8, layers=1, heads=2, max_length=4)
    finetune.add_adapters(net, FineTuneSpec(adapter="lora", adapter_rank=2,
                                            adapter_targets=("blocks.*.q",)))

    class Fitted:
        def module(self) -> torch.nn.Module:
            return net

    adapters, total = bench.trainable_share(Fitted())
    assert adapters == 2 * (8 * 2) and total == sum(p.numel() for p in net.parameters())
