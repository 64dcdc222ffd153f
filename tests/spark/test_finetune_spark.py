"""Fine-tuning (issue 28, its first part): a fit that starts from trained weights
(``initialWeights``: a saved TorchModel's directory or a state-dict file) and trains only what
``freeze`` leaves out, under ddp and fsdp: frozen parameters bitwise unchanged, less optimizer
state and traffic than full fine-tuning, exact resume after a killed rank, and each bad
input a ParamError naming the Param before launch (a pickled object is never unpickled)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch

from sparkdist.exceptions import ParamError
from sparkdist.failpoints import arm
from sparkdist.models import TorchEstimator
from sparkdist.torchtrain.backends import horovod_available

COMMON = {"progress": False, "numWorkers": 2, "seed": 9, "rendezvousTimeoutSeconds": 60,
          "featureCols": ["x1", "x2", "x3"], "modelKwargs": {"hidden": [32, 32]},
          "loss": "bce", "learningRate": 0.01, "batchSize": 32}
FROZEN = ["layers.0", "layers.2"]  # the two hidden layers; the output layer trains


@pytest.fixture(scope="module")
def tasks(spark, cached):
    """x1..x3 uniform in [-1, 1]; ``first`` = x1 + x2 > 0, ``second`` = x1 + x2 > 0.5 (a
    task the first one's features serve)."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (800, 3))
    frame = pd.DataFrame({"x1": x[:, 0], "x2": x[:, 1], "x3": x[:, 2],
                          "first": (x[:, 0] + x[:, 1] > 0).astype(float),
                          "second": (x[:, 0] + x[:, 1] > 0.5).astype(float)})
    with cached(spark.createDataFrame(frame).repartition(2)) as df:
        yield df


@pytest.fixture(scope="module")
def pretrained(tasks, tmp_path_factory):
    """A network trained on the first task, saved as a TorchModel and as a state-dict file."""
    model = TorchEstimator(labelCol="first", epochs=6, **COMMON).fit(tasks)
    where = tmp_path_factory.mktemp("base")
    model.write().save(str(where / "model"))
    torch.save(model.module().state_dict(), str(where / "weights.pt"))
    return model, str(where / "model"), str(where / "weights.pt")


def _state(model) -> dict[str, torch.Tensor]:
    return model.module().state_dict()


def _accuracy(model, df, label) -> float:
    return model.transform(df).where(f"prediction = {label}").count() / df.count()


def test_a_frozen_base_keeps_its_weights_and_the_rest_learns_the_second_task(tasks, pretrained):
    base, directory, _ = pretrained
    tuned = TorchEstimator(labelCol="second", epochs=8, initialWeights=directory,
                           freeze=FROZEN, **COMMON).fit(tasks)
    full = TorchEstimator(labelCol="second", epochs=8, initialWeights=directory,
                          **COMMON).fit(tasks)
    before, after = _state(base), _state(tuned)
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith(("layers.0.",
                                                                                  "layers.2.")))
    assert not torch.equal(before["layers.4.weight"], after["layers.4.weight"])
    # the head alone moves the base from its first task (0.79 here) to the second
    assert _accuracy(tuned, tasks, "second") > _accuracy(base, tasks, "second") + 0.05
    assert tuned.history[-1]["loss"] < 0.5 * tuned.history[0]["loss"]
    # the optimizer holds state, and DDP all-reduces gradients, of the output layer only
    frozen, whole = (m.trainingSummary["ranks"][0] for m in (tuned, full))
    assert frozen["state_mb"] < 0.5 * whole["state_mb"]
    assert frozen["optimizer_mb"] < 0.05 * whole["optimizer_mb"]
    assert frozen["sent_mb"] < 0.2 * whole["sent_mb"]


def test_a_state_dict_file_under_fsdp_leaves_the_frozen_layers_bitwise(tasks, pretrained):
    base, _, weights = pretrained
    tuned = TorchEstimator(labelCol="second", epochs=2, initialWeights=weights, freeze=FROZEN,
                           strategy="fsdp", **COMMON).fit(tasks)
    before, after = _state(base), _state(tuned)
    assert all(torch.equal(before[k], after[k]) for k in before if not k.startswith("layers.4"))
    assert not torch.equal(before["layers.4.bias"], after["layers.4.bias"])


