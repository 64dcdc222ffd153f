"""Sharded checkpoints (sparkdist.torchtrain.sharded) on real torch.distributed (gloo, forked
ranks): a checkpoint written by 2 ranks loads into 1 and 3; damaged shards and hostile
metadata are refused; Checkpoints prunes shard directories with the checkpoints."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import traceback

import pytest

torch = pytest.importorskip("torch")

from sparkdist.exceptions import TrainingError  # noqa: E402
from sparkdist.store import Checkpoints  # noqa: E402


def _model():
    from sparkdist.torchtrain.nets import MLP

    torch.manual_seed(3)
    return MLP(input_dim=6, output_dim=1, hidden=[10, 7])


def _sharded(world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _model()
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def _full(model, optimizer):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    weights, optim = get_state_dict(model, optimizer, options=StateDictOptions(
        full_state_dict=True))
    return {name: value.clone() for name, value in weights.items()}, optim


def _rank(rank, world, store, job, out):
    """One forked rank: train 3 steps and save (job 'save'), or load (job 'load'/'tamper')."""
    import torch.distributed as dist

    from sparkdist.torchtrain import sharded

    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                world_size=world)
        model, optimizer = _sharded(world)
        result = {}
        if job == "save":
            generator = torch.Generator().manual_seed(rank)
            for _ in range(3):
                features = torch.randn(5, 6, generator=generator)
                loss = model(features).square().sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            where = os.environ.get("SHARDS_URL", f"{out}/shards")
            result["saved"] = sharded.save(where, model, optimizer, False)
            result["bytes"] = sharded.local_state_bytes(model, optimizer)
        else:
            saved = torch.load(f"{out}/saved.pt", weights_only=True)
            sharded.load(saved, model, optimizer, False)
        result["full"] = _full(model, optimizer)
        torch.save(result, f"{out}/{job}-{world}-{rank}.pt")
        dist.destroy_process_group()
    except BaseException:
        with open(f"{out}/{job}-{world}-{rank}.err", "w") as err:
            err.write(traceback.format_exc())
        raise


def _run(world, job, out, tag):
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=_rank, args=(rank, world, f"{out}/store-{tag}", job, out))
             for rank in range(world)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
    errors = [open(f"{out}/{job}-{world}-{r}.err").read() for r in range(world)
              if os.path.exists(f"{out}/{job}-{world}-{r}.err")]
    return [process.exitcode for process in ranks], errors


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sharded"))
    codes, errors = _run(2, "save", out, "save")
    assert codes == [0, 0], errors
    first = torch.load(f"{out}/save-2-0.pt", weights_only=True)
    torch.save(first["saved"], f"{out}/saved.pt")
    return out, first


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_checkpoint_of_two_ranks_loads_into_another_number(written, world):
    out, first = written
    assert set(first["saved"]["files"]) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    codes, errors = _run(world, "load", out, f"load{world}")
    assert codes == [0] * world, errors
    weights, optim = first["full"]
    for rank in range(world):
        loaded_weights, loaded_optim = torch.load(f"{out}/load-{world}-{rank}.pt",
                                                  weights_only=True)["full"]
        assert loaded_weights.keys() == weights.keys()
        assert all(torch.equal(loaded_weights[name], weights[name]) for name in weights)
        for name, state in optim["state"].items():
            for key, value in state.items():
                assert torch.equal(torch.as_tensor(loaded_optim["state"][name][key]),
                                   torch.as_tensor(value)), (name, key)
        assert loaded_optim["param_groups"][0]["weight_decay"] == 0.1


@pytest.mark.slow
def test_each_rank_holds_half_of_the_state(written):
    out, first = written
    second = torch.load(f"{out}/save-2-1.pt", weights_only=True)
    weights, _ = first["full"]
    whole = sum(value.numel() * 4 for value in weights.values())
    # parameters + gradients + Adam's two moments: 4x the weights, halved (plus the step
    # counters); the 10-, 7- and 1-row layers split unevenly over 2 ranks
    for part in (first["bytes"], second["bytes"]):
        assert part["parameters"] < 0.6 * whole
    assert first["bytes"]["parameters"] + second["bytes"]["parameters"] == whole
    assert first["bytes"]["total"] < 0.6 * 4 * whole


@pytest.mark.slow
def test_a_damaged_shard_is_refused_before_it_is_read(written, tmp_path):
    import shutil

    out, first = written
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    saved = {**first["saved"], "sharded": f"{copy}/shards"}
    torch.save(saved, f"{copy}/saved.pt")
    shard = tmp_path / "copy" / "shards" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-20] ^= 0xFF
    shard.write_bytes(bytes(data))
    codes, errors = _run(1, "load", copy, "tamper")
    assert codes == [1]
    assert "__1_0.distcp is damaged (SHA-256)" in errors[0]


@pytest.mark.slow
def test_sharded_checkpoints_on_s3(tmp_path, monkeypatch):
    """The same on an object store: a moto S3 server of this test's own (s3fs, DCP's fsspec
    writer and reader)."""
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
        fs.mkdir("shards-bucket")
        monkeypatch.setenv("SHARDS_URL", "s3://shards-bucket/run/shards-0000000001-0000000000")
        out = str(tmp_path)
        codes, errors = _run(2, "save", out, "s3save")
        assert codes == [0, 0], errors
        first = torch.load(f"{out}/save-2-0.pt", weights_only=True)
        assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(
            "shards-bucket/run/shards-0000000001-0000000000")) == sorted(first["saved"]["files"])
        torch.save(first["saved"], f"{out}/saved.pt")
        codes, errors = _run(1, "load", out, "s3load")
        assert codes == [0], errors
        loaded = torch.load(f"{out}/load-1-0.pt", weights_only=True)["full"][0]
        assert all(torch.equal(loaded[name], first["full"][0][name]) for name in loaded)
    finally:
        server.stop()


class _Hostile:
    def __reduce__(self):
        return os.system, ("touch pwned-by-metadata",)


def test_metadata_naming_os_system_is_refused(tmp_path, monkeypatch):
    from sparkdist.torchtrain.sharded import load_metadata

    monkeypatch.chdir(tmp_path)
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(_Hostile()))
    with open(path, "rb") as stream, pytest.raises(TrainingError, match="posix.system"):
        load_metadata(stream)
    assert not (tmp_path / "pwned-by-metadata").exists()


def test_real_metadata_passes_the_allowlist(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.metadata import Metadata

    from sparkdist.torchtrain.sharded import load_metadata

    model = _model()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.zeros(2, 6)).sum().backward()
    optimizer.step()
    dcp.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
             storage_writer=FileSystemWriter(str(tmp_path)), no_dist=True)
    with open(tmp_path / ".metadata", "rb") as stream:
        metadata = load_metadata(stream)
    assert isinstance(metadata, Metadata)
    assert "model.layers.0.weight" in metadata.state_dict_metadata


def test_checkpoints_prune_shard_directories_with_their_checkpoints(tmp_path):
    root = str(tmp_path)
    checkpoints = Checkpoints(root, keep=2)

    def commit(number, substep=0):
        where = checkpoints.shard_dir(number, substep)
        os.makedirs(where)
        checkpoints.save(number, b"x")
        return os.path.basename(where)

    def shards():
        return sorted(name for name in os.listdir(root) if name.startswith("shards-"))

    first, second = commit(1), commit(2)
    assert shards() == [first, second]
    third = commit(3)  # ckpt-1 dropped: its shards too
    assert shards() == [second, third]
    os.makedirs(f"{root}/{os.path.basename(checkpoints.shard_dir(4, 0))}")  # killed save
    mid = commit(3, 2)  # a mid-epoch checkpoint replaces ckpt-3 and its shards
    assert shards() == [second, mid]
    assert sorted(checkpoints.steps()) == [2, 3]


def _swapping_rank(first_rank, out):
    """Two fits in one process, as in a reused Spark worker: as rank ``first_rank`` it trains
    a step and writes a sharded checkpoint; then, as the other rank, it reads it back into a
    freshly sharded model (a resume: the templates are made before any step)."""
    import torch.distributed as dist

    from sparkdist.torchtrain import sharded

    try:
        for fit, rank in enumerate([first_rank, 1 - first_rank]):
            dist.init_process_group("gloo", init_method=f"file://{out}/swap-store-{fit}",
                                    rank=rank, world_size=2)
            sharded.fresh_dtensor_caches()
            model, optimizer = _sharded(2)
            if fit == 0:
                model(torch.ones(2, 6)).sum().backward()
                optimizer.step()
                saved = sharded.save(f"{out}/swap", model, optimizer, False)
                if rank == 0:
                    torch.save(saved, f"{out}/swap.pt")
            else:
                sharded.load(torch.load(f"{out}/swap.pt", weights_only=True), model,
                             optimizer, False)
            torch.save(_full(model, optimizer)[0], f"{out}/swap-{fit}-{rank}.pt")
            dist.barrier()
            dist.destroy_process_group()
    except BaseException:
        with open(f"{out}/swap-{first_rank}.err", "w") as err:
            err.write(traceback.format_exc())
        raise


@pytest.mark.slow
def test_a_reused_worker_that_changes_rank_reads_its_own_slices(tmp_path):
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=_swapping_rank, args=(rank, str(tmp_path)))
             for rank in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
    errors = [p.read_text() for p in tmp_path.glob("swap-*.err")]
    assert [process.exitcode for process in ranks] == [0, 0], errors
    written = torch.load(tmp_path / "swap-0-0.pt", weights_only=True)
    for rank in range(2):
        read = torch.load(tmp_path / f"swap-1-{rank}.pt", weights_only=True)
        assert all(torch.equal(read[name], written[name]) for name in written)
