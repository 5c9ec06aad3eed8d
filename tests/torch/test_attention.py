"""Attention with injected schemes, and the ALiBi / T5 bias modules."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.testing import assert_close  # noqa: E402

import posenc  # noqa: E402
from posenc.torch import (  # noqa: E402
    ALiBiBias,
    KVCache,
    MultiHeadAttention,
    RotaryEmbedding,
    T5RelativeBias,
)

SCHEMES = ["nope", "rope", "alibi", "t5"]


def make_position(name: str, heads: int = 4, head_dim: int = 8, causal: bool = True):
    if name == "nope":
        return None
    if name == "rope":
        return RotaryEmbedding(head_dim, max_length=64)
    if name == "alibi":
        return ALiBiBias(heads, mode="causal" if causal else "symmetric")
    torch.manual_seed(1)
    return T5RelativeBias(heads, bidirectional=not causal)


def reference_attention(module: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ/√d + bias + mask) v written out in float64, from the module's weights."""
    B, T, C = x.shape
    nh, hs = module.num_heads, module.head_dim
    w = module.qkv.weight.double()
    q, k, v = (x.double() @ w.T).split(C, dim=2)
    q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k, v))
    position = module.position
    if isinstance(position, RotaryEmbedding):
        cos, sin = posenc.rope_tables(T, posenc.rope_frequencies(hs), dtype="float64")
        q, k = (torch.from_numpy(posenc.apply_rope(t.detach().numpy(), cos, sin)) for t in (q, k))
    scores = q @ k.transpose(-1, -2) / math.sqrt(hs)
    if isinstance(position, ALiBiBias):
        scores = scores + torch.from_numpy(
            posenc.alibi_bias(T, num_heads=nh, mode=position.spec.mode, dtype="float64")
        )
    if isinstance(position, T5RelativeBias):
        weights = position.relative_attention_bias.weight.detach().double().numpy()
        scores = scores + torch.from_numpy(
            posenc.t5_bias(weights, T, bidirectional=position.spec.bidirectional)
        )
    if module.causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = scores.softmax(-1) @ v
    y = y.transpose(1, 2).reshape(B, T, C)
    return y @ module.out.weight.double().T


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_attention_equals_the_written_out_formula(scheme, causal):
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, position=make_position(scheme, causal=causal), causal=causal)
    x = torch.randn(2, 12, 32)
    assert_close(module(x).double(), reference_attention(module, x), rtol=0, atol=2e-5)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_kv_cache_decoding_equals_the_full_call(scheme):
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, position=make_position(scheme)).eval()
    x = torch.randn(2, 16, 32)
    full = module(x)
    cache = KVCache()
    prefix = module(x[:, :5], cache=cache)  # a prompt, then one token at a time
    steps = [module(x[:, t : t + 1], cache=cache) for t in range(5, 16)]
    assert cache.length == 16
    assert_close(torch.cat([prefix, *steps], dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5"])
def test_relative_schemes_do_not_see_a_common_shift(scheme):
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, position=make_position(scheme)).eval()
    x = torch.randn(1, 10, 32)
    base = module(x, positions=torch.arange(10))
    shifted = module(x, positions=torch.arange(1000, 1010))
    assert_close(shifted, base, rtol=0, atol=1e-5)


def test_nope_bidirectional_attention_is_permutation_equivariant():
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, causal=False).eval()
    x = torch.randn(1, 9, 32)
    perm = torch.randperm(9)
    assert_close(module(x[:, perm]), module(x)[:, perm], rtol=0, atol=1e-6)


