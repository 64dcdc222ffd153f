"""A thin MLflow adapter (the ``mlflow`` extra). Estimators never call it; workflows do.

The tracking URI is, in order: the argument, ``$MLFLOW_TRACKING_URI``, ``databricks`` on a
Databricks runtime, else a sqlite file ``mlruns.db`` in the working directory (artifacts in
``./mlruns``). Models are logged with the ``spark`` flavour: Spark ML's own directory format,
which sparkdist's readers load without unpickling anything.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULT_DB = "mlruns.db"
_LOG = logging.getLogger(__name__)


#: The models whose inputs and signature tracking reads as TorchModel's (KerasModel extends it).
_TORCH_MODELS = ("TorchModel", "KerasModel")
#: The models that read one features vector (``featuresCol``), as MLlib's models do.
_VECTOR_MODELS = ("LogisticRegressionModel", "RandomForestClassificationModel",
                  "RandomForestRegressionModel", "XGBoostClassificationModel",
                  "XGBoostRegressionModel")


def _mlflow() -> Any:
    try:
        import mlflow
        import mlflow.spark  # noqa: F401  (the flavour models are logged with)
    except ImportError:
        raise ImportError('MLflow tracking needs the mlflow extra: pip install "sparkdist[mlflow]"'
                          ) from None
    if not os.environ.get("MLFLOW_LOGGING_LEVEL"):  # MLflow logs INFO unless told otherwise
        logging.getLogger("mlflow").setLevel(logging.WARNING)
    return mlflow


def tracking_uri(uri: str | None = None) -> str:
    if uri:
        return uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return "databricks"
    return f"sqlite:///{Path.cwd() / DEFAULT_DB}"


@contextmanager
def workflow_run(experiment: str, run_name: str, uri: str | None = None,
                 tags: Mapping[str, str] | None = None) -> Iterator[str]:
    """One MLflow run for one workflow fit; yields its run id. Model runs nest inside it."""
    mlflow = _mlflow()
    uri = tracking_uri(uri)
    mlflow.set_tracking_uri(uri)
    if mlflow.get_experiment_by_name(experiment) is None:
        mlflow.create_experiment(experiment, artifact_location=_artifact_root(uri))
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=run_name, tags=dict(tags or {})) as run:
        yield run.info.run_id


def _artifact_root(uri: str) -> str | None:
    """For a sqlite store, artifacts go in ``mlruns/`` beside the database file (MLflow's own
    default is the working directory, wherever that happens to be)."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).parent / "mlruns").resolve().as_uri()


def log_workflow(config: Mapping[str, Any], split: Mapping[str, Any],
                 table: Mapping[str, Mapping[str, float]]) -> None:
    """On the workflow run: the config, the split metadata and each model's metrics."""
    mlflow = _mlflow()
    mlflow.log_dict(dict(config), "config.json")
    mlflow.log_dict(dict(split), "split.json")
    mlflow.log_params(flatten({"split": split}))
    for model, metrics in table.items():
        mlflow.log_metrics(metric_names({f"{model}.{k}": v for k, v in metrics.items()}))


def log_model_run(name: str, params: Mapping[str, Any], metrics: Mapping[str, float],
                  model: Any, features: list[str], figures: Mapping[str, Any],
                  split: Mapping[str, Any], rows: Any = None) -> str:
    """A nested run for one fitted model: params, metrics, features, plots, the model.

    The model is logged with its signature (:func:`_signature`) and, given ``rows`` (a few
    rows of its input data as a pandas DataFrame, any columns), their first 5 in its input
    columns as its input example."""
    import pyspark

    mlflow = _mlflow()

    with mlflow.start_run(run_name=name, nested=True) as run:
        mlflow.log_params(flatten(params))
        mlflow.log_metrics(metric_names(metrics))
        mlflow.log_dict(dict(split), "split.json")
        mlflow.log_dict({"features": features}, "features.json")
        _log_training_summary(mlflow, model)
        for figure_name, figure in figures.items():
            mlflow.log_figure(figure, f"plots/{figure_name}.png")
        # Explicit requirements: inferring them re-loads the model in a subprocess (slow).
        signature = _signature(model, rows)
        mlflow.spark.log_model(model, "model", signature=signature,
                               input_example=_input_example(signature, rows),
                               pip_requirements=[f"pyspark=={pyspark.__version__}", "sparkdist"])
        _log_torch_module(mlflow, model)
        _log_keras_model(mlflow, model)
        return str(run.info.run_id)


