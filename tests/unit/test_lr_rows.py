"""What a LogisticRegression rank keeps for the next fit of the same rows (no Spark)."""

from __future__ import annotations

import numpy as np

from sparkdist.models import _lr_rows


def prepared(rows: int = 4) -> _lr_rows.Prepared:
    return _lr_rows.Prepared(x=np.ones((rows, 2)), y=np.zeros(rows), w=np.ones(rows),
                             max_label=1, weight_sum=float(rows), hist=np.ones(2),
                             mean=np.zeros(2), std=np.ones(2), inverse=np.ones(2))


def test_a_worker_holds_one_key_and_drops_it(monkeypatch):
    monkeypatch.delenv("PYSPARK_EXECUTOR_MEMORY_MB", raising=False)
    rows = prepared()
    assert _lr_rows.hold("a", 1, rows)
    assert _lr_rows.piece_of("a") == (1, rows) and _lr_rows.piece_of("b") == (-1, None)
    assert _lr_rows.hold("b", 0, prepared()) and _lr_rows.piece_of("a") == (-1, None)
    _lr_rows.drop()
    assert _lr_rows.piece_of("b") == (-1, None)


def test_nothing_is_held_under_a_worker_memory_cap_or_without_room(monkeypatch):
    monkeypatch.setenv("PYSPARK_EXECUTOR_MEMORY_MB", "2048")
    assert not _lr_rows.hold("a", 0, prepared()) and _lr_rows.piece_of("a") == (-1, None)
    monkeypatch.delenv("PYSPARK_EXECUTOR_MEMORY_MB")
    huge = prepared()
    monkeypatch.setattr(_lr_rows.Prepared, "nbytes", property(lambda self: 1 << 60))
    assert not _lr_rows.hold("a", 0, huge)


def test_every_piece_once_is_complete():
    def sums(*pieces):  # the all-reduce of every rank's count vector
        def all_reduce(counts):
            total = np.zeros_like(counts)
            for piece in pieces:
                total[piece if 0 <= piece < len(counts) - 1 else -1] += 1
            return total
        return all_reduce

    assert _lr_rows.complete(0, 2, sums(0, 1))
    assert not _lr_rows.complete(0, 2, sums(0, 0))  # one piece twice, one missing
    assert not _lr_rows.complete(-1, 2, sums(-1, 1))  # a worker holds nothing
    assert not _lr_rows.complete(2, 2, sums(2, 1))  # a piece of another layout


def test_the_driver_remembers_the_latest_keys():
    remembered = _lr_rows.Remembered()
    for key in map(str, range(20)):
        remembered.held(key)
    assert "19" in remembered and "0" not in remembered and None not in remembered
    remembered.forget("19")
    assert "19" not in remembered