def test_packed_documents_with_a_block_mask_equal_separate_calls():
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, position=make_position("rope")).eval()
    a, b = torch.randn(1, 4, 32), torch.randn(1, 6, 32)
    doc = torch.tensor([0] * 4 + [1] * 6)
    mask = (doc[:, None] == doc[None, :])[None, None]  # (1, 1, 10, 10)
    positions = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4, 5])
    packed = module(torch.cat([a, b], dim=1), positions=positions, attn_mask=mask)
    assert_close(packed, torch.cat([module(a), module(b)], dim=1), rtol=0, atol=1e-5)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_compile_fullgraph_and_export(scheme):
    torch._dynamo.reset()  # each scheme recompiles forward: keep under the limit
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, position=make_position(scheme)).eval()
    x = torch.randn(2, 12, 32)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    assert_close(compiled(x), module(x), rtol=0, atol=1e-6)
    program = torch.export.export(module, (x,))
    assert_close(program.module()(x), module(x), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------
# The bias modules against the NumPy core and the references behind it.


@pytest.mark.parametrize("heads", [1, 8, 12, 20])
@pytest.mark.parametrize("mode", ["causal", "symmetric"])
@pytest.mark.parametrize(("q", "k", "offset"), [(7, None, 0), (1, 40, 39), (5, 12, 7)])
def test_alibi_bias_equals_the_core(heads, mode, q, k, offset):
    bias = ALiBiBias(heads, mode=mode)(q, k, offset=offset, dtype=torch.float64)
    expected = posenc.alibi_bias(q, k, num_heads=heads, mode=mode, offset=offset, dtype="float64")
    assert np.array_equal(bias.numpy(), expected)
    low = ALiBiBias(heads, mode=mode).bfloat16()(q, k, offset=offset, dtype=torch.bfloat16)
    expected_bf16 = posenc.alibi_bias(q, k, num_heads=heads, mode=mode, offset=offset,
                                      dtype="bfloat16").astype(np.float64)  # fmt: skip
    assert np.array_equal(low.double().numpy(), expected_bf16)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("q", "k", "offset"), [(9, None, 0), (1, 300, 299), (20, 20, 0)])
def test_t5_bias_equals_the_core_and_hugging_face(bidirectional, q, k, offset):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    torch.manual_seed(0)
    module = T5RelativeBias(6, bidirectional=bidirectional)
    weights = module.relative_attention_bias.weight.detach().double().numpy()
    ours = module(q, k, offset=offset, dtype=torch.float64).detach().numpy()
    core = posenc.t5_bias(weights, q, k, bidirectional=bidirectional, offset=offset)
    assert np.array_equal(ours, core)

    config = t5.T5Config(num_heads=6, d_model=48, d_kv=8, relative_attention_num_buckets=32,
                         relative_attention_max_distance=128, is_decoder=not bidirectional)  # fmt: skip
    hf = t5.T5Attention(config, has_relative_attention_bias=True)
    hf.load_state_dict({"relative_attention_bias.weight": module.relative_attention_bias.weight,
                        **{n: p for n, p in hf.state_dict().items() if "relative" not in n}})  # fmt: skip
    key_length = offset + q if k is None else k
    expected = hf.compute_bias(q, key_length, past_seen_tokens=offset)[0]
    assert_close(module(q, k, offset=offset), expected, rtol=0, atol=0)


