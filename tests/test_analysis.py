"""posenc.analysis: right answers against brute force and closed forms, clear refusals,
and a memory guard whose estimate is never below the measured peak."""

from __future__ import annotations

import math
import tracemalloc
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

import posenc
from posenc.analysis import MAX_DIGITS, MIN_DIGITS
from posenc.core.frequencies import frequency_table
from posenc.core.positions import MemoryLimitError
from posenc.core.sinusoidal import layout_permutation

# ---------------------------------------------------------------------------------------
# min_pairwise_distance against an exact brute force (Fractions: no rounding at all).


def exact_closest(table: np.ndarray) -> tuple[Fraction, list[tuple[int, int]]]:
    """The exact smallest squared distance and every pair that has it."""
    rows = [[(Fraction(float(z.real)), Fraction(float(z.imag))) for z in row] for row in table]
    squares = {}
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            squares[i, j] = sum(
                (a - c) ** 2 + (b - e) ** 2 for (a, b), (c, e) in zip(rows[i], rows[j], strict=True)
            )
    best = min(squares.values())
    return best, [pair for pair, value in squares.items() if value == best]


def exact_square(table: np.ndarray, i: int, j: int) -> Fraction:
    return sum(
        (Fraction(float(a.real)) - Fraction(float(b.real))) ** 2
        + (Fraction(float(a.imag)) - Fraction(float(b.imag))) ** 2
        for a, b in zip(table[i], table[j], strict=True)
    )


def assert_closest(table: np.ndarray, **kwargs: object) -> posenc.ClosestPair:
    """The reported pair is an exact closest pair up to rounding, its distance right."""
    pair = posenc.min_pairwise_distance(table, **kwargs)
    best, pairs = exact_closest(np.asarray(table))
    assert pair.first < pair.second
    reported = exact_square(np.asarray(table), pair.first, pair.second)
    assert reported <= best * (1 + Fraction(1, 10**13)), (pair, pairs)
    with mpmath.workdps(30):  # the square root of the exact Fraction (no underflow)
        expected = float(mpmath.sqrt(mpmath.mpf(best.numerator) / best.denominator))
    assert pair.distance == pytest.approx(expected, rel=1e-14, abs=0)
    if best == 0:  # exact ties at 0: the first pair in row-major order
        assert (pair.first, pair.second) == pairs[0]
    return pair


entries = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, 0.5]),  # duplicates and exact ties
    st.floats(-1e3, 1e3, allow_nan=False),
)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    rows=st.integers(2, 9),
    width=st.integers(1, 4),
    complex_=st.booleans(),
    block=st.sampled_from([None, 1, 2, 3, 100]),
)
def test_min_pairwise_distance_is_the_brute_force_minimum(data, rows, width, complex_, block):
    values = data.draw(st.lists(entries, min_size=rows * width * 2, max_size=rows * width * 2))
    table = np.array(values[: rows * width]).reshape(rows, width)
    if complex_:  # distances of C^d: sum of |a_k - b_k|²
        table = table + 1j * np.array(values[rows * width :]).reshape(rows, width)
    pair = assert_closest(table, block=block)
    assert posenc.min_pairwise_distance(table, block=1) == pair  # the block changes nothing


def test_complex_rows_are_vectors_of_c_d_not_their_real_parts():
    table = np.array([[1 + 0j, 0], [1 + 1e-3j, 0], [1.5 + 0j, 0]])
    pair = posenc.min_pairwise_distance(table)
    assert (pair.first, pair.second, pair.distance) == (0, 1, pytest.approx(1e-3, rel=1e-12))
    assert posenc.min_pairwise_distance(table.astype(np.complex64)).first == 0
    # the same as the real table of real and imaginary parts side by side
    real = np.concatenate([table.real, table.imag], axis=1)
    assert posenc.min_pairwise_distance(real).distance == pair.distance


def test_large_norms_and_tiny_differences_are_ranked_right():
    # |rows|² ~ 1e16: a Gram matrix alone has errors ~1, the distances are 1e-6 and 2e-6.
    step = 2.0**-20
    table = np.array([[1e8, 0.0], [1e8, 2 * step], [1e8 + step, 3 * step], [1e8, 5 * step]])
    pair = assert_closest(table)
    assert (pair.first, pair.second, pair.distance) == (1, 2, pytest.approx(step * math.sqrt(2)))


@pytest.mark.parametrize("scale", [1e-200, 1e-310, 1e140])
def test_tiny_and_huge_entries_neither_underflow_nor_overflow(scale):
    table = scale * np.array([[0.0, 1.0], [3.0, 5.0], [2.0, 1.0]])
    pair = posenc.min_pairwise_distance(table)
    expected = float(np.hypot(*(table[2] - table[0])))
    assert (pair.first, pair.second) == (0, 2)
    assert pair.distance == pytest.approx(expected, rel=1e-15)
    assert pair.distance > 0


