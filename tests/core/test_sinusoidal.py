"""The NumPy core: exactness in every format, layouts, formulas, properties, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

import posenc
from posenc.core.precision import round_to_format

mpmath = pytest.importorskip("mpmath")
ml_dtypes = pytest.importorskip("ml_dtypes")


# ---------------------------------------------------------------------------------------
# An independent reference: exact values with mpmath, rounded by searching the format's
# full list of values (no floating-point rounding involved).


def _all_values(np_dtype) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        bits = np.arange(2**16, dtype=np.uint16).view(np_dtype).astype(np.float64)
    return np.unique(bits[np.isfinite(bits)])


_VALUES = {"float16": _all_values(np.float16), "bfloat16": _all_values(ml_dtypes.bfloat16)}


def _exact(position, d, base, digits=40) -> list:
    with mpmath.workdps(digits):
        k, n = mpmath.mpf(position), mpmath.mpf(base)
        out = []
        for j in range((d + 1) // 2):
            angle = k / n ** (mpmath.mpf(2 * j) / d)
            out += [mpmath.sin(angle), mpmath.cos(angle)]
        return out[:d]


def _round_exact(value, fmt) -> float:
    """Round an mpf to ``fmt`` (float16/bfloat16), ties to even, by exact comparison."""
    grid = _VALUES[fmt]
    i = int(np.searchsorted(grid, float(value)))
    candidates = grid[max(i - 2, 0) : i + 2]
    with mpmath.workdps(60):
        dist = [abs(mpmath.mpf(float(c)) - value) for c in candidates]
    best = min(dist)
    ties = [c for c, e in zip(candidates, dist, strict=True) if e == best]
    if len(ties) == 1:
        return float(ties[0])
    dtype = np.float16 if fmt == "float16" else ml_dtypes.bfloat16
    even = [c for c in ties if int(np.array(c).astype(dtype).view(np.uint16)) % 2 == 0]
    return float(even[0])


SAMPLE_POSITIONS = [0, 1, 2, 3, 100, 2**16 + 1, 999_999, 2**20, 5_000_000, 10_000_000]


@pytest.mark.parametrize("d", [8, 64, 512])
def test_float32_within_half_ulp_of_exact_up_to_1e7(d):
    table = posenc.sinusoidal(np.array(SAMPLE_POSITIONS), d, dtype=np.float32).astype(np.float64)
    for row, position in enumerate(SAMPLE_POSITIONS):
        exact = _exact(position, d, 10000)
        exact64 = np.array([float(v) for v in exact])
        ulp = np.spacing(np.abs(exact64).astype(np.float32)).astype(np.float64)
        error = np.abs(table[row] - exact64)
        assert np.all(error <= 0.5 * ulp + 1e-15), (position, (error / ulp).max())


def test_contiguous_range_is_exact_far_from_zero():
    # The fast path (coarse × fine phasors) anchored at 1e7.
    start, d = 10_000_000 - 37, 32
    table = posenc.sinusoidal(np.arange(start, start + 75), d, dtype=np.float64)
    for row in (0, 37, 74):
        exact = np.array([float(v) for v in _exact(start + row, d, 10000)])
        assert_allclose(table[row], exact, rtol=0, atol=2e-15)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [16, 128])
def test_low_precision_tables_are_correctly_rounded(fmt, d):
    positions = [*SAMPLE_POSITIONS, 1_234_567, 7_654_321]
    table = posenc.sinusoidal(np.array(positions), d, dtype=fmt).astype(np.float64)
    for row, position in enumerate(positions):
        expected = [_round_exact(v, fmt) for v in _exact(position, d, 10000)]
        assert_array_equal(table[row], expected, err_msg=f"position {position}")


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float32", "float64"])
def test_formats_agree_between_range_and_array_paths(fmt):
    fast = posenc.sinusoidal(3000, 24, dtype=fmt)
    general = posenc.sinusoidal(np.arange(3000) + 0.0, 24, dtype=fmt)  # float positions
    shuffled = np.random.default_rng(0).permutation(3000)
    gathered = posenc.sinusoidal(shuffled, 24, dtype=fmt)  # not a contiguous run
    assert fast.dtype == general.dtype == gathered.dtype
    # float64 values carry the two paths' own errors (~1e-16 each); rounded formats agree.
    atol = 2e-15 if fmt == "float64" else 0
    assert_allclose(fast.astype(np.float64), general.astype(np.float64), rtol=0, atol=atol)
    assert_allclose(fast[shuffled].astype(np.float64), gathered.astype(np.float64), atol=atol)


@pytest.mark.parametrize("start", [0, 5_000_000])
def test_long_range_builds_stay_accurate(start):
    # A million consecutive positions go three levels deep in the phasor recursion;
    # compare sampled rows with the per-element exact reduction.
    length, d = 1_000_000, 16
    table = posenc.sinusoidal(np.arange(start, start + length), d, dtype="float64")
    rows = np.random.default_rng(0).choice(length, 5000, replace=False)
    direct = posenc.sinusoidal(rows + float(start), d, dtype="float64")
    assert_allclose(table[rows], direct, rtol=0, atol=3e-15)


def test_threads_do_not_change_values():
    tables = [posenc.sinusoidal(3001, 64, threads=n) for n in (1, 2, 3)]
    split = [posenc.sinusoidal(3001, 63, layout="split", threads=n) for n in (1, 2)]
    assert_array_equal(tables[0], tables[1])
    assert_array_equal(tables[0], tables[2])
    assert_array_equal(split[0], split[1])
    with pytest.raises(ValueError, match="threads must be an int >= 1, got 0"):
        posenc.sinusoidal(10, 4, threads=0)


def test_peers_float32_angles_are_far_off_at_1e7():
    # What every peer does: float32 positions times float32 frequencies.
    position, d = 10_000_000, 64
    exact = np.array([float(v) for v in _exact(position, d, 10000)])
    omega = np.power(10000.0, -np.arange(0, d, 2) / d).astype(np.float32)
    angle = np.float32(position) * omega
    peer = np.empty(d)
    peer[0::2], peer[1::2] = np.sin(angle), np.cos(angle)
    assert np.abs(peer - exact).max() > 0.2
    ours = posenc.sinusoidal(np.array([position]), d)[0]
    assert np.abs(ours - exact).max() < 3e-8


# ---------------------------------------------------------------------------------------
# round_to_format against the exhaustive reference, ties included.


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_round_to_format_matches_exhaustive_rounding(fmt):
    rng = np.random.default_rng(1)
    grid = _VALUES[fmt]
    grid = grid[np.abs(grid) <= 4]
    mids = (grid[1:] + grid[:-1]) / 2  # exact ties
    values = np.concatenate(
        [
            rng.uniform(-1, 1, 2000),
            mids[::7],
            np.nextafter(mids[::7], np.inf),
            np.nextafter(mids[::7], -np.inf),
            [0.0, -0.0, 1e-30, -3e-41, 6e-8, 2.0**-24 * 1.5],
        ]
    )
    dtype = np.float16 if fmt == "float16" else ml_dtypes.bfloat16
    got = round_to_format(values, fmt).astype(dtype).astype(np.float64)
    with mpmath.workdps(60):
        want = [_round_exact(mpmath.mpf(float(v)), fmt) for v in values]
    assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------
# Layouts, formulas, odd widths.


@pytest.mark.parametrize("d", [1, 2, 3, 8, 9, 64])
@pytest.mark.parametrize("formula", ["paper", "tensor2tensor"])
def test_split_is_a_column_permutation_of_interleaved(d, formula):
    inter = posenc.sinusoidal(50, d, layout="interleaved", formula=formula, dtype="float64")
    split = posenc.sinusoidal(50, d, layout="split", formula=formula, dtype="float64")
    assert_array_equal(split, inter[:, posenc.layout_permutation(d, "interleaved", "split")])
    assert_array_equal(inter, split[:, posenc.layout_permutation(d, "split", "interleaved")])


def test_odd_width_is_a_prefix_of_the_next_even_width_with_the_same_frequencies():
    # d=7 uses ω_i = n^(-2i/7); its table is the first 7 columns of the d=8 table built
    # with those same four frequencies.
    d = 7
    omega = posenc.frequencies(d)
    assert omega.shape == (4,)
    angle = np.arange(20)[:, None] * omega
    expected = np.stack([np.sin(angle), np.cos(angle)], axis=-1).reshape(20, 8)[:, :d]
    assert_allclose(posenc.sinusoidal(20, d, dtype="float64"), expected, rtol=0, atol=1e-15)


def test_tensor2tensor_formula_matches_hugging_face_speech2text():
    torch = pytest.importorskip("torch")
    s2t = pytest.importorskip("transformers.models.speech_to_text.modeling_speech_to_text")
    length, d = 1024, 256
    theirs = s2t.Speech2TextSinusoidalPositionalEmbedding.get_embedding(length, d).numpy()
    ours = posenc.sinusoidal(length, d, layout="split", formula="tensor2tensor")
    # Theirs forms float32 angles: allow that error (position × 2^-23), nothing more.
    tolerance = np.arange(length)[:, None] * 2.0**-23 + 2e-7
    assert np.all(np.abs(ours - theirs) <= tolerance)
    # ... and the formulas really differ from the paper's.
    paper = posenc.sinusoidal(length, d, layout="split")
    assert np.abs(paper - theirs).max() > 0.1
    assert torch.get_default_dtype() == torch.float32


def test_tensor2tensor_frequencies_closed_form():
    d, n = 16, 10000.0
    inc = math.log(n) / (d // 2 - 1)
    assert_allclose(
        posenc.frequencies(d, n, formula="tensor2tensor"), np.exp(-inc * np.arange(8)), rtol=1e-15
    )
    assert posenc.frequencies(d, n, formula="tensor2tensor")[-1] == pytest.approx(1 / n, rel=1e-15)
    assert posenc.frequencies(2, n, formula="tensor2tensor").tolist() == [1.0]


def test_shapes():
    assert posenc.sinusoidal(0, 8).shape == (0, 8)
    assert posenc.sinusoidal(np.zeros((2, 3, 5)), 6).shape == (2, 3, 5, 6)
    assert posenc.sinusoidal(np.array(2.5), 6).shape == (6,)
    assert posenc.sinusoidal([[1, 2], [3, 4]], 4).shape == (2, 2, 4)
    assert posenc.sinusoidal(3, 4, dtype="float16").dtype == np.float16
    assert posenc.sinusoidal(3, 4, dtype="bfloat16").dtype == ml_dtypes.bfloat16
    assert posenc.sinusoidal(3, 4, dtype=np.float64).dtype == np.float64


def test_negative_and_fractional_positions_follow_the_formula():
    positions = np.array([-3.5, -1, 0.25, 1e-30, 12345.678])
    omega = posenc.frequencies(10, 100)
    angle = positions[:, None] * omega
    expected = np.stack([np.sin(angle), np.cos(angle)], axis=-1).reshape(5, 10)
    assert_allclose(
        posenc.sinusoidal(positions, 10, base=100, dtype="float64"), expected, atol=1e-12
    )


# ---------------------------------------------------------------------------------------
# The linear relation between positions (paper §3.5) and other properties.


@settings(max_examples=40, deadline=None)
@given(
    k=st.one_of(st.integers(-5000, 5000), st.floats(-1e4, 1e4, allow_nan=False)),
    half=st.integers(1, 40),
    base=st.sampled_from([2.0, 100.0, 10000.0, 500000.0]),
    layout=st.sampled_from(["interleaved", "split"]),
)
def test_relative_map_shifts_every_position(k, half, base, layout):
    d = 2 * half
    positions = np.array([0.0, 1.0, 17.0, 1234.5, -40.0])
    pe = posenc.sinusoidal(positions, d, base=base, layout=layout, dtype="float64")
    shifted = posenc.sinusoidal(positions + k, d, base=base, layout=layout, dtype="float64")
    m = posenc.relative_map(k, d, base, layout=layout)
    assert_allclose(pe @ m.T, shifted, rtol=0, atol=1e-12)
    assert_allclose(m @ m.T, np.eye(d), rtol=0, atol=1e-14)  # a rotation


def test_relative_map_composes():
    a, b = posenc.relative_map(3, 16, 100), posenc.relative_map(-11.5, 16, 100)
    assert_allclose(a @ b, posenc.relative_map(-8.5, 16, 100), rtol=0, atol=1e-14)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.integers(-2000, 2000))
def test_dot_product_depends_only_on_offset(pos, k):
    pe = posenc.sinusoidal(np.array([pos, pos + k]), 64, dtype="float64")
    assert pe[0] @ pe[1] == pytest.approx(posenc.offset_similarity(k, 64), abs=1e-12)
    assert np.linalg.norm(pe[1] - pe[0]) == pytest.approx(posenc.offset_distances(k, 64), abs=1e-12)


def test_min_pairwise_distance_brute_force():
    rng = np.random.default_rng(3)
    table = rng.normal(size=(70, 5))
    table[50] = table[13] + 1e-3
    closest = posenc.min_pairwise_distance(table, block=16)
    brute = min(
        (np.linalg.norm(table[i] - table[j]), i, j) for i in range(70) for j in range(i + 1, 70)
    )
    assert (closest.distance, closest.first, closest.second) == pytest.approx(brute)


def test_precision_report_shows_the_gap():
    rows = posenc.precision_report([10_000_000], d_model=64)
    assert rows[0].posenc_max_ulp_error <= 0.5 + 1e-6
    assert rows[0].float32_angle_max_abs_error > 0.2


# ---------------------------------------------------------------------------------------
# Bad input: clear errors naming the value.


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"positions": -1}, ValueError, "got -1"),
        ({"positions": 4.0}, TypeError, "float 4.0"),
        ({"positions": np.float32(4)}, TypeError, "float"),
        ({"positions": True}, TypeError, "bool"),
        ({"positions": [1.0, np.nan]}, ValueError, "finite.*nan"),
        ({"positions": [np.inf]}, ValueError, "finite.*inf"),
        ({"positions": ["a"]}, TypeError, "dtype <U1"),
        ({"positions": [1 + 2j]}, TypeError, "complex"),
        ({"positions": [[1, 2], [3]]}, TypeError, "array of numbers"),
        ({"positions": np.array([2**60])}, ValueError, "2\\*\\*53"),
        ({"d_model": 0}, ValueError, "d_model must be an int >= 1, got 0"),
        ({"d_model": -4}, ValueError, "got -4"),
        ({"d_model": 4.0}, TypeError, "4.0 \\(float\\)"),
        ({"d_model": True}, TypeError, "True \\(bool\\)"),
        ({"base": 0}, ValueError, "base must be a finite real number > 0, got 0"),
        ({"base": -10}, ValueError, "got -10"),
        ({"base": float("nan")}, ValueError, "nan"),
        ({"base": float("inf")}, ValueError, "inf"),
        ({"base": 1}, ValueError, "base=1 every frequency"),
        ({"base": "10000"}, TypeError, "'10000' \\(str\\)"),
        ({"layout": "halves"}, ValueError, "'interleaved', 'split'.*'halves'"),
        ({"formula": "fairseq"}, ValueError, "'paper', 'tensor2tensor'.*'fairseq'"),
        ({"dtype": np.int32}, TypeError, "float16, bfloat16, float32, float64"),
        ({"dtype": "float8"}, TypeError, "float8"),
    ],
)
def test_bad_input(kwargs, error, match):
    args = {"positions": 4, "d_model": 4} | kwargs
    positions, d_model = args.pop("positions"), args.pop("d_model")
    with pytest.raises(error, match=match):
        posenc.sinusoidal(positions, d_model, **args)


def test_huge_table_is_refused_with_its_size_unless_asked():
    with pytest.raises(ValueError, match=r"about 14\.9 TiB.*max_bytes=None"):
        posenc.sinusoidal(1_000_000_000, 4096)
    with pytest.raises(ValueError, match="max_bytes"):
        posenc.sinusoidal(np.zeros((1000, 1000)), 4096)
    small = posenc.sinusoidal(1000, 64, max_bytes=1000 * 64 * 4)
    assert small.shape == (1000, 64)
    with pytest.raises(ValueError, match="max_bytes"):
        posenc.sinusoidal(1000, 64, max_bytes=1000 * 64 * 4 - 1)


def test_relative_map_rejects_odd_width_and_arrays():
    with pytest.raises(ValueError, match="even d_model, got 5"):
        posenc.relative_map(1, 5)
    with pytest.raises(TypeError, match="one number"):
        posenc.relative_map([1, 2], 4)


def test_frequencies_and_wavelengths_validate():
    with pytest.raises(ValueError, match="base=1"):
        posenc.wavelengths(8, 1)
    with pytest.raises(ValueError, match="formula"):
        posenc.frequencies(8, formula="t5")


def test_import_posenc_loads_no_framework():
    import subprocess
    import sys

    code = (
        "import sys, posenc; posenc.sinusoidal(3, 4); "
        "bad = [m for m in ('torch', 'tensorflow', 'keras', 'matplotlib', 'jax') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class _FrameworkDtype:
    """Stands for a framework dtype object, known to posenc only by its printed name."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


