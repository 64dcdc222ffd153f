"""Training state in checkpoints, so that a retried or re-run fit continues where it stopped.

Rank 0 writes a checkpoint every ``CheckpointSpec.every`` epochs, and with ``every_steps``
also every that many steps within an epoch, into :class:`sparkdist.store.Checkpoints` (atomic,
checksummed, the last K kept), numbered by the epochs completed. A checkpoint holds the
weights, the optimizer state, the history, the best weights so far (early stopping), the epoch,
the steps done in the next epoch and their summed loss, and the steps done in all (the
learning rate's warm-up counts them: :mod:`sparkdist.torchtrain.schedule`). Randomness needs no
saved state: every step reseeds torch from (seed, epoch, step, rank) and the feed shuffles from
(seed, epoch), so a resumed step draws exactly what the uninterrupted one would have drawn, and
a resumed fit ends with the same weights.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from sparkdist.exceptions import TrainingError

if TYPE_CHECKING:
    import torch

    from sparkdist.torchtrain.spec import TrainSpec


def step_seed(seed: int, epoch: int, step: int, rank: int) -> int:
    """The torch seed of one rank's step (dropout and the like)."""
    return (seed * 1_000_003 + epoch * 7919 + step * 104_729 + rank) % 2**63


def seed_torch(seed: int, device: torch.device) -> None:
    """Seed the generators a rank on ``device`` draws from: the CPU's, and CUDA's on a GPU.
    Not ``torch.manual_seed``: it also queues the seed for every uninitialised accelerator
    (CUDA, XPU, MTIA), formatting the whole Python stack each time, which costs 0.3-0.6 ms
    a call from inside a Spark worker (issue 32), every step."""
    import torch

    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)


def fingerprint(spec: TrainSpec) -> dict[str, Any]:
    """What a checkpoint must agree on to be resumed from: a backstop inside the task. The
    driver compares the whole fingerprint (settings and data, ``run.json``) before launch
    (:class:`sparkdist.models._recovery.RunGuard`), so this check fails only for checkpoints
    changed behind a fit's back. The keys are those of the checkpoints written so far."""
    model = spec.model
    return {"module_name": model.module_name, "module_kwargs": model.module_kwargs,
            "input_dim": model.input_dim, "output_dim": model.output_dim, "loss": model.loss,
            "optimizer": spec.optim.optimizer}


def encode(epoch: int, step: int, training_state: dict[str, Any], history: list[dict],
           best: dict | None, stopped: bool, partial_loss: float, spec: TrainSpec,
           global_step: int) -> bytes:
    """The state after ``epoch`` epochs and ``step`` steps of the next (whose summed loss
    over all ranks is ``partial_loss``; ``global_step`` steps in all, across epochs and
    worker counts), as bytes ``torch.load(weights_only=True)`` reads.
    ``training_state`` is the strategy's model and optimizer state (or where its shards are:
    :meth:`sparkdist.torchtrain.strategies.Strategy.save_training_state`)."""
    import torch

    state = {"epoch": epoch, "step": step, "global_step": global_step,
             "partial_loss": partial_loss,
             "training_state": training_state, "history": history,
             "best": best and {**best, "state": _cpu(best["state"])}, "stopped": stopped,
             "fingerprint": fingerprint(spec)}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def decode(payload: bytes, spec: TrainSpec, where: str) -> dict[str, Any]:
    """A checkpoint's state; refuses one written for another model or loss. One written
    before the step count was kept has ``global_step`` None (the loop derives it)."""
    import torch

    state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    if state["fingerprint"] != fingerprint(spec):
        raise TrainingError(f"the checkpoint {where} was written by a different fit "
                            f"({state['fingerprint']}, this fit: {fingerprint(spec)}); use "
                            f"a new runId or another checkpointDir.")
    if "training_state" not in state:  # written before strategies: whole-model state dicts
        state["training_state"] = {"model": state.pop("model"),
                                   "optimizer": state.pop("optimizer")}
    return {"step": 0, "partial_loss": 0.0, "global_step": None, **state}


def _cpu(state_dict: dict[str, Any]) -> dict[str, Any]:
    return {name: tensor.detach().cpu().clone() for name, tensor in state_dict.items()}
