"""TorchEstimator's Params, grouped by the concern that reads them, each group a pyspark Params
mixin that turns its Params into its part of the typed contract (:mod:`.spec`).

Defaults live here only (``_setDefault``); the spec parts check their ranges as they are built.
The strategy Params are :class:`sparkdist.torchtrain.strategies.params.HasStrategy`, the
checkpoint and retry Params :class:`sparkdist.models._recovery.HasRecovery`, the elastic ones
:class:`sparkdist.models._recovery.HasElastic`.

Adding a TorchEstimator Param touches two places: its group here (the Param, its default, its
line in the group's spec part and in :data:`TRAJECTORY`, the fingerprint policy of
:mod:`sparkdist.models._recovery`) and the spec part's field in :mod:`.spec`. ``make
accessors`` then writes its getter, setter and constructor keyword (``_TorchEstimatorInit``).
"""

from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasSeed, HasValidationIndicatorCol

from sparkdist._params import stable_seed
from sparkdist.columns import check_one_of
from sparkdist.exceptions import ParamError
from sparkdist.torchtrain import network
from sparkdist.torchtrain.spec import (
    CheckpointSpec,
    CommSpec,
    DataRules,
    FineTuneSpec,
    InputField,
    LaunchSpec,
    ModelSpec,
    OptimSpec,
)

#: The fingerprint policy of these groups: True for a Param that shapes the training
#: trajectory (a resume refuses a change of it); False for one that changes no step's
#: arithmetic (the device, scoring, waits, the progress bar).
TRAJECTORY: dict[str, bool] = {
    **dict.fromkeys(("model", "modelKwargs", "loss", "batchSize", "optimizer", "learningRate",
                     "learningRateScaling", "warmupSteps", "weightDecay", "epochs",
                     "earlyStoppingPatience", "validationIndicatorCol", "validationFraction",
                     "nanPolicy", "numClasses", "seed", "backend", "syncEvery", "syncWarmupSteps",
                     "maxStaleness", "gradientCompression", "powerSgdRank", "numWorkers",
                     "inputCols", "inputShapes", "maxSequenceLength", "initialWeights", "freeze",
                     "adapter", "adapterRank", "adapterAlpha", "adapterDropout",
                     "adapterTargets"), True),
    # columns: the data identity of a resume covers what they read
    **dict.fromkeys(("labelCols", "weightCol"), False),
    **dict.fromkeys(("useGpu", "quantization", "timeoutSeconds", "rendezvousTimeoutSeconds",
                     "progress", "allowUnencrypted", "checkpointEverySteps", "mergeAdapters",
                     "saveBase", "inferenceBatchSize", "inferencePrecision",
                     "inferenceCacheBytes"),
                   False)}


def _use_gpu(value: Any) -> Any:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


class HasNetwork(Params):
    """model, modelKwargs and loss: the network and what it minimises (TorchEstimator and
    TorchModel)."""

    model: Param[str] = Param(
        Params._dummy(), "model",
        "the nn.Module subclass, or its qualified name 'package.module.Class' in a module "
        "this process has imported (a class given is stored by its name)",
        typeConverter=network.to_name)
    modelKwargs: Param[dict] = Param(
        Params._dummy(), "modelKwargs",
        "JSON-able constructor arguments of the model; input_dim/output_dim are filled in "
        "from the data when the constructor takes them")
    loss: Param[str] = Param(
        Params._dummy(), "loss",
        f"{sorted(network.LOSSES)}, an nn.Module loss class, or a function (output, label) -> "
        "per-row losses (a class or function given is stored by its name)",
        typeConverter=network.to_name)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(model="sparkdist.torchtrain.nets.MLP", modelKwargs={}, loss="bce")

    def _loss_kind(self) -> str:
        """The built-in loss whose labels, outputs and metrics the loss follows: a built-in's
        name, else the name of the function or class (regression's)."""
        return str(self.getOrDefault("loss"))

    def _resolve_network(self) -> type:
        """The network class and the loss resolved: ParamError for either, before any data."""
        network.resolve_loss(self.getOrDefault("loss"))
        return network.resolve_model(self.getOrDefault("model"))

    def _model_spec(self, input_dim: int, num_classes: int,
                    inputs: tuple[InputField, ...] = (), label_width: int = 0,
                    label_names: tuple[str, ...] = ()) -> ModelSpec:
        """The network resolved to its class and the loss to its function (ParamError for a
        name that does not resolve); ``label_width`` outputs for several labels per row."""
        loss = self.getOrDefault("loss")
        return ModelSpec(module=network.resolve_model(self.getOrDefault("model")),
                         module_name=self.getOrDefault("model"),
                         module_kwargs=dict(self.getOrDefault("modelKwargs") or {}),
                         loss=loss, loss_fn=network.resolve_loss(loss), input_dim=input_dim,
                         output_dim=label_width or network.output_width(loss, num_classes),
                         num_classes=num_classes, inputs=inputs, label_width=label_width,
                         label_names=label_names)


