"""The JAX front end: pure functions under jit/vmap/grad, and the Flax linen modules.

Expected values come from the NumPy core (``posenc.sinusoidal``, ``posenc.rope_tables``,
``posenc.alibi_bias``, ``posenc.t5_bias``, ``posenc.sinusoidal_nd``, all tested against
closed forms and reference implementations elsewhere), compared as whole arrays and
exactly wherever the JAX side only moves the core's values.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import posenc  # noqa: E402
import posenc.jax  # noqa: E402
from posenc.jax import (  # noqa: E402
    alibi_bias,
    alibi_slopes,
    apply_rope,
    rope_tables,
    sinusoidal,
    sinusoidal_nd,
    t5_bias,
)

RNG = np.random.default_rng(20240611)
DTYPES = ["float16", "bfloat16", "float32"]


def as_np(array) -> np.ndarray:
    """A JAX array as NumPy, bfloat16 widened to float32 (exact)."""
    array = jnp.asarray(array)
    if array.dtype == jnp.bfloat16:
        array = array.astype(jnp.float32)
    return np.asarray(array)


def core_np(values) -> np.ndarray:
    """A core result as NumPy, bfloat16 widened to float32 (exact)."""
    values = np.asarray(values)
    return values.astype(np.float32) if values.dtype.name == "bfloat16" else values


def assert_same(actual, expected) -> None:
    """Same shape and dtype name, and bit-equal values (NaN equal to NaN)."""
    actual, expected = jnp.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape
    assert actual.dtype.name == expected.dtype.name
    np.testing.assert_array_equal(as_np(actual), core_np(expected))


def nan_rows(array) -> np.ndarray:
    """Which rows (the last axis reduced) are all NaN; asserts no row is partly NaN."""
    isnan = np.isnan(as_np(array))
    assert (isnan.all(-1) == isnan.any(-1)).all(), "a row is partly NaN"
    return isnan.all(-1)


# --- packaging ---------------------------------------------------------------------------


def test_imports_jax_only_where_asked_and_flax_only_in_linen():
    code = """
import sys
import posenc
assert "jax" not in sys.modules, "import posenc imported jax"
sys.modules["flax"] = None  # as if flax were not installed
import posenc.jax
assert posenc.jax.sinusoidal(2, 4).shape == (2, 4)
try:
    posenc.jax.linen
except ImportError as exc:
    assert "needs Flax" in str(exc), exc
else:
    raise AssertionError("posenc.jax.linen imported without flax")
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# --- sinusoidal ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("layout", "formula"), [("interleaved", "paper"), ("split", "tensor2tensor")]
)
def test_sinusoidal_concrete_equals_core(dtype, layout, formula):
    options = {"base": 100.0, "layout": layout, "formula": formula, "dtype": dtype}
    assert_same(sinusoidal(37, 10, **options), posenc.sinusoidal(37, 10, **options))
    odd = sinusoidal(9, 7, **options)  # odd width: a last sine column
    assert_same(odd, posenc.sinusoidal(9, 7, **options))
    positions = np.array([[3.5, -2.0, 1e6], [0.0, 7.0, 123456789.0]])
    assert_same(sinusoidal(positions, 6, **options), posenc.sinusoidal(positions, 6, **options))
    # A concrete JAX array is read as its values.
    ints = jnp.array([[5, 9], [0, 2]])
    assert_same(sinusoidal(ints, 6, **options), posenc.sinusoidal(np.asarray(ints), 6, **options))


