"""The data-parallel training loop that runs in each barrier task, written once for every
backend; plus the model, loss and optimizer specs it shares with the driver.

Every rank runs the same number of steps per epoch whatever its partition holds: each epoch
has ``ceil(rows / (batchSize x world_size))`` steps (``batchSize`` is per worker) and a rank
takes its rows in proportional slices (:func:`sparkdist.torchtrain.feed.step_sizes`), so a small
or empty partition gives small or empty batches, never a missing collective. Each rank scales
its summed loss by ``world_size / rows in this global step`` (every rank knows every rank's
slice sizes from the row counts summed once at the start), so the averaged gradient is exactly
the mean over the global batch: 1 worker at ``2 x batchSize`` takes the same steps as 2.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import json
import math
import sys
import time
from typing import TYPE_CHECKING, Any

from sparkdist import failpoints
from sparkdist.exceptions import ParamError, TrainingError
from sparkdist.launch import gpus
from sparkdist.torchtrain import resume
from sparkdist.torchtrain.strategies import make_strategy

if TYPE_CHECKING:
    import torch

    from sparkdist.launch.barrier import WorkerContext
    from sparkdist.torchtrain.datacheck import PartitionScan
    from sparkdist.torchtrain.feed import SpilledRows

LOSSES = {"bce": "classification", "cross_entropy": "classification", "mse": "regression"}
OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "rmsprop": "RMSprop"}


# ------------------------------------------------------------------------- specs (both sides)
# The ``model`` and ``loss`` Params hold names; the driver resolves them here and ships the
# resolved objects to the executors (by reference when importable, else by value through
# cloudpickle), so executors never resolve a name.

#: This package's name in models saved before it was renamed (``sparkdist.train.nets.MLP``).
_OLD_PACKAGE = "sparkdist.train."

#: Classes and functions given as objects in this process, by the name their Param holds.
_REGISTRY: dict[str, Any] = {}


def qualified_name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def to_name(value: Any) -> str:
    """The typeConverter of the ``model`` and ``loss`` Params: a name stays as it is; a class
    or function given in code is recorded under its qualified name, so that this process
    resolves the name to that object wherever it was defined (``__main__``, a notebook, a
    test module). A later object under the same name replaces the earlier, as in Python."""
    if isinstance(value, str):
        return value
    if inspect.isclass(value) or inspect.isroutine(value):
        name = qualified_name(value)
        _REGISTRY[name] = value
        return name
    raise TypeError(f"expected a class, a function or its qualified name, got {value!r}")


def resolve_model(name: str) -> type[torch.nn.Module]:
    """The ``nn.Module`` subclass ``model`` names; ParamError for anything else, before
    anything is called."""
    import torch

    found = _lookup(name, "model")
    if not (inspect.isclass(found) and issubclass(found, torch.nn.Module)):
        raise ParamError(f"model={name!r} is {found!r}, not an nn.Module subclass; give "
                         f"the network class or its qualified name.")
    return found


def resolve_loss(name: str) -> Any:
    """What the training loop calls for ``loss``: a built-in name stays a name; otherwise an
    instance of the ``nn.Module`` subclass it names (made without arguments), or a function
    given as an object in this process. Anything else (a function named only in a file,
    ``os.system``) is refused by construction, not by a denylist."""
    import torch

    if name in LOSSES:
        return name
    found = _lookup(name, "loss")
    if inspect.isclass(found) and issubclass(found, torch.nn.Module):
        return found()
    if _REGISTRY.get(name) is found and callable(found):
        return found
    raise ParamError(f"loss={name!r} is {found!r}: use one of {sorted(LOSSES)}, an nn.Module "
                     f"loss class, or pass a function (output, label) -> per-row losses "
                     f"itself (loss=my_loss), not its name.")


def _lookup(name: str, param: str) -> Any:
    """Registry first; else an attribute of a module already imported in this process (or of
    sparkdist itself). A module named only in a Param is never imported: importing runs its
    top-level code, and Param values come from saved files too."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name.startswith(_OLD_PACKAGE):  # saved before the package was renamed
        name = "sparkdist.torchtrain." + name[len(_OLD_PACKAGE):]
    module_name, _, attribute = name.rpartition(".")
    own = module_name == "sparkdist" or module_name.startswith("sparkdist.")
    try:
        if module_name not in sys.modules and not own:
            raise ImportError(f"module {module_name!r} is not imported in this process, and "
                              "sparkdist imports no module a Param names")
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as err:
        if module_name == "__main__":
            raise ParamError(f"{param}={name!r} was defined in a notebook or script "
                             f"(__main__) that this process does not define it in; run that "
                             f"definition first, or move it into a module and import it before "
                             f"the fit or load.") from err
        raise ParamError(f"{param}={name!r} cannot be imported ({err}); pass the class "
                         f"itself, or import its module (import {module_name or name}) "
                         f"before the fit or load.") from err


