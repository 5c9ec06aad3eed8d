"""Tables written into memory the caller allocated (``out=``), and the chunked run path.

``out=`` must give the very values of a call without it, bit for bit, in the caller's
arrays; a wrong ``out`` is refused with the argument named. The run path of the RoPE
tables works a chunk of rows at a time from the two phasor factors; its rows must be
the correctly rounded values at every chunk and block boundary.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_array_equal

from posenc.core.phasors import phasor_factors, phasor_rows
from posenc.core.precision import CONTAINERS, turns_of, unit_phasors
from posenc.core.rope import rope_frequencies, rope_table_values
from posenc.core.rounding import PHASOR_ERROR, exact_part, round_decimal
from posenc.specs import RopeSpec, SinusoidalSpec

FORMATS = ["float32", "float16", "bfloat16", "float64"]
INV_FREQ = rope_frequencies(32, 10000.0)  # 16 frequencies


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype
    assert a.shape == b.shape
    assert_array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(
    ("positions", "start"),
    [(300, 0), (300, 12345), (5, 7), (np.array([[3, -1], [2**20, 7]]), 0), (0, 0)],
)
def test_rope_out_holds_the_values_of_a_call_without_it(fmt, layout, positions, start):
    expected = rope_table_values(
        positions, INV_FREQ, fmt=fmt, layout=layout, start=start, scale=1.25
    )
    out = tuple(np.full(expected[0].shape, np.nan, CONTAINERS[fmt]) for _ in range(2))
    got = rope_table_values(
        positions, INV_FREQ, fmt=fmt, layout=layout, start=start, scale=1.25, out=out
    )
    for table, given_out, want in zip(got, out, expected, strict=True):
        assert table is given_out
        _same_bits(given_out, want)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", ["interleaved", "split"])
@pytest.mark.parametrize("d_model", [64, 7])
@pytest.mark.parametrize(("positions", "start"), [(200, 0), (200, 999), ([[0.5, 3.0]], 0)])
def test_sinusoidal_out_holds_the_values_of_a_call_without_it(
    fmt, layout, d_model, positions, start
):
    spec = SinusoidalSpec(d_model=d_model, layout=layout)
    expected = spec.table(positions, fmt=fmt, start=start)
    out = np.full(expected.shape, np.nan, CONTAINERS[fmt])
    got = spec.table(positions, fmt=fmt, start=start, out=out)
    assert got is out
    _same_bits(out, expected)


def test_rope_spec_passes_out_through_with_its_attention_factor():
    spec = RopeSpec(
        head_dim=32,
        scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    )
    expected = spec.tables(100, fmt="float32", start=50)
    out = (np.empty((100, 32), np.float32), np.empty((100, 32), np.float32))
    got = spec.tables(100, fmt="float32", start=50, out=out)
    assert got[0] is out[0]
    assert got[1] is out[1]
    for a, b in zip(out, expected, strict=True):
        _same_bits(a, b)


def test_out_in_memory_another_array_owns():
    # What a front end passes: views of memory it allocated (here a bigger buffer).
    owner = np.zeros(2 * 64 * 32 + 16, np.float32)
    cos, sin = owner[16 : 16 + 64 * 32].reshape(64, 32), owner[16 + 64 * 32 :].reshape(64, 32)
    rope_table_values(64, INV_FREQ, fmt="float32", layout="half", out=(cos, sin))
    expected = rope_table_values(64, INV_FREQ, fmt="float32", layout="half")
    assert np.shares_memory(cos, owner)
    assert np.shares_memory(sin, owner)
    _same_bits(owner[16:].reshape(2, 64, 32)[0], expected[0])
    _same_bits(owner[16:].reshape(2, 64, 32)[1], expected[1])
    assert not owner[:16].any()  # nothing written outside


def _rope(out, fmt="float32"):
    return rope_table_values(10, INV_FREQ, fmt=fmt, layout="half", out=out)


def _table(out, fmt="float32"):
    return SinusoidalSpec(d_model=8).table(10, fmt=fmt, out=out)


GOOD = np.empty((10, 32), np.float32)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: _rope(GOOD), TypeError, r"out must be a \(cos, sin\) tuple"),
        (lambda: _rope([GOOD, GOOD.copy()]), TypeError, r"out must be a \(cos, sin\) tuple"),
        (lambda: _rope((GOOD,)), TypeError, r"out must be a \(cos, sin\) tuple"),
        (lambda: _rope((GOOD, [[0.0] * 32] * 10)), TypeError, r"out\[1\] \(sin\) must be a"),
        (
            lambda: _rope((np.empty((10, 32)), GOOD)),
            TypeError,
            r"out\[0\] \(cos\) must have dtype float32 .*got float64",
        ),
        (
            lambda: _rope((GOOD, np.empty((10, 32), np.float32)), fmt="float16"),
            TypeError,
            "must have dtype float16",
        ),
        (
            lambda: _rope((GOOD, np.empty((10, 32), ">f4"))),
            TypeError,
            r"out\[1\] \(sin\) must have dtype float32",
        ),
        (
            lambda: _rope((GOOD, np.empty((10, 33), np.float32))),
            ValueError,
            r"out\[1\] \(sin\) must have shape \(10, 32\), got \(10, 33\)",
        ),
        (
            lambda: _rope((np.empty((320,), np.float32), GOOD)),
            ValueError,
            r"out\[0\] \(cos\) must have shape",
        ),
        (
            lambda: _rope((np.empty((32, 10), np.float32).T, GOOD)),
            ValueError,
            r"out\[0\] \(cos\) must be C-contiguous",
        ),
        (
            lambda: _rope((GOOD, np.empty((10, 64), np.float32)[:, ::2])),
            ValueError,
            "C-contiguous",
        ),
        (
            lambda: _rope((GOOD, np.broadcast_to(np.float32(0), (10, 32)))),
            ValueError,
            "C-contiguous|writeable",
        ),
        (lambda: _rope((GOOD, GOOD)), ValueError, "out must be two separate arrays"),
        (
            lambda: _rope((GOOD, GOOD.reshape(-1)[:320].reshape(10, 32))),
            ValueError,
            "overlap",
        ),
        (lambda: _table([[0.0] * 8] * 10), TypeError, "out must be a writeable, C-contiguous"),
        (lambda: _table(np.empty((10, 8), np.float16)), TypeError, "out must have dtype float32"),
        (lambda: _table(np.empty((10, 8)), "bfloat16"), TypeError, "container of bfloat16"),
        (lambda: _table(np.empty((11, 8), np.float32)), ValueError, r"out must have shape"),
        (
            lambda: _table(np.empty((8, 10), np.float32).T),
            ValueError,
            "out must be C-contiguous",
        ),
    ],
)
def test_a_bad_out_is_refused_with_the_argument_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_read_only_out_is_refused():
    frozen = np.empty((10, 32), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match=r"out\[0\] \(cos\) must be writeable"):
        _rope((frozen, GOOD))
    table = np.empty((10, 8), np.float32)
    table.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writeable"):
        _table(table)


def test_a_refused_out_is_left_untouched():
    cos = np.full((10, 32), 7.0, np.float32)
    with pytest.raises(ValueError, match="shape"):
        _rope((cos, np.empty((10, 31), np.float32)))
    assert (cos == 7.0).all()


# ---------------------------------------------------------------------------------------
# The chunked run path


@settings(max_examples=40, deadline=None)
@given(
    start=st.integers(-(2**40), 2**40),
    n=st.integers(1, 700),
    rows_log2=st.integers(0, 9),
    m=st.integers(1, 5),
)
def test_phasor_rows_put_together_are_the_phasors(start, n, rows_log2, m):
    # Within the phasor error of the exact phasors (evaluated one by one), chunk by chunk.
    hi, lo = turns_of(rope_frequencies(2 * m, 777.0))
    fine, coarse, block = phasor_factors(float(start), n, hi, lo)
    rows = 1 << rows_log2
    buffer = np.empty((rows, m), np.complex128)
    chunks = []
    for first in range(0, n, rows):
        z = phasor_rows(fine, coarse, block, first, rows, buffer)
        assert z.shape[0] >= min(rows, n - first)
        assert np.shares_memory(z, buffer)
        chunks.append(z[: min(rows, n - first)].copy())
    z = np.concatenate(chunks)
    sin, cos = unit_phasors(start + np.arange(n, dtype=np.float64)[:, None], hi, lo)
    assert z.shape == (n, m)
    assert np.abs(z.real - cos).max() <= PHASOR_ERROR
    assert np.abs(z.imag - sin).max() <= PHASOR_ERROR


@settings(max_examples=25, deadline=None)
@given(
    start=st.integers(-(2**33), 2**33),
    length=st.integers(1, 1200),
    fmt=st.sampled_from(["float32", "float16", "bfloat16"]),
    layout=st.sampled_from(["half", "interleaved"]),
    data=st.data(),
)
def test_every_row_of_a_run_is_the_correctly_rounded_exact_value(start, length, fmt, layout, data):
    # Runs long enough for several chunks (1024 rows of 16 frequencies) and blocks;
    # a few rows, chunk and block edges among them, checked against decimal arithmetic.
    hi, lo = turns_of(INV_FREQ)
    cos, sin = rope_table_values(length, INV_FREQ, fmt=fmt, layout=layout, start=start)
    edges = [0, length - 1, *(r for r in (31, 32, 1023, 1024) if r < length)]
    rows = sorted({*edges, data.draw(st.integers(0, length - 1))})
    m = INV_FREQ.size
    columns = np.arange(m) if layout == "half" else 2 * np.arange(m)
    for r in rows:
        position = float(start + r)
        for table, part in ((cos, "cos"), (sin, "sin")):
            want = [round_decimal(exact_part(position, hi[j], lo[j], part), fmt) for j in range(m)]
            got = table[r, columns].astype(np.float64)
            assert_array_equal(got, want)
            other = table[r, columns + (m if layout == "half" else 1)]
            assert_array_equal(other.astype(np.float64), want)


def test_float64_run_is_within_the_phasor_error_and_both_columns_agree():
    cos, sin = rope_table_values(5000, INV_FREQ, fmt="float64", layout="half", start=-77)
    positions = np.arange(-77, 5000 - 77, dtype=np.float64)[:, None]
    m = INV_FREQ.size
    hi, lo = turns_of(INV_FREQ)
    # Per-element exact angle reduction, then float64 sin/cos: the array path's values.
    s, c = unit_phasors(positions, hi, lo)
    assert np.abs(cos[:, :m] - c).max() < 3e-15
    assert np.abs(sin[:, :m] - s).max() < 3e-15
    _same_bits(cos[:, :m].copy(), cos[:, m:].copy())
    _same_bits(sin[:, :m].copy(), sin[:, m:].copy())
