"""Round 3 of saving and loading (../shared/reports/robustness_round3.md): an overwrite keeps
the version it replaced for a grace period, under readers that still use it, and a load
whose version an overwrite removed retries (N10); S3 saves never create a bucket, and
rejected credentials or a dead endpoint are typed errors naming the path (N11). The
malformed paths of N16 and N18 are rows of test_bad_input.py."""

from __future__ import annotations

import json
import os
import socket
import threading
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from sparkdist import persist, store
from sparkdist.datasets import make_ratings
from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.features import FeatureAssembler
from sparkdist.models import LogisticRegression, LogisticRegressionModel
from sparkdist.models.als import ALS
from sparkdist.persist import REPLACED, data_dir, load_model, save_model
from sparkdist.store import Checkpoints, StoreError

BUCKET = "sparkdist-r3"


@pytest.fixture(scope="module")
def frame(spark):
    rows = [(float(i % 7), float(i % 5), float(i % 2)) for i in range(60)]
    df = spark.createDataFrame(rows, ["x", "y", "label"]).cache()
    yield df
    df.unpersist()


@pytest.fixture(scope="module")
def lr_models(frame):
    """Two different fitted LogisticRegressionModels (their load reads the mllib/ files)."""
    assembled = FeatureAssembler(numericCols=["x", "y"]).fit(frame).transform(frame)
    return [LogisticRegression(maxIter=n).fit(assembled) for n in (2, 5)], assembled


def _versions(path: Path) -> set[str]:
    return {p.name for p in path.glob("v-*")}


def _committed(path: Path) -> str:
    return Path(data_dir(str(path))).name


# ------------------------------------------------------------------------------------ N10
@pytest.mark.slow
def test_a_loaded_als_model_keeps_working_after_an_overwrite(spark, tmp_path):
    pdf = make_ratings(n_users=30, n_items=15, density=0.5, seed=5, string_ids=False)
    pdf.attrs = {}  # the true factors are not needed here
    ratings = spark.createDataFrame(pdf[["user_id", "item_id", "rating"]])
    model = ALS(userCol="user_id", itemCol="item_id", ratingCol="rating", rank=2, maxIter=2,
                numUserBlocks=2, numItemBlocks=2, seed=1).fit(ratings)
    path = tmp_path / "als"
    save_model(model, str(path))
    loaded = load_model(str(path))  # ALS reads its factors lazily, from this version
    first = _committed(path)
    save_model(model, str(path), overwrite=True)
    assert loaded.transform(ratings).count() == ratings.count()
    assert loaded.recommendForAllUsers(2).count() == 30
    assert _committed(path) != first and (path / first / REPLACED).exists()


def test_a_replaced_version_goes_with_a_save_after_the_grace_period(spark, frame, tmp_path,
                                                                    monkeypatch):
    stage, path = FeatureAssembler(numericCols=["x"]).fit(frame), tmp_path / "m"
    stage.write().save(str(path))
    first = _committed(path)
    stage.write().overwrite().save(str(path))
    second = _committed(path)
    assert _versions(path) == {first, second}  # the replaced one stays, marked
    assert abs(int((path / first / REPLACED).read_text()) / 1000 - os.path.getmtime(
        path / first / REPLACED)) < 60
    (path / first / REPLACED).write_text("0")  # as if replaced long ago
    stage.write().overwrite().save(str(path))
    third = _committed(path)
    assert _versions(path) == {second, third}
    monkeypatch.setattr(persist, "REPLACED_GRACE_S", 0.0)  # no grace: removed at once
    stage.write().overwrite().save(str(path))
    assert _versions(path) == {_committed(path)}
    assert load_model(str(path)).featureNames == stage.featureNames


@pytest.mark.slow
def test_loads_racing_overwrites_never_fail(spark, lr_models, tmp_path):
    models, assembled = lr_models
    path = str(tmp_path / "lr")
    save_model(models[0], path, spark=spark)
    coefficients = {tuple(m.coefficients) for m in models}
    stop, saves, errors = threading.Event(), [], []

    def overwrite() -> None:
        while not stop.is_set():
            try:
                save_model(models[len(saves) % 2], path, overwrite=True, spark=spark)
            except Exception as err:  # reported below
                errors.append(err)
                return
            saves.append(1)

    writer = threading.Thread(target=overwrite)
    writer.start()
    loads = 0
    try:  # at least 8 loads, while at least 3 overwrites commit (however slow either is)
        while (loads < 8 or len(saves) < 3) and not errors:
            loaded = LogisticRegressionModel.load(path)
            assert tuple(loaded.coefficients) in coefficients
            assert loaded.transform(assembled).count() == assembled.count()
            loads += 1
    finally:
        stop.set()
        writer.join(300)
    assert not errors, errors