def test_t5_weights_load_from_a_hugging_face_state_dict():
    module = T5RelativeBias(4)
    state = {"relative_attention_bias.weight": torch.randn(32, 4), "buckets": torch.zeros(3)}
    with pytest.warns(
        UserWarning, match="the module keeps its own"
    ):  # the junk buckets: named, then dropped
        module.load_state_dict(state, strict=True)
    assert set(module.state_dict()) == {"relative_attention_bias.weight"}
    assert dict(ALiBiBias(4).state_dict()) == {}


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: MultiHeadAttention(30, 4), ValueError, "num_heads must divide d_model"),
        (lambda: MultiHeadAttention(32, 4, position=RotaryEmbedding(16)), ValueError, "head_dim=8"),
        (lambda: MultiHeadAttention(32, 4, position=ALiBiBias(8)), ValueError, "8 heads"),
        (lambda: MultiHeadAttention(32, 4, position=torch.nn.Linear(2, 2)), TypeError, "Linear"),
        (lambda: ALiBiBias(0), ValueError, "num_heads must be an int >= 1, got 0"),
        (lambda: ALiBiBias(4, mode="both"), ValueError, "'both'"),
        (lambda: T5RelativeBias(4, bidirectional=1), TypeError, "bool"),
        (lambda: MultiHeadAttention(32, 4)(torch.zeros(2, 5, 16)), ValueError, r"\(2, 5, 16\)"),
        (lambda: ALiBiBias(2)(-1), ValueError, "query_length.*-1"),
        (lambda: ALiBiBias(2)(3, positions=torch.tensor([0.0, 1, 2])), TypeError, "integer"),
        (lambda: MultiHeadAttention(32, 4)(torch.zeros(1, 2, 32), offset=1, cache=KVCache()),
         ValueError, "either offset= or cache="),
    ],
)  # fmt: skip
def test_bad_input(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bias_positions_must_be_integers_of_matching_batches():
    with pytest.raises(TypeError, match="positions must be an integer tensor.*bool"):
        ALiBiBias(2)(3, positions=torch.tensor([True, False, True]))
    with pytest.raises(ValueError, match="different batch sizes"):
        T5RelativeBias(2)(3, 3, positions=torch.zeros(2, 3, dtype=torch.long),
                          key_positions=torch.zeros(4, 3, dtype=torch.long))  # fmt: skip


# ---------------------------------------------------------------------------------------
# Schemes plug in by the role they play (posenc.torch.protocols), not by their class.


class HalvedRotation:
    """A rotation written here, not in posenc: RoPE with every frequency halved."""

    head_dim, qk_layout = 8, "bhsd"

    def __init__(self) -> None:
        self.inv_freq = posenc.rope_frequencies(8) / 2

    def tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return posenc.rope_tables(positions, self.inv_freq, dtype="float64")

    def rotate_queries_keys(self, q, k, *, positions=None, offset=0):
        where = np.arange(offset, offset + q.shape[2]) if positions is None else positions.numpy()
        cos, sin = (torch.from_numpy(t).to(q.dtype) for t in self.tables(where))
        return (
            torch.from_numpy(posenc.apply_rope(q.detach().numpy(), cos.numpy(), sin.numpy())),
            torch.from_numpy(posenc.apply_rope(k.detach().numpy(), cos.numpy(), sin.numpy())),
        )


class DistancePenalty:
    """A score bias written here: -|i - j| / 4 for every head."""

    num_heads = 4

    def score_bias(self, query_length, key_length=None, *, offset=0, positions=None,
                   key_positions=None, dtype=torch.float32, device=None):  # fmt: skip
        key_length = offset + query_length if key_length is None else key_length
        q = torch.arange(offset, offset + query_length)[:, None]
        k = torch.arange(key_length)[None, :]
        bias = -(q - k).abs().to(torch.float64) / 4
        return bias.expand(self.num_heads, -1, -1).to(dtype)


def attention_with(module: MultiHeadAttention, x: torch.Tensor, rotate=None, bias=None):
    """The float64 attention of ``module``'s weights with a rotation and a bias given here."""
    B, T, C = x.shape
    nh, hs = module.num_heads, module.head_dim
    q, k, v = (x.double() @ module.qkv.weight.double().T).split(C, dim=2)
    q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k, v))
    if rotate is not None:
        q, k = rotate(q.detach().numpy(), k.detach().numpy())
        q, k = torch.from_numpy(q), torch.from_numpy(k)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hs)
    if bias is not None:
        scores = scores + bias
    if module.causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    return y @ module.out.weight.double().T


def test_xpos_plugs_in_and_decodes_one_token_at_a_time():
    from posenc.torch import XPosRotaryEmbedding

    torch.manual_seed(3)
    module = MultiHeadAttention(32, 4, position=XPosRotaryEmbedding(8, max_length=16)).eval()
    x = torch.randn(2, 10, 32)

    def xpos(q, k):  # the core's xPos, float64, fixed centre 0 as the module
        return posenc.apply_xpos(q, k, centre=0.0)

    assert_close(module(x).double(), attention_with(module, x, xpos), rtol=0, atol=2e-5)
    cache = KVCache()
    steps = [module(x[:, :6], cache=cache)]
    steps += [module(x[:, t : t + 1], cache=cache) for t in range(6, 10)]
    assert_close(torch.cat(steps, dim=1), module(x), rtol=0, atol=2e-6)


