"""T5 relative position buckets and bias: Hugging Face's T5 as the reference, properties, bad input."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_array_equal

import posenc
from posenc.core import t5
from posenc.core.t5 import relative_position_bucket, relative_positions, t5_bias

torch = pytest.importorskip("torch")
modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
T5Config = pytest.importorskip("transformers").T5Config


def hf_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """Hugging Face's float32 bucket function (PyTorch, CPU)."""
    out = modeling_t5.T5Attention._relative_position_bucket(
        torch.from_numpy(np.asarray(relative_position, dtype=np.int64)),
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    return out.numpy()


def side_and_exact(bidirectional, num_buckets):
    side = num_buckets // 2 if bidirectional else num_buckets
    return side, side // 2


# ---------------------------------------------------------------------------------------
# Equality with Hugging Face


RANGE = np.arange(-100_000, 100_001)


@pytest.mark.parametrize("compat", ["hf", "exact"])
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets", [8, 32, 64])
@pytest.mark.parametrize("max_distance", [16, 128, 1000])
def test_buckets_equal_hugging_face(compat, bidirectional, num_buckets, max_distance):
    # On this grid (and on every setting T5-family checkpoints use) the float32 formula
    # and exact arithmetic put every |d| <= 10**5 in the same bucket.
    if max_distance <= side_and_exact(bidirectional, num_buckets)[1]:
        # HF divides by log(max_distance / max_exact) <= 0 and returns negative buckets.
        assert hf_bucket(RANGE, bidirectional, num_buckets, max_distance).min() < 0
        with pytest.raises(ValueError, match="max_distance must be > max_exact"):
            relative_position_bucket(
                RANGE,
                bidirectional=bidirectional,
                num_buckets=num_buckets,
                max_distance=max_distance,
                compat=compat,
            )
        return
    ours = relative_position_bucket(
        RANGE,
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
        compat=compat,
    )
    assert ours.dtype == np.int64
    assert_array_equal(ours, hf_bucket(RANGE, bidirectional, num_buckets, max_distance))


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets", [16, 24, 48, 128, 256])
@pytest.mark.parametrize("max_distance", [256, 512, 2048, 100_000])
def test_buckets_equal_hugging_face_wider_grid(bidirectional, num_buckets, max_distance):
    for compat in ("hf", "exact"):
        ours = relative_position_bucket(
            RANGE,
            bidirectional=bidirectional,
            num_buckets=num_buckets,
            max_distance=max_distance,
            compat=compat,
        )
        assert_array_equal(ours, hf_bucket(RANGE, bidirectional, num_buckets, max_distance))


def test_huge_distances_saturate_like_hugging_face():
    rp = np.array([-(2**62), -(2**40) - 1, -(2**24) - 1, 2**24 + 1, 2**53, 2**63 - 1])
    for bidirectional in (True, False):
        assert_array_equal(
            relative_position_bucket(rp, bidirectional=bidirectional),
            hf_bucket(rp, bidirectional, 32, 128),
        )


# Where float32 and exact arithmetic disagree. The exact value of the log-bucket formula
# y = n · ln(|d|/max_exact) / ln(max_distance/max_exact) is an integer, or within float32
# rounding of one, and float32 decides which side of the edge |d| lands on.


def exact_y(distance, num_buckets, max_distance):
    """``(floor(y), whether y is an integer)`` for a causal setting, in exact arithmetic."""
    max_exact = num_buckets // 2
    n = num_buckets - max_exact
    for k in range(n, -1, -1):  # largest k with (d/me)^n >= (md/me)^k
        left, right = Fraction(distance, max_exact) ** n, Fraction(max_distance, max_exact) ** k
        if left >= right:
            return k, left == right
    raise AssertionError("unreachable: k = 0 always holds for d >= max_exact")


@pytest.mark.parametrize(
    ("num_buckets", "max_distance", "differences"),
    [
        # {|d|: (bucket with compat="hf", with compat="exact")}
        # (12/8)^9 = (27/8)^3 and (18/8)^9 = (27/8)^6: y = 3 and y = 6 exactly.
        (17, 27, {12: (8 + 2, 8 + 3), 18: (8 + 5, 8 + 6)}),
        # y = 5.99999948..., which float32 rounds to 6.
        (15, 636, {206: (7 + 6, 7 + 5)}),
        # (14/2)^3 = (686/2)^1 and (98/2)^3 = (686/2)^2: y = 1 and y = 2 exactly.
        (5, 686, {14: (2 + 0, 2 + 1), 98: (2 + 1, 2 + 2)}),
    ],
)
def test_float32_and_exact_edges_differ_where_documented(num_buckets, max_distance, differences):
    options = {"bidirectional": False, "num_buckets": num_buckets, "max_distance": max_distance}
    rp = -np.arange(2 * max_distance)
    hf = relative_position_bucket(rp, **options, compat="hf")
    exact = relative_position_bucket(rp, **options, compat="exact")
    assert {int(d): (int(hf[d]), int(exact[d])) for d in np.nonzero(hf != exact)[0]} == differences
    for distance, (_, bucket) in differences.items():
        k, on_edge = exact_y(distance, num_buckets, max_distance)
        assert num_buckets // 2 + k == bucket
        assert on_edge == (distance != 206)
    # PyTorch's float32 log is not correctly rounded (about 3% of inputs are 1 ulp off),
    # so on an exact edge HF lands on either side; off the edges it follows float32.
    torch_buckets = hf_bucket(rp, False, num_buckets, max_distance)
    for distance, pair in differences.items():
        assert torch_buckets[distance] in pair
    if 206 in differences:
        assert torch_buckets[206] == differences[206][0]


# ---------------------------------------------------------------------------------------
# Properties


@st.composite
def bucket_options(draw):
    bidirectional = draw(st.booleans())
    num_buckets = draw(st.integers(4 if bidirectional else 2, 160))
    max_exact = side_and_exact(bidirectional, num_buckets)[1]
    max_distance = draw(st.integers(max_exact + 1, max(max_exact + 1, 3000)))
    compat = draw(st.sampled_from(["hf", "exact"]))
    return {
        "bidirectional": bidirectional,
        "num_buckets": num_buckets,
        "max_distance": max_distance,
        "compat": compat,
    }


@settings(max_examples=150, deadline=None)
@given(bucket_options())
def test_bucket_properties(options):
    side, max_exact = side_and_exact(options["bidirectional"], options["num_buckets"])
    md = options["max_distance"]
    distance = np.arange(0, 2 * md + 50)
    past = relative_position_bucket(-distance, **options)  # keys before the query
    future = relative_position_bucket(distance, **options)
    both = np.concatenate([past, future])
    assert both.min() >= 0
    assert both.max() < options["num_buckets"]
    # Monotone non-decreasing in |d| on each side.
    assert np.all(np.diff(past) >= 0)
    assert np.all(np.diff(future) >= 0)
    # Exact region: one bucket per distance.
    assert_array_equal(past[:max_exact], np.arange(max_exact))
    # Saturation: |d| >= max_distance is the last bucket of its side, and only those
    # past the last log edge are.
    assert np.all(past[md:] == side - 1)
    assert past[max_exact] == max_exact
    if options["bidirectional"]:
        # The future side is the past side shifted by num_buckets // 2 (d = 0 excepted).
        assert future[0] == 0
        assert_array_equal(future[1:], past[1:] + side)
        assert len(np.unique(future[1:max_exact])) == max_exact - 1
    else:
        assert np.all(future == 0)  # the query itself and the future keys


@settings(max_examples=100, deadline=None)
@given(bucket_options())
def test_float32_and_exact_differ_only_next_to_an_edge(options):
    distance = np.arange(0, 2 * options["max_distance"])
    hf = relative_position_bucket(-distance, **{**options, "compat": "hf"})
    exact = relative_position_bucket(-distance, **{**options, "compat": "exact"})
    assert np.abs(hf - exact).max() <= 1
    # Where they differ, y = n · ln(d/max_exact) / ln(max_distance/max_exact) is within
    # float32 rounding of an integer.
    max_exact = side_and_exact(options["bidirectional"], options["num_buckets"])[1]
    n = side_and_exact(options["bidirectional"], options["num_buckets"])[0] - max_exact
    d = distance[hf != exact]
    y = n * np.log(d / max_exact) / math.log(options["max_distance"] / max_exact)
    assert np.all(np.abs(y - np.rint(y)) < 1e-5)


@settings(max_examples=60, deadline=None)
@given(bucket_options(), st.integers(0, 40), st.integers(0, 40), st.integers(0, 100))
def test_buckets_of_a_matrix_depend_only_on_the_relative_position(options, q, k, offset):
    rp = relative_positions(q, k, offset=offset)
    flat = relative_position_bucket(rp.ravel(), **options).reshape(rp.shape)
    assert_array_equal(relative_position_bucket(rp, **options), flat)


def test_exact_edges_are_the_exact_bucket_boundaries():
    # Independent check of compat="exact" with rational arithmetic.
    for num_buckets, max_distance in [(17, 27), (16, 128), (33, 1000), (5, 686)]:
        distances = np.arange(num_buckets // 2, max_distance + 2)
        ours = relative_position_bucket(
            -distances, bidirectional=False, num_buckets=num_buckets,
            max_distance=max_distance, compat="exact",
        )  # fmt: skip
        n = num_buckets - num_buckets // 2
        expected = [num_buckets // 2 + min(exact_y(int(d), num_buckets, max_distance)[0], n - 1)
                    for d in distances]  # fmt: skip
        assert ours.tolist() == expected


def test_scalar_and_list_inputs():
    assert relative_position_bucket(-3).shape == ()
    assert int(relative_position_bucket(-3)) == 3
    assert relative_position_bucket([[-1, 2]]).tolist() == [[1, 18]]
    assert relative_position_bucket(np.array([5], dtype=np.uint8)).tolist() == [21]
    assert relative_position_bucket(np.zeros((0, 3), dtype=np.int32)).shape == (0, 3)


# ---------------------------------------------------------------------------------------
# Relative positions and the bias


def test_relative_positions_follow_hugging_face_convention():
    # HF: relative_position = memory_position - context_position, with the queries'
    # context positions shifted by the cached tokens.
    for q, k, offset in [(3, 3, 0), (1, 5, 4), (4, 9, 5), (6, 2, 0)]:
        context = np.arange(q)[:, None] + offset
        memory = np.arange(k)[None, :]
        assert_array_equal(relative_positions(q, k, offset=offset), memory - context)
    assert relative_positions(2, offset=3).shape == (2, 5)
    assert relative_positions(0).shape == (0, 0)
    assert relative_positions(0, 4).shape == (0, 4)
    assert relative_positions(3, 0).shape == (3, 0)
    assert relative_positions(2).dtype == np.int64


def hf_compute_bias(weights, query_length, key_length, is_decoder, max_distance, offset=0):
    num_buckets, num_heads = weights.shape
    config = T5Config(
        d_model=8,
        d_kv=4,
        num_heads=num_heads,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=is_decoder,
    )
    attention = modeling_t5.T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    with torch.no_grad():
        attention.relative_attention_bias.weight.copy_(torch.from_numpy(weights))
        return attention.compute_bias(query_length, key_length, past_seen_tokens=offset).numpy()


@pytest.mark.parametrize("is_decoder", [False, True])
@pytest.mark.parametrize(
    ("num_buckets", "num_heads", "max_distance", "q", "k", "offset"),
    [
        (32, 8, 128, 7, 7, 0),
        (32, 12, 128, 300, 300, 0),
        (32, 6, 128, 1, 400, 399),  # one new token after 399 cached ones
        (64, 4, 1000, 50, 250, 200),
        (8, 3, 16, 40, 30, 0),
        (32, 2, 128, 20, 70, 10),
    ],
)
def test_t5_bias_equals_hugging_face_compute_bias(
    is_decoder, num_buckets, num_heads, max_distance, q, k, offset
):
    rng = np.random.default_rng(num_buckets * 1000 + q)
    weights = rng.standard_normal((num_buckets, num_heads)).astype(np.float32)
    expected = hf_compute_bias(weights, q, k, is_decoder, max_distance, offset)
    ours = t5_bias(
        weights, q, k, bidirectional=not is_decoder, max_distance=max_distance, offset=offset
    )
    assert ours.dtype == np.float32
    assert ours.shape == (num_heads, q, k)
    assert_array_equal(ours[None], expected)


def test_t5_bias_gathers_the_table():
    weights = np.random.default_rng(0).standard_normal((32, 5))
    q, k, offset = 9, 14, 3
    buckets = relative_position_bucket(relative_positions(q, k, offset=offset))
    expected = np.moveaxis(weights[buckets], -1, 0)
    ours = t5_bias(weights, q, k, offset=offset)
    assert ours.dtype == np.float64
    assert ours.flags.c_contiguous
    assert_array_equal(ours, expected)
    assert t5_bias(weights, 3, offset=2).shape == (5, 3, 5)
    assert t5_bias(weights, 0, 4).shape == (5, 0, 4)
    assert t5_bias(weights, 4, 0).shape == (5, 4, 0)
    assert t5_bias(weights.astype(np.float16), 2).dtype == np.float16


def test_t5_bias_decoding_rows_equal_the_full_matrix():
    weights = np.random.default_rng(1).standard_normal((32, 4)).astype(np.float32)
    full = t5_bias(weights, 200, bidirectional=False)
    for t in (0, 1, 17, 150, 199):
        assert_array_equal(
            t5_bias(weights, 1, offset=t, bidirectional=False), full[:, t : t + 1, : t + 1]
        )


# ---------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_buckets": 1, "bidirectional": False}, ValueError, "num_buckets must be >= 2"),
        ({"num_buckets": 3}, ValueError, "num_buckets must be >= 4 with bidirectional=True"),
        ({"num_buckets": 0}, ValueError, "num_buckets must be an int >= 1, got 0"),
        ({"num_buckets": 32.0}, TypeError, "num_buckets must be an int"),
        ({"num_buckets": True}, TypeError, "num_buckets must be an int"),
        ({"max_distance": 8}, ValueError, "max_distance must be > max_exact = 8.*got 8"),
        ({"max_distance": 0}, ValueError, "max_distance must be an int >= 1"),
        ({"max_distance": 128.0}, TypeError, "max_distance must be an int"),
        ({"bidirectional": 1}, TypeError, "bidirectional must be True .* or False"),
        ({"bidirectional": "causal"}, TypeError, "bidirectional must be True"),
        ({"compat": "torch"}, ValueError, r"compat must be one of \['hf', 'exact'\], got 'torch'"),
        ({"compat": None}, TypeError, "compat must be one of"),
    ],
)
def test_bad_bucket_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        relative_position_bucket([0, 1], **kwargs)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (np.array([1.0, 2.0]), TypeError, "must hold integers.*float64.*np.rint"),
        (1.5, TypeError, "must hold integers"),
        (True, TypeError, "relative_position must be an int or an integer array, got True"),
        (np.array([True]), TypeError, "must hold integers.*bool"),
        ("3", TypeError, "must hold integers"),
        ([[1, 2], [3]], TypeError, "must be an integer array"),
        (2**63, ValueError, "within"),
        (np.array([2**64 - 1], dtype=np.uint64), ValueError, "within"),
        (np.array([np.iinfo(np.int64).min]), ValueError, "within"),
    ],
)
def test_bad_relative_positions(value, error, match):
    with pytest.raises(error, match=match):
        relative_position_bucket(value)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((-1,), {}, ValueError, "query_length must be an int >= 0, got -1"),
        ((2, -1), {}, ValueError, "key_length must be an int >= 0, got -1"),
        ((2.0,), {}, TypeError, "query_length must be an int"),
        ((2,), {"offset": -3}, ValueError, "offset must be an int >= 0, got -3"),
        ((2,), {"offset": True}, TypeError, "offset must be an int"),
        ((2**53 + 1,), {"offset": 1}, ValueError, "within ±2\\*\\*53 .* got 9007199254740993"),
    ],
)
def test_bad_lengths(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        relative_positions(*args, **kwargs)
    with pytest.raises(error, match=match):
        t5_bias(np.zeros((32, 2)), *args, **kwargs)


@pytest.mark.parametrize(
    ("weights", "kwargs", "error", "match"),
    [
        (np.zeros(32), {}, ValueError, r"shape \(num_buckets, num_heads\).*got shape \(32,\)"),
        (np.zeros((32, 0)), {}, ValueError, "at least one head"),
        (np.zeros((3, 2)), {}, ValueError, r"weights.shape\[0\] \(num_buckets\) must be >= 4"),
        (np.zeros((16, 2)), {"max_distance": 4}, ValueError, "must be > max_exact = 4"),
        (np.zeros((32, 2), dtype=bool), {}, TypeError, "real numbers.*bool"),
        (np.array([["a", "b"]]), {}, TypeError, "real numbers"),
        ([[1, 2], [3]], {}, TypeError, r"NumPy array of shape \(num_buckets, num_heads\)"),
    ],
)
def test_bad_weights(weights, kwargs, error, match):
    with pytest.raises(error, match=match):
        t5_bias(weights, 4, **kwargs)


def test_t5_bias_refuses_huge_results():
    with pytest.raises(ValueError, match="this T5 bias would need about 4.0 GiB"):
        t5_bias(np.zeros((32, 16), np.float32), 2**13, 2**13, max_bytes=2**30)
    assert t5_bias(np.zeros((32, 1), np.float32), 4, max_bytes=None).shape == (1, 4, 4)


def test_bad_weights_from_torch_with_grad():
    weight = torch.nn.Embedding(32, 2).weight
    with pytest.raises(TypeError, match=r"tensor.detach\(\).cpu\(\).numpy\(\)"):
        t5_bias(weight, 3)
    assert t5_bias(weight.detach().numpy(), 3).shape == (2, 3, 3)


def test_edges_are_cached_and_read_only():
    edges = t5._log_edges(16, 128, "hf")
    assert not edges.flags.writeable
    assert t5._log_edges(16, 128, "hf") is edges
    # 8 log buckets of max_exact * 16^(k/8) = 8·2^(k/2): 11.3, 16, 22.6, 32, 45.3, 64, 90.5
    assert edges.tolist() == [math.ceil(8 * 2 ** (k / 2)) for k in range(1, 8)]


def test_a_bucket_count_past_the_limit_is_refused_at_once():
    with pytest.raises(
        ValueError, match=r"num_buckets must be at most 65536 \(2\*\*16; T5 uses 32\)"
    ):
        posenc.relative_position_bucket(np.arange(4), num_buckets=10**12, max_distance=10**13)


def test_the_bucket_table_of_a_huge_max_distance_is_refused_with_what_to_do():
    from posenc.specs import T5Spec

    spec = T5Spec(num_heads=8, max_distance=10**9)  # the bias itself needs no table
    with pytest.raises(ValueError, match="use a smaller max_distance"):
        spec.bucket_table()
    assert posenc.t5_bias(np.zeros((32, 8)), 4, max_distance=10**12).shape == (8, 4, 4)
