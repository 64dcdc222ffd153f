"""Driver side of a TorchEstimator fit: the barrier stage of :func:`loop.fit_worker` over the
prepared data, with a progress bar fed by rank 0's per-epoch reports."""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import DataFrame

from sparkdist.launch.barrier import BarrierSettings, run_barrier
from sparkdist.torchtrain import loop

_LOG = logging.getLogger("sparkdist.models.torch")


def train(prepared: DataFrame, spec: dict[str, Any], get: Any) -> bytes:
    """Run the fit's barrier stage; rank 0's result bytes (``loop.pack_result``). ``get`` reads
    the estimator's Params (timeouts, retries, progress)."""
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
