"""Communication backends for data-parallel training: what differs between torch.distributed
and Horovod, behind one small interface so the training loop is written once.

A backend runs the barrier stage's rendezvous and starts the process group from it, wraps the
model and optimizer so gradients are averaged across ranks, makes every rank start from rank
0's weights, sums tensors across ranks, and shuts down. Rank 0 starts the backend's rendezvous
server on port 0 before the allGather that publishes its port, so no port is reserved and
released first (a window in which another process could bind it).

- ``torch`` (default): ``DistributedDataParallel``; gloo on CPU, NCCL on GPU (ring
  all-reduce), bounded by ``init_process_group(timeout=...)``; rank 0 hosts the ``TCPStore``.
- ``horovod``: ``horovod.torch`` with its gloo controller. Rank 0 runs Horovod's rendezvous
  server inside its task; every task sets the ``HOROVOD_*`` environment and calls
  ``hvd.init()``; ``DistributedOptimizer`` averages gradients.
"""

from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING, Any

from sparkdist.columns import check_one_of
from sparkdist.exceptions import ParamError, TrainingError
from sparkdist.torchtrain.compression import COMPRESSIONS

if TYPE_CHECKING:
    import torch

    from sparkdist.launch.barrier import WorkerContext

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


def backend_class(name: str) -> type[TorchBackend | HorovodBackend]:
    """The class of backend ``name`` (one of :data:`BACKENDS`): it declares what the backend
    supports (``compressions``, ``local_steps``), which
    :func:`sparkdist.torchtrain.strategies.check_compatible` reads."""
    check_one_of("backend", name, BACKENDS)
    return HorovodBackend if name == "horovod" else TorchBackend


def make_backend(name: str) -> TorchBackend | HorovodBackend:
    """The backend called ``name``."""
    return backend_class(name)()


class TorchBackend:
    """torch.distributed with DistributedDataParallel (gloo on CPU, NCCL on CUDA)."""

    name, title = "torch", "torch.distributed"
    #: every gradient compression (a DDP communication hook), and local steps
    compressions: tuple[str, ...] = COMPRESSIONS
    local_steps = True

    def __init__(self) -> None:
        self._device: Any = None
        self._store: Any = None

    def init(self, context: WorkerContext, device: torch.device) -> None:
        """Rendezvous, then join the process group through rank 0's ``TCPStore``."""
        import torch.distributed as dist

        self._device = device
        timeout = datetime.timedelta(seconds=context.settings.collective_timeout_s)
        world = context.world_size

        def listen(host: str) -> list[int]:
            # Binds port 0; does not wait for the others, who learn the port from the gather.
            self._store = dist.TCPStore(host, 0, world, is_master=True, timeout=timeout,
                                        wait_for_workers=False)
            return [self._store.port]

        rendezvous = context.rendezvous(listen)
        if context.rank != 0:
            self._store = dist.TCPStore(rendezvous.master_addr, rendezvous.ports[0], world,
                                        is_master=False, timeout=timeout)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=self._store,
                                rank=context.rank, world_size=world, timeout=timeout)

    def wrap_model(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """DDP broadcasts rank 0's parameters and buffers when it wraps the model."""
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def wrap_optimizer(self, optimizer: Any, model: torch.nn.Module,
                       compression: str = "none") -> Any:
        """DDP averages gradients during backward (compressed by its communication hook:
        :mod:`sparkdist.torchtrain.compression`)."""
        return optimizer

    def store(self) -> Any:
        """The process group's key-value store (rank 0's ``TCPStore``)."""
        return self._store

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        on_device = tensor.to(self._device)  # NCCL reduces CUDA tensors only
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
        return on_device.to(tensor.device)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = None  # rank 0: closes the store's listening socket


class HorovodBackend:
    """horovod.torch over gloo, started inside sparkdist's own barrier stage.

    Horovod ranks are Spark's partition ids: the rendezvous server is told the same slot plan
    (rank, local and cross ranks per host) that each task puts into its ``HOROVOD_*``
    environment, so rank 0 here is rank 0 of the barrier stage.
    """

    name, title = "horovod", "Horovod"
    #: float16 only (hvd.Compression.fp16); no process-group store for model averaging
    compressions: tuple[str, ...] = ("none", "fp16")
    local_steps = False

    def __init__(self) -> None:
        self._server: Any = None
        self._initialized = False

    def init(self, context: WorkerContext, device: torch.device) -> None:
        """Rendezvous (rank 0 binds Horovod's HTTP store first), then ``hvd.init()``."""
        if not horovod_available():
            raise ParamError(HOROVOD_INSTALL)
        import horovod.torch as hvd

        def listen(host: str) -> list[int]:
            self._server = _RendezvousServer(host)
            return [self._server.port]

        try:
            rendezvous = context.rendezvous(listen)
            plan = _slot_plan(rendezvous.hosts)
            port = rendezvous.ports[0]
            if self._server is not None:
                self._server.start(plan)
            os.environ.update(_horovod_env(plan[context.rank], rendezvous.master_addr, port,
                                           context.settings.collective_timeout_s))
            hvd.init()
            self._initialized = True
        except BaseException:
            self.shutdown()
            raise

    def wrap_model(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """Every rank starts from rank 0's parameters and buffers (as DDP does)."""
        import horovod.torch as hvd

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model

    def wrap_optimizer(self, optimizer: Any, model: torch.nn.Module,
                       compression: str = "none") -> Any:
        """Gradients are averaged across ranks in ``step()``, sent as float16 with
        ``compression="fp16"`` (``hvd.Compression.fp16``; :attr:`compressions`). No
        ``hvd.broadcast_optimizer_state``: every rank builds the same fresh optimizer (or loads
        the same checkpoint), and that call would take a zero-gradient step first (Adam's step
        count, AdamW's weight decay), so the run would differ from the torch backend."""
        import horovod.torch as hvd

        codec = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        compression=codec)

    def store(self) -> Any:
        raise TrainingError("Horovod has no process-group store (local_steps is False).")

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        import horovod.torch as hvd

        return hvd.allreduce(tensor, op=hvd.Sum)

    def shutdown(self) -> None:
        """Stop Horovod, then (rank 0) the rendezvous server; Spark reuses this process."""
        try:
            if self._initialized:
                import horovod.torch as hvd

                self._initialized = False
                hvd.shutdown()
        finally:
            if self._server is not None:
                self._server.stop()
                self._server = None


class _RendezvousServer:
    """Horovod's gloo rendezvous (HTTP key-value store), bound to port 0 on rank 0's host
    before the allGather publishes the port; it serves once :meth:`start` gives it the plan.

    ``horovod.runner.http.http_server.RendezvousServer.start()`` in 0.28.1 picks a random port
    of its own and never closes its socket, so its HTTP server class is used directly here.
    """

    def __init__(self, host: str) -> None:
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        self._httpd = RendezvousHTTPServer((host, 0), RendezvousHandler, 0)
        self.port: int = self._httpd.server_address[1]
        self._thread: Any = None

    def start(self, plan: list[Any]) -> None:
        import threading

        self._httpd.init(plan)
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="horovod-rendezvous", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=10)
        self._httpd.server_close()


