"""bench/keras_estimator.py's figures become the performance page's rows, each way round as
the target says."""

from __future__ import annotations

from tests.benchscripts import load


def test_the_keras_figures_make_page_rows_with_their_targets():
    report = load("report")
    speed = {"keras_samples_per_s": 400, "torch_samples_per_s": 800, "ratio": 0.5}
    figures = {
        "digits": {"keras_accuracy": 0.975, "torch_accuracy": 0.98, "target": ">= 0.97",
                   "definition": "test accuracy"},
        "speed": {"warm": speed, "cold": speed},
        "against_keras_fit": {"sgd": {"max_abs_difference": 4e-9, "target": "<= 1e-6"},
                              "adam": {"max_abs_difference": 3e-3, "target": "<= 1e-6"}}}
    rows = report.table({"keras_estimator": figures})
    assert [(r["ratio"], r["better"]) for r in rows] == [
        (0.975, "higher"), (0.5, "higher"), (0.5, "higher"), (4e-9, "lower"), (3e-3, "lower")]
    assert [report.met(r) for r in rows] == [True, None, None, True, False]
