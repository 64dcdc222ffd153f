"""strategy='pipeline' on real torch.distributed (gloo, forked ranks), against one process
training the whole model on the same rows: micro-batched GPipe and 1F1B give the full batch's
gradients; 2 stages x 2 replicas with uneven and empty batches (more than one round) take
the whole-model Adam steps; validation hands every rank its own rows' outputs; a checkpoint
written by 2 x 2 ranks resumes in another layout (2 stages, 1 replica, other micro-batches)
to the same weights."""

from __future__ import annotations

import multiprocessing
import os
import traceback

import pytest

torch = pytest.importorskip("torch")

from sparkdist.torchtrain.clock import StepClock  # noqa: E402
from sparkdist.torchtrain.inputs import Target  # noqa: E402
from sparkdist.torchtrain.nets import MLP  # noqa: E402
from sparkdist.torchtrain.network import loss_sum  # noqa: E402

INPUT, CLASSES = 5, 3
#: Rows of each rank at each step (rank order): the 2 x 2 run has an empty rank, an empty
#: replica (step 1) and a replica needing 2 rounds of 8 rows (step 0: 9 + 7).
SIZES_2X2 = [[3, 0, 9, 7], [1, 2, 0, 0]]
SIZES_RESUMED = [[4, 5]]


def _model():
    torch.manual_seed(0)
    return MLP(INPUT, CLASSES, hidden=[7, 6, 6])


def _rows(step, rank, size):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(size, INPUT, generator=generator),
            torch.randint(0, CLASSES, (size,), generator=generator).float())


def _args(stages, micro, schedule, optimizer="adam"):
    from tests.torchfits import train_spec

    return train_spec("pipeline", pipeline_stages=stages, micro_batches=micro,
                      pipeline_schedule=schedule, batch_size=3, input_dim=INPUT,
                      output_dim=CLASSES, num_classes=CLASSES, loss="cross_entropy",
                      loss_fn="cross_entropy", optimizer=optimizer, learning_rate=0.01,
                      weight_decay=0.0)


class _Context:
    def __init__(self, rank, world):
        self.rank, self.world_size = rank, world

    def log(self, message):
        pass


class _Backend:
    """The loop's all-reduce (sparkdist.torchtrain.backends.TorchBackend's, on CPU)."""

    def all_reduce_sum(self, tensor):
        import torch.distributed as dist

        dist.all_reduce(tensor)
        return tensor


def _strategy(rank, world, args):
    from sparkdist.torchtrain.strategies.pipeline import Strategy

    strategy = Strategy(_Context(rank, world), _Backend(), torch.device("cpu"), args,
                        StepClock())
    strategy.setup(_model())
    return strategy, strategy.optimizer()


def _train(strategy, optimizer, rank, world, sizes, first_step=0):
    for step, row in enumerate(sizes, start=first_step):
        features, label = _rows(step, rank, row[rank])
        strategy.train_step(features, Target(label), world / sum(row), optimizer)


def _job_gradients(rank, world, out):
    """One SGD step with 4 micro-batches, GPipe then 1F1B: every stage's gradients."""
    result = {}
    for schedule in ("gpipe", "1f1b"):
        strategy, optimizer = _strategy(rank, world, _args(2, 4, schedule, "sgd"))
        features, label = _rows(0, rank, 5 + 4 * rank)
        loss = strategy.train_step(features, Target(label), world / 14, optimizer)
        result[schedule] = {"loss": loss, "grads": {
            name: p.grad.clone() for name, p in strategy.module.named_parameters()}}
    return result


def _job_two_by_two(rank, world, out):
    strategy, optimizer = _strategy(rank, world, _args(2, 2, "1f1b"))
    _train(strategy, optimizer, rank, world, SIZES_2X2)
    saved = strategy.save_training_state(optimizer, f"{out}/shards")
    state = strategy.full_state()
    strategy.module.eval()
    with torch.no_grad():
        output = strategy.predict(_rows(7, rank, [2, 5, 0, 4][rank])[0])
    return {"saved": saved, "state": state, "output": output}


def _job_resumed(rank, world, out):
    strategy, optimizer = _strategy(rank, world, _args(2, 3, "gpipe"))
    strategy.load_training_state(torch.load(f"{out}/saved.pt", weights_only=True), optimizer)
    _train(strategy, optimizer, rank, world, SIZES_RESUMED, first_step=len(SIZES_2X2))
    return {"state": strategy.full_state()}


JOBS = {"gradients": _job_gradients, "two_by_two": _job_two_by_two, "resumed": _job_resumed}


def _rank(rank, world, job, out):
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{out}/store-{job}", rank=rank,
                                world_size=world)
        torch.save(JOBS[job](rank, world, out), f"{out}/{job}-{rank}.pt")
        dist.destroy_process_group()
    except BaseException:
        with open(f"{out}/{job}-{rank}.err", "w") as err:
            err.write(traceback.format_exc())
        raise


def _run(world, job, out):
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=_rank, args=(rank, world, job, out)) for rank in range(world)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(180)
    errors = [open(f"{out}/{job}-{r}.err").read() for r in range(world)
              if os.path.exists(f"{out}/{job}-{r}.err")]
    assert [process.exitcode for process in ranks] == [0] * world, errors
    return [torch.load(f"{out}/{job}-{r}.pt", weights_only=True) for r in range(world)]