def _log_training_summary(mlflow: Any, model: Any) -> None:
    """The final stage's ``trainingSummary`` (TorchModel, XGBoost models) as
    ``training_summary.json``; where the ranks ran also as the ``placement`` param."""
    import json

    from sparkdist.evaluation import final_stage

    summary = getattr(final_stage(model), "trainingSummary", None)
    if not summary:
        return
    mlflow.log_dict(dict(summary), "training_summary.json")
    if summary.get("placement"):
        mlflow.log_param("placement", json.dumps(summary["placement"])[:6000])


def _signature(model: Any, rows: Any = None) -> Any:
    """The Spark model's MLflow signature: one input per column the model reads, typed as its
    stages take it, and its prediction as output; None where a stage's columns are not known
    here (MLflow's pyfunc drops every column a signature does not list).

    Inputs, by stage: a FeatureAssemblerModel reads ``numericCols`` as ``double``,
    ``categoricalCols`` as ``string`` and ``vectorCols`` as ``SparkMLVector`` (the pyfunc
    flavour turns an array into the vector); logistic regression, a random forest and XGBoost
    read ``featuresCol``, a ``SparkMLVector``; ALS reads ``userCol`` and ``itemCol``, ``string``
    or ``long`` as the ids it was fitted on. A TorchModel (or KerasModel) reads each typed input
    (``inputCols``) as ``long`` for int64 ids, ``double`` for float32 values (transform casts
    them to float), ``Array(long)`` for a fixed shape of ids or a variable-length sequence
    (transform cuts and pads it), ``Array(double)`` for a fixed shape of floats (flat:
    transform reshapes it to ``inputShapes``); else ``featuresCol``, a ``SparkMLVector``, or
    each of ``featureCols`` as ``double``. A column an earlier stage writes is no input.

    ``double`` stands for any number: MLflow's pyfunc takes ints of up to 32 bits and floats
    for it but refuses int64 values ("Can not safely convert int64 to float64"), and the Spark
    types a model was fitted on are not saved. So where ``rows`` (a pandas DataFrame of the
    model's input data) holds int64 values in such a column, it is typed ``long`` instead.

    Outputs: ``predictionCol``, ``double`` (``Array(double)`` for a TorchModel of several labels
    per row), alone, also for a classifier: the pyfunc flavour returns that one column, and
    MLflow 3.17's Spark pyfunc converts every ``SparkMLVector`` output of the signature in a
    frame that holds only it (listing ``probability`` fails every ``predict`` with
    UNRESOLVED_COLUMN)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.types.schema import Array

    from sparkdist.evaluation import final_stage

    inputs = _pipeline_inputs(_stages(model), rows)
    if inputs is None:
        return None
    final = final_stage(model)
    several = type(final).__name__ in _TORCH_MODELS and final.labelWidth
    prediction = Array(DataType.double) if several else DataType.double
    outputs = Schema([ColSpec(prediction, final.getOrDefault("predictionCol"))])
    return ModelSignature(inputs=Schema(inputs), outputs=outputs)


def _stages(model: Any) -> list[Any]:
    """The stages of a (nested) PipelineModel in order; a lone model as one stage."""
    from pyspark.ml import PipelineModel

    if isinstance(model, PipelineModel):
        return [stage for inner in model.stages for stage in _stages(inner)]
    return [model]


def _pipeline_inputs(stages: list[Any], rows: Any = None) -> list[Any] | None:
    """ColSpecs of the columns the stages read that no earlier stage writes, in reading
    order, each column once; None where a stage's columns are not known here."""
    import numpy as np
    from mlflow.types import ColSpec, DataType

    found: dict[str, Any] = {}
    written: set[str] = set()
    for stage in stages:
        columns = _stage_columns(stage)
        if columns is None:
            return None
        reads, writes = columns
        for name, kind in reads:
            if name in written or name in found:
                continue
            if (kind == DataType.double and rows is not None and name in rows
                    and rows[name].dtype == np.int64):
                kind = DataType.long
            found[name] = ColSpec(kind, name)
        written.add(writes)
    return list(found.values())


