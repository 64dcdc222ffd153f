"""Scoring with a trained network on the executors: one Arrow UDF per TorchModel.transform.

Each Python worker builds and loads a network once and keeps it (:mod:`modelcache`, keyed by
the weights' SHA-256), so the UDF carries no weights: a worker that lacks the network reads
them from a broadcast. Arrow batches become tensors without pandas (a features list array is
read in place), a thread decodes the next batch while the network scores this one in
``inferenceBatchSize`` slices (optionally under bf16/fp16 autocast), and the outputs go back
as Arrow. Classifiers return MLlib's columns (prediction, probability, rawPrediction).

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

import pyarrow as pa

from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.launch import gpus
from sparkdist.torchtrain import finetune, modelcache
from sparkdist.torchtrain.network import build_module, load_weights, qualified_name

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


def predict_udf(spec: ScoreSpec, task: str, weights: Any, loads: Any = None) -> Any:
    """The scoring UDF (an Arrow UDF: Arrow batches in and out, no pandas) of one features
    column, or of the typed inputs' columns in ``spec.inputs`` order. ``weights`` is where a
    worker without the network cached reads its state dict: a Broadcast of the bytes, or the
    bytes; ``loads`` an accumulator of :class:`~sparkdist.torchtrain.modelcache.LoadRecord`
    (None: not recorded). The UDF holds ``spec`` pickled, so that a worker that cannot
    unpickle its network class fails with a ModelLoadError, not inside Spark's worker."""
    from pyspark import cloudpickle  # the copy Spark pickles UDFs with (and users register)
    from pyspark.sql.functions import arrow_udf

    payload = cloudpickle.dumps(spec)
    if len(spec.inputs) > 1:
        def predict_typed(batches: Iterator[tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
            yield from predict_batches(payload, batches, weights, loads)

        return arrow_udf(predict_typed,  # type: ignore[call-overload]
                         output_schema(task, spec.label_width))

    def predict(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:  # one column
        yield from predict_batches(payload, ((batch,) for batch in batches), weights, loads)

    return arrow_udf(predict, output_schema(task, spec.label_width))  # type: ignore[call-overload]


def predict_batches(payload: bytes, batches: Iterator[tuple[pa.Array, ...]], weights: Any,
                    loads: Any = None) -> Iterator[pa.Array]:
    """Executor side: the task's network (from this worker's cache, or built and loaded
    once), then each Arrow batch scored while a thread decodes the next."""
    import time

    start = time.perf_counter()
    spec, module, device, hit = task_network(payload, weights)
    if loads is not None:
        loads.add([modelcache.record(hit, time.perf_counter() - start)])
    for rows in prefetched(decoded(spec, batch) for batch in batches):
        output = score(module, rows, spec.batch_size, spec.output_dim, device, spec.inputs,
                       spec.precision)
        yield _outputs(spec.loss, output.double(), spec.label_width)


def task_network(payload: bytes, weights: Any) -> tuple[ScoreSpec, Any, Any, bool]:
    """The spec, the network on its device in eval mode, the device, and whether the network
    came from this worker's cache. ModelLoadError, with the cause, where this Python cannot
    unpickle or build the network."""
    import pickle

    import torch

    try:
        spec: ScoreSpec = pickle.loads(payload)
    except Exception as err:
        raise ModelLoadError(f"TorchModel scoring: this executor's Python cannot unpickle "
                             f"the network's class ({type(err).__name__}: {err}); install "
                             "the module that defines it on the executors (or define it in "
                             "a module cloudpickle sends by value).") from err
    if spec.quantization == "int8":
        device = torch.device("cpu")
    else:
        # The task's assigned GPU when there is one; a model trained with useGpu=True still
        # scores on a CPU-only cluster rather than failing there.
        device = gpus.apply(gpus.plan_for_task("auto" if spec.use_gpu else False))
    key = f"{spec.weights_sha256}:{spec.network_key()}:{device}"
    module, hit = modelcache.network(key, spec.weights_size, spec.cache_bytes,
                                     lambda: _built(spec, weights, device))
    return spec, module, device, hit


def _built(spec: ScoreSpec, weights: Any, device: Any) -> Any:
    import io

    import torch

    data = weights if isinstance(weights, bytes) else weights.value
    try:
        module = build_module(spec.module, spec.module_kwargs, spec.input_dim,
                              spec.output_dim)
        if spec.adapters is not None:  # the adapters scored alongside their layers
            finetune.add_adapters(module, spec.adapters)
        load_weights(module, torch.load(io.BytesIO(data), weights_only=True))
    except Exception as err:
        raise ModelLoadError(f"TorchModel scoring: this executor cannot build the network "
                             f"{qualified_name(spec.module)} with its weights "
                             f"({type(err).__name__}: {err}).") from err
    if spec.quantization == "int8":
        return quantize_int8(module.eval())
    return module.to(device).eval()


def prefetched(items: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """``items``, produced by a thread up to ``depth`` ahead: the next Arrow batch is decoded
    while the network scores this one (numpy and torch release the GIL). An error in the
    thread is raised here; stopping early stops the thread."""
    import queue
    import threading

    ready: queue.Queue[Any] = queue.Queue(depth)
    stop = threading.Event()
    end = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(end)
        except BaseException as err:  # noqa: BLE001 (raised again in the consumer)
            put(_Failed(err))

    threading.Thread(target=produce, daemon=True, name="sparkdist-decode").start()
    try:
        while (item := ready.get()) is not end:
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def decoded(spec: ScoreSpec, columns: tuple[pa.Array, ...]) -> Any:
    """One Arrow batch as the network's input: a float32 ``[rows, input_dim]`` matrix read
    from the features' list array without a copy, or the typed inputs (:func:`typed_rows`)."""
    import numpy as np

    if spec.inputs:
        return typed_rows(spec.inputs, columns)
    features = columns[0]
    if not len(features):
        return np.zeros((0, spec.input_dim), np.float32)
    values = features.flatten().to_numpy(zero_copy_only=False)
    return values.astype(np.float32, copy=False).reshape(len(features), spec.input_dim)


def typed_rows(fields: tuple[InputField, ...], arrays: tuple[pa.Array, ...]) -> dict[str, Any]:
    """A scoring batch's typed inputs (Arrow arrays) as numpy arrays named as the feed names
    them (a sequence cut to ``max_length``, padded to the batch's longest, with its mask);
    ValueError naming the column for a null, a wrong length or a negative id."""
    import numpy as np

    found: dict[str, Any] = {}
    for field, values in zip(fields, arrays):
        dtype = np.int64 if field.dtype == "int64" else np.float32
        several = bool(field.sequence or field.width)
        if values.null_count or (several and values.flatten().null_count):
            raise ValueError(f"TorchModel: {field.describe()} holds a null (or a null id "
                             f"inside an array); drop or fill it.")
        if several:
            matrix, lengths = _padded(values, dtype, field.max_length)
            if field.width and (lengths != field.width).any():
                raise ValueError(f"TorchModel: {field.describe()} holds an array of "
                                 f"{lengths[lengths != field.width][0]} values, but the model "
                                 f"takes {field.width} (shape {list(field.shape)}).")
            if field.sequence:
                found[f"{field.name}_mask"] = np.arange(matrix.shape[1]) < lengths[:, None]
        else:
            matrix = values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        if field.dtype == "int64" and matrix.size and matrix.min() < 0:
            raise ValueError(f"TorchModel: {field.describe()} holds the negative id "
                             f"{matrix.min()}; ids index an embedding table from 0.")
        found[field.name] = matrix
    return found


def _padded(values: pa.Array, dtype: Any, max_length: int) -> tuple[Any, Any]:
    """A list array as a ``[rows, longest]`` matrix of its first ``max_length`` (0: all)
    values per row, zero-padded, and each row's length after the cut."""
    import numpy as np
    import pyarrow.compute as pc

    lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
    if max_length:
        lengths = np.minimum(lengths, max_length)
    flat = values.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    offsets = values.offsets.to_numpy()[:-1] - values.offsets[0].as_py()
    width = max(1, int(lengths.max(initial=0)))
    filled = np.arange(width) < lengths[:, None]
    matrix = np.zeros((len(values), width), dtype)
    matrix[filled] = flat[(offsets[:, None] + np.arange(width))[filled]]
    return matrix, lengths


def score(module: Any, rows: Any, batch_size: int, output_dim: int, device: Any = None,
          fields: tuple[InputField, ...] = (), precision: str = "float32") -> Any:
    """The network's outputs for a float32 matrix (or the typed inputs' arrays by name,
    :func:`typed_rows`), ``batch_size`` rows at a call, as a float32 CPU tensor of one row
    per input row (no rows are not passed to the network: torchao's int8 layers cannot take
    zero rows). ``precision`` 'bf16' or 'fp16': autocast on the network's device; on a GPU
    the rows are copied from pinned memory."""
    import contextlib
    import warnings

    import numpy as np
    import torch

    from sparkdist.torchtrain.inputs import arguments
    from sparkdist.torchtrain.network import forward, rows_of

    count = rows_of(rows)
    if not count:
        return torch.zeros((0, output_dim))
    device = torch.device(device or "cpu")
    pinned = device.type == "cuda"

    def tensor(values: Any) -> Any:
        found = torch.from_numpy(np.ascontiguousarray(values))
        return found.pin_memory().to(device, non_blocking=True) if pinned else found.to(device)

    cast = (contextlib.nullcontext() if precision == "float32"
            else torch.autocast(device.type, dtype=getattr(torch, _DTYPES[precision])))
    outputs = []
    # Arrow's buffers are read-only, and torch warns of that once per array; the network
    # only reads its inputs.
    with torch.no_grad(), cast, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        for first in range(0, count, batch_size):
            part = slice(first, first + batch_size)
            batch = ({name: tensor(values[part]) for name, values in rows.items()} if fields
                     else tensor(rows[part]))
            outputs.append(forward(module, arguments(batch, fields)).float().cpu())
    return torch.cat(outputs).reshape(count, -1)


_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


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


def _outputs(loss: str, output: Any, label_width: int = 0) -> pa.StructArray:
    """The scoring struct of a batch's float64 outputs (see :func:`output_schema`)."""
    import torch

    if label_width:  # several values per row: arrays
        output = output.reshape(len(output), -1)
        if loss != "bce":
            return _struct(prediction=_lists(output))
        return _struct(prediction=_lists((output > 0).double()),
                       probability=_lists(torch.sigmoid(output)), raw=_lists(output))
    if loss == "bce":
        logit = output[:, 0]
        probability = torch.sigmoid(logit)
        return _struct(prediction=(logit > 0).double().numpy(),
                       probability=_lists(torch.stack([1 - probability, probability], 1)),
                       raw=_lists(torch.stack([-logit, logit], 1)))
    if loss == "cross_entropy":
        return _struct(prediction=output.argmax(1).double().numpy(),
                       probability=_lists(torch.softmax(output, 1)), raw=_lists(output))
    return _struct(prediction=output[:, 0].numpy())


def _struct(**columns: Any) -> pa.StructArray:
    return pa.StructArray.from_arrays([pa.array(c) if not isinstance(c, pa.Array) else c
                                       for c in columns.values()], names=list(columns))


def _lists(matrix: Any) -> pa.ListArray:
    """A ``[rows, k]`` tensor as a list<double> array, without a Python object per row."""
    import numpy as np

    rows, width = matrix.shape
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.numpy().reshape(-1)))
