"""What one gradient all-reduce costs on 2 gloo ranks outside Spark (issue 32: where do the
1.6-3 ms per all-reduce that TorchEstimator's ranks measure go?). A helper of bench/deep.py
(which puts bench/ on ``sys.path`` and imports it) and the ranks' script that ``torchrun``
runs; nothing here touches Spark or sparkdist's training code.

Each launch is ``torchrun --standalone --nproc_per_node=2`` with ``torch.set_num_threads(T)``
in each rank, gloo over loopback, and measures, per rank:

- ``allreduce``: for each tensor size (float32 elements; 1, the model's gradient, 4x it),
  ``--warmup`` untimed then ``--calls`` timed back-to-back ``dist.all_reduce`` (sum) of one
  zero tensor, each call timed alone (``perf_counter`` around it): median, 10th and 90th
  percentile ms per call.
- ``step``: the bench's MLP on ``--batch`` random rows per rank, Adam, ``--steps`` timed steps
  after 10 untimed, median ms per step of: ``local`` (no DDP, no communication: both ranks
  compute at once), ``ddp`` (DistributedDataParallel, its built-in all-reduce) and
  ``ddp_hooked`` (DDP with a Python communication hook that notes when the bucket is ready
  and then runs DDP's default all-reduce hook, as sparkdist's StepClock does), and for the
  last ``wait`` (ms from the last bucket ready to ``backward()`` returning: what sparkdist
  reports as each step's communication), split step by step (the ranks' CLOCK_MONOTONIC
  times, one clock on one machine) into ``peer``, waiting for the other rank's bucket, and
  ``after_both_ready``, the all-reduce and DDP's copy back once both ranks are ready.
  ``gapped``: a bare ``dist.all_reduce`` of the gradient's size, each after an untimed
  forward and backward without DDP (the collective as a step meets it, its threads idle since
  the last one), split the same way (``gapped_split``).

Rank 0 writes every rank's figures, as JSON, to ``--out``; :func:`measure` launches it once
per thread count and :func:`summary` turns the per-call times into the figures.

    torchrun --standalone --nproc_per_node=2 bench/allreduce.py --numel 1,82689 --out f
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

from ddp_reference import launch, mlp_parameters

HERE = Path(__file__).resolve()


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    """Median, 10th and 90th percentile and mean of ``seconds``, in ms (3 decimals)."""
    ordered = sorted(seconds)

    def at(share: float) -> float:
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))]

    return {"median_ms": round(1000 * statistics.median(ordered), 3),
            "p10_ms": round(1000 * at(0.1), 3), "p90_ms": round(1000 * at(0.9), 3),
            "mean_ms": round(1000 * statistics.fmean(ordered), 3)}


def slowest(each: list[dict[str, float]]) -> dict[str, Any]:
    """``median_ms`` and ``mean_ms`` of the rank with the larger ones, and every rank's."""
    return {"median_ms": max(e["median_ms"] for e in each),
            "mean_ms": max(e["mean_ms"] for e in each), "ranks": each}


def wait_split(ranks: list[dict[str, Any]], ready_key: str = "ready_at",
               returned_key: str = "returned_at") -> dict[str, Any]:
    """The hooked DDP steps' wait (bucket ready to ``backward()`` returning) split, step by
    step, into ``peer``: the later rank's bucket-ready time minus this rank's (waiting for the
    other rank to finish its backward), and ``after_both_ready``: backward's return minus the
    later bucket-ready time (the all-reduce itself and DDP's copy back into the gradients).
    The ranks' times are CLOCK_MONOTONIC, one clock on one machine."""
    ready = [rank["step"][ready_key] for rank in ranks]
    both = [max(step) for step in zip(*ready)]
    peer = [percentiles_ms([b - r for b, r in zip(both, mine)]) for mine in ready]
    after = [percentiles_ms([t - b for t, b in zip(rank["step"][returned_key], both)])
             for rank in ranks]
    return {"peer": slowest(peer), "after_both_ready": slowest(after)}


