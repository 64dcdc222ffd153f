"""The one contract between TorchEstimator/TorchModel (driver) and the ranks (executors).

The estimator turns its Params into a frozen :class:`TrainSpec` once, on the driver; the spec
travels to the barrier tasks (cloudpickled) and every rank reads typed fields only: no rank
knows a Param's camelCase name, and no default is restated here (defaults live in the
Params). A launch on another world size is ``dataclasses.replace`` of the spec
(:meth:`TrainSpec.for_world`).

Each part checks its own ranges when it is built (``__post_init__``), so a bad value is a
ParamError on the driver, before anything is launched. The messages name the Params the
values came from: the user set those, and the ranks never build a spec part from scratch.
Choices that live in a registry (optimizers, strategies, backends, compressions) are checked
where the registry is (the Params groups, ``strategies.check_compatible``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from sparkdist.columns import check_one_of, check_timeout
from sparkdist.exceptions import ParamError
from sparkdist.torchtrain import schedule

USE_GPU = ("auto", True, False)
NAN_POLICIES = ("error", "drop")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
#: ``psOptimizer``: the sparse rule a parameter server applies to the rows a step touches
PS_OPTIMIZERS = ("adagrad", "adam")
QUANTIZATIONS = ("none", "int8")
PRECISIONS = ("float32", "bf16", "fp16")
ADAPTERS = ("none", "lora")


def _at_least(low: int, **values: int) -> None:
    """ParamError naming the first Param (keyword) whose value is below ``low``."""
    for name, value in values.items():
        if value < low:
            raise ParamError(f"{name}={value}: use {low} or more.")


@dataclass(frozen=True)
class InputField:
    """One ``forward`` argument of a network with typed inputs (``inputCols``), resolved on the
    driver from the column's type: float32 values or int64 ids, a scalar (``shape`` ()), a
    fixed ``shape`` per row, or a variable-length ``sequence`` of ids cut to ``max_length``
    (``mask``: ``forward`` also takes ``<arg>_mask``). ``num_embeddings``: the table size the
    network declares for the argument (``embedding_sizes``); 0 when it declares none."""

    arg: str
    column: str  # the user's column
    dtype: str  # 'float32' or 'int64'
    shape: tuple[int, ...] = ()
    sequence: bool = False
    max_length: int = 0
    mask: bool = False
    num_embeddings: int = 0

    @property
    def name(self) -> str:
        """The column's name in the training stage's partitions and spilled files."""
        return f"in_{self.arg}"

    @property
    def width(self) -> int:
        """Values per row of a fixed shape (0 for a scalar or a sequence)."""
        return math.prod(self.shape) if self.shape and not self.sequence else 0

    def describe(self) -> str:
        """How messages name it: the argument and the column."""
        return f"inputCols['{self.arg}'] (column '{self.column}')"

    def saved(self) -> dict[str, Any]:
        """This field as a saved model's metadata holds it (JSON), read back by :meth:`parse`."""
        return {**dataclasses.asdict(self), "shape": list(self.shape)}

    @classmethod
    def parse(cls, saved: Any) -> InputField:
        """A field from a saved model's metadata (untrusted): ValueError unless every key is
        a field of the right type."""
        types = {"arg": str, "column": str, "dtype": str, "shape": list, "sequence": bool,
                 "max_length": int, "mask": bool, "num_embeddings": int}
        if not isinstance(saved, dict) or set(saved) != set(types) or not all(
                isinstance(saved[k], kind) for k, kind in types.items()):
            raise ValueError(f"not a typed input: {saved!r}")
        if saved["dtype"] not in ("float32", "int64") or not saved["arg"].isidentifier() or \
                not all(isinstance(n, int) and n > 0 for n in saved["shape"]):
            raise ValueError(f"not a typed input: {saved!r}")
        return cls(**{**saved, "shape": tuple(saved["shape"])})


@dataclass(frozen=True)
class ModelSpec:
    """The network and its loss, resolved on the driver."""

    module: Any  # the nn.Module subclass (cloudpickle ships classes defined in __main__)
    module_name: str
    module_kwargs: dict[str, Any]
    loss: str  # a built-in loss name, or the qualified name of loss_fn
    loss_fn: Any  # the resolved loss: a built-in's name, an nn.Module class or a function
    input_dim: int  # features per row (0 with typed inputs)
    output_dim: int
    num_classes: int
    inputs: tuple[InputField, ...] = ()  # typed inputs, by keyword; () one ``features`` x
    label_width: int = 0  # values per row of an array label or labelCols; 0 one value
    label_names: tuple[str, ...] = ()  # labelCols: the loss gets the labels by column


