"""``gradientCompression``: how DDP's gradient all-reduce packs the gradients, as a DDP
communication hook (torch.distributed.algorithms.ddp_comm_hooks), on gloo and NCCL alike.

- ``none``: float32, DDP's default all-reduce (mean over ranks).
- ``fp16`` / ``bf16``: each bucket cast to half precision, summed, cast back (half the bytes;
  fp16 keeps more mantissa, bf16 more range).
- ``powersgd``: each gradient matrix sent as a rank-``powerSgdRank`` approximation P Q^T with
  error feedback (Vogels et al. 2019); vectors (biases) and matrices too small to gain go
  uncompressed. The first ``max(2, syncWarmupSteps)`` steps are plain all-reduces (PowerSGD's
  ``start_powerSGD_iter``; 2 is the least DDP allows with error feedback), and so are the 2
  steps after each checkpoint (below).

Every hook counts the bytes it hands to ``all_reduce`` (this rank's payload; a ring all-reduce
moves about twice that over the wire) into the :class:`~sparkdist.torchtrain.clock.StepClock`,
which reports them per rank in ``trainingSummary["ranks"]``.

PowerSGD keeps state per rank (the error of its own compression, warm-start matrices). A
checkpoint starts it afresh on every rank, with 2 plain steps before compressing again
(:meth:`GradientHook.restart`, seeded by the step count, which the checkpoint keeps), in an
uninterrupted fit as in a resumed one, so a resumed fit ends with the same weights as an
uninterrupted fit with the same checkpoint settings.
"""

from __future__ import annotations

from typing import Any

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")


class GradientHook:
    """One DDP model's gradient all-reduce: the chosen compression, with byte counting."""

    def __init__(self, kind: str, clock: Any, powersgd_rank: int = 2,
                 warmup_steps: int = 0) -> None:
        self.kind, self.clock = kind, clock
        self.powersgd_rank = powersgd_rank
        self.warmup_steps = warmup_steps
        self.powersgd: Any = self._powersgd_state(0) if kind == "powersgd" else None

    def _powersgd_state(self, iteration: int) -> Any:
        """A fresh PowerSGD state at step ``iteration``: 2 plain all-reduces first (a new
        process's DDP lays its buckets out anew after its first step, which PowerSGD's memory
        must not straddle), or up to ``syncWarmupSteps``."""
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=self.powersgd_rank,
            start_powerSGD_iter=max(iteration + 2, self.warmup_steps),
            random_seed=iteration % 2**31, compression_stats_logging_frequency=2**31)
        state.iter = iteration
        return state

    @property
    def iteration(self) -> int:
        """Steps PowerSGD has seen (0 for the stateless hooks)."""
        return int(self.powersgd.iter) if self.powersgd is not None else 0

    def restart(self, iteration: int) -> None:
        """Drop PowerSGD's per-rank memory (at a checkpoint, on every rank): afterwards the
        state depends on ``iteration`` alone, which the checkpoint keeps."""
        if self.powersgd is not None:
            self.powersgd = self._powersgd_state(iteration)

    def __call__(self, bucket: Any) -> Any:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        buffer = bucket.buffer()
        if self.kind == "fp16":
            self.clock.sent(buffer.numel() * 2)
            return default_hooks.fp16_compress_hook(None, bucket)  # type: ignore[arg-type]
        if self.kind == "bf16":
            self.clock.sent(buffer.numel() * 2)
            return default_hooks.bf16_compress_hook(None, bucket)  # type: ignore[arg-type]
        if self.kind == "powersgd":
            state = self.powersgd
            before = state.total_numel_after_compression
            plain = state.iter < state.start_powerSGD_iter
            future = powerSGD_hook.powerSGD_hook(state, bucket)
            sent = buffer.numel() if plain else state.total_numel_after_compression - before
            self.clock.sent(sent * buffer.element_size())
            return future
        self.clock.sent(buffer.numel() * buffer.element_size())
        return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]
