"""Communication backends for data-parallel training: what differs between torch.distributed
and Horovod, behind one small interface so the training loop is written once.

A backend starts the process group from the barrier stage's rendezvous, wraps the model and
optimizer so gradients are averaged across ranks, makes every rank start from rank 0's
weights, sums tensors across ranks, and shuts down.

- ``torch`` (default): ``DistributedDataParallel``; gloo on CPU, NCCL on GPU (ring
  all-reduce), bounded by ``init_process_group(timeout=...)``.
- ``horovod``: ``horovod.torch`` with its gloo controller. Rank 0 runs Horovod's rendezvous
  server inside its task; every task sets the ``HOROVOD_*`` environment and calls
  ``hvd.init()``; ``DistributedOptimizer`` averages gradients.
"""

from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING, Any

from sparkdist.exceptions import ParamError

if TYPE_CHECKING:
    import torch

    from sparkdist.launch.barrier import Rendezvous, WorkerContext

BACKENDS = ("torch", "horovod")
HOROVOD_INSTALL = ("Horovod is not installed in this Python environment. Build it against "
                   "the installed torch with `make horovod` (Horovod 0.28.1 from source, "
                   "gloo only), or use backend='torch'.")


def horovod_available() -> bool:
    """Whether ``horovod.torch`` imports here (checked on the driver before launch)."""
    try:
        import horovod.torch  # noqa: F401
    except Exception:  # ImportError, or a build that does not match torch
        return False
    return True


def make_backend(name: str) -> TorchBackend | HorovodBackend:
    """The backend called ``name`` (one of :data:`BACKENDS`)."""
    if name == "torch":
        return TorchBackend()
    if name == "horovod":
        return HorovodBackend()
    raise ParamError(f"backend={name!r} is not one of {BACKENDS}.")


class TorchBackend:
    """torch.distributed with DistributedDataParallel (gloo on CPU, NCCL on CUDA)."""

    name = "torch"

    def __init__(self) -> None:
        self._device: Any = None

    def init(self, context: WorkerContext, rendezvous: Rendezvous,
             device: torch.device) -> None:
        import torch.distributed as dist

        self._device = device
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://{rendezvous.master_addr}:{rendezvous.ports[0]}",
            rank=context.rank, world_size=context.world_size,
            timeout=datetime.timedelta(seconds=context.settings.collective_timeout_s))

    def wrap_model(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """DDP broadcasts rank 0's parameters and buffers when it wraps the model."""
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def wrap_optimizer(self, optimizer: Any, model: torch.nn.Module) -> Any:
        return optimizer  # DDP averages gradients during backward

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        on_device = tensor.to(self._device)  # NCCL reduces CUDA tensors only
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
        return on_device.to(tensor.device)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class HorovodBackend:
    """horovod.torch over gloo, started inside sparkdist's own barrier stage."""

    name = "horovod"

    def __init__(self) -> None:
        self._server: Any = None

    def init(self, context: WorkerContext, rendezvous: Rendezvous,
             device: torch.device) -> None:
        if not horovod_available():
            raise ParamError(HOROVOD_INSTALL)
        import horovod.torch as hvd

        port = rendezvous.ports[1]
        if context.rank == 0:
            self._server = _start_horovod_rendezvous(rendezvous, port)
        os.environ.update(_horovod_env(context, rendezvous, port))
        hvd.init()

    def wrap_model(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        import horovod.torch as hvd

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model

    def wrap_optimizer(self, optimizer: Any, model: torch.nn.Module) -> Any:
        import horovod.torch as hvd

        wrapped = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_optimizer_state(wrapped, root_rank=0)
        return wrapped

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        import horovod.torch as hvd

        return hvd.allreduce(tensor, op=hvd.Sum)

    def shutdown(self) -> None:
        import horovod.torch as hvd

        hvd.shutdown()
        if self._server is not None:
            self._server.stop()


def _start_horovod_rendezvous(rendezvous: Rendezvous, port: int) -> Any:
    """Horovod's gloo rendezvous server, told which rank runs on which host."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    slots = ",".join(f"{host}:{rendezvous.hosts.count(host)}"
                     for host in dict.fromkeys(rendezvous.hosts))
    server = RendezvousServer(verbose=0)
    server.start(port=port)
    server.init(get_host_assignments(parse_hosts(slots), len(rendezvous.hosts)))
    return server


def _horovod_env(context: WorkerContext, rendezvous: Rendezvous, port: int) -> dict[str, str]:
    """The environment ``hvd.init()`` reads to join a gloo job (as horovodrun sets it)."""
    hosts = rendezvous.hosts
    host = hosts[context.rank]
    local_ranks = [rank for rank, name in enumerate(hosts) if name == host]
    unique_hosts = list(dict.fromkeys(hosts))
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous.master_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        "HOROVOD_HOSTNAME": host,
        "HOROVOD_RANK": str(context.rank),
        "HOROVOD_SIZE": str(context.world_size),
        "HOROVOD_LOCAL_RANK": str(local_ranks.index(context.rank)),
        "HOROVOD_LOCAL_SIZE": str(len(local_ranks)),
        "HOROVOD_CROSS_RANK": str(unique_hosts.index(host)),
        "HOROVOD_CROSS_SIZE": str(len(unique_hosts)),
    }