@dataclass(frozen=True)
class OptimSpec:
    """What one step does, and how many there are."""

    optimizer: str
    learning_rate: float
    weight_decay: float
    batch_size: int  # rows per worker per step
    epochs: int
    seed: int
    patience: int  # early stopping: epochs without a better validation loss; 0 off
    options: tuple[tuple[str, Any], ...] = ()  # more torch.optim keywords (Keras' settings)
    lr_scaling: str = "none"  # learningRateScaling: 'none', 'linear' or 'sqrt'
    warmup_steps: int = 0  # steps of the ramp from learning_rate to the scaled rate
    lr_workers: int = 1  # the k of the scaling: the configured numWorkers (kept by for_world)

    def __post_init__(self) -> None:
        _at_least(1, batchSize=self.batch_size, epochs=self.epochs, numWorkers=self.lr_workers)
        _at_least(0, earlyStoppingPatience=self.patience, warmupSteps=self.warmup_steps)
        if not 0 < self.learning_rate < math.inf:
            raise ParamError(f"learningRate={self.learning_rate}: use a positive number.")
        if not 0 <= self.weight_decay < math.inf:
            raise ParamError(f"weightDecay={self.weight_decay}: use a number >= 0.")
        check_one_of("learningRateScaling", self.lr_scaling, schedule.SCALINGS)
        if self.warmup_steps and self.lr_scaling == "none":
            raise ParamError(f"warmupSteps={self.warmup_steps} ramps the learning rate up to "
                             f"the rate learningRateScaling scales it to, and "
                             f"learningRateScaling='none' does not scale it: set "
                             f"learningRateScaling='linear' or 'sqrt', or warmupSteps=0.")

    def rate_at(self, step: int) -> float:
        """The learning rate of the fit's step ``step`` (counted across epochs from 0)."""
        return schedule.rate_at(self.learning_rate, self.lr_scaling, self.lr_workers,
                                self.warmup_steps, step)


@dataclass(frozen=True)
class StrategySpec:
    """How the network is spread over the workers (sparkdist.torchtrain.strategies)."""

    name: str  # 'ddp', 'fsdp', 'pipeline', 'tensor' or 'ps'
    fsdp_wrap: tuple[str, ...] = ()
    mixed_precision: bool = False
    pipeline_stages: int = 1
    pipeline_split_points: tuple[str, ...] = ()
    micro_batches: int = 1
    pipeline_schedule: str = "1f1b"
    ps_tables: tuple[str, ...] = ()
    parameter_servers: int = 0  # 0: every rank
    ps_optimizer: str = "adagrad"
    ps_learning_rate: float = 0.0  # 0: learningRate
    ps_init_std: float = 1.0  # the rows a server draws for a table built on the meta device
    server_budget: int = 0  # bytes a server rank may hold (0: not known)

    def __post_init__(self) -> None:
        _at_least(1, pipelineStages=self.pipeline_stages, microBatches=self.micro_batches)
        _at_least(0, parameterServers=self.parameter_servers)
        check_one_of("pipelineSchedule", self.pipeline_schedule, PIPELINE_SCHEDULES)
        check_one_of("psOptimizer", self.ps_optimizer, PS_OPTIMIZERS)
        if not self.ps_learning_rate >= 0:
            raise ParamError(f"psLearningRate={self.ps_learning_rate}: use 0 (learningRate) "
                             "or a positive rate.")
        if not self.ps_init_std > 0:
            raise ParamError(f"psInitStd={self.ps_init_std}: use a positive standard "
                             "deviation (1.0: nn.Embedding's own).")


