"""The Spark Connect scenarios, run as their own driver (the test session already holds a
classic local[2] session, which a Connect server in the same process would clash with):

    python tests/connect/connect_driver.py WORKDIR

starts ONE local Spark Connect server (``get_spark(remote="local[2]")``), runs every scenario
against it and prints one JSON line: per scenario, its figures or the error it raised.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

ROOT = Path(__file__).resolve().parents[2]
LABEL = "cancelled_within_week"
# The ratings sample's id columns; 2 blocks, not MLlib's 10, for 60 users x 30 items (on 2
# cores the 10 blocks' tasks cost about 5 s per fit and transform, and prove nothing more).
COLS = {"userCol": "user_id", "itemCol": "item_id", "numUserBlocks": 2, "numItemBlocks": 2}


def classification(spark: Any, work: Path) -> dict[str, Any]:
    """FeatureAssembler + split + LR and RF: fit, transform, evaluate, save, load, same
    predictions."""
    from pyspark.ml import Pipeline, PipelineModel

    from sparkdist.datasets import CHURN_COUNTS, churn
    from sparkdist.evaluation import evaluate
    from sparkdist.features import FeatureAssembler, split
    from sparkdist.models import LogisticRegression, RandomForestClassifier

    parts = split(churn(spark, n=3000, seed=7, partitions=2),
                  {"train": 0.8, "test": 0.2}, method="stratified", labelCol=LABEL,
                  keyCols=["customer_id"], seed=42)
    train, test = parts["train"], parts["test"]
    out: dict[str, Any] = {"counts": parts.metadata["counts"]}
    for name, estimator in (("lr", LogisticRegression(labelCol=LABEL, maxIter=10)),
                            ("rfc", RandomForestClassifier(labelCol=LABEL, numTrees=5,
                                                           maxDepth=3, seed=1))):
        assembler = FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan"],
                                     labelCol=LABEL)
        model = Pipeline(stages=[assembler, estimator]).fit(train)
        metrics = evaluate(model, test)
        path = str(work / f"model-{name}")
        model.save(path)
        loaded = PipelineModel.load(path)

        def rows(m: Any) -> list[tuple]:
            return sorted(tuple(r) for r in m.transform(test)
                          .select("customer_id", "prediction").collect())

        out[name] = {"auc": metrics["auc"], "same_predictions": rows(model) == rows(loaded),
                     "final_stage": type(loaded.stages[-1]).__name__}
    return out


def workflow(spark: Any, work: Path) -> dict[str, Any]:
    """sparkdist.workflows.run: the churn config with LR (RF: see classification), the model
    saved, MLflow off."""
    import yaml

    from sparkdist import workflows
    from sparkdist.config import parse_config

    raw = yaml.safe_load((ROOT / "jobs" / "configs" / "churn.yaml").read_text())
    raw["data"] = {"path": str(ROOT / raw["data"]["path"])}
    raw["models"] = [m for m in raw["models"] if m["type"] == "LogisticRegression"]
    raw["tracking"] = {"enabled": False}
    raw["output"] = {"modelDir": str(work / "workflow-models")}
    result = workflows.run(parse_config(raw), spark=spark, progress=lambda _: None)
    return {"metrics": {m.name: m.metrics for m in result.models},
            "saved": sorted(p.name for p in (work / "workflow-models").iterdir())}


def torch_fit(spark: Any, work: Path) -> dict[str, Any]:
    """A 2-worker TorchEstimator fit (progress reports on), transform, save and load."""
    from sparkdist.datasets import make_nonlinear
    from sparkdist.models import TorchEstimator, TorchModel

    train = spark.createDataFrame(make_nonlinear(2000, 1)).repartition(2)
    test = spark.createDataFrame(make_nonlinear(500, 2))
    started = time.monotonic()
    model = TorchEstimator(numWorkers=2, epochs=3, seed=11, progress=False, batchSize=128,
                           learningRate=0.01, modelKwargs={"hidden": [32, 16]}).fit(train)
    seconds = time.monotonic() - started
    accuracy = model.transform(test).where("prediction = label").count() / 500
    path = str(work / "torch-model")
    model.write().save(path)
    loaded = TorchModel.load(path)
    before = [r[0] for r in model.transform(test).select("probability").collect()]
    after = [r[0] for r in loaded.transform(test).select("probability").collect()]
    return {"losses": [epoch["loss"] for epoch in model.history], "accuracy": accuracy,
            "fit_s": round(seconds, 1), "same_after_load": before == after}


def keras_mlp(input_dim: int) -> Any:
    import keras

    inputs = keras.Input((input_dim,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))


def keras_fit(spark: Any, work: Path) -> dict[str, Any]:
    """A 2-worker KerasEstimator fit, transform, save and load."""
    from sparkdist.datasets import make_nonlinear
    from sparkdist.models import KerasEstimator, KerasModel

    train = spark.createDataFrame(make_nonlinear(2000, 1)).repartition(2)
    test = spark.createDataFrame(make_nonlinear(500, 2))
    model = KerasEstimator(model=keras_mlp, numWorkers=2, epochs=6, seed=11, progress=False,
                           batchSize=64, learningRate=0.01).fit(train)
    accuracy = model.transform(test).where("prediction = label").count() / 500
    path = str(work / "keras-model")
    model.write().save(path)
    loaded = KerasModel.load(path)
    before = [r[0] for r in model.transform(test).select("probability").collect()]
    after = [r[0] for r in loaded.transform(test).select("probability").collect()]
    return {"losses": [epoch["loss"] for epoch in model.history], "accuracy": accuracy,
            "same_after_load": before == after}


def torch_bounded_retries(spark: Any, work: Path) -> dict[str, Any]:
    """maxRetries=1 with a fault that fires every attempt: bounded from the failure reports."""
    from sparkdist.datasets import make_nonlinear
    from sparkdist.failpoints import arm
    from sparkdist.models import TorchEstimator

    data = spark.createDataFrame(make_nonlinear(1000, 3)).repartition(2)
    estimator = arm(
        TorchEstimator(numWorkers=2, epochs=2, maxRetries=1, progress=False, seed=5,
                       checkpointDir=str(work / "ckpt"), rendezvousTimeoutSeconds=60),
        str(work), rank=1, epoch=1, step=0, times=4)
    estimator.fit(data)
    return {"third_attempt": (work / "fired-3.pid").exists()}


def _sleeping_worker(context: Any, batches: Any, args: dict[str, Any]) -> bytes:
    """Reports once, then sleeps past the job timeout (pickled by value: this file runs as
    __main__)."""
    context.report({"rank": context.rank, "hello": True})
    time.sleep(args["sleep_s"])
    return b"done"


def barrier_timeout(spark: Any, work: Path) -> dict[str, Any]:
    """run_barrier's job timeout cancels a stuck stage through the session job tag."""
    from sparkdist.exceptions import TrainingError
    from sparkdist.launch.barrier import run_barrier

    reports: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        run_barrier(spark.range(4), _sleeping_worker, {"sleep_s": 120}, 2, timeout_s=6,
                    on_report=reports.append)
    except TrainingError as err:
        return {"message": str(err)[:500], "seconds": round(time.monotonic() - started, 1),
                "reports": reports}
    return {"message": None}


