"""``strategy="ddp"``: data parallelism, a whole replica of the network on every rank.

By default synchronous: DistributedDataParallel (or Horovod's DistributedOptimizer) averages
the gradients in each step's backward pass, in float32 or compressed
(``gradientCompression``: :mod:`sparkdist.torchtrain.compression`). With ``syncEvery > 1``
(local SGD) or ``maxStaleness > 0`` (bounded staleness) the ranks take local steps and
average their models instead, after ``syncWarmupSteps`` synchronous steps
(:mod:`sparkdist.torchtrain.localsgd` says when, and what that does to checkpoints and
determinism). Runs on every backend; the backend's class declares which compression and
local-step settings it adds (:func:`sparkdist.torchtrain.strategies.check_compatible`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkdist.torchtrain import compression, localsgd, strategies
from sparkdist.torchtrain.network import forward, rows_of
from sparkdist.torchtrain.strategies.base import WholeModel

if TYPE_CHECKING:
    import torch

    from sparkdist.torchtrain.inputs import Inputs, Target
    from sparkdist.torchtrain.spec import TrainSpec

SUPPORTS = strategies.Supports(backends=("torch", "horovod"),
                               compressions=compression.COMPRESSIONS, local_steps=True,
                               typed_inputs=True, adapters=True)
usable = strategies.any_world


def check(spec: TrainSpec, module: torch.nn.Module) -> None:
    """Nothing beyond TorchEstimator's own checks."""


class Strategy(WholeModel):
    name = "ddp"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls = 0  # train-step calls since training began (a checkpoint keeps it)
        self.hook: compression.GradientHook | None = None
        self.local: localsgd.LocalSGD | None = None
        self._dirty = False  # local steps taken since the ranks last held the same model

    def setup(self, module: torch.nn.Module) -> None:
        """DDP broadcasts rank 0's weights when it wraps the module (Horovod: a broadcast;
        Horovod compresses in its optimizer, torch in a DDP communication hook)."""
        comm = self.spec.comm
        self.module = module.to(self.device)
        if self.backend.name == "torch" and comm.gradient_compression != "none":
            self.hook = compression.GradientHook(comm.gradient_compression, self.clock,
                                                 comm.powersgd_rank, comm.sync_warmup_steps)
        self.model = self.clock.watch(self.backend.wrap_model(self.module, self.device),
                                      self.hook)
        self.local = self._local_steps()

    def _local_steps(self) -> localsgd.LocalSGD | None:
        every, staleness = self.spec.comm.sync_every, self.spec.comm.max_staleness
        if staleness > 0:
            return localsgd.BoundedStaleness(self.module, every, staleness, self.clock,
                                             self.context.rank, self.context.world_size,
                                             self.backend.store())
        return localsgd.LocalSGD(self.module, every, self.clock) if every > 1 else None

    def optimizer(self) -> Any:
        return self.backend.wrap_optimizer(super().optimizer(), self.module,
                                           self.spec.comm.gradient_compression)

    def train_step(self, features: Inputs, target: Target, scale: float,
                   optimizer: Any) -> torch.Tensor:
        """A DDP step (the warm-up, or always without local steps); else a local step on this
        rank's rows (its own mean gradient), skipped when bounded staleness says so."""
        call, self.calls = self.calls, self.calls + 1
        if self.local is None or call < self.spec.comm.sync_warmup_steps:
            return self._step(self.model, features, target, scale, optimizer)
        compute = self.local.compute(call)
        if not compute:
            self.clock.skipped()
        rows = rows_of(features)
        if compute and rows:
            loss = self._step(self.module, features, target, 1.0 / rows, optimizer)
        else:
            loss = target.label.new_zeros(())
        self._dirty = not self.local.after_step(call, compute and rows > 0)
        return loss

    def _same_model(self, optimizer: Any = None) -> None:
        """Every rank the same model (and with ``optimizer``, its state). Collective."""
        if self.local is not None and (self._dirty or optimizer is not None):
            self.local.sync(optimizer)
            self._dirty = False

    def predict(self, features: Inputs) -> torch.Tensor | None:
        self._same_model()
        return forward(self.module, features)

    def full_state(self) -> dict[str, Any] | None:
        self._same_model()
        return super().full_state()

    def save_training_state(self, optimizer: Any, where: str) -> dict[str, Any] | None:
        """The model and optimizer once every rank holds the same ones, the step count, and
        PowerSGD's step count (its per-rank memory starts afresh here, on every rank)."""
        self._same_model(optimizer)
        if self.hook is not None:
            self.hook.restart(self.hook.iteration)
        saved = super().save_training_state(optimizer, where)
        if saved is not None:
            saved["ddp"] = {"calls": self.calls,
                            "powersgd_iter": self.hook.iteration if self.hook else 0}
        return saved

    def load_training_state(self, saved: dict[str, Any], optimizer: Any) -> None:
        super().load_training_state(saved, optimizer)
        extra = saved.get("ddp", {})
        self.calls = int(extra.get("calls", 0))
        if self.hook is not None:
            self.hook.restart(int(extra.get("powersgd_iter", 0)))