def test_integer_tables_are_exact():
    table = np.array([[2**53, 0], [2**53 - 1, 0], [0, 7]], dtype=np.int64)
    assert posenc.min_pairwise_distance(table) == posenc.ClosestPair(1.0, 0, 1)
    narrow = np.array([[200, 3], [255, 3], [201, 3]], dtype=np.uint8)
    assert posenc.min_pairwise_distance(narrow) == posenc.ClosestPair(1.0, 0, 2)


def test_seed_table_closest_pair_is_a_neighbour():
    table = posenc.sinusoidal(300, 16, base=100, dtype="float64")
    pair = posenc.min_pairwise_distance(table, block=7)
    expected = posenc.offset_distances(1, 16, 100.0)
    assert pair.second - pair.first == 1
    assert pair.distance == pytest.approx(float(expected), rel=1e-14)


@pytest.mark.parametrize(
    ("table", "error", "match"),
    [
        (
            [[0.0, 1.0], [2.0, 3.0], [1.0, np.nan]],
            ValueError,
            r"table.*finite.*nan at row 2, column 1",
        ),
        ([[0.0, np.inf], [2.0, 3.0]], ValueError, r"table.*inf at row 0, column 1"),
        ([[0.0, 1.0], [-np.inf, 3.0]], ValueError, r"table.*-inf at row 1, column 0"),
        (np.array([[0, 1], [1, complex(0, np.nan)]]), ValueError, r"table.*row 1, column 1"),
        ([[0.0, 1e300], [2.0, 3.0]], ValueError, r"table.*2\*\*480.*1e\+300 at row 0, column 1"),
        (np.array([[2**60, 0], [0, 0]]), ValueError, r"integer table.*2\*\*53.*row 0, column 0"),
        (np.array([[2**64 - 1], [0]], np.uint64), ValueError, r"integer table.*2\*\*53"),
        ([[1.0, 2.0]], ValueError, r"table must be 2-D with at least two rows.*\(1, 2\)"),
        (np.zeros((0, 3)), ValueError, r"table.*at least two rows.*\(0, 3\)"),
        (np.zeros((5, 0)), ValueError, r"table.*one column.*\(5, 0\)"),
        ([1.0, 2.0, 3.0], ValueError, r"table must be 2-D.*\(3,\)"),
        (np.zeros((2, 2, 2)), ValueError, r"table must be 2-D.*\(2, 2, 2\)"),
        (5.0, ValueError, r"table must be 2-D.*\(\)"),
        (np.ones((3, 2), bool), TypeError, r"table must hold.*dtype bool"),
        ([["a", "b"], ["c", "d"]], TypeError, r"table must hold.*dtype <U1"),
        (np.ones((3, 2), object), TypeError, r"table must hold.*dtype object"),
        ([[1.0, 2.0], [3.0]], TypeError, r"table must be a 2-D array of numbers"),
        (np.ones((3, 2), np.longdouble), TypeError, r"table must hold.*float16/32/64"),
    ],
)
def test_min_pairwise_distance_refuses_bad_tables(table, error, match):
    if np.dtype(np.longdouble).itemsize == 8 and np.asarray(table).dtype == np.longdouble:
        pytest.skip("long double is float64 on this platform")
    with pytest.raises(error, match=match):
        posenc.min_pairwise_distance(table)


@pytest.mark.parametrize(
    ("block", "error", "match"),
    [
        (0, ValueError, "block must be an int >= 1, got 0"),
        (-3, ValueError, "block must be an int >= 1, got -3"),
        (1.5, TypeError, r"block must be an int >= 1, got 1\.5 \(float\)"),
        (True, TypeError, r"block must be an int >= 1, got True \(bool\)"),
        ("4", TypeError, r"block must be an int >= 1, got '4' \(str\)"),
    ],
)
def test_min_pairwise_distance_refuses_bad_blocks(block, error, match):
    with pytest.raises(error, match=match):
        posenc.min_pairwise_distance(np.eye(3), block=block)


# ---------------------------------------------------------------------------------------
# relative_map, offset_similarity, offset_distances: closed forms and tables.


def test_relative_map_split_is_the_permuted_interleaved_map():
    interleaved = posenc.relative_map(7.25, 12, 100.0)
    perm = layout_permutation(12, "interleaved", "split")
    split = posenc.relative_map(7.25, 12, 100.0, layout="split")
    assert_array_equal(split, interleaved[np.ix_(perm, perm)])


