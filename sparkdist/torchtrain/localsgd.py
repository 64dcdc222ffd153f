"""Training that does not wait on every step: local SGD (``syncEvery``) and bounded staleness
(``maxStaleness``), for :mod:`sparkdist.torchtrain.strategies.ddp`.

Local SGD (``syncEvery=k > 1``, ``maxStaleness=0``)
    After ``syncWarmupSteps`` ordinary DDP steps (gradients averaged every step), each rank
    takes steps on its own replica (its gradient is the mean over its own rows, no
    collective) and the ranks average their parameters and floating buffers (an all-reduce
    of one flat float tensor on the process group, equal weights) after every train step
    whose number, counted from the start of training, is a multiple of k: post-local SGD
    (Lin et al. 2020). Optimizer state stays per rank. ``syncEvery=1`` is plain DDP, the
    same code path as before, bitwise.

Bounded staleness (``maxStaleness=s > 0``)
    Local steps as above, but the averages do not stop anyone: every k-th train step each
    rank snapshots its parameters and launches an asynchronous all-reduce of (snapshot x w,
    w) on a second process group, w being the steps it computed since its previous snapshot;
    when that completes it moves its parameters by (weighted mean - its snapshot), keeping
    the steps it took meanwhile. It waits for an average only once that is more than s
    train steps old. A rank that lags (its step count, published through the process
    group's store every step, is more than max(1, s // 2) behind the fastest rank's: well
    before the fastest would have to wait) skips the step:
    it drops that batch and computes nothing, so a slow executor does less work rather than
    holding the others back; every rank still makes the same number of train-step calls
    (the loop's epoch-end collectives need that). Skipped steps are reported per rank
    (``skipped_steps``) and leave the epoch's training loss out of those batches. What is
    averaged, and which batches are dropped, depend on timing: such a fit is not
    reproducible. With ``maxStaleness=0`` (the default) nothing here runs.

Where the model is looked at, every rank holds the same one: before validation, before the
best or final weights are taken and before a checkpoint, the ranks finish their pending
averages and average their parameters and buffers (equal weights); before a checkpoint also
their optimizer state (floating tensors, not step counts), so that every rank holds what
rank 0 writes. An uninterrupted fit does the same at the same points, so a fit resumed from a
checkpoint ends with the same weights as an uninterrupted one with the same checkpoint
settings (local SGD; bounded staleness is not reproducible in the first place). The schedule
is keyed by the train-step count, which the checkpoint keeps.
"""

from __future__ import annotations

import collections
import time
from typing import Any


def floating(module: Any) -> list[Any]:
    """The tensors an average covers: parameters, then floating buffers."""
    return [*module.parameters(),
            *(b for b in module.buffers() if b.is_floating_point())]


def average(tensors: list[Any], group: Any = None) -> int:
    """Replace each tensor by its mean over the ranks (one all-reduce of a flat copy, every
    rank gets bitwise the same values); returns the bytes handed to the all-reduce."""
    import torch
    import torch.distributed as dist

    if not tensors:
        return 0
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        flat /= dist.get_world_size(group)
        dist.all_reduce(flat, group=group)
        _unflatten(flat, tensors)
    return flat.numel() * flat.element_size()


def optimizer_tensors(optimizer: Any) -> list[Any]:
    """The optimizer's floating state (Adam's moments, SGD's momentum), in a fixed order;
    step counts excluded (the same on every rank under local SGD)."""
    found = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            found += [state[key] for key in sorted(state) if key != "step"
                      and hasattr(state[key], "is_floating_point")
                      and state[key].is_floating_point() and state[key].dim() > 0]
    return found


def _unflatten(flat: Any, tensors: list[Any]) -> None:
    offset = 0
    for tensor in tensors:
        size = tensor.numel()
        tensor.data.copy_(flat[offset:offset + size].view_as(tensor))
        offset += size


