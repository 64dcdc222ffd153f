"""Models and checkpoints on S3, against a real S3 API server (moto) on 127.0.0.1: save, load
and overwrite of an LR pipeline and a sparkdist stage (s3:// and s3a://) and a TorchModel,
schemes sparkdist refuses before anything runs, checkpoints written by the executors and a
resume after a killed worker, and a saving process SIGKILLed part-way through an overwrite.

The endpoint and credentials are the standard AWS variables, set by tests/conftest.py before
the session starts (the executors' Python workers get the JVM's environment)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from pyspark.ml import Pipeline, PipelineModel

from sparkdist import store
from sparkdist.datasets import CHURN_COUNTS, CHURN_LABEL, churn
from sparkdist.exceptions import ParamError
from sparkdist.failpoints import arm
from sparkdist.features import FeatureAssembler
from sparkdist.models import LogisticRegression, LogisticRegressionModel, TorchEstimator, TorchModel
from sparkdist.persist import RECORD, REPLACED, data_dir, load_model, save_model
from sparkdist.store import PathExistsError

BUCKET = "sparkdist-tests"
TORCH = {"progress": False, "batchSize": 200, "learningRate": 0.01, "seed": 5,
         "modelKwargs": {"hidden": [8]}, "rendezvousTimeoutSeconds": 60}


@pytest.fixture(scope="session")
def s3(moto_s3):
    """The moto S3 server (tests/conftest.py) with BUCKET: an s3fs filesystem to look into it."""
    if not moto_s3.exists(BUCKET):
        moto_s3.mkdir(BUCKET)
    return moto_s3


@pytest.fixture
def prefix(s3, request) -> str:
    """A fresh key prefix in the bucket for one test."""
    return f"{BUCKET}/{request.node.name.replace('[', '-').strip(']')}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def churn_small(spark):
    df = churn(spark, n=600, seed=3, partitions=2).cache()
    df.count()
    yield df
    df.unpersist()


@pytest.fixture(scope="module")
def lr_pipeline(churn_small):
    """A fitted FeatureAssembler + LogisticRegression pipeline and its predictions."""
    model = Pipeline(stages=[
        FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan"],
                         labelCol=CHURN_LABEL),
        LogisticRegression(labelCol=CHURN_LABEL, maxIter=10)]).fit(churn_small)
    return model, predictions(model, churn_small)


@pytest.fixture(scope="module")
def lr_stage(lr_pipeline, churn_small):
    """The pipeline's LogisticRegressionModel, its input rows and its predictions."""
    assembled = lr_pipeline[0].stages[0].transform(churn_small).cache()
    lr = lr_pipeline[0].stages[1]
    yield lr, assembled, predictions(lr, assembled)
    assembled.unpersist()


@pytest.fixture(scope="module")
def torch_model(nonlinear):
    """A TorchModel (one epoch, one worker) and its predictions."""
    model = TorchEstimator(numWorkers=1, epochs=1, **TORCH).fit(nonlinear[0])
    return model, predictions(model, nonlinear[1])


def predictions(model, df) -> list[tuple]:
    out = model.transform(df)
    key = "customer_id" if "customer_id" in out.columns else "features"
    rows = out.select(key, "prediction", "probability").collect()
    return sorted((tuple(r[0]) if key == "features" else r[0], r[1], tuple(r[2])) for r in rows)


def names(s3, key: str) -> list[str]:
    """The entries directly under ``key`` in the bucket."""
    return sorted(p.rsplit("/", 1)[1] for p in s3.ls(key))


def versions(s3, key: str) -> list[str]:
    """The version directories under ``key`` in the bucket."""
    return [name for name in names(s3, key) if name.startswith("v-")]


def committed(path: str) -> str:
    """The version directory that the commit at ``path`` names."""
    return data_dir(path).rsplit("/", 1)[1]


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "s3a"])
def test_an_lr_pipeline_saves_loads_and_overwrites(s3, prefix, scheme, lr_pipeline,
                                                   churn_small):
    model, before = lr_pipeline
    path, key = f"{scheme}://{prefix}/pipeline", f"{prefix}/pipeline"
    save_model(model, path)
    first = committed(path)
    assert names(s3, key) == ["metadata", first]
    loaded = load_model(path)
    assert isinstance(loaded, PipelineModel) and predictions(loaded, churn_small) == before

    save_model(model, path, overwrite=True)
    assert committed(path) != first and versions(s3, key) == [first, committed(path)]
    assert s3.exists(f"{key}/{first}/{REPLACED}")  # kept for a grace period, then swept
    with pytest.raises(PathExistsError):
        save_model(model, path)


@pytest.mark.parametrize("scheme", ["s3", "s3a"])
def test_a_sparkdist_stage_writes_loads_and_overwrites(s3, prefix, scheme, lr_stage):
    lr, assembled, before = lr_stage
    path = f"{scheme}://{prefix}/lr"
    lr.write().save(path)
    with pytest.raises(PathExistsError):
        lr.write().save(path)
    lr.write().overwrite().save(path)
    assert predictions(LogisticRegressionModel.load(path), assembled) == before