def _input_cols(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
            isinstance(arg, str) and arg.isidentifier() and isinstance(column, str)
            for arg, column in value.items()):
        raise TypeError(f"inputCols={value!r}: use a dict from the network's forward argument "
                        "names to column names, e.g. {'user': 'userId', 'item': 'movieId'}")
    return dict(value)


def _input_shapes(value: Any) -> dict[str, list[int]]:
    if not isinstance(value, dict) or not all(
            isinstance(arg, str) and isinstance(shape, list | tuple) and shape
            and all(isinstance(n, int) and n > 0 for n in shape)
            for arg, shape in value.items()):
        raise TypeError(f"inputShapes={value!r}: use a dict from forward argument names to "
                        "shapes of positive ints, e.g. {'image': [1, 8, 8]}")
    return {arg: list(shape) for arg, shape in value.items()}


class HasInputs(Params):
    """inputCols, inputShapes and maxSequenceLength: a network with several typed inputs, each
    column passed to ``forward`` by keyword (TorchEstimator and TorchModel)."""

    inputCols: Param[dict] = Param(
        Params._dummy(), "inputCols",
        "a dict from the network's forward argument names to columns, each passed as its own "
        "tensor: integer columns and arrays as int64 ids, numbers, vectors and float arrays as "
        "float32 (instead of one features vector: featuresCol/featureCols)",
        typeConverter=_input_cols)
    inputShapes: Param[dict] = Param(
        Params._dummy(), "inputShapes",
        "a dict from forward argument names to a fixed shape per row (e.g. {'image': [1, 8, "
        "8]}): a flat array column is reshaped to it; an integer array without one is a "
        "variable-length sequence", typeConverter=_input_shapes)
    maxSequenceLength: Param[int] = Param(
        Params._dummy(), "maxSequenceLength",
        "longest variable-length sequence kept (longer ones are cut to their first values); "
        "each batch is padded to its own longest, with a boolean <arg>_mask when forward "
        "takes one, >= 1", typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(inputCols={}, inputShapes={}, maxSequenceLength=512)

    def _input_params(self) -> tuple[dict[str, str], dict[str, list[int]], int]:
        """The typed inputs asked for, checked against each other: ParamError."""
        columns, shapes = self.getOrDefault("inputCols"), self.getOrDefault("inputShapes")
        longest = self.getOrDefault("maxSequenceLength")
        if longest < 1:
            raise ParamError(f"maxSequenceLength={longest}: use 1 or more.")
        unknown = sorted(set(shapes) - set(columns))
        if unknown:
            raise ParamError(f"inputShapes names {unknown}, which inputCols does not "
                             f"(arguments: {sorted(columns)}); shape only the arguments of "
                             "inputCols.")
        if columns and self.isSet("featureCols") and self.getOrDefault("featureCols"):
            raise ParamError("inputCols and featureCols both set: give the network either "
                             "typed inputs by keyword (inputCols) or one features vector "
                             "(featureCols/featuresCol), not both.")
        return columns, shapes, longest


class HasScoring(Params):
    """batchSize: rows per training step; useGpu: the device, in training and scoring;
    quantization, inferenceBatchSize, inferencePrecision and inferenceCacheBytes: how scoring
    runs; mergeAdapters and saveBase: how a model with
    adapters scores and what its saved directory holds (TorchEstimator and TorchModel)."""

    batchSize: Param[int] = Param(
        Params._dummy(), "batchSize",
        "rows per worker in a training step (as in DDP and Horovod: a step takes batchSize x "
        "numWorkers rows in all), >= 1", typeConverter=TypeConverters.toInt)
    inferenceBatchSize: Param[int] = Param(
        Params._dummy(), "inferenceBatchSize",
        "scoring: rows per call of the network, >= 1", typeConverter=TypeConverters.toInt)
    inferencePrecision: Param[str] = Param(
        Params._dummy(), "inferencePrecision",
        "scoring: 'float32', or 'bf16'/'fp16' (autocast on the task's device, GPU or CPU)",
        typeConverter=TypeConverters.toString)
    inferenceCacheBytes: Param[int] = Param(
        Params._dummy(), "inferenceCacheBytes",
        "scoring: bytes of weights each Python worker keeps built for later tasks and jobs "
        "(least recently used evicted), >= 0; 0 keeps none", typeConverter=TypeConverters.toInt)
    useGpu: Param[Any] = Param(
        Params._dummy(), "useGpu",
        "'auto' (the GPU Spark assigned to the task, when there is one), True or False",
        typeConverter=_use_gpu)
    quantization: Param[str] = Param(
        Params._dummy(), "quantization",
        "scoring: 'none' (float32) or 'int8' (dynamic int8 quantization of the Linear "
        "layers, CPU)", typeConverter=TypeConverters.toString)
    mergeAdapters: Param[bool] = Param(
        Params._dummy(), "mergeAdapters",
        "scoring a model with LoRA adapters: merge them into the base weights (one matrix per "
        "layer) instead of running them alongside", typeConverter=TypeConverters.toBoolean)
    saveBase: Param[bool] = Param(
        Params._dummy(), "saveBase",
        "saving a model with LoRA adapters: also copy the base weights into its directory, so "
        "that it loads where the initialWeights path is gone; False (default): the base is "
        "referenced by path and SHA-256", typeConverter=TypeConverters.toBoolean)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(batchSize=256, useGpu="auto", quantization="none",
                         inferenceBatchSize=1024, inferencePrecision="float32",
                         inferenceCacheBytes=2 << 30, mergeAdapters=False, saveBase=False)


class HasOptimization(HasSeed):
    """optimizer, learningRate, learningRateScaling, warmupSteps, weightDecay, epochs,
    earlyStoppingPatience and seed: what one step does and how many there are (with batchSize;
    the learning rate's scaling with numWorkers: :mod:`sparkdist.torchtrain.schedule`)."""

    optimizer: Param[str] = Param(Params._dummy(), "optimizer",
                                  f"one of {sorted(network.OPTIMIZERS)}",
                                  typeConverter=TypeConverters.toString)
    learningRate: Param[float] = Param(Params._dummy(), "learningRate", "learning rate, > 0",
                                       typeConverter=TypeConverters.toFloat)
    learningRateScaling: Param[str] = Param(
        Params._dummy(), "learningRateScaling",
        "the learning rate used with numWorkers = k workers (a step averages batchSize x k "
        "rows): 'none' (learningRate as given), 'linear' (learningRate x k) or 'sqrt' "
        "(learningRate x sqrt(k))", typeConverter=TypeConverters.toString)
    warmupSteps: Param[int] = Param(
        Params._dummy(), "warmupSteps",
        "steps (counted across epochs) over which the learning rate ramps linearly from "
        "learningRate to the rate learningRateScaling scales it to, >= 0; 0: the scaled rate "
        "from the first step", typeConverter=TypeConverters.toInt)
    weightDecay: Param[float] = Param(Params._dummy(), "weightDecay", "L2 penalty, >= 0",
                                      typeConverter=TypeConverters.toFloat)
    epochs: Param[int] = Param(Params._dummy(), "epochs", "passes over the data, >= 1",
                               typeConverter=TypeConverters.toInt)
    earlyStoppingPatience: Param[int] = Param(
        Params._dummy(), "earlyStoppingPatience",
        "epochs without a better validation loss before stopping; 0 turns it off",
        typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(optimizer="adam", learningRate=1e-3, learningRateScaling="none",
                         warmupSteps=0, weightDecay=0.0, epochs=10, earlyStoppingPatience=0,
                         seed=stable_seed(type(self).__name__))  # the same in every process

    def _optim_spec(self, validates: bool) -> OptimSpec:
        """``validates``: whether the fit holds rows out (early stopping needs them). The
        learning rate scales with the configured numWorkers (the global batch's)."""
        get = self.getOrDefault
        if get("earlyStoppingPatience") and not validates:
            raise ParamError("earlyStoppingPatience needs validation rows: set "
                             "validationFraction or validationIndicatorCol.")
        name, rate, decay, options = self._optimizer()
        return OptimSpec(optimizer=name, learning_rate=rate, weight_decay=decay,
                         batch_size=get("batchSize"), epochs=get("epochs"),
                         seed=get("seed") % 2**31, patience=get("earlyStoppingPatience"),
                         options=options, lr_scaling=get("learningRateScaling"),
                         warmup_steps=get("warmupSteps"), lr_workers=get("numWorkers"))

    def _optimizer(self) -> tuple[str, float, float, tuple[tuple[str, Any], ...]]:
        """(torch.optim's optimizer by name, learning rate, weight decay, more keywords)."""
        check_one_of("optimizer", self.getOrDefault("optimizer"), network.OPTIMIZERS)
        return (self.getOrDefault("optimizer"), self.getOrDefault("learningRate"),
                self.getOrDefault("weightDecay"), ())


class HasDataRules(HasValidationIndicatorCol):
    """validationIndicatorCol, validationFraction, nanPolicy, numClasses, labelCols and
    weightCol: which rows validate, what the data must satisfy
    (:mod:`sparkdist.torchtrain.datacheck`), and what the loss is computed against."""

    labelCols: Param[list[str]] = Param(
        Params._dummy(), "labelCols",
        "several label columns (instead of labelCol): the loss, a function (output, labels) -> "
        "per-row losses, gets the labels as a dict by column name",
        typeConverter=TypeConverters.toListString)
    weightCol: Param[str] = Param(
        Params._dummy(), "weightCol",
        "a column of row weights >= 0: each row's loss is multiplied by its weight and the "
        "mean is weighted; '' (default) weighs every row 1", typeConverter=TypeConverters.toString)

    validationFraction: Param[float] = Param(
        Params._dummy(), "validationFraction",
        "fraction of rows held out for validation by a seeded hash split, in [0, 1)",
        typeConverter=TypeConverters.toFloat)
    nanPolicy: Param[str] = Param(Params._dummy(), "nanPolicy",
                                  "rows with NaN/inf/null features or label: 'error' or 'drop'",
                                  typeConverter=TypeConverters.toString)
    numClasses: Param[int] = Param(Params._dummy(), "numClasses",
                                   "classes for cross_entropy; 0 infers max(label) + 1",
                                   typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(validationFraction=0.0, nanPolicy="error", numClasses=0, labelCols=[],
                         weightCol="")

    def label_source(self) -> str | list[str]:
        """What the loss is computed against: labelCol, or the list of labelCols; ParamError
        for labelCols given with labelCol or with a built-in loss (which takes one label)."""
        columns = list(self.getOrDefault("labelCols"))
        if not columns:
            return str(self.getOrDefault("labelCol"))
        if self.isSet("labelCol"):
            raise ParamError(f"labelCol={self.getOrDefault('labelCol')!r} and labelCols="
                             f"{columns} both set; give one label column or several, not both.")
        if len(set(columns)) != len(columns):
            raise ParamError(f"labelCols={columns} names a column twice; name each once.")
        if self.getOrDefault("loss") in network.LOSSES:
            raise ParamError(f"labelCols={columns} with loss={self.getOrDefault('loss')!r}: "
                             f"several label columns need a loss function (output, labels) -> "
                             f"per-row losses, which gets the labels as a dict by column name; "
                             f"or put the labels in one array column (labelCol) for "
                             f"'mse'/'bce'.")
        return columns

    def validation_column(self) -> str | None:
        """The boolean column marking validation rows, or None (a hash split, or none)."""
        if self.isSet("validationIndicatorCol"):
            return str(self.getOrDefault("validationIndicatorCol"))
        return None

    def _data_rules(self, source: list[str]) -> DataRules:
        """The rules for features read from ``source`` (ParamError for a bad fraction)."""
        get = self.getOrDefault
        if not 0 <= get("validationFraction") < 1:
            raise ParamError(f"validationFraction={get('validationFraction')}: use a "
                             "fraction in [0, 1).")
        label = self.label_source()
        return DataRules(source=", ".join(source),
                         label_col=", ".join(label) if isinstance(label, list) else label,
                         nan_policy=get("nanPolicy"), batch_size=get("batchSize"),
                         loss=get("loss"), num_classes=get("numClasses"),
                         weight_col=get("weightCol"))


class HasCommunication(Params):
    """backend, syncEvery, syncWarmupSteps, maxStaleness, gradientCompression and
    powerSgdRank: how gradients and models travel between the ranks."""

    backend: Param[str] = Param(Params._dummy(), "backend", "'torch' or 'horovod'",
                                typeConverter=TypeConverters.toString)
    syncEvery: Param[int] = Param(
        Params._dummy(), "syncEvery",
        "local SGD: local steps between model averages; 1: every step (DDP)",
        typeConverter=TypeConverters.toInt)
    syncWarmupSteps: Param[int] = Param(
        Params._dummy(), "syncWarmupSteps",
        "local SGD: fully synchronous steps before local steps start (and before PowerSGD "
        "compresses), >= 0", typeConverter=TypeConverters.toInt)
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

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(backend="torch", syncEvery=1, syncWarmupSteps=0, maxStaleness=0,
                         gradientCompression="none", powerSgdRank=2)

    def _comm_spec(self) -> CommSpec:
        get = self.getOrDefault
        return CommSpec(backend=get("backend"), sync_every=get("syncEvery"),
                        sync_warmup_steps=get("syncWarmupSteps"),
                        max_staleness=get("maxStaleness"),
                        gradient_compression=get("gradientCompression"),
                        powersgd_rank=get("powerSgdRank"))


class HasLaunch(Params):
    """numWorkers, timeoutSeconds, rendezvousTimeoutSeconds, progress and allowUnencrypted:
    the barrier stage (with useGpu, maxRetries and the elastic Params)."""

    numWorkers: Param[int] = Param(Params._dummy(), "numWorkers",
                                   "number of data-parallel tasks, >= 1",
                                   typeConverter=TypeConverters.toInt)
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
    allowUnencrypted: Param[bool] = Param(
        Params._dummy(), "allowUnencrypted",
        "train on a cluster with Spark authentication/encryption on although the gradient "
        "traffic between workers (gloo, NCCL, Horovod) is not encrypted",
        typeConverter=TypeConverters.toBoolean)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(numWorkers=1, timeoutSeconds=86400.0, rendezvousTimeoutSeconds=300.0,
                         progress=True, allowUnencrypted=False)

    def _launch_spec(self) -> LaunchSpec:
        get = self.getOrDefault
        return LaunchSpec(num_workers=get("numWorkers"), use_gpu=get("useGpu"),
                          min_workers=get("minWorkers") or get("numWorkers"),
                          slot_wait_s=get("slotWaitSeconds"), timeout_s=get("timeoutSeconds"),
                          rendezvous_timeout_s=get("rendezvousTimeoutSeconds"),
                          max_retries=get("maxRetries"), progress=get("progress"))


class HasFineTuning(Params):
    """initialWeights, freeze and the adapter Params: a fit that starts from trained weights
    and trains part of them, or low-rank adapters on them
    (:mod:`sparkdist.torchtrain.finetune`)."""

    initialWeights: Param[str] = Param(
        Params._dummy(), "initialWeights",
        "the weights the fit starts from: a saved TorchModel's directory or a torch.save'd "
        "state-dict file, at any store URL, loaded with weights_only=True (never unpickled); "
        "'' (default): the network's own initialisation", typeConverter=TypeConverters.toString)
    freeze: Param[list[str]] = Param(
        Params._dummy(), "freeze",
        "parameter or module name patterns (fnmatch: ['embed', 'encoder.*']) whose parameters "
        "keep their initial values: no gradient, optimizer state or all-reduce traffic",
        typeConverter=TypeConverters.toListString)

    adapter: Param[str] = Param(
        Params._dummy(), "adapter",
        "'none' (default), or 'lora': peft's low-rank adapters on the adapterTargets modules "
        "of the initialWeights network, which stays frozen", typeConverter=TypeConverters.toString)
    adapterRank: Param[int] = Param(Params._dummy(), "adapterRank", "LoRA rank r, >= 1",
                                    typeConverter=TypeConverters.toInt)
    adapterAlpha: Param[int] = Param(
        Params._dummy(), "adapterAlpha", "LoRA alpha (the update is scaled by alpha / r), >= 1",
        typeConverter=TypeConverters.toInt)
    adapterDropout: Param[float] = Param(
        Params._dummy(), "adapterDropout", "dropout on the adapters' input, in [0, 1)",
        typeConverter=TypeConverters.toFloat)
    adapterTargets: Param[list[str]] = Param(
        Params._dummy(), "adapterTargets",
        "module name patterns (fnmatch: ['blocks.*.attn', 'head']) of the Linear, Embedding "
        "or Conv layers that get adapters", typeConverter=TypeConverters.toListString)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(initialWeights="", freeze=[], adapter="none", adapterRank=8,
                         adapterAlpha=16, adapterDropout=0.0, adapterTargets=[])

    def _finetune_spec(self, base: bytes, base_sha256: str) -> FineTuneSpec:
        """The fine-tuning part, with the initial weights read (``base``) by the estimator."""
        get = self.getOrDefault
        if get("adapter") != "none" and not (base and get("adapterTargets")):
            raise ParamError(f"adapter={get('adapter')!r} needs initialWeights (the base it "
                             f"adapts) and adapterTargets (the modules it adapts, e.g. "
                             f"['blocks.*.attn', 'head']).")
        return FineTuneSpec(base=base, base_sha256=base_sha256, source=get("initialWeights"),
                            freeze=tuple(get("freeze")), adapter=get("adapter"),
                            adapter_rank=get("adapterRank"), adapter_alpha=get("adapterAlpha"),
                            adapter_dropout=get("adapterDropout"),
                            adapter_targets=tuple(get("adapterTargets")))


class HasStepCheckpoints(Params):
    """checkpointEverySteps: checkpoints within an epoch (with the recovery Params)."""

    checkpointEverySteps: Param[int] = Param(
        Params._dummy(), "checkpointEverySteps",
        "also checkpoint every this many steps within an epoch (a resume continues at that "
        "step); 0: at epoch ends only", typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(checkpointEverySteps=0)

    def _checkpoint_spec(self, directory: str | None, run_id: str | None) -> CheckpointSpec:
        get = self.getOrDefault
        return CheckpointSpec(directory=directory, run_id=run_id, every=get("checkpointEvery"),
                              every_steps=get("checkpointEverySteps"),
                              keep=get("keepCheckpoints"))