def test_relative_map_against_the_rotation_closed_form():
    omega = posenc.frequencies(6, 10.0, formula="tensor2tensor")
    expected = np.zeros((6, 6))
    for i, w in enumerate(omega):
        c, s = math.cos(3 * w), math.sin(3 * w)
        expected[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[c, s], [-s, c]]
    got = posenc.relative_map(3, 6, 10.0, formula="tensor2tensor")
    assert_allclose(got, expected, rtol=0, atol=1e-15)


def tables_at(positions: np.ndarray, d: int, base: float) -> np.ndarray:
    return posenc.sinusoidal(positions, d, base=base, dtype="float64")


@settings(max_examples=30, deadline=None)
@given(
    shape=st.sampled_from([(0,), (3,), (2, 3), (20,)]),
    d=st.sampled_from([2, 8, 1 << 14]),  # 1 << 14: several chunks of offsets
    base=st.sampled_from([0.5, 100.0, 10000.0]),
    data=st.data(),
)
def test_offset_functions_match_tables(shape, d, base, data):
    count = math.prod(shape)
    offsets = np.array(
        data.draw(st.lists(st.integers(-3000, 3000), min_size=count, max_size=count))
    )
    offsets = offsets.reshape(shape)
    pos = data.draw(st.integers(0, 10**6))
    here = tables_at(np.full(shape, pos), d, base)
    there = tables_at(pos + offsets, d, base)
    similarity = posenc.offset_similarity(offsets, d, base)
    distances = posenc.offset_distances(offsets, d, base)
    assert similarity.shape == distances.shape == shape
    tolerance = 1e-13 * d
    assert_allclose(similarity, (here * there).sum(axis=-1), rtol=0, atol=tolerance)
    assert_allclose(distances, np.linalg.norm(there - here, axis=-1), rtol=0, atol=tolerance)


@pytest.mark.parametrize(
    "call",
    [
        lambda: posenc.relative_map(2, 8, 1e-320, formula="tensor2tensor"),
        lambda: posenc.offset_similarity([1, 2], 8, 1e-320, formula="tensor2tensor"),
        lambda: posenc.offset_distances([1, 2], 66, 1e-300),
        lambda: posenc.precision_report([1], 66, 1e-300),
    ],
)
def test_bases_whose_frequencies_overflow_are_refused(call):
    with pytest.raises(ValueError, match=r"base"):
        call()


def test_odd_width_and_array_offsets_are_refused():
    for function in (posenc.offset_similarity, posenc.offset_distances):
        with pytest.raises(ValueError, match="even d_model, got 5"):
            function([1], 5)
        with pytest.raises(ValueError, match="offsets must be finite"):
            function([1, np.nan], 4)
    with pytest.raises(TypeError, match="k must be one number"):
        posenc.relative_map(np.array([1.0]), 4)


# ---------------------------------------------------------------------------------------
# precision_report: a reference precise enough, whatever digits is accepted.


@pytest.mark.parametrize(
    ("digits", "error"),
    [(0, ValueError), (17, ValueError), (MIN_DIGITS - 1, ValueError), (MAX_DIGITS + 1, ValueError),
     (-5, ValueError), (40.0, TypeError), (True, TypeError), ("40", TypeError)],
)  # fmt: skip
def test_precision_report_refuses_too_few_digits(digits, error):
    with pytest.raises(error, match=r"digits must be an int"):
        posenc.precision_report([1], 4, digits=digits)
    if error is ValueError and digits >= 0:
        with pytest.raises(ValueError, match=r"\[40, 1000\]"):
            posenc.precision_report([1], 4, digits=digits)


def test_the_fewest_accepted_digits_give_the_report_of_many():
    positions = [0, 1, 1e7, 2**53 - 1, -(2**52) + 0.5, 123456789.125]
    for base in (100.0, 10000.0):
        fewest = posenc.precision_report(positions, 16, base, digits=MIN_DIGITS)
        many = posenc.precision_report(positions, 16, base, digits=300)
        assert fewest == many


