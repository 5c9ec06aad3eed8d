"""ALiBi slopes and biases (reference code, BLOOM, closed forms, properties) and NoPE."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

import posenc
from posenc.core.alibi import alibi_bias, alibi_bias_values, alibi_slopes
from posenc.core.nope import nope as nope_table
from posenc.core.precision import round_to_format

mpmath = pytest.importorskip("mpmath")


def get_slopes(n):
    """The reference implementation, as in ofirpress/attention_with_linear_biases
    (fairseq/models/transformer.py, ``get_slopes``)."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def exact_slope(numerator, denominator):
    """``2^(numerator/denominator)`` correctly rounded to float64, with mpmath."""
    with mpmath.workprec(200):
        return float(mpmath.power(2, mpmath.mpf(numerator) / denominator))


NON_POWERS_OF_TWO = [3, 5, 6, 7, 12, 20, 24, 40, 48, 112]


# ---------------------------------------------------------------------------------------
# Slopes


@pytest.mark.parametrize("n", range(1, 65))
def test_slopes_match_the_reference_code(n):
    ours = alibi_slopes(n)
    reference = np.array(get_slopes(n))
    assert ours.dtype == np.float64
    assert ours.shape == (n,)
    # The reference raises a rounded float64 start to the power i, so its error grows
    # with i (14 ulp at most for n <= 64); ours are correctly rounded (next test).
    assert np.all(np.abs(ours - reference) <= 16 * np.spacing(reference))
    assert ours[0] == reference[0]


@pytest.mark.parametrize("n", [*range(1, 129), 256, 1000])
def test_slopes_are_the_correctly_rounded_closed_form(n):
    c = 2 ** math.floor(math.log2(n))
    expected = [exact_slope(-8 * (h + 1), c) for h in range(c)]
    expected += [exact_slope(-4 * (2 * m + 1), c) for m in range(n - c)]
    assert alibi_slopes(n).tolist() == expected


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64, 128])
def test_power_of_two_slopes_are_a_geometric_sequence(n):
    assert alibi_slopes(n).tolist() == [2.0 ** (-8 * (i + 1) / n) for i in range(n)]


def test_slopes_of_non_power_of_two_head_counts():
    # 12 heads: the 8 slopes of 8 heads, then 4 of the 16 of 16 heads (every other one).
    assert alibi_slopes(12).tolist() == [
        *(2.0**-k for k in range(1, 9)),
        *(2.0 ** -(k + 0.5) for k in range(4)),
    ]
    # 20 heads: 16 heads' 2^(-k/2), then 2^(-(2m+1)/4) for m = 0..3.
    assert alibi_slopes(20).tolist() == [
        *(2.0 ** -(k / 2) for k in range(1, 17)),
        *(2.0 ** -((2 * m + 1) / 4) for m in range(4)),
    ]
    for n in NON_POWERS_OF_TWO:
        c = 2 ** math.floor(math.log2(n))
        slopes = alibi_slopes(n)
        assert_array_equal(slopes[:c], alibi_slopes(c))
        assert_array_equal(slopes[c:], alibi_slopes(2 * c)[0::2][: n - c])
        assert len(set(slopes.tolist())) == n


def test_slopes_are_a_fresh_writable_copy():
    slopes = alibi_slopes(8)
    slopes[0] = 7.0
    assert alibi_slopes(8)[0] == 0.5


# ---------------------------------------------------------------------------------------
# BLOOM (Hugging Face): the per-key form slope · j


bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, *NON_POWERS_OF_TWO])
def test_slopes_match_bloom(n):
    # BLOOM raises a float32 base to integer powers in float32.
    theirs = bloom._get_alibi_slopes(n, torch.device("cpu")).numpy().astype(np.float64)
    assert_allclose(alibi_slopes(n), theirs, rtol=2e-6, atol=0)
    if n <= 8:  # powers of two: exact in float32 too
        assert_array_equal(alibi_slopes(n), theirs)


def bloom_alibi(mask, num_heads):
    """BLOOM's bias as float64, shape (batch, heads, key)."""
    mask = torch.tensor(mask)
    out = bloom.build_alibi_tensor(mask, num_heads, torch.float64).numpy()
    return out.reshape(mask.shape[0], num_heads, mask.shape[1])


