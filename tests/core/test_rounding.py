"""Correct rounding on every path: the fast (run of positions) and direct (gathered
positions) paths agree bit for bit over every entry of large tables, and the entries
whose float64 value lies near a rounding midpoint are the correctly rounded exact values
by mpmath, with the frequencies computed exactly there too."""

from __future__ import annotations

import decimal

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.core.precision import round_to_format
from posenc.core.rope.tables import rope_table_values
from posenc.core.rounding import PHASOR_ERROR, exact_part, round_decimal
from posenc.core.sinusoidal import table_values

mpmath.mp.dps = 60
BITS = {"float32": 24, "float16": 11, "bfloat16": 8}
EMIN = {"float32": -126, "float16": -14, "bfloat16": -126}


def mp_round(x: mpmath.mpf, fmt: str) -> float:
    """``x`` correctly rounded to ``fmt`` by mpmath (nearest, ties to even)."""
    if x == 0:
        return 0.0
    exponent = int(mpmath.floor(mpmath.log(abs(x), 2))) + 1
    last = max(exponent - 1, EMIN[fmt]) - (BITS[fmt] - 1)
    units = mpmath.nint(mpmath.ldexp(x, -last))  # nint: nearest, ties to even
    return float(mpmath.ldexp(units, last))


def direct(positions_of_rows: np.ndarray, build) -> np.ndarray:
    """The table of the gathered path: positions given in reverse order (not a run)."""
    return build(positions_of_rows[::-1].copy())[::-1]


@pytest.mark.slow
def test_sinusoidal_fast_path_equals_direct_path_2m_by_64_float32():
    length, d = 2_000_000, 64
    fast = posenc.sinusoidal(length, d)
    for r0 in range(0, length, 250_000):
        rows = np.arange(r0, r0 + 250_000, dtype=np.float64)
        np.testing.assert_array_equal(
            fast[r0 : r0 + 250_000], direct(rows, lambda p: posenc.sinusoidal(p, d))
        )


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["interleaved", "split"])
def test_sinusoidal_fast_path_equals_direct_path_low_precision(dtype, layout):
    length, d = 400_000, 64
    fast = posenc.sinusoidal(length, d, dtype=dtype, layout=layout).astype(np.float32)
    slow = direct(
        np.arange(length, dtype=np.float64),
        lambda p: posenc.sinusoidal(p, d, dtype=dtype, layout=layout),
    ).astype(np.float32)
    np.testing.assert_array_equal(fast, slow)


