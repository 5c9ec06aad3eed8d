"""The core's numbers at their edges: huge ints, bases and factors whose results leave
float64, the ±2**53 boundary of positions, and the parameters a RoPE scaling's formula
needs. Each case gives the exact answer (mpmath, closed forms) or one clear refusal."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import posenc
from posenc._checks import MemoryLimitError, format_bytes
from posenc.core.rope.tables import rope_table_values

B53 = 2**53
BOUNDARY = (
    r"must lie within ±2\*\*53 = ±9007199254740992 \(where every integer is an exact float64\)"
)


# -- 1. a scaling whose rule needs base > 1 ------------------------------------------------

NEEDS_BASE_ABOVE_ONE = {
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 2048},
    "ntk": {"factor": 4.0},
    "dynamic_ntk": {"factor": 4.0, "original_max_position_embeddings": 2048},
    "proportional": {"partial_rotary_factor": 0.5},
}


@pytest.mark.parametrize("name", sorted(NEEDS_BASE_ABOVE_ONE))
@pytest.mark.parametrize("base", [0.5, 1e-3, 0.999999])
def test_a_scaling_built_on_falling_frequencies_refuses_a_base_below_1(name, base):
    with pytest.raises(ValueError, match=rf"base must be .* > 1 with RoPE scaling '{name}'.*got"):
        posenc.rope_scaling(name, 64, base, **NEEDS_BASE_ABOVE_ONE[name])


def test_the_yarn_ramp_at_base_below_1_is_refused_not_inverted():
    with pytest.raises(ValueError, match=r"base must be a finite real number > 1 .* got 0\.5"):
        posenc.rope_scaling("yarn", 64, base=0.5, factor=4, original_max_position_embeddings=2048)


def test_rules_of_one_frequency_at_a_time_take_a_base_below_1():
    # Closed forms: θ_i = 0.5^(-2i/d) rise; linear divides each, llama3 keeps every
    # wavelength below L₀/high (all of them here: λ <= 2π), default is θ itself.
    d, base = 8, 0.5
    theta = np.array([float(mpmath.mpf(base) ** (mpmath.mpf(-2 * i) / d)) for i in range(d // 2)])
    np.testing.assert_array_equal(posenc.rope_frequencies(d, base), theta)
    np.testing.assert_array_equal(posenc.rope_scaling("default", d, base)[0], theta)
    np.testing.assert_array_equal(posenc.rope_scaling("linear", d, base, factor=4.0)[0], theta / 4)
    llama3 = posenc.rope_scaling(
        "llama3", d, base, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=1024,
    )  # fmt: skip
    np.testing.assert_array_equal(llama3[0], theta)


# -- 2. YaRN's mscale ratio ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mscale", "mscale_all_dim", "named"),
    [
        (1.0, -7.213475204444817, "mscale_all_dim"),  # the denominator is 0 at factor 4
        (-7.213475204444817, 1.0, "mscale"),  # the numerator is 0
        (-10.0, 1.0, "mscale"),
        (1.0, -8.0, "mscale_all_dim"),
    ],
)
def test_yarn_refuses_an_mscale_whose_temperature_is_not_positive(mscale, mscale_all_dim, named):
    bound = -10 / math.log(4)  # 0.1·m·ln 4 + 1 > 0 ⇔ m > -10/ln 4 = -7.21348
    with pytest.raises(ValueError, match=rf"^{named} must be a finite real number > {bound:.6g} "):
        posenc.rope_scaling(
            "yarn", 64, factor=4, original_max_position_embeddings=2048,
            mscale=mscale, mscale_all_dim=mscale_all_dim,
        )  # fmt: skip


def test_yarn_refuses_an_mscale_whose_temperature_overflows():
    with pytest.raises(ValueError, match=r"^mscale must be a finite real number > .* got 1e\+308"):
        posenc.YarnScaling(
            factor=1e300, original_max_position_embeddings=8, mscale=1e308, mscale_all_dim=1.0
        )


def test_yarn_mscale_ratio_is_the_closed_form():
    _, attention = posenc.rope_scaling(
        "yarn", 64, factor=4, original_max_position_embeddings=2048, mscale=2.0, mscale_all_dim=-3.0
    )
    assert attention == (0.2 * math.log(4) + 1) / (-0.3 * math.log(4) + 1)


# -- 3. huge ints and results past float64 --------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: posenc.rope_scaling("linear", 64, factor=10**400), r"^factor must .* 1\.00000e\+400$"),
        (lambda: posenc.sinusoidal(4, 4, base=10**400), r"^base must .* got 1\.00000e\+400$"),
        (lambda: posenc.sinusoidal(4, 4, base=-(10**400)), r"^base must .* got -1\.00000e\+400$"),
        (lambda: posenc.rope_frequencies(8, 2**1100), r"^base must .* got 1\.35830e\+331$"),
        (lambda: posenc.frequencies(2**1100), r"^d_model must be at most 2\*\*24 .* 1\.35830e\+331$"),
        (lambda: posenc.rope_tables(3, [1.0], scale=10**400), r"^scale must .* 1\.00000e\+400$"),
        (lambda: posenc.alibi_slopes(10**400), r"num_heads"),
        (
            lambda: posenc.attention_temperature([1], floor_scale=10**400, attn_scale=0.1),
            r"^floor_scale must .* 1\.00000e\+400$",
        ),
        (lambda: posenc.rope_scaling("linear", 64, factor=1e308), r"factor=1e\+308.*underflow"),
        (lambda: posenc.frequencies(4, 5e-324, formula="tensor2tensor"), r"^base must be large"),
        (lambda: posenc.wavelengths(4, 1e308, formula="tensor2tensor"), r"^base must be small"),
        (lambda: posenc.sinusoidal(4, 4, base=1e-300), r"^base makes angles of .* turns"),
        (lambda: posenc.sinusoidal([B53], 4, base=1e-3), r"^base makes angles of .* turns"),
        (lambda: posenc.rope_tables([B53], [10.0]), r"^inv_freq makes angles of .* turns"),
    ],
)  # fmt: skip
def test_numbers_past_float64_are_refused_in_one_line(call, message):
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


def test_a_table_of_a_huge_length_is_refused_by_its_size_or_its_positions():
    # 2**1100 rows of 8 float64: 2**1106 bytes = 2**1066 TiB
    tib = mpmath.nstr(mpmath.mpf(2) ** 1066, 3).replace("e+", r"e\+")
    with pytest.raises(MemoryLimitError, match=rf"^this NoPE table would need about {tib} TiB"):
        posenc.nope(2**1100, 8, dtype="float64")
    assert format_bytes(2**1100) == "1.24e+319 TiB"
    with pytest.raises(ValueError, match=rf"^positions {BOUNDARY}, got 1\.35830e\+331$"):
        posenc.sinusoidal(2**1100, 4)


def test_a_base_below_1_gives_exact_tables_while_the_angles_stay_small():
    # base 0.01 at d = 4: ω ≈ [1, 10]; position 10**12 is 1.6e12 turns, well inside 2**51.
    positions = [0, 3, 10**12, -(10**12)]
    got = posenc.sinusoidal(np.array(positions), 4, base=0.01, dtype="float32")
    np.testing.assert_array_equal(got, _sinusoidal_reference(positions, 4, 0.01).astype(np.float32))


def _bucket(distance: int, num_buckets: int, max_distance: int) -> int:
    """T5's bidirectional bucket of ``distance`` (key - query), exactly (mpmath)."""
    side = num_buckets // 2
    upper = side if distance > 0 else 0
    d, max_exact = abs(distance), side // 2
    if d < max_exact:
        return upper + d
    n = side - max_exact
    mpmath.mp.dps = 80
    log_bucket = mpmath.floor(n * mpmath.log(mpmath.mpf(d) / max_exact) / mpmath.log(
        mpmath.mpf(max_distance) / max_exact
    ))  # fmt: skip
    return upper + max_exact + min(int(log_bucket), n - 1)


