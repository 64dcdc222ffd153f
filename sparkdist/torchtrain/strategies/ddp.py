"""``strategy="ddp"``: synchronous data parallelism, a whole replica of the network on every
rank; DistributedDataParallel (or Horovod's DistributedOptimizer) averages the gradients in
each step's backward pass."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkdist.torchtrain import strategies

if TYPE_CHECKING:
    import torch


def check(spec: dict[str, Any], module: torch.nn.Module) -> None:
    """Nothing beyond TorchEstimator's own checks."""


class Strategy(strategies.Strategy):
    name = "ddp"

    def setup(self, module: torch.nn.Module) -> None:
        """DDP broadcasts rank 0's weights when it wraps the module (Horovod: a broadcast)."""
        self.module = module.to(self.device)
        self.model = self.clock.watch(self.backend.wrap_model(self.module, self.device))

    def optimizer(self) -> Any:
        return self.backend.wrap_optimizer(super().optimizer(), self.module)
