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


def train_stage(estimator: Any, df: Any, run_dir: str,
                epochs: int | None = None) -> tuple[dict, dict]:
    """``estimator``'s training stage on ``df`` resuming from ``run_dir``'s checkpoints (with
    ``epochs`` overridden): the state dict and the result header rank 0 returns."""
    import dataclasses

    from sparkdist.torchtrain import launch, loop

    prepared, spec, _ = estimator._train_spec(df, run_dir, "r")
    if epochs is not None:
        spec = dataclasses.replace(spec, optim=dataclasses.replace(spec.optim, epochs=epochs))
    return loop.unpack_result(launch.train(prepared, spec))


def train_spec(strategy: str = "ddp", **changes: Any) -> Any:
    """A TrainSpec for the rank-side tests (no estimator): an MLP on 5 inputs, one output,
    bce, 4 workers; ``changes`` set fields by name in whichever spec part has them."""
    import dataclasses

    from sparkdist.torchtrain import spec as parts
    from sparkdist.torchtrain.nets import MLP

    made = parts.TrainSpec(
        model=parts.ModelSpec(module=MLP, module_name="sparkdist.torchtrain.nets.MLP",
                              module_kwargs={"hidden": [12, 6]}, loss="bce", loss_fn="bce",
                              input_dim=5, output_dim=1, num_classes=2),
        optim=parts.OptimSpec(optimizer="adam", learning_rate=1e-3, weight_decay=0.0,
                              batch_size=8, epochs=1, seed=0, patience=0),
        strategy=parts.StrategySpec(name=strategy), comm=parts.CommSpec(backend="torch"),
        checkpoint=parts.CheckpointSpec(),
        launch=parts.LaunchSpec(num_workers=4, use_gpu=False, min_workers=1, slot_wait_s=1.0,
                                timeout_s=60.0, rendezvous_timeout_s=60.0, max_retries=0,
                                progress=False),
        rules=parts.DataRules(source="features", label_col="label", nan_policy="error",
                              batch_size=8, loss="bce", num_classes=2))
    unused = set(changes)
    for part in dataclasses.fields(made):
        value = getattr(made, part.name)
        if not dataclasses.is_dataclass(value):
            continue
        mine = {name: changes[name] for name in changes
                if name in {f.name for f in dataclasses.fields(value)}}
        unused -= set(mine)
        made = dataclasses.replace(made, **{part.name: dataclasses.replace(value, **mine)})
    if "hooks" in changes:
        made, unused = dataclasses.replace(made, hooks=changes["hooks"]), unused - {"hooks"}
    assert not unused, f"no spec field is called {sorted(unused)}"
    return made
