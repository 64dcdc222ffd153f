"""Loading never runs what a saved directory names; saving commits all-or-nothing and never
deletes what it was not asked to replace (issue 11, items 2-4; report cases P2e, P3a, P3b,
C10, P5, P6, P7)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import threading
import time
from pathlib import Path

import pytest
from pyspark.ml import PipelineModel, Transformer

from sparkdist import cli
from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.features import FeatureAssembler, FeatureAssemblerModel
from sparkdist.models import LogisticRegression
from sparkdist.persist import RECORD, REPLACED, data_dir, load_model, save_model
from sparkdist.store import PathExistsError


class _Payload:
    """Unpickling this creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture
def marker(tmp_path):
    marker = tmp_path / "PAYLOAD_RAN"
    pickle.loads(pickle.dumps(_Payload(marker)))  # the payload is live
    assert marker.exists()
    marker.unlink()
    return marker


@pytest.fixture(scope="module")
def frame(spark):
    rows = [(float(i % 7), "a" if i % 3 else "b", float(i % 2)) for i in range(60)]
    return spark.createDataFrame(rows, ["x", "c", "label"])


@pytest.fixture(scope="module")
def pipeline(frame):
    assembler = FeatureAssembler(numericCols=["x"], categoricalCols=["c"]).fit(frame)
    lr = LogisticRegression(maxIter=5).fit(assembler.transform(frame))
    return PipelineModel([assembler, lr])


def _predictions(model, frame):
    return [r["prediction"] for r in model.transform(frame).orderBy("x", "c").collect()]


def _xgboost_spark_metadata(marker: Path) -> dict:
    """xgboost.spark's loader unpickles ``serialized_callbacks`` (report case P3a)."""
    import cloudpickle

    return {"class": "xgboost.spark.estimator.SparkXGBClassifierModel", "timestamp": 0,
            "sparkVersion": "4.0.0", "uid": "SparkXGBClassifierModel_x", "paramMap": {},
            "defaultParamMap": {},
            "serialized_callbacks": base64.encodebytes(
                cloudpickle.dumps(_Payload(marker))).decode()}


def _plant(directory: Path, metadata: dict) -> Path:
    (directory / "metadata").mkdir(parents=True, exist_ok=True)
    for old in (directory / "metadata").iterdir():
        old.unlink()
    (directory / "metadata" / "part-00000").write_text(json.dumps(metadata) + "\n")
    return directory


# ------------------------------------------------------------------------------ loading
def test_a_class_off_the_allowlist_is_refused_before_anything_runs(spark, tmp_path, marker):
    evil = _plant(tmp_path / "evil", _xgboost_spark_metadata(marker))
    with pytest.raises(ModelLoadError, match="SparkXGBClassifierModel.*does not load"):
        load_model(str(evil), spark)
    assert not marker.exists()


def test_a_named_module_is_never_imported(spark, tmp_path, monkeypatch):
    package = tmp_path / "site"
    package.mkdir()
    (package / "planted_stage.py").write_text(
        f"open({str(tmp_path / 'IMPORTED')!r}, 'w').close()\nclass Stage: pass\n")
    monkeypatch.syspath_prepend(str(package))
    for name in ("planted_stage.Stage", "sparkdist.planted_stage.Stage", "os.system"):
        evil = _plant(tmp_path / "evil", {"class": name, "uid": "x", "paramMap": {}})
        with pytest.raises(ModelLoadError, match="does not load"):
            load_model(str(evil), spark)
    assert not (tmp_path / "IMPORTED").exists() and "planted_stage" not in sys.modules


def test_the_allowlist_is_the_public_model_modules_and_the_assembler():
    """persist finds sparkdist's stage modules by name (it must not import models): the
    same modules as the models package's own table, nothing private, nothing made up."""
    from sparkdist.models import MODULES
    from sparkdist.persist import own_stage_module

    assert all(own_stage_module(name) for name in (*MODULES, "sparkdist.features.assembly"))
    for name in ("sparkdist.models._recovery", "sparkdist.models.os", "sparkdist.models",
                 "sparkdist.models.torch.nn", "sparkdist.store", "sparkdist.models.x/../y"):
        assert not own_stage_module(name), name


def test_a_planted_inner_stage_of_a_feature_assembler_is_refused(frame, tmp_path, marker):
    path = tmp_path / "assembler"
    FeatureAssembler(numericCols=["x"], categoricalCols=["c"]).fit(frame).write().save(
        str(path))
    stages = Path(data_dir(str(path))) / "stages"
    inner = next(p for p in (Path(data_dir(str(stages))) / "stages").iterdir())
    _plant(inner, _xgboost_spark_metadata(marker))
    with pytest.raises(ModelLoadError, match="SparkXGBClassifierModel"):
        FeatureAssemblerModel.load(str(path))
    assert not marker.exists()


def test_stage_uids_cannot_point_outside_the_model(spark, pipeline, tmp_path):
    path = tmp_path / "pipeline"
    save_model(pipeline, str(path), spark=spark)
    record = json.loads((path / RECORD).read_text())
    record["paramMap"]["stageUids"][0] = "../../../../evil_stage"
    (path / RECORD).write_text(json.dumps(record))
    with pytest.raises(ModelLoadError, match="stageUids"):
        load_model(str(path), spark)


def test_the_cli_refuses_a_planted_model(spark, frame, tmp_path, marker, capsys):
    evil = _plant(tmp_path / "evil", _xgboost_spark_metadata(marker))
    data = str(tmp_path / "data.parquet")
    frame.write.parquet(data)
    assert cli.main(["evaluate", str(evil), data]) == 2
    assert "does not load" in capsys.readouterr().err and not marker.exists()