def test_sinusoidal_static_under_jit():
    jitted = jax.jit(sinusoidal, static_argnums=(0, 1), static_argnames=("base",))
    assert_same(jitted(12, 8, base=100.0), posenc.sinusoidal(12, 8, base=100.0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sinusoidal_traced_gathers_core_rows_with_nan_out_of_range(dtype):
    table = posenc.sinusoidal(16, 6, dtype=dtype)  # the core's rows 0 .. 15
    gather = jax.jit(lambda p: sinusoidal(p, 6, dtype=dtype, max_length=16))
    positions = jnp.array([[0, 15, 7], [16, -1, 3]])
    out = gather(positions)
    assert out.shape == (2, 3, 6)
    np.testing.assert_array_equal(
        nan_rows(out), [[False, False, False], [True, True, False]]
    )  # 16 and -1 are outside 0 .. 15: NaN, not a clamped or wrapped row
    inside = np.array([[0, 15, 7], [0, 0, 3]])
    expected = core_np(table)[inside]
    expected[1, :2] = np.nan
    np.testing.assert_array_equal(as_np(out), expected)


def test_sinusoidal_vmap_over_batches_of_positions():
    batch = jnp.asarray(RNG.integers(0, 40, size=(4, 5)))
    out = jax.vmap(lambda p: sinusoidal(p, 8, base=100.0, max_length=40))(batch)
    expected = posenc.sinusoidal(40, 8, base=100.0)[np.asarray(batch)]
    assert_same(out, expected)
    # vmap of scalars: each call gathers one row
    scalars = jax.vmap(lambda p: sinusoidal(p, 8, base=100.0, max_length=40))(batch[0])
    assert_same(scalars, expected[0])


def test_sinusoidal_float64_needs_x64():
    with pytest.raises(ValueError, match="64-bit mode"):
        sinusoidal(4, 4, dtype="float64")
    with jax.enable_x64(True):
        assert_same(sinusoidal(5, 6, dtype="float64"), posenc.sinusoidal(5, 6, dtype="float64"))


def test_sinusoidal_bad_input():
    with pytest.raises(ValueError, match="max_length="):
        jax.jit(lambda p: sinusoidal(p, 4))(jnp.arange(3))
    with pytest.raises(TypeError, match="traced positions must hold integers"):
        jax.jit(lambda p: sinusoidal(p, 4, max_length=8))(jnp.arange(3.0))
    with pytest.raises(TypeError, match="d_model must be a static Python int"):
        jax.jit(lambda d: sinusoidal(3, d))(4)
    with pytest.raises(TypeError, match="dtype must be one of"):
        sinusoidal(3, 4, dtype="int32")
    with pytest.raises(TypeError, match="dtype must be one of"):
        sinusoidal(3, 4, dtype=None)
    with pytest.raises(ValueError, match="layout must be one of"):
        sinusoidal(3, 4, layout="blocked")
    with pytest.raises(ValueError, match="base must not be 1"):
        sinusoidal(3, 4, base=1.0)
    with pytest.raises(ValueError, match="max_length must be an int >= 1"):
        sinusoidal(3, 4, max_length=0)
    with pytest.raises(TypeError, match="positions must hold integers or real numbers"):
        sinusoidal(np.array([True, False]), 4)


# --- RoPE ----------------------------------------------------------------------------------

SCALINGS = {
    "default": {},
    "linear": {"factor": 4.0},
    "ntk": {"factor": 4.0},
    "dynamic_ntk": {"factor": 2.0, "original_max_position_embeddings": 16},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 16},
    "llama3": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "longrope": {
        "short_factor": [1.0, 1.5, 2.0, 3.0],
        "long_factor": [2.0, 3.0, 5.0, 8.0],
        "original_max_position_embeddings": 16,
        "factor": 4.0,
    },
    "proportional": {"partial_rotary_factor": 0.5, "factor": 2.0},
}


def test_every_scaling_is_covered():
    assert set(SCALINGS) == set(posenc.ROPE_SCALINGS)


def core_rope(positions, head_dim, scaling, params, *, dtype="float32", layout="half", length=None):
    """The core's tables; a length-dependent scaling's at the call's ``length``."""
    if length is not None and posenc.ROPE_SCALING_SPECS[scaling].length_dependent:
        params = {**params, "seq_len": length}
    inv_freq, factor = posenc.rope_scaling(scaling, head_dim, 500.0, **params)
    return posenc.rope_tables(positions, inv_freq, dtype=dtype, layout=layout, scale=factor)


@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_rope_tables_every_scaling_concrete_and_traced(scaling):
    # A length-dependent scaling follows each call's length L = max(positions) + 1 (30,
    # then 100001: past the original 16); traced, LongRoPE selects its long factors in
    # the graph (L = 31) and dynamic NTK, whose frequencies change with every length,
    # refuses.
    params = SCALINGS[scaling]
    options = {"base": 500.0, "scaling": scaling, "scaling_params": params, "layout": "half"}
    for got, want in zip(
        rope_tables(30, 8, **options), core_rope(30, 8, scaling, params, length=30), strict=True
    ):
        assert_same(got, want)
    positions = np.array([[1, 29], [100000, 3]])
    got = rope_tables(positions, 8, **options)
    want = core_rope(positions, 8, scaling, params, length=100001)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    traced = jax.jit(lambda p: rope_tables(p, 8, max_length=30, **options))
    if scaling == "dynamic_ntk":
        with pytest.raises(ValueError, match="'dynamic_ntk'.*known only inside a trace"):
            traced(jnp.array([[1, 29], [30, 3]]))
        return
    cos, sin = traced(jnp.array([[1, 29], [30, 3]]))
    np.testing.assert_array_equal(nan_rows(cos), [[False, False], [True, False]])
    np.testing.assert_array_equal(nan_rows(sin), [[False, False], [True, False]])
    want_cos, want_sin = core_rope(30, 8, scaling, params, length=31)
    np.testing.assert_array_equal(as_np(cos)[0], want_cos[[1, 29]])
    np.testing.assert_array_equal(as_np(sin)[1, 1], want_sin[3])
    short = traced(jnp.array([[1, 9], [12, 3]]))[0]  # L = 13: LongRoPE's short factors
    np.testing.assert_array_equal(
        as_np(short), core_rope(30, 8, scaling, params)[0][[[1, 9], [12, 3]]]
    )


def test_rope_tables_take_the_length_from_the_call():
    with pytest.raises(TypeError, match="seq_len is not a parameter of the function"):
        rope_tables(4, 8, scaling="dynamic_ntk", scaling_params={"factor": 2.0, "seq_len": 40})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_tables_dtypes_layouts_and_vmap(dtype, layout):
    params = SCALINGS["yarn"]  # attention factor != 1, folded in before the rounding
    options = {"scaling": "yarn", "scaling_params": params, "layout": layout, "dtype": dtype}
    want = core_rope(20, 8, "yarn", params, dtype=dtype, layout=layout)
    for got, expected in zip(rope_tables(20, 8, base=500.0, **options), want, strict=True):
        assert_same(got, expected)
    batch = jnp.asarray(RNG.integers(0, 20, size=(3, 4)))
    cos, sin = jax.vmap(lambda p: rope_tables(p, 8, base=500.0, max_length=20, **options))(batch)
    assert_same(cos, want[0][np.asarray(batch)])
    assert_same(sin, want[1][np.asarray(batch)])


def test_rope_tables_partial_rotary_and_bad_input():
    cos, _ = rope_tables(5, 10, rotary_dim=4)
    assert_same(cos, posenc.rope_tables(5, posenc.rope_frequencies(10, rotary_dim=4))[0])
    with pytest.raises(ValueError, match="without a scaling method"):
        rope_tables(4, 8, scaling_params={"factor": 2.0})
    with pytest.raises(ValueError, match="is called 'dynamic_ntk' here"):
        rope_tables(4, 8, scaling="dynamic", scaling_params={"factor": 2.0})
    with pytest.raises(TypeError, match="missing \\['factor'\\]"):
        rope_tables(4, 8, scaling="linear")
    with pytest.raises(ValueError, match="even int >= 2"):
        rope_tables(4, 7)
    with pytest.raises(ValueError, match="max_length="):
        jax.jit(lambda p: rope_tables(p, 8))(jnp.arange(3))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_apply_rope_matches_core(layout):
    x = RNG.normal(size=(2, 3, 7, 12)).astype(np.float32)  # (batch, heads, seq, head_dim)
    cos, sin = rope_tables(7, 12, rotary_dim=8, layout=layout)
    out = apply_rope(x, cos, sin, layout=layout)
    want = posenc.apply_rope(x, np.asarray(cos), np.asarray(sin), layout=layout)
    assert out.dtype == jnp.float32
    assert out.shape == x.shape
    # float32 arithmetic here, float64 rounded once in the core: a few float32 ulps apart
    np.testing.assert_allclose(np.asarray(out), want, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(np.asarray(out)[..., 8:], x[..., 8:])  # passed through
    # (batch, seq, heads, head_dim) with the documented heads axis on the tables
    bshd = apply_rope(x.transpose(0, 2, 1, 3), cos[:, None, :], sin[:, None, :], layout=layout)
    np.testing.assert_array_equal(np.asarray(bshd), np.asarray(out).transpose(0, 2, 1, 3))
    # jit and vmap (over the batch) give the same numbers
    jitted = jax.jit(lambda x, c, s: apply_rope(x, c, s, layout=layout))(x, cos, sin)
    np.testing.assert_allclose(np.asarray(jitted), want, rtol=0, atol=2e-6)
    mapped = jax.vmap(lambda x: apply_rope(x, cos, sin, layout=layout))(x)
    np.testing.assert_allclose(np.asarray(mapped), want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_apply_rope_low_precision_rotates_in_float32(dtype):
    x = jnp.asarray(RNG.normal(size=(3, 9, 16)).astype(np.float32)).astype(dtype)
    cos, sin = rope_tables(9, 16)
    out = apply_rope(x, cos, sin)
    assert out.dtype == x.dtype
    # exactly the float32 rotation cast back once
    assert_same(out, np.asarray(apply_rope(x.astype(jnp.float32), cos, sin).astype(dtype)))
    # and within one unit in the last place of the core's once-rounded float64 result
    want = posenc.apply_rope(as_np(x).astype(np.float64), np.asarray(cos), np.asarray(sin))
    ulp = 2.0 ** (
        np.floor(np.log2(np.maximum(np.abs(want), 1e-30))) - (10 if dtype == "float16" else 7)
    )
    assert (np.abs(as_np(out) - want) <= ulp).all()


def test_apply_rope_bad_input():
    cos, sin = rope_tables(5, 8)
    x = jnp.zeros((2, 5, 3, 8))  # (batch, seq, heads, head_dim) without the heads axis
    with pytest.raises(ValueError, match=r"pass cos\[:, None, :\]"):
        apply_rope(x, cos, sin)
    with pytest.raises(ValueError, match="does not match the tables' last axis"):
        apply_rope(jnp.zeros((5, 8)), cos, sin, rotary_dim=6)
    with pytest.raises(ValueError, match="exceeds x's feature axis"):
        apply_rope(jnp.zeros((5, 4)), cos, sin)
    with pytest.raises(TypeError, match="x must be a floating array"):
        apply_rope(jnp.zeros((5, 8), jnp.int32), cos, sin)
    with pytest.raises(ValueError, match="same shape"):
        apply_rope(jnp.zeros((5, 8)), cos, sin[:4])
    with pytest.raises(ValueError, match="layout must be one of"):
        apply_rope(jnp.zeros((5, 8)), cos, sin, layout="split")


# --- ALiBi ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_alibi_concrete_bias_equals_core(dtype):
    for mode in ("causal", "symmetric"):
        for q, k, offset in ((7, None, 0), (3, 11, 5), (1, 20, 19), (0, 4, 0)):
            got = alibi_bias(q, k, num_heads=6, mode=mode, offset=offset, dtype=dtype)
            want = posenc.alibi_bias(q, k, num_heads=6, mode=mode, offset=offset, dtype=dtype)
            assert_same(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_alibi_slopes_are_the_core_slopes_rounded_once(dtype):
    from posenc.core.precision import round_to_format

    for heads in (1, 6, 8, 12, 32):
        want = round_to_format(posenc.alibi_slopes(heads), dtype)
        got = alibi_slopes(heads, dtype=dtype)
        assert got.dtype.name == dtype
        np.testing.assert_array_equal(as_np(got), want)


@pytest.mark.parametrize("mode", ["causal", "symmetric"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_alibi_traced_offset_kv_cache_decoding(mode, dtype):
    full = posenc.alibi_bias(10, num_heads=5, mode=mode, dtype=dtype)  # (H, 10, 10)
    step = jax.jit(lambda t: alibi_bias(1, 10, num_heads=5, mode=mode, offset=t, dtype=dtype))
    assert step(jnp.int32(0)).dtype.name == dtype
    rows = [as_np(step(jnp.int32(t))) for t in range(10)]
    np.testing.assert_array_equal(np.concatenate(rows, axis=1), core_np(full))
    # vmap over offsets: chunks of 3 queries at offsets 0 .. 7
    chunks = jax.vmap(lambda t: alibi_bias(3, 10, num_heads=5, mode=mode, offset=t, dtype=dtype))(
        jnp.arange(8)
    )
    for t in range(8):
        np.testing.assert_array_equal(as_np(chunks[t]), core_np(full)[:, t : t + 3])
    # beyond the key length (the default bound) and negative: NaN rows, never wrong ones
    past = as_np(step(jnp.int32(10)))
    assert np.isnan(past).all()
    late = as_np(jax.jit(lambda t: alibi_bias(3, 10, num_heads=5, mode=mode, offset=t))(8))
    assert not np.isnan(late[:, :2]).any()
    assert np.isnan(late[:, 2]).all()
    assert np.isnan(as_np(step(jnp.int32(-1)))).all()


def test_alibi_traced_offset_with_max_length_beyond_the_keys():
    # queries past the keys (all keys in the past): a longer bound than key_length
    want = posenc.alibi_bias(2, 6, num_heads=4, offset=30)
    got = jax.jit(lambda t: alibi_bias(2, 6, num_heads=4, offset=t, max_length=40))(30)
    assert_same(got, want)


def test_alibi_bad_input():
    with pytest.raises(ValueError, match="key_length must be given when offset is traced"):
        jax.jit(lambda t: alibi_bias(1, num_heads=2, offset=t))(3)
    with pytest.raises(TypeError, match="traced offset must hold integers"):
        jax.jit(lambda t: alibi_bias(1, 4, num_heads=2, offset=t))(3.0)
    with pytest.raises(ValueError, match="traced offset must be an integer scalar"):
        jax.jit(lambda t: alibi_bias(1, 4, num_heads=2, offset=t))(jnp.arange(2))
    with pytest.raises(TypeError, match="query_length must be a static Python int"):
        jax.jit(lambda q: alibi_bias(q, 4, num_heads=2))(1)
    with pytest.raises(ValueError, match="offset must be an int >= 0"):
        alibi_bias(1, 4, num_heads=2, offset=-1)
    with pytest.raises(ValueError, match="mode must be one of"):
        alibi_bias(1, 4, num_heads=2, mode="bidirectional")
    with pytest.raises(ValueError, match="num_heads must be an int >= 1"):
        alibi_slopes(0)


# --- T5 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("compat", ["hf", "exact"])
def test_t5_bias_equals_core_concrete_and_traced(bidirectional, compat):
    weights = RNG.normal(size=(32, 3)).astype(np.float32)
    options = {"bidirectional": bidirectional, "max_distance": 100, "compat": compat}
    for q, k, offset in ((6, None, 0), (4, 300, 150), (1, 9, 8), (0, 3, 0)):
        assert_same(
            t5_bias(weights, q, k, offset=offset, **options),
            posenc.t5_bias(weights, q, k, offset=offset, **options),
        )
    step = jax.jit(lambda w, t: t5_bias(w, 4, 300, offset=t, **options))
    assert_same(step(weights, 150), posenc.t5_bias(weights, 4, 300, offset=150, **options))
    mapped = jax.vmap(lambda t: t5_bias(weights, 2, 250, offset=t, **options))(
        jnp.arange(0, 240, 40)
    )
    for n, t in enumerate(range(0, 240, 40)):
        assert_same(mapped[n], posenc.t5_bias(weights, 2, 250, offset=t, **options))


def test_t5_bias_gradient_is_the_bucket_sums():
    weights = jnp.asarray(RNG.normal(size=(16, 2)).astype(np.float32))
    upstream = RNG.integers(-3, 4, size=(2, 5, 40)).astype(np.float32)  # exact sums

    def loss(w, t):
        return jnp.sum(t5_bias(w, 5, 40, max_distance=20, offset=t) * upstream)

    relative = posenc.relative_positions(5, 40, offset=7)
    buckets = posenc.relative_position_bucket(relative, num_buckets=16, max_distance=20)
    expected = np.zeros((16, 2), np.float32)
    for h in range(2):
        np.add.at(expected[:, h], buckets, upstream[h])
    np.testing.assert_array_equal(np.asarray(jax.grad(loss)(weights, 7)), expected)
    traced = jax.jit(jax.grad(loss))(weights, jnp.int32(7))
    np.testing.assert_array_equal(np.asarray(traced), expected)


def test_t5_bias_negative_traced_offset_gives_nan_rows():
    weights = jnp.ones((32, 2))
    out = as_np(jax.jit(lambda t: t5_bias(weights, 3, 5, offset=t))(-2))
    assert np.isnan(out[:, :2]).all()
    assert not np.isnan(out[:, 2]).any()


def test_t5_bias_bad_input():
    with pytest.raises(ValueError, match="shape \\(num_buckets, num_heads\\)"):
        t5_bias(jnp.ones(32), 3)
    with pytest.raises(TypeError, match="weights must be a floating array"):
        t5_bias(jnp.ones((32, 2), jnp.int32), 3)
    with pytest.raises(ValueError, match="weights.shape\\[0\\] \\(num_buckets\\) must be >= 4"):
        t5_bias(jnp.ones((3, 2)), 3)
    with pytest.raises(ValueError, match="max_distance must be > max_exact"):
        t5_bias(jnp.ones((32, 2)), 3, max_distance=8)
    with pytest.raises(ValueError, match="key_length must be given when offset is traced"):
        jax.jit(lambda t: t5_bias(jnp.ones((32, 2)), 1, offset=t))(3)
    with pytest.raises(ValueError, match="compat must be one of"):
        t5_bias(jnp.ones((32, 2)), 3, compat="mesh")


# --- N-D -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_sinusoidal_nd_equals_core(dtype):
    for shape, channels, layout in (
        ((4, 5), 6, "positional-encodings"),
        ((3, 4, 5), 10, "positional-encodings"),
        ((4, 6), 8, "mae"),
        ((7,), 6, "mae"),
    ):
        want = posenc.sinusoidal_nd(shape, channels, layout=layout, dtype=dtype, base=100.0)
        got = sinusoidal_nd(shape, channels, layout=layout, dtype=dtype, base=100.0)
        assert_same(got, want)
    jitted = jax.jit(lambda x: x + sinusoidal_nd(x.shape[1:-1], x.shape[-1], dtype=dtype))
    x = jnp.zeros((2, 3, 4, 6), dtype)
    np.testing.assert_array_equal(
        as_np(jitted(x))[1], core_np(posenc.sinusoidal_nd((3, 4), 6, dtype=dtype))
    )


def test_sinusoidal_nd_bad_input():
    with pytest.raises(ValueError, match="needs channels divisible by 4"):
        sinusoidal_nd((4, 4), 6, layout="mae")
    with pytest.raises(TypeError, match="pass \\(5,\\) for a 1-D grid"):
        sinusoidal_nd(5, 4)
    with pytest.raises(TypeError, match="shape\\[0\\] must be a static Python int"):
        jax.jit(lambda h: sinusoidal_nd((h, 2), 4))(3)


# --- Flax linen ------------------------------------------------------------------------------

KEY = jax.random.key(0)


@pytest.fixture
def linen():
    """posenc.jax.linen; the tests that take it are skipped without Flax."""
    pytest.importorskip("flax")
    from posenc.jax import linen

    return linen


def param_shapes(variables):
    return jax.tree_util.tree_map(jnp.shape, jax.tree_util.tree_map(jnp.asarray, variables))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linen_sinusoidal_values_and_no_variables(dtype, linen):
    pe = linen.SinusoidalPositionalEncoding(max_length=32, base=100.0, layout="split")
    x = jnp.asarray(RNG.normal(size=(2, 9, 6)).astype(np.float32)).astype(dtype)
    variables = pe.init(KEY, x)
    assert param_shapes(variables) == {}
    table = posenc.sinusoidal(32, 6, base=100.0, layout="split", dtype=dtype)
    # x + 0 rows: the table itself, correctly rounded in x's dtype
    zeros = pe.apply(variables, jnp.zeros_like(x), start_index=3)
    assert_same(zeros[0], table[3:12])
    out = pe.apply(variables, x)
    assert_same(out, np.asarray(x + jnp.asarray(core_np(table)[:9]).astype(dtype)))


def test_linen_sinusoidal_kv_cache_decoding_and_out_of_range(linen):
    pe = linen.SinusoidalPositionalEncoding(max_length=12)
    x = jnp.asarray(RNG.normal(size=(2, 12, 8)).astype(np.float32))
    full = pe.apply({}, x)
    step = jax.jit(lambda x, t: pe.apply({}, x, start_index=t))
    decoded = jnp.concatenate([step(x[:, t : t + 1], t) for t in range(12)], axis=1)
    assert_same(decoded, np.asarray(full))
    static = jnp.concatenate(
        [pe.apply({}, x[:, t : t + 3], start_index=t) for t in (0, 3, 6, 9)], 1
    )
    assert_same(static, np.asarray(full))
    # a static start past the table gets the exact rows; a traced one gets NaN
    far = pe.apply({}, jnp.zeros((1, 2, 8)), start_index=1000)
    assert_same(far[0], posenc.sinusoidal(np.arange(1000, 1002), 8))
    assert nan_rows(step(jnp.zeros((1, 2, 8)), 11))[0].tolist() == [False, True]


def test_linen_sinusoidal_dropout(linen):
    pe = linen.SinusoidalPositionalEncoding(max_length=16, dropout_rate=0.5)
    x = jnp.ones((4, 16, 8))
    kept = pe.apply({}, x)  # deterministic by default
    dropped = pe.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
    dropped, kept = np.asarray(dropped), np.asarray(kept)
    zero = dropped == 0
    assert 0.3 < zero.mean() < 0.7
    np.testing.assert_allclose(dropped[~zero], 2 * kept[~zero], rtol=1e-6)
    with pytest.raises(pytest.importorskip("flax").errors.InvalidRngError):
        pe.apply({}, x, deterministic=False)


def test_linen_learned_params_and_decoding(linen):
    emb = linen.LearnedPositionalEmbedding(max_length=10)
    x = jnp.asarray(RNG.normal(size=(3, 6, 32)).astype(np.float32))
    variables = emb.init(KEY, x)
    assert param_shapes(variables) == {"params": {"embedding": (10, 32)}}
    table = np.asarray(variables["params"]["embedding"])
    assert 0.015 < table.std() < 0.025
    out = emb.apply(variables, x, start_index=2)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x) + table[2:8])
    step = jax.jit(lambda v, x, t: emb.apply(v, x, start_index=t))
    decoded = jnp.concatenate([step(variables, x[:, t : t + 1], t) for t in range(6)], axis=1)
    np.testing.assert_array_equal(np.asarray(decoded), np.asarray(emb.apply(variables, x)))
    assert nan_rows(step(variables, x[:, :3], 8))[0].tolist() == [False, False, True]
    with pytest.raises(ValueError, match="cannot extrapolate"):
        emb.apply(variables, x, start_index=5)
    half = emb.apply(variables, x.astype(jnp.bfloat16))
    assert half.dtype == jnp.bfloat16


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_linen_rotary_values_and_kv_cache(layout, linen):
    params = SCALINGS["yarn"]
    rope = linen.RotaryEmbedding(
        base=500.0, rotary_dim=8, layout=layout, scaling="yarn", scaling_params=params,
        max_length=16,
    )  # fmt: skip
    # Entries ±1 make every product x·cos, x·sin exact, so the result is the same whether
    # XLA fuses x·cos + turn(x)·sin into FMAs (under jit) or not (eager): bit-equality
    # then checks that each token got its own table rows. Random entries: 1e-6 apart.
    signs = jnp.asarray(RNG.choice([-1.0, 1.0], size=(2, 10, 3, 12)).astype(np.float32))
    q = jnp.asarray(RNG.normal(size=(2, 10, 3, 12)).astype(np.float32))
    assert param_shapes(rope.init(KEY, q)) == {}
    inv_freq, factor = posenc.rope_scaling("yarn", 12, 500.0, rotary_dim=8, **params)
    cos, sin = posenc.rope_tables(10, inv_freq, layout=layout, scale=factor)
    step = jax.jit(lambda x, t: rope.apply({}, x, start_index=t))
    by_position = jax.jit(lambda x, p: rope.apply({}, x, positions=p))
    positions = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]])
    for x, exact in ((signs, True), (q, False)):
        check = (
            np.testing.assert_array_equal
            if exact
            else functools.partial(np.testing.assert_allclose, rtol=0, atol=1e-6)
        )
        full = rope.apply({}, x)
        want = apply_rope(x, jnp.asarray(cos)[:, None], jnp.asarray(sin)[:, None], layout=layout)
        np.testing.assert_array_equal(np.asarray(full), np.asarray(want))
        decoded = jnp.concatenate([step(x[:, t : t + 1], t) for t in range(10)], axis=1)
        check(np.asarray(decoded), np.asarray(full))
        # per-example positions (the second example reversed), concrete and traced
        for packed in (rope.apply({}, x, positions=positions), by_position(x, positions)):
            check(np.asarray(packed)[0], np.asarray(full)[0])
            flipped = rope.apply({}, x[1:, ::-1])  # reversed tokens at positions 0 .. 9
            check(np.asarray(packed)[1, ::-1], np.asarray(flipped)[0])
        np.testing.assert_array_equal(
            np.asarray(rope.apply({}, x[:1], positions=positions[0])), np.asarray(full)[:1]
        )


def test_linen_dynamic_ntk_past_its_length_gets_only_the_calls_rows(linen):
    # The plan says "core" for a run past dynamic NTK's original length: the core's rows
    # of the call at seq_len = L, equal to the NumPy core's, and no max_length-row table
    # of that length's frequencies (one per new length, each of max_length rows, before).
    from posenc.core.tables import CACHE
    from posenc.jax import _tables

    def jax_entries():
        keys = list(CACHE._entries.keys())
        return {key for key in keys if isinstance(key[0], _tables.PositionTables)}

    params = {"factor": 2.0, "original_max_position_embeddings": 8}
    rope = linen.RotaryEmbedding(scaling="dynamic_ntk", scaling_params=params, max_length=4096)
    x = jnp.asarray(RNG.normal(size=(1, 3, 2, 8)).astype(np.float32))
    before = jax_entries()
    out = rope.apply({}, x, start_index=17)  # L = 20 > 8
    assert jax_entries() <= before  # no table built for the call
    inv_freq, factor = posenc.rope_scaling("dynamic_ntk", 8, seq_len=20, **params)
    cos, sin = posenc.rope_tables(np.arange(17, 20), inv_freq, scale=factor)
    want = apply_rope(x, jnp.asarray(cos)[:, None], jnp.asarray(sin)[:, None])
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


def test_linen_rotary_positions_and_dtypes(linen):
    rope = linen.RotaryEmbedding(max_length=8)
    x = jnp.asarray(RNG.normal(size=(1, 3, 2, 8)).astype(np.float32))
    # positions past the table: concrete ones are exact, traced ones NaN
    far = np.array([100, 8, 2])
    cos, sin = rope_tables(far, 8)
    want = apply_rope(x, cos[:, None, :], sin[:, None, :])
    np.testing.assert_array_equal(np.asarray(rope.apply({}, x, positions=far)), np.asarray(want))
    traced = np.asarray(jax.jit(lambda p: rope.apply({}, x, positions=p))(far))
    assert np.isnan(traced[0, :2]).all()
    assert not np.isnan(traced[0, 2]).any()
    far_start = rope.apply({}, x, start_index=100)
    cos, sin = rope_tables(np.arange(100, 103), 8)
    np.testing.assert_array_equal(
        np.asarray(far_start), np.asarray(apply_rope(x, cos[:, None, :], sin[:, None, :]))
    )
    half = rope.apply({}, x.astype(jnp.float16))
    assert half.dtype == jnp.float16
    assert_same(
        half,
        np.asarray(rope.apply({}, x.astype(jnp.float16).astype(jnp.float32)).astype(jnp.float16)),
    )


def test_linen_rotary_bad_input(linen):
    with pytest.raises(ValueError, match="is called 'dynamic_ntk' here"):
        linen.RotaryEmbedding(scaling="dynamic")
    with pytest.raises(ValueError, match="without a scaling method"):
        linen.RotaryEmbedding(scaling_params={"factor": 2.0})
    rope = linen.RotaryEmbedding(max_length=8)
    with pytest.raises(ValueError, match="\\(batch, seq, heads, head_dim\\)"):
        rope.apply({}, jnp.zeros((3, 8)))
    with pytest.raises(TypeError, match="floating-point queries or keys"):
        rope.apply({}, jnp.zeros((1, 3, 2, 8), jnp.int32))
    with pytest.raises(ValueError, match="positions must be >= 0"):
        rope.apply({}, jnp.zeros((1, 3, 2, 8)), positions=np.array([0, -1, 2]))
    with pytest.raises(ValueError, match="positions must have shape \\(seq,\\)"):
        rope.apply({}, jnp.zeros((1, 3, 2, 8)), positions=np.arange(4))
    with pytest.raises(TypeError, match="either start_index= or positions="):
        rope.apply({}, jnp.zeros((1, 3, 2, 8)), positions=np.arange(3), start_index=2)
    with pytest.raises(TypeError, match="missing \\['factor'\\]"):
        linen.RotaryEmbedding(scaling="linear").apply({}, jnp.zeros((1, 3, 2, 8)))


@pytest.mark.parametrize("mode", ["causal", "symmetric"])
def test_linen_alibi(mode, linen):
    bias = linen.ALiBiBias(num_heads=6, mode=mode, dtype="bfloat16")
    assert param_shapes(bias.init(KEY, 7)) == {}
    full = posenc.alibi_bias(7, num_heads=6, mode=mode, dtype="bfloat16")
    assert_same(bias.apply({}, 7), full)
    step = jax.jit(lambda t: bias.apply({}, 1, 7, offset=t))
    decoded = np.concatenate([as_np(step(t)) for t in range(7)], axis=1)
    np.testing.assert_array_equal(decoded, core_np(full))


def test_linen_t5_params_and_decoding(linen):
    bias = linen.T5RelativeBias(num_heads=3, bidirectional=False, num_buckets=16, max_distance=20)
    variables = bias.init(KEY, 5)
    assert param_shapes(variables) == {"params": {"relative_attention_bias": (16, 3)}}
    weights = np.asarray(variables["params"]["relative_attention_bias"])
    full = posenc.t5_bias(weights, 30, bidirectional=False, max_distance=20)
    assert_same(bias.apply(variables, 30), full)
    step = jax.jit(lambda v, t: bias.apply(v, 1, 30, offset=t))
    decoded = np.concatenate([np.asarray(step(variables, t)) for t in range(30)], axis=1)
    np.testing.assert_array_equal(decoded, full)
    grads = jax.grad(lambda v: bias.apply(v, 4).sum())(variables)
    assert param_shapes(grads) == param_shapes(variables)
    with pytest.raises(ValueError, match="num_buckets must be >= 4"):
        linen.T5RelativeBias(num_heads=2, num_buckets=3)
    with pytest.raises(TypeError, match="bidirectional must be True"):
        linen.T5RelativeBias(num_heads=2, bidirectional="yes")


@pytest.mark.parametrize("layout", ["positional-encodings", "mae"])
def test_linen_nd(layout, linen):
    pe = linen.SinusoidalPositionalEncodingND(layout=layout)
    x = jnp.asarray(RNG.normal(size=(2, 3, 4, 8)).astype(np.float32)).astype(jnp.float16)
    assert param_shapes(pe.init(KEY, x)) == {}
    table = posenc.sinusoidal_nd((3, 4), 8, layout=layout, dtype="float16")
    assert_same(pe.apply({}, jnp.zeros_like(x))[1], table)
    assert_same(jax.jit(pe.apply)({}, x), np.asarray(x + jnp.asarray(table)))
    with pytest.raises(ValueError, match="rank >= 3"):
        pe.apply({}, jnp.zeros((4, 8)))


def test_linen_bad_configuration(linen):
    with pytest.raises(ValueError, match="max_length must be an int >= 1"):
        linen.SinusoidalPositionalEncoding(max_length=0)
    with pytest.raises(ValueError, match="dropout_rate must be a float in \\[0, 1\\)"):
        linen.SinusoidalPositionalEncoding(dropout_rate=1.0)
    with pytest.raises(ValueError, match="init_std must be a finite real number > 0"):
        linen.LearnedPositionalEmbedding(max_length=4, init_std=-1.0)
    with pytest.raises(ValueError, match="layout must be one of"):
        linen.SinusoidalPositionalEncodingND(layout="detr")
    with pytest.raises(ValueError, match="64-bit mode"):
        linen.ALiBiBias(num_heads=2, dtype="float64")
    with pytest.raises(ValueError, match="expects x of shape \\(batch, seq, d_model\\)"):
        linen.SinusoidalPositionalEncoding().apply({}, jnp.zeros((1, 2, 3, 4)))
    with pytest.raises(TypeError, match="floating-point embeddings"):
        linen.SinusoidalPositionalEncoding().apply({}, jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="start_index must be an int >= 0"):
        linen.SinusoidalPositionalEncoding().apply({}, jnp.zeros((2, 4)), start_index=-1)


def test_rope_tables_refuses_positions_none_as_the_core_does():
    with pytest.raises(TypeError, match="positions must hold integers or real numbers"):
        posenc.jax.rope_tables(None, 8)
    with pytest.raises(TypeError, match="positions must hold integers or real numbers"):
        posenc.rope_tables(None, posenc.rope_frequencies(8))


def test_score_biases_by_blocks_of_queries_equal_the_whole_bias():
    """What docs/attention.md offers JAX users for long contexts: the bias of a block of
    queries at ``offset`` is the whole bias's rows, bit for bit."""
    from posenc.jax import alibi_bias, t5_bias

    weights = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    whole_alibi = alibi_bias(96, 96, num_heads=4, offset=0)
    whole_t5 = t5_bias(weights, 96, 96, bidirectional=False, offset=0)
    for start in range(0, 96, 32):
        block = alibi_bias(32, 96, num_heads=4, offset=start)
        np.testing.assert_array_equal(block, whole_alibi[:, start : start + 32])
        block = t5_bias(weights, 32, 96, bidirectional=False, offset=start)
        np.testing.assert_array_equal(block, whole_t5[:, start : start + 32])