@pytest.mark.slow
def test_a_torch_model_writes_loads_and_overwrites(s3, prefix, torch_model, nonlinear):
    model, before = torch_model
    path = f"s3://{prefix}/torch"
    model.write().save(path)
    with pytest.raises(PathExistsError):
        model.write().save(path)
    model.write().overwrite().save(path)
    loaded = TorchModel.load(path)
    assert loaded.history == model.history and predictions(loaded, nonlinear[1]) == before


def test_every_s3_path_shares_one_client(s3):
    """One filesystem per process, not one per call (which made an S3 save 10x slower)."""
    assert store.locate(f"s3://{BUCKET}/a").fs is store.locate(f"s3a://{BUCKET}/b/c").fs


@pytest.mark.parametrize("url", ["ftp://host/models/m", "foo://bucket/models/m"])
def test_an_unsupported_scheme_is_refused_before_anything_runs(spark, url, nonlinear):
    supported = r"(?s)cannot read or write.*s3://.*s3a://.*gs://.*abfss://.*wasbs://"
    with pytest.raises(ParamError, match=supported):
        save_model(LogisticRegression(), url)
    with pytest.raises(ParamError, match=supported):
        LogisticRegression().write().save(url)
    with pytest.raises(ParamError, match=supported):
        load_model(url)
    with pytest.raises(ParamError, match=supported):
        TorchModel.load(url)
    context, group = spark.sparkContext, f"refused-{uuid.uuid4().hex[:6]}"
    context.setJobGroup(group, "a fit that must not start")
    try:
        with pytest.raises(ParamError, match="checkpointDir=.*" + supported[4:]):
            TorchEstimator(checkpointDir=url, **TORCH).fit(nonlinear[0])
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    assert context.statusTracker().getJobIdsForGroup(group) == []


def _kill_a_worker_once(estimator, state_dir, *, rank: int, epoch: int, step: int):
    """SIGKILL the Python worker of ``rank`` at ``step`` of ``epoch``, once (a failpoint)."""
    return arm(estimator, state_dir, rank=rank, epoch=epoch, step=step, action="kill")


@pytest.mark.slow
def test_checkpoints_on_s3_resume_after_a_killed_worker(s3, prefix, nonlinear, tmp_path):
    estimator = _kill_a_worker_once(
        TorchEstimator(numWorkers=2, epochs=3, checkpointDir=f"s3://{prefix}/ckpt", **TORCH),
        str(tmp_path), rank=1, epoch=2, step=4)
    model = estimator.fit(nonlinear[0])
    summary = model.trainingSummary
    assert (tmp_path / "fired-1.pid").exists(), "the worker was not killed"
    assert summary["resumed_from_epoch"] == 1
    assert [epoch["epoch"] for epoch in model.history] == [1, 2, 3]
    names = [p.rsplit("/", 1)[1] for p in s3.ls(f"{prefix}/ckpt/{summary['run_id']}")]
    assert sorted(n for n in names if n.startswith("ckpt-")) == [
        "ckpt-0000000001", "ckpt-0000000002", "ckpt-0000000003"]


# Saves a PipelineModel of many stages (each its own JVM write, upload and commit, so the
# save takes seconds) over the model at argv[1].
SLOW_SAVE = """
import sys
from pyspark.ml import PipelineModel
from pyspark.ml.feature import SQLTransformer
from sparkdist.persist import save_model
from sparkdist.session import get_spark

get_spark(master="local[1]", conf={"spark.ui.enabled": "false"})
stages = [SQLTransformer(statement="SELECT * FROM __THIS__") for _ in range(int(sys.argv[2]))]
save_model(PipelineModel(stages), sys.argv[1], overwrite=True)
print("committed", flush=True)
"""


@pytest.mark.slow
def test_a_save_killed_during_an_overwrite_leaves_the_old_model(s3, prefix, lr_stage,
                                                               tmp_path):
    lr, assembled, before = lr_stage
    path, key = f"s3://{prefix}/m", f"{prefix}/m"
    lr.write().save(path)
    old = committed(path)

    log = tmp_path / "child.log"
    with open(log, "wb") as out:
        child = subprocess.Popen([sys.executable, "-c", SLOW_SAVE, path, "30"], stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        # SIGKILL it (and its JVM) once its new version holds two saved stages: part of the
        # new model is written, its commit is not.
        deadline = time.monotonic() + 120
        while True:
            new = [v for v in versions(s3, key) if v != old]
            if new and len(s3.glob(f"{key}/{new[0]}/stages/*/{RECORD}")) >= 2:
                break
            assert child.poll() is None, f"the save ended before the kill:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no new version appeared:\n{log.read_text()}"
            time.sleep(0.05)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)  # the child's own session: it and its JVM
        child.wait()
    assert child.returncode == -signal.SIGKILL and "committed" not in log.read_text()

    assert committed(path) == old  # the commit still names the old version
    assert versions(s3, key) == sorted([old, *new])  # the killed save's is left, never read
    assert predictions(load_model(path), assembled) == before

    lr.write().overwrite().save(path)
    assert committed(path) not in (old, *new) and old in versions(s3, key)
    assert s3.exists(f"{key}/{old}/{REPLACED}")  # replaced: kept for a grace period
    assert predictions(load_model(path), assembled) == before
