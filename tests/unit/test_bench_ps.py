"""bench/ps.py without Spark: its ids stay in range with a hot head, MLlib's sparse vectors
count a repeated id, and its figures become the performance page's rows with their targets."""

from __future__ import annotations

import numpy as np

from tests.benchscripts import load


def test_hashed_ids_are_in_range_with_a_few_hot_ids():
    bench = load("ps")
    ids = bench.hashed_ids(np.random.default_rng(0), 20_000, 2, 2**17)
    assert ids.shape == (20_000, 2) and ids.min() >= 0 and ids.max() < 2**17
    _, counts = np.unique(ids[:, 0], return_counts=True)
    assert counts.max() > 1000 and len(counts) > 2000  # a hot head and a long tail
    assert not np.array_equal(ids[:, 0], ids[:, 1])  # the features scatter differently


def test_the_mllib_side_counts_a_repeated_id():
    vector = load("ps")._sparse_vector([5, 3, 5])
    assert vector.size == 2**20 and list(vector.indices) == [3, 5]
    assert list(vector.values) == [1.0, 2.0]


def test_ps_figures_become_rows_with_their_targets():
    report = load("report")
    side = {"sent_mb_per_step": 0.5, "samples_per_s_later": 9000.0, "samples_per_s_first": 4000.0,
            "test_auc": 0.781}
    figures = {"click": {"model": {"tables": [2**17] * 8, "dim": 16}, "definition": "d",
                         "ps": side, "ddp": {**side, "sent_mb_per_step": 64.0,
                                             "samples_per_s_later": 3000.0,
                                             "samples_per_s_first": 2500.0, "test_auc": 0.7805},
                         "bytes_ratio": 128.0, "bytes_target": ">= 10",
                         "throughput_ratio_later": 3.0, "throughput_ratio_first": 1.6,
                         "throughput_target": ">= 2", "auc_difference": 0.0005,
                         "auc_target": "<= 0.002"},
               "sparse_lr": {"rows": 96_000, "ids_per_row": 16, "features": 2**20,
                             "definition": "d",
                             "sparkdist": {"first_s": 12.0, "later_s": 8.0, "test_log_loss": 0.55},
                             "mllib": {"first_s": 30.0, "later_s": 20.0, "test_log_loss": 0.5},
                             "time_ratio_later": 0.4, "time_ratio_first": 0.4}}
    assert len(report.table({"ps": figures})) == 7  # results from before async was measured
    figures["async_vs_sync"] = [{
        "learning_rate": 0.05, "staleness": 4, "slowed": {"rank": 1, "factor": 2.0},
        "per_epochs": {"sync": {"1": {"test_auc": 0.722}}, "async": {"1": {"test_auc": 0.71}}},
        "target_auc": 0.72, "sync_epochs": 1, "async_epochs": None, "sync_s": 10.0,
        "async_s": None, "time_ratio": None, "target": "<= 1", "definition": "d"}]
    rows = report.table({"ps": figures})
    assert "async: not within 4 epochs" in rows[4]["comparison"] and not report.met(rows[4])
    assert "sync's best 0.722 - 0.002; async's best 0.71" in rows[4]["comparison"]
    assert rows[4]["ratio"] == rows[4]["sparkdist"] == "not reached"
    assert "| not reached | 10.0 s | not reached | <= 1 | **missed** |" in report.markdown(
        [{**rows[4], "met": report.met(rows[4]), "stale": None, "noisy": None, "commit": "c",
          "date": "d", "load": "l"}])
    del rows[4]
    assert [row["target"] for row in rows] == [">= 10", ">= 2", ">= 2", "<= 0.002", "-", "-",
                                               "-"]
    assert "1,048,576 rows x 16" in rows[0]["comparison"]
    assert [report.met(row) for row in rows[:4]] == [True, False, True, True]
    assert rows[-1]["ratio"] == 1.1 and rows[-1]["better"] == "lower"
