"""A rank's local copy of its partition never outlives its task for long (issue 12, item 7;
report cases K2/K3): a rank whose process dies (killed by Spark on a timeout or a cancel, by
the OOM killer, by a lost driver) never runs its cleanup, so the next rank on that executor
removes what dead ranks left."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time

import pytest
from pyspark import cloudpickle

from sparkdist.exceptions import TrainingError
from sparkdist.launch.barrier import run_barrier

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers travel by value


def _die(context, batches, args):
    with open(os.path.join(context.scratch, "train.arrow"), "wb") as out:
        out.write(b"a copy of the user's training rows")
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would: no cleanup runs


def _quick(context, batches, args):
    return b"done"


def _scratch_dirs(spark, since: float) -> list[str]:
    """Rank scratch directories made since ``since``, in the executor's Spark local directory
    and the temp directory (where they used to be)."""
    def listing(batches):
        import pandas as pd

        roots = {os.environ.get("SPARK_LOCAL_DIRS", "/tmp").split(",")[0],
                 tempfile.gettempdir()}
        names = [os.path.join(root, name) for root in roots for name in os.listdir(root)
                 if name.startswith("sparkdist-rank")
                 and os.path.getmtime(os.path.join(root, name)) >= since]
        yield pd.DataFrame({"names": [json.dumps(sorted(names))]})
    rows = spark.range(1, numPartitions=1).mapInPandas(listing, "names string").collect()
    return json.loads(rows[0]["names"])


@pytest.mark.slow
def test_a_dead_ranks_copy_of_the_data_is_removed_by_the_next_fit(spark):
    started = time.time() - 1
    with pytest.raises(TrainingError):
        run_barrier(spark.range(4), _die, {}, 2, max_retries=0)
    assert _scratch_dirs(spark, started), "the dead ranks left nothing: the test proves nothing"
    assert run_barrier(spark.range(4), _quick, {}, 2) == b"done"
    assert _scratch_dirs(spark, started) == []
