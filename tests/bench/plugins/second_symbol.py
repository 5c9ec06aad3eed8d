"""A bench plugin for the tests: a task and a scheme that posenc does not build in.

``second``: ``[BOS] x_1 .. x_n [SEP] x_2``: the model is scored on the second input
symbol, which it can find only by its position. No ``max_positions``: the bench
measures the problems it draws (every one has n + 3 tokens).

``learned-recency``: a bias ``-slope_h · (query - key)`` on the scores, one learned
slope per head (ALiBi's form with trained slopes), a ``BiasesScores`` module per layer.
"""

from __future__ import annotations

import numpy as np
import torch

from posenc.bench import register_scheme, register_task
from posenc.torch.protocols import BiasesScores


class SecondSymbol:
    name = "second"
    vocab = ("<pad>", "<bos>", "<sep>", "a", "b", "c", "d")

    def sample(self, lengths, generator):
        problems = []
        for n in lengths:
            x = generator.integers(3, 7, size=max(int(n), 2))
            tokens = np.array([1, *x, 2, x[1]])
            scored = np.zeros(tokens.size, dtype=bool)
            scored[-1] = True
            problems.append((tokens, scored))
        return problems


class LearnedRecency(BiasesScores):
    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.slopes = torch.nn.Parameter(torch.full((num_heads,), 0.5))

    def forward(self, query_length, key_length=None, *, offset=0, positions=None,
                key_positions=None, dtype=torch.float32, device=None):  # fmt: skip
        keys = query_length + offset if key_length is None else key_length
        q = torch.arange(offset, offset + query_length, device=device).unsqueeze(-1)
        k = torch.arange(keys, device=device)
        distance = (q - k).clamp(min=0).to(self.slopes.dtype)  # (q, k)
        bias = -self.slopes.view(-1, 1, 1) * distance  # (heads, q, k)
        return bias if dtype is None else bias.to(dtype)


def learned_recency(*, d_model, n_heads, head_dim, max_positions):
    return LearnedRecency(n_heads)


register_task(SecondSymbol())
register_scheme("learned-recency", learned_recency)