@pytest.mark.parametrize("num_heads", [1, 2, 4, 8, 12, 20, 24, 40, 48, 112])
def test_bloom_is_the_causal_bias_plus_a_constant_per_query(num_heads):
    # BLOOM adds slope·j for key j; ours is -slope·(i - j) for j <= i. The difference is
    # slope·i, the same for every key of query i, which softmax ignores.
    length = 37
    theirs = bloom_alibi([[1] * length], num_heads)[0]  # (H, K)
    ours = alibi_bias(length, num_heads=num_heads, dtype="float64")
    i, j = np.tril_indices(length)
    shifted = theirs[:, j] - theirs[:, i]  # slope·j - slope·i, (H, pairs)
    if num_heads <= 8:  # power-of-two slopes >= 2^-8: every value exact in float32
        assert_array_equal(ours[:, i, j], shifted)
    else:
        assert_allclose(ours[:, i, j], shifted, rtol=0, atol=4e-6)


@pytest.mark.parametrize("num_heads", [8, 12])
def test_bloom_and_ours_give_the_same_attention(num_heads):
    length = 23
    rng = np.random.default_rng(num_heads)
    logits = rng.standard_normal((num_heads, length, length))
    future = np.triu(np.ones((length, length), bool), 1)

    def attention(bias):
        scores = np.where(future, -np.inf, logits + bias)
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        return weights / weights.sum(axis=-1, keepdims=True)

    theirs = bloom_alibi([[1] * length], num_heads)[0][:, None, :]  # (H, 1, K)
    ours = alibi_bias(length, num_heads=num_heads, dtype="float64")
    assert_allclose(attention(ours), attention(theirs), rtol=0, atol=1e-6)


def test_bloom_left_padding_keeps_the_relative_bias():
    # BLOOM numbers the keys from each row's first real token ((cumsum - 1) · mask), so
    # with p pad tokens on the left the real keys get slope·(j - p). Differences within
    # a row are still slope·(j - i): our bias over absolute positions, or the unpadded
    # bias shifted by p (ALiBi depends only on j - i).
    num_heads, length = 8, 12
    pads = [0, 3, 5]
    mask = [[0] * p + [1] * (length - p) for p in pads]
    theirs = bloom_alibi(mask, num_heads)  # (B, H, K)
    full = alibi_bias(length, num_heads=num_heads, dtype="float64")
    for b, p in enumerate(pads):
        assert np.all(theirs[b, :, :p] == 0)  # padded keys: masked anyway
        unpadded = alibi_bias(length - p, num_heads=num_heads, dtype="float64")
        assert_array_equal(full[:, p:, p:], unpadded)
        for i in range(p, length):
            shifted = theirs[b, :, p : i + 1] - theirs[b, :, i : i + 1]
            assert_array_equal(full[:, i, p : i + 1], shifted)


# ---------------------------------------------------------------------------------------
# The bias: closed form and properties


def reference_bias(q, k, num_heads, mode, offset):
    slopes = alibi_slopes(num_heads)
    out = np.zeros((num_heads, q, k))
    for h in range(num_heads):
        for i in range(q):
            p = offset + i
            for j in range(k):
                if mode == "symmetric":
                    out[h, i, j] = -slopes[h] * abs(p - j)
                elif j <= p:
                    out[h, i, j] = -slopes[h] * (p - j)
    return out


lengths = st.integers(0, 24)
heads = st.integers(1, 20)
modes = st.sampled_from(["causal", "symmetric"])


@settings(max_examples=80, deadline=None)
@given(lengths, lengths, heads, modes, st.integers(0, 1000))
def test_bias_closed_form(q, k, num_heads, mode, offset):
    ours = alibi_bias(q, k, num_heads=num_heads, mode=mode, offset=offset, dtype="float64")
    assert ours.shape == (num_heads, q, k)
    assert_array_equal(ours, reference_bias(q, k, num_heads, mode, offset))
    assert not np.signbit(ours[ours == 0]).any()  # +0.0, never -0.0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), heads, modes)
