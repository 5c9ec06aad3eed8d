"""The PyTorch bias modules refuse what would be silently wrong or unbounded."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from posenc.core.positions import MemoryLimitError  # noqa: E402
from posenc.torch import (  # noqa: E402
    ALiBiBias,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    T5RelativeBias,
)


@pytest.mark.parametrize("module", [ALiBiBias(4), T5RelativeBias(4)])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_an_integer_dtype_is_a_type_error_not_a_truncated_bias(module, dtype):
    with pytest.raises(TypeError, match=rf"dtype must be one of .*got {dtype}"):
        module(3, dtype=dtype)


@pytest.mark.parametrize("module", [ALiBiBias(8), T5RelativeBias(8)])
def test_a_long_bias_is_refused_before_any_allocation(module):
    name = type(module).__name__
    with pytest.raises(
        MemoryLimitError, match=rf"{name}'s bias for 200000 queries and 200000 keys"
    ):
        module(200_000)
    with pytest.raises(MemoryLimitError, match="compute it in blocks of queries"):
        module(1, 10**12)


def test_the_bucket_table_of_a_huge_max_distance_is_refused():
    with pytest.raises(MemoryLimitError, match="use a smaller max_distance"):
        T5RelativeBias(8, max_distance=10**9)


def positional_calls():
    x = torch.zeros(1, 2, 8)
    q = torch.zeros(1, 1, 2, 8)
    at = torch.tensor([[3, 4]])
    return [
        ("SinusoidalPositionalEncoding", lambda: SinusoidalPositionalEncoding(8, dropout=0.0)(x, positions=at, offset=3)),
        ("LearnedPositionalEmbedding", lambda: LearnedPositionalEmbedding(8, 8, dropout=0.0)(x, positions=at, offset=3)),
        ("RotaryEmbedding", lambda: RotaryEmbedding(8)(q, q, positions=at, offset=3)),
        ("ALiBiBias", lambda: ALiBiBias(2)(2, 5, positions=at, offset=3)),
        ("T5RelativeBias", lambda: T5RelativeBias(2)(2, 5, positions=at, offset=3)),
    ]  # fmt: skip


@pytest.mark.parametrize(("name", "call"), positional_calls())
def test_an_offset_beside_positions_is_an_error_not_ignored(name, call):
    with pytest.raises(
        ValueError, match=rf"{name}: give positions= or offset=, not both \(got offset=3"
    ):
        call()
