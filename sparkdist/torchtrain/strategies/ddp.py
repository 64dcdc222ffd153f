"""``strategy="ddp"``: data parallelism, a whole replica of the network on every rank.

By default synchronous: DistributedDataParallel (or Horovod's DistributedOptimizer) averages
the gradients in each step's backward pass, in float32 or compressed
(``gradientCompression``: :mod:`sparkdist.torchtrain.compression`). With ``syncEvery > 1``
(local SGD) or ``maxStaleness > 0`` (bounded staleness) the ranks take local steps and
average their models instead, after ``syncWarmupSteps`` synchronous steps
(:mod:`sparkdist.torchtrain.localsgd` says when, and what that does to checkpoints and
determinism). A straggler armed by :mod:`sparkdist.torchtrain.straggle` (tests, benchmarks)
sleeps after each step it computes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkdist.torchtrain import compression, localsgd, straggle, strategies

if TYPE_CHECKING:
    import torch


def check(spec: dict[str, Any], module: torch.nn.Module) -> None:
    """Nothing beyond TorchEstimator's own checks."""


class Strategy(strategies.Strategy):
    name = "ddp"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls = 0  # train-step calls since training began (a checkpoint keeps it)
        self.hook: compression.GradientHook | None = None
        self.local: localsgd.LocalSGD | None = None
        self._dirty = False  # local steps taken since the ranks last held the same model
        self.straggler = straggle.Straggler(self.args.get("straggle"), self.context.rank)

    def setup(self, module: torch.nn.Module) -> None:
        """DDP broadcasts rank 0's weights when it wraps the module (Horovod: a broadcast)."""
        args = self.args
        self.module = module.to(self.device)
        kind = args.get("gradient_compression", "none")
        if self.backend.name == "torch" and kind != "none":
            self.hook = compression.GradientHook(kind, self.clock, args.get("powersgd_rank", 2),
                                                 args.get("sync_warmup_steps", 0))
        self.model = self.clock.watch(self.backend.wrap_model(self.module, self.device),
                                      self.hook)
        self.local = self._local_steps()

    def _local_steps(self) -> localsgd.LocalSGD | None:
        every, staleness = self.args.get("sync_every", 1), self.args.get("max_staleness", 0)
        if staleness > 0:
            return localsgd.BoundedStaleness(self.module, every, staleness, self.clock,
                                             self.context.rank, self.context.world_size,
                                             self.backend.store())
        return localsgd.LocalSGD(self.module, every, self.clock) if every > 1 else None

    def optimizer(self) -> Any:
        return self.backend.wrap_optimizer(super().optimizer(), self.module,
                                           self.args.get("gradient_compression", "none"))

    def train_step(self, features: torch.Tensor, label: torch.Tensor, scale: float,
                   optimizer: Any) -> torch.Tensor:
        """A DDP step (the warm-up, or always without local steps); else a local step on this
        rank's rows (its own mean gradient), skipped when bounded staleness says so."""
        call, self.calls = self.calls, self.calls + 1
        self.straggler.begin(self.clock)
        if self.local is None or call < self.args.get("sync_warmup_steps", 0):
            loss = self._step(self.model, features, label, scale, optimizer)
            self.straggler.end(self.clock, True)
            return loss
        compute = self.local.compute(call)
        if not compute:
            self.clock.skipped()
        rows = features.shape[0]
        if compute and rows:
            loss = self._step(self.module, features, label, 1.0 / rows, optimizer)
        else:
            loss = features.new_zeros(())
        self.straggler.end(self.clock, compute and rows > 0)
        self._dirty = not self.local.after_step(call, compute and rows > 0)
        return loss

    def _step(self, model: Any, features: torch.Tensor, label: torch.Tensor, scale: float,
              optimizer: Any) -> torch.Tensor:
        from sparkdist.torchtrain.loop import loss_sum

        output = model(features)
        loss = loss_sum(self.args["loss_fn"], output, label)
        optimizer.zero_grad()
        (loss * scale).backward()
        self.clock.backward_done()
        optimizer.step()
        return loss.detach()

    def _same_model(self, optimizer: Any = None) -> None:
        """Every rank the same model (and with ``optimizer``, its state). Collective."""
        if self.local is not None and (self._dirty or optimizer is not None):
            self.local.sync(optimizer)
            self._dirty = False

    def predict(self, features: torch.Tensor) -> torch.Tensor | None:
        self._same_model()
        return self.module(features)

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