def test_axial_rope_plugs_in_with_coordinates_as_positions():
    from posenc.core.rope_nd import axial_rope_tables, grid_coordinates
    from posenc.torch import AxialRotaryEmbedding

    torch.manual_seed(4)
    axial = AxialRotaryEmbedding(8, n_axes=2)
    module = MultiHeadAttention(32, 4, position=axial, causal=False).eval()
    coords = grid_coordinates((3, 4)).reshape(12, 2)
    x = torch.randn(2, 12, 32)

    def rotate(q, k):
        cos, sin = axial_rope_tables(coords, 8, dtype="float64")
        return posenc.apply_rope(q, cos, sin), posenc.apply_rope(k, cos, sin)

    got = module(x, positions=torch.from_numpy(coords))
    assert_close(got.double(), attention_with(module, x, rotate), rtol=0, atol=2e-5)
    with pytest.raises(TypeError, match="AxialRotaryEmbedding rotates by coordinates"):
        module(x)


def test_schemes_written_elsewhere_plug_in_by_their_role():
    from posenc.torch.protocols import QueryKeyRotation, ScoreBias

    rotation, penalty = HalvedRotation(), DistancePenalty()
    assert isinstance(rotation, QueryKeyRotation)
    assert not isinstance(rotation, ScoreBias)
    assert isinstance(penalty, ScoreBias)
    torch.manual_seed(5)
    x = torch.randn(2, 9, 32)
    rotated = MultiHeadAttention(32, 4, position=rotation).eval()

    def halved(q, k):
        cos, sin = rotation.tables(np.arange(9))
        return posenc.apply_rope(q, cos, sin), posenc.apply_rope(k, cos, sin)

    assert_close(rotated(x).double(), attention_with(rotated, x, halved), rtol=0, atol=2e-5)
    biased = MultiHeadAttention(32, 4, position=penalty).eval()
    expected = attention_with(biased, x, bias=penalty.score_bias(9, dtype=torch.float64))
    assert_close(biased(x).double(), expected, rtol=0, atol=2e-5)
    cache = KVCache()  # the bias follows the cache's offset too
    steps = [biased(x[:, :5], cache=cache)] + [
        biased(x[:, t : t + 1], cache=cache) for t in range(5, 9)
    ]
    assert_close(torch.cat(steps, dim=1), biased(x), rtol=0, atol=2e-6)
    with pytest.raises(
        ValueError, match="the DistancePenalty has 4 heads, the attention num_heads=2"
    ):
        MultiHeadAttention(32, 2, position=penalty)


# ---------------------------------------------------------------------------------------
# The call's arguments: caches, positions, masks, offsets, meta tensors.

ALL_SCHEMES = ["nope", "rope", "xpos", "alibi", "t5", "kerple", "fire", "sandwich", "cope"]


def any_position(name: str, heads: int = 4, head_dim: int = 8):
    """A scheme of every kind, seeded, for ``heads`` heads of ``head_dim``."""
    from posenc.torch import (
        ContextualPositionEncoding,
        FIREBias,
        KERPLEBias,
        SandwichBias,
        XPosRotaryEmbedding,
    )

    torch.manual_seed(2)
    if name == "xpos":
        return XPosRotaryEmbedding(head_dim, max_length=64)
    if name == "kerple":
        return KERPLEBias(heads)
    if name == "fire":
        return FIREBias(heads)
    if name == "sandwich":
        return SandwichBias(heads, dim=head_dim)
    if name == "cope":
        cope = ContextualPositionEncoding(head_dim, max_positions=16)
        torch.nn.init.normal_(cope.pos_emb)  # non-zero vectors: a bias that matters
        return cope
    return make_position(name, heads, head_dim)


def attention(scheme: str, **kwargs) -> MultiHeadAttention:
    position = any_position(scheme)
    torch.manual_seed(0)
    return MultiHeadAttention(32, 4, position=position, **kwargs).eval()


