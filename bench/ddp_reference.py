"""Plain torch DDP outside Spark: the reference for TorchEstimator's 2-worker fit (issue 32,
"The reference that matters: plain DDP"). A helper of bench/deep.py (which puts bench/ on
``sys.path`` and imports it) and the ranks' script that ``torchrun`` runs.

The reference does what a user would write without Spark, at its best: ``torchrun
--standalone --nproc_per_node=2`` starts 2 processes; each sets ``torch.set_num_threads(1)``,
joins a gloo process group, makes its half of the rows in memory as tensors (uniform
features, label ``x0 + x1 > 1``, like bench/deep.py's ``vector_frame``), wraps the same MLP in
``DistributedDataParallel`` (no communication hook), and trains the same epochs with the same
optimizer, learning rate and loss: each epoch permutes its rows and cuts them into
``ceil(rows / (batch x world))`` steps (TorchEstimator's step count), so every step takes
about ``batch`` rows per rank. Rank 0 writes every rank's figures, as JSON, to ``--out``.

Driver side: :func:`run` launches it and returns the ranks' figures; bench/deep.py times the
call (wall clock around the whole of it, process start included). Inside the ranks,
``train_s`` is the training alone, between a ``dist.barrier()`` before the first step and one
after the last (process start, imports, the rendezvous, the data and the model excluded): the
steady state the start-up is measured against.

    torchrun --standalone --nproc_per_node=2 bench/ddp_reference.py --setup '{...}' --out f
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
#: torch.optim's class of each TorchEstimator optimizer name (sparkdist.torchtrain.network's)
OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "rmsprop": "RMSprop"}


@dataclass(frozen=True)
class Setup:
    """What both sides train: the MLP, the rows (in all), epochs, rows per worker per step,
    the optimizer by TorchEstimator's name, its learning rate and weight decay, the loss
    (``bce``: binary cross-entropy on logits), the seed, the ranks and each one's threads."""

    features: int = 64
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    rows: int = 200_000
    epochs: int = 3
    batch: int = 256
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    loss: str = "bce"
    seed: int = 1
    workers: int = 2
    threads: int = 1


def steps_per_epoch(rows: int, batch: int, world: int) -> int:
    """TorchEstimator's steps per epoch: ``ceil(rows / (batch x world))``, at least 1."""
    return max(1, math.ceil(rows / (batch * world)))


def rows_of_rank(rows: int, rank: int, world: int) -> int:
    """This rank's share of ``rows``: equal halves, the remainder to the first ranks."""
    return rows // world + (1 if rank < rows % world else 0)


def mlp_parameters(features: int, hidden: list[int], outputs: int = 1) -> int:
    """Parameters (weights and biases) of ``MLP(features, outputs, hidden)``: the floats its
    gradient all-reduce sends each step."""
    widths = [features, *hidden, outputs]
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


# ------------------------------------------------------------------------ driver side
def torchrun(script: Path, arguments: list[str], workers: int) -> list[str]:
    """The command that runs ``script`` on ``workers`` local ranks: this interpreter's
    ``torchrun`` (the venv's), else ``python -m torch.distributed.run``."""
    runner = Path(sys.executable).with_name("torchrun")
    head = [str(runner)] if runner.exists() else [sys.executable, "-m",
                                                   "torch.distributed.run"]
    return [*head, "--standalone", f"--nproc_per_node={workers}", str(script), *arguments]


def launch(script: Path, arguments: list[str], workers: int, timeout_s: float = 600.0) -> Any:
    """Run ``script`` under torchrun with ``--out FILE`` added; the JSON rank 0 wrote there."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # torchrun's own default, without its warning
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory(prefix="sparkdist-ddp-") as work:
        out = Path(work) / "result.json"
        done = subprocess.run(torchrun(script, [*arguments, "--out", str(out)], workers),
                              capture_output=True, text=True, env=env, timeout=timeout_s)
        if done.returncode or not out.exists():
            raise RuntimeError(f"torchrun {script.name} failed (exit {done.returncode}):\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")
        return json.loads(out.read_text())


def run(setup: Setup) -> list[dict[str, Any]]:
    """One plain DDP training run outside Spark; every rank's figures (see :func:`train`)."""
    return launch(HERE, ["--setup", json.dumps(asdict(setup))], setup.workers)


def steady_seconds(ranks: list[dict[str, Any]]) -> float:
    """The run's training seconds: the slowest rank's ``train_s``."""
    return max(rank["train_s"] for rank in ranks)


# -------------------------------------------------------------------------- rank side
def make_rows(setup: Setup, rank: int, world: int) -> tuple[Any, Any]:
    """This rank's rows as tensors: uniform features, label ``x0 + x1 > 1`` (0/1 floats)."""
    import torch

    generator = torch.Generator().manual_seed(setup.seed * 1000 + rank)
    x = torch.rand(rows_of_rank(setup.rows, rank, world), setup.features, generator=generator)
    return x, (x[:, 0] + x[:, 1] > 1).float()


def train(setup: Setup) -> dict[str, Any]:
    """This rank's run (inside torchrun's environment): its figures, ``train_s`` the seconds
    between a barrier before the first step and one after the last."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from sparkdist.torchtrain.nets import MLP

    assert setup.loss == "bce", setup.loss
    torch.set_num_threads(setup.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_rows(setup, rank, world)
    torch.manual_seed(setup.seed)  # DDP broadcasts rank 0's weights anyway
    model = DistributedDataParallel(MLP(setup.features, 1, setup.hidden))
    optimizer = getattr(torch.optim, OPTIMIZERS[setup.optimizer])(
        model.parameters(), lr=setup.learning_rate, weight_decay=setup.weight_decay)
    steps = steps_per_epoch(setup.rows, setup.batch, world)
    generator = torch.Generator().manual_seed(setup.seed * 7919 + rank)
    epoch_s: list[float] = []
    loss = torch.zeros(())
    dist.barrier()
    began = time.perf_counter()
    for _ in range(setup.epochs):
        started = time.perf_counter()
        for rows in torch.tensor_split(torch.randperm(len(x), generator=generator), steps):
            loss = F.binary_cross_entropy_with_logits(model(x[rows]).squeeze(-1), y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        epoch_s.append(time.perf_counter() - started)
    dist.barrier()
    figures = {"rank": rank, "train_s": time.perf_counter() - began, "epoch_s": epoch_s,
               "steps_per_epoch": steps, "rows": len(x), "last_loss": float(loss),
               "threads": torch.get_num_threads()}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, figures)
    del model, optimizer  # a DDP model outliving its process group aborts at exit (gloo)
    gc.collect()
    dist.destroy_process_group()
    return {"ranks": gathered} if rank == 0 else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", required=True, help="Setup's fields as JSON")
    parser.add_argument("--out", required=True, help="where rank 0 writes the figures")
    args = parser.parse_args()
    result = train(Setup(**json.loads(args.setup)))
    if result:
        Path(args.out).write_text(json.dumps(result["ranks"]))


if __name__ == "__main__":
    main()
