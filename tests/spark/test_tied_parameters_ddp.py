"""strategy='ddp' keeps a tied Parameter one tensor through a 2-worker fit (round 3, N1): the
fitted model's two names hold the same trained weight. The strategies that would train two
copies refuse the tie before launch (tests/unit/test_tied_parameters.py, and the N1 rows of
tests/spark/test_bad_input.py)."""

from __future__ import annotations

import sys

import pytest
import torch
from pyspark import cloudpickle
from torch import nn

from sparkdist.models import TorchEstimator

# Classes defined here travel to the executors by value (the test module is not importable
# there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Tied(nn.Module):
    """N1's network: the second Linear's weight is the first one's."""

    def __init__(self, input_dim: int, output_dim: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(input_dim, input_dim), nn.ReLU(),
                                    nn.Linear(input_dim, input_dim), nn.ReLU(),
                                    nn.Linear(input_dim, output_dim))
        self.layers[2].weight = self.layers[0].weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@pytest.mark.slow
def test_ddp_keeps_a_tied_parameter_one_tensor(nonlinear):
    model = TorchEstimator(model=Tied, numWorkers=2, epochs=1, batchSize=256, seed=5,
                           progress=False, rendezvousTimeoutSeconds=60).fit(nonlinear[0])
    weights = model._weights
    assert torch.equal(weights["layers.0.weight"], weights["layers.2.weight"])
    net = model.module()
    assert net.layers[0].weight is net.layers[2].weight
    assert torch.equal(net.layers[0].weight, weights["layers.0.weight"])
