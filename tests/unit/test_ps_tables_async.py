"""The asynchronous parameter servers (sparkdist.torchtrain.tables_async) on two gloo ranks
(spawned, never this process): each push is applied alone, as it arrives, and a settle applies
every push made before it. When the ranks take turns (rank 0's steps, a settle, rank 1's), the
tables equal one process taking the same steps in that order with torch's sparse optimizer;
when they push at once, no push is lost and nothing deadlocks."""

from __future__ import annotations

import os

import pytest
import torch

from sparkdist.torchtrain.tables import RemoteEmbedding
from sparkdist.torchtrain.tables_async import AsyncTables
from tests.unit.test_ps_tables import (
    IDS,
    PAD,
    RATE,
    ROWS,
    _initial,
    _loss,
    _module,
    reference,
    run_ranks,
)

#: Adam's bias correction counts a server's pushes, so it takes one server (every push
#: reaches it); Adagrad has no step count
TURNS = [(1, "adagrad"), (2, "adagrad"), (1, "adam")]
RACE_STEPS = 40


def _table(servers: int, optimizer: str, rank: int) -> tuple[AsyncTables, RemoteEmbedding]:
    tables = AsyncTables(servers, rank, 2, optimizer, timeout_s=60)
    original = _module(False, sparse=False)
    original.weight.data.copy_(_initial())
    tables.hold("t", original.weight)
    return tables, RemoteEmbedding(tables, "t", original)


def _ranks(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results: dict = {}
    for servers, optimizer in TURNS:
        tables, remote = _table(servers, optimizer, rank)
        for turn in range(world):
            if turn == rank:
                for step, ids in enumerate(IDS):
                    _loss(remote(torch.tensor(ids[rank])), step, rank).backward()
                    tables.push(1.0 / world, RATE)
            tables.settle()
        results[(servers, optimizer)] = tables.gather("t")
    tables, remote = _table(2, "adagrad", rank)
    pushes = [0, 0]  # to each server
    generator = torch.Generator().manual_seed(rank)
    for step in range(RACE_STEPS):
        ids = torch.randint(0, ROWS, (4, 3), generator=generator)
        _loss(remote(ids), step, rank).backward()
        for server in set((ids.reshape(-1) % 2).tolist()):
            pushes[server] += 1
        tables.push(1.0 / world, RATE)
    tables.settle()
    with torch.no_grad():
        seen = remote(torch.arange(ROWS))
    tables.settle()  # the servers stop before the process group goes
    results["race"] = (pushes, tables.shards["t"].step, seen, tables.gather("t"))
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(_ranks, tmp_path_factory.mktemp("ps_async"))


@pytest.mark.parametrize("servers, optimizer", TURNS)
def test_pushes_in_turns_equal_one_process_taking_them_in_order(ranks, servers, optimizer):
    whole = ranks[0][(servers, optimizer)]
    assert ranks[1][(servers, optimizer)] is None  # only rank 0 gets the table
    # one process: rank 0's steps, then rank 1's, each its loss halved (scale 1 / world)
    expected = reference(optimizer, False, [[(step, rank)] for rank in (0, 1)
                                            for step in range(len(IDS))])
    assert set(whole) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(whole[key], value, rtol=1e-5, atol=1e-6)
    assert torch.equal(whole["weight"][PAD], _initial()[PAD])


def test_pushes_made_at_once_are_all_applied_by_the_settle(ranks):
    for server in (0, 1):
        applied = ranks[server]["race"][1]
        assert applied == sum(ranks[rank]["race"][0][server] for rank in (0, 1))
    whole = ranks[0]["race"][3]["weight"]
    assert torch.isfinite(whole).all() and not torch.equal(whole, _initial())
    for rank in (0, 1):  # after the settle every rank pulls the rows the servers hold
        torch.testing.assert_close(ranks[rank]["race"][2], whole, rtol=0, atol=0)