class LocalSGD:
    """Periodic model averaging every ``every`` train steps (see the module docstring)."""

    def __init__(self, module: Any, every: int, clock: Any) -> None:
        self.module, self.every, self.clock = module, every, clock

    def compute(self, call: int) -> bool:
        """Whether this rank computes train step ``call`` (always, here)."""
        return True

    def after_step(self, call: int, computed: bool) -> bool:
        """After train step ``call``: average when the schedule says so. Returns whether
        every rank now holds the same model."""
        if (call + 1) % self.every:
            return False
        started = time.perf_counter()
        self.clock.sent(average(floating(self.module)))
        self.clock.waited(time.perf_counter() - started)
        return True

    def sync(self, optimizer: Any = None) -> None:
        """Every rank the same model (and optimizer state): a collective."""
        self.clock.sent(average(floating(self.module)))
        if optimizer is not None:
            self.clock.sent(average(optimizer_tensors(optimizer)))


class BoundedStaleness(LocalSGD):
    """Asynchronous weighted averaging that waits only for averages older than
    ``staleness`` steps; a rank more than ``staleness`` steps behind skips steps."""

    def __init__(self, module: Any, every: int, staleness: int, clock: Any, rank: int,
                 world: int, store: Any) -> None:
        import torch.distributed as dist

        super().__init__(module, every, clock)
        self.staleness, self.rank, self.world = staleness, rank, world
        # a group of its own, so that its averages in flight never pair up with the
        # loop's collectives on the default group (created on every rank, in order)
        self.group = dist.new_group()
        self.store = dist.PrefixStore("sparkdist-staleness/", store)
        self.rounds: collections.deque[tuple[int, Any, Any, Any]] = collections.deque()
        self.computed = 0  # steps computed since the last snapshot
        self.published = 0  # train-step calls of this attempt (the store's count)

    def compute(self, call: int) -> bool:
        """Publish this rank's progress; False when it is more than ``staleness`` steps
        behind the fastest rank (it then skips the step)."""
        self.published = int(self.store.add(f"calls/{self.rank}", 1))
        others = [int(self.store.add(f"calls/{rank}", 0)) for rank in range(self.world)
                  if rank != self.rank]
        return max(others, default=0) - self.published <= max(1, self.staleness // 2)

    def after_step(self, call: int, computed: bool) -> bool:
        self.computed += computed
        started = time.perf_counter()
        self._apply_finished(call)
        if (call + 1) % self.every == 0:
            self._launch(call)
        self.clock.waited(time.perf_counter() - started)
        return False

    def _launch(self, call: int) -> None:
        import torch
        import torch.distributed as dist

        with torch.no_grad():
            snapshot = torch.cat([p.detach().reshape(-1) for p in self.module.parameters()])
            weight = float(self.computed) if self.computed else 1e-3
            payload = torch.cat([snapshot * weight, snapshot.new_tensor([weight])])
        work = dist.all_reduce(payload, group=self.group, async_op=True)
        self.clock.sent(payload.numel() * payload.element_size())
        self.rounds.append((call, work, payload, snapshot))
        self.computed = 0

    def _apply_finished(self, call: int) -> None:
        """Apply the finished averages in order; wait for one more than ``staleness`` train
        steps old."""
        while self.rounds:
            launched, work, payload, snapshot = self.rounds[0]
            if not work.is_completed():
                if call - launched < self.staleness:
                    return
                work.wait()
            self.rounds.popleft()
            self._apply(payload, snapshot)

    def _apply(self, payload: Any, snapshot: Any) -> None:
        import torch

        with torch.no_grad():
            mean = payload[:-1] / payload[-1]
            params = list(self.module.parameters())
            delta = mean - snapshot
            offset = 0
            for param in params:
                size = param.numel()
                param.add_(delta[offset:offset + size].view_as(param))
                offset += size

    def sync(self, optimizer: Any = None) -> None:
        while self.rounds:
            _, work, payload, snapshot = self.rounds.popleft()
            work.wait()
            self._apply(payload, snapshot)
        self.computed = 0
        super().sync(optimizer)
