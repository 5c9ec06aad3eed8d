"""CoPE's float64 formula (posenc.core.cope) against the paper's definition written out
key by key in Python floats, and the checks every front end shares."""

from __future__ import annotations

import math

import numpy as np
import pytest

import posenc
from posenc.core.cope import check_cope_call, cope_bias


def paper_cope(q, k, pos_emb, allowed, scale):
    """Golovneva et al. (2024), §3: g_ij = σ(q_i·k_j) over the keys query i sees (else 0),
    p_ij = Σ_{t >= j} g_it, e(p) = (1 - w)·e[⌊p⌋] + w·e[⌈p⌉] with p clamped at the last
    vector, bias = q_i·e(p_ij); q and the logits scaled by ``scale`` as in attention."""
    B, H, T, D = q.shape
    S, last = k.shape[2], pos_emb.shape[2] - 1
    out = np.zeros((B, H, T, S))
    for b, h, i in np.ndindex(B, H, T):
        qi = [float(x) for x in q[b, h, i]]
        gates = []
        for t in range(S):
            logit = scale * math.fsum(qi[c] * float(k[b, h, t, c]) for c in range(D))
            gates.append(1 / (1 + math.exp(-logit)) if allowed[b, h, i, t] else 0.0)
        for j in range(S):
            p = min(math.fsum(gates[j:]), last)
            low, high, w = math.floor(p), math.ceil(p), p - math.floor(p)
            vector = [(1 - w) * pos_emb[0, c, low] + w * pos_emb[0, c, high] for c in range(D)]
            out[b, h, i, j] = scale * math.fsum(qi[c] * vector[c] for c in range(D))
    return out


@pytest.mark.parametrize(
    ("mask", "npos"),
    [("causal", 9), ("causal", 3), ("none", 12), ("padded", 5)],  # 3: counts clamp
)
def test_cope_bias_is_the_papers_definition(mask, npos):
    rng = np.random.default_rng(7)
    q, k = rng.standard_normal((2, 3, 6, 4)), rng.standard_normal((2, 3, 8, 4))
    pos_emb = rng.standard_normal((1, 4, npos))
    causal = np.arange(8)[None, :] <= np.arange(2, 8)[:, None]  # the last 6 of 8 keys
    allowed = {
        "causal": causal,
        "none": None,
        "padded": causal & (np.arange(8) >= np.array([[0], [3]]))[:, None, None, :],
    }[mask]
    full = (
        np.ones((2, 3, 6, 8), bool) if allowed is None else np.broadcast_to(allowed, (2, 3, 6, 8))
    )
    expected = paper_cope(q, k, pos_emb, full, 0.5)
    got = cope_bias(q, k, pos_emb, allowed=allowed, scale=0.5)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


def test_cope_bias_worked_example_and_public_name():
    """Every gate σ(0) = 1/2: query i counts (i - j + 1)/2 at key j, e[p] = (p, 0)."""
    e = np.zeros((1, 2, 4))
    e[0, 0] = np.arange(4.0)
    q = np.tile([1.0, 0.0], (1, 1, 3, 1))
    causal = np.tril(np.ones((3, 3), bool))
    counts = (np.arange(3)[:, None] - np.arange(3)[None, :] + 1) / 2 * causal
    np.testing.assert_array_equal(
        posenc.cope_bias(q, np.zeros((1, 1, 3, 2)), e, allowed=causal)[0, 0], counts
    )


def test_cope_bias_nan_input_is_nan_not_an_index_error():
    q = np.ones((1, 1, 2, 2))
    q[0, 0, 0, 0] = np.nan
    bias = cope_bias(q, np.ones((1, 1, 2, 2)), np.ones((1, 2, 3)))
    assert np.isnan(bias[0, 0, 0]).all()
    assert np.isfinite(bias[0, 0, 1]).all()


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        (((2, 4, 3), (2, 4, 5, 8), None, 1.0), ValueError, r"q must have shape \(batch, heads, seq, 8\), got \(2, 4, 3\)"),
        (((2, 4, 3, 8), (2, 4, 5, 6), None, 1.0), ValueError, r"k must have shape .* got \(2, 4, 5, 6\)"),
        (((2, 4, 3, 8), (1, 4, 5, 8), None, 1.0), ValueError, "same batch and heads"),
        (((2, 4, 3, 8), (2, 4, 5, 8), (3, 4), 1.0), ValueError, r"allowed must broadcast to the scores of q and k \(2, 4, 3, 5\), got \(3, 4\)"),
        (((2, 4, 3, 8), (2, 4, 5, 8), (1, 2, 4, 3, 5), 1.0), ValueError, "allowed must broadcast"),
        (((2, 4, 3, 8), (2, 4, 5, 8), None, 0.0), ValueError, "scale must be a finite real number > 0"),
        (((2, 4, 3, 8), (2, 4, 5, 8), None, "1"), TypeError, "scale must be a finite real number"),
    ],
)  # fmt: skip
def test_check_cope_call_names_the_argument(arguments, error, match):
    with pytest.raises(error, match=match):
        check_cope_call("cope", *arguments, head_dim=8)


def test_check_cope_call_skips_sizes_unknown_in_a_graph():
    assert check_cope_call("cope", (None, 4, None, 8), (2, None, 5, 8), (None, 5), 0.5, 8) == 0.5


def test_cope_bias_refuses_bad_arrays_by_name():
    q = np.zeros((1, 1, 2, 2))
    with pytest.raises(ValueError, match="pos_emb must have shape"):
        cope_bias(q, q, np.zeros((2, 3)))
    with pytest.raises(TypeError, match="allowed must be a boolean array"):
        cope_bias(q, q, np.zeros((1, 2, 3)), allowed=np.ones((2, 2)))
    with pytest.raises(TypeError, match="q must be an array of real numbers"):
        cope_bias(q.astype(complex), q, np.zeros((1, 2, 3)))
    with pytest.raises(ValueError, match="max_bytes"):
        cope_bias(q, q, np.zeros((1, 2, 3)), max_bytes=100)
