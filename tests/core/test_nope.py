from __future__ import annotations

import numpy as np
import pytest

import posenc
from posenc.core.positions import MemoryLimitError


def test_nope_is_zeros_shaped_like_the_sinusoidal_table():
    np.testing.assert_array_equal(posenc.nope(np.zeros((2, 3)), 5), np.zeros((2, 3, 5), np.float32))


def test_nope_checks_memory_before_allocating():
    with pytest.raises(MemoryLimitError, match=r"this NoPE table would need about 3\.6 TiB"):
        posenc.nope(10**7, 10**5)
    assert posenc.nope(10**3, 10**3, max_bytes=None).shape == (1000, 1000)


def test_attention_temperature_is_llama4s_scale_correctly_rounded():
    """Against transformers' Llama 4 attention expression (float32 torch ops: within one
    float32 ulp) and mpmath (exact, rounded once) at every position of a range."""
    import mpmath
    import pytest

    torch = pytest.importorskip("torch")
    from posenc import attention_temperature

    positions = np.concatenate([np.arange(0, 70_000, 7), [2**24, 10**9 + 5]])
    mine = attention_temperature(positions, floor_scale=8192, attn_scale=0.1)
    p = torch.from_numpy(positions)
    theirs = torch.log1p(torch.floor((p.float() + 1.0) / 8192)) * 0.1 + 1.0  # Llama4TextAttention
    np.testing.assert_allclose(mine, theirs.numpy(), rtol=2**-23, atol=0)
    mpmath.mp.dps = 40
    for position, value in zip(positions[::500].tolist(), mine[::500].tolist(), strict=True):
        exact = 1 + mpmath.mpf(0.1) * mpmath.log1p(mpmath.floor(mpmath.mpf(position + 1) / 8192))
        assert value == float(np.float32(float(exact))), position
    assert attention_temperature(3, dtype="float64").tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="integers >= 0"):
        attention_temperature([-1])
    with pytest.raises(ValueError, match="floor_scale"):
        attention_temperature(4, floor_scale=0.0)