LEFT_PADDED = torch.tensor([list(range(10)), [0, 0, 0, 0, 1, 2, 3, 4, 5, 6]])


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_decoding_with_positions_equals_the_full_call_with_them(scheme):
    module = attention(scheme)
    x = torch.randn(2, 10, 32)
    full = module(x, positions=LEFT_PADDED)
    cache = KVCache()
    steps = [module(x[:, :4], positions=LEFT_PADDED[:, :4], cache=cache)]
    steps += [module(x[:, t : t + 1], positions=LEFT_PADDED[:, t : t + 1], cache=cache)
              for t in range(4, 10)]  # fmt: skip
    assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=2e-6)
    assert torch.equal(cache.positions, LEFT_PADDED)
    # without positions, each row continues after its last one: the same answer
    cache = KVCache()
    steps = [module(x[:, :4], positions=LEFT_PADDED[:, :4], cache=cache)]
    steps += [module(x[:, t : t + 1], cache=cache) for t in range(4, 10)]
    assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=2e-6)
    assert torch.equal(cache.positions, LEFT_PADDED)


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_positions_after_a_cache_filled_without_them_are_the_keys_true_positions(scheme):
    # 4 tokens cached at 0..3, then two at positions 0 and 1 (not 4 and 5): a score bias
    # sees keys at 0, 1, 2, 3, 0, 1, as the full call given those positions does
    module = attention(scheme)
    x = torch.randn(1, 6, 32)
    positions = torch.tensor([0, 1, 2, 3, 0, 1])
    full = module(x, positions=positions)
    cache = KVCache()
    module(x[:, :4], cache=cache)
    late = module(x[:, 4:], positions=torch.tensor([0, 1]), cache=cache)
    assert_close(late, full[:, 4:], rtol=0, atol=2e-6)
    assert cache.positions.tolist() == [[0, 1, 2, 3, 0, 1]]
    if scheme not in ("nope", "cope"):  # schemes that read positions: not those of 4, 5
        assert not torch.allclose(late, module(x)[:, 4:], atol=1e-4)


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_an_offset_without_a_cache_places_the_queries_and_the_keys(scheme):
    # before, keys stayed at 0.. while the queries moved: the causal mask let every query
    # see the keys after it and ALiBi saw a distance of the offset
    module = attention(scheme)
    x = torch.randn(2, 7, 32)
    expected = module(x, positions=torch.arange(5, 12))
    assert_close(module(x, offset=5), expected, rtol=0, atol=2e-6)
    mask = torch.ones(7, 7, dtype=torch.bool)
    assert_close(module(x, offset=5, attn_mask=mask), expected, rtol=0, atol=2e-6)
    if scheme in ("nope", "rope", "alibi", "t5"):  # relative: a common shift changes nothing
        assert_close(module(x, offset=5), module(x), rtol=0, atol=2e-6)


def test_a_cache_refuses_another_batch_heads_head_dim_dtype_or_device():
    module = attention("alibi")
    cache = KVCache()
    module(torch.randn(1, 4, 32), cache=cache)
    keys = cache.keys
    with pytest.raises(
        ValueError, match=r"cache holds keys of batch 1, 4 heads.*x gives keys of batch 2"
    ):
        module(torch.randn(2, 1, 32), cache=cache)
    with pytest.raises(
        ValueError, match="cache holds keys of batch 1, 4 heads.*x gives keys of batch 1, 2 heads"
    ):
        MultiHeadAttention(32, 2)(torch.randn(1, 1, 32), cache=cache)
    with pytest.raises(ValueError, match="head_dim 8, .*x gives keys .*head_dim 4"):
        MultiHeadAttention(16, 4)(torch.randn(1, 1, 16), cache=cache)
    with pytest.raises(ValueError, match="torch.float32 on cpu but x gives keys .*torch.float64"):
        attention("alibi").double()(torch.randn(1, 1, 32, dtype=torch.float64), cache=cache)
    with pytest.raises(ValueError, match="on cpu but x gives keys .* on meta"):
        attention("alibi").to("meta")(torch.randn(1, 1, 32, device="meta"), cache=cache)
    assert cache.keys is keys  # refused calls leave it as it was
    assert cache.length == 4
    with pytest.raises(TypeError, match="cache must be a KVCache or None, got 'yes' \\(str\\)"):
        module(torch.randn(1, 1, 32), cache="yes")


