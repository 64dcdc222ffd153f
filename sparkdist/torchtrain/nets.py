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


# ------------------------------------------------------------- networks with typed inputs
# For ``inputCols``: each forward argument is a column; a network declares the rows of the
# embedding table an id argument indexes (``embedding_sizes``), so an id beyond it is refused
# in the data pass, naming the column, instead of failing inside a step.
class ImageCNN(nn.Module):
    """Two 3x3 convolutions, a 2x2 max pool and two Linear layers (each after a dropout) over
    ``[channels, size, size]`` images (``inputShapes={"image": [channels, size, size]}``).

    >>> ImageCNN(channels=1, size=8, classes=10)(torch.zeros(2, 1, 8, 8)).shape
    torch.Size([2, 10])
    """

    def __init__(self, channels: int = 1, size: int = 8, classes: int = 10,
                 width: int = 32, dropout: float = 0.3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout),
                                  nn.Linear(2 * width * (size // 2) ** 2, 64), nn.ReLU(),
                                  nn.Dropout(dropout), nn.Linear(64, classes))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(image))


class TwoTower(nn.Module):
    """Neural collaborative filtering: a rating as the dot product of a user and an item
    embedding plus their biases and a global mean (ids 0..num_users-1 and 0..num_items-1).

    >>> TwoTower(num_users=5, num_items=7)(torch.tensor([0, 4]), torch.tensor([6, 1])).shape
    torch.Size([2, 1])
    """

    def __init__(self, num_users: int, num_items: int, dim: int = 32,
                 mean: float = 0.0) -> None:
        super().__init__()
        self.embedding_sizes = {"user": num_users, "item": num_items}
        self.users, self.items = nn.Embedding(num_users, dim), nn.Embedding(num_items, dim)
        self.user_bias, self.item_bias = nn.Embedding(num_users, 1), nn.Embedding(num_items, 1)
        for table in (self.users, self.items):
            nn.init.normal_(table.weight, std=0.1)
        for table in (self.user_bias, self.item_bias):
            nn.init.zeros_(table.weight)
        self.mean = nn.Parameter(torch.tensor(float(mean)))

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        dot = (self.users(user) * self.items(item)).sum(1, keepdim=True)
        return dot + self.user_bias(user) + self.item_bias(item) + self.mean


class SequenceClassifier(nn.Module):
    """A transformer encoder over token ids: token and position embeddings, ``layers``
    encoder layers that skip the padding (``tokens_mask``), the mean over the real tokens,
    and a Linear layer to ``classes`` outputs.

    >>> net = SequenceClassifier(vocab=20, classes=2, dim=16, heads=2, layers=1)
    >>> net(torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.bool)).shape
    torch.Size([2, 2])
    """

    def __init__(self, vocab: int, classes: int = 2, dim: int = 64, heads: int = 4,
                 layers: int = 2, max_length: int = 512) -> None:
        super().__init__()
        self.embedding_sizes = {"tokens": vocab}
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(max_length, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor, tokens_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.encoder(self.tokens(tokens) + self.positions(positions),
                              src_key_padding_mask=~tokens_mask)
        mask = tokens_mask.unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0))