@pytest.mark.parametrize("max_distance", [2**62, 2**63, 2**64 + 1, 10**30, 2**1100, 10**400])
def test_a_max_distance_past_every_int64_distance_is_the_closed_form(max_distance):
    top = 2**63 - 1
    distances = [0, 1, -1, 7, 8, -9, 100, 10**6, -(10**9), 10**15, 2**53, 2**62, top, -top]
    got = posenc.relative_position_bucket(
        np.array(distances), num_buckets=32, max_distance=max_distance, compat="exact"
    )
    want = [_bucket(d, 32, max_distance) for d in distances]
    np.testing.assert_array_equal(got, want)
    hf = posenc.relative_position_bucket(
        np.array(distances), num_buckets=32, max_distance=max_distance
    )
    np.testing.assert_array_equal(hf, want)  # no distance here sits on a float32 edge


def test_the_example_of_a_huge_max_distance():
    assert posenc.relative_position_bucket(5, max_distance=2**1100).tolist() == _bucket(
        5, 32, 2**1100
    )


# -- 4. the ±2**53 boundary ----------------------------------------------------------------------


def _sinusoidal_reference(positions: list[int], d: int, base: float) -> np.ndarray:
    mpmath.mp.dps = 60
    omegas = [mpmath.mpf(base) ** (mpmath.mpf(-2 * i) / d) for i in range(d // 2)]
    return np.array(
        [[f(p * w) for w in omegas for f in (mpmath.sin, mpmath.cos)] for p in positions],
        dtype=np.float64,
    )


def _rope_reference(positions: list[int], inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mpmath.mp.dps = 60
    thetas = [mpmath.mpf(float(t)) for t in inv_freq] * 2  # "half": [θ_0 .. θ_m-1] twice
    cos = np.array([[mpmath.cos(p * t) for t in thetas] for p in positions], dtype=np.float64)
    sin = np.array([[mpmath.sin(p * t) for t in thetas] for p in positions], dtype=np.float64)
    return cos, sin


EDGES = [B53, -B53, B53 - 1, -B53 + 1]


@pytest.mark.parametrize(
    "positions",
    [
        np.array(EDGES),  # gathered
        np.array(EDGES, dtype=np.float64),  # as floats
        np.array([B53 - 2, B53 - 1, B53]),  # a run that ends at the boundary
        np.array([-B53, -B53 + 1, -B53 + 2]),  # a run that starts at it
    ],
)
def test_sinusoidal_is_exact_at_the_boundary(positions):
    want = _sinusoidal_reference([int(p) for p in positions], 8, 100.0)
    got32 = posenc.sinusoidal(positions, 8, base=100.0, dtype="float32")
    np.testing.assert_array_equal(got32, want.astype(np.float32))  # correctly rounded
    got64 = posenc.sinusoidal(positions, 8, base=100.0, dtype="float64")
    np.testing.assert_allclose(got64, want, rtol=0, atol=4e-15)


@pytest.mark.parametrize(
    "positions",
    [np.array(EDGES), np.array(EDGES, dtype=np.float64), np.array([B53 - 2, B53 - 1, B53])],
)
def test_rope_tables_are_exact_at_the_boundary(positions):
    inv_freq = posenc.rope_frequencies(8, 10000.0)
    cos, sin = _rope_reference([int(p) for p in positions], inv_freq)
    got = posenc.rope_tables(positions, inv_freq, dtype="float32")
    np.testing.assert_array_equal(got[0], cos.astype(np.float32))
    np.testing.assert_array_equal(got[1], sin.astype(np.float32))
    got = posenc.rope_tables(positions, inv_freq, dtype="float64")
    np.testing.assert_allclose(got[0], cos, rtol=0, atol=4e-15)
    np.testing.assert_allclose(got[1], sin, rtol=0, atol=4e-15)


def test_a_run_given_by_its_start_reaches_the_boundary():
    inv_freq = posenc.rope_frequencies(4, 100.0)
    cos, sin = rope_table_values(3, inv_freq, fmt="float32", layout="half", start=B53 - 2)
    want = _rope_reference([B53 - 2, B53 - 1, B53], inv_freq)
    np.testing.assert_array_equal(cos, want[0].astype(np.float32))
    np.testing.assert_array_equal(sin, want[1].astype(np.float32))


@pytest.mark.parametrize(
    ("call", "shown"),
    [
        (lambda: posenc.sinusoidal([B53 + 1], 4), "9007199254740993"),
        (lambda: posenc.sinusoidal([-B53 - 1], 4), "-9007199254740993"),
        (lambda: posenc.sinusoidal(np.array([2.0**53 + 2]), 4), r"9007199254740994\.0"),
        (lambda: posenc.sinusoidal([B53 - 1, B53, B53 + 1], 4), "9007199254740993"),
        (lambda: posenc.rope_tables([B53 + 1], [1.0]), "9007199254740993"),
        (lambda: posenc.rope_tables([-B53 - 2, -B53 - 1], [1.0]), "-9007199254740994"),
        (
            lambda: rope_table_values(2, [1.0], fmt="float32", layout="half", start=B53),
            "9007199254740993",
        ),
        (lambda: posenc.relative_positions(1, offset=B53 + 1), "9007199254740993"),
    ],
)
def test_one_past_the_boundary_is_refused_in_the_same_words(call, shown):
    # (a call with query and key lengths also says what they were)
    with pytest.raises(ValueError, match=rf"^positions {BOUNDARY}, got {shown}($| \(the last of )"):
        call()
