"""The training loop that runs in each barrier task, written once for every backend and
strategy; it reads the typed spec (:class:`sparkdist.torchtrain.spec.TrainSpec`) only.

Every rank runs the same number of steps per epoch whatever its partition holds: each epoch
has ``ceil(rows / (batchSize x world_size))`` steps (``batchSize`` is per worker) and a rank
takes its rows in proportional slices (:func:`sparkdist.torchtrain.feed.step_sizes`), so a small
or empty partition gives small or empty batches, never a missing collective. Each rank scales
its summed loss by ``world_size / rows in this global step`` (every rank knows every rank's
slice sizes from the row counts summed once at the start), so the averaged gradient is exactly
the mean over the global batch: 1 worker at ``2 x batchSize`` takes the same steps as 2.

Before each step the loop sets the step's learning rate (``learningRateScaling`` and
``warmupSteps``: :mod:`sparkdist.torchtrain.schedule`) on the optimizer, whatever the strategy;
steps are numbered across epochs (``epoch_start + step``), and the count is checkpointed, so a
resumed warm-up continues at its step. Each epoch's record holds ``lr``, the rate at its end.
"""

from __future__ import annotations

import io
import json
import math
import time
from typing import TYPE_CHECKING, Any

from sparkdist import hooks
from sparkdist.exceptions import TrainingError
from sparkdist.launch import gpus
from sparkdist.torchtrain import finetune, resume, schedule
from sparkdist.torchtrain.clock import StepClock, peak_rss_mb, reset_peak_rss, tcp_bytes_sent
from sparkdist.torchtrain.network import build_module, correct_count, loss_sum, task_of_loss
from sparkdist.torchtrain.strategies import Strategy, make_strategy

if TYPE_CHECKING:
    import torch

    from sparkdist.launch.barrier import WorkerContext
    from sparkdist.torchtrain.datacheck import PartitionScan
    from sparkdist.torchtrain.feed import SpilledRows
    from sparkdist.torchtrain.inputs import Inputs, Target
    from sparkdist.torchtrain.spec import TrainSpec


# ------------------------------------------------------------------- result (rank 0 -> driver)
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

    from sparkdist.torchtrain.shardfiles import with_stored_rows

    payload = bytes(payload) if isinstance(payload, memoryview) else payload
    size = int.from_bytes(payload[:8], "big")
    weights = memoryview(payload)[8 + size:-8]
    if len(payload) < 16 + size or len(weights) != int.from_bytes(payload[-8:], "big"):
        raise TrainingError(f"the trained weights reached the driver incomplete ({len(payload)} "
                            "bytes); the driver may lack the memory to receive them: raise "
                            "spark.driver.memory (and spark.driver.maxResultSize).")
    header = json.loads(payload[8:8 + size])
    state = torch.load(io.BytesIO(weights), weights_only=True)
    return with_stored_rows(state), header  # ps: rows no rank held whole