def _stage_columns(stage: Any) -> tuple[list[tuple[str, Any]], str] | None:
    """(column, MLflow type) for each column ``stage`` reads, and the column it writes; None
    for a stage whose columns are not known here. See :func:`_signature`."""
    from mlflow.types import DataType
    from mlflow.types.schema import SparkMLVector

    from sparkdist.features.assembly import FeatureAssemblerModel
    from sparkdist.models.als import ALSModel

    if isinstance(stage, FeatureAssemblerModel):
        kinds: dict[str, Any] = {"numericCols": DataType.double,
                                 "categoricalCols": DataType.string,
                                 "vectorCols": SparkMLVector()}
        return ([(name, kind) for param, kind in kinds.items()
                 for name in stage.getOrDefault(param)], stage.getOrDefault("outputCol"))
    if type(stage).__name__ in _TORCH_MODELS:
        reads = _torch_inputs(stage)
    elif isinstance(stage, ALSModel):
        reads = [_id_input(stage.userFactors, stage.getUserCol()),
                 _id_input(stage.itemFactors, stage.getItemCol())]
    elif type(stage).__name__ in _VECTOR_MODELS:
        reads = [(stage.getOrDefault("featuresCol"), SparkMLVector())]
    else:
        return None
    return reads, stage.getOrDefault("predictionCol")


def _id_input(factors: Any, name: str) -> tuple[str, Any]:
    """An ALS id column, typed as the ids the model was fitted on (its factors' column)."""
    from mlflow.types import DataType
    from pyspark.sql.types import IntegralType, StringType

    kind = factors.schema[name].dataType
    if isinstance(kind, StringType):
        return name, DataType.string
    return name, DataType.long if isinstance(kind, IntegralType) else DataType.double


def _torch_inputs(final: Any) -> list[tuple[str, Any]]:
    """(column, MLflow type) for each column a TorchModel reads: see :func:`_signature`."""
    from mlflow.types import DataType
    from mlflow.types.schema import Array, SparkMLVector

    fields = final.inputFields()
    if not fields:
        source = final.featureSource()
        if final.isSet("featureCols") and final.getOrDefault("featureCols"):
            return [(name, DataType.double) for name in source]
        return [(source[0], SparkMLVector())]
    found = []
    for field in fields:
        kind = DataType.long if field.dtype == "int64" else DataType.double
        found.append((field.column, Array(kind) if field.sequence or field.shape else kind))
    return found


def _input_example(signature: Any, rows: Any) -> Any:
    """The first 5 of ``rows`` in the signature's input columns, ``double`` ones as floats and
    vectors and arrays as lists (what the pyfunc flavour takes); None without rows or where
    they lack an input column."""
    from mlflow.types import DataType

    if signature is None or rows is None:
        return None
    names = signature.inputs.input_names()
    if not set(names) <= set(rows.columns):
        return None
    example = rows[names].head(5).copy()
    for spec in signature.inputs.inputs:
        if spec.type == DataType.double:
            example[spec.name] = example[spec.name].astype("float64")
        elif not isinstance(spec.type, DataType):  # a SparkMLVector or an Array
            example[spec.name] = example[spec.name].map(_as_list)
    return example


def _as_list(value: Any) -> Any:
    """An ML vector or an array cell (a numpy array from Arrow) as a list."""
    value = value.toArray() if hasattr(value, "toArray") else value
    return value.tolist() if hasattr(value, "tolist") else value


def _log_torch_module(mlflow: Any, model: Any) -> None:
    """A TorchModel's network also goes in as ``torch_model`` with the pytorch flavour
    (torch.export's pt2 format: no pickle; a 4-row example keeps the batch size dynamic).
    A TorchModel with ``quantization='int8'`` (its Spark model then scores in int8 too) also
    gets ``torch_model_int8``: the network with its Linear layers dynamically quantized, as
    ``module()`` returns it; loading it needs torchao.

    A network with typed inputs (``inputCols``) is exported with its tensors as positional
    arguments in the order ``forward`` declares them: MLflow's pt2 export takes a tuple of
    example tensors, not keywords. Its signature names them in that order (a sequence's
    ``<arg>_mask`` too; a sequence's length stays dynamic), and the loaded module takes them
    by position, ``mlflow.pytorch.load_model(uri)(user, item)`` (the exported graph refuses
    keywords: "kwarg keyword mismatch"). With one input the signature leaves its name out, so
    that the pyfunc flavour scores a numpy array (with a name, MLflow hands the network a dict
    it refuses); with several, MLflow writes no pyfunc flavour. A network whose typed
    arguments are not the first positional parameters of ``forward`` (keyword-only ones,
    ``**kwargs``) is logged as a Spark model only."""
    from sparkdist.evaluation import final_stage

    final = final_stage(model)
    if type(final).__name__ != "TorchModel":
        return
    import torch

    int8 = final.getOrDefault("quantization") == "int8"
    fp32 = (final.copy({final.quantization: "none"}) if int8 else final).module()
    example = _example(fp32, final.inputDim, final.inputFields())
    if isinstance(example, str):
        _LOG.info("the network is logged as a Spark model only, not also with the pytorch "
                  "flavour: %s", example)
        return
    requirements = [f"torch=={torch.__version__}"]
    _log_network(mlflow, fp32, example, "torch_model", requirements)
    if int8:
        from importlib.metadata import version

        _log_network(mlflow, final.module(), example, "torch_model_int8",
                     [*requirements, f"torchao=={version('torchao')}"])


