"""RoPE core: scaling methods vs Hugging Face, rotation vs HF and Meta, exact tables, errors."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

from posenc.core.precision import round_to_format, turns_of
from posenc.core.rope import (
    ROPE_SCALINGS,
    apply_rope,
    rope_frequencies,
    rope_permutation,
    rope_scaling,
    rope_tables,
)

F32_EPS = 2.0**-24  # unit roundoff of float32


def _ladder_rtol(base: float) -> float:
    """Relative error bound of Hugging Face's float32 ``1 / base**(arange(0, d, 2) / d)``.

    The exponent ``2i/d`` (< 1) rounded to float32 is off by <= 2**-25 absolutely, which
    ``base**x`` turns into a relative error <= ln(base)·2**-25; ``pow``, the reciprocal
    and the scaling step round a few more times. (4 + ln base) units of 2**-24 covers it.
    """
    return (4 + math.log(base)) * F32_EPS


# ---------------------------------------------------------------------------------------
# Scaling methods vs Hugging Face ROPE_INIT_FUNCTIONS (transformers 5.x reads a config).


def _hf_config(head_dim, base, rope_parameters, *, max_position_embeddings=4096, partial=None):
    transformers = pytest.importorskip("transformers")
    parameters = dict(rope_parameters, rope_theta=base)
    if partial is not None:
        parameters["partial_rotary_factor"] = partial
    return transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=parameters,
    )


def _hf(rope_type, config, **kwargs):
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, attention = ROPE_INIT_FUNCTIONS[rope_type](config, **kwargs)
    assert inv_freq.dtype == torch.float32
    return inv_freq.double().numpy(), attention


@pytest.mark.parametrize(
    ("head_dim", "base", "partial"),
    [(64, 10000.0, None), (128, 500000.0, None), (80, 10000.0, None), (96, 1e6, None)],
)
def test_default_matches_hugging_face(head_dim, base, partial):
    pytest.importorskip("torch")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = _hf_config(head_dim, base, {"rope_type": "default"})
    expected, attention = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    ours, our_attention = rope_scaling("default", head_dim, base)
    assert_allclose(ours, expected.double().numpy(), rtol=_ladder_rtol(base), atol=0)
    assert our_attention == attention == 1.0


@pytest.mark.parametrize(
    ("head_dim", "base", "factor", "partial"),
    [(64, 10000.0, 2.0, None), (128, 10000.0, 4.0, 0.5), (96, 1e6, 8.0, None)],
)
def test_linear_matches_hugging_face(head_dim, base, factor, partial):
    config = _hf_config(head_dim, base, {"rope_type": "linear", "factor": factor}, partial=partial)
    expected, attention = _hf("linear", config)
    rotary_dim = int(head_dim * (partial or 1.0))
    ours, our_attention = rope_scaling(
        "linear", head_dim, base, rotary_dim=rotary_dim, factor=factor
    )
    assert ours.shape == expected.shape == (rotary_dim // 2,)
    assert_allclose(ours, expected, rtol=_ladder_rtol(base), atol=0)
    assert our_attention == attention == 1.0


@pytest.mark.parametrize(
    ("head_dim", "factor", "seq_len"),
    [
        (128, 2.0, None),  # construction: seq_len defaults to max_position_embeddings
        (128, 2.0, 1000),  # shorter than L0: unchanged
        (128, 2.0, 8192),
        (64, 4.0, 3 * 4096 + 17),
        (96, 1.0, 9000),  # factor 1 still grows the base past L0
    ],
)
def test_dynamic_ntk_matches_hugging_face_dynamic(head_dim, factor, seq_len):
    base = 10000.0
    config = _hf_config(head_dim, base, {"rope_type": "dynamic", "factor": factor})
    expected, attention = _hf("dynamic", config, seq_len=seq_len)
    ours, our_attention = rope_scaling(
        "dynamic_ntk",
        head_dim,
        base,
        factor=factor,
        original_max_position_embeddings=4096,
        seq_len=seq_len,
    )
    assert_allclose(ours, expected, rtol=_ladder_rtol(base), atol=0)
    assert our_attention == attention == 1.0


@pytest.mark.parametrize(("head_dim", "alpha"), [(64, 2.0), (128, 4.0), (96, 8.0)])
def test_static_ntk_closed_form_and_hugging_face(head_dim, alpha):
    base = 10000.0
    ours, attention = rope_scaling("ntk", head_dim, base, factor=alpha)
    # Closed form (bloc97): base' = base · alpha^(d/(d-2)).
    assert_array_equal(
        ours, rope_frequencies(head_dim, base * alpha ** (head_dim / (head_dim - 2)))
    )
    assert attention == 1.0
    assert ours[0] == 1.0
    assert ours[-1] == pytest.approx(rope_frequencies(head_dim, base)[-1] / alpha, rel=1e-14)
    # HF's dynamic base at L = 2·L0 with factor alpha-1 is base · ((alpha-1)·2 - (alpha-2))^e.
    config = _hf_config(head_dim, base, {"rope_type": "dynamic", "factor": alpha - 1})
    expected, _ = _hf("dynamic", config, seq_len=2 * 4096)
    assert_allclose(ours, expected, rtol=_ladder_rtol(base), atol=0)


YARN_CASES = [
    # (head_dim, base, partial, rope parameters)
    (128, 10000.0, None, {"factor": 4.0, "original_max_position_embeddings": 4096}),
    (128, 10000.0, None, {"factor": 4.0, "original_max_position_embeddings": 4096, "truncate": False}),
    (64, 150000.0, None, {"factor": 32.0, "original_max_position_embeddings": 4096, "truncate": False}),
    (128, 10000.0, None, {"factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0}),  # DeepSeek-V3
    (64, 10000.0, None, {"factor": 16.0, "original_max_position_embeddings": 2048, "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16, "beta_slow": 2}),
    (128, 1e6, None, {"factor": 4.0, "original_max_position_embeddings": 32768}),  # Qwen2.5
    (128, 10000.0, None, {"factor": 8.0, "original_max_position_embeddings": 4096, "attention_factor": 0.9}),
    (128, 10000.0, 0.5, {"factor": 2.0, "original_max_position_embeddings": 4096}),
    (64, 10000.0, None, {"factor": 1.0, "original_max_position_embeddings": 4096}),
    # L0/2π > base: the ramp's upper end passes d/2 - 1 and is clamped at d - 1 (HF quirk).
    (64, 10000.0, None, {"factor": 4.0, "original_max_position_embeddings": 131072}),
    (32, 500.0, None, {"factor": 2.0, "original_max_position_embeddings": 8192, "truncate": False}),
]  # fmt: skip


@pytest.mark.parametrize(("head_dim", "base", "partial", "params"), YARN_CASES)
def test_yarn_matches_hugging_face(head_dim, base, partial, params):
    factor = params["factor"]
    config = _hf_config(
        head_dim,
        base,
        {"rope_type": "yarn", **params},
        max_position_embeddings=int(params["original_max_position_embeddings"] * factor),
        partial=partial,
    )
    expected, attention = _hf("yarn", config)
    rotary_dim = int(head_dim * (partial or 1.0))
    ours, our_attention = rope_scaling("yarn", head_dim, base, rotary_dim=rotary_dim, **params)
    # HF blends θ(r/f + 1 - r) with a float32 ramp r; an error ε in r changes the result
    # by up to (f - 1)·ε relatively, so the ladder bound is multiplied by the factor.
    assert_allclose(ours, expected, rtol=_ladder_rtol(base) * factor, atol=0)
    assert our_attention == pytest.approx(attention, rel=1e-12)


def test_yarn_attention_factor_closed_forms():
    # 0.1 ln(s) + 1 by default; DeepSeek's ratio is 1 when mscale == mscale_all_dim.
    _, attention = rope_scaling("yarn", 64, factor=4.0, original_max_position_embeddings=4096)
    assert attention == 0.1 * math.log(4.0) + 1
    _, attention = rope_scaling(
        "yarn",
        64,
        factor=40.0,
        original_max_position_embeddings=4096,
        mscale=0.707,
        mscale_all_dim=0.707,
    )
    assert attention == 1.0
    _, attention = rope_scaling(
        "yarn", 64, factor=4.0, original_max_position_embeddings=4096, mscale=2.0
    )
    assert attention == 0.1 * math.log(4.0) + 1  # one of the pair alone is ignored


LLAMA3_CASES = [
    # Llama 3.1 (8B/70B/405B): head 128, base 500000, factor 8, L0 8192.
    (128, 500000.0, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # Llama 3.2 1B/3B: factor 32.
    (64, 500000.0, {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    (96, 10000.0, {"factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0, "original_max_position_embeddings": 2048}),
]  # fmt: skip


@pytest.mark.parametrize(("head_dim", "base", "params"), LLAMA3_CASES)
def test_llama3_matches_hugging_face(head_dim, base, params):
    config = _hf_config(
        head_dim, base, {"rope_type": "llama3", **params}, max_position_embeddings=131072
    )
    expected, attention = _hf("llama3", config)
    ours, our_attention = rope_scaling("llama3", head_dim, base, **params)
    # The smoothing blend (1-s)θ/f + sθ has the same (f - 1) amplification as YaRN's.
    assert_allclose(ours, expected, rtol=_ladder_rtol(base) * params["factor"], atol=0)
    assert our_attention == attention == 1.0


@pytest.mark.parametrize(("head_dim", "base", "params"), LLAMA3_CASES)
def test_llama3_keeps_high_and_divides_low_frequencies(head_dim, base, params):
    default = rope_frequencies(head_dim, base)
    ours, _ = rope_scaling("llama3", head_dim, base, **params)
    wavelength = 2 * math.pi / default
    original = params["original_max_position_embeddings"]
    high = wavelength < original / params["high_freq_factor"]
    low = wavelength > original / params["low_freq_factor"]
    assert high.any()
    assert low.any()
    assert_array_equal(ours[high], default[high])
    assert_array_equal(ours[low], default[low] / params["factor"])
    medium = ~high & ~low
    assert np.all(ours[medium] <= default[medium])
    assert np.all(ours[medium] >= default[medium] / params["factor"])


def _longrope_factors(count, seed):
    rng = np.random.default_rng(seed)
    return (1 + rng.random(count)).tolist(), (1 + 20 * rng.random(count)).tolist()


@pytest.mark.parametrize(
    ("seq_len", "factor", "attention_factor"),
    [
        (None, None, None),
        (4096, None, None),
        (4097, None, None),
        (131072, 32.0, None),
        (5000, None, 1.3),
    ],
)
def test_longrope_matches_hugging_face(seq_len, factor, attention_factor):
    head_dim, base, original, extended = 96, 10000.0, 4096, 131072  # Phi-3-mini-128k shape
    short, long = _longrope_factors(head_dim // 2, seed=seq_len or 0)
    params = {
        "short_factor": short,
        "long_factor": long,
        "original_max_position_embeddings": original,
    }
    if factor is not None:
        params["factor"] = factor
    if attention_factor is not None:
        params["attention_factor"] = attention_factor
    config = _hf_config(
        head_dim, base, {"rope_type": "longrope", **params}, max_position_embeddings=extended
    )
    expected, attention = _hf("longrope", config, seq_len=seq_len)
    ours, our_attention = rope_scaling(
        "longrope", head_dim, base, max_position_embeddings=extended, seq_len=seq_len, **params
    )
    assert_allclose(ours, expected, rtol=_ladder_rtol(base), atol=0)
    assert our_attention == pytest.approx(attention, rel=1e-12)
    divisors = np.array(long if seq_len is not None and seq_len > original else short)
    assert_array_equal(ours, rope_frequencies(head_dim, base) / divisors)


def test_linear_is_default_divided_by_factor_exactly():
    for head_dim, base, factor in [(64, 10000.0, 2.0), (128, 500000.0, 3.0), (6, 100.0, 7.5)]:
        ours, _ = rope_scaling("linear", head_dim, base, factor=factor)
        assert_array_equal(ours, rope_frequencies(head_dim, base) / factor)


def test_rope_frequencies_are_correctly_rounded():
    mpmath = pytest.importorskip("mpmath")
    for d, base in [(128, 500000.0), (96, 10000.0), (6, 1e6)]:
        ours = rope_frequencies(d, base)
        with mpmath.workdps(40):
            exact = [mpmath.mpf(base) ** (-mpmath.mpf(2 * i) / d) for i in range(d // 2)]
        assert ours.tolist() == [float(v) for v in exact]


@settings(max_examples=60, deadline=None)
@given(
    half=st.integers(2, 128),
    base=st.floats(100.0, 1e6),
    factor=st.floats(1.0, 100.0),
    original=st.integers(16, 100_000),
    betas=st.tuples(st.floats(0.5, 64.0), st.floats(0.5, 64.0)).map(sorted),
    truncate=st.booleans(),
)
def test_yarn_frequencies_lie_between_interpolated_and_original(
    half, base, factor, original, betas, truncate
):
    d = 2 * half
    default = rope_frequencies(d, base)
    ours, attention = rope_scaling(
        "yarn",
        d,
        base,
        factor=factor,
        original_max_position_embeddings=original,
        beta_slow=betas[0],
        beta_fast=betas[1],
        truncate=truncate,
    )
    assert np.all(ours <= default * (1 + 1e-15))
    assert np.all(ours >= default / factor * (1 - 1e-15))
    assert attention >= 1.0


# ---------------------------------------------------------------------------------------
# Rotation vs Hugging Face (half) and Meta's Llama (interleaved).


def test_apply_rope_half_matches_hugging_face_float64():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rng = np.random.default_rng(0)
    batch, heads, seq, head_dim = 2, 3, 17, 64
    q = rng.standard_normal((batch, heads, seq, head_dim))
    k = rng.standard_normal((batch, heads, seq, head_dim))
    inv_freq, attention = rope_scaling(
        "yarn", head_dim, factor=4.0, original_max_position_embeddings=8
    )
    cos, sin = rope_tables(seq, inv_freq, dtype="float64", scale=attention)  # (seq, d)
    cos_b = np.broadcast_to(cos, (batch, seq, head_dim))  # HF passes (batch, seq, d)
    sin_b = np.broadcast_to(sin, (batch, seq, head_dim))
    q_hf, k_hf = apply_rotary_pos_emb(
        torch.from_numpy(q), torch.from_numpy(k), torch.tensor(cos_b), torch.tensor(sin_b)
    )
    assert_allclose(apply_rope(q, cos, sin), q_hf.numpy(), rtol=0, atol=1e-12)
    assert_allclose(apply_rope(k, cos, sin), k_hf.numpy(), rtol=0, atol=1e-12)


def test_rope_tables_half_layout_matches_hugging_face_rotary_embedding():
    """HF's cos/sin are ours for HF's float32 inv_freq, up to its float32 angles."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = _hf_config(
        64,
        10000.0,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
        max_position_embeddings=4096,
    )
    module = LlamaRotaryEmbedding(config)
    positions = torch.arange(50)[None]
    cos_hf, sin_hf = module(torch.zeros(1, dtype=torch.float32), positions)
    inv_freq32 = module.inv_freq.numpy()  # float32, taken exactly
    cos, sin = rope_tables(50, inv_freq32, dtype="float64", scale=module.attention_scaling)
    # HF forms p·θ in float32 (error <= |p·θ|·2**-24) and rounds cos/sin, then the scaling.
    angle = np.arange(50)[:, None] * np.concatenate([inv_freq32, inv_freq32]).astype(np.float64)
    tolerance = 2 * (angle * F32_EPS + 2 * F32_EPS)
    assert np.all(np.abs(cos_hf[0].double().numpy() - cos) <= tolerance)
    assert np.all(np.abs(sin_hf[0].double().numpy() - sin) <= tolerance)