def test_bias_is_linear_in_distance_and_constant_along_diagonals(length, num_heads, mode):
    ours = alibi_bias(length, num_heads=num_heads, mode=mode, dtype="float64")
    slopes = alibi_slopes(num_heads)[:, None, None]
    i, j = np.indices((length, length))
    if mode == "symmetric":
        assert_array_equal(ours, -slopes * np.abs(i - j))
        assert_array_equal(ours, np.swapaxes(ours, 1, 2))
    else:
        assert_array_equal(ours, np.where(j <= i, -slopes * (i - j), 0.0))
        # causal + its transpose = symmetric (the diagonal is 0 in both).
        symmetric = alibi_bias(length, num_heads=num_heads, mode="symmetric", dtype="float64")
        assert_array_equal(ours + np.swapaxes(ours, 1, 2), symmetric)
    for diagonal in range(-length + 1, length):
        values = np.diagonal(ours, offset=diagonal, axis1=1, axis2=2)
        assert np.all(values == values[:, :1])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), heads, modes, st.data())
def test_decoding_with_an_offset_gives_rows_of_the_full_matrix(length, num_heads, mode, data):
    full = alibi_bias(length, num_heads=num_heads, mode=mode)
    start = data.draw(st.integers(0, length - 1))
    stop = data.draw(st.integers(start + 1, length))
    chunk = alibi_bias(stop - start, num_heads=num_heads, mode=mode, offset=start)
    assert_array_equal(chunk, full[:, start:stop, :stop])  # keys default to offset + q
    assert_array_equal(
        alibi_bias(1, length, num_heads=num_heads, mode=mode, offset=start),
        full[:, start : start + 1, :],
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("mode", ["causal", "symmetric"])
def test_each_dtype_is_the_rounded_float64_bias(dtype, mode):
    exact = alibi_bias(300, num_heads=12, mode=mode, offset=5000, dtype="float64")
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        ours = alibi_bias(300, num_heads=12, mode=mode, offset=5000, dtype=dtype)
        assert ours.dtype == ml_dtypes.bfloat16
    else:
        ours = alibi_bias(300, num_heads=12, mode=mode, offset=5000, dtype=dtype)
        assert ours.dtype == np.dtype(dtype)
    assert_array_equal(ours.astype(np.float64), round_to_format(exact, dtype).astype(np.float64))
    values = alibi_bias_values(300, num_heads=12, mode=mode, offset=5000, fmt=dtype)
    assert_array_equal(values.astype(np.float64), ours.astype(np.float64))
    assert values.flags.c_contiguous
    assert values.dtype == (np.float32 if dtype == "bfloat16" else np.dtype(dtype))


def test_bias_values_need_a_format_name():
    with pytest.raises(ValueError, match="fmt must be one of"):
        alibi_bias_values(3, num_heads=2, fmt="int8")


def test_framework_dtypes_are_accepted():
    assert alibi_bias(3, num_heads=2, dtype=torch.float16).dtype == np.float16
    assert alibi_bias(3, num_heads=2, dtype=np.float64).dtype == np.float64
    assert alibi_bias(3, num_heads=2).dtype == np.float32


def test_empty_and_default_shapes():
    assert alibi_bias(0, num_heads=4).shape == (4, 0, 0)
    assert alibi_bias(0, 5, num_heads=4).shape == (4, 0, 5)
    assert alibi_bias(5, 0, num_heads=4).shape == (4, 5, 0)
    assert alibi_bias(2, num_heads=3, offset=7).shape == (3, 2, 9)


# ---------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_heads": 0}, ValueError, "num_heads must be an int >= 1, got 0"),
        ({"num_heads": -8}, ValueError, "num_heads must be an int >= 1, got -8"),
        ({"num_heads": 8.0}, TypeError, r"num_heads must be an int >= 1, got 8.0 \(float\)"),
        ({"num_heads": True}, TypeError, "num_heads must be an int"),
        ({"num_heads": "8"}, TypeError, "num_heads must be an int"),
        ({"num_heads": 8, "mode": "bidirectional"}, ValueError,
         r"mode must be one of \['causal', 'symmetric'\], got 'bidirectional'"),
        ({"num_heads": 8, "mode": None}, TypeError, "mode must be one of"),
        ({"num_heads": 8, "offset": -1}, ValueError, "offset must be an int >= 0, got -1"),
        ({"num_heads": 8, "offset": 1.0}, TypeError, "offset must be an int"),
        ({"num_heads": 8, "dtype": "int32"}, TypeError, "dtype must be one of float16"),
        ({"num_heads": 8, "max_bytes": 100}, ValueError, "this ALiBi bias would need about"),
    ],
)  # fmt: skip
def test_bad_bias_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        alibi_bias(10, **kwargs)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((-1,), ValueError, "query_length must be an int >= 0, got -1"),
        ((4, -2), ValueError, "key_length must be an int >= 0, got -2"),
        ((4.0,), TypeError, "query_length must be an int"),
        ((True,), TypeError, "query_length must be an int"),
        ((4, np.float32(3)), TypeError, "key_length must be an int"),
    ],
)
def test_bad_lengths(args, error, match):
    with pytest.raises(error, match=match):
        alibi_bias(*args, num_heads=4)


