"""bench/deep.py's pure parts: the timing protocol's order, targets, time to accuracy, the
bare feed's task and the memory figure."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

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


# ------------------------------------------------ issue 32: plain DDP and the all-reduce
ddp_reference = load("ddp_reference")
allreduce = load("allreduce")
report = load("report")


def test_the_reference_takes_torchestimators_steps_and_halves():
    assert ddp_reference.steps_per_epoch(200_000, 256, 2) == 391  # ceil(200000 / 512)
    assert ddp_reference.steps_per_epoch(20_000, 256, 2) == 40
    assert ddp_reference.steps_per_epoch(10, 256, 2) == 1
    assert [ddp_reference.rows_of_rank(7, r, 2) for r in (0, 1)] == [4, 3]
    assert sum(ddp_reference.rows_of_rank(200_001, r, 2) for r in (0, 1)) == 200_001


def test_the_gradient_size_is_the_mlps_parameter_count():
    # 64*256 + 256, 256*256 + 256, 256*1 + 1: the 330 KB of issue 32's note
    assert ddp_reference.mlp_parameters(64, [256, 256]) == 82_689
    assert 4 * ddp_reference.mlp_parameters(64, [256, 256]) == 330_756
    assert ddp_reference.mlp_parameters(8, []) == 9


def test_the_reference_runs_under_the_interpreters_torchrun(tmp_path, monkeypatch):
    python = tmp_path / "python"
    monkeypatch.setattr(ddp_reference.sys, "executable", str(python))
    command = ddp_reference.torchrun(tmp_path / "s.py", ["--x", "1"], 2)
    assert command[1:] == ["-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", str(tmp_path / "s.py"), "--x", "1"]
    (tmp_path / "torchrun").touch()
    assert ddp_reference.torchrun(tmp_path / "s.py", [], 2)[0] == str(tmp_path / "torchrun")
    ranks = [{"rank": 0, "train_s": 2.0}, {"rank": 1, "train_s": 2.5}]
    assert ddp_reference.steady_seconds(ranks) == 2.5


def test_the_reference_follows_the_estimators_defaults():
    from sparkdist.models import TorchEstimator

    get = TorchEstimator().getOrDefault
    setup = deep.ddp_setup(20_000, 2)
    assert (setup.rows, setup.epochs, setup.workers, setup.hidden) == (20_000, 2, 2,
                                                                        [256, 256])
    assert (setup.optimizer, setup.loss, setup.weight_decay) == (
        get("optimizer"), get("loss"), get("weightDecay"))
    assert setup.batch == (get("batchSize") if deep.batch_per_worker()
                           else get("batchSize") // 2)
    assert deep.LR_SCALINGS["none"](2) == 1.0 and deep.LR_SCALINGS["linear"](2) == 2.0


def test_ddp_figures_cold_is_the_first_call_and_warm_the_median_after_it():
    cold = {"sparkdist": 10.0, "ddp": 8.0}
    warm = {"sparkdist": [4.0, 5.0, 6.0], "ddp": [8.0, 7.0, 9.0]}
    found = deep.ddp_figures(60_000, cold, warm, ddp_steady_s=[3.0, 2.0, 2.0, 4.0],
                             sparkdist_steady_s=[3.0, 2.5, 3.0, 2.5], repeats=3)
    c, w = found["cold"], found["warm"]
    assert c["ratio"] == 0.8 and not c["meets_target"] and c["target"] == ">= 0.9"
    assert (c["sparkdist_samples_per_s"], c["ddp_samples_per_s"]) == (6000, 7500)
    assert (c["ddp_steady_samples_per_s"], c["ddp_startup_s"]) == (20_000, 5.0)
    assert (c["sparkdist_steady_samples_per_s"], c["sparkdist_outside_epochs_s"]) == (
        20_000, 7.0)
    assert w["ratio"] == 1.6 and w["meets_target"]  # 8 s / 5 s
    assert (w["ddp_steady_samples_per_s"], w["ddp_startup_s"]) == (30_000, 6.0)
    assert w["sparkdist_steady_samples_per_s"] == 24_000  # median of 2.5, 3.0, 2.5
    assert "cold" in c["definition"] and "median of the 3 calls" in w["definition"]


def test_communication_ms_per_step_from_the_ranks():
    ranks = [{"communication_s": 0.3, "train_steps": 100.0},
             {"communication_s": 0.25, "train_steps": 100.0}]
    assert deep.communication_ms(ranks) == [3.0, 2.5]
    assert deep.communication_ms(None) is None
    assert deep.communication_ms([{"communication_s": 0.0, "train_steps": 0.0}]) is None


def _rank(offset: float, ready: list[float], returned: list[float]) -> dict:
    seconds = [0.001 * (i + 1) + offset for i in range(4)]
    return {"threads": 1, "allreduce": {"1": seconds, "82689": seconds},
            "step": {"local": seconds, "ddp": seconds, "ddp_hooked": seconds,
                     "wait": [t - r for r, t in zip(ready, returned)],
                     "ready_at": ready, "returned_at": returned, "gapped": seconds,
                     "gapped_began_at": ready, "gapped_ended_at": returned}}


def test_the_allreduce_summary_takes_the_slower_rank_and_splits_the_wait():
    assert allreduce.percentiles_ms([0.001, 0.002, 0.003, 0.010]) == {
        "median_ms": 2.5, "p10_ms": 1.0, "p90_ms": 10.0, "mean_ms": 4.0}
    # step 1: rank 0 ready at 10.0, rank 1 at 10.002, both back at 10.003;
    # step 2: rank 1 first (20.0), rank 0 at 20.001, both back at 20.0015
    ranks = [_rank(0.0, [10.0, 20.001], [10.003, 20.0015]),
             _rank(0.001, [10.002, 20.0], [10.003, 20.0015])]
    found = allreduce.summary(ranks)
    assert found["threads"] == 1 and "ready_at" not in found["step"]
    assert found["allreduce"]["82689"]["bytes"] == 330_756
    assert found["allreduce"]["82689"]["median_ms"] == 3.5  # rank 1's 2.5 + 1
    split = found["wait_split"]
    peer = [rank["mean_ms"] for rank in split["peer"]["ranks"]]
    after = [rank["mean_ms"] for rank in split["after_both_ready"]["ranks"]]
    assert peer == pytest.approx([1.0, 0.5]) and after == pytest.approx([0.75, 0.75])
    assert found["gapped_split"] == split and "gapped" in found["step"]


def test_report_renders_the_ddp_rows():
    ddp = deep.ddp_figures(60_000, {"sparkdist": 10.0, "ddp": 8.0},
                           {"sparkdist": [4.0], "ddp": [8.0]}, [3.0, 2.0], [3.0, 2.5], 1)
    ddp["sparkdist_communication_ms_per_step"] = [3.0, 3.5]
    ranks = [_rank(0.0, [10.0, 20.001], [10.003, 20.0015]),
             _rank(0.001, [10.002, 20.0], [10.003, 20.0015])]
    reduce = {"gradient_numel": 82689, "gradient_bytes": 330_756,
              "threads_1": allreduce.summary(ranks), "threads_2": allreduce.summary(ranks)}
    rows: list[dict] = []
    report._ddp_rows({"ddp_reference": ddp, "allreduce": reduce},
                     lambda what, ours, ref, ratio, target, unit="s", definition=None:
                     rows.append({"what": what, "ours": ours, "ref": ref, "ratio": ratio,
                                  "target": target, "unit": unit}))
    assert [(r["ratio"], r["target"], r["unit"]) for r in rows[:2]] == [
        (0.8, ">= 0.9", "samples/s"), (2.0, ">= 0.9", "samples/s")]
    assert rows[2]["ours"] == 3.5 and rows[2]["unit"] == "ms" and rows[2]["target"] == "-"
    assert rows[3]["ref"] == 3.5 and "331 KB" in rows[3]["what"]
    assert "ms" in report.LOWER_IS_BETTER
    rows.clear()
    report._ddp_rows({"ddp_reference": {"error": "x"}}, lambda *a, **k: rows.append(a))
    assert rows == []


# ------------------------------------ issue 32: the recommended rate, cold on local-cluster
def _fit_model(accuracies: list[float], seconds: float = 1.0) -> SimpleNamespace:
    return SimpleNamespace(history=[{"seconds": seconds, "val_accuracy": a, "lr": 0.001}
                                    for a in accuracies])


def test_the_recommended_row_changes_only_the_two_worker_side():
    from sparkdist.models import TorchEstimator

    built: list[dict] = []

    class Est:
        def __init__(self, **kwargs):
            built.append(kwargs)

        def fit(self, df):
            return df

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(deep, "estimator", lambda **kwargs: Est(**kwargs))
        sides = deep.accuracy_sides({1: "one", 2: "two"}, epochs=3)
        assert list(sides) == ["workers_1", "workers_2", "workers_2_recommended"]
        assert [sides[name]() for name in sides] == ["one", "two", "two"]
    one, two, recommended = built
    assert one == {"epochs": 3, "numWorkers": 1, "validationFraction": 0.1}
    assert two == {**one, "numWorkers": 2}
    assert recommended == {**two, **deep.RECOMMENDED_SCALING}
    est = TorchEstimator()  # the settings are valid Params, and not the defaults
    for key, value in deep.RECOMMENDED_SCALING.items():
        assert est.hasParam(key) and est.getOrDefault(key) != value


def test_the_recommended_settings_are_what_the_docs_recommend():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "deep-models.md").read_text()
    section = text.split("## Several workers: the learning rate")[1].split("\n## ")[0]
    assert deep.RECOMMENDED_SCALING == {"learningRateScaling": "linear", "warmupSteps": 300}
    assert 'learningRateScaling="linear"' in section and "warmupSteps=300" in section
    assert "usual advice for 2-8 workers is `\"linear\"`" in section


def test_time_to_accuracy_keeps_the_defaults_figure_and_adds_the_recommended_row(monkeypatch):
    def fake_alternate(capture, sides, repeats, fits=()):
        assert list(sides) == ["workers_1", "workers_2", "workers_2_recommended"]
        assert set(fits) == set(sides)
        histories = {"workers_1": [0.8, 0.96, 0.97], "workers_2": [0.7, 0.8, 0.9],
                     "workers_2_recommended": [0.9, 0.96, 0.97]}
        wall = {"workers_1": 10.0, "workers_2": 8.0, "workers_2_recommended": 8.0}
        return {name: deep.Side(seconds=[wall[name]] * repeats,
                                results=[_fit_model(histories[name])] * repeats)
                for name in sides}

    monkeypatch.setattr(deep, "alternate", fake_alternate)
    monkeypatch.setattr(deep, "accuracy_sides", lambda frames, epochs: {
        "workers_1": None, "workers_2": None, "workers_2_recommended": None})
    found = deep.time_to_accuracy(_Capture(), {}, 1000, 3, 0.95, 3)
    # 1 worker: fixed 7 s + 2 epochs = 9 s; 2 workers never reach it; recommended 5 + 2 = 7 s
    assert (found["seconds_workers_1"], found["seconds_workers_2"], found["ratio"]) == (
        9.0, None, None)
    assert found["target"] == "<= 0.65" and found["threshold"] == 0.95
    assert "both sides at the defaults" in found["definition"]
    rec = found["recommended"]
    assert (rec["seconds_workers_1"], rec["seconds_workers_2"]) == (9.0, 7.0)
    assert rec["ratio"] == round(7 / 9, 3) and rec["meets_target"] is False
    assert rec["settings_workers_2"] == deep.RECOMMENDED_SCALING
    assert "learningRateScaling='linear', warmupSteps=300" in rec["definition"]
    assert rec["lr_workers_2"] == [0.001] * 3


def test_the_existing_cold_row_keeps_its_command_and_the_cluster_rows_name_theirs():
    assert deep.cold_command("sparkdist")[2:] == ["--cold", "sparkdist"]
    assert deep.cold_command("torch_distributor", deep.CLUSTER_MASTER, "plain")[2:] == [
        "--cold", "torch_distributor", "--cold-master", "local-cluster[2,1,1024]",
        "--cold-builder", "plain"]
    assert deep.cold_command("sparkdist", deep.CLUSTER_MASTER)[-2:] == [
        "--cold-master", deep.CLUSTER_MASTER]


def test_the_plain_session_has_no_sparkdist_conf():
    conf = deep.plain_conf(deep.CLUSTER_MASTER)
    assert conf["spark.master"] == deep.CLUSTER_MASTER
    assert conf["spark.driver.bindAddress"] == "127.0.0.1" and conf["spark.ui.enabled"] == "false"
    assert deep.DAEMON_CONF not in conf
    assert not any("sparkdist" in value and key != "spark.app.name"
                   for key, value in conf.items())
    assert "spark.sql.execution.arrow.pyspark.enabled" not in conf


def test_a_cold_cluster_row_alternates_fresh_processes_on_one_master_and_builder(monkeypatch):
    calls: list[tuple] = []
    seconds = {"sparkdist": iter([3.0, 5.0, 4.0]), "torch_distributor": iter([10.0, 12.0, 8.0])}

    def result(side, master, builder):
        calls.append((side, master, builder))
        return {"seconds": next(seconds[side]), "daemon_module": None}

    monkeypatch.setattr(deep, "cold_result", result)
    capture = SimpleNamespace(log=lambda message: None)
    row = deep.cold_cluster_row(capture, deep.CLUSTER_MASTER, "plain", 3, "what")
    assert calls == [("sparkdist", deep.CLUSTER_MASTER, "plain"),
                     ("torch_distributor", deep.CLUSTER_MASTER, "plain")] * 3
    assert (row["sparkdist_s"], row["torch_distributor_s"], row["ratio"]) == (4.0, 10.0, 0.4)
    assert row["target"] == "<= 0.35" and not row["meets_target"]
    assert (row["master"], row["builder"], row["daemon_module"]) == (
        deep.CLUSTER_MASTER, "plain", ["None"])
    assert "plain SparkSession.builder" in row["definition"] and "median of 3" in row[
        "definition"]