def _meta_precompute_freqs_cis(inv_freq, end):
    """Meta's Llama ``precompute_freqs_cis`` in float64, on given frequencies."""
    import torch

    freqs = torch.from_numpy(inv_freq)  # Meta: 1 / theta ** (arange(0, dim, 2) / dim)
    t = torch.arange(end, dtype=torch.float64)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex128, (end, dim // 2)


def _meta_apply_rotary_emb(xq, xk, freqs_cis):
    """Meta's Llama ``apply_rotary_emb`` (x: (bsz, seqlen, n_heads, head_dim)) in float64."""
    import torch

    xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2))
    ndim = xq_.ndim
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(xq_.shape)]
    freqs_cis = freqs_cis.view(*shape)  # reshape_for_broadcast
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out, xk_out


def test_apply_rope_interleaved_matches_meta_llama_float64():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    bsz, seq, heads, head_dim = 2, 23, 4, 32
    xq = rng.standard_normal((bsz, seq, heads, head_dim))
    xk = rng.standard_normal((bsz, seq, heads, head_dim))
    inv_freq, _ = rope_scaling(
        "llama3",
        head_dim,
        500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
    )
    q_ref, k_ref = _meta_apply_rotary_emb(
        torch.from_numpy(xq), torch.from_numpy(xk), _meta_precompute_freqs_cis(inv_freq, seq)
    )
    cos, sin = rope_tables(seq, inv_freq, dtype="float64", layout="interleaved")
    cos, sin = cos[:, None, :], sin[:, None, :]  # (seq, 1, d): x is (bsz, seq, heads, d)
    assert_allclose(apply_rope(xq, cos, sin, layout="interleaved"), q_ref.numpy(), atol=1e-12)
    assert_allclose(apply_rope(xk, cos, sin, layout="interleaved"), k_ref.numpy(), atol=1e-12)