def _slot_plan(hosts: tuple[str, ...]) -> list[Any]:
    """One Horovod ``SlotInfo`` per rank (rank = index in ``hosts``): local ranks count the
    ranks on the same host; the cross group of local rank k is the hosts that have a k-th
    rank, in order of first appearance (Horovod's own definitions)."""
    from horovod.runner.common.util.hosts import SlotInfo

    order = list(dict.fromkeys(hosts))
    per_host = {host: [rank for rank, name in enumerate(hosts) if name == host]
                for host in order}
    plan = []
    for rank, host in enumerate(hosts):
        local_rank = per_host[host].index(rank)
        cross = [name for name in order if len(per_host[name]) > local_rank]
        plan.append(SlotInfo(hostname=host, rank=rank, local_rank=local_rank,
                             cross_rank=cross.index(host), size=len(hosts),
                             local_size=len(per_host[host]), cross_size=len(cross)))
    return plan


def _horovod_env(slot: Any, rendezvous_addr: str, port: int,
                 timeout_s: float) -> dict[str, str]:
    """The environment ``hvd.init()`` reads to join a gloo job (as ``horovodrun`` sets it in
    ``horovod/runner/gloo_run.py``, 0.28.1)."""
    env = {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(max(1, int(timeout_s))),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }
    env["HOROVOD_GLOO_IFACE"] = _gloo_iface(slot.hostname) or ""  # "": Horovod's default
    return env


def _gloo_iface(address: str) -> str | None:
    """``GLOO_SOCKET_IFNAME`` (first entry) when set, else the interface holding this task's
    address, else None (gloo then uses the address the hostname resolves to)."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return os.environ["GLOO_SOCKET_IFNAME"].split(",")[0]
    import socket

    import psutil  # a Horovod dependency

    try:
        ip = socket.gethostbyname(address)
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(item.family == socket.AF_INET and item.address == ip for item in addresses):
            return name
    return None
