"""sparkdist.torchtrain.localsgd on a real 2-process gloo group (no Spark): the averages'
arithmetic, the asynchronous weighted average keeping the steps taken meanwhile, the skip
rule; and the straggle hook's sleep."""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sparkdist import hooks
from sparkdist.torchtrain import localsgd, straggle
from sparkdist.torchtrain.clock import StepClock


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _worker(rank: int, port: int, out: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        results = {}
        net = torch.nn.Linear(3, 2)
        with torch.no_grad():
            for p in net.parameters():
                p.fill_(float(rank + 1))  # rank 0: 1.0, rank 1: 2.0
        clock = StepClock()
        sent = localsgd.average(localsgd.floating(net))
        results["mean"] = [p.detach().clone() for p in net.parameters()]
        results["sent"] = sent

        # optimizer state: moments averaged, step counts left alone
        optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
        net(torch.full((1, 3), float(rank))).sum().backward()
        optimizer.step()
        localsgd.average(localsgd.optimizer_tensors(optimizer))
        results["moments"] = [optimizer.state[p]["exp_avg"].clone() for p in net.parameters()]
        results["steps"] = [float(optimizer.state[p]["step"]) for p in net.parameters()]

        # bounded staleness: rank 0 computed 3 steps, rank 1 one; each moved by +10 after
        # its snapshot, which the average keeps
        stale = localsgd.BoundedStaleness(net, every=1, staleness=2, clock=clock, rank=rank,
                                          world=2, store=store)
        with torch.no_grad():
            for p in net.parameters():
                p.fill_(float(rank + 1))
        stale.computed = 3 if rank == 0 else 1
        stale._launch(call=0)
        with torch.no_grad():
            for p in net.parameters():
                p.add_(10.0)
        stale.sync()  # waits for the round, applies it, then the plain average
        results["stale"] = [p.detach().clone() for p in net.parameters()]
        results["stale_sent"] = clock.allreduce_bytes
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("localsgd"))
    mp.start_processes(_worker, args=(_free_port(), out), nprocs=2, start_method="spawn")
    return [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=True) for r in (0, 1)]


@pytest.mark.slow
def test_average_gives_every_rank_bitwise_the_mean(ranks):
    for mine, theirs in zip(ranks[0]["mean"], ranks[1]["mean"]):
        assert torch.equal(mine, theirs) and torch.equal(mine, torch.full_like(mine, 1.5))
    assert ranks[0]["sent"] == (6 + 2) * 4  # weight and bias, float32


@pytest.mark.slow
def test_optimizer_moments_are_averaged_and_step_counts_kept(ranks):
    for mine, theirs in zip(ranks[0]["moments"], ranks[1]["moments"]):
        assert torch.equal(mine, theirs)
    assert ranks[0]["moments"][0].abs().sum() > 0  # rank 1's gradient was not zero
    assert ranks[0]["steps"] == ranks[1]["steps"] == [1.0, 1.0]


@pytest.mark.slow
def test_the_asynchronous_average_is_weighted_by_steps_and_keeps_later_steps(ranks):
    # weighted mean of the snapshots (1 x 3 + 2 x 1) / 4 = 1.25; each rank keeps its +10
    # taken after the snapshot; the closing plain average of equal values changes nothing
    for mine, theirs in zip(ranks[0]["stale"], ranks[1]["stale"]):
        assert torch.equal(mine, theirs) and torch.equal(mine, torch.full_like(mine, 11.25))
    assert ranks[0]["stale_sent"] == (8 + 1) * 4 + 8 * 4  # one round, then one plain average


def test_the_straggler_sleeps_factor_minus_one_times_its_own_work_and_only_when_computing():
    clock = StepClock()
    hooks_armed = (straggle.Straggle(rank=1, factor=3.0),)

    def work(epoch, step, features, label):  # the step's own work; None: nothing to compute
        time.sleep(0.05)
        return None if step else features.sum()

    slow = hooks.around_step(work, hooks_armed, rank=1, clock=clock)
    other = hooks.around_step(work, hooks_armed, rank=0, clock=clock)
    assert other is work  # a rank with no hook armed runs its step unwrapped
    rows = torch.ones(2, 1)
    for step, least, most in ((0, 0.1, 0.5), (1, 0.0, 0.04)):
        started = time.perf_counter()
        slow(0, step, rows, rows)
        assert least <= time.perf_counter() - started - 0.05 <= most
