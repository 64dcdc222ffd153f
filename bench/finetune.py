"""Fine-tuning with LoRA adapters (issue 28, "Measure"), every figure from one run on this
machine, timed as bench/_common.py says (wall clock on the driver around the whole call, the
sides alternating; the first call of each side is its cold figure, the median of --repeats
after it the warm one).

The worked example: ``nets.CausalLM`` (4 layers, width 256, 3.2M parameters, random init) is
trained on a first generated task (the token after a sequence is its last token + 1), saved,
then fine-tuned on a second (last token + 2) from a token-sequence column, 2 workers, two
ways: full fine-tuning (every parameter) and LoRA (``adapter="lora"``, rank 8, on every
block's ``q`` and ``v`` and the ``head``), the same epochs, batch and data.

- trainable parameters of the LoRA fit over the model's: target <= 2 %;
- per-rank optimizer state (``optimizer_mb``), LoRA over full: target <= 0.05;
- bytes all-reduced per step (DDP's gradient buckets), LoRA over full: target <= 0.05;
- test loss on the second task after LoRA over the base's before it: target <= 0.5;
- samples/s, LoRA over full, cold and warm (reported);
- merged-adapter scores against separate: the largest difference of ``rawPrediction``,
  target <= 1e-5.

Prints one JSON line; a full run (no --quick) also saves it as bench/results/finetune.json.

    python bench/finetune.py [--quick] [--rows 12800] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from typing import Any

import numpy as np
from _common import cold_and_warm, machine, start_spark, write_result

#: The code this benchmark measures: bench/report.py marks a figure STALE when any of it
#: changed after the figure's commit.
MEASURES = ("sparkdist/models/torch.py", "sparkdist/models/_torch_finetune.py",
            "sparkdist/models/_torch_checks.py", "sparkdist/torchtrain", "sparkdist/launch")
VOCAB, LONGEST = 64, 16
LM = {"vocab": VOCAB, "dim": 256, "layers": 4, "heads": 4, "max_length": LONGEST}
LORA = {"adapter": "lora", "adapterTargets": ["blocks.*.q", "blocks.*.v", "head"],
        "adapterRank": 8, "adapterAlpha": 16}


def task(spark: Any, rows: int, shift: int, seed: int) -> Any:
    """Token sequences of 4-16 ids in 1..VOCAB-1; the label: the last token + ``shift``."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    words = [rng.integers(1, VOCAB, rng.integers(4, LONGEST + 1)) for _ in range(rows)]
    frame = pd.DataFrame({"words": words,
                          "label": [float((w[-1] + shift) % VOCAB) for w in words]})
    df = spark.createDataFrame(frame).repartition(2).cache()
    df.count()
    return df


def estimator(**settings: Any) -> Any:
    from sparkdist.models import TorchEstimator
    from sparkdist.torchtrain import nets

    return TorchEstimator(model=nets.CausalLM, modelKwargs=LM, inputCols={"tokens": "words"},
                          maxSequenceLength=LONGEST, loss="cross_entropy", numClasses=VOCAB,
                          batchSize=64, numWorkers=2, progress=False, seed=3, **settings)


def test_loss(model: Any, df: Any) -> float:
    """Mean cross-entropy of ``model``'s probabilities on ``df``'s labels."""
    frame = model.transform(df).select("probability", "label").toPandas()
    picked = [p[int(label)] for p, label in zip(frame.probability, frame.label)]
    return float(-np.mean(np.log(np.maximum(picked, 1e-12))))


def busiest(model: Any, field: str) -> float:
    return max(rank[field] for rank in model.trainingSummary["ranks"])


def per_step(model: Any) -> float:
    """Bytes rank 0 all-reduced per training step."""
    rank = model.trainingSummary["ranks"][0]
    return rank["allreduce_bytes"] / max(1.0, rank["train_steps"])


def trainable_share(model: Any) -> tuple[int, int]:
    """(adapter parameters, all parameters) of a fitted LoRA model's network."""
    from sparkdist.torchtrain.finetune import is_adapter

    counts = [(is_adapter(name), p.numel()) for name, p in model.module().named_parameters()]
    return sum(n for adapter, n in counts if adapter), sum(n for _, n in counts)


