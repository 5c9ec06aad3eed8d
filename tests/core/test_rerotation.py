"""Tables that move RoPE-rotated keys to new positions or frequencies, against mpmath."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.core.rope import (
    DynamicNTKScaling,
    LongRopeScaling,
    rerotation_table_values,
    rerotation_tables,
    rope_tables,
)


def exact(old_p, new_p, old_theta, new_theta, scale=1.0):
    """cos and sin of new_p·θ' − old_p·θ (each float64 θ taken as the exact number it
    holds), times scale, in 60 digits, per (row, pair)."""
    with mpmath.workdps(60):
        cos = np.empty((len(old_p), len(old_theta)), dtype=object)
        sin = np.empty_like(cos)
        for r, (p, q) in enumerate(zip(old_p, new_p, strict=True)):
            for i, (a, b) in enumerate(zip(old_theta, new_theta, strict=True)):
                new_angle = mpmath.mpf(int(q)) * mpmath.mpf(float(b))
                angle = new_angle - mpmath.mpf(int(p)) * mpmath.mpf(float(a))
                cos[r, i] = mpmath.mpf(scale) * mpmath.cos(angle)
                sin[r, i] = mpmath.mpf(scale) * mpmath.sin(angle)
    return cos, sin


def rounded(values, dtype):
    return np.array([[dtype(float(v)) for v in row] for row in values])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tables_are_the_exact_rotation_rounded_once_far_out(dtype):
    old_theta = posenc.core.rope.rope_frequencies(8, 10000.0)
    new_theta = DynamicNTKScaling(factor=4.0, original_max_position_embeddings=4096).frequencies(
        8, 10000.0, seq_len=500_000
    )[0]
    old_p = np.array([0, 1, 4095, 131_071, 499_999, 2**40 + 3])
    new_p = np.array([0, 1, 4095, 131_071, 499_999, 2**40 + 3])
    cos, sin = rerotation_tables(old_p, new_p, old_theta, new_theta, dtype=dtype.__name__)
    want_cos, want_sin = exact(old_p, new_p, old_theta, new_theta)
    if dtype is np.float32:  # correctly rounded
        np.testing.assert_array_equal(cos[:, :4], rounded(want_cos, np.float32))
        np.testing.assert_array_equal(sin[:, :4], rounded(want_sin, np.float32))
    else:  # float64: the angle is within ~7e-16 rad (two reductions of 2**-54 turns)
        np.testing.assert_allclose(cos[:, :4], rounded(want_cos, float), rtol=0, atol=1e-15)
        np.testing.assert_allclose(sin[:, :4], rounded(want_sin, float), rtol=0, atol=1e-15)
    np.testing.assert_array_equal(cos[:, 4:], cos[:, :4])  # half layout: both halves


def test_a_move_to_new_positions_with_a_scale_in_the_interleaved_layout():
    theta = np.array([1.0, 0.01, 1e-4])
    old_p, new_p = np.array([7, 1_000_003, 12]), np.array([2, 999_000, 12])
    cos, sin = rerotation_table_values(
        old_p, new_p, theta, fmt="float32", layout="interleaved", scale=1.25
    )
    want_cos, want_sin = exact(old_p, new_p, theta, theta, scale=1.25)
    np.testing.assert_array_equal(cos[:, 0::2], rounded(want_cos, np.float32))
    np.testing.assert_array_equal(sin[:, 1::2], rounded(want_sin, np.float32))
    np.testing.assert_array_equal(cos[:, 0::2], cos[:, 1::2])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 2**30), min_size=1, max_size=6),
    st.integers(-(2**20), 2**20),
    st.floats(1.5, 1e6),
)
def test_a_shift_is_the_rope_table_of_the_difference(positions, shift, base):
    """Moving by `shift` with the same frequencies turns by shift·θ: the RoPE table of
    that one position (an independent path of the core: the phasor engine)."""
    theta = posenc.core.rope.rope_frequencies(6, base)
    old = np.array(positions)
    new = old + shift
    cos, sin = rerotation_tables(old, new, theta, dtype="float64")
    want_cos, want_sin = rope_tables([shift] * len(positions), theta, dtype="float64")
    np.testing.assert_allclose(cos, want_cos, rtol=0, atol=2e-15)
    np.testing.assert_allclose(sin, want_sin, rtol=0, atol=2e-15)


def test_spec_rerotation_takes_longrope_from_short_to_long_factors_and_mscales():
    scaling = LongRopeScaling(
        short_factor=[1.0, 1.5],
        long_factor=[2.0, 8.0],
        original_max_position_embeddings=16,
        short_mscale=1.0,
        long_mscale=1.2,
    )
    spec = posenc.RopeSpec(head_dim=4, base=100.0, scaling=scaling)
    positions = np.arange(5, 12)
    cos, sin = spec.rerotation(positions, seq_len=None, new_seq_len=17, fmt="float64")
    short, _ = spec.frequencies(None)
    long, _ = spec.frequencies(17)
    want_cos, want_sin = exact(positions, positions, short, long, scale=1.2)
    np.testing.assert_allclose(cos[:, :2], rounded(want_cos, float), rtol=0, atol=1e-15)
    np.testing.assert_allclose(sin[:, :2], rounded(want_sin, float), rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: rerotation_tables([1, 2], [1], [1.0]), "same length"),
        (lambda: rerotation_tables([1], [1], [1.0], [1.0, 2.0]), "same length"),
        (lambda: rerotation_tables([[1]], [[1]], [1.0]), "1-D"),
        (lambda: rerotation_tables([1], [1], [1.0], scale=0.0), "scale"),
        (lambda: rerotation_tables([1.5, np.inf], [1, 1], [1.0]), "finite"),
        (lambda: rerotation_tables([1], [1], [1.0], layout="pairs"), "layout"),
        (lambda: rerotation_tables([2**53], [2**53], [100.0]), "turns"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_new_frequencies_in_place_are_one_reduction_of_the_turns_difference():
    """Same positions: the angle p·(t' − t), the difference of the two frequencies' turns
    held as a double-double and reduced once (exact relative to the small angles it
    gives); correctly rounded."""
    old_theta = posenc.core.rope.rope_frequencies(16, 500000.0)
    new_theta = DynamicNTKScaling(factor=8.0, original_max_position_embeddings=8192).frequencies(
        16, 500000.0, seq_len=131_072
    )[0]
    positions = np.arange(131_000, 131_072)
    cos, sin = rerotation_tables(positions, positions, old_theta, new_theta)
    want_cos, want_sin = exact(positions, positions, old_theta, new_theta)
    np.testing.assert_array_equal(cos[:, :8], rounded(want_cos, np.float32))
    np.testing.assert_array_equal(sin[:, :8], rounded(want_sin, np.float32))


def test_a_move_by_a_few_distinct_shifts_is_computed_once_per_shift():
    theta = posenc.core.rope.rope_frequencies(8, 10000.0)
    old = np.array([0, 1, 2, 3, 10, 11, 12, 13, 1_000_000])  # sinks stay, the others move
    new = np.array([0, 1, 2, 3, 4, 5, 6, 7, 999_994])
    cos, sin = rerotation_tables(old, new, theta)
    want_cos, want_sin = exact(old, new, theta, theta)
    np.testing.assert_array_equal(cos[:, :4], rounded(want_cos, np.float32))
    np.testing.assert_array_equal(sin[:, :4], rounded(want_sin, np.float32))