def test_precision_report_against_mpmath():
    position, d, base = 2**40 + 0.75, 8, 10000.0
    (row,) = posenc.precision_report([position], d, base)
    ours = posenc.sinusoidal([position], d, base=base, dtype="float32")[0].astype(np.float64)
    with mpmath.workdps(80):
        exact = []
        for j in range(d):
            angle = mpmath.mpf(position) * mpmath.power(base, -mpmath.mpf(2 * (j // 2)) / d)
            exact.append(mpmath.sin(angle) if j % 2 == 0 else mpmath.cos(angle))
        errors = [abs(mpmath.mpf(float(v)) - e) for v, e in zip(ours, exact, strict=True)]
        ulps = [2.0 ** (math.floor(math.log2(abs(float(e)))) - 23) for e in exact]
        # the report's reference is rounded to float64 (~1e-16 off): ~1e-8 of these
        # errors of a few 1e-8 (half a float32 ulp)
        assert row.posenc_max_abs_error == pytest.approx(float(max(errors)), rel=1e-7)
        worst = max(float(err) / u for err, u in zip(errors, ulps, strict=True))
    assert row.posenc_max_ulp_error == pytest.approx(worst, rel=1e-7)
    assert row.posenc_max_ulp_error <= 0.5  # correctly rounded


# ---------------------------------------------------------------------------------------
# The memory guard: max_bytes on every function, an estimate never below the peak.

CALLS = {
    "relative_map": (posenc.relative_map, (3.5, 64), {"layout": "split"}),
    "offset_similarity": (posenc.offset_similarity, (np.arange(300), 128), {}),
    "offset_distances": (posenc.offset_distances, (list(range(300)), 128), {}),
    "min_pairwise_distance": (posenc.min_pairwise_distance, (np.eye(40),), {"block": 8}),
    "precision_report": (posenc.precision_report, ([1.0, 1e7], 16), {}),
}


def estimate(name: str) -> int:
    """The peak the guard computes, read from its refusal at max_bytes=0."""
    function, args, kwargs = CALLS[name]
    with pytest.raises(MemoryLimitError) as info:
        function(*args, **kwargs, max_bytes=0)
    assert info.value.nbytes is not None
    return info.value.nbytes


@pytest.mark.parametrize("name", sorted(CALLS))
def test_max_bytes_refuses_just_above_and_allows_at_the_estimate(name):
    function, args, kwargs = CALLS[name]
    nbytes = estimate(name)
    with pytest.raises(MemoryLimitError, match="max_bytes=") as info:
        function(*args, **kwargs, max_bytes=nbytes - 1)
    assert isinstance(info.value, ValueError)
    assert info.value.max_bytes == nbytes - 1
    expected = function(*args, **kwargs, max_bytes=None)
    result = function(*args, **kwargs, max_bytes=nbytes)
    assert repr(result) == repr(expected)


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize(
    ("max_bytes", "error"),
    [("1e9", TypeError), (1.5e9, TypeError), (True, TypeError), (-1, ValueError)],
)
def test_bad_max_bytes_is_refused(name, max_bytes, error):
    function, args, kwargs = CALLS[name]
    with pytest.raises(error, match="max_bytes must be an int >= 0 or None"):
        function(*args, **kwargs, max_bytes=max_bytes)


def test_a_huge_relative_map_is_refused_not_a_memory_error():
    with pytest.raises(
        MemoryLimitError, match=r"100000 x 100000 relative map .*74\.5 GiB.*max_bytes"
    ):
        posenc.relative_map(5, 10**5)
    with pytest.raises(MemoryLimitError, match="max_bytes"):
        posenc.offset_distances(np.zeros(10**9, np.int8), 2)
    with pytest.raises(MemoryLimitError, match="max_bytes"):
        posenc.min_pairwise_distance(np.zeros((10**5, 10**4), np.int8))


def peak_and_estimate(function, args, kwargs) -> tuple[int, int]:
    frequency_table.cache_clear()  # the frequencies' cost too
    with pytest.raises(MemoryLimitError) as info:
        function(*args, **kwargs, max_bytes=0)
    nbytes = info.value.nbytes
    assert nbytes is not None
    tracemalloc.start()
    try:
        function(*args, **kwargs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, nbytes


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(CALLS)),
    size=st.integers(1, 400),
    width=st.sampled_from([2, 8, 64, 512]),
    block=st.sampled_from([None, 1, 7, 64]),
    complex_=st.booleans(),
)
def test_the_estimate_is_never_below_the_measured_peak(name, size, width, block, complex_):
    rng = np.random.default_rng(size)
    if name == "relative_map":
        args, kwargs = (1.5, 4 * width), {"layout": "split" if complex_ else "interleaved"}
    elif name in ("offset_similarity", "offset_distances"):
        args, kwargs = (rng.uniform(-1e6, 1e6, 20 * size), width), {}
    elif name == "min_pairwise_distance":
        table = rng.normal(size=(size + 1, width // 2 + 1))
        table = table + 1j * table[::-1] if complex_ else table.astype(np.float32)
        args, kwargs = (table,), {"block": block}
    else:
        args, kwargs = (rng.uniform(-(2**40), 2**40, size // 40 + 1), width // 2), {}
    peak, nbytes = peak_and_estimate(CALLS[name][0], args, kwargs)
    assert peak <= nbytes, (name, peak, nbytes)