def figures(spark: Any, rows: int, repeats: int, epochs: int) -> dict[str, Any]:
    first = task(spark, max(2000, rows // 2), shift=1, seed=1)
    second, test = task(spark, rows, shift=2, seed=2), task(spark, 2000, shift=2, seed=3)
    base = estimator(epochs=1, learningRate=1e-3).fit(first)
    where = tempfile.mkdtemp(prefix="sparkdist-bench-finetune-")
    base.write().save(f"{where}/base")
    full = estimator(initialWeights=f"{where}/base", epochs=epochs, learningRate=1e-3)
    lora = estimator(initialWeights=f"{where}/base", epochs=epochs, learningRate=2e-3, **LORA)
    cold, warm, last = cold_and_warm({"lora": lambda: lora.fit(second),
                                      "full": lambda: full.fit(second)}, repeats)
    adapted, whole = last["lora"], last["full"]
    samples = rows * epochs
    adapters, total = trainable_share(adapted)
    before, after = test_loss(base, test), test_loss(adapted, test)
    separate = np.array([r[0].toArray() for r in adapted.transform(test).select(
        "rawPrediction").collect()])
    merged = np.array([r[0].toArray() for r in adapted.copy(
        {adapted.mergeAdapters: True}).transform(test).select("rawPrediction").collect()])
    difference = float(np.abs(merged - separate).max())
    speed = {kind: {"lora_samples_per_s": round(samples / seconds["lora"]),
                    "full_samples_per_s": round(samples / seconds["full"]),
                    "ratio": round(seconds["full"] / seconds["lora"], 3)}
             for kind, seconds in (("cold", cold),
                                   ("warm", {k: statistics.median(v) for k, v in warm.items()}))}
    return {
        "trainable": {"adapter_params": adapters, "model_params": total,
                      "share": round(adapters / total, 4), "target": "<= 0.02",
                      "meets_target": adapters / total <= 0.02},
        "optimizer": _ratio(busiest(adapted, "optimizer_mb"), busiest(whole, "optimizer_mb"),
                            "<= 0.05", "MiB of optimizer state on the busiest rank"),
        "allreduce": _ratio(per_step(adapted), per_step(whole), "<= 0.05",
                            "bytes all-reduced per step by rank 0"),
        "loss": {"before": round(before, 4), "after": round(after, 4),
                 "ratio": round(after / before, 4), "target": "<= 0.5",
                 "meets_target": after <= 0.5 * before,
                 "history": [round(r["loss"], 4) for r in adapted.history],
                 "full_after": round(test_loss(whole, test), 4)},
        "speed": speed, "merged": {"max_abs_difference": difference, "target": "<= 1e-5",
                                   "meets_target": difference <= 1e-5,
                                   # the scale: float32 spacing there is up to largest / 2**23
                                   "largest_abs_logit": float(np.abs(separate).max())},
        "setup": {"rows": rows, "epochs": epochs, "repeats": repeats, "model": LM,
                  "lora": LORA, "batch_size": 64, "workers": 2,
                  "warm_runs_s": {k: [round(s, 3) for s in v] for k, v in warm.items()},
                  "cold_s": {k: round(v, 3) for k, v in cold.items()}},
    }


def _ratio(ours: float, full: float, target: str, what: str) -> dict[str, Any]:
    ratio = ours / full
    return {"lora": round(ours, 4), "full": round(full, 4), "ratio": round(ratio, 4),
            "target": target, "meets_target": ratio <= float(target.split()[1]), "what": what}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; nothing saved")
    parser.add_argument("--rows", type=int, default=12_800)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spark = start_spark("sparkdist-bench-finetune")
    rows = 2_560 if args.quick else args.rows
    result = figures(spark, rows, 1 if args.quick else args.repeats, epochs=2)
    write_result("finetune", {**result, "machine": machine(spark)}, save=not args.quick)


if __name__ == "__main__":
    main()