def test_a_load_retries_once_when_an_overwrite_removed_its_version(spark, lr_models,
                                                                  tmp_path, monkeypatch):
    """An overwrite (without grace) commits and sweeps right after the load read the commit."""
    models, _ = lr_models
    path = str(tmp_path / "lr")
    save_model(models[0], path, spark=spark)
    monkeypatch.setattr(persist, "REPLACED_GRACE_S", 0.0)
    read_record, overwritten = persist._read_record, []

    def read_then_overwrite(at: str) -> dict:
        record = read_record(at)
        if at == path and not overwritten:
            overwritten.append(record[persist.DATA_KEY])
            save_model(models[1], path, overwrite=True, spark=spark)
        return record

    monkeypatch.setattr(persist, "_read_record", read_then_overwrite)
    loaded = LogisticRegressionModel.load(path)
    assert overwritten and not os.path.exists(f"{path}/{overwritten[0]}")
    assert tuple(loaded.coefficients) == tuple(models[1].coefficients)


# ------------------------------------------------------------------------------------ N11
@pytest.fixture(scope="module")
def s3(moto_s3):
    """The moto S3 server (tests/conftest.py) with BUCKET: an s3fs filesystem."""
    if not moto_s3.exists(BUCKET):
        moto_s3.mkdir(BUCKET)
    return moto_s3


@contextmanager
def _credentials_rejected():
    """moto checks credentials (ours are unknown to it, as a revoked key is to AWS)."""
    def reset(count: str) -> str:
        request = urllib.request.Request(f"{os.environ['AWS_ENDPOINT_URL']}/moto-api/reset-auth",
                                         data=count.encode(), method="POST",
                                         headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(request) as response:
            return json.loads(response.read())["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"]

    previous = reset("0")
    try:
        yield
    finally:
        reset(previous)


def test_a_save_into_a_missing_bucket_is_refused_and_creates_none(spark, s3, lr_models):
    model, bucket = lr_models[0][0], f"typo-{uuid.uuid4().hex[:8]}"
    missing = rf"'{bucket}' does not exist\. sparkdist never creates one.*correct the name"
    with pytest.raises(ParamError, match=rf"path='s3://{bucket}/m'.*{missing}"):
        model.write().save(f"s3://{bucket}/m")  # sparkdist's own stage
    with pytest.raises(ParamError, match=missing):
        save_model(model.mllib_model, f"s3a://{bucket}/m")  # written by MLlib
    with pytest.raises(ParamError, match=rf"checkpointDir=.*{missing}"):
        Checkpoints(f"s3://{bucket}/ckpt").check_writable()
    # Spark's writers' output is uploaded file by file: no makedirs, which creates buckets
    with pytest.raises(FileNotFoundError), store.jvm_output(spark, f"s3://{bucket}/x") as out:
        os.makedirs(f"{out}/metadata")
        Path(f"{out}/metadata/part-00000").write_text("{}")
    assert not s3.exists(bucket)


def test_rejected_credentials_are_a_typed_error_naming_the_path(s3, lr_models):
    model, path = lr_models[0][0], f"s3://{BUCKET}/creds-{uuid.uuid4().hex[:6]}/m"
    model.write().save(path)
    with _credentials_rejected():
        with pytest.raises(StoreError, match=rf"'{path}': checking its bucket .*PermissionError"
                                             r".*credentials"):
            model.write().overwrite().save(path)
        with pytest.raises(ModelLoadError, match=rf"'{path}' could not be read \(StoreError"):
            LogisticRegressionModel.load(path)
    assert tuple(LogisticRegressionModel.load(path).coefficients) == tuple(model.coefficients)


def test_an_unreachable_endpoint_is_a_typed_error_naming_the_path(s3, lr_models,
                                                                  monkeypatch):
    import s3fs

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # fail at once, not after botocore's
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)  # and s3fs's retries
    s3fs.S3FileSystem.clear_instance_cache()  # a client for the dead endpoint
    try:
        path = f"s3://{BUCKET}/dead/m"
        with pytest.raises(StoreError, match=rf"'{path}': .*EndpointConnectionError.*endpoint"):
            lr_models[0][0].write().save(path)
        with pytest.raises(ModelLoadError, match=rf"'{path}' could not be read"):
            load_model(path)
    finally:
        s3fs.S3FileSystem.clear_instance_cache()

