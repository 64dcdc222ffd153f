"""bench/communication.py's figures from fits' summaries (time to accuracy, bytes per step,
ratios against fp32, the best mode's verdict), and its --quick run end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.benchscripts import BENCH, load

communication = load("communication")


def _run(seconds, sent, accuracies, epoch_s=1.0, skipped=(0, 0)):
    history = [{"seconds": epoch_s, "val_accuracy": a} for a in accuracies]
    ranks = [{"rank": r, "allreduce_bytes": sent[r], "skipped_steps": skipped[r]}
             for r in range(2)]
    return {"seconds": seconds, "histories": [history] * len(seconds), "first_fit_s": 9.0,
            "summary": {"ranks": ranks, "steps_per_epoch": 10, "rows": 1000}}


def test_time_to_accuracy_is_the_fixed_costs_plus_the_epochs_up_to_the_threshold():
    history = [{"seconds": 2.0, "val_accuracy": 0.8}, {"seconds": 2.0, "val_accuracy": 0.96}]
    assert communication.time_to(history, 10.0, 0.95) == 6.0 + 4.0
    assert communication.time_to(history, 10.0, 0.97) is None


def test_figures_are_ratios_against_fp32_with_bytes_per_step_of_the_busiest_rank():
    runs = {"fp32": _run([4.0, 5.0, 6.0], [8000.0, 8000.0], [0.8, 0.9, 0.96, 0.97]),
            "fp16": _run([4.0, 4.0, 4.0], [4000.0, 4000.0], [0.8, 0.9, 0.96, 0.97]),
            "sync4": _run([2.0, 2.0, 2.0], [1500.0, 2000.0], [0.8, 0.96, 0.9, 0.95],
                          epoch_s=0.25)}
    sides = communication.figures(runs, epochs=4, threshold=0.95)
    assert sides["fp32"]["allreduce_bytes_per_step"] == 200.0  # 8000 / (10 steps x 4 epochs)
    assert sides["fp16"]["ratios"]["allreduce_bytes_per_step"] == 0.5
    assert sides["sync4"]["ratios"]["allreduce_bytes_per_step"] == 0.25
    assert sides["fp32"]["samples_per_s"] == 800.0  # 1000 rows x 4 epochs / 5 s (median)
    assert sides["fp16"]["ratios"]["samples_per_s"] == 1.25
    # fp32: (5 - 4) + 3 epochs = 4 s; sync4: (2 - 1) + 2 x 0.25 = 1.5 s
    assert sides["fp32"]["time_to_accuracy_s"] == 4.0
    assert sides["sync4"]["ratios"]["time_to_accuracy_s"] == 0.375
    assert sides["fp32"]["reached_at_epoch_runs"] == [3, 3, 3]
    assert sides["sync4"]["reached_at_epoch_runs"] == [2, 2, 2]
    assert sides["sync4"]["final_val_accuracy"] == 0.95
    assert sides["sync4"]["threshold"] == 0.95
    verdict = communication.best(sides)
    assert verdict == {"mode": "sync4", "ratio": 0.375, "target": "<= 0.7",
                       "meets_target": True, "threshold": 0.95,
                       "threshold_reached_by_fp32_at_epoch": 3}


def test_the_straggler_threshold_is_the_lowest_fp32_accuracy_after_its_third_epoch():
    runs = {"fp32": _run([4.0, 5.0], [8.0, 8.0], [0.8, 0.9, 0.95, 0.97])}
    runs["fp32"]["histories"][1] = [{"seconds": 1.0, "val_accuracy": a}
                                    for a in (0.8, 0.9, 0.94, 0.97)]
    assert communication.fp32_threshold(runs) == 0.94
    one_epoch = {"fp32": _run([4.0], [8.0, 8.0], [0.8])}
    assert communication.fp32_threshold(one_epoch) == 0.8


def test_no_verdict_when_fp32_reaches_the_threshold_before_its_third_epoch():
    runs = {"fp32": _run([4.0], [8.0, 8.0], [0.96, 0.97, 0.98]),
            "sync4": _run([2.0], [4.0, 4.0], [0.96, 0.97, 0.98])}
    verdict = communication.best(communication.figures(runs, epochs=3, threshold=0.95))
    assert verdict["threshold_reached_by_fp32_at_epoch"] == 1
    assert verdict["meets_target"] is None and verdict["mode"] is None
    assert "before its 3rd" in verdict["reason"]


def test_a_mode_that_never_reaches_the_threshold_has_no_time_and_no_verdict():
    runs = {"fp32": _run([4.0], [8.0, 8.0], [0.9, 0.9, 0.96]),
            "bf16": _run([4.0], [4.0, 4.0], [0.9, 0.9, 0.9])}
    sides = communication.figures(runs, epochs=3, threshold=0.95)
    assert sides["bf16"]["time_to_accuracy_s"] is None
    assert communication.best(sides)["mode"] is None


@pytest.mark.slow
def test_quick_run_prints_every_mode_with_and_without_the_straggler_on_both_models():
    done = subprocess.run([sys.executable, str(BENCH / "communication.py"), "--quick"],
                          capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
                               "GLOO_SOCKET_IFNAME": "lo"})
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["benchmark"] == "communication" and line["quick"] is True
    for sides in (line["per_mode"], line["straggler"]["per_mode"],
                  line["straggler_wide_model"]["per_mode"]):
        assert set(sides) == set(communication.MODES)
        assert sides["fp16"]["ratios"]["allreduce_bytes_per_step"] == 0.5
        assert all(side["samples_per_s"] > 0 for side in sides.values())
    for section in ("straggler", "straggler_wide_model"):  # 1 epoch: fp32 reaches it at 1
        verdict = line[section]["best"]
        assert verdict["threshold_reached_by_fp32_at_epoch"] == 1
        assert verdict["meets_target"] is None and verdict["reason"]
