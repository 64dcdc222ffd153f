"""Driver side of a TorchEstimator fit: the barrier stage of :func:`loop.fit_worker` over the
prepared data, with a progress bar fed by rank 0's per-epoch reports. Everything it needs is in
the typed spec (:class:`sparkdist.torchtrain.spec.TrainSpec`).

Elastic fits (``minWorkers`` < ``numWorkers``, :mod:`sparkdist.launch.elastic`): a restart that
finds fewer task slots re-plans on ``world`` workers (:meth:`TrainSpec.for_world`, on the
worker counts the strategy declares usable), and keeps the GLOBAL batch: each worker
takes ``ceil(batchSize x numWorkers / world)`` rows a step, so an epoch keeps its number of
steps (exactly, where ``world`` divides ``batchSize x numWorkers``; at most one step fewer
otherwise), the learning rate stays as it was (no rescaling: the same global batch), and a
mid-epoch checkpoint's step number still means the same share of the epoch. The data is
repartitioned across the new workers, so the rest of an epoch resumed mid-way on another world
size draws its rows from the new shards: epoch boundaries are exact, a resumed partial epoch
sees about the share of rows it has left, not the very same rows. The history of worker counts
(one entry per attempt that started training, e.g. ``[3, 2]``) lands in the result header as
``worker_counts`` (``TorchModel.trainingSummary``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pyspark.sql import DataFrame

from sparkdist.launch.barrier import BarrierSettings, run_barrier
from sparkdist.launch.elastic import ElasticPlan
from sparkdist.torchtrain import loop, strategies
from sparkdist.torchtrain.spec import TrainSpec

_LOG = logging.getLogger("sparkdist.models.torch")


def train(prepared: DataFrame, spec: TrainSpec) -> bytes:
    """Run the fit's barrier stage; rank 0's result bytes (``loop.pack_result``)."""
    launch = spec.launch
    settings = BarrierSettings(rendezvous_timeout_s=launch.rendezvous_timeout_s,
                               collective_timeout_s=launch.rendezvous_timeout_s,
                               env=_local_env(prepared))
    description = (f"sparkdist TorchEstimator: {spec.optim.epochs} epochs on "
                   f"{launch.num_workers} workers")
    plan = ElasticPlan(min_workers=launch.min_workers, slot_wait_s=launch.slot_wait_s,
                       for_world=TrainSpec.for_world, usable=strategies.usable(spec))
    with _Progress(spec.optim.epochs, enabled=launch.progress, plan=plan) as progress:
        payload = run_barrier(prepared, loop.fit_worker, spec, launch.num_workers,
                              settings=settings, timeout_s=launch.timeout_s,
                              description=description, on_report=progress.update,
                              max_retries=launch.max_retries, elastic=plan)
    _LOG.info("sparkdist TorchEstimator timeline: %s", plan.timeline)
    return with_header(payload, worker_counts=plan.worker_counts or [launch.num_workers])


def with_header(payload: bytes, **extra: Any) -> bytes:
    """``payload`` (``loop.pack_result``) with ``extra`` added to its JSON header; the
    tensors' bytes are passed on untouched."""
    size = int.from_bytes(payload[:8], "big")
    header = {**json.loads(payload[8:8 + size]), **extra}
    head = json.dumps(header).encode()
    return len(head).to_bytes(8, "big") + head + payload[8 + size:]


def _local_env(df: DataFrame) -> dict[str, str]:
    """In local modes the executors share this host: pass on the loopback choice for gloo."""
    import os

    master = df.sparkSession.conf.get("spark.master", "") or ""
    names = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    if not master.startswith("local"):
        return {}
    return {name: os.environ[name] for name in names if name in os.environ}


class _Progress:
    """A tqdm bar over epochs on the driver, fed by rank 0's reports (also logged)."""

    def __init__(self, epochs: int, enabled: bool, plan: ElasticPlan | None = None) -> None:
        self.epochs, self.enabled, self.bar, self.plan = epochs, enabled, None, plan

    def __enter__(self) -> _Progress:
        if self.enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.epochs, desc="TorchEstimator", unit="epoch")
        return self

    def update(self, record: dict[str, Any]) -> None:
        _LOG.info("epoch %s/%s: %s", record.get("epoch"), self.epochs, record)
        if self.plan is not None:
            self.plan.note(f"epoch {record.get('epoch')} reported")
        if self.bar is not None:
            self.bar.n = int(record.get("epoch", 0))
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in record.items()
                                  if k not in ("epoch", "epochs")})

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()