def als(spark: Any, work: Path) -> dict[str, Any]:
    """ALS: checkpointing refuses with a clear error (no checkpoint dir on this server);
    without checkpoints it fits, scores, saves and loads."""
    from sparkdist.datasets import ratings
    from sparkdist.exceptions import ClusterConfigError
    from sparkdist.models import ALS, ALSModel

    data = ratings(spark, n_users=60, n_items=30, partitions=2)
    try:
        ALS(rank=2, maxIter=2, **COLS).fit(data)
        refused = None
    except ClusterConfigError as err:
        refused = str(err)
    model = ALS(rank=2, maxIter=4, checkpointInterval=-1, seed=1, **COLS).fit(data)
    path = str(work / "als-model")
    model.write().save(path)
    loaded = ALSModel.load(path)

    def rows(m: Any) -> list[tuple]:
        return sorted(tuple(r) for r in m.transform(data).collect())

    return {"refused": refused, "same_after_load": rows(model) == rows(loaded),
            "rows": len(rows(model))}


def xgboost_fit(spark: Any, work: Path) -> dict[str, Any]:
    from sparkdist.datasets import CHURN_COUNTS, churn
    from sparkdist.features import FeatureAssembler
    from sparkdist.models import XGBoostClassifier

    df = FeatureAssembler(numericCols=CHURN_COUNTS, labelCol=LABEL).fit(
        churn(spark, n=500)).transform(churn(spark, n=500))
    XGBoostClassifier(labelCol=LABEL, num_workers=2, n_estimators=5).fit(df)
    return {"fitted": True}


SCENARIOS: dict[str, Callable[[Any, Path], dict[str, Any]]] = {
    "classification": classification, "workflow": workflow, "torch": torch_fit,
    "torch_bounded": torch_bounded_retries, "timeout": barrier_timeout, "als": als,
    "xgboost": xgboost_fit, "keras": keras_fit,
}


def main(argv: list[str]) -> int:
    from sparkdist.session import get_spark, is_connect

    work = Path(argv[0])
    wanted = argv[1:] or list(SCENARIOS)
    started = time.monotonic()
    spark = get_spark(remote="local[2]", conf={"spark.ui.enabled": "false",
                                               "spark.sql.shuffle.partitions": "2"})
    results: dict[str, Any] = {"is_connect": is_connect(spark),
                               "start_s": round(time.monotonic() - started, 1)}
    for name in wanted:
        began = time.monotonic()
        (work / name).mkdir(parents=True, exist_ok=True)
        try:
            results[name] = {"ok": SCENARIOS[name](spark, work / name)}
        except Exception as err:
            results[name] = {"error": type(err).__name__, "message": str(err)[:3000],
                             "where": traceback.format_exc()[-1500:]}
        results[name]["seconds"] = round(time.monotonic() - began, 1)
    # No spark.stop(): the script must end on its own once its last line has run (issue 19).
    results["last_line_at"] = time.time()
    print(json.dumps(results, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