def _log_keras_model(mlflow: Any, model: Any) -> None:
    """A KerasModel's trained ``keras.Model`` also goes in as ``keras_model`` with MLflow's
    keras flavour (Keras' own ``.keras`` archive, loaded by Keras in safe mode)."""
    from sparkdist.evaluation import final_stage

    final = final_stage(model)
    if type(final).__name__ != "KerasModel":
        return
    import keras
    import mlflow.keras

    mlflow.keras.log_model(final.keras_model(), name="keras_model",
                           pip_requirements=[f"keras=={keras.__version__}"])


def _example(network: Any, input_dim: int, fields: tuple[Any, ...]) -> Any:
    """The export's example, 4 rows of zeros: a ``[4, input_dim]`` array for the features
    layout; for typed inputs ``{argument: (array, TensorSpec shape)}`` in ``forward``'s order
    (a sequence and its mask 2 tokens long and of dynamic length), or, as a str, why the
    network cannot be exported with positional inputs."""
    import inspect

    from sparkdist.torchtrain.network import dummy_inputs

    inputs = dummy_inputs(input_dim, fields, rows=4)
    if not fields:
        return inputs.numpy()
    found = {}
    for name, tensor in inputs.items():
        value = tensor.numpy()
        found[name] = (value, (-1, *value.shape[1:]))
    for field in fields:
        length = min(2, field.max_length or 2)
        for name in (field.arg, f"{field.arg}_mask"):
            if field.sequence and name in found:
                found[name] = (found[name][0][:, :1].repeat(length, 1),
                               (-1, -1 if length > 1 else 1))
    parameters = inspect.signature(network.forward).parameters.values()
    positional = [p.name for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:len(found)]
    if sorted(positional) != sorted(found):
        return (f"{type(network).__qualname__}.forward takes {sorted(found)} other than as "
                f"its first positional parameters, and MLflow's pt2 export passes them by "
                f"position")
    return {name: found[name] for name in positional}


def _log_network(mlflow: Any, network: Any, example: Any, name: str,
                 requirements: list[str]) -> None:
    """``network`` with the pytorch flavour (pt2), exported with ``example`` (see
    :func:`_example`); MLflow infers a features network's signature from its array."""
    import mlflow.pytorch

    signature = None
    if isinstance(example, dict):
        from mlflow.models import ModelSignature
        from mlflow.types import Schema, TensorSpec

        one = len(example) == 1
        signature = ModelSignature(inputs=Schema([
            TensorSpec(value.dtype, shape, None if one else key)
            for key, (value, shape) in example.items()]))
        example = [value for value, _ in example.values()]
        example = example[0] if one else example
    mlflow.pytorch.log_model(network, name=name, input_example=example, signature=signature,
                             serialization_format="pt2", pip_requirements=requirements)


def load_model(run_id: str, uri: str | None = None) -> Any:
    """The Spark model logged by :func:`log_model_run` (a PipelineModel), read by
    :func:`sparkdist.persist.load_model` and its class allowlist (``mlflow.spark.load_model``
    imports whatever class the files name)."""
    from sparkdist.persist import load_model as load_stage

    mlflow = _mlflow()
    mlflow.set_tracking_uri(tracking_uri(uri))
    return load_stage(mlflow.artifacts.download_artifacts(f"runs:/{run_id}/model/sparkml"))


def metric_names(metrics: Mapping[str, float]) -> dict[str, float]:
    """MLflow allows no '@' in names: precision@10 is logged as precision_at_10."""
    return {name.replace("@", "_at_"): value for name, value in metrics.items()}


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{'split': {'seed': 1}} -> {'split.seed': '1'}; values cut to MLflow's length limit."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:6000]
    return flat
