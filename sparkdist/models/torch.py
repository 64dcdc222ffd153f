"""PyTorch models as Spark ML Estimators: data-parallel training inside one Spark barrier
stage, batched inference on the executors.

:class:`TorchEstimator` ``.fit(df)`` checks the input and the cluster on the driver, then runs
:func:`sparkdist.torchtrain.loop.fit_worker` in ``numWorkers`` barrier tasks (torch
DistributedDataParallel, or Horovod), each streaming its partition from a local Arrow file.
Rank 0 sends every epoch's metrics to the driver while it trains (a progress bar; the history
lands on the model) and returns the weights as bytes. :class:`TorchModel` ``.transform``
adds ``prediction`` (and for classifiers ``probability``/``rawPrediction`` vectors, as MLlib
classifiers do) through an Arrow UDF, so Spark's evaluators and ``sparkdist.evaluation`` work
unchanged. A model saves its Params and history as JSON and its weights as a ``torch.save``d
state dict, loaded with ``weights_only=True``; the network class is stored by qualified name.

The ``model`` and ``loss`` Params hold names. A class or function given in code is stored by
its qualified name and recorded in this process (:func:`sparkdist.torchtrain.network.to_name`), so
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
(2, ['epoch', 'epochs', 'loss', 'lr', 'seconds'])
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any, ClassVar

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasRawPredictionCol,
)
from pyspark.ml.util import MLReader
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkdist import hooks
from sparkdist._params import user_frame_level
from sparkdist.columns import check_one_of
from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.launch.preflight import preflight
from sparkdist.models import _torch_checks as checks
from sparkdist.models import _torch_finetune as tuned
from sparkdist.models import _torch_scoring
from sparkdist.models._accessors_torch import (
    _TorchEstimatorAccessors,
    _TorchEstimatorInit,
    _TorchModelAccessors,
)
from sparkdist.models._lr_allreduce import memory_budget
from sparkdist.models._recovery import (
    ELASTIC_TRAJECTORY,
    RECOVERY_TRAJECTORY,
    HasElastic,
    HasRecovery,
    data_identity,
)
from sparkdist.persist import ParamsPersistence, PersistentModel
from sparkdist.torchtrain import finetune, inference, launch, loop, network, strategies
from sparkdist.torchtrain.params import (
    TRAJECTORY,
    HasCommunication,
    HasDataRules,
    HasFineTuning,
    HasInputs,
    HasLaunch,
    HasNetwork,
    HasOptimization,
    HasScoring,
    HasStepCheckpoints,
)
from sparkdist.torchtrain.spec import (
    QUANTIZATIONS,
    InputField,
    TrainSpec,
)
from sparkdist.torchtrain.strategies.params import TRAJECTORY as STRATEGY_TRAJECTORY
from sparkdist.torchtrain.strategies.params import HasStrategy

_LOG = logging.getLogger(__name__)
WEIGHTS_FILE = "weights.pt"
#: validationCol was renamed validationIndicatorCol (pyspark's name); the old name is
#: accepted, with a FutureWarning, for one release.
_RENAMED = {"validationCol": "validationIndicatorCol"}


class _TorchParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol,
                   HasRawPredictionCol, HasNetwork, HasInputs, HasScoring):
    """Params shared by TorchEstimator and TorchModel: the columns, the network and its
    inputs, scoring."""

    featureCols: Param[list[str]] = Param(
        Params._dummy(), "featureCols",
        "numeric columns to use as the features instead of featuresCol (a vector or array)",
        typeConverter=TypeConverters.toListString)

    def inputColumns(self) -> list[str]:
        """The columns the network reads: inputCols' columns, else the feature column(s)."""
        return list(self.getOrDefault("inputCols").values()) or self.featureSource()

    def featureSource(self) -> list[str]:
        """The column(s) features come from."""
        if self.isSet("featureCols") and self.getOrDefault("featureCols"):
            return list(self.getOrDefault("featureCols"))
        return [self.getOrDefault("featuresCol")]


