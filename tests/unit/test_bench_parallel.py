"""bench/parallel.py's figures from fits' summaries: ratios against ddp, medians, errors."""

from __future__ import annotations

from tests.benchscripts import load

parallel = load("parallel")

SHAPE = {"epochs": 2}


def _run(seconds, state_mb, sent_mb, losses):
    ranks = [{"rank": r, "state_mb": state_mb[r], "sent_mb": sent_mb[r], "peak_rss_mb": 300.0}
             for r in range(2)]
    return {"seconds": seconds, "history": [{"loss": loss} for loss in losses],
            "summary": {"ranks": ranks, "rows": 1000, "steps_per_epoch": 5}}


def test_ratios_use_the_busiest_rank_and_the_median_time():
    runs = {"ddp": _run([2.0, 1.0, 3.0], [8.0, 8.0], [10.0, 10.0], [0.5, 0.4]),
            "fsdp": _run([4.0, 4.0, 1.0], [4.0, 4.4], [20.0, 19.0], [0.5, 0.41]),
            "pipeline": {"seconds": [], "error": "ParamError: no"},
            "tensor": _run([2.0, 2.0, 2.0], [3.0, 3.0], [5.0, 5.0], [0.5, 0.4])}
    result = parallel.figures(runs, SHAPE)
    ddp, fsdp = result["ddp"], result["fsdp"]
    assert ddp["samples_per_s"] == 1000.0 and fsdp["samples_per_s"] == 500.0
    assert fsdp["state_ratio"] == 0.55 and fsdp["state_target_met"]
    assert fsdp["throughput_ratio"] == 0.5 and fsdp["sent_ratio"] == 2.0
    assert ddp["sent_mb_per_step"] == 1.0
    assert result["pipeline"] == {"error": "ParamError: no"}
    assert result["tensor"]["state_ratio"] == 0.375
    assert abs(result["loss_curve_max_rel_diff"] - 0.025) < 1e-12


def test_a_state_above_the_target_is_reported_as_missed():
    runs = {name: _run([1.0], [8.0, 8.0], [1.0, 1.0], [0.5]) for name in parallel.STRATEGIES}
    result = parallel.figures(runs, SHAPE)
    assert result["tensor"]["state_ratio"] == 1.0 and not result["tensor"]["state_target_met"]
