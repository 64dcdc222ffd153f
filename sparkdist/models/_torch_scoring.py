"""TorchModel.transform's driver side (:mod:`sparkdist.torchtrain.inference` is the executor
side): the input columns checked, the scoring spec, and the weights shipped once.

The weights never ride in the UDF: they are hashed (SHA-256) and broadcast once per model and
SparkContext, and a Python worker reads the broadcast only when its cache lacks that hash.
Without a SparkContext (Spark Connect) the bytes travel with the UDF, and each worker still
builds the network once. Each task's load is recorded in an accumulator (classic Spark only):
``TorchModel.scoringLoads``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pyspark.sql import DataFrame

from sparkdist.columns import require_columns
from sparkdist.exceptions import ParamError
from sparkdist.models import _torch_checks as checks
from sparkdist.models import _torch_finetune as tuned
from sparkdist.session import is_connect
from sparkdist.torchtrain import inference, modelcache
from sparkdist.torchtrain.spec import ScoreSpec

OUTPUT = "__sparkdist_out"


def scored(model: Any, dataset: DataFrame) -> DataFrame:
    """``dataset`` with the scoring struct in :data:`OUTPUT`; ``model``: a TorchModel."""
    columns = _input_columns(model, dataset)
    get = model.getOrDefault
    separate = bool(model._info.get("adapter")) and not get("mergeAdapters")
    if separate and get("quantization") == "int8":
        raise ParamError("quantization='int8' with adapters scores the merged network: set "
                         "mergeAdapters=True.")
    sha256, size, source = _shipped(model, dataset, separate)
    module, kwargs = model._network_parts()
    spec = ScoreSpec(module=module, module_kwargs=kwargs, weights_sha256=sha256,
                     weights_size=size,
                     adapters=tuned.adapters_of(model._info) if separate else None,
                     input_dim=int(model._info["input_dim"]),
                     output_dim=int(model._info["output_dim"]), loss=model._loss_kind(),
                     batch_size=get("inferenceBatchSize"), use_gpu=get("useGpu"),
                     quantization=model._quantization(),
                     precision=get("inferencePrecision"),
                     cache_bytes=get("inferenceCacheBytes"), inputs=model.inputFields(),
                     label_width=model.labelWidth)
    loads = None
    if not is_connect(dataset.sparkSession):
        loads = dataset.sparkSession.sparkContext.accumulator([], modelcache.LoadRecords())
    model._loads = loads
    predict = inference.predict_udf(spec, model.task, source, loads)
    return dataset.withColumn(OUTPUT, predict(*columns))


def _input_columns(model: Any, dataset: DataFrame) -> list[Any]:
    """The UDF's argument columns: each typed input, or the features as array<float>;
    checked against the schema (SchemaError naming the column)."""
    fields = model.inputFields()
    if fields:
        require_columns(dataset.schema, [f.column for f in fields], "TorchModel")
        return [checks.input_column(dataset.schema, f) for f in fields]
    require_columns(dataset.schema, model.featureSource(), "TorchModel")
    return [checks.scoring_features(dataset.schema, model.featureSource(), model.inputDim)]


def _shipped(model: Any, dataset: DataFrame, separate: bool) -> tuple[str, int, Any]:
    """The weights' SHA-256, size and source (a Broadcast, or the bytes under Connect),
    made once per model, adapter mode and SparkContext and then reused."""
    sc = None if is_connect(dataset.sparkSession) else dataset.sparkSession.sparkContext
    key = (id(model._weights), separate)
    memo = model._shipped.get(key)
    if memo is None or memo["sc"] is not sc:  # (a new SparkContext is a new object)
        # With adapters: the base with them added (or merged into it), not theirs alone.
        data = inference.weights_bytes(model._trained().state_dict()
                                       if model._info.get("adapter") else model._weights)
        memo = {"sc": sc, "weights": model._weights, "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data), "source": sc.broadcast(data) if sc is not None else data}
        if sc is not None:  # under Connect the bytes are needed at each transform
            model._shipped[key] = memo
    return memo["sha256"], memo["size"], memo["source"]
