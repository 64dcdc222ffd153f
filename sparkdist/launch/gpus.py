"""GPU scheduling: the GPU Spark assigned to a task becomes that task's CUDA device.

Spark hands each task the addresses of the GPUs it reserved for it (``spark.task.resource.gpu
.amount``), as the executor's discovery script reported them. This module turns them into a
device, in three steps that the barrier training loop and ``TorchModel.transform`` share:

- :func:`task_gpus` reads the addresses of the running task (barrier or plain task);
- :func:`device_plan` decides, as a pure function of plain values, the torch device, the
  ``CUDA_VISIBLE_DEVICES`` for child processes and the collective backend;
- :func:`apply` makes it so in the running process and returns the ``torch.device``.

The index rule (one rule, everywhere)
-------------------------------------
An address is the GPU's index (or UUID) as the discovery script reports it, i.e. as
``nvidia-smi`` numbers the host's GPUs, whatever this process may see.

- **In this process** the device is ``cuda:<i>`` where ``i`` is the address's position among
  the GPUs the process *inherited* visibility of: the address itself when the executor was
  started without ``CUDA_VISIBLE_DEVICES``, else its position in that list. sparkdist never
  re-indexes the running process: CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when it
  initialises, and Spark reuses Python workers across tasks, so changing it in-process would
  make the index depend on which task ran first.
- **For child processes** (``torchrun``, a Horovod launcher, a subprocess the user starts)
  ``CUDA_VISIBLE_DEVICES`` is set to the assigned addresses, so a child sees exactly the task's
  GPUs and addresses them as ``cuda:0`` (``cuda:1``, ... when a task holds several).
- :func:`apply` therefore initialises CUDA in this process (``torch.cuda.set_device``) *before*
  it exports ``CUDA_VISIBLE_DEVICES``; the value the executor inherited is remembered in
  ``SPARKDIST_INHERITED_CUDA_VISIBLE_DEVICES`` so the next task in a reused worker computes its
  index against the same inherited list, not against the previous task's export.

Examples
--------
>>> plan = device_plan(["1"], use_gpu="auto", cuda_available=True, cuda_count=2)
>>> plan.device, plan.cuda_visible_devices, plan.child_device, plan.backend
('cuda:1', '1', 'cuda:0', 'nccl')
>>> device_plan([], use_gpu="auto", cuda_available=False, cuda_count=0).device
'cpu'
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sparkdist.columns import one_of_message
from sparkdist.exceptions import TrainingError

if TYPE_CHECKING:
    import torch


CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
#: Where :func:`apply` keeps the CUDA_VISIBLE_DEVICES the worker process started with.
INHERITED_ENV = "SPARKDIST_INHERITED_CUDA_VISIBLE_DEVICES"
_UNSET = "<unset>"
_CONF_HINT = ("set spark.task.resource.gpu.amount=1 and spark.executor.resource.gpu.amount "
              "(with spark.executor.resource.gpu.discoveryScript, or "
              "spark.worker.resource.gpu.* on a standalone cluster), or use useGpu='auto'")


@dataclass(frozen=True)
class DevicePlan:
    """Where a task computes, decided from plain values (see the module's index rule).

    Attributes
    ----------
    device : ``"cuda:<i>"`` or ``"cpu"``: the torch device in this process.
    index : the CUDA index in this process (``None`` on the CPU).
    addresses : the GPU addresses Spark assigned to the task (may be non-empty on the CPU).
    cuda_visible_devices : the ``CUDA_VISIBLE_DEVICES`` for child processes (``None``: leave
        the environment alone).
    child_device : the device a child started with that environment uses (``"cuda:0"``).
    backend : the torch.distributed backend for this device: ``"nccl"`` or ``"gloo"``.
    reason : why, in words (log it).
    """

    device: str
    index: int | None
    addresses: tuple[str, ...]
    cuda_visible_devices: str | None
    child_device: str | None
    backend: str
    reason: str

    @property
    def is_cuda(self) -> bool:
        return self.index is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def task_gpus() -> list[str]:
    """The GPU addresses Spark assigned to the running task; ``[]`` outside a task or without.

    Works in barrier tasks (the ``BarrierTaskContext`` is the task's ``TaskContext``) and in
    plain tasks such as a pandas UDF.

    Examples
    --------
    >>> task_gpus()  # on the driver: no task
    []
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return []
    gpu = (context.resources() or {}).get("gpu")
    return [str(address) for address in gpu.addresses] if gpu is not None else []


def inherited_visible_devices() -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` this process started with (before any :func:`apply`)."""
    saved = os.environ.get(INHERITED_ENV)
    if saved is not None:
        return None if saved == _UNSET else saved
    return os.environ.get(CUDA_VISIBLE_DEVICES)


def device_plan(addresses: Sequence[str], use_gpu: Any, cuda_available: bool, cuda_count: int,
                visible_devices: str | None = None) -> DevicePlan:
    """Decide the device of a task from the GPUs Spark assigned to it and what CUDA sees.

    Parameters
    ----------
    addresses : the task's GPU addresses (:func:`task_gpus`); the first is the task's device.
    use_gpu : ``True`` (a GPU or an error), ``False`` (the CPU) or ``"auto"`` (the assigned
        GPU when there is one and CUDA works, else the CPU).
    cuda_available : ``torch.cuda.is_available()`` in this process.
    cuda_count : ``torch.cuda.device_count()`` in this process.
    visible_devices : the ``CUDA_VISIBLE_DEVICES`` this process inherited
        (:func:`inherited_visible_devices`); ``None`` when it was not set.

    Raises
    ------
    TrainingError : ``use_gpu=True`` and no GPU was assigned, CUDA is unavailable, or the
        assigned address is not one this process can see. Names the Spark confs to set.

    Examples
    --------
    >>> device_plan(["0"], True, True, 1).device
    'cuda:0'
    >>> device_plan(["3"], True, True, 2, visible_devices="2,3").device
    'cuda:1'
    """
    addresses = tuple(str(address).strip() for address in addresses)
    use_gpu = _use_gpu(use_gpu)
    if use_gpu is False:
        return _cpu(addresses, "useGpu=False")
    problem = _gpu_problem(addresses, cuda_available, cuda_count)
    index = None if problem else _local_index(addresses[0], cuda_count, visible_devices)
    if isinstance(index, str):
        problem, index = index, None
    if problem is None and index is not None:
        return DevicePlan(device=f"cuda:{index}", index=index, addresses=addresses,
                          cuda_visible_devices=",".join(addresses), child_device="cuda:0",
                          backend="nccl",
                          reason=f"Spark assigned GPU {addresses[0]} (cuda:{index} in this "
                                 f"process, cuda:0 in child processes)")
    if use_gpu is True:
        raise TrainingError(f"useGpu=True but {problem}; {_CONF_HINT}.")
    return _cpu(addresses, f"useGpu='auto' and {problem}")


def apply(plan: DevicePlan) -> torch.device:
    """Make ``plan`` the running process's device; return it as a ``torch.device``.

    On a CUDA plan: ``torch.cuda.set_device(plan.index)`` first (this initialises CUDA with the
    visibility the process inherited), then ``CUDA_VISIBLE_DEVICES`` is exported for child
    processes. The CUDA call is skipped when torch has no CUDA (CPU builds, tests). A CPU plan
    leaves the environment alone.
    """
    import torch

    if plan.index is not None and torch.cuda.is_available():
        torch.cuda.set_device(plan.index)
    if plan.cuda_visible_devices is not None:
        if INHERITED_ENV not in os.environ:
            os.environ[INHERITED_ENV] = os.environ.get(CUDA_VISIBLE_DEVICES, _UNSET)
        os.environ[CUDA_VISIBLE_DEVICES] = plan.cuda_visible_devices
    return torch.device(plan.device)


def plan_for_task(use_gpu: Any, addresses: Sequence[str] | None = None) -> DevicePlan:
    """:func:`device_plan` for the running task, with this process's torch and environment."""
    import torch

    available = torch.cuda.is_available()
    return device_plan(task_gpus() if addresses is None else addresses, use_gpu, available,
                       torch.cuda.device_count() if available else 0,
                       inherited_visible_devices())


# ---------------------------------------------------------------------------------- helpers
def _use_gpu(value: Any) -> bool | str:
    text = str(value).strip().lower()
    if isinstance(value, (bool, str)) and text in ("true", "false", "auto"):
        return text if text == "auto" else text == "true"
    raise TrainingError(one_of_message("useGpu", value, (True, False, "auto")))


def _cpu(addresses: tuple[str, ...], reason: str) -> DevicePlan:
    return DevicePlan(device="cpu", index=None, addresses=addresses, cuda_visible_devices=None,
                      child_device=None, backend="gloo", reason=reason)


def _gpu_problem(addresses: tuple[str, ...], cuda_available: bool,
                 cuda_count: int) -> str | None:
    if not addresses:
        return "Spark assigned no GPU to this task (spark.task.resource.gpu.amount is unset)"
    if not cuda_available or cuda_count < 1:
        return (f"torch sees no CUDA device in this process although Spark assigned GPU "
                f"{list(addresses)} (a CPU-only torch build, or no driver on the executor)")
    return None


def _local_index(address: str, cuda_count: int, visible: str | None) -> int | str:
    """The in-process CUDA index of ``address`` (an int), or the problem (a str)."""
    entries = [entry.strip() for entry in (visible or "").split(",") if entry.strip()]
    if entries:
        if address not in entries:
            return (f"the assigned GPU {address} is not among the GPUs this executor may "
                    f"use (CUDA_VISIBLE_DEVICES={visible}); the discovery script must report "
                    f"addresses from that list")
        index = entries.index(address)
    elif address.isdigit():
        index = int(address)
    else:
        return (f"the assigned GPU {address!r} is neither a CUDA index nor listed in "
                f"CUDA_VISIBLE_DEVICES; make the discovery script report indices")
    if index >= cuda_count:
        return (f"the assigned GPU {address} is beyond the {cuda_count} CUDA device(s) this "
                f"process sees; the discovery script reports GPUs this executor cannot use")
    return index