@pytest.mark.parametrize(
    ("length", "d", "layout", "start"),
    [(70_000, 63, "split", 0), (50_000, 30, "interleaved", 10**9), (20_000, 128, "split", 2**45)],
)
def test_a_row_does_not_depend_on_the_table_or_the_threads(length, d, layout, start):
    kw = {"base": 10000.0, "layout": layout, "formula": "paper", "fmt": "float32", "start": start}
    whole = table_values(length, d, threads=2, **kw)
    np.testing.assert_array_equal(
        whole[: length // 3 + 1], table_values(length // 3 + 1, d, threads=1, **kw)
    )
    rows = start + np.arange(length, dtype=np.float64)
    np.testing.assert_array_equal(
        whole,
        direct(
            rows,
            lambda p: table_values(
                p, d, base=10000.0, layout=layout, formula="paper", fmt="float32"
            ),
        ),
    )


def test_the_value_that_depended_on_the_table_length():
    # sin(762119 ω_19), d = 64: the exact value lies 1.2e-7 ulp from a float32 midpoint.
    omega = mpmath.mpf(10000) ** (-mpmath.mpf(38) / 64)
    expected = mp_round(mpmath.sin(762119 * omega), "float32")
    assert posenc.sinusoidal(800_000, 64)[762119, 38] == np.float32(expected)
    assert posenc.sinusoidal([762119], 64)[0, 38] == np.float32(expected)
    assert expected == np.float32(0.020108301)


def test_entries_near_midpoints_are_the_mpmath_values():
    """Every entry of a 300,000 × 64 float32 table whose float64 value cannot decide its
    rounding is checked against mpmath with the exact frequency 10000^(-2i/d)."""
    length, d = 300_000, 64
    kw = {"base": 10000.0, "layout": "split", "formula": "paper"}
    values = table_values(length, d, fmt="float64", **kw).reshape(-1)
    table = table_values(length, d, fmt="float32", **kw)
    e = PHASOR_ERROR
    hard = np.flatnonzero(
        round_to_format(values - e, "float32") != round_to_format(values + e, "float32")
    )
    hard = hard[hard >= d]  # row 0 is exact
    assert hard.size > 20
    m = d // 2
    for index in hard.tolist():
        row, col = divmod(index, d)
        angle = row * mpmath.mpf(10000) ** (-mpmath.mpf(2 * (col % m)) / d)
        exact = mpmath.cos(angle) if col >= m else mpmath.sin(angle)
        assert float(table[row, col]) == mp_round(exact, "float32"), (row, col)


@pytest.mark.parametrize("fmt", ["float32", "float16", "bfloat16"])
def test_values_made_to_lie_on_midpoints(fmt):
    """Frequencies chosen so that sin(kω) and cos(kω) lie within ~1e-16 of a rounding
    midpoint of ``fmt``: every path gives mpmath's rounding of the exact value (ω taken
    as the float64 it is), through the fast path, the direct path and the table of one
    position."""
    bits = BITS[fmt]
    k = 1000
    targets = [0.5 + 2.0**-bits * j + 2.0 ** -(bits + 1) for j in (0, 3, 17)]  # midpoints
    targets += [0.75 + 2.0**-bits * j + 2.0 ** -(bits + 1) for j in (1, 5)]
    omegas = [float(mpmath.asin(t) / k) for t in targets] + [
        float(mpmath.acos(t) / k) for t in targets
    ]
    inv_freq = np.array(omegas)
    cos, sin = rope_table_values(k + 5, inv_freq, fmt=fmt, layout="half")
    one_cos, one_sin = rope_table_values([k], inv_freq, fmt=fmt, layout="half")
    m = inv_freq.size
    for j, omega in enumerate(omegas):
        angle = k * mpmath.mpf(omega)
        for table, one, exact in (
            (sin, one_sin, mpmath.sin(angle)),
            (cos, one_cos, mpmath.cos(angle)),
        ):
            expected = mp_round(exact, fmt)
            assert float(table[k, j]) == expected == float(table[k, m + j]), (j, omega)
            assert float(one[0, j]) == expected
    # the float64 values really are undecided: the test reaches the slow path
    _, s64 = rope_table_values([k], inv_freq, fmt="float64", layout="half")
    sin_values = s64[0, : len(targets)]
    below = round_to_format(sin_values - PHASOR_ERROR, fmt)
    assert np.all(below != round_to_format(sin_values + PHASOR_ERROR, fmt))


@pytest.mark.parametrize("scale", [1.0, 1.2079441541679836])
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16"])
def test_rope_tables_fast_equals_direct_with_an_attention_factor(fmt, scale):
    inv_freq = 1.0 / 500000.0 ** (np.arange(0, 128, 2) / 128)
    kw = {"fmt": fmt, "layout": "half", "scale": scale}
    cos, sin = rope_table_values(100_000, inv_freq, start=7, **kw)
    rows = 7 + np.arange(100_000, dtype=np.float64)
    both = direct(rows, lambda p: np.stack(rope_table_values(p, inv_freq, **kw), axis=1))
    np.testing.assert_array_equal(cos, both[:, 0])
    np.testing.assert_array_equal(sin, both[:, 1])


@settings(max_examples=60, deadline=None)
@given(
    position=st.integers(min_value=-(2**53), max_value=2**53),
    turns=st.floats(min_value=1e-12, max_value=0.5),
    part=st.sampled_from(["sin", "cos"]),
)
def test_exact_part_agrees_with_mpmath(position, turns, part):
    hi = float(turns)
    with mpmath.workdps(100):  # the angle reaches 3e16: 100 digits leave 80 after the point
        x = 2 * mpmath.pi * mpmath.mpf(position) * mpmath.mpf(hi)
        expected = mpmath.sin(x) if part == "sin" else mpmath.cos(x)
    got = exact_part(float(position), hi, 0.0, part)
    assert abs(mpmath.mpf(str(got)) - expected) < mpmath.mpf(10) ** -45


@pytest.mark.parametrize(
    ("value", "fmt", "expected"),
    [
        ("1.000000059604644775390625", "float32", 1.0),  # a tie: to even
        ("1.000000178813934326171875", "float32", 1.0000002384185791),  # a tie: to even
        ("1.0000000596046447753906250001", "float32", 1.0000001192092896),
        ("-1.00048828125", "float16", -1.0),  # a tie in float16
        ("1.00390625", "bfloat16", 1.0),  # a tie in bfloat16
        ("1.0039062500000000001", "bfloat16", 1.0078125),
        ("1e-46", "float32", 0.0),  # below half the smallest subnormal
        ("1e-45", "float32", 2.0**-149),
        ("3e-8", "float16", 2.0**-24),  # float16 subnormal
        ("0", "float32", 0.0),
    ],
)
def test_round_decimal(value, fmt, expected):
    assert round_decimal(decimal.Decimal(value), fmt) == expected


@pytest.mark.parametrize("fmt", ["float32", "float16", "bfloat16"])
def test_a_run_through_position_0_gives_exact_zeros_and_ones(fmt):
    """From a negative start the phasor of position 0 is a product, not exactly 1: its
    sines (about 1e-17) must still round to +0.0, the sign included."""
    kw = {"base": 10000.0, "layout": "interleaved", "formula": "paper", "fmt": fmt}
    run = table_values(20, 64, start=-7, **kw)
    expected = np.tile([0.0, 1.0], 32).astype(run.dtype)
    np.testing.assert_array_equal(
        run[7].view(f"i{run.itemsize}"), expected.view(f"i{run.itemsize}")
    )
    gathered = direct(np.arange(-7.0, 13.0), lambda p: table_values(p, 64, **kw))
    np.testing.assert_array_equal(run.view(f"i{run.itemsize}"), gathered.view(f"i{run.itemsize}"))


@pytest.mark.parametrize("fmt", ["float32", "float16", "bfloat16"])
def test_a_frequency_of_zero_gives_exact_zeros_and_ones_without_decimal_work(fmt, monkeypatch):
    """p-RoPE's pairs past its proportion turn by 0: every sin (0 ± the error bound) is a
    candidate of the midpoint test, and each is +0.0 and each cos the attention factor
    rounded, without the decimal path (that path made Gemma 4's tables 200 times
    slower); the turning pairs' candidates still take it."""
    import posenc.core.rounding as rounding

    calls = []

    def counted(position, hi, lo, part, scale=1.0):
        calls.append(hi + lo)
        return exact_part(position, hi, lo, part, scale)

    monkeypatch.setattr(rounding, "exact_part", counted)
    spec = posenc.RopeSpec(
        head_dim=64, base=1e6, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25}
    )
    cos, sin = spec.tables(np.arange(3000, 3400), fmt=fmt)
    assert all(turns != 0.0 for turns in calls)
    bits = f"i{cos.itemsize}"
    zero = np.zeros_like(sin[:, 8:32])
    np.testing.assert_array_equal(sin[:, 8:32].view(bits), zero.view(bits))  # +0.0
    np.testing.assert_array_equal(cos[:, 8:32], np.ones_like(cos[:, 8:32]))
    turning, _ = spec.tables(np.arange(3000, 3400), fmt="float64")
    expected = round_to_format(turning[:, :8], fmt)
    np.testing.assert_array_equal(cos[:, :8], expected.astype(cos.dtype))


