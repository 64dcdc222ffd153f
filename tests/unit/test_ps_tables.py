"""The parameter servers' tables (sparkdist.torchtrain.tables) against torch's own sparse
optimizers in one process: two gloo ranks (spawned, never this process) pull and push the rows
of a table split over one or two servers; the whole table and its optimizer state after three
steps equal what ``nn.Embedding(sparse=True)`` with ``torch.optim.Adagrad`` or ``SparseAdam``
gives on the same global batches."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from sparkdist.exceptions import TrainingError
from sparkdist.torchtrain.tables import RemoteEmbedding, Tables

ROWS, DIM, RATE, PAD = 11, 3, 0.1, 4
#: per step, each rank's ids (repeats, an id both ranks touch, the padding row 4)
IDS = [([[0, 3, 3], [7, 10, 4]], [[3, 5, 9], [1, 1, 8]]),
       ([[2, 2, 2], [6, 4, 0]], [[10, 0, 5], [4, 4, 4]]),
       ([[9, 8, 7], [1, 2, 3]], [[3, 3, 6], [6, 2, 1]])]
CONFIGS = [(servers, optimizer, bag) for servers in (1, 2) for optimizer in ("adagrad", "adam")
           for bag in (False, True)]


def _initial() -> torch.Tensor:
    return torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(7))


def _targets(step: int, rank: int, rows: int) -> torch.Tensor:
    seed = 100 * step + rank
    return torch.randn(rows, DIM, generator=torch.Generator().manual_seed(seed))


def _module(bag: bool, sparse: bool) -> nn.Module:
    if bag:
        return nn.EmbeddingBag(ROWS, DIM, mode="mean", sparse=sparse, padding_idx=PAD)
    return nn.Embedding(ROWS, DIM, sparse=sparse, padding_idx=PAD)


def _loss(output: torch.Tensor, step: int, rank: int) -> torch.Tensor:
    flat = output.reshape(-1, DIM)
    return (flat * _targets(step, rank, flat.shape[0])).sum()


def _ranks(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for servers, optimizer, bag in CONFIGS:
        tables = Tables(servers, rank, world, optimizer)
        original = _module(bag, sparse=False)
        original.weight.data.copy_(_initial())
        tables.hold("t", original.weight)
        remote = RemoteEmbedding(tables, "t", original)
        for step, ids in enumerate(IDS):
            _loss(remote(torch.tensor(ids[rank])), step, rank).backward()
            tables.push(1.0 / world, RATE)
        with torch.no_grad():  # a pull without autograd keeps nothing for a push
            remote(torch.tensor(IDS[0][rank]))
        assert not tables.pulled
        results[(servers, optimizer, bag)] = (tables.gather("t"), tables.bytes_sent)
    try:
        remote(torch.tensor([[ROWS]]))
    except TrainingError as err:
        results["error"] = str(err)
    results["resharded"] = _reshard(tables, rank, world, os.path.dirname(out))
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


def _reshard(trained: Tables, rank: int, world: int, directory: str) -> dict:
    """The last config's tables (2 servers, adam) written, then read back by 1 server and
    by 2; a damaged file. Collective."""
    import torch.distributed as dist

    where = f"{directory}/shards"
    digests: list = [None] * world
    dist.all_gather_object(digests, trained.write(where))
    digests = [d for d in digests if d is not None]
    found = {"written": trained.gather("t"), "step": trained.shards["t"].step}
    for servers in (1, 2):
        tables = Tables(servers, rank, world, "adam")
        tables.hold("t", torch.zeros(ROWS, DIM))
        tables.read(where, digests)
        found[servers] = (tables.gather("t"), tables.shards["t"].step)
    try:
        tables.read(where, digests[::-1])  # each file against the other's digest
    except TrainingError as err:
        found["damaged"] = str(err)
    other = Tables(2, rank, world, "adagrad")  # another psOptimizer: other state
    other.hold("t", torch.zeros(ROWS, DIM))
    try:
        other.read(where, digests)
    except TrainingError as err:
        found["another optimizer"] = str(err)
    held = trained.held_bytes()
    trained.drop_state()  # training over: the rows stay, their moments go
    found["dropped"] = (held, trained.held_bytes(), trained.gather("t", state=False))
    return found


def reference(optimizer: str, bag: bool,
              steps: list[list[tuple[int, int]]]) -> dict[str, torch.Tensor]:
    """One process, torch's sparse optimizer: each step's loss is that of the (step, rank)
    batches it lists, halved (the ranks' gradients averaged, as DDP averages)."""
    table = _module(bag, sparse=True)
    table.weight.data.copy_(_initial())
    optim = torch.optim.Adagrad(table.parameters(), lr=RATE) if optimizer == "adagrad" \
        else torch.optim.SparseAdam(table.parameters(), lr=RATE)
    for batches in steps:
        optim.zero_grad()
        loss = sum(_loss(table(torch.tensor(IDS[step][rank])), step, rank)
                   for step, rank in batches)
        (loss / 2).backward()
        optim.step()
    state = optim.state[table.weight]
    keys = ("sum",) if optimizer == "adagrad" else ("exp_avg", "exp_avg_sq")
    return {"weight": table.weight.detach(), **{key: state[key].to_dense() for key in keys}}


def run_ranks(target, directory) -> list[dict]:
    """``target(rank, world, port, out)`` on two spawned gloo ranks; what each saved."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    out = str(directory / "result")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(target, args=(2, port, out), nprocs=2)
    return [torch.load(f"{out}.{rank}", weights_only=False) for rank in (0, 1)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(_ranks, tmp_path_factory.mktemp("ps"))


@pytest.mark.parametrize("servers, optimizer, bag", CONFIGS)
def test_tables_equal_one_process_with_torchs_sparse_optimizer(ranks, servers, optimizer, bag):
    whole, _ = ranks[0][(servers, optimizer, bag)]
    assert ranks[1][(servers, optimizer, bag)][0] is None  # only rank 0 gets the table
    expected = reference(optimizer, bag, [[(step, 0), (step, 1)] for step in range(len(IDS))])
    assert set(whole) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(whole[key], value, rtol=1e-5, atol=1e-6)
    assert torch.equal(whole["weight"][PAD], _initial()[PAD])  # the padding row never trains


def test_only_rows_owned_elsewhere_are_sent(ranks):
    """One server (rank 0): rank 1 sends its ids and gradients, rank 0 the rows it serves."""
    for config in CONFIGS:
        sent = [ranks[rank][config][1] for rank in (0, 1)]
        if config[0] == 1:
            assert sent[0] > 0 and sent[1] > 0
        assert all(0 < count < 10 * ROWS * DIM * 4 * len(IDS) for count in sent)


def test_shards_written_by_two_servers_read_back_on_one_or_two(ranks):
    found = ranks[0]["resharded"]
    assert CONFIGS[-1][:2] == (2, "adam") and found["step"] == len(IDS)
    for servers in (1, 2):
        whole, step = found[servers]
        assert step == found["step"] and set(whole) == set(found["written"])
        for key, value in found["written"].items():
            assert torch.equal(whole[key], value), (servers, key)
    for rank in (0, 1):
        assert "is damaged (SHA-256)" in ranks[rank]["resharded"]["damaged"]
        assert "rows of table 't' with ['sum']: it was written for another model" in \
            ranks[rank]["resharded"]["another optimizer"]


def test_an_id_beyond_the_table_is_a_typed_error(ranks):
    assert f"id {ROWS} is beyond table 't' (ids 0 to {ROWS - 1})" in ranks[0]["error"]


def test_dropped_optimizer_state_leaves_the_rows_to_gather(ranks):
    """Adam's two moments are two thirds of what a server holds; without them the whole rows
    still gather to rank 0."""
    for rank in (0, 1):
        before, after, _ = ranks[rank]["resharded"]["dropped"]
        assert after * 3 == before > 0
    gathered = ranks[0]["resharded"]["dropped"][2]
    assert set(gathered) == {"weight"}
    assert torch.equal(gathered["weight"], ranks[0]["resharded"]["written"]["weight"])


def test_the_strategy_drops_the_servers_optimizer_state_once_training_is_over():
    """ps.Strategy.state_bytes, the loop's end-of-training collective, counts the rows and
    their moments, then leaves the servers the rows alone (one rank: no exchange)."""
    from types import SimpleNamespace

    from sparkdist.torchtrain.strategies import ps

    strategy = ps.Strategy(SimpleNamespace(), None, torch.device("cpu"), None, None)
    strategy.module, strategy.tables = nn.Linear(2, 1), Tables(1, 0, 1, "adam")
    strategy.tables.hold("t", torch.zeros(ROWS, DIM))
    table = ROWS * DIM * 4
    dense = 3 * 4  # the Linear's weight and bias
    assert strategy.state_bytes(SimpleNamespace(state={})) == dense + 3 * table
    assert strategy.tables.held_bytes() == table


@pytest.mark.parametrize("servers", [2, 3])
def test_drawn_rows_are_the_same_table_for_any_number_of_servers(servers):
    """A table built on the meta device: each server draws only its rows, block by block;
    put together they are one server's table, N(0, std), the padding row zero."""
    def whole(k: int) -> torch.Tensor:
        out = torch.empty(1000, DIM)
        for rank in range(k):
            tables = Tables(k, rank, k, "adam")
            tables.hold_drawn("t", 1000, DIM, seed=5, std=0.5, padding_idx=PAD, block=64)
            out[rank::k] = tables.shards["t"].weight
        return out

    one = whole(1)
    assert torch.equal(whole(servers), one)
    assert not one[PAD].any() and 0.45 < float(one.std()) < 0.55


def test_rows_the_servers_wrote_are_put_together_for_the_fitted_model(tmp_path):
    """What the driver does with a fitted state that names the servers' files instead of a
    table (strategy="ps" with a meta table): the whole table, in the state's key order, and
    the files removed; a file changed after it was written is refused, and so is one
    missing. What attempts before wrote is removed, the run's checkpoints are kept."""
    from sparkdist.torchtrain.shardfiles import (
        STORED_ROWS,
        new_model_dir,
        remove_model_dirs,
        stored_rows,
        with_stored_rows,
    )

    table, run = _initial(), tmp_path / "run"
    where = new_model_dir(str(run))
    digests = []
    for rank in range(2):
        tables = Tables(2, rank, 2, "adagrad")
        tables.hold("t", table)
        digests.append(tables.write(where, state=False))
    keys = ["bias", "t.weight"]

    def assembled(files):
        return with_stored_rows({"bias": torch.ones(1), STORED_ROWS: stored_rows(
            where, files, {"t": (ROWS, DIM)}, keys)})

    with pytest.raises(TrainingError, match=r"ps-server-0.pt is damaged \(SHA-256\): fit again"):
        assembled(digests[::-1])
    state = assembled(digests)
    assert list(state) == keys and torch.equal(state["t.weight"], table)
    assert not os.path.exists(where)  # the model holds the rows now
    with pytest.raises(TrainingError, match=r"ps-server-0.pt is missing: .* fit again"):
        assembled(digests)
    (run / "ps-model-killed").mkdir()
    (run / "ckpt-0000000001").write_bytes(b"a checkpoint")
    remove_model_dirs(str(run))
    assert os.listdir(run) == ["ckpt-0000000001"]
