"""xPos and axial / multimodal RoPE: references (torchscale, rope-vit, Hugging Face
Qwen2-VL), closed forms and invariances."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

from posenc.core.rope import apply_rope, rope_frequencies, rope_permutation, rope_tables
from posenc.core.rope_nd import (
    apply_xpos,
    axial_rope_tables,
    grid_coordinates,
    xpos_centre,
    xpos_scales,
)

RNG = np.random.default_rng(1234)


# ---------------------------------------------------------------------------------------
# xPos: reference = microsoft/torchscale torchscale/component/xpos_relative_position.py
# (XPOS.forward, fixed_pos_embedding, rotate_every_two, duplicate_interleave), transcribed
# here in torch float64; used as in torchscale's multihead_attention.py:
# k = xpos(k, offset=0, downscale=True); q = xpos(q, offset=src_len - 1 or 0, downscale=False).


def _torchscale_xpos(torch, x, offset: int, downscale: bool, scale_base: float = 512):
    f64 = torch.float64
    length, dim = x.shape[1], x.shape[2]  # x: (batch·heads, length, head_dim)
    zeta = (torch.arange(0, dim, 2, dtype=f64) + 0.4 * dim) / (1.4 * dim)
    min_pos = -(length + offset) // 2
    max_pos = length + offset + min_pos
    scale = zeta ** (torch.arange(min_pos, max_pos, 1, dtype=f64) / scale_base)[:, None]
    half = scale.shape[1]  # fixed_pos_embedding(scale): seq_len = length + offset, dim = d/2
    inv_freq = 1.0 / (10000 ** (torch.arange(0, half, dtype=f64) / half))
    angles = torch.einsum("i,j->ij", torch.arange(0, scale.shape[0], dtype=f64), inv_freq)
    sin, cos = torch.sin(angles), torch.cos(angles)
    if scale.shape[0] > length:
        scale, sin, cos = scale[-length:], sin[-length:], cos[-length:]
    if downscale:
        scale = 1 / scale
    sin = torch.repeat_interleave(sin * scale, 2, dim=-1)  # duplicate_interleave
    cos = torch.repeat_interleave(cos * scale, 2, dim=-1)
    rotated = torch.stack((-x[:, :, 1::2], x[:, :, ::2]), dim=-1).flatten(-2)
    return x * cos + rotated * sin


@pytest.mark.parametrize(
    ("lq", "lk", "d"),
    [(7, 7, 8), (8, 8, 16), (1, 7, 8), (1, 8, 8), (3, 11, 32), (300, 300, 64), (1, 1001, 64)],
)
def test_apply_xpos_matches_torchscale(lq, lk, d):
    torch = pytest.importorskip("torch")
    q = RNG.standard_normal((2, lq, d))
    k = RNG.standard_normal((2, lk, d))
    qx, kx = apply_xpos(q, k)  # defaults: queries are the last lq tokens, torchscale centre
    ref_q = _torchscale_xpos(torch, torch.from_numpy(q), offset=lk - lq, downscale=False)
    ref_k = _torchscale_xpos(torch, torch.from_numpy(k), offset=0, downscale=True)
    assert_allclose(qx, ref_q.numpy(), rtol=1e-12, atol=1e-12)
    assert_allclose(kx, ref_k.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("length", "offset"), [(5, 0), (6, 0), (1, 9), (4, 3), (2, 100)])
def test_xpos_scales_match_torchscale_scale(length, offset):
    torch = pytest.importorskip("torch")
    d = 16
    positions = np.arange(offset, offset + length)
    centre = xpos_centre(offset + length, "torchscale")
    ours = xpos_scales(positions, d, centre=centre, dtype="float64")
    zeta = (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)
    min_pos = -(length + offset) // 2
    power = torch.arange(min_pos, length + offset + min_pos, dtype=torch.float64) / 512
    ref = torch.repeat_interleave(zeta ** power[:, None], 2, dim=-1)[-length:]
    assert_allclose(ours, ref.numpy(), rtol=1e-14)
    keys = xpos_scales(positions, d, centre=centre, role="key", dtype="float64")
    assert_allclose(keys, 1 / ref.numpy(), rtol=1e-14)


def test_xpos_centre_conventions():
    # torchscale: min_pos = -(length + offset) // 2 -> centre ceil(T/2); lucidrains: T // 2.
    for total in range(1, 12):
        assert xpos_centre(total, "torchscale") == -(-total // 2) == -(-(total) // 2)
        assert xpos_centre(total, "lucidrains") == total // 2
    assert xpos_centre([3, 9], "torchscale") == 5.0


def test_xpos_scales_correctly_rounded():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 200
    positions = np.array([-50000, -5000, -513, -1, 0, 1, 7, 511, 4096, 30000])
    d, gamma, base = 64, 0.4, 512
    s64 = xpos_scales(positions, d, dtype="float64", layout="half")
    s32 = xpos_scales(positions[1:-1], d, dtype="float32", layout="half")
    for r, p in enumerate(positions):
        for i in range(d // 2):
            g = mpmath.mpf(gamma)  # the float64 0.4, exactly
            exact = ((2 * i + g * d) / ((1 + g) * d)) ** (mpmath.mpf(int(p)) / base)
            assert abs(s64[r, i] - float(exact)) <= 2 * np.spacing(float(exact))
    # float32 is the float64 value rounded once (differs from exact only on near-ties)
    assert_array_equal(s32, s64[1:-1].astype(np.float32))
    assert_array_equal(s32[:, : d // 2], s32[:, d // 2 :])


def _pair_scores(qr: np.ndarray, kr: np.ndarray) -> np.ndarray:
    """Per-pair scores (interleaved pairs): (Lq, Lk, d/2)."""
    prod = qr[:, None, :] * kr[None, :, :]
    return prod[..., 0::2] + prod[..., 1::2]


def test_xpos_score_closed_form():
    # q'_n·k'_m = Σ_i ζ_i^((n-m)/B) × (RoPE score of pair i), whatever the centre.
    d, length, gamma, base = 16, 40, 0.4, 512.0
    q = RNG.standard_normal((length, d))
    k = RNG.standard_normal((length, d))
    cos, sin = rope_tables(length, rope_frequencies(d), dtype="float64", layout="interleaved")
    pair = _pair_scores(
        apply_rope(q, cos, sin, layout="interleaved"), apply_rope(k, cos, sin, layout="interleaved")
    )
    n = np.arange(length)
    zeta = (np.arange(0, d, 2) / d + gamma) / (1 + gamma)
    decay = zeta ** ((n[:, None, None] - n[None, :, None]) / base)
    expected = (pair * decay).sum(-1)
    for centre in (0.0, "torchscale", "lucidrains", 17.5):
        qx, kx = apply_xpos(q, k, centre=centre)
        assert_allclose(qx @ kx.T, expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    shift=st.floats(-1e4, 1e4, allow_nan=False),
    layout=st.sampled_from(["half", "interleaved"]),
    centre=st.sampled_from([0.0, "torchscale", "lucidrains"]),
)
def test_xpos_translation_invariance(shift, layout, centre):
    d, length = 8, 12
    rng = np.random.default_rng(7)
    q = rng.standard_normal((length, d))
    k = rng.standard_normal((length, d))
    p = np.arange(length, dtype=np.float64)
    qx, kx = apply_xpos(q, k, q_positions=p, k_positions=p, layout=layout, centre=centre)
    qs, ks = apply_xpos(
        q, k, q_positions=p + shift, k_positions=p + shift, layout=layout, centre=centre
    )
    assert_allclose(qs @ ks.T, qx @ kx.T, rtol=1e-9, atol=1e-9)


def test_xpos_scores_toeplitz_and_decay():
    d, length = 32, 64
    x = RNG.standard_normal(d)
    q = np.tile(x, (length, 1))  # the same vector at every position: q = k
    qx, kx = apply_xpos(q, q)
    scores = qx @ kx.T
    for delta in range(-length + 1, length):  # depends only on n - m
        diag = np.diagonal(scores, offset=-delta)
        assert_allclose(diag, diag[0], rtol=1e-12, atol=1e-12)
    # |score(Δ)| <= Σ_i |x_i|² ζ_i^(Δ/B), a bound that decreases with Δ >= 0
    zeta = (np.arange(0, d, 2) / d + 0.4) / 1.4
    norms = x[0::2] ** 2 + x[1::2] ** 2
    deltas = np.arange(length)
    bound = (norms * zeta ** (deltas[:, None] / 512)).sum(-1)
    causal = np.array([scores[delta, 0] for delta in deltas])
    assert np.all(np.abs(causal) <= bound + 1e-12)
    assert np.all(np.diff(bound) < 0)
    # without rotation (all frequencies 0) the score itself is that bound: strictly decaying
    qx, kx = apply_xpos(q, q, inv_freq=np.zeros(d // 2))
    causal = (qx @ kx.T)[deltas, 0]
    assert_allclose(causal, bound, rtol=1e-12)
    assert np.all(np.diff(causal) < 0)


def test_xpos_layouts_are_a_permutation():
    d = 12
    q = RNG.standard_normal((2, 5, d))
    k = RNG.standard_normal((2, 5, d))
    perm = rope_permutation(d, "interleaved", "half")
    qi, ki = apply_xpos(q, k, layout="interleaved")
    qh, kh = apply_xpos(q[..., perm], k[..., perm], layout="half")
    assert_allclose(qh, qi[..., perm], rtol=1e-15, atol=1e-15)
    assert_allclose(kh, ki[..., perm], rtol=1e-15, atol=1e-15)
    si = xpos_scales(7, d, layout="interleaved")
    assert_array_equal(xpos_scales(7, d, layout="half"), si[..., perm])


def test_apply_xpos_dtype_and_explicit_positions():
    q = RNG.standard_normal((3, 4, 8)).astype(np.float32)
    qx, kx = apply_xpos(q, q)
    assert qx.dtype == np.float32
    assert kx.shape == q.shape
    p = np.arange(4)
    q2, k2 = apply_xpos(q, q, q_positions=p, k_positions=p)
    assert_array_equal(q2, qx)
    assert_array_equal(k2, kx)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: xpos_scales(4, 7), ValueError, "even"),
        (lambda: xpos_scales(4, 8, gamma=0.0), ValueError, "gamma"),
        (lambda: xpos_scales(4, 8, scale_base=-1), ValueError, "scale_base"),
        (lambda: xpos_scales(4, 8, role="value"), ValueError, "role"),
        (lambda: xpos_scales(4, 8, layout="split"), ValueError, "layout"),
        (lambda: xpos_scales([np.nan], 8), ValueError, "finite"),
        (lambda: xpos_centre(4, "middle"), ValueError, "convention"),
        (lambda: xpos_scales([-50000], 8), ValueError, "overflow float32"),
        (lambda: xpos_scales([-400000], 8, dtype="float64"), ValueError, "overflow float64"),
        (lambda: xpos_centre([], "torchscale"), ValueError, "empty"),
        (lambda: apply_xpos(np.ones((2, 8)), np.ones((2, 6))), ValueError, "head_dim"),
        (lambda: apply_xpos(np.ones((3, 8)), np.ones((2, 8))), ValueError, "q_positions"),
        (lambda: apply_xpos(np.ones(8), np.ones(8)), ValueError, "seq"),
        (lambda: apply_xpos(np.ones((2, 8)), np.ones((2, 8)), centre="mid"), ValueError, "centre"),
        (
            lambda: apply_xpos(np.ones((2, 8)), np.ones((2, 8)), inv_freq=[1.0]),
            ValueError,
            "frequencies",
        ),
    ],
)
def test_xpos_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------------------------------
# Axial / M-RoPE


@pytest.mark.parametrize("mode", ["axial", "mrope"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_one_axis_is_plain_rope(mode, layout):
    positions = np.array([0, 3, 17, 1e6, -5.25])
    cos, sin = axial_rope_tables(positions[:, None], 16, 500.0, mode=mode, layout=layout)
    ref = rope_tables(positions, rope_frequencies(16, 500.0), layout=layout)
    assert_array_equal(cos, ref[0])
    assert_array_equal(sin, ref[1])


@pytest.mark.parametrize("mode", ["axial", "mrope"])
def test_other_axes_zero_reduce_to_1d_rope(mode):
    d, base, sections = 24, 100.0, [2, 4, 6]
    values = np.array([0, 1, 5, 1234, 2.5])
    starts = np.cumsum([0, *sections])
    full = rope_frequencies(d, base)
    for a, s in enumerate(sections):
        coords = np.zeros((values.size, 3))
        coords[:, a] = values
        cos, sin = axial_rope_tables(coords, d, base, sections=sections, mode=mode, dtype="float64")
        ladder = (
            rope_frequencies(2 * s, base) if mode == "axial" else full[starts[a] : starts[a + 1]]
        )
        rc, rs = rope_tables(values, ladder, dtype="float64")
        cols = np.r_[starts[a] : starts[a + 1], d // 2 + starts[a] : d // 2 + starts[a + 1]]
        assert_array_equal(cos[:, cols], rc)
        assert_array_equal(sin[:, cols], rs)
        others = np.setdiff1d(np.arange(d), cols)
        assert_array_equal(cos[:, others], 1.0)
        assert_array_equal(sin[:, others], 0.0)


@pytest.mark.parametrize("mode", ["axial", "mrope"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_2d_translation_invariance(mode, layout):
    d, n = 16, 20
    coords = RNG.integers(0, 30, (n, 2)).astype(np.float64)
    q = RNG.standard_normal((n, d))
    k = RNG.standard_normal((n, d))

    def scores(c):
        cos, sin = axial_rope_tables(c, d, 100.0, mode=mode, layout=layout, dtype="float64")
        return apply_rope(q, cos, sin, layout=layout) @ apply_rope(k, cos, sin, layout=layout).T

    assert_allclose(scores(coords + np.array([13.0, -7.0])), scores(coords), rtol=1e-12, atol=1e-12)
    # and it does see both axes: a shift of one query's x changes its scores
    moved = coords.copy()
    moved[0, 0] += 1
    assert not np.allclose(scores(moved)[0], scores(coords)[0])


def test_axial_matches_rope_vit():
    # naver-ai/rope-vit compute_axial_cis (also SAM 2): freqs = 1/theta**(arange(0, dim, 4)
    # [:dim//4]/dim) for x and for y, t_x = t % end_x, t_y = t // end_x, polar, cat([x, y]);
    # applied by complex multiplication of consecutive feature pairs (interleaved layout).
    torch = pytest.importorskip("torch")
    dim, end_x, end_y, theta = 32, 5, 3, 100.0
    f64 = torch.float64
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 4, dtype=f64)[: dim // 4] / dim))
    t = torch.arange(end_x * end_y, dtype=f64)
    t_x, t_y = t % end_x, torch.div(t, end_x, rounding_mode="floor")
    cis_x = torch.polar(torch.ones(end_x * end_y, dim // 4, dtype=f64), torch.outer(t_x, freqs))
    cis_y = torch.polar(torch.ones(end_x * end_y, dim // 4, dtype=f64), torch.outer(t_y, freqs))
    cis = torch.cat([cis_x, cis_y], dim=-1)  # (N, dim/2)
    x = RNG.standard_normal((2, end_x * end_y, dim))
    xc = torch.view_as_complex(torch.from_numpy(x).reshape(2, -1, dim // 2, 2).contiguous())
    ref = torch.view_as_real(xc * cis).flatten(-2).numpy()

    coords = grid_coordinates((end_y, end_x))[..., ::-1].reshape(-1, 2)  # (x, y) per token
    cos, sin = axial_rope_tables(coords, dim, theta, layout="interleaved", dtype="float64")
    assert_allclose(apply_rope(x, cos, sin, layout="interleaved"), ref, rtol=1e-12, atol=1e-12)


def _qwen2_vl_rotary(torch, sections, head_dim=128, theta=10000.0):
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

    config = Qwen2VLTextConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": theta, "mrope_section": sections},
    )
    return Qwen2VLRotaryEmbedding(config)


def test_mrope_matches_hugging_face_qwen2_vl():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb

    sections = [16, 24, 24]
    rotary = _qwen2_vl_rotary(torch, sections)
    position_ids = torch.randint(0, 200, (3, 2, 9))  # (t/h/w, batch, seq), HF's layout
    hf_cos, hf_sin = rotary(torch.zeros(1, dtype=torch.float32), position_ids)  # (2, 9, 128)
    coords = np.moveaxis(position_ids.numpy(), 0, -1)  # (batch, seq, 3)
    # HF's float32 ladder taken as exact: the only difference left is HF's float32 angle.
    inv_freq = rotary.inv_freq.numpy()
    cos, sin = axial_rope_tables(coords, inv_freq=inv_freq, sections=sections, mode="mrope")
    tol = 200 * 2.0**-24 * 2  # |angle error| <= position · ulp(angle) in float32
    assert_allclose(cos, hf_cos.numpy(), atol=tol)
    assert_allclose(sin, hf_sin.numpy(), atol=tol)
    # our default ladder is HF's up to its float32 rounding
    cos_d, _ = axial_rope_tables(coords, 128, 10000.0, sections=sections, mode="mrope")
    assert_allclose(cos_d, hf_cos.numpy(), atol=5 * tol)
    # and the rotation: HF apply_rotary_pos_emb on (batch, heads, seq, d)
    q = torch.randn(2, 4, 9, 128)
    k = torch.randn(2, 4, 9, 128)
    hq, hk = apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
    ours_q = apply_rope(q.numpy(), cos[:, None], sin[:, None])
    ours_k = apply_rope(k.numpy(), cos[:, None], sin[:, None])
    assert_allclose(ours_q, hq.numpy(), atol=1e-4)
    assert_allclose(ours_k, hk.numpy(), atol=1e-4)


def test_axial_dtype_rounding_and_shapes():
    coords = grid_coordinates((4, 6, 2))  # a 3-D grid: (4, 6, 2, 3)
    cos64, sin64 = axial_rope_tables(coords, 12, dtype="float64", layout="interleaved")
    cos32, sin32 = axial_rope_tables(coords, 12, dtype="float32", layout="interleaved")
    assert cos32.shape == (4, 6, 2, 12)
    assert cos32.dtype == np.float32
    assert_array_equal(cos32, cos64.astype(np.float32))  # rounded once from exact values
    assert_array_equal(sin32, sin64.astype(np.float32))
    cos16, _ = axial_rope_tables(coords, 12, dtype="float16")
    assert cos16.dtype == np.float16
    c, _ = axial_rope_tables(coords, 16, rotary_dim=12, dtype="float64", layout="interleaved")
    assert_array_equal(c, cos64)


def test_axial_explicit_ladders():
    coords = RNG.integers(-50, 50, (7, 2))
    fx, fy = np.array([1.0, 0.3]), np.array([0.5, 0.05, 0.005])
    cos, sin = axial_rope_tables(coords, inv_freq=[fx, fy], dtype="float64")
    cx, sx = rope_tables(coords[:, 0], fx, dtype="float64")
    cy, sy = rope_tables(coords[:, 1], fy, dtype="float64")
    assert_array_equal(cos[:, :5], np.concatenate([cx[:, :2], cy[:, :3]], axis=-1))
    assert_array_equal(sin[:, 5:], np.concatenate([sx[:, :2], sy[:, :3]], axis=-1))


def test_grid_coordinates():
    g = grid_coordinates((2, 3))
    assert g.shape == (2, 3, 2)
    assert g[1, 2].tolist() == [1, 2]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: axial_rope_tables(np.zeros((3, 3)), 16), ValueError, "equally"),
        (lambda: axial_rope_tables(np.zeros((3, 2)), 16, sections=[3, 4]), ValueError, "add up"),
        (lambda: axial_rope_tables(np.zeros((3, 2)), 16, sections=[8]), ValueError, "one entry"),
        (lambda: axial_rope_tables(np.zeros((3, 2)), 16, sections=[0, 8]), ValueError, ">= 1"),
        (lambda: axial_rope_tables(np.zeros((3, 2)), 16, mode="3d"), ValueError, "mode"),
        (lambda: axial_rope_tables(np.zeros((3, 2))), TypeError, "head_dim"),
        (lambda: axial_rope_tables(np.zeros((3, 2)), 7), ValueError, "even"),
        (lambda: axial_rope_tables(np.zeros((3, 0)), 8), ValueError, "n_axes"),
        (lambda: axial_rope_tables([[np.inf, 0]], 8), ValueError, "finite"),
        (
            lambda: axial_rope_tables(np.zeros((3, 2)), inv_freq=np.ones(4)),
            TypeError,
            "mrope",
        ),
        (
            lambda: axial_rope_tables(np.zeros((3, 2)), inv_freq=[np.ones(2)]),
            ValueError,
            "one ladder per",
        ),
        (
            lambda: axial_rope_tables(
                np.zeros((3, 2)), inv_freq=[np.ones(2), np.ones(2)], sections=[1, 3]
            ),
            ValueError,
            "disagree",
        ),
        (
            lambda: axial_rope_tables(np.zeros((3, 2)), inv_freq=np.ones(5), mode="mrope"),
            ValueError,
            "equally",
        ),
        (lambda: grid_coordinates(3), TypeError, "sequence"),
    ],
)
def test_axial_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_axial_memory_guard():
    with pytest.raises(ValueError, match="max_bytes"):
        axial_rope_tables(np.zeros((1000, 2)), 64, max_bytes=1000)
    assert math.isfinite(axial_rope_tables(np.zeros((1, 2)), 4, max_bytes=None)[0].sum())
