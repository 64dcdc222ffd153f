"""What one rank measures while it trains: where its time goes (:class:`StepClock`), the
bytes its gradient all-reduces and sockets send, and its peak memory; reported per rank in
``TorchModel.trainingSummary["ranks"]``."""

from __future__ import annotations

import contextlib
import time
from typing import Any


class StepClock:
    """Where one rank's training time goes: waiting for data, computing, waiting on
    communication, and the rest (validation, checkpoints, reports, epoch-end reductions);
    and what it sent: the bytes its gradient or model averages handed to ``all_reduce``, its
    train steps, and the steps it skipped to catch up (``maxStaleness``).

    Communication is what the gradient all-reduce adds to a step beyond the computation it
    overlaps: the time between the last gradient bucket becoming ready (a DDP comm hook
    notes it) and ``backward()`` returning. Without a DDP model (Horovod) it stays 0 and the
    wait is inside ``compute``."""

    FIELDS = ("data_s", "compute_s", "communication_s", "other_s", "allreduce_bytes",
              "train_steps", "skipped_steps")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(("data", "compute", "communication", "other"), 0.0)
        self.allreduce_bytes = 0
        self.train_steps = 0
        self.skipped_steps = 0
        self._mark = time.perf_counter()
        self._bucket_ready: float | None = None

    def watch(self, model: Any, hook: Any = None) -> Any:
        """Install the gradient hook on a DistributedDataParallel model, wrapped so that it
        notes when each bucket is ready; return the model. ``hook`` (a
        :class:`sparkdist.torchtrain.compression.GradientHook`) compresses and counts the
        bytes it sends; without one, DDP's default all-reduce, counted here."""
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            # a lambda: DDP refuses a hook whose annotations are not its own types, and this
            # module's annotations are strings
            model.register_comm_hook((self, hook),
                                     lambda state, bucket: _timed_allreduce(state, bucket))
        return model

    def tick(self) -> None:
        self._mark = time.perf_counter()

    def tock(self, kind: str) -> None:
        """Charge the time since the last mark to ``kind`` (a ``compute`` is one step)."""
        now = time.perf_counter()
        self.seconds[kind] += now - self._mark
        self._mark = now
        if kind == "compute":
            self.train_steps += 1

    def sent(self, nbytes: int) -> None:
        self.allreduce_bytes += int(nbytes)

    def skipped(self) -> None:
        self.skipped_steps += 1

    def bucket_ready(self) -> None:
        self._bucket_ready = time.perf_counter()

    def backward_done(self) -> None:
        """Move the wait after the last bucket from compute to communication."""
        if self._bucket_ready is not None:
            now = time.perf_counter()
            self.seconds["communication"] += now - self._bucket_ready
            self.seconds["compute"] -= now - self._bucket_ready
            self._bucket_ready = None

    def waited(self, seconds: float) -> None:
        """Charge ``seconds`` of a step (a model average) to communication, not compute."""
        self.seconds["communication"] += seconds
        self.seconds["compute"] -= seconds

    def split(self, total: float) -> list[float]:
        """The :data:`FIELDS`: data, compute, communication, other seconds (other is the rest
        of ``total``), then bytes sent, train steps, skipped steps."""
        measured = self.seconds["data"] + self.seconds["compute"] + self.seconds["communication"]
        return [self.seconds["data"], self.seconds["compute"], self.seconds["communication"],
                max(0.0, total - measured), float(self.allreduce_bytes), float(self.train_steps),
                float(self.skipped_steps)]


def _timed_allreduce(state: tuple[StepClock, Any], bucket: Any) -> Any:
    """Note when each bucket is ready, then all-reduce it: by ``hook`` when there is one,
    else by DDP's default all-reduce (mean over ranks), its bytes counted."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    clock, hook = state
    clock.bucket_ready()
    if hook is not None:
        return hook(bucket)
    buffer = bucket.buffer()
    clock.sent(buffer.numel() * buffer.element_size())
    return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]


def peak_rss_mb() -> float:
    """This process's peak resident memory since :func:`reset_peak_rss` (Linux), in MiB."""
    import resource

    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def tcp_bytes_sent() -> int:
    """Bytes this process has sent on its open TCP sockets (the kernel's ``tcpi_bytes_acked``
    of each, Linux; 0 elsewhere): what gloo, NCCL's socket transport or Horovod sent,
    whatever the strategy, measured where it leaves the process. Sockets closed in between
    are not counted."""
    import os
    import socket
    import struct

    total = 0
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    for name in fds:
        with contextlib.suppress(OSError, ValueError):
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
            try:
                if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET,
                                                                        socket.AF_INET6):
                    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 136)
                    total += struct.unpack_from("Q", info, 120)[0]  # tcpi_bytes_acked
            finally:
                sock.close()  # the duplicate only
    return total


def reset_peak_rss() -> None:
    """Start the peak-memory count afresh: Spark reuses Python workers across tasks (Linux 4+;
    elsewhere the peak is the process's)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