def _reference(sizes, optimizer_name="adam", steps=None):
    """The whole model trained in one process on every rank's rows of each step, the loss
    the mean over the step's rows."""
    net = _model()
    optimizer = (torch.optim.Adam(net.parameters(), lr=0.01) if optimizer_name == "adam"
                 else torch.optim.SGD(net.parameters(), lr=0.01))
    for step, row in enumerate(sizes):
        parts = [_rows(step, rank, n) for rank, n in enumerate(row)]
        features, label = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        optimizer.zero_grad()
        (loss_sum("cross_entropy", net(features), Target(label)) / len(label)).backward()
        if steps is None or step < steps:
            optimizer.step()
    return net


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return str(tmp_path_factory.mktemp("pipeline"))


@pytest.mark.slow
def test_micro_batches_give_the_full_batchs_gradients_with_gpipe_and_1f1b(out):
    ranks = _run(2, "gradients", out)
    net = _model()
    parts = [_rows(0, rank, 5 + 4 * rank) for rank in range(2)]
    features, label = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    full = loss_sum("cross_entropy", net(features), Target(label))
    (full / len(label)).backward()
    expected = {name: p.grad for name, p in net.named_parameters()}
    for schedule in ("gpipe", "1f1b"):
        grads = {**ranks[0][schedule]["grads"], **ranks[1][schedule]["grads"]}
        assert grads.keys() == expected.keys()
        for name, grad in grads.items():
            assert torch.allclose(grad, expected[name], rtol=1e-5, atol=1e-7), (schedule, name)
        # the summed loss on the last stage only
        assert float(ranks[0][schedule]["loss"]) == 0.0
        assert float(ranks[1][schedule]["loss"]) == pytest.approx(float(full.detach()), rel=1e-6)


@pytest.fixture(scope="module")
def two_by_two(out):
    ranks = _run(4, "two_by_two", out)
    torch.save(ranks[0]["saved"], f"{out}/saved.pt")
    return ranks


@pytest.mark.slow
def test_two_stages_by_two_replicas_take_the_whole_models_steps(two_by_two):
    """Uneven batches, an empty rank, an empty replica and a 2-round replica: the merged
    state on rank 0 is the whole model after the same Adam steps on all the rows."""
    expected = _reference(SIZES_2X2).state_dict()
    state = two_by_two[0]["state"]
    assert list(state) == list(expected)
    for name, value in state.items():
        assert torch.allclose(value, expected[name], rtol=1e-5, atol=1e-6), name
    assert all(rank["state"] is None and rank["saved"] is None for rank in two_by_two[1:])


@pytest.mark.slow
def test_validation_hands_every_rank_its_own_rows_outputs(two_by_two):
    net = _reference(SIZES_2X2)
    net.eval()
    for rank, n in enumerate([2, 5, 0, 4]):
        output = two_by_two[rank]["output"]
        if n == 0:
            assert output is None
            continue
        expected = net(_rows(7, rank, n)[0]).detach()
        assert output.shape == expected.shape
        assert torch.allclose(output, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_two_by_two_checkpoint_resumes_in_another_layout(two_by_two, out):
    """Written by 2 stages x 2 replicas (model and Adam state by parameter name, merged on
    rank 0), read by 2 stages x 1 replica with 3 micro-batches: the third step lands where
    the whole model's third Adam step does."""
    ranks = _run(2, "resumed", out)
    expected = _reference(SIZES_2X2 + SIZES_RESUMED).state_dict()
    state = ranks[0]["state"]
    for name, value in state.items():
        assert torch.allclose(value, expected[name], rtol=1e-5, atol=1e-6), name
    # and the step moved the weights (a resume that lost Adam's moments would differ)
    before = two_by_two[0]["state"]
    assert not torch.equal(before["layers.0.weight"], state["layers.0.weight"])


@pytest.mark.slow
def test_the_checkpoint_is_a_file_per_stage_checked_on_reading(two_by_two, out):
    from sparkdist.exceptions import TrainingError
    from sparkdist.torchtrain.strategies import pipeline

    saved = two_by_two[0]["saved"]
    assert saved["format"] == pipeline.FORMAT and saved["where"] == f"{out}/shards"
    assert sorted(os.listdir(saved["where"])) == [entry["file"] for entry in saved["stages"]] == [
        "stage-0000-of-0002.pt", "stage-0001-of-0002.pt"]
    assert saved["stages"][1]["names"] == ["layers.4.weight", "layers.4.bias",
                                           "layers.6.weight", "layers.6.bias"]
    # a stage reads only the files holding its names
    read = pipeline._read_stage_files(saved, {"layers.6.bias"})
    assert list(read["model"]) == saved["stages"][1]["names"]
    path = f"{saved['where']}/stage-0001-of-0002.pt"
    data = bytearray(open(path, "rb").read())
    data[-20] ^= 0xFF
    with open(path, "wb") as damaged:
        damaged.write(data)
    with pytest.raises(TrainingError, match="does not hold the bytes its checkpoint recorded"):
        pipeline._read_stage_files(saved, {"layers.6.bias"})
    assert pipeline._read_stage_files(saved, {"layers.0.bias"})["model"]  # the other is fine
