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
                  split: Mapping[str, Any]) -> str:
    """A nested run for one fitted model: params, metrics, features, plots, the model."""
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
        mlflow.spark.log_model(model, "model", signature=_signature(model),
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


def _signature(model: Any) -> Any:
    """The Spark model's MLflow signature where its final stage is a TorchModel (else None):
    one input per column the model reads, typed as ``TorchModel.transform`` takes it, and its
    prediction as output.

    Inputs: a typed input's column (``inputCols``) is ``long`` for int64 ids, ``double`` for
    float32 values (transform casts them to float), ``Array(long)`` for a fixed shape of ids or
    a variable-length sequence (transform cuts and pads it), ``Array(double)`` for a fixed
    shape of floats (flat: transform reshapes it to ``inputShapes``); in the features layout
    ``featuresCol`` is a ``SparkMLVector`` (the pyfunc flavour turns an array into the vector)
    and each of ``featureCols`` is ``double``. Where a FeatureAssemblerModel earlier in the
    pipeline builds the vector, the model reads that stage's columns instead: ``numericCols``
    ``double``, ``categoricalCols`` ``string``, ``vectorCols`` ``SparkMLVector``. A pipeline
    with any other stage before the TorchModel gets no signature: its inputs are not known
    here, and MLflow's pyfunc drops every column a signature does not list. (The Spark types
    a model was fitted on are not saved: ``double`` stands for any non-integer number, and
    MLflow's pyfunc refuses int64 values for it, "Can not safely convert int64 to float64".)
    Outputs: ``predictionCol``, ``double`` (``Array(double)`` for a model of several labels per
    row), alone, also for a classifier: the pyfunc flavour
    returns that one column, and MLflow 3.17's Spark pyfunc converts every ``SparkMLVector``
    output of the signature in a frame that holds only it (listing ``probability`` fails
    every ``predict`` with UNRESOLVED_COLUMN)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.types.schema import Array

    from sparkdist.evaluation import final_stage

    final = final_stage(model)
    if type(final).__name__ not in _TORCH_MODELS:
        return None
    inputs = _pipeline_inputs(_stages(model))
    if inputs is None:
        return None
    prediction = Array(DataType.double) if final.labelWidth else DataType.double
    outputs = Schema([ColSpec(prediction, final.getOrDefault("predictionCol"))])
    return ModelSignature(inputs=Schema(inputs), outputs=outputs)


def _stages(model: Any) -> list[Any]:
    """The stages of a (nested) PipelineModel in order; a lone model as one stage."""
    from pyspark.ml import PipelineModel

    if isinstance(model, PipelineModel):
        return [stage for inner in model.stages for stage in _stages(inner)]
    return [model]


def _pipeline_inputs(stages: list[Any]) -> list[Any] | None:
    """ColSpecs of the columns the stages read that no earlier stage writes, in reading
    order, each column once; None where a stage's columns are not known here."""
    from mlflow.types import ColSpec, DataType
    from mlflow.types.schema import SparkMLVector

    from sparkdist.features.assembly import FeatureAssemblerModel

    found: dict[str, Any] = {}
    written: set[str] = set()
    for stage in stages:
        if isinstance(stage, FeatureAssemblerModel):
            kinds: dict[str, Any] = {"numericCols": DataType.double,
                                     "categoricalCols": DataType.string,
                                     "vectorCols": SparkMLVector()}
            reads = [(name, kind) for param, kind in kinds.items()
                     for name in stage.getOrDefault(param)]
            writes = stage.getOrDefault("outputCol")
        elif type(stage).__name__ in _TORCH_MODELS:
            reads, writes = _torch_inputs(stage), stage.getOrDefault("predictionCol")
        else:
            return None
        for name, kind in reads:
            if name not in written and name not in found:
                found[name] = ColSpec(kind, name)
        written.add(writes)
    return list(found.values())


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
