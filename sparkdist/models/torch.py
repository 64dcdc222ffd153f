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
``persist.load_model``) refuses with a ModelLoadError a ``model`` that does not resolve, or
whose network, built from the saved ``modelKwargs`` on torch's meta device (no memory), does not
have the saved weights' tensor names and shapes. Names
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
from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
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

from sparkdist import failpoints
from sparkdist.columns import check_one_of, require_columns
from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.launch.preflight import preflight
from sparkdist.models import _torch_checks as checks
from sparkdist.models._classification import stable_seed
from sparkdist.models._recovery import HasRecovery, data_identity
from sparkdist.persist import ParamsPersistence, PersistentModel
from sparkdist.torchtrain import inference, launch, loop, straggle

_LOG = logging.getLogger(__name__)
WEIGHTS_FILE = "weights.pt"
#: The TorchEstimator Params in the resume fingerprint (with the data identity).
_TRAJECTORY_PARAMS = ("model", "modelKwargs", "loss", "optimizer", "learningRate",
                      "weightDecay", "batchSize", "epochs", "seed", "numWorkers", "backend",
                      "validationFraction", "earlyStoppingPatience", "numClasses", "nanPolicy",
                      "strategy", "fsdpWrap", "mixedPrecision", "pipelineStages",
                      "pipelineSplitPoints", "microBatches", "pipelineSchedule", "syncEvery",
                      "syncWarmupSteps", "maxStaleness", "gradientCompression", "powerSgdRank")


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
        Params._dummy(), "batchSize",
        "rows per worker in a training step (as in DDP and Horovod: a step takes batchSize x "
        "numWorkers rows in all), and rows per scoring batch, >= 1",
        typeConverter=TypeConverters.toInt)
    useGpu: Param[Any] = Param(
        Params._dummy(), "useGpu",
        "'auto' (the GPU Spark assigned to the task, when there is one), True or False",
        typeConverter=_use_gpu)
    quantization: Param[str] = Param(
        Params._dummy(), "quantization",
        "scoring: 'none' (float32) or 'int8' (dynamic int8 quantization of the Linear "
        "layers, CPU)", typeConverter=TypeConverters.toString)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(featuresCol="features", labelCol="label", predictionCol="prediction",
                         probabilityCol="probability", rawPredictionCol="rawPrediction",
                         model="sparkdist.torchtrain.nets.MLP", modelKwargs={}, loss="bce",
                         batchSize=256, useGpu="auto", quantization="none")

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
    batchSize : rows per worker per step, as in DistributedDataParallel and Horovod: a step
        averages the loss over ``batchSize x numWorkers`` rows (the global batch), so more
        workers take fewer, larger steps per epoch. The learning rate is used as given, not
        scaled with the workers; the linear scaling rule (``learningRate x numWorkers``) is
        yours to apply.
    epochs : passes over the training rows.
    numWorkers : barrier tasks (data-parallel ranks); at most the cluster's task slots.
    backend : 'torch' (DistributedDataParallel, gloo/NCCL) or 'horovod'.
    validationCol / validationFraction : rows held out for per-epoch validation metrics.
    earlyStoppingPatience : stop after this many epochs without a better validation loss
        (0: off) and keep the best epoch's weights.
    seed : the same seed and numWorkers give the same weights (the default is the same in
        every process).
    checkpointDir, checkpointEvery, checkpointEverySteps, keepCheckpoints : rank 0 saves the
        training state every ``checkpointEvery`` epochs (and at the end), and with
        ``checkpointEverySteps`` also every that many steps within an epoch, under
        ``checkpointDir/runId``, keeping the newest ``keepCheckpoints``. When Spark retries
        the training stage after a failure (lost executor, crashed worker), every rank
        resumes from the latest checkpoint, at the step it was saved after.
    runId, resume : a fit with the runId of an interrupted one resumes it when every
        setting and the data match, and refuses a mismatch before launch; with the default
        resume='auto' a completed run is trained again from scratch ('never': always from
        scratch; 'required': continue or fail, with more epochs, or on another numWorkers
        and batchSize: every strategy's checkpoints load into any worker count it can split
        over, and a mid-epoch checkpoint continues at the same step of the new plan). Two
        concurrent fits of one runId: the second is refused.
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
    timeoutSeconds: Param[float] = Param(
        Params._dummy(), "timeoutSeconds",
        "cancel the fit after this many seconds: > 0 and at most 31536000 (one year; inf is "
        "refused)", typeConverter=TypeConverters.toFloat)
    rendezvousTimeoutSeconds: Param[float] = Param(
        Params._dummy(), "rendezvousTimeoutSeconds",
        "longest wait in seconds for all workers to start, and for any one "
        "collective: > 0 and at most 31536000 (one year; inf is refused)",
        typeConverter=TypeConverters.toFloat)
    progress: Param[bool] = Param(Params._dummy(), "progress",
                                  "show a progress bar on the driver",
                                  typeConverter=TypeConverters.toBoolean)
    checkpointEverySteps: Param[int] = Param(
        Params._dummy(), "checkpointEverySteps",
        "also checkpoint every this many steps within an epoch (a resume continues at that "
        "step); 0: at epoch ends only", typeConverter=TypeConverters.toInt)
    strategy: Param[str] = Param(
        Params._dummy(), "strategy",
        "how the network is spread over the workers: 'ddp' (a replica each), 'fsdp' "
        "(parameters, gradients and optimizer state sharded), 'pipeline' (layers split into "
        "stages) or 'tensor' (Linear layers split)", typeConverter=TypeConverters.toString)
    fsdpWrap: Param[list[str]] = Param(
        Params._dummy(), "fsdpWrap",
        "fsdp: names of the module classes sharded as units of their own (e.g. "
        "['TransformerBlock']); empty: each top-level child",
        typeConverter=TypeConverters.toListString)
    mixedPrecision: Param[bool] = Param(
        Params._dummy(), "mixedPrecision",
        "fsdp on GPU executors: compute in bfloat16, keep float32 weights and reduce "
        "gradients in float32", typeConverter=TypeConverters.toBoolean)
    pipelineStages: Param[int] = Param(
        Params._dummy(), "pipelineStages",
        "pipeline: stages the model's top-level children are split into; numWorkers must "
        "be a multiple (the rest is data parallel); 0: numWorkers",
        typeConverter=TypeConverters.toInt)
    pipelineSplitPoints: Param[list[str]] = Param(
        Params._dummy(), "pipelineSplitPoints",
        "pipeline: names of the top-level children that start a new stage (pipelineStages - "
        "1 of them); empty: split by parameter count", typeConverter=TypeConverters.toListString)
    microBatches: Param[int] = Param(
        Params._dummy(), "microBatches",
        "pipeline: micro-batches each worker's batch is cut into, >= 1",
        typeConverter=TypeConverters.toInt)
    pipelineSchedule: Param[str] = Param(
        Params._dummy(), "pipelineSchedule", "pipeline: 'gpipe' or '1f1b'",
        typeConverter=TypeConverters.toString)
    syncEvery: Param[int] = Param(
        Params._dummy(), "syncEvery",
        "local SGD: local steps between model averages; 1: every step (DDP)",
        typeConverter=TypeConverters.toInt)
    syncWarmupSteps: Param[int] = Param(
        Params._dummy(), "syncWarmupSteps",
        "local SGD: fully synchronous steps before local steps start (and before PowerSGD "
        "compresses), >= 0",
        typeConverter=TypeConverters.toInt)
    maxStaleness: Param[int] = Param(
        Params._dummy(), "maxStaleness",
        "bounded staleness: steps a fast worker may run ahead of the slowest before it "
        "waits (a lagging worker skips steps, their batches left out); the fit is then not "
        "reproducible; 0: off (synchronous, bitwise reproducible)",
        typeConverter=TypeConverters.toInt)
    gradientCompression: Param[str] = Param(
        Params._dummy(), "gradientCompression",
        "gradients sent as 'none' (float32), 'fp16', 'bf16' or 'powersgd'",
        typeConverter=TypeConverters.toString)
    powerSgdRank: Param[int] = Param(
        Params._dummy(), "powerSgdRank", "powersgd: the rank of the low-rank approximation",
        typeConverter=TypeConverters.toInt)
    minWorkers: Param[int] = Param(
        Params._dummy(), "minWorkers",
        "elastic: the fewest workers a retried fit may go on with when executors are gone "
        "for good; 0: numWorkers (never fewer)", typeConverter=TypeConverters.toInt)
    slotWaitSeconds: Param[float] = Param(
        Params._dummy(), "slotWaitSeconds",
        "elastic: longest wait in seconds for minWorkers free task slots before a retry "
        "fails: > 0 and at most 31536000 (one year; inf is refused)",
        typeConverter=TypeConverters.toFloat)
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
                 checkpointEvery: int = 1, checkpointEverySteps: int = 0,
                 keepCheckpoints: int = 3, runId: str | None = None,
                 resume: str = "auto", maxRetries: int = 3,
                 allowUnencrypted: bool = False, strategy: str = "ddp",
                 fsdpWrap: list[str] | None = None, mixedPrecision: bool = False,
                 pipelineStages: int = 0, pipelineSplitPoints: list[str] | None = None,
                 microBatches: int = 4, pipelineSchedule: str = "1f1b", syncEvery: int = 1,
                 syncWarmupSteps: int = 0, maxStaleness: int = 0,
                 gradientCompression: str = "none", powerSgdRank: int = 2,
                 minWorkers: int = 0, slotWaitSeconds: float = 300.0,
                 quantization: str = "none") -> None:
        super().__init__()
        self._setDefault(optimizer="adam", learningRate=1e-3, weightDecay=0.0, epochs=10,
                         numWorkers=1, backend="torch", validationFraction=0.0,
                         earlyStoppingPatience=0, numClasses=0, nanPolicy="error",
                         timeoutSeconds=86400.0, rendezvousTimeoutSeconds=300.0,
                         progress=True, allowUnencrypted=False, checkpointEverySteps=0,
                         strategy="ddp", fsdpWrap=[], mixedPrecision=False, pipelineStages=0,
                         pipelineSplitPoints=[], microBatches=4, pipelineSchedule="1f1b",
                         syncEvery=1, syncWarmupSteps=0, maxStaleness=0,
                         gradientCompression="none", powerSgdRank=2, minWorkers=0,
                         slotWaitSeconds=300.0, seed=stable_seed(type(self).__name__))
        self.setParams(**self._input_kwargs)  # type: ignore[attr-defined]

    @keyword_only
    def setParams(self, **kwargs: Any) -> TorchEstimator:
        """Set Params by name; ``model`` and ``loss`` may be a class or function (stored by
        its qualified name)."""
        return self._set(**{k: v for k, v in kwargs.items() if v is not None})

    def _fit(self, dataset: DataFrame) -> TorchModel:
        checks.check_params(self)
        code = {"module": loop.resolve_model(self.getOrDefault("model")),
                "loss_fn": loop.resolve_loss(self.getOrDefault("loss"))}
        checkpoint_dir, run_id = self.checkpoint_location(dataset.sparkSession)
        prepared = checks.prepare(self, dataset)
        stats = self._read_data(dataset, prepared, identity=checkpoint_dir is not None)
        spec = {**self._spec(stats), **code, "checkpoint_dir": checkpoint_dir,
                "run_id": run_id}
        checks.check_model(spec)  # the strategy's preflight included
        preflight(dataset.sparkSession, spec["num_workers"], use_gpu=spec["use_gpu"],
                  allow_unencrypted=self.getOrDefault("allowUnencrypted"))
        fingerprint = self._fingerprint(dataset, stats) if checkpoint_dir else {}
        # every strategy's checkpoints load into any worker count the strategy can split over
        with self.guarded_run(checkpoint_dir, run_id, fingerprint, "epochs",
                              resizable=("numWorkers", "batchSize")) as run:
            payload = launch.train(prepared, spec, self.getOrDefault)
            state, header = loop.unpack_result(payload)
            if run is not None:
                run.complete(len(header["history"]))
        model = TorchModel._fitted(state, {**header, **_model_state(spec)})
        self._copyValues(model)
        return model

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

    def _read_data(self, dataset: DataFrame, prepared: DataFrame,
                   identity: bool) -> dict[str, Any]:
        """What the driver must know of the data before launch: the features per row, and
        where a fit needs them the whole data's figures (a class count to infer, the resume
        fingerprint's content hash: one Spark job, checked by the same rules as the ranks
        apply). Otherwise the ranks check the values in the pass that trains on them."""
        infer_classes = self.getOrDefault("loss") == "cross_entropy" and not self.getOrDefault(
            "numClasses")
        width = None if identity or infer_classes else checks.input_width(
            self, dataset.schema, prepared)
        if width is None:
            return checks.check_data(self, prepared, identity=identity)
        return {"max_dim": width, "max_label": None}

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
                "rules": checks.rules(self),
                "checkpoint_every": get("checkpointEvery"),
                "checkpoint_every_steps": get("checkpointEverySteps"),
                "keep_checkpoints": get("keepCheckpoints"),
                "strategy": get("strategy"), "fsdp_wrap": list(get("fsdpWrap")),
                "mixed_precision": get("mixedPrecision"),
                "pipeline_stages": get("pipelineStages") or get("numWorkers"),
                "pipeline_split_points": list(get("pipelineSplitPoints")),
                "micro_batches": get("microBatches"),
                "pipeline_schedule": get("pipelineSchedule"), "sync_every": get("syncEvery"),
                "sync_warmup_steps": get("syncWarmupSteps"),
                "max_staleness": get("maxStaleness"),
                "gradient_compression": get("gradientCompression"),
                "powersgd_rank": get("powerSgdRank"),
                "min_workers": get("minWorkers") or get("numWorkers"),
                "slot_wait_s": get("slotWaitSeconds"),
                "failpoint": failpoints.armed(self), "straggle": straggle.armed(self)}

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
        """How the fit ran: rows, validation_rows, steps_per_epoch, world_size, batch_size (per
        worker) and global_batch_size, best_epoch, spill_seconds (rank 0 reading its
        partition from Spark into the local feed file), run_id, resumed_from_epoch and
        resumed_from_step (where it continued from, or None), placement (each rank's executor
        id and host: ``[{"rank": 0, "executor_id": "1", "host": ...}]``) and ranks: each
        rank's training seconds split into waiting for data, computing, waiting on the
        gradient all-reduce beyond what overlaps computation, and the rest (validation,
        checkpoints), its peak memory, the MiB it holds of parameters, gradients and
        optimizer state (its shards under fsdp/tensor, its stage under pipeline) and the MiB
        it sent over TCP while training: ``[{"rank": 0, "data_s": ..., "compute_s": ...,
        "communication_s": ..., "other_s": ..., "peak_rss_mb": ..., "state_mb": ...,
        "sent_mb": ...}]``; strategy: the strategy it trained with; worker_counts: the world
        size of each training attempt, e.g. ``[3, 2]`` where an elastic fit (minWorkers) went
        on with 2 workers after losing one."""
        keys = ("rows", "validation_rows", "steps_per_epoch", "world_size", "batch_size",
                "global_batch_size", "best_epoch", "spill_seconds", "run_id",
                "resumed_from_epoch", "resumed_from_step", "placement", "ranks", "strategy",
                "worker_counts")
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
        """The trained ``nn.Module`` (in eval mode), for use outside Spark: the network
        ``transform`` scores with, so with ``quantization='int8'`` its Linear layers are
        dynamically quantized to int8 (on the CPU)."""
        module = self._network()
        module.load_state_dict(self._weights)
        if self._quantization() == "int8":
            return inference.quantize_int8(module.eval())
        return module.eval()

    def _network(self) -> Any:
        return loop.build_module(loop.resolve_model(self.getOrDefault("model")),
                                 self.getOrDefault("modelKwargs") or {},
                                 self._info["input_dim"], self._info["output_dim"])

    def _quantization(self) -> str:
        """The ``quantization`` Param, checked (it may come from copy(), set() or a saved
        model, none of which check it); with 'int8', also that torchao is installed and
        quantizes a copy of the network that then scores two rows, so that no task fails."""
        value = self.getOrDefault("quantization")
        check_one_of("quantization", value, checks.QUANTIZATIONS)
        if value == "int8":
            inference.try_int8(self._network(), self.getOrDefault("model"), self.inputDim,
                               int(self._info["output_dim"]))
        return str(value)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        """Scores on the executors. ``quantization='int8'``: each task quantizes the
        network's Linear layers to int8 once (dynamic quantization, torchao) and scores on
        the CPU, also where the task has a GPU; a network without Linear layers is refused
        (ParamError) rather than scored in float32 under the int8 name."""
        require_columns(dataset.schema, self.featureSource(), "TorchModel")
        features = checks.scoring_features(dataset.schema, self.featureSource(),
                                           self.inputDim)
        spec = {"module": loop.resolve_model(self.getOrDefault("model")),
                "module_kwargs": self.getOrDefault("modelKwargs") or {},
                "loss": self.getOrDefault("loss"),
                "weights": inference.weights_bytes(self._weights),
                "input_dim": self._info["input_dim"], "output_dim": self._info["output_dim"],
                "batch_size": self.getOrDefault("batchSize"),
                "use_gpu": self.getOrDefault("useGpu"), "quantization": self._quantization()}
        predict = inference.predict_udf(spec, self.task)
        scored = dataset.withColumn("__sparkdist_out", predict(features))
        return self._output_columns(scored).drop("__sparkdist_out")

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
        subclass whose network, built from the saved ``modelKwargs`` on the meta device (no
        memory), has the weights' tensor names and shapes: a tampered directory fails here
        (ModelLoadError), before any use."""
        reader = super().read()
        load = reader.load

        def checked(path: str) -> TorchModel:
            model = load(path)
            try:
                network = loop.resolve_model(model.getOrDefault("model"))
            except ParamError as err:
                raise ModelLoadError(f"'{path}': {err}") from err
            checks.check_weights(model, network, path)
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
        store.write_bytes(f"{path}/{WEIGHTS_FILE}", inference.weights_bytes(self._weights))

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
        if not (isinstance(weights, dict) and all(
                isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items())):
            raise ModelLoadError(f"{path}: {WEIGHTS_FILE} is not a state dict (names to "
                                 "tensors); save the model again.")
        return cls._fitted(weights, state)


# ----------------------------------------------------------------------------- helpers
def _model_state(spec: dict[str, Any]) -> dict[str, Any]:
    return {key: spec[key] for key in ("input_dim", "output_dim", "num_classes", "run_id")}
