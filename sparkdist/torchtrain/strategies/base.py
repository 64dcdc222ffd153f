"""The behaviour of a whole model on every rank: :class:`WholeModel`, the base that every
strategy's ``Strategy`` refines (:class:`sparkdist.torchtrain.strategies.Strategy` is the
interface the loop calls)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkdist.torchtrain import finetune
from sparkdist.torchtrain.network import forward, loss_sum, make_optimizer

if TYPE_CHECKING:
    import torch

    from sparkdist.launch.barrier import WorkerContext
    from sparkdist.torchtrain.clock import StepClock
    from sparkdist.torchtrain.inputs import Inputs, Target
    from sparkdist.torchtrain.spec import TrainSpec


class WholeModel:
    """A whole replica on every rank, trained without communication of its own (the
    strategies add it)."""

    name = "base"

    def __init__(self, context: WorkerContext, backend: Any, device: torch.device,
                 spec: TrainSpec, clock: StepClock) -> None:
        self.context, self.backend, self.device, self.spec = context, backend, device, spec
        self.clock = clock
        self.module: Any = None  # this rank's part of the network (all of it here)
        self.model: Any = None  # what a training step calls

    def setup(self, module: torch.nn.Module) -> None:
        """Place, wrap or split ``module`` (built from the same seed on every rank)."""
        self.module = self.model = module.to(self.device)

    def optimizer(self) -> Any:
        """The optimizer over the parameters this rank holds."""
        optim = self.spec.optim
        trainable = [p for p in self.module.parameters() if p.requires_grad]  # not frozen
        return make_optimizer(optim.optimizer, trainable, optim.learning_rate,
                              optim.weight_decay, optim.options)

    def train_step(self, features: Inputs, target: Target, scale: float,
                   optimizer: Any) -> torch.Tensor:
        """Forward, backward (the loss sum times ``scale``) and the optimizer step; returns
        the unscaled loss sum of this rank's rows, detached (zero where a rank computes no
        loss)."""
        return self._step(self.model, features, target, scale, optimizer)

    def _step(self, model: Any, features: Inputs, target: Target, scale: float,
              optimizer: Any) -> torch.Tensor:
        output = forward(model, features)
        loss = loss_sum(self.spec.model.loss_fn, output, target, self.spec.model.label_names)
        optimizer.zero_grad()
        (loss * scale).backward()
        self.clock.backward_done()
        optimizer.step()
        return loss.detach()

    def predict(self, features: Inputs) -> torch.Tensor | None:
        """Evaluation outputs for ``features`` (no grad, eval mode set by the caller), or
        None on a rank that produces none (a pipeline stage before the last)."""
        return forward(self.module, features)

    def full_state(self) -> dict[str, Any] | None:
        """The whole model's state dict, on CPU, on rank 0 (None elsewhere). Collective."""
        if self.context.rank != 0:
            return None
        return {name: value.detach().cpu().clone()
                for name, value in self.module.state_dict().items()}

    def save_training_state(self, optimizer: Any, where: str) -> dict[str, Any] | None:
        """What a checkpoint keeps of the model and optimizer: rank 0's whole state dicts
        here (None elsewhere). A sharded strategy writes every rank's shard under the
        directory ``where`` and returns what finds it again. Collective."""
        if self.context.rank != 0:
            return None
        model = self.full_state()
        assert model is not None  # rank 0's
        # frozen parameters stay out where a resume takes them from initialWeights again;
        # without it a parameter without gradients is state (BatchNormalization's in Keras)
        if self.spec.finetune.base:
            model = finetune.trained(self.module, model)
        return {"model": model,
                "optimizer": optimizer.state_dict()}

    def state_bytes(self, optimizer: Any) -> int:
        """Bytes this rank holds of parameters, gradients and optimizer state (its shards
        only, for a sharded or split model): the memory a strategy divides."""
        tensors = [*self.module.parameters(),
                   *(p.grad for p in self.module.parameters() if p.grad is not None),
                   *(value for state in optimizer.state.values() for value in state.values()
                     if hasattr(value, "element_size"))]
        local = (t.to_local() if hasattr(t, "to_local") else t for t in tensors)
        return sum(t.numel() * t.element_size() for t in local)

    def load_training_state(self, saved: dict[str, Any], optimizer: Any) -> None:
        """Restore what :meth:`save_training_state` returned (read back by every rank)."""
        if self.spec.finetune.base:
            finetune.load_trained(self.module, saved["model"])
        else:
            self.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
