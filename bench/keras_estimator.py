"""KerasEstimator (issue 29, "Measure"), every figure from one run on this machine, timed as
bench/_common.py says (wall clock on the driver around the whole fit, the sides alternating;
each side's first call is its cold figure, the median of --repeats after it the warm one).

- digits: scikit-learn's 8x8 digits (64 features), an 80/20 split, 2 workers: the test
  accuracy of a Keras MLP (Dense 64 -> 32 -> 10 softmax, sparse categorical cross-entropy)
  trained by KerasEstimator, target >= 0.97, and of the same-shaped torch MLP trained by
  TorchEstimator on the same split (the reference);
- samples/s of the two fits, Keras over torch, cold and warm (reported);
- 1 worker, 5 steps of the whole data (256 rows, so the row order cannot differ), seed 7:
  the largest weight difference between KerasEstimator's model and a single-process
  ``keras.Model.fit`` on the same batches, with SGD and with Adam, target <= 1e-6 (Adam's
  epsilon enters the update at another place in torch.optim: docs/deep-models.md).

Prints one JSON line; a full run (no --quick) also saves it as bench/results/keras_estimator.json.

    python bench/keras_estimator.py [--quick] [--epochs 30] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

import numpy as np
from _common import cold_and_warm, machine, start_spark, write_result

os.environ.setdefault("KERAS_BACKEND", "torch")

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/models/keras.py", "sparkdist/models/torch.py",
            "sparkdist/models/_torch_checks.py", "sparkdist/torchtrain", "sparkdist/launch")
HIDDEN = [64, 32]


def digits(spark: Any) -> tuple[Any, Any]:
    import pandas as pd
    from sklearn.datasets import load_digits

    data = load_digits()
    df = spark.createDataFrame(pd.DataFrame({"features": list(data.data / 16.0),
                                             "label": data.target.astype(float)}))
    train, test = df.randomSplit([0.8, 0.2], seed=3)
    train = train.repartition(2).cache()
    return train, test.cache()


def estimators(epochs: int) -> dict[str, Any]:
    from sparkdist.models import KerasEstimator, TorchEstimator

    common = {"epochs": epochs, "batchSize": 32, "learningRate": 3e-3, "numWorkers": 2,
              "progress": False, "seed": 3}
    return {"keras": KerasEstimator(model="sparkdist.torchtrain.keras_net.mlp",
                                    modelKwargs={"hidden": HIDDEN, "activation": "softmax"},
                                    loss="sparse_categorical_crossentropy", **common),
            "torch": TorchEstimator(model="sparkdist.torchtrain.nets.MLP",
                                    modelKwargs={"hidden": HIDDEN}, loss="cross_entropy",
                                    **common)}


def accuracy(model: Any, test: Any) -> float:
    return model.transform(test).where("prediction = label").count() / test.count()


def against_keras_fit(spark: Any) -> dict[str, Any]:
    """The largest weight difference after 5 whole-data steps, by optimizer."""
    import keras
    import pandas as pd

    from sparkdist.models import KerasEstimator
    from sparkdist.torchtrain.keras_net import mlp

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (256, 3)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("float32")
    df = spark.createDataFrame(pd.DataFrame({"features": list(x.astype(float)),
                                             "label": y.astype(float)})).repartition(1)
    found = {}
    for name in ("sgd", "adam"):
        ours = KerasEstimator(optimizer=name, epochs=5, batchSize=256, learningRate=0.01,
                              numWorkers=1, seed=7, progress=False).fit(df).keras_model()
        keras.utils.set_random_seed(7)
        reference = mlp(3, 1)
        reference.compile(optimizer=keras.optimizers.get(
            {"class_name": name, "config": {"learning_rate": 0.01}}),
            loss="binary_crossentropy")
        reference.fit(x, y, batch_size=256, epochs=5, shuffle=False, verbose=0)
        difference = max(float(np.abs(a - b).max())
                         for a, b in zip(ours.get_weights(), reference.get_weights()))
        found[name] = {"max_abs_difference": difference, "target": "<= 1e-6",
                       "meets_target": difference <= 1e-6}
    return found


def figures(spark: Any, epochs: int, repeats: int) -> dict[str, Any]:
    train, test = digits(spark)
    rows = train.count()
    cold, warm, last = cold_and_warm({name: (lambda e=estimator: e.fit(train)) for name, estimator
                              in estimators(epochs).items()}, repeats)
    seconds = {"cold": cold, "warm": {k: statistics.median(v) for k, v in warm.items()}}
    speed = {kind: {"keras_samples_per_s": round(rows * epochs / s["keras"]),
                    "torch_samples_per_s": round(rows * epochs / s["torch"]),
                    "ratio": round(s["torch"] / s["keras"], 3)}
             for kind, s in seconds.items()}
    keras_accuracy = accuracy(last["keras"], test)
    return {
        "digits": {"keras_accuracy": round(keras_accuracy, 4),
                   "torch_accuracy": round(accuracy(last["torch"], test), 4),
                   "target": ">= 0.97", "meets_target": keras_accuracy >= 0.97,
                   "definition": f"test accuracy (20% split) of an MLP {HIDDEN} on "
                                 f"scikit-learn's digits, {epochs} epochs, batchSize 32 per "
                                 f"worker, 2 workers, Adam 3e-3"},
        "speed": speed, "against_keras_fit": against_keras_fit(spark),
        "setup": {"rows": rows, "epochs": epochs, "repeats": repeats,
                  "warm_runs_s": {k: [round(s, 3) for s in v] for k, v in warm.items()},
                  "cold_s": {k: round(v, 3) for k, v in cold.items()}},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; nothing saved")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    spark = start_spark("sparkdist-bench-keras-estimator")
    result = figures(spark, 3 if args.quick else args.epochs, 1 if args.quick else args.repeats)
    write_result("keras_estimator", {**result, "machine": machine(spark)}, save=not args.quick)


if __name__ == "__main__":
    main()
