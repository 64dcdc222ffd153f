"""TorchEstimator's and TorchModel's side of fine-tuning (:mod:`sparkdist.torchtrain.finetune`):
reading ``initialWeights`` on the driver, and a fitted model's adapters and the base they were
trained on. Functions of plain values: the model classes call them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.torchtrain import finetune, inference
from sparkdist.torchtrain.spec import FineTuneSpec

#: The base weights in a saved adapter model's directory (``saveBase=True``).
BASE_FILE = "base.pt"


def read_weights(url: str, load: Callable[[str], Any]) -> tuple[bytes, dict[str, Any]]:
    """The state dict at ``url`` (``initialWeights``), as torch.save'd bytes and tensors: a
    saved TorchModel's directory through its strict reader (``load``: ``TorchModel.load``), a
    file with weights_only=True; ParamError naming the Param for anything else."""
    from sparkdist import store
    from sparkdist.exceptions import StoreError

    try:
        if store.is_file(url):
            raw = store.read_bytes(url)
            return raw, finetune.state_of(raw, url)
        if store.exists(url):
            state = load(url)._weights
            return inference.weights_bytes(state), state
    except (StoreError, ModelLoadError) as err:
        raise ParamError(f"initialWeights={url!r} cannot be read: {err}") from err
    raise ParamError(f"initialWeights={url!r} does not exist; give a saved TorchModel's "
                     f"directory or a state-dict file.")


def adapters_of(info: dict[str, Any]) -> FineTuneSpec:
    """The adapters a fitted model was trained with, from its metadata (untrusted: plain
    numbers and name patterns, or ModelLoadError)."""
    saved = info["adapter"]
    try:
        return FineTuneSpec(adapter="lora", adapter_rank=int(saved["rank"]),
                            adapter_alpha=int(saved["alpha"]),
                            adapter_dropout=float(saved["dropout"]),
                            adapter_targets=tuple(str(t) for t in saved["targets"]))
    except (KeyError, TypeError, ValueError, ParamError) as err:
        raise ModelLoadError(f"the saved adapters were edited ({err!r}); save the model "
                             f"again.") from err


def base_of(info: dict[str, Any], load: Callable[[str], Any], saved_in: str) -> bytes:
    """The base weights a fitted model's adapters were trained on: from its directory
    ``saved_in`` where it was saved with them (saveBase), else from where initialWeights named
    them. ModelLoadError where they are gone or their SHA-256 changed."""
    from sparkdist import store
    from sparkdist.exceptions import StoreError

    record = info["initial_weights"]
    where = f"{saved_in}/{BASE_FILE}" if record.get("saved") else str(record["source"])
    try:
        if record.get("saved"):
            raw = store.read_bytes(where)
            state = finetune.state_of(raw, where)
        else:
            raw, state = read_weights(where, load)
    except (ParamError, StoreError) as err:
        raise ModelLoadError(f"the base weights of these adapters cannot be read: {err}") \
            from err
    found = finetune.state_sha256(state)
    if found != record["sha256"]:
        raise ModelLoadError(f"the base weights at {where!r} changed since the adapters were "
                             f"trained on them (SHA-256 {found}, trained on "
                             f"{record['sha256']}); give the adapters their base back, or "
                             f"fine-tune again.")
    return raw


def saved_state(info: dict[str, Any], with_base: bool) -> dict[str, Any]:
    """The state a model saves: ``info``, with an adapter model's record saying whether its
    directory holds the base (``with_base``: saveBase)."""
    if not info.get("adapter"):
        return info
    return {**info, "initial_weights": {**info["initial_weights"], "saved": with_base}}


def adapted(module: Any, info: dict[str, Any], base: bytes, weights: dict[str, Any],
            merge: bool) -> Any:
    """``module`` (the network, built) with the base loaded, the adapters added and their
    trained ``weights`` loaded; ``merge``: merged into their layers."""
    import dataclasses

    finetune.prepare(module, dataclasses.replace(adapters_of(info), base=base))
    finetune.load_trained(module, weights)
    return finetune.merged(module) if merge else module