def build_module(module_class: type[torch.nn.Module], kwargs: dict[str, Any], input_dim: int,
                 output_dim: int) -> torch.nn.Module:
    """Instantiate a class from :func:`resolve_model`; ``input_dim``/``output_dim`` are filled
    in from the data when the constructor takes them and ``kwargs`` leaves them out."""
    accepted = inspect.signature(module_class).parameters
    filled = {name: value for name, value in (("input_dim", input_dim),
                                              ("output_dim", output_dim))
              if name in accepted and name not in kwargs}
    return module_class(**filled, **kwargs)


def output_width(loss: str, num_classes: int) -> int:
    """Outputs per row the network must produce for ``loss``."""
    return num_classes if loss == "cross_entropy" else 1


def task_of_loss(loss: str) -> str:
    return LOSSES.get(loss, "regression")


def loss_sum(loss: Any, output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """The summed loss over the rows of a batch (the loop does the averaging); ``loss`` is
    what :func:`resolve_loss` returned."""
    import torch.nn.functional as F

    if loss == "cross_entropy":
        return F.cross_entropy(output, label.long(), reduction="sum")
    flat = (output.flatten(1) if output.dim() > 1 else output.unsqueeze(1)).squeeze(1)
    if loss == "bce":
        return F.binary_cross_entropy_with_logits(flat, label, reduction="sum")
    if loss == "mse":
        return F.mse_loss(flat, label, reduction="sum")
    return loss(output, label).sum()  # a callable giving per-row losses


def correct_count(loss: str, output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    if loss == "cross_entropy":
        return (output.argmax(dim=1) == label.long()).sum()
    return ((output.reshape(-1) > 0).float() == label).sum()


def make_optimizer(name: str, parameters: Any, learning_rate: float,
                   weight_decay: float) -> Any:
    import torch

    return getattr(torch.optim, OPTIMIZERS[name])(parameters, lr=learning_rate,
                                                  weight_decay=weight_decay)


def pack_result(state_dict: dict[str, Any], header: dict[str, Any]) -> memoryview:
    """Header length, JSON header, ``torch.save``d tensors (loadable with
    ``weights_only=True``), then the tensors' byte count: a result cut short on its way to the
    driver is refused as such. Written into one buffer and returned as a view of it, not a
    copy: rank 0 may hold the whole model, and every copy counts against the worker's
    memory."""
    import torch

    head = json.dumps(header).encode()
    buffer = io.BytesIO()
    buffer.write(len(head).to_bytes(8, "big") + head)
    torch.save({name: tensor.detach().cpu() for name, tensor in state_dict.items()}, buffer)
    buffer.write((buffer.tell() - 8 - len(head)).to_bytes(8, "big"))
    return buffer.getbuffer()


def unpack_result(payload: bytes | memoryview) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    payload = bytes(payload) if isinstance(payload, memoryview) else payload
    size = int.from_bytes(payload[:8], "big")
    weights = memoryview(payload)[8 + size:-8]
    if len(payload) < 16 + size or len(weights) != int.from_bytes(payload[-8:], "big"):
        raise TrainingError(f"the trained weights reached the driver incomplete ({len(payload)} "
                            "bytes); the driver may lack the memory to receive them: raise "
                            "spark.driver.memory (and spark.driver.maxResultSize).")
    header = json.loads(payload[8:8 + size])
    state = torch.load(io.BytesIO(weights), weights_only=True)
    return state, header


# ----------------------------------------------------------------------------- executor side
def fit_worker(context: WorkerContext, batches: Any,
               args: dict[str, Any]) -> memoryview | None:
    """Barrier-task entry point: spill the partition, join the group, train, return weights."""
    import torch

    from sparkdist.torchtrain.backends import make_backend
    from sparkdist.torchtrain.datacheck import PartitionScan
    from sparkdist.torchtrain.feed import spill

    torch.set_num_threads(max(1, context.cpus))
    reset_peak_rss()
    started = time.perf_counter()
    scan = PartitionScan(batches, args["input_dim"])  # the input's checks, in this pass
    train, validation = spill(scan, context.scratch, dim=args["input_dim"])
    args = {**args, "spill_seconds": time.perf_counter() - started}
    context.log(f"spilled {train.num_rows} training and {validation.num_rows} "
                f"validation rows in {args['spill_seconds']:.2f} s")
    plan = gpus.plan_for_task(args["use_gpu"], context.gpus)
    context.log(f"device {plan.device}: {plan.reason}")
    device = gpus.apply(plan)  # the GPU Spark assigned; CUDA_VISIBLE_DEVICES for children
    backend = make_backend(args["backend"])
    try:
        failpoints.hit(args["failpoint"], "torch.rendezvous", context.rank)
        backend.init(context, device)  # the rendezvous included
        return _Trainer(context, backend, device, args).run(train, validation, scan)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as err:  # not only Exception: DCP's CheckpointException is not one
        # Before the shutdown below: the peers fail once this rank's links close, and the
        # driver keeps the first failure it hears of an attempt as the root cause.
        context.report_failure(err)
        raise
    finally:
        backend.shutdown()
        train.close()
        validation.close()


class _Trainer:
    """One rank's training run: counts, model, epochs, validation, early stopping."""

    def __init__(self, context: WorkerContext, backend: Any, device: torch.device,
                 args: dict[str, Any]) -> None:
        self.context, self.backend, self.device, self.args = context, backend, device, args
        self.loss, self.loss_fn = args["loss"], args["loss_fn"]  # the name, what to call
        self.clock = StepClock()

    def run(self, train: SpilledRows, validation: SpilledRows,
            scan: PartitionScan) -> memoryview | None:
        import torch

        from sparkdist.torchtrain.datacheck import check_stats, combine
        from sparkdist.torchtrain.feed import step_sizes

        args, world = self.args, self.context.world_size
        # every rank's row counts and input figures, by one all-reduce; every rank applies the
        # same checks to the same totals, so all of them stop (or go on) together
        table = self._gather([train.num_rows, validation.num_rows, *scan.figures()]).numpy()
        check_stats(combine(table[:, 2:]), args["rules"])
        counts = table[:, :2].astype("int64")
        # batchSize is per worker, as in DDP and Horovod: a step takes batchSize x world rows
        self.steps = max(1, math.ceil(int(counts[:, 0].sum()) / (args["batch_size"] * world)))
        self.global_sizes: Any = sum(step_sizes(int(n), self.steps) for n in counts[:, 0])
        self.rows = (int(counts[:, 0].sum()), int(counts[:, 1].sum()))
        self.most_validation_rows = int(counts[:, 1].max())
        torch.manual_seed(args["seed"])  # identical initial weights on every rank
        strategy = make_strategy(self.context, self.backend, self.device, args, self.clock)
        strategy.setup(build_module(args["module"], args["module_kwargs"],
                                    args["input_dim"], args["output_dim"]))
        optimizer = strategy.optimizer()
        resumed = self._resume_state(strategy, optimizer)
        started, sent = time.perf_counter(), tcp_bytes_sent()
        history, best = self._epochs(strategy, optimizer, train, validation, world,
                                     resumed or {})
        ranks = self._all_ranks(time.perf_counter() - started, strategy.state_bytes(optimizer),
                                tcp_bytes_sent() - sent)
        # training is over: free the optimizer state and gradients (the last checkpoint has
        # them) before rank 0 gathers and serialises the whole model
        optimizer.state.clear()
        for parameter in strategy.module.parameters():  # not zero_grad: Horovod's takes no
            parameter.grad = None                        # set_to_none
        final = None if best else strategy.full_state()
        if self.context.rank != 0:
            return None
        state = best["state"] if best else final
        assert state is not None  # rank 0 holds the whole state
        return pack_result(state, {"history": history, "best_epoch": best and best["epoch"],
                                   "rows": self.rows[0], "validation_rows": self.rows[1],
                                   "steps_per_epoch": self.steps, "world_size": world,
                                   "batch_size": args["batch_size"],
                                   "global_batch_size": args["batch_size"] * world,
                                   "spill_seconds": args["spill_seconds"],
                                   "placement": self.context.placement, "ranks": ranks,
                                   "strategy": strategy.name,
                                   "resumed_from_epoch": resumed and resumed["epoch"],
                                   "resumed_from_step": resumed and resumed.get("step", 0)})

    def _resume_state(self, strategy: Any, optimizer: Any) -> dict[str, Any] | None:
        """Load the latest intact checkpoint of this run, the same one on every rank: rank 0
        picks it and the others learn its number by one all-reduce."""
        import torch

        from sparkdist.store import Checkpoints

        if not self.args.get("checkpoint_dir"):
            return None
        store = Checkpoints(self.args["checkpoint_dir"], self.args["keep_checkpoints"])
        found = store.latest() if self.context.rank == 0 else None
        chosen = torch.tensor([found[0] + 1 if found else 0], dtype=torch.float64)
        number = int(self.backend.all_reduce_sum(chosen)[0]) - 1
        if number < 0:
            return None
        payload = found[1] if found else store.read(number)
        if payload is None:
            raise TrainingError(f"rank {self.context.rank} cannot read checkpoint {number} "
                                f"in {store.root} that rank 0 read.")
        state = resume.decode(payload, self.args, f"{store.root} (checkpoint {number})")
        strategy.load_training_state(state["training_state"], optimizer)
        self.context.log(f"resuming after epoch {state['epoch']}, step {state['step']}")
        return state

    def _checkpoint(self, epoch: int, step: int, strategy: Any, optimizer: Any,
                    history: list[dict], best: dict | None, stopped: bool = False,
                    partial_loss: float = 0.0) -> None:
        """The state after ``epoch`` epochs and ``step`` steps of the next one, numbered by
        the epochs completed (a mid-epoch checkpoint replaces the one of the epoch it started
        from): every rank hands the strategy its part, rank 0 commits the checkpoint."""
        from sparkdist.store import Checkpoints

        args = self.args
        if not args.get("checkpoint_dir"):
            return
        store = Checkpoints(args["checkpoint_dir"], args["keep_checkpoints"])
        saved = strategy.save_training_state(optimizer, store.shard_dir(epoch, step))
        if self.context.rank != 0:
            return
        payload = resume.encode(epoch, step, saved, history, best, stopped, partial_loss, args)
        store.save(epoch, payload)

    def _epoch_checkpoint_due(self, epoch: int, stopped: bool) -> bool:
        every = self.args["checkpoint_every"]
        return stopped or epoch % every == 0 or epoch == self.args["epochs"]

    def _epochs(self, strategy: Any, optimizer: Any, train: SpilledRows,
                validation: SpilledRows, world: int,
                resumed: dict[str, Any]) -> tuple[list[dict], dict | None]:
        args = self.args
        history, best = list(resumed.get("history", [])), resumed.get("best")
        if resumed.get("stopped"):
            return history, best
        first_step, partial_loss = resumed.get("step", 0), resumed.get("partial_loss", 0.0)
        for epoch in range(resumed.get("epoch", 0), args["epochs"]):
            started = time.perf_counter()
            loss = self._train_epoch(strategy, optimizer, train, epoch, world, history,
                                     best, first_step, partial_loss)
            first_step, partial_loss = 0, 0.0
            record = {"epoch": epoch + 1, "epochs": args["epochs"], "loss": loss,
                      "seconds": time.perf_counter() - started}
            if self.rows[1]:
                record.update(self._validate(strategy, validation))
            history.append(record)
            self.context.report(record)
            self.context.log(json.dumps(record))
            if self.rows[1] and (best is None or record["val_loss"] < best["loss"]):
                best = {"epoch": epoch + 1, "loss": record["val_loss"],
                        "state": strategy.full_state()}  # on rank 0
            patience = args["patience"]
            stopped = bool(best and patience and epoch + 1 - best["epoch"] >= patience)
            if self._epoch_checkpoint_due(epoch + 1, stopped):
                self._checkpoint(epoch + 1, 0, strategy, optimizer, history, best, stopped)
            if stopped and best:
                self.context.log(f"early stop after epoch {epoch + 1}: no better val_loss "
                                 f"for {patience} epochs (best epoch {best['epoch']})")
                break
        return history, best

    def _train_epoch(self, strategy: Any, optimizer: Any, train: SpilledRows,
                     epoch: int, world: int, history: list[dict], best: dict | None,
                     first_step: int, partial_loss: float) -> float:
        """One epoch from step ``first_step`` (a mid-epoch resume); the mean training loss.

        Nothing in a step waits for the device: the loss sum stays on it until the epoch
        ends. Every step reseeds torch from (seed, epoch, step, rank), so a resumed step draws
        what the uninterrupted one drew (dropout)."""
        import itertools

        import torch

        strategy.model.train()
        args, clock = self.args, self.clock
        every = args.get("checkpoint_every_steps", 0)
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        if self.context.rank == 0:
            total += partial_loss
        feed = itertools.islice(train.batches(args["seed"], epoch, self.steps,
                                              dim=args["input_dim"]), first_step, None)
        clock.tick()
        for step, (features, label) in enumerate(feed, start=first_step):
            clock.tock("data")
            failpoints.hit(args["failpoint"], "torch.step", self.context.rank, epoch + 1, step)
            if self.global_sizes[step]:  # every rank skips the same empty step: none waits
                torch.manual_seed(resume.step_seed(args["seed"], epoch, step, self.context.rank))
                total += strategy.train_step(features.to(self.device, non_blocking=True),
                                             label.to(self.device, non_blocking=True),
                                             world / float(self.global_sizes[step]), optimizer)
                clock.tock("compute")
            if every and (step + 1) % every == 0 and step + 1 < self.steps:
                done = float(self.backend.all_reduce_sum(total.cpu().clone())[0])
                self._checkpoint(epoch, step + 1, strategy, optimizer, history, best,
                                 partial_loss=done)
                clock.tock("other")
        return float(self.backend.all_reduce_sum(total.cpu())[0]) / max(1, self.rows[0])

    def _validate(self, strategy: Any, validation: SpilledRows) -> dict[str, float]:
        """Validation outside the training wrapper (DDP's forward would sync buffers per
        call). Every rank runs as many batches as the rank with the most validation rows
        (smaller or empty ones where it has fewer), so a strategy whose forward is collective
        never waits on a missing call."""
        import torch

        strategy.module.eval()
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        steps = max(1, math.ceil(self.most_validation_rows / self.args["batch_size"]))
        classification = task_of_loss(self.loss) == "classification"
        with torch.no_grad():
            for features, label in validation.batches(0, 0, steps, shuffle=False,
                                                      dim=self.args["input_dim"]):
                output = strategy.predict(features.to(self.device))
                if output is None:
                    continue
                label = label.to(self.device)
                sums[0] += loss_sum(self.loss_fn, output, label)
                if classification:
                    sums[1] += correct_count(self.loss, output, label)
        sums = self.backend.all_reduce_sum(sums.cpu())
        metrics = {"val_loss": float(sums[0]) / self.rows[1]}
        if classification:
            metrics["val_accuracy"] = float(sums[1]) / self.rows[1]
        return metrics

    def _all_ranks(self, train_seconds: float, state_bytes: int,
                   sent_bytes: int) -> list[dict[str, Any]]:
        """Every rank's time split, peak memory, the bytes it holds of parameters, gradients
        and optimizer state, and the bytes it sent while training (one all-reduce, after the
        last epoch)."""
        fields = StepClock.FIELDS + ("peak_rss_mb", "state_mb", "sent_mb")
        rows = self._gather([*self.clock.split(train_seconds), peak_rss_mb(),
                             state_bytes / 2**20, sent_bytes / 2**20])
        return [{"rank": rank, **{name: round(float(value), 3)
                                  for name, value in zip(fields, row)}}
                for rank, row in enumerate(rows)]

    def _gather(self, values: list[float]) -> Any:
        """A (world_size, len(values)) table of every rank's ``values``, by one all-reduce."""
        import torch

        table = torch.zeros((self.context.world_size, len(values)), dtype=torch.float64)
        table[self.context.rank] = torch.tensor(values, dtype=torch.float64)
        return self.backend.all_reduce_sum(table)


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