def test_a_call_that_fails_leaves_the_cache_as_it_was():
    module = attention("rope")
    cache = KVCache()
    module(torch.randn(1, 3, 32), cache=cache)
    keys, values = cache.keys, cache.values
    with pytest.raises(ValueError, match="attn_mask"):  # checked after the keys were made
        module(torch.randn(1, 2, 32), cache=cache, attn_mask=torch.ones(2, 9, dtype=torch.bool))
    assert (cache.keys, cache.values, cache.positions) == (keys, values, None)


def test_kv_cache_update_checks_what_it_is_given():
    cache = KVCache()
    with pytest.raises(TypeError, match="keys as a tensor .*got 1 \\(int\\)"):
        cache.update(1, torch.zeros(1, 2, 3, 4))
    with pytest.raises(TypeError, match="values as a tensor"):
        cache.update(torch.zeros(1, 2, 3, 4), [0])
    with pytest.raises(
        ValueError, match=r"keys of shape \(batch, heads, seq, head_dim\), got \(2, 3, 4\)"
    ):
        cache.update(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="keys and values of one batch, heads, seq.*seq 3.*seq 2"):
        cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 2, 4))
    with pytest.raises(ValueError, match="float32 on cpu and values .*float64"):
        cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="positions must have shape .* seq=3"):
        cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), positions=torch.arange(2))
    assert cache.length == 0
    k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    assert cache.update(k, v) == (k, v)
    more = torch.randn(1, 2, 2, 4)
    keys, values = cache.update(more, -more, positions=torch.tensor([[9, 10]]))
    assert torch.equal(keys, torch.cat([k, more], dim=2))
    assert torch.equal(values, torch.cat([v, -more], dim=2))
    assert cache.positions.tolist() == [[0, 1, 2, 9, 10]]


