"""The table lifecycle of the PyTorch modules (posenc/torch/_backend.py)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import posenc  # noqa: E402
from posenc.torch import RotaryEmbedding, SinusoidalPositionalEncoding  # noqa: E402


@pytest.mark.parametrize("module", ["sinusoidal", "rope"])
def test_decoding_far_past_the_table_computes_only_the_rows_asked_for(module):
    if module == "sinusoidal":
        layer = SinusoidalPositionalEncoding(64, dropout=0.0, max_length=2048)
        out = layer(torch.zeros(1, 1, 64), offset=10**7)
        expected = torch.from_numpy(posenc.sinusoidal([10**7], 64))
    else:
        layer = RotaryEmbedding(64, max_length=2048)
        q = torch.ones(1, 1, 1, 64)
        out, _ = layer(q, q, offset=10**7)
        cos, sin = posenc.rope_tables([10**7], posenc.rope_frequencies(64), dtype="float64")
        x = np.ones(64)
        rotated = x * cos[0] + np.concatenate([-x[32:], x[:32]]) * sin[0]
        expected = torch.from_numpy(rotated.astype(np.float32)).view(1, 1, 1, 64)
    torch.testing.assert_close(out.view_as(expected), expected, rtol=0, atol=2e-6)
    assert layer.table_length == 2048  # not 10**7 rows built to answer one
    layer(
        torch.zeros(1, 1, 64) if module == "sinusoidal" else q,
        *([] if module == "sinusoidal" else [q]),
        offset=3000,
    )
    assert layer.table_length == 4096  # a call that starts within twice the table grows it
