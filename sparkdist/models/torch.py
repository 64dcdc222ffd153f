"""PyTorch models as Spark ML Estimators: data-parallel training inside one Spark barrier
stage, batched inference on the executors.

:class:`TorchEstimator` ``.fit(df)`` checks the input and the cluster on the driver, then runs
:func:`sparkdist.torchtrain.loop.fit_worker` in ``numWorkers`` barrier tasks (torch
DistributedDataParallel, or Horovod), each streaming its partition from a local Arrow file.
Rank 0 sends every epoch's metrics to the driver while it trains (a progress bar; the history
lands on the model) and returns the weights as bytes. :class:`TorchModel` ``.transform``
adds ``prediction`` (and for classifiers ``probability``/``rawPrediction`` vectors, as MLlib
classifiers do) through a pandas UDF, so Spark's evaluators and ``sparkdist.evaluation`` work
unchanged. A model saves its Params and history as JSON and its weights as a ``torch.save``d
state dict, loaded with ``weights_only=True``; the network class is stored by qualified name.

The ``model`` and ``loss`` Params hold names. A class or function given in code is stored by
its qualified name and recorded in this process (:func:`sparkdist.torchtrain.loop.to_name`), so
``setParams``, ``copy`` and CrossValidator grids train the class asked for. Before anything is
called, the driver resolves ``model`` to an ``nn.Module`` subclass and ``loss`` to a built-in
loss, an ``nn.Module`` loss class or a function given in code, and ships the resolved objects
to the executors (a class cloudpickle sends by value, e.g. from ``__main__`` or a module
registered with ``register_pickle_by_value``, needs no import there). Anything else
is a ParamError at fit, transform and ``module()``; ``TorchModel.load`` (and so
``persist.load_model``) refuses a ``model`` that does not resolve with a ModelLoadError. Names
are looked up only in modules this process has already imported (or sparkdist's own): a module
named only in a Param is never imported.

Examples
--------
>>> from pyspark.ml import Pipeline
>>> from sparkdist.features import FeatureAssembler
>>> pipeline = Pipeline(stages=[
...     FeatureAssembler(numericCols=["month_interaction_count", "week_interaction_count"],
...                      categoricalCols=["plan"], labelCol="cancelled_within_week",
...                      standardize=True),
...     TorchEstimator(model="sparkdist.torchtrain.nets.MLP", modelKwargs={"hidden": [16]},
...                    labelCol="cancelled_within_week", loss="bce", epochs=2, numWorkers=2)])
>>> model = pipeline.fit(train)
>>> history = model.stages[-1].history  # one record per epoch
>>> len(history), sorted(history[-1])
(2, ['epoch', 'epochs', 'loss', 'seconds'])
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasRawPredictionCol,
    HasSeed,
)
from pyspark.ml.util import MLReader
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, NumericType, StructType

from sparkdist import failpoints
from sparkdist.columns import col, require_columns, suggest
from sparkdist.exceptions import ModelLoadError, ParamError, SchemaError
from sparkdist.launch import gpus
from sparkdist.launch.barrier import BarrierSettings, run_barrier
from sparkdist.launch.preflight import preflight
from sparkdist.models._classification import stable_seed
from sparkdist.models._recovery import HasRecovery, content_hash, data_identity
from sparkdist.persist import ParamsPersistence, PersistentModel
from sparkdist.torchtrain import loop

_LOG = logging.getLogger(__name__)
WEIGHTS_FILE = "weights.pt"
USE_GPU = ("auto", True, False)
NAN_POLICIES = ("error", "drop")
#: The TorchEstimator Params in the resume fingerprint (with the data identity).
_TRAJECTORY_PARAMS = ("model", "modelKwargs", "loss", "optimizer", "learningRate",
                      "weightDecay", "batchSize", "epochs", "seed", "numWorkers", "backend",
                      "validationFraction", "earlyStoppingPatience", "numClasses", "nanPolicy")


def _use_gpu(value: Any) -> Any:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


class _TorchParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol,
                   HasRawPredictionCol):
    """Params shared by TorchEstimator and TorchModel."""

    featureCols: Param[list[str]] = Param(
        Params._dummy(), "featureCols",
        "numeric columns to use as the features instead of featuresCol (a vector or array)",
        typeConverter=TypeConverters.toListString)
    model: Param[str] = Param(
        Params._dummy(), "model",
        "the nn.Module subclass, or its qualified name 'package.module.Class' in a module "
        "this process has imported (a class given is stored by its name)",
        typeConverter=loop.to_name)
    modelKwargs: Param[dict] = Param(
        Params._dummy(), "modelKwargs",
        "JSON-able constructor arguments of the model; input_dim/output_dim are filled in "
        "from the data when the constructor takes them")
    loss: Param[str] = Param(
        Params._dummy(), "loss",
        f"{sorted(loop.LOSSES)}, an nn.Module loss class, or a function (output, label) -> "
        "per-row losses (a class or function given is stored by its name)",
        typeConverter=loop.to_name)
    batchSize: Param[int] = Param(
        Params._dummy(), "batchSize", "global batch size (split across workers), >= 1",
        typeConverter=TypeConverters.toInt)
    useGpu: Param[Any] = Param(
        Params._dummy(), "useGpu",
        "'auto' (the GPU Spark assigned to the task, when there is one), True or False",
        typeConverter=_use_gpu)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(featuresCol="features", labelCol="label", predictionCol="prediction",
                         probabilityCol="probability", rawPredictionCol="rawPrediction",
                         model="sparkdist.torchtrain.nets.MLP", modelKwargs={}, loss="bce",
                         batchSize=256, useGpu="auto")

    def featureSource(self) -> list[str]:
        """The column(s) features come from."""
        if self.isSet("featureCols") and self.getOrDefault("featureCols"):
            return list(self.getOrDefault("featureCols"))
        return [self.getOrDefault("featuresCol")]


class TorchEstimator(Estimator, _TorchParams, HasSeed, HasRecovery, ParamsPersistence):
    """Train a PyTorch network data-parallel on ``numWorkers`` Spark tasks.

    Parameters
    ----------
    model : an ``nn.Module`` subclass, or its qualified name in a module this process has
        imported (default: sparkdist's MLP).
    modelKwargs : JSON-able constructor arguments.
    loss : 'bce' (binary labels 0/1, one output), 'cross_entropy' (class indices 0..k-1,
        k outputs), 'mse' (regression), an ``nn.Module`` class whose instance (made without
        arguments) returns per-row losses, or such a function itself.
    optimizer, learningRate, weightDecay : the torch.optim optimizer by name and its settings.
    batchSize : global batch size; each step averages the loss over this many rows in all.
    epochs : passes over the training rows.
    numWorkers : barrier tasks (data-parallel ranks); at most the cluster's task slots.
    backend : 'torch' (DistributedDataParallel, gloo/NCCL) or 'horovod'.
    validationCol / validationFraction : rows held out for per-epoch validation metrics.
    earlyStoppingPatience : stop after this many epochs without a better validation loss
        (0: off) and keep the best epoch's weights.
    seed : the same seed and numWorkers give the same weights (the default is the same in
        every process).
    checkpointDir, checkpointEvery, keepCheckpoints : rank 0 saves the training state every
        ``checkpointEvery`` epochs (and at the end) under ``checkpointDir/runId``, keeping
        the newest ``keepCheckpoints``. When Spark retries the training stage after a failure
        (lost executor, crashed worker), every rank resumes from the latest checkpoint.
    runId, resume : a fit with the runId of an interrupted one resumes it when every
        setting and the data match, and refuses a mismatch before launch; with the default
        resume='auto' a completed run is trained again from scratch ('never': always from
        scratch; 'required': continue or fail). Two concurrent fits of one runId: the second
        is refused.
    maxRetries : retries of the failed training stage before the fit fails with the last
        failure's cause.

    Examples
    --------
    >>> est = TorchEstimator(labelCol="cancelled_within_week", loss="cross_entropy",
    ...                      modelKwargs={"hidden": [16, 8]}, epochs=1, numWorkers=1,
    ...                      validationFraction=0.1)
    >>> model = est.fit(assembled_train)
    >>> sorted(model.history[-1])  # validation metrics from the held-out 10%
    ['epoch', 'epochs', 'loss', 'seconds', 'val_accuracy', 'val_loss']
    >>> model.transform(assembled_test).columns[-3:]
    ['prediction', 'rawPrediction', 'probability']
    """

    optimizer: Param[str] = Param(Params._dummy(), "optimizer",
                                  f"one of {sorted(loop.OPTIMIZERS)}",
                                  typeConverter=TypeConverters.toString)
    learningRate: Param[float] = Param(Params._dummy(), "learningRate", "learning rate, > 0",
                                       typeConverter=TypeConverters.toFloat)
    weightDecay: Param[float] = Param(Params._dummy(), "weightDecay", "L2 penalty, >= 0",
                                      typeConverter=TypeConverters.toFloat)
    epochs: Param[int] = Param(Params._dummy(), "epochs", "passes over the data, >= 1",
                               typeConverter=TypeConverters.toInt)
    numWorkers: Param[int] = Param(Params._dummy(), "numWorkers",
                                   "number of data-parallel tasks, >= 1",
                                   typeConverter=TypeConverters.toInt)
    backend: Param[str] = Param(Params._dummy(), "backend", "'torch' or 'horovod'",
                                typeConverter=TypeConverters.toString)
    validationCol: Param[str] = Param(Params._dummy(), "validationCol",
                                      "boolean column: true marks validation rows",
                                      typeConverter=TypeConverters.toString)
    validationFraction: Param[float] = Param(
        Params._dummy(), "validationFraction",
        "fraction of rows held out for validation by a seeded hash split, in [0, 1)",
        typeConverter=TypeConverters.toFloat)
    earlyStoppingPatience: Param[int] = Param(
        Params._dummy(), "earlyStoppingPatience",
        "epochs without a better validation loss before stopping; 0 turns it off",
        typeConverter=TypeConverters.toInt)
    numClasses: Param[int] = Param(Params._dummy(), "numClasses",
                                   "classes for cross_entropy; 0 infers max(label) + 1",
                                   typeConverter=TypeConverters.toInt)
    nanPolicy: Param[str] = Param(Params._dummy(), "nanPolicy",
                                  "rows with NaN/inf/null features or label: 'error' or 'drop'",
                                  typeConverter=TypeConverters.toString)
    timeoutSeconds: Param[float] = Param(Params._dummy(), "timeoutSeconds",
                                         "cancel the fit after this long, > 0",
                                         typeConverter=TypeConverters.toFloat)
    rendezvousTimeoutSeconds: Param[float] = Param(
        Params._dummy(), "rendezvousTimeoutSeconds",
        "longest wait for all workers to start, and for any one collective",
        typeConverter=TypeConverters.toFloat)
    progress: Param[bool] = Param(Params._dummy(), "progress",
                                  "show a progress bar on the driver",
                                  typeConverter=TypeConverters.toBoolean)
    allowUnencrypted: Param[bool] = Param(
        Params._dummy(), "allowUnencrypted",
        "train on a cluster with Spark authentication/encryption on although the gradient "
        "traffic between workers (gloo, NCCL, Horovod) is not encrypted",
        typeConverter=TypeConverters.toBoolean)

    @keyword_only
    def __init__(self, *, model: Any = None, modelKwargs: dict | None = None,
                 featuresCol: str = "features", featureCols: list[str] | None = None,
                 labelCol: str = "label", predictionCol: str = "prediction",
                 probabilityCol: str = "probability", rawPredictionCol: str = "rawPrediction",
                 loss: str = "bce", optimizer: str = "adam", learningRate: float = 1e-3,
                 weightDecay: float = 0.0, batchSize: int = 256, epochs: int = 10,
                 numWorkers: int = 1, useGpu: Any = "auto", backend: str = "torch",
                 validationCol: str | None = None, validationFraction: float = 0.0,
                 earlyStoppingPatience: int = 0, numClasses: int = 0,
                 nanPolicy: str = "error", seed: int | None = None,
                 timeoutSeconds: float = 86400.0, rendezvousTimeoutSeconds: float = 300.0,
                 progress: bool = True, checkpointDir: str | None = None,
                 checkpointEvery: int = 1, keepCheckpoints: int = 3, runId: str | None = None,
                 resume: str = "auto", maxRetries: int = 3,
                 allowUnencrypted: bool = False) -> None:
        super().__init__()
        self._setDefault(optimizer="adam", learningRate=1e-3, weightDecay=0.0, epochs=10,
                         numWorkers=1, backend="torch", validationFraction=0.0,
                         earlyStoppingPatience=0, numClasses=0, nanPolicy="error",
                         timeoutSeconds=86400.0, rendezvousTimeoutSeconds=300.0,
                         progress=True, allowUnencrypted=False,
                         seed=stable_seed(type(self).__name__))
        self.setParams(**self._input_kwargs)  # type: ignore[attr-defined]

    @keyword_only
    def setParams(self, **kwargs: Any) -> TorchEstimator:
        """Set Params by name; ``model`` and ``loss`` may be a class or function (stored by
        its qualified name)."""
        return self._set(**{k: v for k, v in kwargs.items() if v is not None})

    def _fit(self, dataset: DataFrame) -> TorchModel:
        self._check_params()
        code = {"module": loop.resolve_model(self.getOrDefault("model")),
                "loss_fn": loop.resolve_loss(self.getOrDefault("loss"))}
        checkpoint_dir, run_id = self.checkpoint_location(dataset.sparkSession)
        prepared = self._prepare(dataset)
        stats = self._check_data(prepared, identity=checkpoint_dir is not None)
        spec = {**self._spec(stats), **code, "checkpoint_dir": checkpoint_dir,
                "run_id": run_id}
        self._check_model(spec)
        preflight(dataset.sparkSession, spec["num_workers"], use_gpu=spec["use_gpu"],
                  allow_unencrypted=self.getOrDefault("allowUnencrypted"))
        fingerprint = self._fingerprint(dataset, stats) if checkpoint_dir else {}
        with self.guarded_run(checkpoint_dir, run_id, fingerprint, "epochs") as run:
            payload = self._run(prepared, spec)
            state, header = loop.unpack_result(payload)
            if run is not None:
                run.complete(len(header["history"]))
        model = TorchModel._fitted(state, {**header, **_model_state(spec)})
        self._copyValues(model)
        return model

    # --- validation: Params, then schema (in _prepare), then one pass over the data
    def _check_params(self) -> None:
        get = self.getOrDefault
        for name, low in (("batchSize", 1), ("epochs", 1), ("numWorkers", 1),
                          ("earlyStoppingPatience", 0), ("numClasses", 0)):
            if get(name) < low:
                raise ParamError(f"{name}={get(name)}: use {low} or more.")
        for name in ("learningRate", "timeoutSeconds", "rendezvousTimeoutSeconds"):
            if not get(name) > 0:
                raise ParamError(f"{name}={get(name)}: use a positive number.")
        if get("weightDecay") < 0 or not 0 <= get("validationFraction") < 1:
            raise ParamError("weightDecay must be >= 0 and validationFraction in [0, 1); got "
                             f"{get('weightDecay')} and {get('validationFraction')}.")
        _one_of("optimizer", get("optimizer"), loop.OPTIMIZERS)
        _one_of("nanPolicy", get("nanPolicy"), NAN_POLICIES)
        _one_of("useGpu", get("useGpu"), USE_GPU)
        from sparkdist.torchtrain.backends import BACKENDS, HOROVOD_INSTALL, horovod_available

        _one_of("backend", get("backend"), BACKENDS)
        if get("backend") == "horovod" and not horovod_available():
            raise ParamError(f"backend='horovod': {HOROVOD_INSTALL}")
        if get("earlyStoppingPatience") and not self._has_validation():
            raise ParamError("earlyStoppingPatience needs validation rows: set "
                             "validationFraction or validationCol.")

    def _has_validation(self) -> bool:
        return self.isSet("validationCol") or self.getOrDefault("validationFraction") > 0

    def _prepare(self, dataset: DataFrame) -> DataFrame:
        """Columns ``features`` (array<float>), ``label`` (float), ``is_validation``."""
        label = self.getOrDefault("labelCol")
        columns = self.featureSource() + [label]
        if self.isSet("validationCol"):
            columns.append(self.getOrDefault("validationCol"))
        require_columns(dataset.schema, columns, "TorchEstimator")
        features = features_array(dataset.schema, self.featureSource())
        _check_numeric(dataset.schema, label, "labelCol")
        return dataset.select(features.alias("features"),
                              col(label).cast("float").alias("label"),
                              self._validation_flag(dataset, features).alias("is_validation"))

    def _validation_flag(self, dataset: DataFrame, features: Any) -> Any:
        if self.isSet("validationCol"):
            name = self.getOrDefault("validationCol")
            if not isinstance(dataset.schema[name].dataType, BooleanType):
                raise SchemaError(f"validationCol: column '{name}' has type "
                                  f"{dataset.schema[name].dataType.simpleString()}; it must be "
                                  f"boolean (true marks validation rows).")
            return F.coalesce(col(name), F.lit(False))
        fraction = self.getOrDefault("validationFraction")
        # a seeded hash of the row: the same rows are held out on every run and retry
        bucket = F.abs(F.xxhash64(features, F.lit(self.getOrDefault("seed")))) % 10**6
        return bucket < F.lit(int(fraction * 10**6)) if fraction else F.lit(False)

    def _check_data(self, prepared: DataFrame, identity: bool = False) -> dict[str, Any]:
        """One Spark job: rows, vector lengths, bad values, label range; with ``identity``
        also the content hash of the rows (the resume fingerprint's data identity)."""
        extra = [content_hash("features", "label", "is_validation")] if identity else []
        stats = prepared.agg(*_data_aggregates(), *extra).collect()[0].asDict()
        source = ", ".join(self.featureSource())
        if stats["rows"] == 0:
            raise SchemaError("TorchEstimator got an empty DataFrame; there is nothing to train.")
        if stats["min_dim"] != stats["max_dim"]:
            raise SchemaError(f"featuresCol: rows of '{source}' have between {stats['min_dim']} "
                              f"and {stats['max_dim']} values; every row needs the same length "
                              f"(assemble them with FeatureAssembler).")
        if stats["bad_rows"] and self.getOrDefault("nanPolicy") == "error":
            raise SchemaError(f"{stats['bad_rows']} of {stats['rows']} rows have NaN, infinite or "
                              f"null values in '{source}' or the label "
                              f"'{self.getOrDefault('labelCol')}'; clean them, impute them "
                              f"(FeatureAssembler nullPolicy='impute') or set nanPolicy='drop'.")
        good = stats["rows"] - (stats["bad_rows"] or 0)
        if self.getOrDefault("batchSize") > good:
            raise ParamError(f"batchSize={self.getOrDefault('batchSize')} exceeds the {good} "
                             f"usable rows; lower batchSize.")
        self._check_labels(stats)
        return stats

    def _check_labels(self, stats: dict[str, Any]) -> None:
        loss, label = self.getOrDefault("loss"), self.getOrDefault("labelCol")
        if loss not in ("bce", "cross_entropy"):
            return
        if stats["fractional"] or stats["min_label"] < 0 or (
                loss == "bce" and stats["max_label"] > 1):
            allowed = "0 and 1" if loss == "bce" else "class indices 0..k-1"
            hint = (" For more than 2 classes use loss='cross_entropy'." if loss == "bce"
                    and not stats["fractional"] else "")
            raise SchemaError(f"labelCol: '{label}' holds values from {stats['min_label']} to "
                              f"{stats['max_label']}, but loss='{loss}' needs {allowed}.{hint}")
        classes = self.getOrDefault("numClasses")
        if loss == "cross_entropy" and classes and stats["max_label"] >= classes:
            raise ParamError(f"numClasses={classes} but labelCol '{label}' reaches "
                             f"{stats['max_label']:.0f}; raise numClasses or leave it 0.")

    def _fingerprint(self, dataset: DataFrame, stats: dict[str, Any]) -> dict[str, Any]:
        """What decides the training trajectory, by Param name, plus the data's identity: a
        run resumes only when all of it matches (useGpu and the checkpoint Params do not
        count, so a run may resume on other hardware)."""
        columns = self.featureSource() + [self.getOrDefault("labelCol")]
        if self.isSet("validationCol"):
            columns.append(self.getOrDefault("validationCol"))
        return {**{name: self.getOrDefault(name) for name in _TRAJECTORY_PARAMS},
                "validationCol": self.getOrDefault("validationCol")
                if self.isSet("validationCol") else None,
                **data_identity(dataset.select(*columns).schema, stats)}

    def _spec(self, stats: dict[str, Any]) -> dict[str, Any]:
        """Every Param the executors need, as plain values (never ``self``)."""
        get = self.getOrDefault
        loss = get("loss")
        classes = get("numClasses") or (int(stats["max_label"]) + 1 if loss == "cross_entropy"
                                        else 2 if loss == "bce" else 0)
        return {"module_name": get("model"),
                "module_kwargs": dict(get("modelKwargs") or {}), "loss": loss,
                "optimizer": get("optimizer"), "learning_rate": get("learningRate"),
                "weight_decay": get("weightDecay"), "batch_size": get("batchSize"),
                "epochs": get("epochs"), "seed": get("seed") % 2**31, "backend": get("backend"),
                "use_gpu": get("useGpu"), "patience": get("earlyStoppingPatience"),
                "num_workers": get("numWorkers"), "input_dim": int(stats["max_dim"]),
                "num_classes": classes, "output_dim": loop.output_width(loss, classes),
                "drop_bad_rows": get("nanPolicy") == "drop",
                "checkpoint_every": get("checkpointEvery"),
                "keep_checkpoints": get("keepCheckpoints"),
                "failpoint": failpoints.armed(self)}

    def _check_model(self, spec: dict[str, Any]) -> None:
        """Build the network on the driver and run two rows of zeros through it."""
        import torch

        try:
            module = loop.build_module(spec["module"], spec["module_kwargs"], spec["input_dim"],
                                       spec["output_dim"])
            module.eval()
            with torch.no_grad():
                output = module(torch.zeros(2, spec["input_dim"]))
        except Exception as err:
            raise ParamError(f"model={spec['module_name']!r} with modelKwargs="
                             f"{spec['module_kwargs']} fails on input of shape "
                             f"(2, {spec['input_dim']}): {type(err).__name__}: {err}") from err
        width = int(math.prod(output.shape[1:])) if output.dim() > 1 else 1
        if output.shape[0] != 2 or width != spec["output_dim"]:
            raise ParamError(f"model={spec['module_name']!r} returns shape "
                             f"{tuple(output.shape)} for 2 rows, but loss='{spec['loss']}' "
                             f"needs {spec['output_dim']} output(s) per row; set the model's "
                             f"output size (modelKwargs) to {spec['output_dim']}.")

    def _run(self, prepared: DataFrame, spec: dict[str, Any]) -> bytes:
        if spec.pop("drop_bad_rows"):
            prepared = prepared.where(_good_row())
        get = self.getOrDefault
        settings = BarrierSettings(rendezvous_timeout_s=get("rendezvousTimeoutSeconds"),
                                   collective_timeout_s=get("rendezvousTimeoutSeconds"),
                                   env=_local_env(prepared))
        description = (f"sparkdist TorchEstimator: {spec['epochs']} epochs on "
                       f"{spec['num_workers']} workers")
        with _Progress(spec["epochs"], enabled=get("progress")) as progress:
            return run_barrier(prepared, loop.fit_worker, spec, spec["num_workers"],
                               settings=settings, timeout_s=get("timeoutSeconds"),
                               description=description, on_report=progress.update,
                               max_retries=get("maxRetries"))


class TorchModel(Model, _TorchParams, PersistentModel):
    """A trained network; ``transform`` adds predictions computed on the executors.

    Attributes
    ----------
    history : one dict per epoch (loss, and val_loss/val_accuracy with validation).
    task : 'classification' or 'regression' (from the loss).
    """

    def __init__(self) -> None:
        super().__init__()
        self._weights: dict[str, Any] = {}
        self._info: dict[str, Any] = {}

    @classmethod
    def _fitted(cls, weights: dict[str, Any], info: dict[str, Any]) -> TorchModel:
        model = cls()
        model._weights, model._info = weights, info
        return model

    @property
    def history(self) -> list[dict[str, Any]]:
        return list(self._info.get("history", []))

    @property
    def trainingSummary(self) -> dict[str, Any]:
        """How the fit ran: rows, validation_rows, steps_per_epoch, world_size, best_epoch,
        spill_seconds (rank 0 reading its partition from Spark into the local feed file),
        run_id, resumed_from_epoch (the checkpoint it continued from, or None) and placement
        (each rank's executor id and host: ``[{"rank": 0, "executor_id": "1", "host": ...}]``)."""
        keys = ("rows", "validation_rows", "steps_per_epoch", "world_size", "best_epoch",
                "spill_seconds", "run_id", "resumed_from_epoch", "placement")
        return {key: self._info.get(key) for key in keys}

    @property
    def task(self) -> str:
        return loop.task_of_loss(self.getOrDefault("loss"))

    @property
    def inputDim(self) -> int:
        """Features per row the network takes."""
        return int(self._info["input_dim"])

    @property
    def numClasses(self) -> int:
        return int(self._info.get("num_classes", 0))

    def module(self) -> Any:
        """The trained ``nn.Module`` (in eval mode), for use outside Spark."""
        module = loop.build_module(loop.resolve_model(self.getOrDefault("model")),
                                   self.getOrDefault("modelKwargs") or {},
                                   self._info["input_dim"], self._info["output_dim"])
        module.load_state_dict(self._weights)
        return module.eval()

    def _transform(self, dataset: DataFrame) -> DataFrame:
        require_columns(dataset.schema, self.featureSource(), "TorchModel")
        features = self._checked_features(dataset.schema)
        spec = {"module": loop.resolve_model(self.getOrDefault("model")),
                "module_kwargs": self.getOrDefault("modelKwargs") or {},
                "loss": self.getOrDefault("loss"), "weights": _weights_bytes(self._weights),
                "input_dim": self._info["input_dim"], "output_dim": self._info["output_dim"],
                "batch_size": self.getOrDefault("batchSize"),
                "use_gpu": self.getOrDefault("useGpu")}
        scored = dataset.withColumn("__sparkdist_out", _predict_udf(spec, self.task)(features))
        return self._output_columns(scored).drop("__sparkdist_out")

    def _checked_features(self, schema: StructType) -> Any:
        """The features as array<float>, each row checked to hold ``inputDim`` numbers.

        A width the schema already tells (numeric columns, a vector column with ML attribute
        metadata, e.g. FeatureAssembler's) is checked now: SchemaError. Otherwise scoring is
        lazy, so a null or wrong-length row stops the job that reaches it, with this message
        (Spark's USER_RAISED_EXCEPTION) rather than a failure inside the network."""
        columns, dim = self.featureSource(), int(self._info["input_dim"])
        source = ", ".join(f"'{c}'" for c in columns)
        fix = ("score the columns the model was fitted on, assembled the same way (the same "
               "FeatureAssemblerModel), with nulls imputed or dropped")
        width = len(columns) if len(columns) > 1 else (
            1 if isinstance(schema[columns[0]].dataType, NumericType)
            else schema[columns[0]].metadata.get("ml_attr", {}).get("num_attrs"))
        if width is not None and width != dim:
            raise SchemaError(f"featuresCol: {source} holds {width} features per row, but this "
                              f"TorchModel was trained on {dim}; {fix}.")
        features = features_array(schema, columns)
        size = F.size(features).cast("string")
        return (F.when(features.isNull() | F.exists(features, lambda v: v.isNull()),
                       F.raise_error(F.lit(f"TorchModel: a row of featuresCol {source} is null "
                                           f"or holds a null; {fix}.")))
                .when(F.size(features) != dim,
                      F.raise_error(F.concat(F.lit(f"TorchModel: a row of featuresCol {source} "
                                                   "holds "), size,
                                             F.lit(f" values, but the model was trained on "
                                                   f"{dim}; {fix}."))))
                .otherwise(features))

    def _output_columns(self, scored: DataFrame) -> DataFrame:
        from pyspark.ml.functions import array_to_vector

        out = F.col("__sparkdist_out")
        scored = scored.withColumn(self.getOrDefault("predictionCol"), out["prediction"])
        if self.task == "classification":
            for param, field in (("rawPredictionCol", "raw"), ("probabilityCol", "probability")):
                if self.getOrDefault(param):
                    scored = scored.withColumn(self.getOrDefault(param),
                                               array_to_vector(out[field]))
        return scored

    # --- persistence: Params + history as JSON, weights as a torch state dict
    @classmethod
    def read(cls) -> MLReader:
        """The strict reader, and then the loaded ``model`` must name an ``nn.Module``
        subclass: a tampered directory fails here (ModelLoadError), before any use."""
        reader = super().read()
        load = reader.load

        def checked(path: str) -> TorchModel:
            model = load(path)
            try:
                loop.resolve_model(model.getOrDefault("model"))
            except ParamError as err:
                raise ModelLoadError(f"'{path}': {err}") from err
            return model

        reader.load = checked  # type: ignore[method-assign]
        return reader

    def _state(self) -> dict[str, Any]:
        return self._info

    def _save_artifacts(self, path: str) -> None:
        from sparkdist import store

        name = self.getOrDefault("model")
        if name.startswith("__main__."):
            _LOG.warning("model=%r is defined in a notebook or script (__main__): %s loads only "
                         "in a process that defines it again; to load it anywhere, move the "
                         "class into a module and import it before loading.", name, path)
        store.write_bytes(f"{path}/{WEIGHTS_FILE}", _weights_bytes(self._weights))

    @classmethod
    def _from_state(cls, state: dict[str, Any], path: str) -> TorchModel:
        import io

        import torch

        from sparkdist import store

        missing = sorted({"input_dim", "output_dim"} - set(state))
        if missing:  # read lazily by transform and module(): refuse now, not as a KeyError
            raise ModelLoadError(f"'{path}': the saved model state lacks {missing}; the "
                                 "directory is incomplete or was edited. Save the model again.")
        try:
            raw = store.read_bytes(f"{path}/{WEIGHTS_FILE}")
            weights = torch.load(io.BytesIO(raw), weights_only=True)
        except Exception as err:
            raise ModelLoadError(f"{path}: cannot read {WEIGHTS_FILE} as a torch state dict "
                                 f"({err}).") from err
        return cls._fitted(weights, state)


# ----------------------------------------------------------------------------- helpers
def features_array(schema: StructType, columns: list[str]) -> Any:
    """The features as one array<float> column: from a vector, an array or numeric columns."""
    from pyspark.ml.functions import vector_to_array

    if len(columns) > 1:
        for name in columns:
            _check_numeric(schema, name, "featureCols")
        return F.array(*[col(name).cast("float") for name in columns])
    name = columns[0]
    dtype = schema[name].dataType
    if isinstance(dtype, VectorUDT):
        return vector_to_array(col(name), "float32")
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, NumericType):
        return col(name).cast("array<float>")
    if isinstance(dtype, NumericType):
        return F.array(col(name).cast("float"))
    raise SchemaError(f"featuresCol: column '{name}' has type {dtype.simpleString()}; use an "
                      f"ML vector, an array of numbers, or numeric columns in featureCols "
                      f"(FeatureAssembler builds a vector from any columns).")


def _check_numeric(schema: StructType, name: str, param: str) -> None:
    if not isinstance(schema[name].dataType, NumericType):
        raise SchemaError(f"{param}: column '{name}' has type "
                          f"{schema[name].dataType.simpleString()}; it must be numeric "
                          f"(index string labels with FeatureAssembler(labelCol=...)).")


def _one_of(param: str, value: Any, allowed: Any) -> None:
    if value not in tuple(allowed):
        raise ParamError(f"{param}={value!r} is not one of {sorted(map(str, allowed))}."
                         f"{suggest(str(value), [str(a) for a in allowed])}")


def _bad_value(column: Any) -> Any:
    return column.isNull() | F.isnan(column) | (F.abs(column) == F.lit(float("inf")))


def _good_row() -> Any:
    return ~(F.col("features").isNull() | F.exists("features", _bad_value)
             | _bad_value(F.col("label")))


def _data_aggregates() -> list[Any]:
    label = F.col("label")
    good_label = F.when(~_bad_value(label), label)
    return [F.count(F.lit(1)).alias("rows"),
            F.min(F.size("features")).alias("min_dim"),
            F.max(F.size("features")).alias("max_dim"),
            F.count_if(~_good_row()).alias("bad_rows"),
            F.min(good_label).alias("min_label"), F.max(good_label).alias("max_label"),
            F.count_if(good_label != F.floor(good_label)).alias("fractional")]


def _local_env(df: DataFrame) -> dict[str, str]:
    """In local modes the executors share this host: pass on the loopback choice for gloo."""
    import os

    master = df.sparkSession.conf.get("spark.master", "") or ""
    names = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    if not master.startswith("local"):
        return {}
    return {name: os.environ[name] for name in names if name in os.environ}


def _model_state(spec: dict[str, Any]) -> dict[str, Any]:
    return {key: spec[key] for key in ("input_dim", "output_dim", "num_classes", "run_id")}


def _weights_bytes(weights: dict[str, Any]) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(weights, buffer)
    return buffer.getvalue()


_OUTPUT_SCHEMA = {
    "classification": "prediction double, probability array<double>, raw array<double>",
    "regression": "prediction double",
}


def _predict_udf(spec: dict[str, Any], task: str) -> Any:
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


class _Progress:
    """A tqdm bar over epochs on the driver, fed by rank 0's reports (also logged)."""

    def __init__(self, epochs: int, enabled: bool) -> None:
        self.epochs, self.enabled, self.bar = epochs, enabled, None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.epochs, desc="TorchEstimator", unit="epoch")
        return self

    def update(self, record: dict[str, Any]) -> None:
        _LOG.info("epoch %s/%s: %s", record.get("epoch"), self.epochs, record)
        if self.bar is not None:
            self.bar.n = int(record.get("epoch", 0))
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in record.items()
                                  if k not in ("epoch", "epochs")})

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()