def reference_with_mask(module, x, mask, bias=None):
    """SDPA called directly on the module's projections with ``mask`` (and ``bias``, and
    the causal mask as -inf) added to the scores."""
    B, T, C = x.shape
    nh, hs = module.num_heads, module.head_dim
    q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in module.qkv(x).split(C, dim=2))
    total = mask.to(q.dtype) + (0 if bias is None else bias)
    if module.causal:
        total = total + torch.full((T, T), float("-inf")).triu(1)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=total)
    return module.out(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_a_floating_mask_is_added_to_the_scores_as_sdpa_adds_it(causal, dtype):
    module = attention("alibi", causal=causal)
    x = torch.randn(2, 6, 32)
    mask = torch.randn(2, 1, 6, 6).to(dtype)
    mask[0, 0, :, 2] = float("-inf")  # a hidden key
    bias = module.position(6, 6, offset=0)
    expected = reference_with_mask(module, x, mask, bias)
    assert_close(module(x, attn_mask=mask), expected, rtol=0, atol=2e-6)
    plain = attention("nope", causal=False)
    assert torch.equal(
        plain(x, attn_mask=mask.float()), reference_with_mask(plain, x, mask.float())
    )


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_a_key_padding_mask_as_bool_or_as_minus_inf_gives_the_same_answer(scheme):
    module = attention(scheme)
    x = torch.randn(2, 5, 32)
    keep = torch.tensor([[True] * 5, [False, False, True, True, True]])[:, None, None, :]
    as_float = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    by_bool = module(x, attn_mask=keep)  # (B, 1, 1, S): broadcast over heads and queries
    assert_close(module(x, attn_mask=as_float), by_bool, rtol=0, atol=2e-6)
    # row 1 without its two padding tokens: the same answer for the others
    alone = module(x[1:, 2:], positions=torch.arange(2, 5))
    assert_close(by_bool[1:, 2:], alone, rtol=0, atol=2e-6)


@pytest.mark.parametrize(
    ("mask", "error", "match"),
    [
        (torch.ones(3, 3, dtype=torch.bool), ValueError, r"attn_mask must broadcast to \(batch, heads, seq, keys\) = \(2, 4, 5, 5\), got shape \(3, 3\)"),
        (torch.ones(1, 1, 1, 5, 5, dtype=torch.bool), ValueError, r"attn_mask must broadcast .*\(1, 1, 1, 5, 5\)"),
        (torch.ones(3, 4, 5, 5, dtype=torch.bool), ValueError, r"attn_mask must broadcast .*\(3, 4, 5, 5\)"),
        (torch.ones(5, 5, dtype=torch.int64), TypeError, r"attn_mask must be a boolean tensor .*int64; .*attn_mask.bool\(\)"),
        (torch.ones(5, 5, dtype=torch.complex64), TypeError, "attn_mask must be a boolean .*complex64"),
        (np.ones((5, 5), bool), TypeError, "attn_mask must be None or a boolean tensor .*ndarray"),
        (torch.ones(5, 5, dtype=torch.bool, device="meta"), ValueError, "attn_mask is on meta but x on cpu"),
        (torch.tensor([[0.0, float("nan"), 0, 0, 0]]), ValueError, "attn_mask must hold finite values or -inf .*NaN or \\+inf"),
        (torch.tensor([[0.0, float("inf"), 0, 0, 0]]), ValueError, "attn_mask must hold finite values or -inf"),
        (torch.tensor([[0.0, 1e300, 0, 0, 0]], dtype=torch.float64), ValueError, r"attn_mask must hold finite values or -inf \(a hidden key\) in torch.float32"),
    ],
)  # fmt: skip
def test_bad_masks_are_refused(mask, error, match):
    with pytest.raises(error, match=match):
        attention("t5")(torch.randn(2, 5, 32), attn_mask=mask)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"x": torch.ones(1, 4, 32, dtype=torch.int64)}, TypeError, "x must be a floating tensor, got dtype torch.int64"),
        ({"x": torch.ones(1, 4, 32, dtype=torch.float64)}, TypeError, r"x has dtype torch.float64 but the weights torch.float32; .*module.to\(torch.float64\)"),
        ({"x": torch.ones(1, 4, 32, device="meta")}, ValueError, "x is on meta but the weights on cpu"),
        ({"x": np.ones((1, 4, 32))}, TypeError, r"x must be a tensor of shape \(batch, seq, 32\), got a ndarray"),
        ({"x": torch.ones(4, 32)}, ValueError, r"x of shape \(batch, seq, 32\), got \(4, 32\)"),
        ({"offset": -1}, ValueError, "offset must be an int >= 0, got -1"),
        ({"offset": True}, TypeError, "offset must be an int >= 0, got True"),
        ({"offset": 2.0}, TypeError, "offset must be an int >= 0, got 2.0"),
        ({"offset": 2**60}, ValueError, "offset must lie within ±2\\*\\*53"),
        ({"offset": 2, "positions": torch.arange(4)}, ValueError, "give positions= or offset=, not both"),
        ({"offset": 2, "cache": KVCache()}, ValueError, "either offset= or cache=.*offset=2"),
        ({"positions": torch.zeros(4)}, TypeError, "positions must be an integer tensor, got dtype torch.float32"),
        ({"positions": torch.zeros(4, dtype=torch.bool)}, TypeError, "positions must be an integer tensor"),
        ({"positions": [0, 1, 2, 3]}, TypeError, "positions must be an integer tensor, got \\[0, 1, 2, 3\\]"),
        ({"positions": torch.arange(5)}, ValueError, r"positions must have shape \(seq,\) or \(batch, seq\) with seq=4 \(that of x\), got shape \(5,\)"),
        ({"positions": torch.zeros(1, 1, 4, dtype=torch.long)}, ValueError, "positions must have shape"),
        ({"positions": torch.zeros(3, 4, dtype=torch.long)}, ValueError, "positions has batch size 3 but x has 2"),
        ({"positions": torch.tensor([0, 1, -2, 3])}, ValueError, "positions must be >= 0, got -2"),
        ({"positions": torch.tensor([0, 1, 2**60, 3])}, ValueError, "positions must lie within ±2\\*\\*53"),
        ({"positions": torch.arange(4, device="meta")}, ValueError, "positions are on the meta device .* x on cpu"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("scheme", ["nope", "rope", "alibi", "cope"])
def test_bad_call_arguments_are_refused_by_name(scheme, kwargs, error, match):
    kwargs = {"x": torch.randn(2, 4, 32), **kwargs}
    with pytest.raises(error, match=match):
        attention(scheme)(kwargs.pop("x"), **kwargs)


def test_axial_coordinates_of_the_wrong_shape_are_refused_as_positions():
    from posenc.torch import AxialRotaryEmbedding

    module = MultiHeadAttention(32, 4, position=AxialRotaryEmbedding(8, n_axes=2))
    with pytest.raises(
        ValueError,
        match=r"positions must be coordinates of shape \(seq, n_axes\).*n_axes=2, got \(4, 3\)",
    ):
        module(torch.randn(1, 4, 32), positions=torch.zeros(4, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="positions has batch size 2 but x has 1"):
        module(torch.randn(1, 4, 32), positions=torch.zeros(2, 4, 2, dtype=torch.long))


def test_x_in_another_dtype_works_under_autocast():
    module = attention("alibi")
    x = torch.randn(1, 4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = module(x.bfloat16())
    assert low.dtype == torch.bfloat16
    assert_close(low.float(), module(x), rtol=0, atol=0.1)


def test_dropout_in_training_is_that_of_sdpa_and_off_in_eval():
    position = any_position("alibi")
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, position=position, dropout=0.5)
    x = torch.randn(2, 6, 32)
    B, T, C = x.shape
    q, k, v = (t.view(B, T, 4, 8).transpose(1, 2) for t in module.qkv(x).split(C, dim=2))
    bias = position(T, T, offset=0).masked_fill(
        torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")
    )
    torch.manual_seed(7)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.5)
    expected = module.out(y.transpose(1, 2).reshape(B, T, C))
    torch.manual_seed(7)
    assert_close(module.train()(x), expected, rtol=0, atol=1e-6)
    assert not torch.allclose(module.train()(x), module.eval()(x))
    assert torch.equal(module.eval()(x), module.eval()(x))


def test_meta_inputs_of_another_dtype_are_refused_by_name():
    # autocast has no "meta" device type: asking whether it is on raised PyTorch's
    # RuntimeError instead of the module's refusal of the dtype
    module = attention("alibi").to("meta")
    with pytest.raises(TypeError, match="x has dtype torch.float16 but the weights torch.float32"):
        module(torch.randn(2, 5, 32, device="meta", dtype=torch.float16))


@pytest.mark.parametrize("with_positions", [False, True])
@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_meta_inputs_give_meta_outputs_of_the_right_shape(scheme, with_positions):
    with torch.device("meta"):
        module = attention(scheme)
        x = torch.randn(2, 5, 32)
        positions = torch.arange(5).expand(2, 5) if with_positions else None
        mask = torch.zeros(2, 1, 5, 5)
    try:
        out = module(x, positions=positions, attn_mask=mask)
    except ValueError as error:  # or a clear refusal, naming the meta device
        assert "meta" in str(error)  # noqa: PT017
        return
    assert out.is_meta
    assert out.shape == (2, 5, 32)
    cache = KVCache()
    module(x, positions=positions, cache=cache)
    step = module(x[:, :1], cache=cache)
    assert step.is_meta
    assert step.shape == (2, 1, 32)
    assert cache.length == 6
    if with_positions:
        assert cache.positions.is_meta
        assert cache.positions.shape == (2, 6)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_positions_of_any_integer_dtype_equal_int64_ones(scheme, dtype):
    # uint8 key - query distances wrapped to 252 before: ALiBi lost its penalty
    module = attention(scheme)
    x = torch.randn(2, 5, 32)
    positions = torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])
    expected = module(x, positions=positions)
    assert_close(module(x, positions=positions.to(dtype)), expected, rtol=0, atol=0)