class ClickModel(nn.Module):
    """A DLRM-style click model: a bottom MLP on the dense features, one embedding per
    categorical feature (``len(tables)`` ids per row, each below its table's size), the pairwise
    dot products of all those vectors (:class:`ClickInteractions`), and a top MLP to one logit.
    The declared table size (``embedding_sizes``) is the smallest table's: an id is refused
    where it would overrun a table of that size. Its forward is its two children in order, the
    first taking the typed inputs: ``strategy="pipeline"`` can split it. With
    ``table_device="meta"`` the table has no memory of its own: ``strategy="ps"``'s servers
    draw its rows (``psInitStd=0.05`` for the same start).

    >>> net = ClickModel(dense=3, tables=[10, 20], dim=4)
    >>> net(torch.zeros(2, 3), torch.tensor([[1, 19], [9, 0]])).shape
    torch.Size([2, 1])
    """

    def __init__(self, dense: int = 13, tables: Sequence[int] = (100_000,) * 26,
                 dim: int = 16, hidden: Sequence[int] = (64, 32),
                 table_device: str = "cpu") -> None:
        super().__init__()
        self.embedding_sizes = {"ids": min(tables)}
        self.interactions = ClickInteractions(dense, tables, dim, table_device)
        vectors = len(tables) + 1
        self.top = MLP(input_dim=dim + vectors * (vectors - 1) // 2, output_dim=1, hidden=hidden)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.top(self.interactions(dense, ids))


class ClickInteractions(nn.Module):
    """The bottom of :class:`ClickModel`: the dense features' vector and the pairwise dot
    products of it and the ids' embeddings (all tables in one, each feature at its offset)."""

    offsets: torch.Tensor  # where each feature's rows start in the one table

    def __init__(self, dense: int, tables: Sequence[int], dim: int,
                 table_device: str = "cpu") -> None:
        super().__init__()
        offsets = torch.tensor([0, *tables[:-1]]).cumsum(0)
        self.register_buffer("offsets", offsets, persistent=False)
        # "meta": a table no rank holds whole (strategy="ps" with psInitStd=0.05 draws it)
        self.table = nn.Embedding(int(sum(tables)), dim, device=table_device)
        nn.init.normal_(self.table.weight, std=0.05)
        self.bottom = nn.Sequential(nn.Linear(dense, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        vectors = torch.cat([self.bottom(dense).unsqueeze(1), self.table(ids + self.offsets)], 1)
        pairs = torch.triu_indices(vectors.shape[1], vectors.shape[1], 1, device=ids.device)
        products = torch.bmm(vectors, vectors.transpose(1, 2))[:, pairs[0], pairs[1]]
        return torch.cat([vectors[:, 0], products], 1)


class HashedLogistic(nn.Module):
    """Logistic regression on hashed features: a weight per feature id (an ``EmbeddingBag``
    summing a row's ids, each below ``features``) and a bias; one logit. Under
    ``strategy="ps"`` the weights stay on the servers and no row is densified.

    >>> HashedLogistic(features=16)(torch.tensor([[1, 5, 5], [0, 2, 15]])).shape
    torch.Size([2, 1])
    """

    def __init__(self, features: int = 2**20) -> None:
        super().__init__()
        self.embedding_sizes = {"ids": features}
        self.weights = nn.EmbeddingBag(features, 1, mode="sum")
        nn.init.zeros_(self.weights.weight)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weights(ids) + self.bias


class FactorizationMachine(HashedLogistic):
    """A factorization machine on hashed features: :class:`HashedLogistic` plus the pairwise
    interactions of a ``dim``-wide factor per feature (Rendle's O(n x dim) form).

    >>> FactorizationMachine(features=16, dim=4)(torch.tensor([[1, 5, 9]])).shape
    torch.Size([1, 1])
    """

    def __init__(self, features: int = 2**20, dim: int = 8) -> None:
        super().__init__(features)
        self.factors = nn.Embedding(features, dim)
        nn.init.normal_(self.factors.weight, std=0.01)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        factors = self.factors(ids)
        pairs = 0.5 * (factors.sum(1).pow(2) - factors.pow(2).sum(1)).sum(1, keepdim=True)
        return super().forward(ids) + pairs


class CausalLM(nn.Module):
    """A small decoder-only (causal) transformer over token ids that predicts the token after
    each sequence: token and position embeddings, ``layers`` pre-norm blocks of causal
    self-attention (``q``, ``k``, ``v``, ``o``: plain Linear layers, so LoRA can target them)
    and an MLP, and a ``head`` on the last real token (``tokens_mask``) to ``vocab`` logits.

    >>> net = CausalLM(vocab=20, dim=16, layers=1, heads=2, max_length=8)
    >>> net(torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.bool)).shape
    torch.Size([2, 20])
    """

    def __init__(self, vocab: int, dim: int = 256, layers: int = 4, heads: int = 4,
                 max_length: int = 64) -> None:
        super().__init__()
        self.embedding_sizes = {"tokens": vocab}
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(max_length, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, tokens_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            hidden = block(hidden)
        last = tokens_mask.sum(1).clamp(min=1) - 1  # padding sits after: causal attention
        return self.head(self.norm(hidden[torch.arange(len(tokens)), last]))  # never sees it


class Block(nn.Module):
    """One pre-norm block of :class:`CausalLM`: causal self-attention, then an MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, length, dim = x.shape
        h = self.norm1(x)
        q, k, v = (layer(h).view(rows, length, self.heads, -1).transpose(1, 2)
                   for layer in (self.q, self.k, self.v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attended.transpose(1, 2).reshape(rows, length, dim))
        return x + self.mlp(self.norm2(x))