def test_a_killed_rank_resumes_a_fine_tuning_fit_to_the_uninterrupted_weights(tasks, pretrained,
                                                                            tmp_path):
    _, directory, _ = pretrained
    settings = {**COMMON, "labelCol": "second", "epochs": 3, "initialWeights": directory,
                "freeze": FROZEN}
    clean = TorchEstimator(checkpointDir=str(tmp_path / "clean"), **settings).fit(tasks)
    killed = arm(TorchEstimator(checkpointDir=str(tmp_path / "ckpt"), **settings),
                 str(tmp_path), rank=1, epoch=2, step=3, action="kill").fit(tasks)
    assert killed.trainingSummary["resumed_from_epoch"] == 1
    first, second = _state(clean), _state(killed)
    assert all(torch.equal(first[k], second[k]) for k in first)


class Evil:
    """Unpickling it would create a file: the weights loader must never do so."""

    def __reduce__(self):
        return (os.makedirs, (os.environ["SPARKDIST_EVIL_MARK"],))


@pytest.mark.parametrize(("params", "message"), [
    ({"freeze": ["decoder.*"]}, r"freeze=\['decoder.\*'\]: \['decoder.\*'\] match no parameter"),
    ({"freeze": ["layers"]}, "freezes every parameter of the network: nothing would train"),
    ({"modelKwargs": {"hidden": [8]}}, "does not fit the network: .*layers.0.weight"),
    ({"initialWeights": "/nonexistent/weights.pt"}, "does not exist"),
])
def test_bad_initial_weights_or_freeze_are_refused_naming_the_param(tasks, pretrained, params,
                                                                    message):
    settings = {**COMMON, "labelCol": "second", "epochs": 1, "initialWeights": pretrained[1],
                **params}
    with pytest.raises(ParamError, match=message):
        TorchEstimator(**settings).fit(tasks)


def test_a_pickled_object_as_initial_weights_is_refused_unopened(tasks, tmp_path, monkeypatch):
    mark = tmp_path / "unpickled"
    monkeypatch.setenv("SPARKDIST_EVIL_MARK", str(mark))
    torch.save({"layers.0.weight": Evil()}, str(tmp_path / "evil.pt"))
    with pytest.raises(ParamError, match="weights_only=True"):
        TorchEstimator(labelCol="second", initialWeights=str(tmp_path / "evil.pt"),
                       **COMMON).fit(tasks)
    assert not mark.exists()


# ----------------------------------------------------------------------------- adapters
LORA = {"adapter": "lora", "adapterTargets": ["layers.*"], "adapterRank": 4,
        "adapterAlpha": 8, "learningRate": 0.02}


@pytest.fixture(scope="module")
def adapted(tasks, pretrained, tmp_path_factory):
    """LoRA adapters on the pretrained network, fitted on the second task under ddp, from a
    copy of the base file (a test may change it)."""
    import shutil

    base = str(tmp_path_factory.mktemp("lora") / "base.pt")
    shutil.copy(pretrained[2], base)
    model = TorchEstimator(labelCol="second", epochs=8, initialWeights=base,
                           **{**COMMON, **LORA}).fit(tasks)
    return model, base


def test_lora_adapters_train_alone_on_a_frozen_base(tasks, pretrained, adapted):
    model, _ = adapted
    assert model._weights and all(".lora_" in name for name in model._weights)
    base = _state(pretrained[0])
    module = model.module()
    trained = module.state_dict()
    assert all(torch.equal(base[name], trained[name.replace("weight", "base_layer.weight")
                                                .replace("bias", "base_layer.bias")])
               for name in base)
    assert model.history[-1]["loss"] < 0.5 * model.history[0]["loss"]
    assert _accuracy(model, tasks, "second") > _accuracy(pretrained[0], tasks, "second") + 0.05
    first, last = (m.trainingSummary["ranks"][0] for m in (model, pretrained[0]))
    assert first["sent_mb"] < last["sent_mb"]  # the adapters' gradients only


