"""Sharded checkpoints: every rank writes its own part of the model and optimizer state with
``torch.distributed.checkpoint`` (DCP), and a checkpoint loads into any number of workers.

Writing (:func:`save`, collective): the shard directory the loop names
(:meth:`sparkdist.store.Checkpoints.shard_dir`) is emptied (a killed save may have left
files there), every rank writes its shard of ``get_state_dict(model, optimizer)`` (DTensors,
so no rank ever holds the whole state), and each file's SHA-256 reaches rank 0, which returns
``{"sharded": where, "files": {name: sha256}}``. The loop puts that into the checkpoint file
it commits atomically and checksummed (``ckpt-N``): a shard directory without a committed
checkpoint naming it is never read, and :class:`sparkdist.store.Checkpoints` removes it.

Reading (:func:`load`, collective): every file's digest is checked first (the ranks split the
files between them and agree on the outcome), then DCP reads each rank's slices, resharding
when the checkpoint was written by another number of workers. A checkpoint may come from
someone else, so nothing on this path unpickles arbitrary classes: DCP's ``.metadata`` (a
pickle, which DCP reads with plain ``pickle.load``) goes through an allowlisting unpickler
(:func:`load_metadata`), and the non-tensor values (DCP's planner calls
``torch.load(weights_only=False)`` on them) through ``torch.load(weights_only=True)``.

Paths are local, ``file:`` or any fsspec URL :mod:`sparkdist.store` supports. The functions
take the model and optimizer of any strategy whose parameters are DTensors over the default
process group (fsdp, tensor), or plain tensors (the same on every rank).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import pickle
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

from sparkdist import store
from sparkdist.exceptions import TrainingError

if TYPE_CHECKING:
    import torch

METADATA = ".metadata"  # DCP's file name for the global metadata
_CHUNK = 8 << 20

#: module -> the names an unpickled DCP ``.metadata`` may refer to ("*": every class defined
#: in that module). Enough for what torch 2.x's DCP writes: its metadata dataclasses, file
#: storage records, tensor sizes, dtypes and layouts, and paths.
ALLOWED_GLOBALS: dict[str, set[str]] = {
    "torch.distributed.checkpoint.metadata": {"*"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch": {"Size"},  # and the dtypes and layouts, checked by type
    "torch.serialization": {"_get_layout"},  # maps a layout's name to the layout, no more
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath",
                "PureWindowsPath"},
    "collections": {"OrderedDict"},
    "builtins": {"dict", "list", "tuple", "set", "frozenset", "bytes", "bytearray"},
    "_codecs": {"encode"},  # how protocol 2 pickles bytes
}


def fresh_dtensor_caches() -> None:
    """Forget DTensor's cached sharding propagation; call before building DTensors.

    Spark reuses Python workers, and a worker that was rank 1 of one fit may be rank 0 of the
    next. A DeviceMesh compares equal to an earlier one of the same shape whatever rank built
    it, so DTensor's sharding-propagation caches (Python and C++) hand back specs holding the
    earlier fit's mesh, whose coordinate is the earlier rank: the shards themselves stay right,
    but their global offsets (what DCP writes into a checkpoint's metadata) come out as the
    other rank's, and a checkpoint with two chunks at one offset loads the wrong bytes
    (measured with torch 2.13: 2 ranks swapping between fits)."""
    from torch.distributed.tensor import debug

    debug._clear_sharding_prop_cache()


# --------------------------------------------------------------------------------- writing
def save(where: str, model: torch.nn.Module, optimizer: Any,
         from_base: bool) -> dict[str, Any] | None:
    """Write every rank's shard of the model and optimizer state into directory ``where``
    (``from_base``: without the frozen parameters, which initialWeights gives back); rank 0
    returns ``{"sharded": where, "files": {name: sha256}}`` (None on the others).
    Collective."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if dist.get_rank() == 0:
        store.remove(where)  # what a killed save left under this name
    dist.barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer,
                                                  options=_options(from_base))
    with _dcp_errors(f"writing the sharded checkpoint {where}", "check that checkpointDir "
                     "is writable by every executor and has room"):
        metadata = dcp.save({"model": model_state, "optimizer": optimizer_state},
                            storage_writer=_writer(where))
    names = sorted({info.relative_path for info in metadata.storage_data.values()}
                   | {METADATA})
    digests = _split_work(names, lambda name: _sha256(f"{where}/{name}"))
    if dist.get_rank() != 0:
        return None
    return {"sharded": where, "files": digests}


