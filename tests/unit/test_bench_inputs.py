"""bench/inputs.py: the bare reference reads the columns as the fit's feed holds them, and its
figures become the performance page's rows, each way round as the target says."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tests.benchscripts import load


def test_the_bare_scan_turns_every_batch_into_the_feeds_arrays_and_counts_rows():
    bench = load("inputs")
    batches = [pa.RecordBatch.from_pydict({
        "dense": pa.array([[1.0] * 13] * n, pa.list_(pa.float32())),
        "ids": pa.array([list(range(26))] * n, pa.list_(pa.int64())),
        "label": pa.array(np.ones(n, np.float32))}) for n in (3, 0, 5)]
    (counted,) = bench.arrays_counted(iter(batches))
    assert counted.column(0).to_pylist() == [8]


def test_the_inputs_figures_make_page_rows_with_their_targets():
    report = load("report")
    figures = {"feed": {"fit_rows_per_s": 80, "bare_rows_per_s": 100, "ratio": 0.8,
                        "target": ">= 0.8", "definition": "feed"},
               "click_auc": {"sparkdist_auc": 0.7, "single_process_auc": 0.701,
                             "difference": 0.001, "target": "<= 0.002", "definition": "auc"},
               "digits": {"accuracy": 0.985, "target": ">= 0.98", "definition": "digits"},
               "ratings": {"two_tower_rmse": 0.5, "als_rmse": 0.4, "ratio": 1.25,
                           "winner": "ALS", "definition": "ratings"},
               "sequence_memory": {"small_rows": 10, "large_rows": 40, "small_peak_mb": 100.0,
                                   "large_peak_mb": 110.0, "ratio": 1.1, "target": "<= 1.2",
                                   "definition": "memory"}}
    rows = report.table({"inputs": figures})
    assert [(r["ratio"], r["better"]) for r in rows] == [
        (0.8, "higher"), (0.001, "lower"), (0.985, "higher"), (1.25, "lower"), (1.1, "lower")]
    assert "ALS wins" in rows[3]["comparison"] and all(r["benchmark"] == "inputs" for r in rows)
