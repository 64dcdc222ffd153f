"""Writes this folder's saved models, checkpoint and expected predictions with the code of
commit 15970eb (run it with that code first on the path; see README.md):

    git archive 15970eb | tar -x -C /tmp/old15970eb
    PYTHONPATH=/tmp/old15970eb python tests/data/legacy_15970eb/make_legacy.py

Everything is tiny: a 4-input MLP, 5 XGBoost trees of depth 3, a 3-column logistic regression.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

HERE = Path(__file__).resolve().parent
#: The settings of the checkpointed TorchEstimator run (the test resumes it with these).
TORCH = {"numWorkers": 2, "epochs": 1, "batchSize": 50, "learningRate": 0.01, "seed": 5,
         "modelKwargs": {"hidden": [8]}, "progress": False, "rendezvousTimeoutSeconds": 60}
RUN_ID = "legacy"
XGB = {"num_workers": 1, "n_estimators": 5, "max_depth": 3, "learning_rate": 0.3}
CHURN_NUMERIC = ["month_interaction_count", "week_interaction_count", "day_interaction_count"]
CHURN_LABEL = "cancelled_within_week"


def nonlinear_rows() -> dict:
    from sparkdist.datasets import make_nonlinear

    pdf = make_nonlinear(200, seed=3, dim=4)
    return {"features": [[float(v) for v in row] for row in pdf["features"]],
            "label": [float(v) for v in pdf["label"]]}


def nonlinear_frame(spark, rows: dict, vector: bool = False):
    """The rows as ``make_nonlinear`` gives them (float32 arrays) and a ``key`` (the row's
    index), in 2 partitions."""
    import numpy as np
    import pandas as pd

    pdf = pd.DataFrame({"key": range(len(rows["label"])),
                        "features": [np.asarray(r, dtype="float32") for r in rows["features"]],
                        "label": np.asarray(rows["label"], dtype="float32")})
    df = spark.createDataFrame(pdf).repartition(2)
    if vector:
        from pyspark.ml.functions import array_to_vector

        df = df.withColumn("features", array_to_vector("features"))
    return df


def scored(model, df, columns: tuple[str, ...]) -> list[dict]:
    """The first 20 rows' outputs, in a stable order (by the row's own features)."""
    from pyspark.ml.functions import vector_to_array

    out = model.transform(df)
    for name in columns:
        if name in ("probability", "rawPrediction"):
            out = out.withColumn(name, vector_to_array(name))
    rows = [row.asDict(recursive=True) for row in out.select("key", *columns).collect()]
    return sorted(rows, key=lambda row: row["key"])[:20]


def main() -> None:
    from pyspark.ml import Pipeline
    from pyspark.sql import functions as F

    import sparkdist
    from sparkdist.datasets import churn
    from sparkdist.features import FeatureAssembler
    from sparkdist.models import LogisticRegression, TorchEstimator, XGBoostClassifier
    from sparkdist.persist import save_model
    from sparkdist.session import get_spark

    assert "old15970eb" in sparkdist.__file__, f"not the old code: {sparkdist.__file__}"
    spark = get_spark(master="local[2]", app_name="legacy-15970eb",
                      conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    for name in ("torch_model", "torch_checkpoints", "xgboost_model", "lr_pipeline"):
        shutil.rmtree(HERE / name, ignore_errors=True)
    rows = nonlinear_rows()
    (HERE / "nonlinear.json").write_text(json.dumps(rows))
    train = nonlinear_frame(spark, rows).cache()
    torch_model = TorchEstimator(checkpointDir=str(HERE / "torch_checkpoints"), runId=RUN_ID,
                                 **TORCH).fit(train)
    save_model(torch_model, str(HERE / "torch_model"))
    expected = {"torch": scored(torch_model, train,
                                ("prediction", "probability")),
                "torch_history": torch_model.history}
    vectors = nonlinear_frame(spark, rows, vector=True)
    xgb = XGBoostClassifier(**XGB).fit(vectors)
    save_model(xgb, str(HERE / "xgboost_model"))
    expected["xgboost"] = scored(xgb, vectors, ("prediction", "probability"))
    churn_df = churn(spark, n=300, seed=1, partitions=2)
    # the 20 rows scored below (by customer_id, as ``scored`` orders them)
    churn_df.orderBy("customer_id").limit(20).toPandas().to_json(HERE / "churn.json",
                                                                 orient="records")
    lr = Pipeline(stages=[FeatureAssembler(numericCols=CHURN_NUMERIC, categoricalCols=["plan"],
                                           labelCol=CHURN_LABEL),
                          LogisticRegression(labelCol=CHURN_LABEL, maxIter=10)])
    lr_model = lr.fit(churn_df)
    save_model(lr_model, str(HERE / "lr_pipeline"))
    expected["lr_pipeline"] = scored(lr_model, churn_df.withColumn("key", F.col("customer_id")),
                                     ("prediction", "probability"))
    commit = subprocess.run(["git", "rev-parse", "--short", "15970eb"], capture_output=True,
                            text=True, cwd=HERE).stdout.strip()
    expected["made_by"] = {"commit": commit, "torch_settings": TORCH, "run_id": RUN_ID}
    (HERE / "expected.json").write_text(json.dumps(expected, sort_keys=True) + "\n")
    spark.stop()


if __name__ == "__main__":
    main()