class TorchEstimator(_TorchEstimatorInit, Estimator, _TorchParams, HasOptimization,
                     HasDataRules, HasCommunication, HasStrategy, HasLaunch, HasFineTuning,
                     HasStepCheckpoints, HasRecovery, HasElastic, ParamsPersistence,
                     _TorchEstimatorAccessors):
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
        workers take fewer, larger steps per epoch.
    learningRateScaling, warmupSteps : the learning rate for those larger steps: 'none'
        (default: learningRate as given), 'linear' (``learningRate x numWorkers``) or 'sqrt'
        (``x sqrt(numWorkers)``), reached by a linear ramp from learningRate over the first
        ``warmupSteps`` steps, counted across epochs (:mod:`sparkdist.torchtrain.schedule`).
        Each epoch's history record holds ``lr``, the rate at its end.
    epochs : passes over the training rows.
    numWorkers : barrier tasks (data-parallel ranks); at most the cluster's task slots.
    backend : 'torch' (DistributedDataParallel, gloo/NCCL) or 'horovod'.
    validationIndicatorCol / validationFraction : rows held out for per-epoch validation
        metrics (``validationCol``, the old name of validationIndicatorCol, is accepted with
        a FutureWarning for one release).
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

    The Params come in groups, each declared next to the code that reads it
    (:mod:`sparkdist.torchtrain.params`, :mod:`sparkdist.torchtrain.strategies.params`,
    :mod:`sparkdist.models._recovery`); ``_fit`` turns them once into a typed
    :class:`~sparkdist.torchtrain.spec.TrainSpec`.

    Examples
    --------
    >>> est = TorchEstimator(labelCol="cancelled_within_week", loss="cross_entropy",
    ...                      modelKwargs={"hidden": [16, 8]}, epochs=1, numWorkers=1,
    ...                      validationFraction=0.1)
    >>> model = est.fit(assembled_train)
    >>> sorted(model.history[-1])  # validation metrics from the held-out 10%
    ['epoch', 'epochs', 'loss', 'lr', 'seconds', 'val_accuracy', 'val_loss']
    >>> model.transform(assembled_test).columns[-3:]
    ['prediction', 'rawPrediction', 'probability']
    """

    _generated_init = True  # its constructor: a keyword per Param, by make accessors
    _param_aliases = _RENAMED  # keywords, and Param names a saved estimator may hold
    _renamed_params = _RENAMED
    #: The fingerprint policy (sparkdist.models._recovery), from each group's declaration;
    #: the data identity covers the columns read, so the column Params are not in it.
    _trajectory: ClassVar[dict[str, bool]] = {
        **RECOVERY_TRAJECTORY, **ELASTIC_TRAJECTORY, **TRAJECTORY, **STRATEGY_TRAJECTORY,
        **dict.fromkeys(("featuresCol", "featureCols", "labelCol", "predictionCol",
                         "probabilityCol", "rawPredictionCol"), False)}

    @keyword_only
    def setParams(self, **kwargs: Any) -> TorchEstimator:
        """Set Params by name; ``model`` and ``loss`` may be a class or function (stored by
        its qualified name)."""
        return self._set(**{k: v for k, v in kwargs.items() if v is not None})

    def _set(self, **kwargs: Any) -> TorchEstimator:
        """Sets Params, taking an old name (also from a saved estimator's metadata) for its
        new one with a FutureWarning."""
        for old, new in _RENAMED.items():
            if old in kwargs:
                warnings.warn(f"TorchEstimator: {old} is deprecated and will be removed in the "
                              f"next release; use {new}.", FutureWarning,
                              stacklevel=user_frame_level())
                kwargs.setdefault(new, kwargs.pop(old))
        return super()._set(**kwargs)

    def _fit(self, dataset: DataFrame) -> TorchModel:
        checkpoint_dir, run_id = self.checkpoint_location(dataset.sparkSession)
        prepared, spec, stats = self._train_spec(dataset, checkpoint_dir, run_id)
        preflight(dataset.sparkSession, spec.launch.num_workers, use_gpu=spec.launch.use_gpu,
                  allow_unencrypted=self.getOrDefault("allowUnencrypted"))
        fingerprint = self._fingerprint(dataset, stats, spec) if checkpoint_dir else {}
        # every strategy's checkpoints load into any worker count the strategy can split over
        with self.guarded_run(checkpoint_dir, run_id, fingerprint, "epochs",
                              resizable=("numWorkers", "batchSize")) as run:
            state, header = loop.unpack_result(launch.train(prepared, spec))
            if run is not None:
                run.complete(len(header["history"]))
        model = self._fitted_model(state, {**header, **_model_state(spec)}, spec)
        model._base = spec.finetune.base if spec.finetune.adapter != "none" else b""
        self._copyValues(model)
        return model

    def _fitted_model(self, state: dict[str, Any], info: dict[str, Any],
                      spec: TrainSpec) -> TorchModel:
        return TorchModel._fitted(state, info)

    def _spec_parts(self) -> dict[str, Any]:
        """The Params' spec parts that need no data, each checked as it is built: every
        Param error comes before any data is read."""
        launch_spec = self._launch_spec()
        validates = self.validation_column() is not None or \
            self.getOrDefault("validationFraction") > 0
        check_one_of("quantization", self.getOrDefault("quantization"), QUANTIZATIONS)
        return {"launch": launch_spec, "optim": self._optim_spec(validates),
                "strategy": self._strategy_spec(launch_spec.num_workers),
                "comm": self._comm_spec(), "rules": self._data_rules(self.featureSource())}

    def _train_spec(self, dataset: DataFrame, checkpoint_dir: str | None,
                    run_id: str | None) -> tuple[DataFrame, TrainSpec, dict[str, Any]]:
        """The prepared data, the fit's typed spec (checked: Params, data, the network on
        two rows, the strategy's preflight) and the data's figures."""
        parts = self._spec_parts()
        if parts["strategy"].name == "ps":  # what a server may hold, for its preflight
            parts["strategy"] = dataclasses.replace(
                parts["strategy"], server_budget=memory_budget(dataset.sparkSession)[0])
        module = self._resolve_network()  # before the data pass
        fields = checks.input_fields(dataset, *self._input_params(), module)
        parts["rules"] = dataclasses.replace(parts["rules"], inputs=fields)
        label = self.label_source()
        width = checks.label_width(dataset, label, self._loss_kind())
        parts["rules"] = dataclasses.replace(parts["rules"], label_width=width)
        prepared = checks.prepare(dataset, self.featureSource(), label,
                                  self.validation_column(),
                                  self.getOrDefault("validationFraction"),
                                  self.getOrDefault("seed"), fields,
                                  self.getOrDefault("weightCol"))
        stats = self._read_data(dataset, prepared, parts["rules"],
                                identity=checkpoint_dir is not None)
        names = tuple(label) if isinstance(label, list) else ()
        spec = TrainSpec(model=self._model_spec(int(stats["max_dim"]), self._classes(stats),
                                                fields, width, names),
                         checkpoint=self._checkpoint_spec(checkpoint_dir, run_id),
                         finetune=self._finetune_spec(*self._initial_weights()),
                         hooks=hooks.armed(self), **parts)
        strategies.check_compatible(spec)
        return prepared, checks.check_model(spec), stats  # the strategy's preflight included

    def _classes(self, stats: dict[str, Any]) -> int:
        """numClasses, else inferred for cross_entropy (max label + 1); 2 for bce."""
        loss = self._loss_kind()
        return self.getOrDefault("numClasses") or (
            int(stats["max_label"]) + 1 if loss == "cross_entropy" else 2 if loss == "bce"
            else 0)

    def _initial_weights(self) -> tuple[bytes, str]:
        """``initialWeights`` read (``torch.save``'d state-dict bytes) and its state's SHA-256;
        empty without it. A saved TorchModel's directory is loaded by its strict reader, a
        file with ``weights_only=True``: ParamError naming the Param for anything else."""
        url = self.getOrDefault("initialWeights")
        if not url:
            return b"", ""
        raw, state = tuned.read_weights(url, TorchModel.load)
        return raw, finetune.state_sha256(state)

    def _fingerprint(self, dataset: DataFrame, stats: dict[str, Any],
                     spec: TrainSpec) -> dict[str, Any]:
        """What decides the training trajectory (``_trajectory``), plus the data's identity
        and the initial weights' SHA-256: a run resumes only when all of it matches."""
        validation = self.validation_column()
        label, weight = self.label_source(), self.getOrDefault("weightCol")
        columns = self.inputColumns() + (label if isinstance(label, list) else [label]) + (
            [weight] if weight else []) + ([validation] if validation else [])
        base = {"initialWeightsSha256": spec.finetune.base_sha256} if spec.finetune.base else {}
        return {**self._fingerprint_params(), **base,
                **data_identity(dataset.select(*columns).schema, stats)}

    def _fingerprint_params(self) -> dict[str, Any]:
        """The Params part of the fingerprint; validationIndicatorCol under its old name, and
        without the typed-input Params where inputCols is not set (the learning-rate scaling
        ones where it is 'none'), so runs checkpointed before the rename and before typed
        inputs (and the scaling) still resume."""
        values = self._trajectory_values()
        values["validationCol"] = values.pop("validationIndicatorCol", None)
        if not values.get("inputCols"):  # a features fit: as before typed inputs existed
            for name in ("inputCols", "inputShapes", "maxSequenceLength"):
                values.pop(name)
        for name in ("initialWeights", "freeze"):  # as before fine-tuning existed
            if not values.get(name):
                values.pop(name, None)
        if values.get("learningRateScaling") == "none":  # as before the scaling existed
            values.pop("learningRateScaling")            # (warmupSteps is then 0)
            values.pop("warmupSteps", None)
        if values.get("adapter") == "none":
            for name in ("adapter", "adapterRank", "adapterAlpha", "adapterDropout",
                         "adapterTargets"):
                values.pop(name, None)
        if values.get("strategy") != "ps":  # as before parameter servers existed
            for name in ("psTables", "parameterServers", "psOptimizer", "psLearningRate"):
                values.pop(name, None)
        if values.get("strategy") != "ps" or values["psInitStd"] == 1.0:  # before meta tables
            values.pop("psInitStd")
        return values

    def _read_data(self, dataset: DataFrame, prepared: DataFrame, rules: Any,
                   identity: bool) -> dict[str, Any]:
        """What the driver must know of the data before launch: the features per row, and
        where a fit needs them the whole data's figures (a class count to infer, the resume
        fingerprint's content hash: one Spark job, checked by the same rules as the ranks
        apply). Otherwise the ranks check the values in the pass that trains on them."""
        infer_classes = rules.loss == "cross_entropy" and not rules.num_classes
        if rules.inputs and not (identity or infer_classes):
            return {"max_dim": 0, "max_label": None}  # the typed inputs need no width
        width = None if identity or infer_classes else checks.input_width(
            dataset.schema, self.featureSource(), prepared)
        if width is None:
            return checks.check_data(prepared, rules, identity=identity)
        return {"max_dim": width, "max_label": None}


class TorchModel(Model, _TorchParams, PersistentModel, _TorchModelAccessors):
    """A trained network; ``transform`` adds predictions computed on the executors.

    Attributes
    ----------
    history : one dict per epoch (loss, and val_loss/val_accuracy with validation).
    task : 'classification' or 'regression' (from the loss).
    """

    _loads_model_param = True  # the network is built from the ``model`` Param when loaded

    def __init__(self) -> None:
        super().__init__()
        self._weights: dict[str, Any] = {}  # with adapters: theirs only
        self._info: dict[str, Any] = {}
        self._base = b""  # with adapters: the base's state dict, read once
        self._saved_in = ""  # the directory it was loaded from (a saved base is read there)
        self._shipped: dict[Any, Any] = {}  # the weights hashed and broadcast for transform
        self._loads: Any = None  # the accumulator of the latest transform's LoadRecords

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
        optimizer state (its shards under fsdp/tensor, its stage under pipeline), of the
        optimizer state alone, and the MiB it sent over TCP while training: ``[{"rank": 0,
        "data_s": ..., "compute_s": ..., "communication_s": ..., "other_s": ...,
        "peak_rss_mb": ..., "state_mb": ..., "optimizer_mb": ..., "sent_mb": ...}]``;
        strategy: the strategy it trained with; worker_counts: the world size of each
        training attempt, e.g. ``[3, 2]`` where an elastic fit (minWorkers) went on with 2
        workers after losing one."""
        keys = ("rows", "validation_rows", "steps_per_epoch", "world_size", "batch_size",
                "global_batch_size", "best_epoch", "spill_seconds", "run_id",
                "resumed_from_epoch", "resumed_from_step", "placement", "ranks", "strategy",
                "worker_counts")
        return {key: self._info.get(key) for key in keys}

    @property
    def task(self) -> str:
        return network.task_of_loss(self._loss_kind())

    @property
    def inputDim(self) -> int:
        """Features per row the network takes."""
        return int(self._info["input_dim"])

    @property
    def numClasses(self) -> int:
        return int(self._info.get("num_classes", 0))

    @property
    def labelWidth(self) -> int:
        """Values per row of the label it was trained on (an array label, labelCols): its
        ``prediction`` is an array of them; 0 for one value (a number)."""
        return int(self._info.get("label_width", 0))

    def module(self) -> Any:
        """The trained ``nn.Module`` (in eval mode), for use outside Spark: the network
        ``transform`` scores with, so with ``quantization='int8'`` its Linear layers are
        dynamically quantized to int8 (on the CPU)."""
        module = self._trained()
        if self._quantization() == "int8":
            return inference.quantize_int8(module.eval())
        return module.eval()

    def _trained(self) -> Any:
        """The network with its trained weights: with adapters, the base with them added
        (``mergeAdapters``: merged into its layers)."""
        module = self._network()
        if not self._info.get("adapter"):
            network.load_weights(module, self._weights)
            return module
        return tuned.adapted(module, self._info, self._base_weights(), self._weights,
                             self.getOrDefault("mergeAdapters"))

    def _base_weights(self) -> bytes:
        if not self._base:
            self._base = tuned.base_of(self._info, TorchModel.load, self._saved_in)
        return self._base

    def inputFields(self) -> tuple[InputField, ...]:
        """The typed inputs the network was trained on (``inputCols``); () for one features
        vector."""
        return tuple(InputField.parse(saved) for saved in self._info.get("inputs", []))

    def _network(self) -> Any:
        return network.build_module(*self._network_parts(), self._info["input_dim"],
                                    self._info["output_dim"])

    def _network_parts(self) -> tuple[Any, dict[str, Any]]:
        """The network's class and its constructor's keywords."""
        return (network.resolve_model(self.getOrDefault("model")),
                dict(self.getOrDefault("modelKwargs") or {}))

    def _quantization(self) -> str:
        """The ``quantization`` Param, checked (it may come from copy(), set() or a saved
        model, none of which check it); with 'int8', also that torchao is installed and
        quantizes a copy of the network that then scores two rows, so that no task fails."""
        value = self.getOrDefault("quantization")
        check_one_of("quantization", value, QUANTIZATIONS)
        if value == "int8":
            inference.try_int8(self._network(), self.getOrDefault("model"), self.inputDim,
                               int(self._info["output_dim"]), self.inputFields())
        return str(value)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        """Scores on the executors (:mod:`sparkdist.models._torch_scoring`). With
        ``quantization='int8'`` each worker quantizes the network's Linear layers to int8
        once (dynamic quantization, torchao) and scores on the CPU, also where the task has
        a GPU; a network without Linear layers is refused (ParamError) rather than scored in
        float32 under the int8 name."""
        scored = _torch_scoring.scored(self, dataset)
        return self._output_columns(scored).drop(_torch_scoring.OUTPUT)

    @property
    def scoringLoads(self) -> list[dict[str, Any]]:
        """Each scoring task so far of the DataFrames from the latest ``transform`` (classic
        Spark; [] under Connect): ``{"pid", "hit", "seconds", "cached_bytes"}``: whether its
        Python worker had the network cached, and the seconds to a network ready to score."""
        return [dict(load) for load in self._loads.value] if self._loads is not None else []

    def _output_columns(self, scored: DataFrame) -> DataFrame:
        from pyspark.ml.functions import array_to_vector

        out = F.col(_torch_scoring.OUTPUT)
        scored = scored.withColumn(self.getOrDefault("predictionCol"), out["prediction"])
        if self.task == "classification":  # (with several labels: each one's probability)
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
                module, kwargs = model._network_parts()
                if model._info.get("adapter"):  # the base read and the adapters put on it
                    model._trained()
                    return model
            except ParamError as err:
                raise ModelLoadError(f"'{path}': {err}") from err
            checks.check_weights(model._weights, module, model.getOrDefault("model"), kwargs,
                                 (model._info["input_dim"], model._info["output_dim"]), path)
            return model

        reader.load = checked  # type: ignore[method-assign]
        return reader

    def _state(self) -> dict[str, Any]:
        return tuned.saved_state(self._info, self.getOrDefault("saveBase"))

    def _save_artifacts(self, path: str) -> None:
        from sparkdist import store

        name = self.getOrDefault("model")
        if name.startswith("__main__.") and self._loads_model_param:
            _LOG.warning("model=%r is defined in a notebook or script (__main__): %s loads only "
                         "in a process that defines it again; to load it anywhere, move the "
                         "class into a module and import it before loading.", name, path)
        store.write_bytes(f"{path}/{WEIGHTS_FILE}", inference.weights_bytes(self._weights))
        if self._info.get("adapter") and self.getOrDefault("saveBase"):
            store.write_bytes(f"{path}/{tuned.BASE_FILE}", self._base_weights())

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
            [InputField.parse(saved) for saved in state.get("inputs", [])]
        except (TypeError, ValueError) as err:
            raise ModelLoadError(f"'{path}': its typed inputs were edited ({err}); save the "
                                 "model again.") from err
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
        model = cls._fitted(weights, state)
        model._saved_in = path
        return model


# ----------------------------------------------------------------------------- helpers
def _model_state(spec: TrainSpec) -> dict[str, Any]:
    typed = {"inputs": [f.saved() for f in spec.model.inputs]} if spec.model.inputs else {}
    several: dict[str, Any] = {"label_width": spec.model.label_width} \
        if spec.model.label_width else {}
    fine = spec.finetune
    if fine.base or fine.freeze:  # where the weights started, for the record
        several["initial_weights"] = {"source": fine.source, "sha256": fine.base_sha256,
                                      "freeze": list(fine.freeze)}
    if fine.adapter != "none":
        several["adapter"] = {"rank": fine.adapter_rank, "alpha": fine.adapter_alpha,
                              "dropout": fine.adapter_dropout,
                              "targets": list(fine.adapter_targets)}
    return {"input_dim": spec.model.input_dim, "output_dim": spec.model.output_dim,
            "num_classes": spec.model.num_classes, "run_id": spec.checkpoint.run_id, **typed,
            **several}
