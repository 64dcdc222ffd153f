"""A cheap cold start: Spark's Python workers fork from a daemon that imported torch already
(sparkdist.launch.daemon), and a local fit's rendezvous goes through the driver, not Spark's
allGather (which sleeps in whole seconds)."""

from __future__ import annotations

import json

import pytest

from sparkdist.launch import daemon


def test_get_spark_sets_the_preloading_daemon_for_local_masters(spark):
    assert spark.conf.get(daemon.CONF) == daemon.MODULE == "sparkdist.launch.daemon"


def test_workers_fork_from_a_daemon_that_imported_torch(spark):
    def worker_facts(batches):  # pickled by value: imports nothing before it runs
        import json
        import os
        import sys

        facts = {"torch": "torch" in sys.modules, "dynamo": "torch._dynamo" in sys.modules,
                 "preloaded": os.environ.get("SPARKDIST_DAEMON_PRELOADED")}
        parent = os.getppid()
        with open(f"/proc/{parent}/cmdline", "rb") as cmdline:
            facts["parent"] = cmdline.read().replace(b"\0", b" ").decode()
        facts["parent_threads"] = len(os.listdir(f"/proc/{parent}/task"))
        import pyarrow as pa

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"facts": [json.dumps(facts)]})

    rows = spark.range(4, numPartitions=4).mapInArrow(worker_facts, "facts string").collect()
    facts = [json.loads(row["facts"]) for row in rows]
    for fact in facts:
        # the worker's parent is sparkdist's daemon, which imported torch before forking it
        assert "sparkdist.launch.daemon" in fact["parent"], fact
        assert {"torch", "torch._dynamo", "sparkdist.torchtrain.loop"} <= set(
            (fact["preloaded"] or "").split(",")), fact
        assert fact["torch"] and fact["dynamo"], fact
        # fork safety: the daemon runs no thread besides its main one (OpenBLAS's pool, the
        # one thread an import started, is stopped by its own atfork handler)
        assert fact["parent_threads"] == 1, fact


def test_preloading_starts_no_thread_that_outlives_a_fork(tmp_path):
    """In a fresh interpreter: after :func:`daemon.preload` and one fork, the parent runs a
    single thread, and neither pyarrow nor pandas (which start threads) were imported."""
    import subprocess
    import sys

    code = ("import os, sys, json\n"
            "from sparkdist.launch import daemon\n"
            "loaded = daemon.preload()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "print(json.dumps({'loaded': loaded, 'threads': len(os.listdir('/proc/self/task')),"
            " 'heavy': sorted({'pyarrow', 'pandas'} & set(sys.modules))}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["loaded"] == list(daemon.PRELOAD)
    assert result["threads"] == 1 and result["heavy"] == [], result


@pytest.mark.parametrize("limit", ["", "512"])
def test_daemon_preloads_nothing_under_a_python_memory_limit(limit, monkeypatch):
    """``spark.executor.pyspark.memory`` caps each worker's address space: the daemon then
    forks plain workers (torch's libraries would count against every worker's cap)."""
    import os

    calls = []
    monkeypatch.setattr(daemon, "preload", lambda: calls.append(1) or ["torch"])
    monkeypatch.setattr("pyspark.daemon.manager", lambda: None)
    monkeypatch.setenv("PYSPARK_EXECUTOR_MEMORY_MB", limit)
    monkeypatch.delenv(daemon.ENV_PRELOADED, raising=False)
    daemon.main()
    assert calls == ([] if limit else [1])
    assert os.environ.get(daemon.ENV_PRELOADED) == (None if limit else "torch")


def test_a_local_rendezvous_goes_through_the_driver_not_spark_allgather(spark):
    """Spark's allGather sleeps a whole second in the JVM (Thread.sleep(1000)) before it
    looks at its RPC again; with a local master the ranks gather through the driver."""
    from sparkdist.launch.barrier import DRIVER_RENDEZVOUS_LOG_PREFIX as DRIVER
    from sparkdist.launch.barrier import SYNC_LOG_PREFIX, run_barrier

    def rendezvous_worker(context, batches, args):  # pickled by value
        import json

        for _ in batches:
            pass
        found = context.rendezvous()
        return json.dumps({"tail": context.tail(), "hosts": list(found.hosts),
                           "placement": context.placement}).encode()

    out = json.loads(run_barrier(spark.range(2, numPartitions=2), rendezvous_worker, {}, 2))
    assert DRIVER in out["tail"] and SYNC_LOG_PREFIX not in out["tail"]
    assert [p["rank"] for p in out["placement"]] == [0, 1] and len(out["hosts"]) == 2


def test_the_driver_gatherer_answers_once_all_ranks_of_the_newest_attempt_arrived():
    import socket

    from sparkdist.launch.report import _Gatherer

    gatherer = _Gatherer()
    pairs = [socket.socketpair() for _ in range(4)]

    def record(rank, task):
        return {"key": "7", "rank": rank, "world_size": 2, "task": task,
                "rendezvous": f"r{rank}t{task}"}

    assert gatherer.join(record(0, 10), pairs[0][0])  # attempt 0, rank 0 (rank 1 never came)
    assert gatherer.join(record(1, 12), pairs[1][0])  # the retry (task ids all higher)
    assert pairs[0][1].recv(10) == b""  # the stale rank was let go, not left waiting
    assert not gatherer.join(record(1, 9), pairs[2][0])  # a late rank of attempt 0: refused
    assert gatherer.join(record(0, 13), pairs[3][0])
    expected = json.dumps(["r0t13", "r1t12"]).encode() + b"\n"
    assert pairs[1][1].recv(100) == expected and pairs[3][1].recv(100) == expected
    assert not gatherer.join({"key": "7", "rank": 2, "world_size": 2, "task": 1,
                              "rendezvous": ""}, pairs[2][0])  # a rank out of range
    for a, b in pairs:
        a.close(), b.close()