@pytest.mark.parametrize(
    ("text", "expected"),
    [("torch.bfloat16", "bfloat16"), ("torch.float16", "float16"),
     ("<dtype: 'bfloat16'>", "bfloat16"), ("<dtype: 'float64'>", "float64")],
)  # fmt: skip
def test_framework_dtypes_are_read_by_their_whole_name(text, expected):
    table = posenc.sinusoidal(5, 4, dtype=_FrameworkDtype(text))
    assert table.dtype.name == expected


def test_start_needs_an_int_length_and_stays_exact():
    from posenc.core.sinusoidal import table_values

    options = {"base": 1e4, "layout": "interleaved", "formula": "paper", "fmt": "float64"}
    with pytest.raises(TypeError, match=r"start= applies only when positions is an int"):
        table_values([0, 5, 9], 4, start=3, **options)
    with pytest.raises(ValueError, match=r"within ±2\*\*53"):
        table_values(2, 4, start=2**60, **options)
    shifted = table_values(3, 4, start=1000, **options)
    assert_array_equal(shifted, posenc.sinusoidal(np.arange(1000, 1003), 4, dtype="float64"))


@pytest.mark.parametrize(
    ("d", "n", "formula"),
    [
        (64, 10000.0, "paper"),
        (4097, 500000.0, "paper"),
        (512, 10000.0, "tensor2tensor"),
        (200_001, 10000.0, "tensor2tensor"),
    ],
)
def test_frequencies_are_double_doubles_of_the_exact_values(d, n, formula):
    """``ω_i`` to float64 and ``ω_i / 2π`` as a double-double, against mpmath, for widths
    up to 200,001 (a million frequencies take milliseconds: no decimal arithmetic each)."""
    mpmath = pytest.importorskip("mpmath")
    from posenc.core.frequencies import frequency_table

    omega, hi, lo = frequency_table(d, n, formula)
    with mpmath.workdps(60):
        for i in np.unique(np.linspace(0, omega.size - 1, 60).astype(int)).tolist():
            if formula == "paper":
                exact = mpmath.mpf(n) ** (-mpmath.mpf(2 * i) / d)
            else:
                exact = mpmath.exp(-i * mpmath.log(n) / max(d // 2 - 1, 1))
            turns = exact / (2 * mpmath.pi)
            assert omega[i] == float(exact)
            assert (
                abs(mpmath.mpf(hi[i]) + mpmath.mpf(lo[i]) - turns) <= turns * mpmath.mpf(2) ** -102
            )


@pytest.mark.parametrize(
    ("positions", "message"),
    [
        (
            np.array([1.3e300]),
            r"positions must lie within ±2\*\*53 = ±9007199254740992 \(where every integer is an "
            r"exact float64\), got 1\.3e\+300",
        ),
        (np.array([0.5, -1e17]), r"got -1e\+17"),
        (np.array([2**60]), r"positions must lie within ±2\*\*53 .* got 1152921504606846976"),
    ],
)
def test_positions_past_2_53_are_refused_not_nan(positions, message):
    with pytest.raises(ValueError, match=message):
        posenc.sinusoidal(positions, 4)
