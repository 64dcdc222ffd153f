"""bench/scoring.py: its figures from known inputs become the performance page's rows with their
targets, its bare reference scores as the network does (no Spark), and its --quick mode end to
end (a real local[2] session: fits, transform, the bare mapInArrow, the UDF's bytes)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchscripts import load

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "scoring.py"


def load_bench() -> ModuleType:
    return load("scoring")


def test_the_defaults_are_the_issue_sizes_and_rows_scale_down():
    bench = load_bench()
    _, full = bench.arguments([])
    assert (full.rows, full.features, full.hidden, full.repeats) == (
        2_500_000, 128, [1024, 1024], 3)
    first, second = full.udf_hidden
    parameters = full.features * first + first + first * second + second + second + 1
    assert 190e6 < 4 * parameters < 210e6  # a 200 MB float32 model
    _, small = bench.arguments(["--rows", "50000"])
    assert small.rows == 50_000 and small.hidden == full.hidden
    args, quick = bench.arguments(["--quick"])
    assert quick.rows <= 5_000 and quick.repeats == 1 and not args.save


def test_throughput_ratio_is_sparkdist_rows_per_s_over_the_bare_ones():
    bench = load_bench()
    cold = {"sparkdist": 10.0, "int8": 5.0, "bare": 8.0}
    warm = {"sparkdist": [4.0, 5.0, 6.0], "int8": [2.0, 2.5, 9.0], "bare": [4.5, 4.4, 4.6]}
    figures = bench.throughput_figures(cold, warm, 1_000, 3)
    assert figures["cold"]["ratio"] == 0.8 and not figures["cold"]["meets_target"]
    assert figures["cold"]["int8_speedup"] == 2.0
    assert figures["warm"]["sparkdist_rows_per_s"] == 200 and figures["warm"]["ratio"] == 0.9
    assert figures["warm"]["meets_target"] and figures["target"] == ">= 0.9"
    assert figures["warm"]["runs_s"]["int8"] == [2.0, 2.5, 9.0]


def test_load_is_what_the_tasks_timed_with_the_driver_estimate_beside_it():
    bench = load_bench()
    first = [{"hit": False, "seconds": 0.2}, {"hit": False, "seconds": 0.3}]
    later = [{"hit": True, "seconds": 0.001}, {"hit": True, "seconds": 0.003},
             {"hit": False, "seconds": 0.25}]
    figures = bench.load_figures(0.5, [0.104, 0.2, 0.103], [0.1, 0.3, 0.099], 2, 512,
                                 first, later)
    assert (figures["first_s"], figures["later_s"], figures["later_max_s"]) == (
        0.25, 0.003, 0.25)
    assert figures["meets_target"] and figures["ratio_to_target"] == 0.6
    assert (figures["later_hits"], figures["later_tasks"], figures["first_hits"]) == (2, 3, 0)
    assert figures["driver_estimate"] == {"first_s": 0.4, "later_s": 0.004, "bare_job_s": 0.1}
    slow = bench.load_figures(0.5, [0.2], [0.1], 2, 512, first, later[2:])
    assert not slow["meets_target"] and slow["target"] == "<= 0.005"


def test_udf_bytes_are_summed_over_the_udfs_against_1_mib():
    bench = load_bench()
    figures = bench.udf_figures([200_000_000, 1_000], 199_000_000, 50_000_000, [7000, 7000],
                                128, 4_000)
    assert figures["udf_bytes"] == 200_001_000 and not figures["meets_target"]
    assert bench.udf_figures([1 << 20], 1, 1, [1], 1, 1)["meets_target"]


def test_the_scoring_figures_make_page_rows_with_their_targets():
    bench, report = load_bench(), load("report")
    figures = {
        "network": {"features": 128, "hidden": [1024, 1024], "outputs": 1},
        "throughput": bench.throughput_figures(
            {"sparkdist": 10.0, "int8": 5.0, "bare": 8.0},
            {"sparkdist": [4.0], "int8": [2.0], "bare": [3.8]}, 1_000, 1),
        "load": bench.load_figures(0.5, [0.2], [0.1], 2, 512, [{"hit": False, "seconds": 0.3}],
                                   [{"hit": True, "seconds": 0.1}]),
        "udf": bench.udf_figures([2_000], 199_000_000, 50_000_000, [7000, 7000], 128, 1_000),
        "classical": {"rows": 500, "target": ">= 0.95", "definition": "d",
                      "cold": {"sparkdist_s": 1.0, "mllib_s": 0.9, "ratio": 0.9},
                      "warm": {"sparkdist_s": 1.0, "mllib_s": 0.98, "ratio": 0.98}}}
    rows = report.table({"scoring": figures})
    assert [(r["ratio"], r["better"], r["unit"]) for r in rows] == [
        (0.8, "higher", "rows/s"), (0.95, "higher", "rows/s"), (2.0, "higher", "rows/s"),
        (2.0, "higher", "rows/s"), (20.0, "lower", "s"), (0.9, "higher", "s"),
        (0.98, "higher", "s"), (0.0019, "lower", "bytes")]
    assert [report.met(r) for r in rows] == [False, True, None, None, False, False, True, True]
    assert "MLP 128-1024-1024-1" in rows[0]["comparison"]
    assert "199 MB model" in rows[-1]["comparison"]


def test_the_bare_reference_scores_as_the_network_does():
    import numpy as np
    import pyarrow as pa
    import torch

    from sparkdist.torchtrain.nets import MLP

    bench = load_bench()
    torch.manual_seed(0)
    network = MLP(8, 1, [16]).eval()

    class Broadcast:
        value = pickle.dumps(network)

    x = np.random.default_rng(0).standard_normal((70, 8), dtype=np.float32)
    features = pa.ListArray.from_arrays(np.arange(0, x.size + 1, 8, dtype=np.int32), x.ravel())
    batches = [pa.RecordBatch.from_arrays([features.slice(0, 50)], ["features"]),
               pa.RecordBatch.from_arrays([features.slice(50)], ["features"]),
               pa.RecordBatch.from_arrays([features.slice(70)], ["features"])]  # no rows
    with torch.no_grad():
        logits = network(torch.from_numpy(x))[:, 0].numpy()
    try:
        for loss, expected in (("bce", (logits > 0).astype(float)), ("mse", logits)):
            scorer = bench.bare_scorer(Broadcast(), f"test-{loss}", 8, 32, loss)
            out = list(scorer(iter(batches)))
            assert [len(b) for b in out] == [50, 20]
            got = np.concatenate([b.column(0).to_numpy() for b in out])
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        assert isinstance(getattr(sys.modules[bench.CACHE_MODULE], "test-bce"), MLP)
    finally:
        sys.modules.pop(bench.CACHE_MODULE, None)


@pytest.mark.slow
def test_quick_mode_runs_every_part(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
                               "GLOO_SOCKET_IFNAME": "lo"})
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["benchmark"] == "scoring" and line["quick"] is True
    for kind in ("cold", "warm"):
        side = line["throughput"][kind]
        assert all(side[f"{s}_rows_per_s"] > 0 for s in ("sparkdist", "int8", "bare"))
    assert line["udf"]["udf_bytes"] > 0 and line["udf"]["per_udf_bytes"]
    assert line["load"]["tasks"] == 2 and line["load"]["later_tasks"] == 4
    assert line["load"]["first_hits"] == 0 and line["load"]["later_hits"] == 4