def mp_xpos_scale(position: float, i: int, d: int, gamma: float, scale_base: float, centre: float):
    """``ζ_i^((p - c)/B)`` by mpmath, ``γ`` and ``B`` the float64 numbers they are."""
    zeta = (2 * i + mpmath.mpf(gamma) * d) / ((1 + mpmath.mpf(gamma)) * d)
    return mpmath.exp((mpmath.mpf(position) - mpmath.mpf(centre)) * mpmath.log(zeta) / scale_base)


def test_xpos_scales_are_within_their_error_bound_of_mpmath():
    """The float64 scales before rounding lie within SCALE_ERROR / 8 (relative) of the
    exact values, far from the centre too (exponents near ±700) and with a fractional
    centre (p - c formed exactly)."""
    from posenc.core.rope_nd.xpos import SCALE_ERROR, _xpos_scale_values

    d, gamma, scale_base, centre = 64, 0.4, 512.0, 1234.375
    rng = np.random.default_rng(7)
    positions = rng.integers(-280_000, 280_000, 150).astype(np.float64)
    for sign in (1.0, -1.0):
        values = _xpos_scale_values(positions, d, gamma, sign * scale_base, centre)
        for r, p in enumerate(positions.tolist()):
            for i in (0, 1, 7, d // 2 - 1):
                exact = mp_xpos_scale(p, i, d, gamma, sign * scale_base, centre)
                if not mpmath.mpf("1e-300") < exact < mpmath.mpf("1e300"):
                    continue
                error = abs(mpmath.mpf(float(values[r, i])) / exact - 1)
                assert error < SCALE_ERROR / 8, (p, i, sign, float(error))


@pytest.mark.parametrize("fmt", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("role", ["query", "key"])
def test_xpos_scales_made_to_lie_on_midpoints(fmt, role):
    """scale_base chosen so that ζ_0^((p - c)/B) lies within ~1e-16 of a rounding midpoint
    of ``fmt``: the scale is mpmath's rounding of the exact value (the float64 value
    cannot decide it, so the test reaches the exact path)."""
    from posenc.core.rope_nd.xpos import SCALE_ERROR

    bits, d, gamma, position, centre = BITS[fmt], 8, 0.4, 3000.0, 17.5
    zeta0 = mpmath.mpf(gamma) / (1 + mpmath.mpf(gamma))
    sign = 1 if role == "query" else -1  # queries shrink past the centre, keys grow
    for j in (0, 3, 17):
        if role == "query":
            target = 0.5 + 2.0**-bits * j + 2.0 ** -(bits + 1)  # a midpoint of fmt
        else:
            target = 1.25 + 2.0 ** -(bits - 1) * j + 2.0**-bits
        scale_base = float(sign * (position - centre) * mpmath.log(zeta0) / mpmath.log(target))
        scales = posenc.xpos_scales(
            [position], d, gamma=gamma, scale_base=scale_base, centre=centre, role=role,
            dtype=fmt, layout="half",
        )  # fmt: skip
        exact = mp_xpos_scale(position, 0, d, gamma, sign * scale_base, centre)
        assert float(scales[0, 0]) == mp_round(exact, fmt) == float(scales[0, d // 2]), (j, exact)
        value = float(
            posenc.xpos_scales(
                [position], d, gamma=gamma, scale_base=scale_base, centre=centre, role=role,
                dtype="float64", layout="half",
            )[0, 0]
        )  # fmt: skip
        below = round_to_format(np.array([value * (1 - SCALE_ERROR)]), fmt)
        assert below != round_to_format(np.array([value * (1 + SCALE_ERROR)]), fmt)