@dataclass(frozen=True)
class CommSpec:
    """How gradients and models travel between the ranks."""

    backend: str  # 'torch' or 'horovod'
    sync_every: int = 1
    sync_warmup_steps: int = 0
    max_staleness: int = 0
    gradient_compression: str = "none"
    powersgd_rank: int = 2

    def __post_init__(self) -> None:
        _at_least(1, syncEvery=self.sync_every, powerSgdRank=self.powersgd_rank)
        _at_least(0, syncWarmupSteps=self.sync_warmup_steps, maxStaleness=self.max_staleness)


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often rank 0 saves the training state (directory None: never)."""

    directory: str | None = None
    run_id: str | None = None
    every: int = 1
    every_steps: int = 0
    keep: int = 3

    def __post_init__(self) -> None:
        _at_least(1, checkpointEvery=self.every, keepCheckpoints=self.keep)
        _at_least(0, checkpointEverySteps=self.every_steps)


@dataclass(frozen=True)
class LaunchSpec:
    """The barrier stage: how many ranks, on what, for how long."""

    num_workers: int
    use_gpu: Any  # 'auto', True or False
    min_workers: int
    slot_wait_s: float
    timeout_s: float
    rendezvous_timeout_s: float
    max_retries: int
    progress: bool

    def __post_init__(self) -> None:
        _at_least(1, numWorkers=self.num_workers)
        _at_least(0, maxRetries=self.max_retries)
        check_one_of("useGpu", self.use_gpu, USE_GPU)
        if not 1 <= self.min_workers <= self.num_workers:
            raise ParamError(f"minWorkers={self.min_workers}: use 0 (all numWorkers) to "
                             f"numWorkers={self.num_workers}.")
        for name, seconds in (("timeoutSeconds", self.timeout_s),
                              ("rendezvousTimeoutSeconds", self.rendezvous_timeout_s),
                              ("slotWaitSeconds", self.slot_wait_s)):
            check_timeout(name, seconds)


@dataclass(frozen=True)
class DataRules:
    """What the data must satisfy (sparkdist.torchtrain.datacheck), checked where it is read."""

    source: str  # the feature column(s), for messages
    label_col: str
    nan_policy: str
    batch_size: int
    loss: str
    num_classes: int
    inputs: tuple[InputField, ...] = ()  # typed inputs (ModelSpec.inputs), checked per column
    label_width: int = 0  # ModelSpec.label_width: an array label's length, checked per row
    weight_col: str = ""  # weightCol: weights >= 0, not all 0; "" every row weighs 1

    def __post_init__(self) -> None:
        _at_least(0, numClasses=self.num_classes)
        check_one_of("nanPolicy", self.nan_policy, NAN_POLICIES)


@dataclass(frozen=True)
class FineTuneSpec:
    """A fit that starts from trained weights (``initialWeights``) and trains part of them:
    the parameters ``freeze`` matches keep their values and get no gradient, optimizer state
    or all-reduce traffic (:mod:`sparkdist.torchtrain.finetune`)."""

    base: bytes = b""  # the initial state dict, torch.save'd; b"" trains from the seed's init
    base_sha256: str = ""  # of the state dict's names and tensors (finetune.state_sha256)
    source: str = ""  # initialWeights, for messages
    freeze: tuple[str, ...] = ()  # parameter or module name patterns (fnmatch)
    adapter: str = "none"  # or 'lora': peft's LoRA on adapter_targets, the rest frozen
    adapter_rank: int = 8
    adapter_alpha: int = 16
    adapter_dropout: float = 0.0
    adapter_targets: tuple[str, ...] = ()  # module name patterns (fnmatch)

    def __post_init__(self) -> None:
        check_one_of("adapter", self.adapter, ADAPTERS)
        _at_least(1, adapterRank=self.adapter_rank, adapterAlpha=self.adapter_alpha)
        if not 0 <= self.adapter_dropout < 1:
            raise ParamError(f"adapterDropout={self.adapter_dropout}: use a fraction in [0, 1).")


@dataclass(frozen=True)
class TrainSpec:
    """Everything the ranks of one fit need, as typed plain values."""

    model: ModelSpec
    optim: OptimSpec
    strategy: StrategySpec
    comm: CommSpec
    checkpoint: CheckpointSpec
    launch: LaunchSpec
    rules: DataRules
    finetune: FineTuneSpec = FineTuneSpec()
    #: Test and benchmark hooks (sparkdist.hooks), applied by wrapping; empty in production.
    hooks: tuple[Any, ...] = field(default=())

    def for_world(self, world: int) -> TrainSpec:
        """This spec on ``world`` workers, keeping the global batch of ``num_workers``."""
        global_batch = self.optim.batch_size * self.launch.num_workers
        return dataclasses.replace(
            self, launch=dataclasses.replace(self.launch, num_workers=world),
            optim=dataclasses.replace(self.optim, batch_size=math.ceil(global_batch / world)))


@dataclass(frozen=True)
class ScoreSpec:
    """What TorchModel.transform's scoring tasks need, less the weights: those travel beside
    it (a broadcast, or the bytes where there is no SparkContext), and are read only by a
    Python worker whose cache lacks ``weights_sha256``."""

    module: Any
    module_kwargs: dict[str, Any]
    weights_sha256: str
    weights_size: int  # bytes of the serialised state dict: what the cache's bound counts
    input_dim: int
    output_dim: int
    loss: str
    batch_size: int
    use_gpu: Any
    quantization: str = "none"
    precision: str = "float32"
    cache_bytes: int = 0  # the bound of each Python worker's network cache
    inputs: tuple[InputField, ...] = ()  # typed inputs, in the UDF's argument order
    label_width: int = 0  # outputs per row scored as an array (an array label, labelCols)
    adapters: FineTuneSpec | None = None  # LoRA to add before loading the weights (unmerged)

    def __post_init__(self) -> None:
        _at_least(1, inferenceBatchSize=self.batch_size)
        _at_least(0, inferenceCacheBytes=self.cache_bytes)
        check_one_of("useGpu", self.use_gpu, USE_GPU)
        check_one_of("quantization", self.quantization, QUANTIZATIONS)
        check_one_of("inferencePrecision", self.precision, PRECISIONS)
        if self.quantization == "int8" and self.precision != "float32":
            raise ParamError(f"quantization='int8' scores with int8 Linear layers on the CPU; "
                             f"inferencePrecision={self.precision!r} does not apply to it: "
                             "set inferencePrecision='float32' (or quantization='none').")

    def network_key(self) -> str:
        """What makes a built network differ, besides its weights: its class, keywords,
        sizes, adapters and quantization (hashed; for the workers' cache)."""
        import hashlib

        from pyspark import cloudpickle  # the copy Spark pickles UDFs with

        parts = (self.module, self.module_kwargs, self.input_dim, self.output_dim,
                 self.adapters, self.quantization)
        return hashlib.sha256(cloudpickle.dumps(parts)).hexdigest()
