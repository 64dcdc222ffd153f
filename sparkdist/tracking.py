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
        mlflow.spark.log_model(model, "model",
                               pip_requirements=[f"pyspark=={pyspark.__version__}", "sparkdist"])
        _log_torch_module(mlflow, model)
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


def _log_torch_module(mlflow: Any, model: Any) -> None:
    """A TorchModel's network also goes in as ``torch_model`` with the pytorch flavour
    (torch.export's pt2 format: no pickle; a 4-row example keeps the batch size dynamic).
    A TorchModel with ``quantization='int8'`` (its Spark model then scores in int8 too) also
    gets ``torch_model_int8``: the network with its Linear layers dynamically quantized, as
    ``module()`` returns it; loading it needs torchao. A network with typed inputs
    (``inputCols``) is not logged this way (not built yet)."""
    from sparkdist.evaluation import final_stage

    final = final_stage(model)
    if type(final).__name__ != "TorchModel":
        return
    if final.inputFields():  # the pt2 export takes one example tensor, not keyword inputs
        _LOG.info("a TorchModel with typed inputs (inputCols) is logged as a Spark model only, "
                  "not also with the pytorch flavour")
        return
    import torch

    requirements = [f"torch=={torch.__version__}"]
    if final.getOrDefault("quantization") != "int8":
        _log_network(mlflow, final.module(), final.inputDim, "torch_model", requirements)
        return
    from importlib.metadata import version

    fp32 = final.copy({final.quantization: "none"}).module()
    _log_network(mlflow, fp32, final.inputDim, "torch_model", requirements)
    _log_network(mlflow, final.module(), final.inputDim, "torch_model_int8",
                 [*requirements, f"torchao=={version('torchao')}"])


def _log_network(mlflow: Any, network: Any, input_dim: int, name: str,
                 requirements: list[str]) -> None:
    import mlflow.pytorch
    import numpy as np

    example = np.zeros((4, input_dim), dtype=np.float32)
    mlflow.pytorch.log_model(network, name=name, input_example=example,
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
