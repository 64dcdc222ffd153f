"""strategy='pipeline' on 4 workers (2 stages x 2 data-parallel replicas), run as its own
driver, since the suite's shared session has 2 task slots:

    python tests/cluster/pipeline_fit.py local[4]

Prints one JSON line: ddp's and the pipeline's per-epoch losses and test accuracy on the same
data, each rank's state MiB, and a second pipeline fit with checkpoints whose rank 3 (stage
1 of replica 1) is SIGKILLed in epoch 2: whether it resumed, and whether it ended with the
uninterrupted fit's weights.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402

from sparkdist.datasets import make_nonlinear  # noqa: E402
from sparkdist.failpoints import arm  # noqa: E402
from sparkdist.models import TorchEstimator  # noqa: E402
from sparkdist.session import get_spark  # noqa: E402

SETTINGS = {"numWorkers": 4, "epochs": 3, "seed": 11, "progress": False, "batchSize": 32,
            "learningRate": 0.01, "modelKwargs": {"hidden": [64, 64, 64]},
            "validationFraction": 0.2, "rendezvousTimeoutSeconds": 120}
PIPELINE = {"strategy": "pipeline", "pipelineStages": 2, "microBatches": 2}


def _accuracy(model, df) -> float:
    return model.transform(df).where("prediction = label").count() / df.count()


def main(master: str) -> None:
    spark = get_spark(master=master, app_name="sparkdist-pipeline-fit",
                      conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"})
    train = spark.createDataFrame(make_nonlinear(4000, 1)).repartition(4).cache()
    test = spark.createDataFrame(make_nonlinear(1000, 2)).repartition(4).cache()
    ddp = TorchEstimator(**SETTINGS).fit(train)
    with tempfile.TemporaryDirectory() as clean, tempfile.TemporaryDirectory() as killed:
        pipeline = TorchEstimator(checkpointDir=clean, checkpointEverySteps=5, **PIPELINE,
                                  **SETTINGS).fit(train)
        estimator = arm(TorchEstimator(checkpointDir=f"{killed}/ckpt", checkpointEverySteps=5,
                                       **PIPELINE, **SETTINGS),
                        killed, rank=3, epoch=2, step=7, action="kill")
        resumed = estimator.fit(train)
        fired = os.path.exists(f"{killed}/fired-1.pid")
    first, second = pipeline.module().state_dict(), resumed.module().state_dict()
    print(json.dumps({
        "world_size": pipeline.trainingSummary["world_size"],
        "ddp_losses": [epoch["loss"] for epoch in ddp.history],
        "pipeline_losses": [epoch["loss"] for epoch in pipeline.history],
        "ddp_accuracy": _accuracy(ddp, test), "pipeline_accuracy": _accuracy(pipeline, test),
        "ddp_state_mb": [rank["state_mb"] for rank in ddp.trainingSummary["ranks"]],
        "pipeline_state_mb": [rank["state_mb"] for rank in pipeline.trainingSummary["ranks"]],
        "fault_fired": fired,
        "resumed_from": [resumed.trainingSummary["resumed_from_epoch"],
                         resumed.trainingSummary["resumed_from_step"]],
        "resumed_losses": [epoch["loss"] for epoch in resumed.history],
        "resumed_same_weights": first.keys() == second.keys() and all(
            torch.equal(first[name], second[name]) for name in first),
    }))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "local[4]")
