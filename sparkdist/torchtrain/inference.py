"""Scoring with a trained network on the executors: one pandas UDF per TorchModel.transform,
the network built and loaded once per task, each Arrow batch scored in ``batch_size`` slices.
Classifiers return MLlib's columns (prediction, probability, rawPrediction)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd

from sparkdist.launch import gpus
from sparkdist.torchtrain import loop


def weights_bytes(weights: dict[str, Any]) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(weights, buffer)
    return buffer.getvalue()


_OUTPUT_SCHEMA = {
    "classification": "prediction double, probability array<double>, raw array<double>",
    "regression": "prediction double",
}


def predict_udf(spec: dict[str, Any], task: str) -> Any:
    from pyspark.sql.functions import pandas_udf

    def predict(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        yield from predict_batches(spec, batches)

    return pandas_udf(predict, _OUTPUT_SCHEMA[task])  # type: ignore[call-overload]


def predict_batches(spec: dict[str, Any], batches: Any) -> Any:
    """Executor side: load the network once per task, then score each Arrow batch."""
    import io

    import numpy as np
    import torch

    module = loop.build_module(spec["module"], spec["module_kwargs"],
                               spec["input_dim"], spec["output_dim"])
    module.load_state_dict(torch.load(io.BytesIO(spec["weights"]), weights_only=True))
    # The task's assigned GPU when there is one; a model trained with useGpu=True still scores
    # on a CPU-only cluster rather than failing there.
    device = gpus.apply(gpus.plan_for_task("auto" if spec["use_gpu"] else False))
    module.to(device).eval()
    for series in batches:
        matrix = np.stack(series.to_numpy()).astype(np.float32) if len(series) else \
            np.zeros((0, spec["input_dim"]), np.float32)
        with torch.no_grad():
            output = torch.cat([module(torch.from_numpy(part).to(device)).cpu() for part in
                                np.array_split(matrix, max(1, -(-len(matrix) //
                                                              spec["batch_size"])))])
        yield pd.DataFrame(_outputs(spec["loss"], output.reshape(len(matrix), -1).double()))


def _outputs(loss: str, output: Any) -> dict[str, Any]:
    import torch

    if loss == "bce":
        logit = output[:, 0]
        probability = torch.sigmoid(logit)
        return {"prediction": (logit > 0).double().numpy(),
                "probability": list(torch.stack([1 - probability, probability], 1).numpy()),
                "raw": list(torch.stack([-logit, logit], 1).numpy())}
    if loss == "cross_entropy":
        return {"prediction": output.argmax(1).double().numpy(),
                "probability": list(torch.softmax(output, 1).numpy()),
                "raw": list(output.numpy())}
    return {"prediction": output[:, 0].numpy()}