def summary(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One launch's figures from its ranks' raw times: per size and per step kind, each
    rank's percentiles, and ``median_ms``/``mean_ms``: the slowest rank's."""
    first = ranks[0]
    kinds = [name for name in first["step"] if not name.endswith("_at")]
    return {"threads": first["threads"],
            "allreduce": {size: {"bytes": 4 * int(size), **slowest(
                [percentiles_ms(rank["allreduce"][size]) for rank in ranks])}
                for size in first["allreduce"]},
            "step": {name: slowest([percentiles_ms(rank["step"][name]) for rank in ranks])
                     for name in kinds},
            "wait_split": wait_split(ranks),
            "gapped_split": wait_split(ranks, "gapped_began_at", "gapped_ended_at")}


def measure(features: int, hidden: list[int], batch: int, threads: tuple[int, ...] = (1, 2),
            calls: int = 200, warmup: int = 20, steps: int = 100) -> dict[str, Any]:
    """The figures of one launch per thread count (each a fresh pair of processes)."""
    numel = mlp_parameters(features, hidden)
    sizes = [1, numel, 4 * numel]
    found = {}
    for count in threads:
        ranks = launch(HERE, ["--numel", ",".join(map(str, sizes)), "--calls", str(calls),
                              "--warmup", str(warmup), "--threads", str(count),
                              "--features", str(features), "--hidden",
                              ",".join(map(str, hidden)), "--batch", str(batch),
                              "--steps", str(steps)], 2)
        found[f"threads_{count}"] = summary(ranks)
    return {"gradient_numel": numel, "gradient_bytes": 4 * numel, "sizes_numel": sizes,
            "calls": calls, "warmup": warmup, "steps": steps, "batch": batch, **found}


# -------------------------------------------------------------------------- rank side
def time_allreduce(numel: int, calls: int, warmup: int) -> list[float]:
    """Seconds of each of ``calls`` back-to-back all-reduces of ``numel`` float32 zeros."""
    import torch
    import torch.distributed as dist

    tensor = torch.zeros(numel)  # zeros: the sums stay 0, never inf or denormal
    for _ in range(warmup):
        dist.all_reduce(tensor)
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - began)
    return times


class _Marks:
    """When the last bucket became ready (the hook's note)."""

    ready = 0.0


def _noting_hook(marks: _Marks, bucket: Any) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    marks.ready = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process here
    return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]


def time_steps(kind: str, features: int, hidden: list[int], batch: int,
               steps: int) -> dict[str, list[float]]:
    """Seconds of each of ``steps`` training steps (after 10 untimed) of ``kind``: local, ddp
    or ddp_hooked; for ddp_hooked also each step's wait after the bucket was ready."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from sparkdist.torchtrain.nets import MLP

    torch.manual_seed(1)
    model: Any = MLP(features, 1, hidden)
    marks = _Marks()
    if kind != "local":
        model = DistributedDataParallel(model)
    if kind == "ddp_hooked":
        model.register_comm_hook(marks, lambda state, bucket: _noting_hook(state, bucket))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.rand(batch, features), torch.randint(0, 2, (batch,)).float()
    times: dict[str, list[float]] = {kind: [], "wait": [], "ready_at": [], "returned_at": []}
    for index in range(10 + steps):
        began = time.monotonic()
        loss = F.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)
        optimizer.zero_grad()
        loss.backward()
        returned = time.monotonic()
        optimizer.step()
        if index >= 10:
            times[kind].append(time.monotonic() - began)
            times["wait"].append(returned - marks.ready)
            times["ready_at"].append(marks.ready)
            times["returned_at"].append(returned)
    return times if kind == "ddp_hooked" else {kind: times[kind]}


def time_gapped(features: int, hidden: list[int], batch: int,
                steps: int) -> dict[str, list[float]]:
    """Seconds of each of ``steps`` all-reduces of the gradient's size (after 10 untimed), each
    after an untimed forward and backward of the MLP without DDP (a step's computation), with
    when each began and ended (CLOCK_MONOTONIC): the bare collective as a step meets it."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from sparkdist.torchtrain.nets import MLP

    torch.manual_seed(1)
    model = MLP(features, 1, hidden)
    x, y = torch.rand(batch, features), torch.randint(0, 2, (batch,)).float()
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    times: dict[str, list[float]] = {"gapped": [], "gapped_began_at": [], "gapped_ended_at": []}
    for index in range(10 + steps):
        model.zero_grad()
        F.binary_cross_entropy_with_logits(model(x).squeeze(-1), y).backward()
        began = time.monotonic()
        dist.all_reduce(flat)
        ended = time.monotonic()
        if index >= 10:
            times["gapped"].append(ended - began)
            times["gapped_began_at"].append(began)
            times["gapped_ended_at"].append(ended)
    return times


def rank_main(args: argparse.Namespace) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    hidden = [int(n) for n in args.hidden.split(",")]
    figures: dict[str, Any] = {"rank": dist.get_rank(), "threads": torch.get_num_threads(),
                               "allreduce": {}, "step": {}}
    for numel in (int(n) for n in args.numel.split(",")):
        figures["allreduce"][str(numel)] = time_allreduce(numel, args.calls, args.warmup)
    for kind in ("local", "ddp", "ddp_hooked"):
        dist.barrier()
        figures["step"].update(time_steps(kind, args.features, hidden, args.batch, args.steps))
    dist.barrier()
    figures["step"].update(time_gapped(args.features, hidden, args.batch, args.steps))
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, figures)
    gc.collect()  # the DDP models (held in cycles by their hooks) before their group
    dist.barrier()
    dist.destroy_process_group()
    return {"ranks": gathered} if figures["rank"] == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numel", required=True, help="comma-separated float32 sizes")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", default="256,256")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = rank_main(args)
    if result is not None:
        Path(args.out).write_text(json.dumps(result["ranks"]))


if __name__ == "__main__":
    main()