def test_merged_adapters_score_as_the_separate_ones(tasks, adapted):
    model, _ = adapted
    separate = model.transform(tasks).select("rawPrediction").collect()
    merged = model.copy({model.mergeAdapters: True}).transform(tasks).select(
        "rawPrediction").collect()
    np.testing.assert_allclose(np.array([r[0].toArray() for r in merged]),
                               np.array([r[0].toArray() for r in separate]), atol=1e-5)
    plain = model.copy({model.mergeAdapters: True}).module()
    assert not any("lora" in name for name in plain.state_dict())


def test_an_adapter_model_saves_the_adapters_and_refuses_a_changed_base(tasks, adapted,
                                                                       tmp_path):
    from sparkdist.exceptions import ModelLoadError
    from sparkdist.models import TorchModel

    model, base = adapted
    model.write().save(str(tmp_path / "adapters"))
    model.copy({model.saveBase: True}).write().save(str(tmp_path / "with_base"))
    assert not list((tmp_path / "adapters").rglob("base.pt"))  # never copied unless asked
    [copied] = (tmp_path / "with_base").rglob("base.pt")
    loaded = TorchModel.load(str(tmp_path / "adapters"))
    first, second = (m.transform(tasks).select("probability").collect() for m in (model, loaded))
    assert first == second
    state = torch.load(base, weights_only=True)
    state["layers.0.bias"] += 1.0
    torch.save(state, base)
    with pytest.raises(ModelLoadError, match="changed since the adapters were trained"):
        TorchModel.load(str(tmp_path / "adapters"))
    # saved with its base, the model no longer depends on initialWeights' path...
    kept = TorchModel.load(str(tmp_path / "with_base"))
    assert kept.getSaveBase() and kept.transform(tasks).select("probability").collect() == first
    # ...and the copy is checked against the SHA-256 the adapters were trained on
    torch.save(state, str(copied))
    with pytest.raises(ModelLoadError, match="changed since the adapters were trained"):
        TorchModel.load(str(tmp_path / "with_base"))


def test_adapters_under_fsdp_reach_ddps_loss(tasks, adapted):
    model, base = adapted
    sharded = TorchEstimator(labelCol="second", epochs=8, initialWeights=base,
                             strategy="fsdp", **{**COMMON, **LORA}).fit(tasks)
    assert sharded.history[-1]["loss"] == pytest.approx(model.history[-1]["loss"], rel=0.05)


def test_a_killed_rank_resumes_an_adapter_fit_to_the_uninterrupted_weights(tasks, pretrained,
                                                                          tmp_path):
    settings = {**COMMON, **LORA, "labelCol": "second", "epochs": 3,
                "initialWeights": pretrained[2]}
    clean = TorchEstimator(checkpointDir=str(tmp_path / "clean"), **settings).fit(tasks)
    killed = arm(TorchEstimator(checkpointDir=str(tmp_path / "ckpt"), **settings),
                 str(tmp_path), rank=1, epoch=2, step=3, action="kill").fit(tasks)
    assert killed.trainingSummary["resumed_from_epoch"] == 1
    assert clean._weights.keys() == killed._weights.keys()
    assert all(torch.equal(clean._weights[k], killed._weights[k]) for k in clean._weights)


@pytest.mark.parametrize(("params", "message"), [
    ({"adapterTargets": ["decoder"]}, "'decoder' matches no Linear"),
    ({"initialWeights": ""}, "adapter='lora' needs initialWeights"),
    ({"strategy": "pipeline", "pipelineStages": 2}, "adapter='lora' with strategy='pipeline'"),
    ({"adapterDropout": 1.0}, r"adapterDropout=1.0: use a fraction in \[0, 1\)"),
])
def test_bad_adapters_are_refused_naming_the_param(tasks, pretrained, params, message):
    settings = {**COMMON, **LORA, "labelCol": "second", "epochs": 1,
                "initialWeights": pretrained[2], **params}
    with pytest.raises(ParamError, match=message):
        TorchEstimator(**settings).fit(tasks)


