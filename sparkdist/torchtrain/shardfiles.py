"""The files parameter servers write through the store (``strategy="ps"``): one per server
(:func:`shard_file`), each checked against its SHA-256 and read as tensors only
(:func:`checked_file`). A checkpoint's shards hold rows and their optimizer state; the rows of
tables no rank holds whole (built on the meta device) are written for the fitted model too,
and the driver puts them together (:func:`with_stored_rows`), because no rank can."""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from typing import Any

import torch

from sparkdist import store
from sparkdist.exceptions import TrainingError


def shard_file(server: int) -> str:
    return f"ps-server-{server}.pt"


def check_shape(url: str, saved: dict[str, Any], name: str, whole: tuple[int, int],
                 rows: int, state: Any) -> None:
    """TrainingError unless ``saved`` holds ``rows`` rows of table ``name`` (``whole``: the
    table's shape) and their optimizer ``state`` (its names)."""
    part = saved.get(name) if isinstance(saved, dict) else None
    expected = {"rows", "step", "weight", *state}
    shape = (rows, whole[1])
    if not isinstance(part, dict) or set(part) != expected or not all(
            isinstance(value, torch.Tensor) for value in part.values()) or int(
            part["rows"]) != whole[0] or any(
            part[key].shape != shape for key in expected - {"rows", "step"}):
        raise TrainingError(f"{url} does not hold {rows} rows of table {name!r} with "
                            f"{sorted(state)}: it was written for another model or "
                            "psOptimizer; resume from another runId, or resume='never'.")


RESUME_FIX = "resume from another runId, or resume='never'"


def checked_file(url: str, digest: str,
                  fix: str = RESUME_FIX) -> dict[str, dict[str, torch.Tensor]]:
    try:
        data = store.read_bytes(url)
    except FileNotFoundError:
        raise TrainingError(f"{url} is missing: it was removed after it was written; "
                            f"{fix}.") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise TrainingError(f"{url} is damaged (SHA-256): {fix}.")
    loaded: dict[str, dict[str, torch.Tensor]] = torch.load(io.BytesIO(data),
                                                            weights_only=True)
    return loaded


#: The entry of a fitted model's state dict that stands for tables no rank holds whole: where
#: the servers wrote their trained rows, for the driver to put together.
STORED_ROWS = "sparkdist.ps.stored_rows"


#: The directories under a run's checkpoint directory where servers write rows for a model.
MODEL_DIR = "ps-model-"


def new_model_dir(run_dir: str) -> str:
    return f"{run_dir}/{MODEL_DIR}{uuid.uuid4().hex[:12]}"


def remove_model_dirs(run_dir: str) -> None:
    """Remove what attempts before this one wrote for a model the driver never read (an
    attempt killed, or a driver that failed putting the table together)."""
    for name in store.listdir(run_dir):
        if name.startswith(MODEL_DIR):
            store.remove(f"{run_dir}/{name}")


def stored_rows(where: str, digests: list[str], tables: dict[str, tuple[int, int]],
                keys: list[str]) -> torch.Tensor:
    """The :data:`STORED_ROWS` entry: the servers' files under ``where`` (their SHA-256s, in
    server order), the tables' shapes and the state dict's keys in order, as JSON bytes (a
    state dict travels as tensors only)."""
    text = json.dumps({"where": where, "files": digests, "tables": tables, "keys": keys})
    return torch.tensor(list(text.encode()), dtype=torch.uint8)


def with_stored_rows(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the tables its :data:`STORED_ROWS` entry names read from the servers'
    files, each checked against its SHA-256 and loaded as tensors only, and the files
    removed (the model holds the rows now); ``state`` itself where it has no such entry."""
    if STORED_ROWS not in state:
        return state
    found = json.loads(bytes(state.pop(STORED_ROWS).tolist()))
    where, digests = str(found["where"]), [str(d) for d in found["files"]]
    servers = len(digests)
    whole = {str(name): torch.empty(int(rows), int(dim))
             for name, (rows, dim) in found["tables"].items()}
    for server, digest in enumerate(digests):
        url = f"{where}/{shard_file(server)}"
        saved = checked_file(url, digest, "fit again (the servers wrote it for this fit's "
                              "model under checkpointDir)")
        for name, table in whole.items():
            rows = -(-(table.shape[0] - server) // servers)
            check_shape(url, saved, name, (table.shape[0], table.shape[1]), rows, ())
            table[server::servers] = saved[name]["weight"]
        del saved
    state.update({f"{name}.weight": table for name, table in whole.items()})
    store.remove(where)
    return {key: state[key] for key in found["keys"] if key in state}
