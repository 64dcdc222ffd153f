"""Scoring with a trained network on the executors: one pandas UDF per TorchModel.transform,
the network built and loaded once per task, each Arrow batch scored in ``batch_size`` slices.
Classifiers return MLlib's columns (prediction, probability, rawPrediction).

``quantization='int8'``: once per task, after loading the float32 weights, the network's
``nn.Linear`` layers get int8 weights (per output channel) and quantize their input per row at
each call (dynamic quantization), with torchao's ``quantize_`` and
``Int8DynamicActivationInt8WeightConfig``: the API that torch 2.13 names as the successor
when its own ``torch.ao.quantization.quantize_dynamic`` warns it is deprecated. The rest of the
network (activations, other layers) stays float32. Int8 scoring runs on the CPU, also in a
task that has a GPU (no GPU is claimed). A row's output does not depend on the other rows of
its batch, so int8 scores are reproducible.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pandas as pd

from sparkdist.exceptions import ParamError
from sparkdist.launch import gpus
from sparkdist.torchtrain import finetune
from sparkdist.torchtrain.network import build_module

if TYPE_CHECKING:
    from sparkdist.torchtrain.spec import InputField, ScoreSpec

TORCHAO_INSTALL = ("quantization='int8' needs torchao (torch's int8 quantization library): pip "
                   "install 'sparkdist[torch]' (or torchao) on the driver and the executors, or "
                   "score with quantization='none'.")


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
#: With several values per row (an array label, labelCols): ``prediction`` an array, and for
#: ``bce`` each value's probability of 1 and its logit.
_ARRAY_OUTPUT_SCHEMA = {
    "classification": "prediction array<double>, probability array<double>, raw array<double>",
    "regression": "prediction array<double>",
}


def output_schema(task: str, label_width: int) -> str:
    """The scoring UDF's struct: one prediction per row, or an array of ``label_width``."""
    return (_ARRAY_OUTPUT_SCHEMA if label_width else _OUTPUT_SCHEMA)[task]


