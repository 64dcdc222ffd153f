"""Memory claims under a budget that is really enforced: every Python worker of a
local-cluster[2,1,2048] may map at most a set number of MiB (spark.executor.pyspark.memory,
an RLIMIT_AS on the worker).

- 3400 MiB: an MLP of 256 MiB of weights (1 GiB with gradients and Adam's moments) runs out
  of memory under ddp and trains under fsdp on 2 workers, where each rank holds half of the
  training state. Measured here: the same holds at 3100 and at 3700 MiB, so the cap has
  room either way.
- 4400 MiB: an embedding table of 448 MiB under Adam runs out of memory under ddp and trains
  under ps with 2 servers (issue 33).

Its own driver (one SparkContext per process), about 6 minutes on 2 busy cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = str(Path(__file__).resolve().parents[2] / "bench")  # budget.py, shared with the bench
BUDGET_MB, HIDDEN = 3400, [4096] * 5
ROWS = 128  # 1 step of 64 rows per rank: the memory a step needs, without the 3 steps more
TABLE_BUDGET_MB, TABLE_MB = 4400, 448
CODE = f"""
import json, sys
sys.path.insert(0, {BENCH!r})
from budget import budget_session, compare_tables_under_budget, compare_under_budget
outcome = {{}}
spark = budget_session({BUDGET_MB})
outcome["mlp"] = compare_under_budget(spark, {HIDDEN}, rows={ROWS})
spark = budget_session({TABLE_BUDGET_MB})  # a new local-cluster, in the same driver
outcome["table"] = compare_tables_under_budget(spark, {TABLE_MB}, rows={ROWS})
print(json.dumps(outcome))
spark.stop()
"""


@pytest.fixture(scope="module")
def outcome():
    """Both comparisons in one driver process of their own (one SparkContext per process)."""
    env = {key: value for key, value in os.environ.items() if key != "PYSPARK_SUBMIT_ARGS"}
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                          timeout=1500, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _out_of_memory(failed: dict) -> bool:
    return not failed["ok"] and ("MemoryError" in failed["error"]
                                 or "can't allocate memory" in failed["error"])


@pytest.mark.slow
@pytest.mark.cluster
def test_a_model_over_the_budget_fails_under_ddp_and_trains_under_fsdp(outcome):
    sys.path.insert(0, BENCH)
    from budget import model_state_mb

    ddp, fsdp = outcome["mlp"]["ddp"], outcome["mlp"]["fsdp"]
    assert _out_of_memory(ddp), ddp
    assert fsdp["ok"], fsdp.get("error")
    assert len(fsdp["history"]) == 1 and fsdp["history"][0]["loss"] > 0
    whole = model_state_mb(HIDDEN)["training_state"]  # what every ddp rank holds
    assert [rank["state_mb"] <= 0.55 * whole for rank in fsdp["ranks"]] == [True, True]


@pytest.mark.slow
@pytest.mark.cluster
def test_an_embedding_table_over_the_budget_fails_under_ddp_and_trains_under_ps(outcome):
    """A table of 448 MiB under Adam: ddp needs it, its gradient, DDP's bucket and two
    moments on every rank (2240 MiB over the baseline) and runs out; ps holds half the rows
    and their moments on each of 2 servers (672 MiB). Measured here: ps trains at 3600 MiB
    and not at 3400 (every rank builds the whole table once before keeping its rows, and
    rank 0 gathers it for the fitted model, after the servers dropped their moments); ddp
    fails still at 5000."""
    sys.path.insert(0, BENCH)
    from budget import table_state_mb

    ddp, ps = outcome["table"]["ddp"], outcome["table"]["ps"]
    assert _out_of_memory(ddp), ddp
    assert ps["ok"], ps.get("error")
    assert len(ps["history"]) == 1 and ps["history"][0]["loss"] > 0
    held = table_state_mb(TABLE_MB, servers=2)
    assert [rank["state_mb"] <= held["ps"] + 1 for rank in ps["ranks"]] == [True, True]
