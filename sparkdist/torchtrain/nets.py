"""Ready-made networks for :class:`sparkdist.models.TorchEstimator`.

Any ``nn.Module`` works; a module whose constructor takes ``input_dim`` and ``output_dim`` gets
them filled in from the data when ``modelKwargs`` leaves them out, as this MLP does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Module):
    """A multi-layer perceptron: Linear -> ReLU (-> Dropout) per hidden layer, then Linear.

    Examples
    --------
    >>> net = MLP(input_dim=8, output_dim=1, hidden=[16, 8], dropout=0.1)
    >>> net(torch.zeros(4, 8)).shape
    torch.Size([4, 1])

    :class:`~sparkdist.models.TorchEstimator` builds it by name, with its input and output
    sizes filled in:

    >>> from sparkdist.models import TorchEstimator
    >>> estimator = TorchEstimator(model="sparkdist.torchtrain.nets.MLP",
    ...                            modelKwargs={"hidden": [64, 32]})
    """

    def __init__(self, input_dim: int, output_dim: int, hidden: Sequence[int] = (64,),
                 dropout: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = input_dim
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = size
        layers.append(nn.Linear(width, output_dim))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
