"""What the TorchEstimator strategy and recovery tests share: accuracy on a DataFrame, weight
equality, and one training stage launched directly on a run's checkpoints (the ranks' resume
path alone, without the driver's run guard)."""

from __future__ import annotations

from typing import Any

import torch


def accuracy(model: Any, df: Any) -> float:
    return model.transform(df).where("prediction = label").count() / df.count()


def same_weights(a: Any, b: Any) -> bool:
    first, second = a.module().state_dict(), b.module().state_dict()
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k])
                                                  for k in first)


def train_stage(estimator: Any, df: Any, run_dir: str, **spec: Any) -> tuple[dict, dict]:
    """``estimator``'s training stage on ``df`` resuming from ``run_dir``'s checkpoints (with
    ``spec`` entries overridden): the state dict and the result header rank 0 returns."""
    from sparkdist.models import _torch_checks as checks
    from sparkdist.torchtrain import launch, loop

    code = {"module": loop.resolve_model(estimator.getOrDefault("model")),
            "loss_fn": loop.resolve_loss(estimator.getOrDefault("loss"))}
    prepared = checks.prepare(estimator, df)
    stats = estimator._read_data(df, prepared, identity=False)
    full = {**estimator._spec(stats), **code, "checkpoint_dir": run_dir, "run_id": "r", **spec}
    return loop.unpack_result(launch.train(prepared, full, estimator.getOrDefault))
