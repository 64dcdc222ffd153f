"""bench/tuning.py: its figures from known inputs (the search's ratio and accuracy gap, the
queueing studies, the pruned trials' pruneSeconds) become the performance page's rows with
their targets, a study that hangs is waited on only for its timeout, a full run without the
pruneSeconds column is an error (no Spark); and its --quick mode end to end (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchscripts import load

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "tuning.py"


def load_bench() -> ModuleType:
    return load("tuning")


def _run(ref_s, ours_s, ref_val, ours_val, ref_test=0.95, ours_test=0.94):
    return {"reference": {"seconds": ref_s, "validation": ref_val, "test": ref_test},
            "sparkdist": {"seconds": ours_s, "validation": ours_val, "test": ours_test}}


def test_the_defaults_search_24_configurations_with_fewer_trials():
    bench = load_bench()
    args, full = bench.arguments([])
    points = bench.grid_points(full.space)
    assert len(points) == 24 and full.trials == 12 < len(points)
    assert (full.epochs, full.repeats, full.studies, full.study_trials) == (8, 2, 20, 3)
    assert not full.quick and not args.save
    assert points[0] == {"learningRate": 3e-4, "batchSize": 16, "weightDecay": 0.0}
    assert len({json.dumps(p, sort_keys=True) for p in points}) == 24
    _, quick = bench.arguments(["--quick"])
    assert quick.quick and len(bench.grid_points(quick.space)) < 24 and quick.studies == 2
    assert quick.epochs == 1 and quick.prune_epochs < full.prune_epochs


def test_the_search_ratio_is_our_seconds_over_the_reference_and_the_gap_in_points():
    bench = load_bench()
    _, sizes = bench.arguments([])
    runs = [_run(40.0, 24.0, 0.97, 0.96), _run(30.0, 12.0, 0.97, 0.968),
            _run(32.0, 14.0, 0.97, 0.972)]
    figures = bench.search_figures(runs, sizes, {"searched": 1437, "test": 360,
                                                 "validation": 290})
    cold, warm = figures["cold"], figures["warm"]
    assert (cold["reference_s"], cold["sparkdist_s"], cold["ratio"]) == (40.0, 24.0, 0.6)
    assert not cold["meets_target"] and cold["accuracy_gap_points"] == 1.0
    assert not cold["meets_accuracy_target"] and cold["test_gap_points"] == 1.0
    assert (warm["reference_s"], warm["sparkdist_s"], warm["ratio"]) == (31.0, 13.0, 0.419)
    assert warm["meets_target"] and warm["runs"] == 2
    assert warm["sparkdist_best_validation_accuracy"] == 0.97  # the median of the two
    assert warm["accuracy_gap_points"] == 0.0 and warm["meets_accuracy_target"]
    assert (figures["configurations"], figures["trials"]) == (24, 12)
    assert figures["target"] == "<= 0.5" and figures["accuracy_target"] == "<= 0.5"
    assert "TrainValidationSplit" in figures["definition"]
    alone = bench.search_figures(runs[:1], sizes, {})
    assert alone["warm"] is None and alone["cold"] == cold
    better = bench.search_kind([_run(10.0, 5.0, 0.95, 0.96)])
    assert better["accuracy_gap_points"] == -1.0 and better["meets_accuracy_target"]
    assert better["meets_target"]  # 0.5 meets <= 0.5


def test_queueing_counts_finished_hung_failed_and_not_run_studies():
    bench = load_bench()
    _, sizes = bench.arguments([])
    outcomes = [{"state": "finished", "seconds": 4.0, "trials": {"COMPLETE": 3}, "error": None},
                {"state": "finished", "seconds": 6.0, "trials": {"COMPLETE": 2, "FAIL": 1},
                 "error": None},
                {"state": "failed", "seconds": 1.0, "trials": None, "error": "TrainingError: x"},
                {"state": "hung", "seconds": 120.0, "trials": None, "error": None}]
    figures = bench.queueing_figures(outcomes, 5, sizes)
    assert (figures["finished"], figures["failed"], figures["hung"], figures["not_run"]) == (
        2, 1, 1, 1)
    assert figures["trials"] == {"COMPLETE": 5, "FAIL": 1}
    assert figures["finished_share"] == 0.4 and not figures["meets_target"]
    assert (figures["median_study_s"], figures["max_study_s"]) == (5.0, 6.0)
    assert figures["errors"] == ["TrainingError: x"]
    every = bench.queueing_figures(outcomes[:1] * 3, 3, sizes)
    assert every["meets_target"] and every["finished_share"] == 1.0


def test_a_study_is_waited_on_for_its_timeout_only():
    bench = load_bench()
    assert bench.within(lambda: 7, 5)[:2] == ("finished", 7)
    state, error, _ = bench.within(lambda: 1 / 0, 5)
    assert state == "failed" and error.startswith("ZeroDivisionError")
    release = threading.Event()
    state, result, seconds = bench.within(lambda: release.wait(30), 0.2)
    release.set()
    assert (state, result) == ("hung", None) and seconds < 5


def test_a_full_run_without_prune_seconds_is_an_error_and_a_quick_one_reports_null():
    bench = load_bench()
    columns = ["number", "params", "metric", "state", "seconds", "error"]
    assert bench.prune_column([*columns, "pruneSeconds"], quick=False)
    assert not bench.prune_column(columns, quick=True)
    with pytest.raises(RuntimeError, match="no pruneSeconds column"):
        bench.prune_column(columns, quick=False)


def _trial(number, state, seconds, prune=None, epochs=None):
    return {"number": number, "state": state, "seconds": seconds, "pruneSeconds": prune,
            "epochs": epochs}


def test_pruning_figures_are_the_pruned_trials_prune_seconds_and_epochs():
    bench = load_bench()
    _, sizes = bench.arguments([])
    rows = [_trial(0, "COMPLETE", 24.0, None, 24), _trial(1, "COMPLETE", 26.0, None, 24),
            _trial(2, "PRUNED", 4.0, 1.5, 2), _trial(3, "PRUNED", 5.0, 6.5, 2),
            _trial(4, "PRUNED", 6.0, 2.5, 5),
            _trial(5, "PRUNED", 25.0, None, 24),  # pruned after its fit
            _trial(6, "FAIL", None)]
    figures = bench.pruning_figures(rows, 24, True, 60.0, sizes)
    assert (figures["pruned"], figures["pruned_during_fit"]) == (4, 3)
    assert figures["prune_s"] == [1.5, 2.5, 6.5]
    assert (figures["median_prune_s"], figures["max_prune_s"]) == (2.5, 6.5)
    assert figures["meets_target"] and figures["ratio_to_target"] == 0.5
    assert figures["pruned_epochs_reported"] == [2, 2, 5, 24]
    assert figures["median_pruned_epochs"] == 3.5 and figures["epochs_budget"] == 24
    assert figures["states"] == {"COMPLETE": 2, "FAIL": 1, "PRUNED": 4}
    assert figures["median_trial_s"] == {"COMPLETE": 25.0, "PRUNED": 5.5}
    slow = bench.pruning_figures([_trial(0, "PRUNED", 9.0, 7.0, 3)], 24, True, 9.0, sizes)
    assert not slow["meets_target"] and slow["ratio_to_target"] == 1.4
    missing = bench.pruning_figures(rows, 24, False, 60.0, sizes)
    assert missing["prune_s"] is None and missing["median_prune_s"] is None
    assert missing["meets_target"] is None and "no pruneSeconds" in missing["note"]


def test_the_tuning_figures_make_page_rows_with_their_targets():
    bench, report = load_bench(), load("report")
    _, sizes = bench.arguments([])
    runs = [_run(40.0, 24.0, 0.97, 0.96), _run(30.0, 12.0, 0.97, 0.968)]
    done = {"state": "finished", "seconds": 4.0, "trials": {"COMPLETE": 3}, "error": None}
    figures = {"search": bench.search_figures(runs, sizes, {}),
               "queueing": bench.queueing_figures([done] * 20, 20, sizes),
               "pruning": bench.pruning_figures(
                   [_trial(0, "COMPLETE", 24.0, None, 24), _trial(1, "PRUNED", 4.0, 3.0, 2)],
                   24, True, 30.0, sizes)}
    rows = report.table({"tuning": figures})
    assert [(r["ratio"], r["better"], r["unit"]) for r in rows] == [
        (0.6, "lower", "s"), (0.4, "lower", "s"), (1.0, "lower", "accuracy"),
        (0.2, "lower", "accuracy"), (1.0, "higher", "studies"), (0.6, "lower", "s")]
    assert [report.met(r) for r in rows] == [False, True, False, True, True, True]
    assert "all 24 configurations" in rows[0]["comparison"]
    assert "test accuracy 0.94 vs 0.95" in rows[2]["comparison"]
    assert "60 COMPLETE" in rows[4]["comparison"]
    assert "median 2 of 24 epochs" in rows[5]["comparison"]
    # no trial pruned during its fit: no pruning row (the result keeps the counts)
    figures["pruning"] = bench.pruning_figures([_trial(0, "COMPLETE", 24.0)], 24, True, 24.0,
                                               sizes)
    assert len(report.table({"tuning": figures})) == 5


@pytest.mark.slow
def test_quick_mode_runs_every_part(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True,
                          text=True, timeout=900, cwd=tmp_path,
                          env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
                               "GLOO_SOCKET_IFNAME": "lo"})
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["benchmark"] == "tuning" and line["quick"] is True
    for kind in ("cold", "warm"):
        side = line["search"][kind]
        assert side["reference_s"] > 0 and side["sparkdist_s"] > 0
        assert 0 < side["sparkdist_best_validation_accuracy"] <= 1
    assert line["queueing"]["finished"] == line["queueing"]["studies"] == 2
    assert line["pruning"]["trials"] == 5 and line["pruning"]["epochs_budget"] == 4
    assert line["pruning"]["pruned_during_fit"] is not None  # the pruneSeconds column exists