def test_partial_rotary_passes_the_rest_through():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 5, 10))
    cos, sin = rope_tables(5, rope_frequencies(10, rotary_dim=4), dtype="float64")
    for layout in ("half", "interleaved"):
        out = apply_rope(x, cos, sin, layout=layout, rotary_dim=4)
        assert_array_equal(out[..., 4:], x[..., 4:])
        assert_array_equal(out[..., :4], apply_rope(x[..., :4], cos, sin, layout=layout))


def test_apply_rope_rounds_once_to_the_input_dtype():
    rng = np.random.default_rng(3)
    x64 = rng.standard_normal((7, 8))
    cos, sin = rope_tables(7, rope_frequencies(8), dtype="float64")
    exact = apply_rope(x64, cos, sin)
    x32 = x64.astype(np.float32)
    out = apply_rope(x32, cos, sin)
    assert out.dtype == np.float32
    assert_array_equal(out, apply_rope(x32.astype(np.float64), cos, sin).astype(np.float32))
    assert_allclose(out, exact, rtol=1e-6, atol=1e-6)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    xb = x64.astype(ml_dtypes.bfloat16)
    outb = apply_rope(xb, cos, sin)
    assert outb.dtype == xb.dtype
    reference = round_to_format(apply_rope(xb.astype(np.float64), cos, sin), "bfloat16")
    assert_array_equal(outb.astype(np.float32), reference)