def predict_udf(spec: ScoreSpec, task: str) -> Any:
    """The scoring UDF: of one features column, or of the typed inputs' columns in
    ``spec.inputs`` order."""
    from pyspark.sql.functions import pandas_udf

    if spec.inputs:
        def predict_typed(batches: Iterator[tuple[pd.Series, ...]]) -> Iterator[pd.DataFrame]:
            yield from predict_batches(spec, batches)

        return pandas_udf(predict_typed,  # type: ignore[call-overload]
                          output_schema(task, spec.label_width))

    def predict(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        yield from predict_batches(spec, batches)

    return pandas_udf(predict, output_schema(task, spec.label_width))  # type: ignore[call-overload]


def predict_batches(spec: ScoreSpec, batches: Any) -> Any:
    """Executor side: load the network once per task (and quantize it, with
    ``spec.quantization == 'int8'``), then score each Arrow batch."""
    import io

    import numpy as np
    import torch

    module = build_module(spec.module, spec.module_kwargs, spec.input_dim, spec.output_dim)
    if spec.adapters is not None:  # the adapters scored alongside their layers
        finetune.add_adapters(module, spec.adapters)
    module.load_state_dict(torch.load(io.BytesIO(spec.weights), weights_only=True))
    if spec.quantization == "int8":
        device = torch.device("cpu")
        module = quantize_int8(module.eval())
    else:
        # The task's assigned GPU when there is one; a model trained with useGpu=True still
        # scores on a CPU-only cluster rather than failing there.
        device = gpus.apply(gpus.plan_for_task("auto" if spec.use_gpu else False))
        module.to(device).eval()
    for batch in batches:
        if spec.inputs:
            rows: Any = typed_rows(spec.inputs, (batch,) if isinstance(batch, pd.Series)
                                   else batch)
        else:
            rows = np.stack(batch.to_numpy()).astype(np.float32) if len(batch) else \
                np.zeros((0, spec.input_dim), np.float32)
        output = score(module, rows, spec.batch_size, spec.output_dim, device, spec.inputs)
        yield pd.DataFrame(_outputs(spec.loss, output.double(), spec.label_width))


def typed_rows(fields: tuple[InputField, ...], series: tuple[pd.Series, ...]) -> dict[str, Any]:
    """A scoring batch's typed inputs as numpy arrays named as the feed names them (a sequence
    cut to ``max_length``, padded to the batch's longest, with its mask); ValueError naming
    the column for a null, a wrong length or a negative id."""
    import numpy as np

    found: dict[str, Any] = {}
    for field, values in zip(fields, series):
        dtype = np.int64 if field.dtype == "int64" else np.float32
        ids = field.dtype == "int64" and (field.sequence or field.width)  # null ids: NaN
        if values.isna().any() or (ids and any(pd.isna(v).any() for v in values)):
            raise ValueError(f"TorchModel: {field.describe()} holds a null (or a null id "
                             f"inside an array); drop or fill it.")
        if field.sequence or field.width:
            arrays = [np.asarray(v, dtype=dtype)[:field.max_length or None] for v in values]
            lengths = np.array([len(a) for a in arrays], np.int64)
            if field.width and (lengths != field.width).any():
                raise ValueError(f"TorchModel: {field.describe()} holds an array of "
                                 f"{lengths[lengths != field.width][0]} values, but the model "
                                 f"takes {field.width} (shape {list(field.shape)}).")
            matrix = np.zeros((len(arrays), max(1, int(lengths.max(initial=0)))), dtype)
            for row, array in enumerate(arrays):
                matrix[row, :len(array)] = array
            if field.sequence:
                found[f"{field.name}_mask"] = np.arange(matrix.shape[1]) < lengths[:, None]
        else:
            matrix = values.to_numpy(dtype=dtype)
        if field.dtype == "int64" and matrix.size and matrix.min() < 0:
            raise ValueError(f"TorchModel: {field.describe()} holds the negative id "
                             f"{matrix.min()}; ids index an embedding table from 0.")
        found[field.name] = matrix
    return found


def score(module: Any, rows: Any, batch_size: int, output_dim: int, device: Any = None,
          fields: tuple[InputField, ...] = ()) -> Any:
    """The network's outputs for a float32 matrix (or the typed inputs' arrays by name,
    :func:`typed_rows`), ``batch_size`` rows at a call, as a CPU tensor of one row per input
    row (no rows are not passed to the network: torchao's int8 layers cannot take zero
    rows)."""
    import numpy as np
    import torch

    from sparkdist.torchtrain.inputs import arguments
    from sparkdist.torchtrain.network import forward, rows_of

    count = rows_of(rows)
    if not count:
        return torch.zeros((0, output_dim))
    outputs = []
    with torch.no_grad():
        for part in np.array_split(np.arange(count), -(-count // batch_size)):
            batch = ({name: torch.from_numpy(values[part]).to(device)
                      for name, values in rows.items()} if fields
                     else torch.from_numpy(rows[part]).to(device))
            outputs.append(forward(module, arguments(batch, fields)).cpu())
    return torch.cat(outputs).reshape(count, -1)


# ----------------------------------------------------------------------- int8 quantization
def quantizable_layers(module: Any) -> list[str]:
    """Names of the layers int8 quantization replaces: the ``nn.Linear`` ones, less the
    ``NonDynamicallyQuantizableLinear`` output projection of attention (torchao skips it)."""
    import torch

    skip = torch.nn.modules.linear.NonDynamicallyQuantizableLinear
    return [name for name, layer in module.named_modules()
            if isinstance(layer, torch.nn.Linear) and not isinstance(layer, skip)]


def check_int8(module: Any, model_name: str) -> None:
    """On the driver, before any task: a network with nothing to quantize, or a missing
    torchao, is a ParamError (quantizing nothing would score float32 under an int8 name)."""
    import importlib.util

    if not quantizable_layers(module):
        raise ParamError(f"quantization='int8' quantizes a network's nn.Linear layers, and "
                         f"model={model_name!r} has none; score it with quantization='none'.")
    if importlib.util.find_spec("torchao") is None:
        raise ParamError(TORCHAO_INSTALL)


def try_int8(module: Any, model_name: str, input_dim: int, output_dim: int,
             fields: tuple[InputField, ...] = ()) -> None:
    """On the driver, before any task: quantize ``module`` (a copy the caller throws away)
    and score two rows of zeros with it, as each task will. torchao refuses some networks
    that have Linear layers (one taking a single input feature: ``Linear(1, n)``); that, or
    anything else failing, is a ParamError here instead of a failure in every task."""
    import torch

    from sparkdist.torchtrain.network import dummy_inputs, forward

    check_int8(module, model_name)
    try:
        with torch.no_grad():
            forward(quantize_int8(module.eval()), dummy_inputs(input_dim, fields))
    except Exception as err:
        single = [name for name in quantizable_layers(module)
                  if getattr(module.get_submodule(name), "in_features", None) == 1]
        hint = (f" (its layer(s) {single} take a single input feature, which torchao's int8 "
                "quantization does not handle)" if single else "")
        raise ParamError(f"quantization='int8' cannot quantize model={model_name!r}{hint}: "
                         f"{type(err).__name__}: {err}. Score it with quantization='none'."
                         ) from err


def quantize_int8(module: Any) -> Any:
    """``module`` (float32, eval mode) with its Linear layers dynamically quantized to int8,
    in place, on the CPU; returned. ParamError when it has no Linear layer."""
    check_int8(module, type(module).__qualname__)
    quantize, config = _torchao()
    # set_inductor_config=False: it would change torch.compile's global settings, and
    # scoring does not compile.
    quantize(module.cpu(), config(set_inductor_config=False))
    return module


def _torchao() -> tuple[Any, Any]:
    """torchao's ``quantize_`` and int8 config, imported without its import-time warnings:
    a CPU build of torch cannot load its CUDA kernels (it logs each), and torch's pytree
    logs a deprecation about torchao's enums; neither affects CPU int8 scoring."""
    import logging

    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    except ImportError as err:
        raise ImportError(TORCHAO_INSTALL) from err
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    return quantize_, Int8DynamicActivationInt8WeightConfig


def state_bytes(module: Any) -> int:
    """Bytes of ``torch.save(module.state_dict())``: a model's size as stored."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    return len(buffer.getvalue())


def _outputs(loss: str, output: Any, label_width: int = 0) -> dict[str, Any]:
    import torch

    if label_width:  # several values per row: arrays
        output = output.reshape(len(output), -1)
        if loss != "bce":
            return {"prediction": list(output.numpy())}
        return {"prediction": list((output > 0).double().numpy()),
                "probability": list(torch.sigmoid(output).numpy()), "raw": list(output.numpy())}
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