@pytest.mark.slow
def test_tracking_load_model_uses_the_allowlist(spark, tmp_path, marker):
    import mlflow

    from sparkdist import tracking

    uri = f"sqlite:///{tmp_path}/mlruns.db"
    evil = _plant(tmp_path / "evil" / "sparkml", _xgboost_spark_metadata(marker))
    mlflow.set_tracking_uri(uri)
    # Its own experiment: an earlier test may have left another one active in this process.
    with mlflow.start_run(experiment_id=mlflow.create_experiment("allowlist")) as run:
        mlflow.log_artifacts(str(evil), "model/sparkml")
    with pytest.raises(ModelLoadError, match="does not load"):
        tracking.load_model(run.info.run_id, uri=uri)
    assert not marker.exists()


@pytest.mark.slow
def test_pipelines_round_trip_through_both_writers(spark, pipeline, frame, tmp_path):
    expected = _predictions(pipeline, frame)
    save_model(pipeline, str(tmp_path / "ours"), spark=spark)
    pipeline.write().save(str(tmp_path / "pyspark"))  # pyspark's own layout
    for name in ("ours", "pyspark"):
        assert _predictions(load_model(str(tmp_path / name), spark), frame) == expected
    assert _predictions(PipelineModel.load(str(tmp_path / "pyspark")), frame) == expected


# ------------------------------------------------------------------------------ saving
@pytest.mark.parametrize("path", ["", "/", "."])
def test_saving_to_an_empty_root_or_working_path_deletes_nothing(pipeline, tmp_path,
                                                                  monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "canary").write_text("still here")
    with pytest.raises(ParamError, match="empty|root|working directory"):
        pipeline.stages[1].write().overwrite().save(path)
    assert (tmp_path / "canary").read_text() == "still here"


def test_overwriting_a_directory_that_is_not_a_model_is_refused(pipeline, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(ParamError, match="not a saved model"):
        pipeline.stages[1].write().overwrite().save(str(tmp_path / "notes"))
    with pytest.raises(PathExistsError):
        pipeline.stages[1].write().save(str(tmp_path / "notes"))
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"


def test_a_concurrent_writer_is_refused_not_deleted(spark, pipeline, tmp_path):
    path = tmp_path / "model"
    outcome: dict = {}

    def slow_save() -> None:  # a pipeline with MLlib parts: several Spark jobs
        try:
            save_model(pipeline, str(path), spark=spark)
        except Exception as err:
            outcome["error"] = err

    writer = threading.Thread(target=slow_save)
    writer.start()
    deadline = time.monotonic() + 60
    while not any(p.name.startswith("v-") for p in path.glob("v-*")):
        assert time.monotonic() < deadline, "the first save never started writing"
        time.sleep(0.01)
    other = FeatureAssembler(numericCols=["x"])
    other.write().save(str(path))  # commits first
    writer.join(120)
    assert isinstance(outcome.get("error"), PathExistsError)
    loaded = load_model(str(path), spark)
    assert isinstance(loaded, FeatureAssembler) and loaded.uid == other.uid
    assert {p.name for p in path.glob("v-*")} <= {Path(data_dir(str(path))).name}


@pytest.mark.slow
def test_a_failed_overwrite_keeps_the_old_model_and_leaves_no_version(spark, pipeline,
                                                                      frame, tmp_path):
    path = str(tmp_path / "model")
    save_model(pipeline, path, spark=spark)
    before = sorted(os.listdir(path))

    class Unsaveable(Transformer):
        def _transform(self, dataset):
            return dataset

    broken = PipelineModel([pipeline.stages[0], Unsaveable()])
    with pytest.raises(ParamError, match="cannot save a Unsaveable"):
        save_model(broken, path, overwrite=True, spark=spark)
    assert sorted(os.listdir(path)) == before
    assert _predictions(load_model(path, spark), frame) == _predictions(pipeline, frame)


@pytest.mark.slow
def test_what_a_killed_save_leaves_trips_nothing(spark, pipeline, frame, tmp_path):
    """The state a SIGKILL leaves at any point before the commit: a partial version and a
    temporary metadata file. Loads ignore them; the next save works and sweeps old ones."""
    path = tmp_path / "model"
    stale = path / "v-0000000000001-deadbeef"
    young = path / f"v-{int(time.time() * 1000):013d}-0badf00d"
    for version in (stale, young):
        (version / "mllib").mkdir(parents=True)
    (path / "metadata").mkdir()
    (path / "metadata" / ".part-00000.tmp-12345678").write_text("{half")
    with pytest.raises(ModelLoadError, match="no metadata"):
        load_model(str(path), spark)
    save_model(pipeline, str(path), spark=spark)
    assert _predictions(load_model(str(path), spark), frame) == _predictions(pipeline, frame)
    assert not stale.exists() and young.exists()  # a save still under way is left alone


@pytest.mark.slow
def test_overwrite_replaces_the_version_and_the_layout_before_versions(spark, pipeline,
                                                                        frame, tmp_path):
    path = tmp_path / "model"
    pipeline.stages[1].mllib_model.write().save(str(path))  # MLlib's own layout, unversioned
    save_model(pipeline, str(path), overwrite=True, spark=spark)
    first = Path(data_dir(str(path))).name
    assert sorted(p.name for p in path.iterdir()) == ["metadata", first]
    save_model(pipeline, str(path), overwrite=True, spark=spark)
    second = Path(data_dir(str(path))).name  # the replaced one stays for a grace period
    assert sorted(p.name for p in path.iterdir()) == ["metadata", first, second]
    assert (path / first / REPLACED).exists()
    assert os.listdir(path / "metadata") == ["part-00000"]
    assert _predictions(load_model(str(path), spark), frame) == _predictions(pipeline, frame)
