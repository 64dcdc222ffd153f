"""The 2-worker TorchEstimator training test, run as its own driver on any master.

    python tests/cluster/torch_fit.py local-cluster[2,1,1024]

Prints one JSON line: per-epoch losses, test accuracy, majority-class rate, the executors
registered. With one core per executor, the 2 barrier tasks run in 2 executor JVMs. Then the
same fit again with checkpoints, rank 1's Python worker SIGKILLed in epoch 3: whether it
resumed, and whether it ended with the uninterrupted fit's weights.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

from sparkdist.datasets import make_nonlinear  # noqa: E402
from sparkdist.failpoints import arm  # noqa: E402
from sparkdist.models import TorchEstimator  # noqa: E402
from sparkdist.session import get_spark  # noqa: E402

SETTINGS = {"numWorkers": 2, "epochs": 8, "seed": 11, "progress": False, "batchSize": 128,
            "learningRate": 0.01, "modelKwargs": {"hidden": [32, 16]}}


def main(master: str) -> None:
    spark = get_spark(master=master, app_name="sparkdist-torch-fit",
                      conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    train = spark.createDataFrame(make_nonlinear(4000, 1)).repartition(2).cache()
    test = spark.createDataFrame(make_nonlinear(1000, 2)).repartition(2).cache()
    model = TorchEstimator(**SETTINGS).fit(train)
    scored = model.transform(test)
    positives = test.where("label = 1").count()
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
    print(json.dumps({
        "losses": [epoch["loss"] for epoch in model.history],
        "accuracy": scored.where("prediction = label").count() / test.count(),
        "majority": max(positives, test.count() - positives) / test.count(),
        "block_managers": status.size(),  # the driver's and one per executor
        "world_size": model.trainingSummary["world_size"], **killed_and_resumed(train, model)}))
    spark.stop()


def killed_and_resumed(train, uninterrupted) -> dict:
    import torch

    with tempfile.TemporaryDirectory() as work:
        estimator = TorchEstimator(checkpointDir=os.path.join(work, "ckpt"), **SETTINGS)
        model = arm(estimator, work, rank=1, epoch=3, step=5, action="kill").fit(train)
        fired = os.path.exists(os.path.join(work, "fired-1.pid"))
    ours, theirs = model.module().state_dict(), uninterrupted.module().state_dict()
    return {"fault_fired": fired, "resumed_from_epoch": model.trainingSummary["resumed_from_epoch"],
            "resumed_same_weights": all(torch.equal(ours[k], theirs[k]) for k in ours)}


if __name__ == "__main__":
    main(sys.argv[1])