def test_num_heads_is_required_and_keyword_only():
    with pytest.raises(TypeError):
        alibi_bias(4)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        alibi_bias(4, 4, 8)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [(0, ValueError, "got 0"), (2.5, TypeError, "got 2.5"), (None, TypeError, "got None")],
)
def test_bad_slope_head_counts(value, error, match):
    with pytest.raises(error, match=f"num_heads must be an int >= 1, {match}"):
        alibi_slopes(value)


def test_huge_biases_are_refused_before_any_work():
    with pytest.raises(ValueError, match=r"ALiBi bias would need about 64.0 GiB"):
        alibi_bias(2**16, num_heads=4)
    assert alibi_bias(3, num_heads=1, max_bytes=None).shape == (1, 3, 3)


# ---------------------------------------------------------------------------------------
# NoPE


@pytest.mark.parametrize(
    ("positions", "shape"),
    [(5, (5, 8)), (0, (0, 8)), (np.arange(7), (7, 8)), (np.zeros((2, 3)), (2, 3, 8)),
     (np.array(4.5), (8,)), ([1, 2], (2, 8))],
)  # fmt: skip
def test_nope_shape_and_values(positions, shape):
    table = nope_table(positions, 8)
    assert table.shape == shape
    assert table.dtype == np.float32
    assert not table.any()
    assert not np.signbit(table).any()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", np.float64, "bfloat16"])
def test_nope_dtypes(dtype):
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        assert nope_table(3, 2, dtype=dtype).dtype == ml_dtypes.bfloat16
    else:
        assert nope_table(3, 2, dtype=dtype).dtype == np.dtype(dtype)
    assert nope_table(3, 2, dtype=torch.float16).dtype == np.float16


@pytest.mark.parametrize(
    ("positions", "d_model", "kwargs", "error", "match"),
    [
        (-1, 4, {}, ValueError, r"positions \(a length\) must be an int >= 0, got -1"),
        (2.0, 4, {}, TypeError, "got the float 2.0"),
        (True, 4, {}, TypeError, "positions must be an int length or an array of numbers"),
        ([np.nan], 4, {}, ValueError, "positions must be finite"),
        (["a"], 4, {}, TypeError, "positions must hold integers or real numbers"),
        (3, 0, {}, ValueError, "d_model must be an int >= 1, got 0"),
        (3, 4.0, {}, TypeError, "d_model must be an int"),
        (3, 4, {"dtype": "int8"}, TypeError, "dtype must be one of"),
    ],
)
def test_nope_bad_input(positions, d_model, kwargs, error, match):
    with pytest.raises(error, match=match):
        nope_table(positions, d_model, **kwargs)


# ---------------------------------------------------------------------------------------


def test_a_head_count_past_the_limit_is_refused_at_once():
    from posenc.core.alibi import MAX_HEADS

    with pytest.raises(
        ValueError, match=r"num_heads must be at most 65536 \(2\*\*16\), got 1000000"
    ):
        posenc.alibi_slopes(10**6)
    with pytest.raises(ValueError, match="num_heads must be at most 65536"):
        posenc.alibi_bias(4, num_heads=MAX_HEADS + 1)