def _writer(where: str) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    location = store.locate(where, "checkpointDir")
    if location.local:
        return FileSystemWriter(location.path, single_file_per_rank=True)
    return FsspecWriter(_fsspec_url(location), single_file_per_rank=True)


# --------------------------------------------------------------------------------- reading
def load(saved: dict[str, Any], model: torch.nn.Module, optimizer: Any,
         from_base: bool) -> None:
    """Verify every shard file of ``saved`` (what :func:`save` returned with ``from_base``),
    then load this rank's part of it into ``model`` and ``optimizer`` (any number of ranks).
    Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if "sharded" not in saved or "files" not in saved:
        raise TrainingError("this checkpoint holds whole state dicts, not shards; it was "
                            "written by another strategy: use a new runId.")
    where, files = str(saved["sharded"]), dict(saved["files"])
    verify(where, files)
    # the templates: this rank's slices, in the layout of the current world size (this also
    # creates the optimizer's state, which DCP fills in place)
    model_state, optimizer_state = get_state_dict(model, optimizer,
                                                  options=_options(from_base))
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    with _dcp_errors(f"reading the sharded checkpoint {where}", "resume from another runId, "
                     "or resume='never' to start again"):
        dcp.load(state, storage_reader=_reader(where), planner=_safe_planner())
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"], options=_options(from_base, strict=False))


def _options(from_base: bool, strict: bool = True) -> Any:
    """``from_base``: frozen parameters stay out of checkpoints (a resume takes them from
    initialWeights again; loading leaves them as they are). Otherwise a parameter without
    gradients is state (Keras' BatchNormalization statistics) and is kept."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=from_base, strict=strict)


def verify(where: str, files: dict[str, str]) -> None:
    """TrainingError unless every file in ``files`` holds the bytes its SHA-256 says; the
    ranks check a share each and raise together. Collective."""
    names = sorted(files)

    def check(name: str) -> str | None:
        try:
            digest = _sha256(f"{where}/{name}")
        except FileNotFoundError:
            return f"{where}/{name} is missing"
        return None if digest == files[name] else f"{where}/{name} is damaged (SHA-256)"

    problems = [problem for problem in _split_work(names, check).values() if problem]
    if problems:
        raise TrainingError(f"sharded checkpoint {where}: {'; '.join(problems)}. Its files "
                            "changed after the checkpoint was committed; resume from another "
                            "runId, or resume='never' to start again.")


def _reader(where: str) -> Any:
    location = store.locate(where, "checkpointDir")
    if location.local:
        return _reader_classes()[0](location.path)
    return _reader_classes()[1](_fsspec_url(location))


@functools.cache
def _reader_classes() -> tuple[type, type]:
    """DCP's file and fsspec readers with :func:`load_metadata` for ``.metadata`` (built on
    first use: torch is imported only where training runs)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeMetadata:
        """``read_metadata`` as DCP's own, with the allowlisting unpickler."""

        fs: Any
        load_id: str

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = self._get_metadata_path(kwargs.get("rank"))  # type: ignore[attr-defined]
            with self.fs.create_stream(path, "rb") as stream:
                metadata = load_metadata(stream)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class SafeFileSystemReader(SafeMetadata, FileSystemReader):
        pass

    class SafeFsspecReader(SafeMetadata, FsspecReader):
        pass

    return SafeFileSystemReader, SafeFsspecReader


def _safe_planner() -> Any:
    return _planner_class()()


@functools.cache
def _planner_class() -> type:
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
        """DCP's default planner, reading non-tensor values (the optimizer's
        hyperparameters: numbers, strings, containers) with ``weights_only=True`` where the
        default calls ``torch.load(weights_only=False)``."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict,
                            self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return WeightsOnlyLoadPlanner


def load_metadata(stream: BinaryIO) -> Any:
    """Unpickle DCP's ``.metadata`` allowing only :data:`ALLOWED_GLOBALS`; a pickle that names
    anything else (``os.system``...) raises TrainingError before it is called."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = _MetadataUnpickler(stream).load()
    except Exception as err:  # refused, truncated, a missing attribute, huge bytes (MemoryError)
        why = err if isinstance(err, pickle.UnpicklingError) else f"{type(err).__name__}: {err}"
        raise TrainingError(f"refused a sharded checkpoint's {METADATA}: {why}") from err
    if not isinstance(metadata, Metadata):
        raise TrainingError(f"a sharded checkpoint's {METADATA} holds a "
                            f"{type(metadata).__name__}, not DCP metadata.")
    return metadata


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import torch

        allowed = ALLOWED_GLOBALS.get(module, set())
        found = super().find_class(module, name) if module in ALLOWED_GLOBALS else None
        if name in allowed or (module == "torch" and isinstance(found, torch.dtype
                                                                | torch.layout)):
            return found
        if "*" in allowed and isinstance(found, type) and found.__module__ == module:
            return found
        raise pickle.UnpicklingError(f"it names {module}.{name}, which DCP metadata never "
                                     "holds (only its own records, sizes and dtypes are "
                                     "allowed)")


# ------------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def _dcp_errors(doing: str, fix: str) -> Iterator[None]:
    """Raise what DCP raises as a TrainingError carrying its cause. DCP's
    ``CheckpointException`` is a BaseException, which no ``except Exception`` (the ranks'
    failure reports) sees; interrupts stay what they are."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as err:
        raise TrainingError(f"{doing} failed: {_cause(err)}; {fix}.") from err


def _cause(err: BaseException) -> str:
    """Each failed rank's error of a ``CheckpointException`` (DCP gathers them all), else
    the error itself."""
    failures = getattr(err, "failures", None)  # {rank: (error, traceback summary)}
    if isinstance(failures, dict) and failures:
        return "; ".join(f"rank {rank}: {type(found[0]).__name__}: {found[0]}"
                         for rank, found in sorted(failures.items()))
    return f"{type(err).__name__}: {err}"


def _split_work(names: list[str], work: Any) -> dict[str, Any]:
    """``{name: work(name)}`` for every name, each computed by one rank (name i by rank
    i mod world) and gathered on every rank. Collective."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = {name: work(name) for index, name in enumerate(names) if index % world == rank}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    return {name: value for part in gathered for name, value in part.items()}


def _sha256(url: str) -> str:
    """The file's SHA-256, read in chunks (a shard may be large)."""
    location = store.locate(url, "checkpointDir")
    digest = hashlib.sha256()
    with location.fs.open(location.path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsspec_url(location: store.Location) -> str:
    protocol = location.fs.protocol
    protocol = protocol if isinstance(protocol, str) else protocol[0]
    return f"{protocol}://{location.path}"


def local_state_bytes(module: torch.nn.Module, optimizer: Any) -> dict[str, int]:
    """Bytes this rank holds of parameters, gradients and optimizer state (a DTensor counts
    its local shard only): what sharding divides by the number of workers."""
    import torch

    def size(tensor: Any) -> int:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        return int(local.numel() * local.element_size())

    params = list(module.parameters())
    state = [value for entry in optimizer.state.values() for value in entry.values()
             if isinstance(value, torch.Tensor)]
    counts = {"parameters": sum(size(p) for p in params),
              "gradients": sum(size(p.grad) for p in params if p.grad is not None),
              "optimizer": sum(size(value) for value in state)}
    return {**counts, "total": sum(counts.values())}
