"""The strategy Params of TorchEstimator (a pyspark Params mixin), turned into the
:class:`~sparkdist.torchtrain.spec.StrategySpec` the strategies read."""

from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters

from sparkdist.exceptions import ParamError
from sparkdist.torchtrain.spec import StrategySpec

#: The fingerprint policy (sparkdist.models._recovery): every strategy Param shapes the
#: training trajectory.
TRAJECTORY: dict[str, bool] = dict.fromkeys(
    ("strategy", "fsdpWrap", "mixedPrecision", "pipelineStages", "pipelineSplitPoints",
     "microBatches", "pipelineSchedule", "psTables", "parameterServers", "psOptimizer",
     "psLearningRate", "psInitStd"), True)


class HasStrategy(Params):
    """strategy, fsdpWrap, mixedPrecision, pipelineStages, pipelineSplitPoints, microBatches,
    pipelineSchedule and the parameter servers' psTables, parameterServers, psOptimizer,
    psLearningRate and psInitStd: how the network is spread over the workers."""

    strategy: Param[str] = Param(
        Params._dummy(), "strategy",
        "how the network is spread over the workers: 'ddp' (a replica each), 'fsdp' "
        "(parameters, gradients and optimizer state sharded), 'pipeline' (layers split into "
        "stages), 'tensor' (Linear layers split) or 'ps' (embedding tables on parameter "
        "servers, the rest data parallel)", typeConverter=TypeConverters.toString)
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

    psTables: Param[list[str]] = Param(
        Params._dummy(), "psTables",
        "ps: names of the nn.Embedding / nn.EmbeddingBag modules the parameter servers hold "
        "(e.g. ['interactions.table']); empty: all of them",
        typeConverter=TypeConverters.toListString)
    parameterServers: Param[int] = Param(
        Params._dummy(), "parameterServers",
        "ps: how many ranks hold the tables' rows (they train too), <= numWorkers; 0: every "
        "rank", typeConverter=TypeConverters.toInt)
    psOptimizer: Param[str] = Param(
        Params._dummy(), "psOptimizer",
        "ps: the sparse optimizer the servers apply to the rows a step touches: 'adagrad' or "
        "'adam' (torch.optim.SparseAdam's rule)", typeConverter=TypeConverters.toString)
    psLearningRate: Param[float] = Param(
        Params._dummy(), "psLearningRate",
        "ps: the tables' learning rate (it follows learningRate's schedule); 0: learningRate",
        typeConverter=TypeConverters.toFloat)
    psInitStd: Param[float] = Param(
        Params._dummy(), "psInitStd",
        "ps: the standard deviation of the normal draw that starts the rows of a table built "
        "on the meta device (no rank holds it whole: each server draws its own rows); 1.0: "
        "nn.Embedding's own", typeConverter=TypeConverters.toFloat)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(strategy="ddp", fsdpWrap=[], mixedPrecision=False, pipelineStages=0,
                         pipelineSplitPoints=[], microBatches=4, pipelineSchedule="1f1b",
                         psTables=[], parameterServers=0, psOptimizer="adagrad",
                         psLearningRate=0.0, psInitStd=1.0)

    def _strategy_spec(self, num_workers: int) -> StrategySpec:
        """The strategy on ``num_workers`` workers (pipelineStages 0: one stage each)."""
        get = self.getOrDefault
        if get("pipelineStages") < 0:
            raise ParamError(f"pipelineStages={get('pipelineStages')}: use 0 or more.")
        return StrategySpec(name=get("strategy"), fsdp_wrap=tuple(get("fsdpWrap")),
                            mixed_precision=get("mixedPrecision"),
                            pipeline_stages=get("pipelineStages") or num_workers,
                            pipeline_split_points=tuple(get("pipelineSplitPoints")),
                            micro_batches=get("microBatches"),
                            pipeline_schedule=get("pipelineSchedule"),
                            ps_tables=tuple(get("psTables")),
                            parameter_servers=get("parameterServers"),
                            ps_optimizer=get("psOptimizer"),
                            ps_learning_rate=get("psLearningRate"),
                            ps_init_std=get("psInitStd"))