# ----------------------------------------------------------------------------- executor side
def fit_worker(context: WorkerContext, batches: Any, spec: TrainSpec) -> memoryview | None:
    """Barrier-task entry point: spill the partition, join the group, train, return weights."""
    import torch

    from sparkdist.torchtrain.backends import make_backend
    from sparkdist.torchtrain.datacheck import PartitionScan
    from sparkdist.torchtrain.feed import spill, targets
    from sparkdist.torchtrain.inputs import feed_columns

    torch.set_num_threads(max(1, context.cpus))
    reset_peak_rss()
    started = time.perf_counter()
    dim, fields, rules = spec.model.input_dim, spec.model.inputs, spec.rules
    # the input's checks, in this pass
    scan = PartitionScan(batches, dim, fields, rules.label_width, bool(rules.weight_col))
    train, validation = spill(scan, context.scratch, dim=dim or None,
                              columns=feed_columns(fields),
                              target=targets(rules.label_width, bool(rules.weight_col)))
    spill_seconds = time.perf_counter() - started
    context.log(f"spilled {train.num_rows} training and {validation.num_rows} "
                f"validation rows in {spill_seconds:.2f} s")
    plan = gpus.plan_for_task(spec.launch.use_gpu, context.gpus)
    context.log(f"device {plan.device}: {plan.reason}")
    device = gpus.apply(plan)  # the GPU Spark assigned; CUDA_VISIBLE_DEVICES for children
    backend = make_backend(spec.comm.backend)
    try:
        # the rendezvous included; test hooks (sparkdist.hooks) wrap it only when armed
        hooks.around_rendezvous(backend.init, spec.hooks, context.rank)(context, device)
        # a temporary: the strategy (a DDP model holding the process group) must be freed
        # before the backend shuts the group down, or its destructor deadlocks on gloo
        return _Trainer(context, backend, device, spec, spill_seconds).run(train, validation,
                                                                            scan)
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
                 spec: TrainSpec, spill_seconds: float) -> None:
        self.context, self.backend, self.device, self.spec = context, backend, device, spec
        self.spill_seconds = spill_seconds
        self.clock = StepClock()
        self.strategy: Strategy
        self.optimizer: Any = None
        self.epoch_start = 0  # the fit's steps before this epoch's first (the rate's count)
        #: Under an observer: ask the driver after each epoch (read once: every rank agrees).
        self.observed = context.settings.observed

    def run(self, train: SpilledRows, validation: SpilledRows,
            scan: PartitionScan) -> memoryview | None:
        import torch

        from sparkdist.torchtrain.datacheck import check_stats, check_training_weight, combine
        from sparkdist.torchtrain.feed import step_sizes

        spec, world = self.spec, self.context.world_size
        # every rank's row counts, training weight and input figures, by one all-reduce; every
        # rank applies the same checks to the same totals, so all of them stop (or go on)
        # together
        table = self._gather([train.num_rows, validation.num_rows, train.weight_sum(),
                              *scan.figures()]).numpy()
        check_stats(combine(table[:, 3:], spec.rules.inputs), spec.rules)
        weight = check_training_weight(float(table[:, 2].sum()), spec.rules)
        counts = table[:, :2].astype("int64")
        # batchSize is per worker, as in DDP and Horovod: a step takes batchSize x world rows
        batch = spec.optim.batch_size
        self.steps = max(1, math.ceil(int(counts[:, 0].sum()) / (batch * world)))
        self.global_sizes: Any = sum(step_sizes(int(n), self.steps) for n in counts[:, 0])
        self.rows = (int(counts[:, 0].sum()), int(counts[:, 1].sum()))
        # weights scaled to a mean of 1 over the training rows: the per-row averaging of
        # every step then gives the weighted mean (sum of w x loss over the sum of w)
        self.weight_scale = self.rows[0] / weight if weight else 1.0
        self.most_validation_rows = int(counts[:, 1].max())
        torch.manual_seed(spec.optim.seed)  # identical initial weights on every rank
        model = spec.model
        self.strategy = strategy = make_strategy(self.context, self.backend, self.device, spec,
                                                 self.clock)
        strategy.setup(finetune.prepare(build_module(model.module, model.module_kwargs,
                                                     model.input_dim, model.output_dim),
                                        spec.finetune))
        self.optimizer = optimizer = strategy.optimizer()
        resumed = self._resume_state()
        started, sent = time.perf_counter(), tcp_bytes_sent()
        history, best = self._epochs(train, validation, resumed or {})
        ranks = self._all_ranks(time.perf_counter() - started, strategy.state_bytes(optimizer),
                                _optimizer_bytes(optimizer), tcp_bytes_sent() - sent)
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
        if spec.finetune.adapter != "none":  # the adapters only: the base is initialWeights
            state = finetune.trained(strategy.module, state)
        return pack_result(state, {"history": history, "best_epoch": best and best["epoch"],
                                   "rows": self.rows[0], "validation_rows": self.rows[1],
                                   "steps_per_epoch": self.steps, "world_size": world,
                                   "batch_size": batch, "global_batch_size": batch * world,
                                   "spill_seconds": self.spill_seconds,
                                   "placement": self.context.placement, "ranks": ranks,
                                   "strategy": strategy.name,
                                   "resumed_from_epoch": resumed and resumed["epoch"],
                                   "resumed_from_step": resumed and resumed.get("step", 0)})

    def _store(self) -> Any:
        """This run's checkpoints, or None without a checkpoint directory."""
        from sparkdist.store import Checkpoints

        where = self.spec.checkpoint
        return Checkpoints(where.directory, where.keep) if where.directory else None

    def _resume_state(self) -> dict[str, Any] | None:
        """Load the latest intact checkpoint of this run, the same one on every rank: rank 0
        picks it and the others learn its number by one all-reduce."""
        import torch

        store = self._store()
        if store is None:
            return None
        found = store.latest() if self.context.rank == 0 else None
        chosen = torch.tensor([found[0] + 1 if found else 0], dtype=torch.float64)
        number = int(self.backend.all_reduce_sum(chosen)[0]) - 1
        if number < 0:
            return None
        payload = found[1] if found else store.read(number)
        if payload is None:
            raise TrainingError(f"rank {self.context.rank} cannot read checkpoint {number} "
                                f"in {store.root} that rank 0 read.")
        state = resume.decode(payload, self.spec, f"{store.root} (checkpoint {number})")
        self.strategy.load_training_state(state["training_state"], self.optimizer)
        self.context.log(f"resuming after epoch {state['epoch']}, step {state['step']}")
        return state

    def _checkpoint(self, epoch: int, step: int, history: list[dict], best: dict | None,
                    stopped: bool = False, partial_loss: float = 0.0) -> None:
        """The state after ``epoch`` epochs and ``step`` steps of the next one, numbered by
        the epochs completed (a mid-epoch checkpoint replaces the one of the epoch it started
        from): every rank hands the strategy its part, rank 0 commits the checkpoint."""
        store = self._store()
        if store is None:
            return
        saved = self.strategy.save_training_state(self.optimizer, store.shard_dir(epoch, step))
        if self.context.rank != 0:
            return
        assert saved is not None  # rank 0's part says where every part is
        payload = resume.encode(epoch, step, saved, history, best, stopped, partial_loss,
                                self.spec, self.epoch_start + step)
        store.save(epoch, payload)

    def _epoch_checkpoint_due(self, epoch: int, stopped: bool) -> bool:
        every = self.spec.checkpoint.every
        return stopped or epoch % every == 0 or epoch == self.spec.optim.epochs

    def _epochs(self, train: SpilledRows, validation: SpilledRows,
                resumed: dict[str, Any]) -> tuple[list[dict], dict | None]:
        epochs, patience = self.spec.optim.epochs, self.spec.optim.patience
        history, best = list(resumed.get("history", [])), resumed.get("best")
        if resumed.get("stopped"):
            return history, best
        first_step, partial_loss = resumed.get("step", 0), resumed.get("partial_loss", 0.0)
        done = resumed.get("global_step")  # None: a checkpoint from before it was kept
        self.epoch_start = (resumed.get("epoch", 0) * self.steps + first_step if done is None
                            else done) - first_step
        for epoch in range(resumed.get("epoch", 0), epochs):
            started = time.perf_counter()
            loss = self._train_epoch(train, epoch, history, best, first_step, partial_loss)
            first_step, partial_loss = 0, 0.0
            self.epoch_start += self.steps
            record = {"epoch": epoch + 1, "epochs": epochs, "loss": loss,
                      "seconds": time.perf_counter() - started,
                      "lr": float(self.optimizer.param_groups[0]["lr"])}
            if self.rows[1]:
                record.update(self._validate(validation))
            history.append(record)
            halted = self._asked_to_stop(self.context.report(record, ask=True))
            self.context.log(json.dumps(record))
            if self.rows[1] and (best is None or record["val_loss"] < best["loss"]):
                best = {"epoch": epoch + 1, "loss": record["val_loss"],
                        "state": self.strategy.full_state()}  # on rank 0
            early = bool(best and patience and epoch + 1 - best["epoch"] >= patience)
            stopped = early or halted
            if self._epoch_checkpoint_due(epoch + 1, stopped):
                self._checkpoint(epoch + 1, 0, history, best, stopped)
            if early and best:
                self.context.log(f"early stop after epoch {epoch + 1}: no better val_loss "
                                 f"for {patience} epochs (best epoch {best['epoch']})")
            if halted:
                self.context.log(f"stopped after epoch {epoch + 1}: the driver's observer "
                                 "asked (a Tuner pruned the trial)")
            if stopped and (best or halted):
                break
        return history, best

    def _asked_to_stop(self, answer: bool) -> bool:
        """Under an observer (the fit's settings say so, the same on every rank): whether
        rank 0's answer from the driver was stop, agreed by every rank in one all-reduce."""
        if not self.observed:
            return False
        import torch

        flag = torch.tensor([1.0 if answer else 0.0], dtype=torch.float64)
        return float(self.backend.all_reduce_sum(flag)[0]) > 0

    def _train_epoch(self, train: SpilledRows, epoch: int, history: list[dict],
                     best: dict | None, first_step: int, partial_loss: float) -> float:
        """One epoch from step ``first_step`` (a mid-epoch resume); the mean training loss.

        Nothing in a step waits for the device: the loss sum stays on it until the epoch
        ends. Test hooks wrap the step from outside, only when one is armed."""
        import itertools

        import torch

        self.strategy.model.train()
        spec, clock = self.spec, self.clock
        every = spec.checkpoint.every_steps
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        if self.context.rank == 0:
            total += partial_loss
        feed = itertools.islice(train.batches(spec.optim.seed, epoch, self.steps,
                                              dim=spec.model.input_dim or None), first_step,
                                None)
        step_once = hooks.around_step(self._step, spec.hooks, self.context.rank, clock)
        clock.tick()
        for step, (features, target) in enumerate(feed, start=first_step):
            clock.tock("data")
            loss = step_once(epoch, step, features, target)
            if loss is not None:
                total += loss
                clock.tock("compute")
            if every and (step + 1) % every == 0 and step + 1 < self.steps:
                done = float(self.backend.all_reduce_sum(total.cpu().clone())[0])
                self._checkpoint(epoch, step + 1, history, best, partial_loss=done)
                clock.tock("other")
        return float(self.backend.all_reduce_sum(total.cpu())[0]) / max(1, self.rows[0])

    def _step(self, epoch: int, step: int, features: Inputs,
              target: Target) -> torch.Tensor | None:
        """One training step of the strategy; None for a step no rank has rows for (every
        rank skips it: none waits). Every step reseeds torch from (seed, epoch, step, rank),
        so a resumed step draws what the uninterrupted one drew (dropout), and takes the rate
        of its number across epochs (with learningRateScaling)."""
        if not self.global_sizes[step]:
            return None
        optim = self.spec.optim
        if optim.lr_scaling != "none":
            schedule.apply(self.optimizer, optim.rate_at(self.epoch_start + step))
        resume.seed_torch(resume.step_seed(optim.seed, epoch, step, self.context.rank),
                          self.device)
        return self.strategy.train_step(self._arguments(features),
                                        target.scaled(self.weight_scale).to(self.device),
                                        self.context.world_size / float(self.global_sizes[step]),
                                        self.optimizer)

    def _arguments(self, batch: Inputs) -> Inputs:
        """A batch from the feed as the network's arguments, on this rank's device."""
        from sparkdist.torchtrain.inputs import arguments, to_device

        return arguments(to_device(batch, self.device), self.spec.model.inputs)

    def _validate(self, validation: SpilledRows) -> dict[str, float]:
        """Validation outside the training wrapper (DDP's forward would sync buffers per
        call). Every rank runs as many batches as the rank with the most validation rows
        (smaller or empty ones where it has fewer), so a strategy whose forward is collective
        never waits on a missing call."""
        import torch

        self.strategy.module.eval()
        model = self.spec.model
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        steps = max(1, math.ceil(self.most_validation_rows / self.spec.optim.batch_size))
        classification = task_of_loss(model.loss) == "classification"
        with torch.no_grad():
            for features, target in validation.batches(0, 0, steps, shuffle=False,
                                                       dim=model.input_dim or None):
                output = self.strategy.predict(self._arguments(features))
                if output is None:
                    continue
                target = target.to(self.device)
                sums[0] += loss_sum(model.loss_fn, output, target, model.label_names)
                if target.weight is not None:
                    sums[2] += target.weight.sum()
                if classification:
                    sums[1] += correct_count(model.loss, output, target.label)
        sums = self.backend.all_reduce_sum(sums.cpu())
        # the weighted mean where rows are weighted (accuracy counts rows)
        weight = float(sums[2]) if self.spec.rules.weight_col else self.rows[1]
        metrics = {"val_loss": float(sums[0]) / weight if weight else math.nan}
        if classification:
            metrics["val_accuracy"] = float(sums[1]) / self.rows[1]
        return metrics

    def _all_ranks(self, train_seconds: float, state_bytes: int, optimizer_bytes: int,
                   sent_bytes: int) -> list[dict[str, Any]]:
        """Every rank's time split, peak memory, the bytes it holds of parameters, gradients
        and optimizer state (and of the optimizer state alone), and the bytes it sent while
        training (one all-reduce, after the last epoch)."""
        fields = StepClock.FIELDS + ("peak_rss_mb", "state_mb", "optimizer_mb", "sent_mb")
        rows = self._gather([*self.clock.split(train_seconds), peak_rss_mb(),
                             state_bytes / 2**20, optimizer_bytes / 2**20, sent_bytes / 2**20])
        return [{"rank": rank, **{name: round(float(value), 3)
                                  for name, value in zip(fields, row)}}
                for rank, row in enumerate(rows)]

    def _gather(self, values: list[float]) -> Any:
        """A (world_size, len(values)) table of every rank's ``values``, by one all-reduce."""
        import torch

        table = torch.zeros((self.context.world_size, len(values)), dtype=torch.float64)
        table[self.context.rank] = torch.tensor(values, dtype=torch.float64)
        return self.backend.all_reduce_sum(table)


def _optimizer_bytes(optimizer: Any) -> int:
    """Bytes of this rank's optimizer state (its shards only, for a sharded model)."""
    tensors = (value for state in optimizer.state.values() for value in state.values()
               if hasattr(value, "element_size"))
    local = (t.to_local() if hasattr(t, "to_local") else t for t in tensors)
    return sum(t.numel() * t.element_size() for t in local)
