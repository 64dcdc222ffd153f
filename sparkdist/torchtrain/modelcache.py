"""Each Python worker's cache of scoring networks: built, loaded and moved to their device
once, then reused by the worker's later tasks, of the same job and of later ones (Spark
reuses Python workers, ``spark.python.worker.reuse``, on by default).

An entry's key is the SHA-256 of the weights with the hash of what else shapes the network
(class, keywords, adapters, quantization) and its device, never a path: a model saved again
under the same path is a new key, read anew. The cache holds at most ``bound`` bytes of
weights, the bound of the model scored last (``inferenceCacheBytes``), evicting the least
recently used; a network larger than the bound is built for its task and not kept.

Each task's load is recorded (``LoadRecord``) in a Spark accumulator that the driver reads
as ``TorchModel.scoringLoads``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypedDict

from pyspark.accumulators import AccumulatorParam

_ENTRIES: OrderedDict[str, tuple[Any, int]] = OrderedDict()


class LoadRecord(TypedDict):
    """One scoring task's network: from the cache (``hit``) or built, and the seconds from
    the task's start to a network ready to score."""

    pid: int
    hit: bool
    seconds: float
    cached_bytes: int


class LoadRecords(AccumulatorParam):  # type: ignore[type-arg]
    """A Spark accumulator of :class:`LoadRecord` lists."""

    def zero(self, value: list[LoadRecord]) -> list[LoadRecord]:
        return []

    def addInPlace(self, first: list[LoadRecord],  # noqa: N802 (pyspark's name)
                   second: list[LoadRecord]) -> list[LoadRecord]:
        return [*first, *second]


def network(key: str, size: int, bound: int, build: Callable[[], Any]) -> tuple[Any, bool]:
    """The cached network under ``key`` (True), or ``build()``'s (False); then the least
    recently used entries go until the cache holds at most ``bound`` bytes (a network larger
    than ``bound`` is not kept). Eviction drops the cache's reference only: a task still
    scoring with an evicted network keeps it until it ends."""
    found = _ENTRIES.pop(key, None)
    module, hit = (found[0], True) if found is not None else (build(), False)
    _ENTRIES[key] = (module, size)  # the most recent
    while _ENTRIES and cached_bytes() > bound:
        _ENTRIES.popitem(last=False)
    return module, hit


def record(hit: bool, seconds: float) -> LoadRecord:
    return LoadRecord(pid=os.getpid(), hit=hit, seconds=seconds, cached_bytes=cached_bytes())


def cached_bytes() -> int:
    """Bytes of weights the cache holds now."""
    return sum(size for _, size in _ENTRIES.values())


def clear() -> None:
    _ENTRIES.clear()