# ------------------------------------------------------------- the worked example (docs)
def _next_token_task(spark, rows, shift, seed):
    """Token sequences of 3-8 ids in 1..15; the label: the last token + ``shift`` (mod 16)."""
    rng = np.random.default_rng(seed)
    words = [rng.integers(1, 16, rng.integers(3, 9)).tolist() for _ in range(rows)]
    frame = pd.DataFrame({"words": words, "label": [float((w[-1] + shift) % 16) for w in words]})
    return spark.createDataFrame(frame).repartition(2)


def test_a_causal_lm_pretrained_on_one_task_is_lora_tuned_to_another(spark, tmp_path):
    from sparkdist.torchtrain import nets

    lm = {"progress": False, "numWorkers": 2, "seed": 4, "rendezvousTimeoutSeconds": 60,
          "model": nets.CausalLM, "inputCols": {"tokens": "words"}, "maxSequenceLength": 8,
          "modelKwargs": {"vocab": 16, "dim": 32, "layers": 2, "heads": 2, "max_length": 8},
          "loss": "cross_entropy", "numClasses": 16, "batchSize": 32}
    first, second = (_next_token_task(spark, 1500, shift, seed) for shift, seed in ((1, 1),
                                                                                    (2, 2)))
    base = TorchEstimator(epochs=4, learningRate=3e-3, **lm).fit(first)
    assert _accuracy(base, first, "label") > 0.9
    base.write().save(str(tmp_path / "lm"))
    tuned = TorchEstimator(epochs=4, learningRate=1e-2, initialWeights=str(tmp_path / "lm"),
                           adapter="lora", adapterTargets=["blocks.*.q", "blocks.*.v", "head"],
                           adapterRank=4, adapterAlpha=8, **lm).fit(second)
    assert tuned.history[-1]["loss"] <= 0.5 * tuned.history[0]["loss"]
    assert _accuracy(tuned, second, "label") > _accuracy(base, second, "label") + 0.5


def test_initial_weights_come_from_an_object_store(tasks, pretrained, moto_s3):
    """A state-dict file and a saved TorchModel on S3 (the moto server), the base of a fit
    with adapters; the adapter model reads its base from there again when loaded."""
    from sparkdist.models import TorchModel

    base, _, weights = pretrained
    if not moto_s3.exists("finetune-bases"):
        moto_s3.mkdir("finetune-bases")
    moto_s3.put(weights, "finetune-bases/weights.pt")
    base.write().overwrite().save("s3://finetune-bases/model")
    for url in ("s3://finetune-bases/weights.pt", "s3://finetune-bases/model"):
        model = TorchEstimator(labelCol="second", epochs=1, initialWeights=url,
                               **{**COMMON, **LORA}).fit(tasks)
        assert model._info["initial_weights"]["source"] == url
    model.write().save("s3://finetune-bases/adapters")
    loaded = TorchModel.load("s3://finetune-bases/adapters")
    assert torch.equal(next(iter(loaded._weights.values())), next(iter(model._weights.values())))


# ------------------------------------------------------------ the other strategies and backend
@pytest.mark.horovod
@pytest.mark.skipif(os.environ.get("SPARKDIST_REQUIRE_HOROVOD") != "1"
                    and not horovod_available(), reason="horovod.torch is not importable")
def test_horovod_and_pipeline_leave_the_frozen_layers_bitwise(tasks, pretrained):
    base, directory, _ = pretrained
    before = _state(base)
    for settings in ({"backend": "horovod"}, {"strategy": "pipeline", "pipelineStages": 2}):
        tuned = TorchEstimator(labelCol="second", epochs=2, initialWeights=directory,
                               freeze=["layers.2"], **{**COMMON, **settings}).fit(tasks)
        after = _state(tuned)
        assert all(torch.equal(before[k], after[k]) for k in before if k.startswith("layers.2"))
        assert not torch.equal(before["layers.0.weight"], after["layers.0.weight"]), settings
    # a pipeline stage left with nothing to train is refused before launch
    with pytest.raises(ParamError, match="stage 0 would run only 0, 1, which hold no "
                                         "trainable parameters"):
        TorchEstimator(labelCol="second", epochs=1, initialWeights=directory,
                       freeze=["layers.0"], strategy="pipeline", pipelineStages=2,
                       **COMMON).fit(tasks)
