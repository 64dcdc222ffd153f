"""bench/deep.py's pure parts: the timing protocol's order, targets, time to accuracy, the
bare feed's task and the memory figure."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa

from tests.benchscripts import load

deep = load("deep")


class _Capture:
    """Capture's interface without file descriptors."""

    calls: list = []

    def offset(self) -> int:
        return 0

    def text_since(self, offset: int) -> str:
        return ""


def test_alternate_warms_up_each_side_then_alternates(monkeypatch):
    monkeypatch.setattr(deep, "SETTLE_S", 0)
    monkeypatch.setattr(deep, "sync_counts", lambda text: {"spark": 0, "rank0_logged": 0})
    order: list[str] = []
    sides = {"a": lambda: order.append("a") or 1, "b": lambda: order.append("b") or 2}
    measured = deep.alternate(_Capture(), sides, 3, after={"b": lambda: order.append("re")})
    assert order == ["a", "b", "re"] + ["a", "b", "re"] * 3
    assert measured["a"].results == [1, 1, 1] and len(measured["b"].seconds) == 3
    order.clear()
    deep.alternate(_Capture(), sides, 2, warm_up=False)
    assert order == ["a", "b", "a", "b"]


def test_targets_and_figures():
    assert deep.verdict(0.8, ">= 0.8") and not deep.verdict(0.79, ">= 0.8")
    assert deep.verdict(1.2, "<= 1.2") and not deep.verdict(1.21, "<= 1.2")
    assert deep.verdict(None, "<= 1.2") is None
    result = deep.figure(0.12345, "<= 0.15", "what it is", extra=1)
    assert result == {"ratio": 0.123, "target": "<= 0.15", "meets_target": True, "extra": 1,
                      "definition": "what it is"}


def test_time_to_accuracy_adds_the_fixed_costs_to_the_epochs_up_to_the_threshold():
    history = [{"seconds": 2.0, "val_accuracy": 0.8}, {"seconds": 2.0, "val_accuracy": 0.93},
               {"seconds": 2.0, "val_accuracy": 0.96}, {"seconds": 2.0, "val_accuracy": 0.97}]
    model = SimpleNamespace(history=history)
    assert deep.time_to(model, 11.0, 0.95) == 3.0 + 6.0  # fixed 11 - 8, then 3 epochs
    assert deep.time_to(model, 11.0, 0.99) is None


def test_the_bare_feed_task_counts_rows_of_float32_matrices():
    features = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float32()))
    batch = pa.RecordBatch.from_arrays([features, pa.array([0.0, 1.0, 1.0], pa.float32())],
                                       ["features", "label"])
    empty = batch.slice(0, 0)
    (counted,) = deep.matrices_counted(iter([batch, empty, batch]))
    assert counted.column(0).to_pylist() == [6]


def test_peak_rss_is_the_max_over_ranks_and_none_without_ranks():
    def model(*peaks):
        ranks = [{"rank": i, "peak_rss_mb": p} for i, p in enumerate(peaks)]
        return SimpleNamespace(trainingSummary={"ranks": ranks} if peaks else {})

    assert deep.peak_rss([model(400.0, 420.0), model(410.0, 405.0)]) == 420.0
    assert deep.peak_rss([model(400.0), model()]) is None
