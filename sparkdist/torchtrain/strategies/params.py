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
     "microBatches", "pipelineSchedule"), True)


class HasStrategy(Params):
    """strategy, fsdpWrap, mixedPrecision, pipelineStages, pipelineSplitPoints, microBatches
    and pipelineSchedule: how the network is spread over the workers."""

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

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(strategy="ddp", fsdpWrap=[], mixedPrecision=False, pipelineStages=0,
                         pipelineSplitPoints=[], microBatches=4, pipelineSchedule="1f1b")

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
                            pipeline_schedule=get("pipelineSchedule"))
