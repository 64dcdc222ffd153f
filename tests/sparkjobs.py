"""Counting the Spark jobs a call runs: the tests that hold a fit to a job budget (issue 15:
no job beyond the wrapped library's own and sparkdist's checks) use this one helper."""

from __future__ import annotations

import uuid
from collections.abc import Callable


def count_jobs(spark, call: Callable[[], object]) -> int:
    """The Spark jobs ``call()`` runs, counted by the status tracker under a job group of
    its own (threads it starts with ``InheritableThread`` inherit the group)."""
    sc = spark.sparkContext
    group = f"sparkdist-test-jobs-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "count the jobs of one call")
    try:
        call()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return len(sc.statusTracker().getJobIdsForGroup(group))
