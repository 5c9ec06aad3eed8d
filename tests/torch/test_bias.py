"""The PyTorch bias modules refuse what would be silently wrong or unbounded."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from posenc.core.positions import MemoryLimitError  # noqa: E402
from posenc.torch import (  # noqa: E402
    ALiBiBias,
    FIREBias,
    KERPLEBias,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SandwichBias,
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


@pytest.mark.parametrize(
    "make",
    [
        lambda: ALiBiBias(3),
        lambda: T5RelativeBias(2),
        lambda: KERPLEBias(2),
        lambda: FIREBias(2),
        lambda: SandwichBias(2, dim=4),
    ],
    ids=["alibi", "t5", "kerple", "fire", "sandwich"],
)
def test_without_an_offset_the_queries_are_the_last_of_the_keys(make):
    # posenc.core.plan.align_queries, in every score bias: rows K-Q .. K-1 of the square
    torch.manual_seed(0)
    module = make()
    with torch.no_grad():
        full = module(6)
        for q in (1, 2, 6):
            torch.testing.assert_close(module(q, 6), module(q, 6, offset=6 - q), rtol=0, atol=0)
            # (FIRE's MLP at another shape may round its float32 sums differently)
            torch.testing.assert_close(module(q, 6), full[:, 6 - q :], rtol=1e-6, atol=1e-7)
        with pytest.raises(ValueError, match="query_length=6 > key_length=2 with no offset"):
            module(6, 2)


def test_t5_bias_on_the_meta_device_is_a_meta_tensor():
    """Its buckets on ``device`` and its weights on their own once gave a CPU tensor of
    uninitialised memory: the weights move to ``device`` with the buckets."""
    bias = T5RelativeBias(2, num_buckets=8, max_distance=16)(4, device="meta")
    assert bias.device.type == "meta"
    assert bias.shape == (2, 4, 4)