# ---------------------------------------------------------------------------------------
# Properties.


@settings(max_examples=40, deadline=None)
@given(
    half=st.integers(1, 32),
    m=st.integers(0, 10_000),
    n=st.integers(0, 10_000),
    shift=st.integers(-5_000, 5_000),
    layout=st.sampled_from(["half", "interleaved"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_scores_depend_only_on_the_offset(half, m, n, shift, layout, seed):
    d = 2 * half
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal(d), rng.standard_normal(d)
    cos, sin = rope_tables(
        np.array([m, n, m + shift, n + shift]), rope_frequencies(d), dtype="float64", layout=layout
    )
    rotated = [
        apply_rope(v[None], cos[i : i + 1], sin[i : i + 1], layout=layout)[0]
        for i, v in enumerate([q, k, q, k])
    ]
    score, shifted = rotated[0] @ rotated[1], rotated[2] @ rotated[3]
    assert shifted == pytest.approx(score, rel=1e-12, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    half=st.integers(1, 64),
    seq=st.integers(1, 20),
    start=st.integers(0, 2**40),
    layout=st.sampled_from(["half", "interleaved"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_rotation_preserves_norms(half, seq, start, layout, seed):
    d = 2 * half
    x = np.random.default_rng(seed).standard_normal((2, seq, d))
    cos, sin = rope_tables(
        np.arange(start, start + seq), rope_frequencies(d), dtype="float64", layout=layout
    )
    out = apply_rope(x, cos, sin, layout=layout)
    assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-14)
    # Each pair keeps its own norm.
    if layout == "half":
        pairs_in = x[..., :half] ** 2 + x[..., half:] ** 2
        pairs_out = out[..., :half] ** 2 + out[..., half:] ** 2
    else:
        pairs_in = x[..., 0::2] ** 2 + x[..., 1::2] ** 2
        pairs_out = out[..., 0::2] ** 2 + out[..., 1::2] ** 2
    assert_allclose(pairs_out, pairs_in, rtol=1e-13, atol=1e-300)


@settings(max_examples=40, deadline=None)
@given(
    half=st.integers(1, 32),
    extra=st.integers(0, 5),
    seq=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
)
def test_layouts_are_related_by_rope_permutation(half, extra, seq, seed):
    r = 2 * half
    head_dim = r + extra
    x = np.random.default_rng(seed).standard_normal((3, seq, head_dim))
    inv_freq = rope_frequencies(head_dim, rotary_dim=r)
    to_half = rope_permutation(head_dim, "interleaved", "half", rotary_dim=r)
    to_interleaved = rope_permutation(head_dim, "half", "interleaved", rotary_dim=r)
    assert_array_equal(to_half[to_interleaved], np.arange(head_dim))
    cos_h, sin_h = rope_tables(seq, inv_freq, dtype="float64", layout="half")
    cos_i, sin_i = rope_tables(seq, inv_freq, dtype="float64", layout="interleaved")
    # Tables follow the same permutation.
    assert_array_equal(cos_i[:, to_half[:r]], cos_h)
    # x in interleaved layout, rotated, then permuted == permuted, then rotated in half.
    assert_array_equal(
        apply_rope(x[..., to_half], cos_h, sin_h, layout="half"),
        apply_rope(x, cos_i, sin_i, layout="interleaved")[..., to_half],
    )
    assert_array_equal(
        apply_rope(x[..., to_interleaved], cos_i, sin_i, layout="interleaved"),
        apply_rope(x, cos_h, sin_h, layout="half")[..., to_interleaved],
    )


def test_permutation_is_hugging_face_llama_conversion_permute():
    # HF's convert_llama_weights_to_hf: w.view(n_heads, dim // n_heads // 2, 2, dim)
    # .transpose(1, 2): per head, row (i, j) of a (d/2, 2) grid moves to (j, i).
    for head_dim in (2, 8, 128):
        rows = np.arange(head_dim).reshape(head_dim // 2, 2).T.reshape(-1)
        assert_array_equal(rope_permutation(head_dim, "interleaved", "half"), rows)


# ---------------------------------------------------------------------------------------
# Exactness of the tables.


def _exact_cos_sin(positions, inv_freq, scale=1.0, digits=40):
    """cos/sin of position × inv_freq (each float taken as exact) with mpmath, as float64."""
    mpmath = pytest.importorskip("mpmath")
    scale = mpmath.mpf(scale)
    with mpmath.workdps(digits):
        cos, sin = [], []
        for p in positions:
            angles = [mpmath.mpf(float(p)) * mpmath.mpf(float(w)) for w in inv_freq]
            cos.append([float(scale * mpmath.cos(a)) for a in angles])
            sin.append([float(scale * mpmath.sin(a)) for a in angles])
    return np.array(cos), np.array(sin)


def _check_float32(table, exact):
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    error = np.abs(table.astype(np.float64) - exact)
    assert np.all(error <= 0.5 * ulp + 1e-15), (error / ulp).max()


FREQUENCY_SETS = {
    "default-500000": rope_frequencies(128, 500000.0),
    "yarn": rope_scaling(
        "yarn", 64, 10000.0, factor=32.0, original_max_position_embeddings=4096, truncate=False
    )[0],
    "float32-inv-freq": rope_frequencies(64, 10000.0).astype(np.float32),
}


@pytest.mark.parametrize("name", list(FREQUENCY_SETS))
def test_tables_within_half_ulp_of_exact_up_to_2_20(name):
    inv_freq = FREQUENCY_SETS[name]
    m = inv_freq.size
    sample = [0, 1, 2, 3, 100, 4095, 2**16 + 1, 999_999, 2**20 - 1, 2**20]
    exact_cos, exact_sin = _exact_cos_sin(sample, inv_freq)
    # Array path (per-element reduction), shuffled positions.
    cos, sin = rope_tables(np.array(sample[::-1]), inv_freq)
    assert cos.dtype == np.float32
    assert cos.shape == (len(sample), 2 * m)
    _check_float32(cos[::-1, :m], exact_cos)
    _check_float32(sin[::-1, :m], exact_sin)
    assert_array_equal(cos[:, :m], cos[:, m:])  # "half": both halves
    # Range path (coarse × fine phasors) at the far end: 2**20 - 40 .. 2**20.
    cos, sin = rope_tables(np.arange(2**20 - 40, 2**20 + 1), inv_freq, layout="interleaved")
    _check_float32(cos[-2:, 0::2], exact_cos[-2:])
    _check_float32(sin[-2:, 1::2], exact_sin[-2:])
    # Range path from 0 (an int length).
    cos, sin = rope_tables(4096, inv_freq)
    _check_float32(cos[[0, 1, 2, 3, 100, 4095], :m], exact_cos[:6])
    _check_float32(sin[[0, 1, 2, 3, 100, 4095], m:], exact_sin[:6])


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_low_precision_tables_are_the_rounded_exact_values(fmt):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    inv_freq = FREQUENCY_SETS["yarn"]
    m = inv_freq.size
    sample = [0, 5, 777, 2**16 + 1, 2**20]
    exact_cos, exact_sin = _exact_cos_sin(sample, inv_freq)
    expected_dtype = ml_dtypes.bfloat16 if fmt == "bfloat16" else np.float16
    array_path = rope_tables(np.array(sample), inv_freq, dtype=fmt)
    # The range path starting at each sample position (first row of p .. p+2).
    ranges = [rope_tables(np.arange(p, p + 3), inv_freq, dtype=fmt) for p in sample]
    range_path = tuple(np.stack([r[i][0] for r in ranges]) for i in (0, 1))
    for cos, sin in (array_path, range_path):
        assert cos.dtype == expected_dtype
        assert_array_equal(cos[:, :m].astype(np.float64), round_to_format(exact_cos, fmt))
        assert_array_equal(sin[:, m:].astype(np.float64), round_to_format(exact_sin, fmt))


def test_scaled_tables_are_rounded_once():
    inv_freq, attention = rope_scaling(
        "yarn", 64, factor=40.0, original_max_position_embeddings=4096
    )
    sample = [3, 1234, 2**20]
    exact_cos, exact_sin = _exact_cos_sin(sample, inv_freq, scale=attention)
    cos, sin = rope_tables(np.array(sample), inv_freq, scale=attention, layout="interleaved")
    _check_float32(cos[:, 0::2], exact_cos)
    _check_float32(sin[:, 0::2], exact_sin)


def test_range_and_array_paths_agree():
    inv_freq = rope_frequencies(64, 10000.0)
    positions = np.arange(-300, 5000)
    fast = rope_tables(positions, inv_freq, dtype="float64")
    shuffled = np.random.default_rng(4).permutation(positions.size)
    slow = rope_tables(positions[shuffled].astype(np.float64), inv_freq, dtype="float64")
    for a, b in zip(fast, slow, strict=True):
        assert_allclose(a[shuffled], b, rtol=0, atol=3e-15)
    # Fractional positions and N-D shapes.
    grid = np.array([[0.5, 1.25], [1e6 + 0.5, -3.0]])
    cos, sin = rope_tables(grid, inv_freq, dtype="float64")
    assert cos.shape == sin.shape == (2, 2, 64)
    assert_allclose(cos[1, 0, :32], np.cos((1e6 + 0.5) * inv_freq), atol=1e-9)


def test_range_path_chunks_join_exactly():
    # 512 frequencies: the range path works in chunks of 512 rows, each anchored exactly.
    inv_freq = rope_frequencies(1024, 10000.0)
    start = 2**20 - 700
    fast = rope_tables(np.arange(start, start + 1500), inv_freq, dtype="float64")
    rows = np.array([0, 511, 512, 513, 1023, 1024, 1499])
    slow = rope_tables(start + rows, inv_freq, dtype="float64")  # not consecutive: array path
    for a, b in zip(fast, slow, strict=True):
        assert_allclose(a[rows], b, rtol=0, atol=3e-15)


def test_yarn_ramp_upper_end_is_clamped_at_d_minus_1():
    # Hugging Face clamps at d - 1, not d/2 - 1: with L0/2π > base no pair is fully
    # interpolated, the last one is (d/2 - 1 - low) / (high - low) of the way there.
    d, base, original, factor = 16, 100.0, 4096, 4.0
    ours, _ = rope_scaling(
        "yarn", d, base, factor=factor, original_max_position_embeddings=original
    )
    high = min(math.ceil(d * math.log(original / (2 * math.pi)) / (2 * math.log(base))), d - 1)
    low = max(math.floor(d * math.log(original / (32 * 2 * math.pi)) / (2 * math.log(base))), 0)
    assert high > d // 2 - 1
    ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
    default = rope_frequencies(d, base)
    assert_allclose(ours, default * (ramp / factor + 1 - ramp), rtol=1e-15)
    assert ours[-1] > default[-1] / factor


def test_turns_of_is_a_double_double():
    mpmath = pytest.importorskip("mpmath")
    omega = np.array(
        [
            1.0,
            0.1,
            1e-9,
            3.0e5,
            rope_scaling("yarn", 8, factor=3.0, original_max_position_embeddings=64)[0][1],
        ]
    )
    hi, lo = turns_of(omega)
    with mpmath.workdps(50):
        for w, h, low in zip(omega, hi, lo, strict=True):
            exact = mpmath.mpf(float(w)) / (2 * mpmath.pi)
            assert (
                abs(mpmath.mpf(h) + mpmath.mpf(low) - exact) <= abs(exact) * mpmath.mpf(2) ** -104
            )
            assert h == float(exact)


# ---------------------------------------------------------------------------------------
# Bad input.

X = np.zeros((4, 8))
COS, SIN = rope_tables(4, rope_frequencies(8), dtype="float64")


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: rope_frequencies(7), ValueError, "even int >= 2"),
        (lambda: rope_frequencies(8, rotary_dim=10), ValueError, "at most head_dim=8"),
        (lambda: rope_frequencies(8, rotary_dim=3), ValueError, "rotary_dim, got 3"),
        (lambda: rope_frequencies(8.0), TypeError, "head_dim must be an int"),
        (lambda: rope_frequencies(8, 1.0), ValueError, "base must not be 1"),
        (lambda: rope_frequencies(8, -5.0), ValueError, "base must be a finite real number > 0"),
        (lambda: rope_scaling("dynamic", 8, factor=2.0), ValueError, "'dynamic' is called 'dynamic_ntk' here.*valid: \\['default'"),
        (lambda: rope_scaling("nope", 8), ValueError, "unknown RoPE scaling 'nope'; valid: \\['default', 'linear', 'ntk', 'dynamic_ntk', 'yarn', 'llama3', 'longrope', 'proportional'\\]"),
        (lambda: rope_scaling(3, 8), TypeError, "name must be one of"),
        (lambda: rope_scaling("linear", 8), TypeError, "missing \\['factor'\\]"),
        (lambda: rope_scaling("linear", 8, factor=2.0, beta=1), TypeError, "unknown \\['beta'\\].*takes \\['factor'\\]"),
        (lambda: rope_scaling("linear", 8, factor=0.5), ValueError, "factor must be a finite real number >= 1"),
        (lambda: rope_scaling("linear", 8, factor="2"), TypeError, "factor must be a finite real number"),
        (lambda: rope_scaling("ntk", 2, factor=2.0), ValueError, "needs a rotary width d > 2"),
        (lambda: rope_scaling("dynamic_ntk", 8, factor=2.0, original_max_position_embeddings=0), ValueError, "original_max_position_embeddings must be an int >= 1"),
        (lambda: rope_scaling("yarn", 8, factor=2.0, original_max_position_embeddings=64, beta_fast=1, beta_slow=32), ValueError, "beta_fast .* must be >= beta_slow"),
        (lambda: rope_scaling("yarn", 8, factor=2.0, original_max_position_embeddings=64, truncate="yes"), TypeError, "truncate must be a bool"),
        (lambda: rope_scaling("llama3", 8, factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0, original_max_position_embeddings=64), ValueError, "high_freq_factor must be greater than low_freq_factor"),
        (lambda: rope_scaling("longrope", 8, short_factor=[1.0] * 3, long_factor=[1.0] * 4, original_max_position_embeddings=64, factor=2.0), ValueError, "short_factor must hold one divisor per frequency, rotary_dim // 2 = 4"),
        (lambda: rope_scaling("longrope", 8, short_factor=[1.0] * 4, long_factor=[1.0, 2.0, 0.0, 1.0], original_max_position_embeddings=64, factor=2.0), ValueError, "long_factor must be finite and > 0"),
        (lambda: rope_scaling("longrope", 8, short_factor=[1.0] * 4, long_factor=[1.0] * 4, original_max_position_embeddings=64), TypeError, "longrope needs factor="),
        (lambda: rope_tables(4, [[1.0, 0.1]]), ValueError, "inv_freq must be a non-empty 1-D array"),
        (lambda: rope_tables(4, ["a"]), TypeError, "inv_freq must hold real numbers"),
        (lambda: rope_tables(4, [np.inf]), ValueError, "inv_freq must be finite"),
        (lambda: rope_tables(4, [1.0], layout="split"), ValueError, "layout must be one of \\['half', 'interleaved'\\]"),
        (lambda: rope_tables(4, [1.0], dtype="int8"), TypeError, "dtype must be one of"),
        (lambda: rope_tables(4.0, [1.0]), TypeError, "positions must be an int length"),
        (lambda: rope_tables([np.nan], [1.0]), ValueError, "positions must be finite"),
        (lambda: rope_tables(2**40, [1.0] * 64), ValueError, "more than max_bytes"),
        (lambda: apply_rope(X, COS[:, :6], SIN), ValueError, "cos and sin must have the same shape"),
        (lambda: apply_rope(X, COS[:3], SIN[:3]), ValueError, "do not broadcast to x\\[..., :8\\] of shape \\(4, 8\\)"),
        (lambda: apply_rope(X[:, :6], COS, SIN), ValueError, "rotary width 8 exceeds x's feature axis 6"),
        (lambda: apply_rope(X, COS[:, :5], SIN[:, :5]), ValueError, "even int >= 2, got 5"),
        (lambda: apply_rope(X, COS, SIN, rotary_dim=4), ValueError, "rotary_dim=4 does not match the tables' last axis 8"),
        (lambda: apply_rope(X.astype(np.int32), COS, SIN), TypeError, "x must be a floating array"),
        (lambda: apply_rope(X, COS.astype(complex), SIN), TypeError, "cos must be a floating array"),
        (lambda: apply_rope(X, COS[None, None], SIN[None, None]), ValueError, "do not broadcast"),
        (lambda: apply_rope(X, COS, SIN, layout="neox"), ValueError, "layout must be one of"),
        (lambda: rope_permutation(8, "half", "split"), ValueError, "target must be one of \\['half', 'interleaved'\\]"),
        (lambda: rope_permutation(7, "half", "interleaved"), ValueError, "even int >= 2"),
    ],
)  # fmt: skip
def test_bad_input_raises_a_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_registry_functions_share_one_signature():
    for name, function in ROPE_SCALINGS.items():
        parameters = list(inspect.signature(function).parameters.values())
        assert [p.name for p in parameters[:3]] == ["head_dim", "base", "rotary_dim"], name
        assert parameters[1].default == 10000.0
        assert parameters[2].kind is inspect.Parameter.KEYWORD_ONLY
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[2:]), name
        inv_freq, attention = rope_scaling(
            name,
            16,
            rotary_dim=8,
            **{
                "default": {},
                "linear": {"factor": 2.0},
                "ntk": {"factor": 2.0},
                "dynamic_ntk": {"factor": 2.0, "original_max_position_embeddings": 64},
                "yarn": {"factor": 2.0, "original_max_position_embeddings": 64},
                "llama3": {
                    "factor": 2.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                "longrope": {
                    "short_factor": [1.0] * 4,
                    "long_factor": [2.0] * 4,
                    "original_max_position_embeddings": 64,
                    "factor": 2.0,
                },
                "proportional": {"partial_rotary_factor": 0.5},
            }[name],
        )
        assert inv_freq.dtype == np.float64, name
        assert inv_freq.shape == (4,), name
        assert isinstance(attention, float), name


@pytest.mark.parametrize(
    ("config", "seq_len", "message"),
    [
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
          "beta_fast": 1e308}, None, r"cannot be computed \(math domain error\); check its parameters"),
        ({"rope_type": "dynamic", "factor": 1e300, "original_max_position_embeddings": 4096},
         10**6, r"cannot be computed \(.*out of range.*\); check its parameters"),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
          "mscale": -10.0, "mscale_all_dim": 1.0}, None,
         r"mscale must be a finite real number > -7\.21348 at factor=4 .* got -10\.0"),
    ],
)  # fmt: skip
def test_parameters_far_outside_their_range_give_a_value_error(config, seq_len, message):
    from posenc.core.rope import as_rope_scaling

    def compute():  # a spec refuses what it can at construction, the rest when computed
        spec, _ = as_rope_scaling(config)
        return spec.frequencies(64, 10000.0, seq_len=seq_len)

    with pytest.raises(ValueError, match=message):
        compute()
