"""The Keras 3 RotaryEmbedding layer, on whichever backend KERAS_BACKEND selects.

Backend-agnostic: run it with KERAS_BACKEND=tensorflow, jax and torch. Expected values come
from the NumPy core: the scaling's frequencies from ``rope_scaling``, the float64 tables of
``rope_tables`` rounded to float32, and the rotation of ``apply_rope``.
"""

from __future__ import annotations

import contextlib
import doctest
import os
import warnings

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")

from keras import ops  # noqa: E402

import posenc.keras.rope  # noqa: E402
from conformance import keras_traced as traced  # noqa: E402
from posenc.core.rope import ROPE_SCALINGS, apply_rope, rope_scaling, rope_tables  # noqa: E402
from posenc.keras.rope import RotaryEmbedding  # noqa: E402

# Keras' torch backend converts tensors with np.array(tensor), which warns under NumPy 2.
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

BACKEND = keras.backend.backend()
BASE = 10000.0
HEAD_DIM = 16
ORIGINAL = 8  # original length of dynamic_ntk and longrope: the 12-token calls pass it
LENGTH_DEPENDENT = ("dynamic_ntk", "longrope")
FIXED = [name for name in ROPE_SCALINGS if name != "dynamic_ntk"]

RNG = np.random.default_rng(2024)
X = RNG.standard_normal((2, 12, 3, HEAD_DIM)).astype(np.float32)  # (batch, seq, heads, d)


def params_for(name: str, rotary_dim: int = HEAD_DIM) -> dict:
    """Realistic parameters scaled down to 16 features and a few dozen positions."""
    half = rotary_dim // 2
    return {
        "default": {},
        "linear": {"factor": 4.0},
        "ntk": {"factor": 4.0},
        "dynamic_ntk": {"factor": 4.0, "original_max_position_embeddings": ORIGINAL},
        "yarn": {"factor": 4.0, "original_max_position_embeddings": 32},
        # Llama 3.1's factors; L₀ = 1024 instead of 8192 so that with d = 16 (or 8) some
        # pairs are kept, one is blended and the rest are divided by 8.
        "llama3": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
        "longrope": {
            "short_factor": np.linspace(1.0, 2.0, half).tolist(),
            "long_factor": np.linspace(1.0, 8.0, half).tolist(),
            "original_max_position_embeddings": ORIGINAL,
            "max_position_embeddings": 4 * ORIGINAL,
        },
        "proportional": {"partial_rotary_factor": 0.5, "factor": 2.0},
    }[name]


def to_numpy(tensor) -> np.ndarray:
    """A backend tensor as NumPy; float16/bfloat16 widened exactly to float32."""
    if keras.backend.standardize_dtype(tensor.dtype) in ("float16", "bfloat16"):
        tensor = ops.cast(tensor, "float32")
    return ops.convert_to_numpy(tensor)


def core_tables(name, params, positions, *, layout="half", rotary_dim=None, length=None):
    """The core's float64 ``(cos, sin)`` at ``positions`` for a call of length ``length``.

    ``length`` (the L of dynamic_ntk and longrope) defaults to ``max(positions) + 1``.
    """
    if length is None:
        length = positions if np.isscalar(positions) else int(np.max(positions)) + 1
    extra = {"seq_len": length} if name in LENGTH_DEPENDENT else {}
    inv_freq, factor = rope_scaling(name, HEAD_DIM, BASE, rotary_dim=rotary_dim, **params, **extra)
    return rope_tables(positions, inv_freq, dtype="float64", layout=layout, scale=factor)


def core_rope(x, name, params, positions, *, layout="half", rotary_dim=None, length=None):
    """``apply_rope`` of ``x`` (batch, seq, heads, d) with the float64 tables in float32."""
    cos, sin = core_tables(
        name, params, positions, layout=layout, rotary_dim=rotary_dim, length=length
    )
    cos = cos.astype(np.float32)[..., None, :]  # (seq, 1, r) or (batch, seq, 1, r)
    sin = sin.astype(np.float32)[..., None, :]
    return apply_rope(x, cos, sin, layout=layout, rotary_dim=rotary_dim)


def assert_rotated(out, expected, x, factor=1.3):
    """Equal up to float32 rounding: three roundings of products bounded by ``factor·|x|``."""
    out = to_numpy(out) if not isinstance(out, np.ndarray) else out
    assert out.shape == expected.shape
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(out, expected, rtol=0, atol=2e-7 * factor * np.abs(x).max())


def rotate_f32(x, cos, sin, layout, rotary_dim):
    """The layer's float32 arithmetic in NumPy, same order: ``x·cos + turn(x)·sin``."""
    xr = x[..., :rotary_dim]
    h = rotary_dim // 2
    turned = np.empty_like(xr)
    if layout == "half":
        turned[..., :h], turned[..., h:] = -xr[..., h:], xr[..., :h]
    else:
        turned[..., 0::2], turned[..., 1::2] = -xr[..., 1::2], xr[..., 0::2]
    out = x.copy()
    out[..., :rotary_dim] = xr * cos + turned * sin
    return out


def int_tensor(value):
    return ops.convert_to_tensor(np.asarray(value, dtype=np.int32))


@contextlib.contextmanager
def wide_ints():
    """Let the backend hold int64 tensors: JAX needs its 64-bit mode for them."""
    if BACKEND == "jax":
        import jax

        with jax.enable_x64(True):
            yield
    else:
        yield


def int64_tensor(value):
    """An int64 tensor (inside :func:`wide_ints` on JAX)."""
    tensor = ops.convert_to_tensor(np.asarray(value, dtype=np.int64), dtype="int64")
    assert keras.backend.standardize_dtype(tensor.dtype) == "int64"
    return tensor


def nan_positions(out):
    """Which positions (axis 1 of ``(batch, seq, heads, d)``) are NaN in every feature,
    per batch row; asserts that no position is only partly NaN."""
    out = to_numpy(out)
    flat = out.reshape(out.shape[0], out.shape[1], -1)
    nan = np.isnan(flat)
    assert np.all(nan.all(axis=-1) | ~nan.any(axis=-1)), "a position is partly NaN"
    return nan.all(axis=-1)  # (batch, seq)


# --- values ------------------------------------------------------------------------------


@pytest.mark.backend_independent  # values: the conformance suite's rope cases
@pytest.mark.parametrize("name", list(ROPE_SCALINGS))
@pytest.mark.parametrize("rotary_dim", [None, 8])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_values_equal_the_core(layout, rotary_dim, name):
    params = params_for(name, rotary_dim or HEAD_DIM)
    layer = RotaryEmbedding(
        base=BASE,
        rotary_dim=rotary_dim,
        layout=layout,
        scaling=name,
        scaling_params=params,
        max_length=32,
    )
    out = layer(X)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    options = {"layout": layout, "rotary_dim": rotary_dim}
    expected = core_rope(X, name, params, 12, **options)  # L = 12: scaled, long factors
    assert_rotated(out, expected, X)
    if rotary_dim is not None:  # partial rotary: the other features pass through
        np.testing.assert_array_equal(to_numpy(out)[..., rotary_dim:], X[..., rotary_dim:])
    # A call up to the original length: dynamic_ntk unscaled, longrope's short factors.
    short = X[:, :6]
    assert_rotated(layer(short), core_rope(short, name, params, 6, **options), short)
    if name != "default":  # the parameters do change the result
        assert not np.allclose(expected, core_rope(X, "default", {}, 12, **options), atol=1e-3)
    assert layer.weights == []


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_float32_arithmetic_is_x_cos_plus_turned_x_sin(layout):
    """The layer's float32 result is NumPy's ``x·cos + turn(x)·sin`` in float32, bit for bit."""
    params = params_for("yarn")
    layer = RotaryEmbedding(layout=layout, scaling="yarn", scaling_params=params, max_length=16)
    inv_freq, factor = rope_scaling("yarn", HEAD_DIM, BASE, **params)
    cos, sin = rope_tables(12, inv_freq, dtype="float32", layout=layout, scale=factor)
    reference = rotate_f32(X, cos[:, None], sin[:, None], layout, HEAD_DIM)
    np.testing.assert_array_equal(to_numpy(layer(X)), reference)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_float64_layer_is_apply_rope_exactly(layout):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX warns that float64 needs jax_enable_x64
        probe = ops.convert_to_tensor(np.zeros(1), dtype="float64")
    if keras.backend.standardize_dtype(probe.dtype) != "float64":
        pytest.skip(f"the {BACKEND} backend has float64 disabled")
    params = params_for("yarn", 8)
    layer = RotaryEmbedding(
        layout=layout,
        rotary_dim=8,
        scaling="yarn",
        scaling_params=params,
        max_length=16,
        dtype="float64",
    )
    x64 = X.astype(np.float64)
    out = to_numpy(layer(x64))
    assert out.dtype == np.float64
    assert keras.backend.standardize_dtype(layer.cos.dtype) == "float64"
    cos, sin = core_tables("yarn", params, 12, layout=layout, rotary_dim=8)
    expected = apply_rope(x64, cos[:, None], sin[:, None], layout=layout, rotary_dim=8)
    np.testing.assert_array_equal(out, expected)


def test_axes_and_ranks():
    params = params_for("llama3", 8)
    options = {"layout": "interleaved", "rotary_dim": 8}
    expected = core_rope(X, "llama3", params, 12, **options)  # (batch, seq, heads, d)
    kwargs = {"scaling": "llama3", "scaling_params": params, **options}
    # (batch, heads, seq, head_dim), as Hugging Face
    bhsd = RotaryEmbedding(sequence_axis=2, **kwargs)(X.transpose(0, 2, 1, 3))
    assert_rotated(to_numpy(bhsd).transpose(0, 2, 1, 3), expected, X)
    # rank 3 (batch, seq, d)
    rank3 = RotaryEmbedding(**kwargs)(X[:, :, 0])
    assert_rotated(rank3, expected[:, :, 0], X)
    # features before positions: (batch, d, seq)
    first = RotaryEmbedding(sequence_axis=-1, feature_axis=1, **kwargs)(
        X[:, :, 0].transpose(0, 2, 1)
    )
    assert_rotated(to_numpy(first).transpose(0, 2, 1), expected[:, :, 0], X)


# --- positions ---------------------------------------------------------------------------


@pytest.mark.backend_independent  # values: the conformance suite's decode cases
@pytest.mark.parametrize("name", list(ROPE_SCALINGS))
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_decoding_one_token_at_a_time(layout, name):
    params = params_for(name)
    layer = RotaryEmbedding(layout=layout, scaling=name, scaling_params=params, max_length=12)
    full = to_numpy(layer(X))
    for t in range(12):
        step = to_numpy(layer(X[:, t : t + 1], start_index=t))
        if name in LENGTH_DEPENDENT:
            # The frequencies are those of L = t + 1, as the core gives them for that L.
            expected = core_rope(X[:, t : t + 1], name, params, [t], layout=layout, length=t + 1)
            assert_rotated(step, expected, X)
            if name == "longrope" and t >= ORIGINAL:  # past L₀ both use the long factors
                np.testing.assert_array_equal(step[:, 0], full[:, t])
        else:
            np.testing.assert_array_equal(step[:, 0], full[:, t])
        if t in (0, 9):  # an eager integer tensor works as the int
            as_tensor = to_numpy(layer(X[:, t : t + 1], start_index=int_tensor(t)))
            np.testing.assert_array_equal(as_tensor, step)
    if name == "dynamic_ntk":  # the method itself: steps before L₀ used other frequencies
        assert not np.allclose(to_numpy(layer(X[:, 7:8], start_index=7))[:, 0], full[:, 7])


@pytest.mark.parametrize("name", ["default", "yarn", "dynamic_ntk", "longrope"])
def test_explicit_positions(name):
    params = params_for(name)
    layer = RotaryEmbedding(scaling=name, scaling_params=params, max_length=16)
    packed = np.concatenate([np.arange(5), np.arange(7)])  # two sequences; L = 7 <= L₀
    assert_rotated(layer(X, positions=packed), core_rope(X, name, params, packed), X)
    batched = np.stack([np.arange(3, 15), RNG.permutation(12)])  # L = 15 > L₀
    expected = core_rope(X, name, params, batched)
    assert_rotated(layer(X, positions=batched), expected, X)
    assert_rotated(layer(X, positions=int_tensor(batched)), expected, X)
    # a batch of one broadcasts
    one = batched[:1]
    assert_rotated(layer(X, positions=one), core_rope(X, name, params, np.repeat(one, 2, 0)), X)
    # positions past the tables, the lowest within twice them: they grow (dynamic_ntk
    # computes these rows for the call)
    near = np.arange(20, 32)
    assert_rotated(layer(X, positions=int_tensor(near)), core_rope(X, name, params, near), X)
    grown = 16 if name == "dynamic_ntk" else 32
    assert layer.table_length == grown
    # all of them far past the tables: only this call's rows, as in PyTorch (the planner)
    far = np.arange(80, 92)
    assert_rotated(layer(X, positions=int_tensor(far)), core_rope(X, name, params, far), X)
    assert layer.table_length == grown


def test_tables_grow_for_static_positions():
    layer = RotaryEmbedding(scaling="linear", scaling_params={"factor": 2.0}, max_length=4)
    assert_rotated(layer(X), core_rope(X, "linear", {"factor": 2.0}, 12), X)
    assert layer.table_length >= 12
    out = layer(X[:, :3], start_index=20)  # starts within twice the table: it grows
    assert_rotated(out, core_rope(X[:, :3], "linear", {"factor": 2.0}, np.arange(20, 23)), X)
    assert layer.table_length >= 23
    grown = layer.table_length
    out = layer(X[:, :3], start_index=100)  # far past it: only these rows, from the core
    assert_rotated(out, core_rope(X[:, :3], "linear", {"factor": 2.0}, np.arange(100, 103)), X)
    assert layer.table_length == grown
    np.testing.assert_array_equal(
        to_numpy(layer.cos),
        rope_tables(layer.table_length, rope_scaling("linear", 16, factor=2.0)[0])[0],
    )


# --- traced calls ------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXED)
def test_tensor_start_index_in_traced_function(name):
    params = params_for(name)
    layer = RotaryEmbedding(scaling=name, scaling_params=params, max_length=16)
    rotate = traced(lambda x, start: layer(x, start_index=start))
    # (3, 4): L = 7 <= L₀, longrope's short factors; (11, 1): L = 12, the long ones.
    for start, length in [(0, 12), (3, 4), (11, 1)]:
        chunk = X[:, start : start + length]
        out = rotate(chunk, int_tensor(start))
        assert_rotated(out, core_rope(chunk, name, params, np.arange(start, start + length)), X)

    tokens = keras.Input(shape=(None, 3, HEAD_DIM))
    start_input = keras.Input(batch_shape=(), dtype="int32")
    model = keras.Model([tokens, start_input], layer(tokens, start_index=start_input))
    assert tuple(model.output.shape) == (None, None, 3, HEAD_DIM)
    run = traced(lambda x, start: model([x, start]))
    out = run(ops.convert_to_tensor(X[:, 3:7]), int_tensor(3))
    assert_rotated(out, core_rope(X[:, 3:7], name, params, np.arange(3, 7)), X)


def test_traced_positions_after_extend():
    params = params_for("longrope")
    layer = RotaryEmbedding(scaling="longrope", scaling_params=params, max_length=8)
    layer.build(X.shape)
    layer.extend(64)
    assert layer.table_length == 64
    rotate = traced(lambda x, positions: layer(x, positions=positions))
    for positions in (np.arange(50, 62), np.arange(12) % 6):  # long, then short factors
        out = rotate(X, int_tensor(positions))
        assert_rotated(out, core_rope(X, "longrope", params, positions), X)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_traced_positions_outside_the_tables_give_nan(layout):
    layer = RotaryEmbedding(layout=layout, max_length=8)
    layer.build(X.shape)
    x = X[:, :4]
    gather = traced(lambda x, positions: layer(x, positions=positions))
    for positions in (np.array([9, -1, 0, 7]), np.array([[7, 8, 2, -3], [0, 1, 2**30, 3]])):
        out = gather(x, int_tensor(positions))
        inside = (positions >= 0) & (positions < 8)
        np.testing.assert_array_equal(nan_positions(out), np.broadcast_to(~inside, (2, 4)))
        expected = core_rope(x, "default", {}, np.where(inside, positions, 0), layout=layout)
        both = np.broadcast_to(inside, (2, 4))  # (batch, seq)
        assert_rotated(to_numpy(out)[both], expected[both], X)
    rotate = traced(lambda x, start: layer(x, start_index=start))
    for start in (0, 6, 9, -2, -5):
        out = rotate(x, int_tensor(start))
        positions = start + np.arange(4)
        inside = (positions >= 0) & (positions < 8)
        np.testing.assert_array_equal(nan_positions(out), np.broadcast_to(~inside, (2, 4)))
        expected = core_rope(x, "default", {}, np.where(inside, positions, 0), layout=layout)
        assert_rotated(to_numpy(out)[:, inside], expected[:, inside], X)
    assert layer.table_length == 8  # a trace never grows the tables


def test_traced_longrope_outside_the_tables_keeps_the_length_rule():
    """Out-of-range positions give NaN, and still count in L = max(positions) + 1."""
    params = params_for("longrope")
    layer = RotaryEmbedding(scaling="longrope", scaling_params=params, max_length=16)
    layer.build(X.shape)
    gather = traced(lambda x, positions: layer(x, positions=positions))
    x = X[:, :2]
    out = to_numpy(gather(x, int_tensor([3, 20])))  # L = 21 > 8: the long factors
    np.testing.assert_array_equal(nan_positions(out), [[False, True]] * 2)
    expected = core_rope(x[:, :1], "longrope", params, np.array([3]), length=21)
    assert_rotated(out[:, :1], expected, X)
    rotate = traced(lambda x, start: layer(x, start_index=start))
    out = to_numpy(rotate(x, int_tensor(15)))  # positions 15, 16: L = 17, long factors
    np.testing.assert_array_equal(nan_positions(out), [[False, True]] * 2)
    expected = core_rope(x[:, :1], "longrope", params, np.array([15]), length=17)
    assert_rotated(out[:, :1], expected, X)


def test_int64_start_index_and_positions_are_checked_before_any_cast():
    layer = RotaryEmbedding(max_length=16)
    x = X[:, :2]
    expected = to_numpy(layer(x, start_index=3))
    with wide_ints():
        with pytest.raises(ValueError, match=r"start_index must be below 2\*\*31.*got 4294967299"):
            layer(x, start_index=int64_tensor(2**32 + 3))  # was read as 3
        with pytest.raises(ValueError, match=r"positions must be below 2\*\*31.*got 4294967300"):
            layer(x, positions=int64_tensor([3, 2**32 + 4]))
        np.testing.assert_array_equal(to_numpy(layer(x, start_index=int64_tensor(3))), expected)
        np.testing.assert_array_equal(to_numpy(layer(x, positions=int64_tensor([3, 4]))), expected)
        rotate = traced(lambda x, start: layer(x, start_index=start))
        gather = traced(lambda x, positions: layer(x, positions=positions))
        # Traced, wide values saturate to the int32 range instead of wrapping: NaN.
        for start in (2**32 + 3, -(2**32) + 3):
            assert np.all(np.isnan(to_numpy(rotate(x, int64_tensor(start)))))
        out = gather(x, int64_tensor([3, 2**32 + 4]))
        np.testing.assert_array_equal(nan_positions(out), [[False, True]] * 2)
        assert_rotated(to_numpy(out)[:, :1], expected[:, :1], X)
    with pytest.raises(ValueError, match=r"start_index must be below 2\*\*31.*got 2147483648"):
        layer(x, start_index=2**31)
    with pytest.raises(ValueError, match=r"positions must be below 2\*\*31.*got 4294967300"):
        layer(x, positions=np.array([3, 2**32 + 4]))  # NumPy: checked before any conversion
    assert layer.table_length == 16


@pytest.mark.parametrize("name", ["llama3", "longrope"])
def test_positions_input_of_a_functional_model(name):
    params = params_for(name)
    tokens = keras.Input(shape=(12, 3, HEAD_DIM))
    positions = keras.Input(shape=(12,), dtype="int32")
    layer = RotaryEmbedding(scaling=name, scaling_params=params, max_length=32)
    model = keras.Model([tokens, positions], layer(tokens, positions=positions))
    for batched in (
        np.stack([np.arange(3, 15), RNG.permutation(12)]),
        np.tile(np.arange(12) % 5, (2, 1)),
    ):
        out = model.predict([X, batched.astype(np.int32)], verbose=0)  # traced, but torch
        assert_rotated(out, core_rope(X, name, params, batched), X)


def test_layer_first_built_inside_a_trace():
    layer = RotaryEmbedding(layout="interleaved", max_length=16)
    expected = core_rope(X, "default", {}, 12, layout="interleaved")
    assert_rotated(traced(lambda x: layer(x))(X), expected, X)
    # The tables kept on the layer are concrete, so eager calls and new traces still work.
    assert_rotated(layer(X), expected, X)
    assert_rotated(
        traced(lambda x: layer(x, start_index=20))(X[:, :2]),
        core_rope(X[:, :2], "default", {}, np.arange(20, 22), layout="interleaved"),
        X,
    )
    assert layer.table_length >= 22
    assert_rotated(layer(X), expected, X)


def test_dynamic_ntk_needs_a_known_length():
    params = params_for("dynamic_ntk")
    layer = RotaryEmbedding(scaling="dynamic_ntk", scaling_params=params, max_length=16)
    tokens = keras.Input(shape=(12, 3, HEAD_DIM))
    start = keras.Input(batch_shape=(), dtype="int32")
    with pytest.raises(ValueError, match=r"dynamic_ntk.*known only inside a trace.*'ntk'"):
        layer(tokens, start_index=start)
    positions = keras.Input(shape=(12,), dtype="int32")
    with pytest.raises(ValueError, match=r"dynamic_ntk.*known only inside a trace.*'ntk'"):
        layer(tokens, positions=positions)
    rotate = traced(lambda x, s: layer(x, start_index=s))
    with pytest.raises(ValueError, match=r"dynamic_ntk.*known only inside a trace.*'ntk'"):
        rotate(X, int_tensor(2))
    gather = traced(lambda x, p: layer(x, positions=p))
    with pytest.raises(ValueError, match=r"dynamic_ntk.*known only inside a trace.*'ntk'"):
        gather(X, int_tensor(np.arange(12)))
    # a Python int start_index with a static shape works in a trace too: L = 14
    out = traced(lambda x: layer(x, start_index=2))(X)
    assert_rotated(out, core_rope(X, "dynamic_ntk", params, np.arange(2, 14)), X)


# --- symbolic use, training, serialization -----------------------------------------------


def test_compute_output_shape_and_symbolic_call():
    layer = RotaryEmbedding(rotary_dim=8)
    assert layer.compute_output_shape((None, 7, 2, 16)) == (None, 7, 2, 16)
    tokens = keras.Input(shape=(None, 2, 16))
    out = layer(tokens)
    assert tuple(out.shape) == (None, None, 2, 16)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    assert (layer.spec.head_dim, layer.spec.rotary_dim) == (16, 8)
    model = keras.Model(tokens, out)
    expected = core_rope(X[:, :, :2], "default", {}, 12, rotary_dim=8)
    assert_rotated(model(X[:, :, :2]), expected, X)


def tiny_model(layer):
    """Dense → heads → RotaryEmbedding → Flatten → Dense, on (batch, 12, 8) inputs."""
    inputs = keras.Input(shape=(12, 8))
    hidden = keras.layers.Dense(3 * HEAD_DIM)(inputs)
    heads = keras.layers.Reshape((12, 3, HEAD_DIM))(hidden)
    rotated = layer(heads)
    return keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(rotated)))


def test_fit_step():
    params = params_for("llama3")
    model = tiny_model(RotaryEmbedding(scaling="llama3", scaling_params=params))
    model.compile(optimizer="adam", loss="mse")
    history = model.fit(
        RNG.standard_normal((4, 12, 8)).astype(np.float32),
        RNG.standard_normal((4, 2)).astype(np.float32),
        batch_size=4,
        epochs=1,
        verbose=0,
    )
    assert np.isfinite(history.history["loss"][0])


def test_config_round_trip():
    params = params_for("longrope", 8)
    layer = RotaryEmbedding(
        base=500.0,
        rotary_dim=8,
        layout="interleaved",
        scaling="longrope",
        scaling_params=params,
        max_length=20,
        sequence_axis=2,
        feature_axis=3,
    )
    config = layer.get_config()
    for key, value in {
        "base": 500.0,
        "rotary_dim": 8,
        "layout": "interleaved",
        "scaling": "longrope",
        "scaling_params": params,
        "max_length": 20,
        "sequence_axis": 2,
        "feature_axis": 3,
    }.items():
        assert config[key] == value
    x = X.transpose(0, 2, 1, 3)  # (batch, heads, seq, d)
    expected = to_numpy(layer(x))
    for clone in (
        RotaryEmbedding.from_config(config),
        keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer)),
    ):
        assert isinstance(clone, RotaryEmbedding)
        assert clone.get_config() == config
        np.testing.assert_array_equal(to_numpy(clone(x)), expected)
    assert RotaryEmbedding().get_config()["scaling"] == "default"


def test_keras_file_round_trip(tmp_path):
    params = params_for("yarn")
    model = tiny_model(RotaryEmbedding(base=500.0, scaling="yarn", scaling_params=params))
    x = RNG.standard_normal((3, 12, 8)).astype(np.float32)
    expected = model.predict(x, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), expected)
    layer = next(lay for lay in loaded.layers if isinstance(lay, RotaryEmbedding))
    assert layer.get_config()["scaling_params"] == params
    assert layer.weights == []
    assert len(loaded.weights) == 4  # the two Dense kernels and biases only


def test_extend_is_saved_in_the_config_and_keras_file(tmp_path):
    tokens = keras.Input(shape=(None, 1, HEAD_DIM))
    layer = RotaryEmbedding(max_length=8)
    model = keras.Model(tokens, layer(tokens))
    layer.extend(100)
    assert layer.table_length == 100
    assert layer.get_config()["max_length"] == 100  # the tables' length, not the initial 8
    path = tmp_path / "extended.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    clone = next(lay for lay in loaded.layers if isinstance(lay, RotaryEmbedding))
    assert clone.table_length == 100
    # So positions up to 99 work inside a trace in the restored model (8 rows would give NaN).
    gather = traced(lambda x, positions: clone(x, positions=positions))
    x = X[:1, :4, :1]
    positions = np.array([0, 50, 98, 99])
    assert_rotated(gather(x, int_tensor(positions)), core_rope(x, "default", {}, positions), X)
    growing = RotaryEmbedding(max_length=4)
    growing(X)  # 12 known positions: the tables grow, and the config follows them
    assert growing.get_config()["max_length"] == growing.table_length >= 12
    assert RotaryEmbedding(max_length=6).get_config()["max_length"] == 6  # before build


# --- mixed precision ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy_name", "fmt"), [("mixed_float16", "float16"), ("mixed_bfloat16", "bfloat16")]
)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_mixed_precision_rotates_in_float32(policy, policy_name, fmt, layout):
    policy(policy_name)
    params = params_for("yarn")
    layer = RotaryEmbedding(layout=layout, scaling="yarn", scaling_params=params, max_length=2048)
    assert layer.compute_dtype == fmt
    out = layer(X, start_index=2030)  # autocast to fmt
    assert keras.backend.standardize_dtype(out.dtype) == fmt
    for table in (layer.cos, layer.sin):
        assert keras.backend.standardize_dtype(table.dtype) == "float32"
    inv_freq, factor = rope_scaling("yarn", HEAD_DIM, BASE, **params)
    cos, sin = rope_tables(2048, inv_freq, layout=layout, scale=factor)  # float32, exact
    np.testing.assert_array_equal(to_numpy(layer.cos), cos)
    np.testing.assert_array_equal(to_numpy(layer.sin), sin)
    # The input rounded to fmt, rotated in float32, cast back to fmt.
    x_low = to_numpy(ops.cast(X, fmt))
    rows = slice(2030, 2042)
    reference = rotate_f32(x_low, cos[rows, None], sin[rows, None], layout, HEAD_DIM)
    np.testing.assert_array_equal(to_numpy(out), to_numpy(ops.cast(reference, fmt)))
    exact = apply_rope(x_low, cos[rows, None], sin[rows, None], layout=layout)
    ulp = 2.0**-10 if fmt == "float16" else 2.0**-7
    np.testing.assert_allclose(to_numpy(out), exact, rtol=0, atol=ulp * np.abs(X).max())


def test_bfloat16_tables_would_differ(policy):
    """The trap: cos/sin of angles formed in bfloat16 are whole turns off at large positions."""
    policy("mixed_bfloat16")
    layer = RotaryEmbedding(max_length=2048)
    layer(X)
    inv_freq = rope_scaling("default", HEAD_DIM, BASE)[0]
    exact, _ = rope_tables(2048, inv_freq, dtype="float64")
    ours = to_numpy(layer.cos)
    assert np.abs(ours - exact).max() <= 2.0**-24 + 1e-15  # half a float32 ulp below 1
    angles = ops.multiply(
        ops.cast(ops.arange(2048)[:, None], "bfloat16"), ops.cast(inv_freq[None, :], "bfloat16")
    )
    naive = to_numpy(ops.cos(angles))  # (2048, 8): the first half of a "half" table
    assert np.abs(naive - exact[:, :8]).max() > 0.5
    # Rotating with the naive table would move the output far from ours.
    rows = slice(2030, 2042)
    x_low = to_numpy(ops.cast(X, "bfloat16"))
    naive_sin = to_numpy(ops.sin(angles))
    naive_out = rotate_f32(
        x_low,
        np.tile(naive[rows], 2)[:, None],
        np.tile(naive_sin[rows], 2)[:, None],
        "half",
        HEAD_DIM,
    )
    ours_out = to_numpy(layer(X, start_index=2030))
    assert np.abs(naive_out - ours_out).max() > 0.5


# --- bad arguments and inputs ------------------------------------------------------------


@pytest.mark.backend_independent  # options: validated by the specs
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"base": 1.0}, ValueError, "base must not be 1"),
        ({"base": "big"}, TypeError, "base.*big"),
        ({"rotary_dim": 7}, ValueError, "rotary_dim must be even.*7"),
        ({"rotary_dim": 0}, ValueError, "rotary_dim.*0"),
        ({"rotary_dim": 8.0}, TypeError, r"rotary_dim.*8\.0"),
        ({"layout": "halves"}, ValueError, "layout.*halves"),
        ({"max_length": 0}, ValueError, "max_length.*0"),
        ({"scaling": "dynamic"}, ValueError, "'dynamic' is called 'dynamic_ntk'"),
        ({"scaling": "rope2"}, ValueError, "unknown RoPE scaling 'rope2'.*llama3"),
        ({"scaling": 3}, TypeError, r"scaling.*3 \(int\)"),
        ({"scaling_params": {"factor": 2.0}}, ValueError, r"\['factor'\].*without a scaling"),
        ({"scaling": "linear", "scaling_params": [2.0]}, TypeError, r"scaling_params.*\[2\.0\]"),
        ({"scaling": "linear"}, TypeError, r"missing \['factor'\]"),
        (
            {"scaling": "linear", "scaling_params": {"factor": 2.0, "beta": 1.0}},
            TypeError,
            r"unknown \['beta'\]",
        ),
        ({"scaling": "linear", "scaling_params": {"factor": 0.5}}, ValueError, "factor.*0.5"),
        (
            {
                "scaling": "dynamic_ntk",
                "scaling_params": {**params_for("dynamic_ntk"), "seq_len": 9},
            },
            TypeError,
            "'dynamic_ntk': seq_len is not a parameter",
        ),
        (
            {"scaling": "longrope", "scaling_params": {**params_for("longrope"), "seq_len": 9}},
            TypeError,
            "'longrope': seq_len is not a parameter",
        ),
        (
            {"scaling": "longrope", "rotary_dim": 4, "scaling_params": params_for("longrope")},
            ValueError,
            r"short_factor.*rotary_dim // 2 = 2.*\(8,\)",
        ),
        (
            {"scaling": "ntk", "scaling_params": {"factor": 2.0}, "rotary_dim": 2},
            ValueError,
            "d > 2",
        ),
        ({"sequence_axis": 1.0}, TypeError, r"sequence_axis.*1\.0"),
        ({"sequence_axis": 2, "feature_axis": 2}, ValueError, "must differ.*2"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        RotaryEmbedding(**kwargs)


@pytest.mark.backend_independent  # shapes: checked in Python at build
@pytest.mark.parametrize(
    ("kwargs", "shape", "match"),
    [
        ({"rotary_dim": 32}, (1, 4, 2, 16), "rotary_dim must be at most head_dim=16.*32"),
        ({}, (1, 4, 2, 15), "even int >= 2.*head_dim.*15"),
        ({}, (4, 16), r"rank >= 3.*\(4, 16\)"),
        ({"sequence_axis": 4}, (1, 4, 2, 16), "sequence_axis=4 is out of range.*rank 4"),
        ({"sequence_axis": 0}, (1, 4, 2, 16), "sequence_axis=0 names the batch axis"),
        ({"feature_axis": -4}, (1, 4, 2, 16), "feature_axis=-4 names the batch axis"),
        ({"sequence_axis": 3}, (1, 4, 2, 16), r"sequence_axis=3 and feature_axis=-1.*axis 3"),
        ({}, (1, 4, 2, None), "known feature axis"),
        (
            {"scaling": "longrope", "scaling_params": params_for("longrope")},
            (1, 4, 2, 12),
            r"short_factor.*rotary_dim // 2 = 6.*\(8,\)",
        ),
    ],
)
def test_bad_build(kwargs, shape, match):
    with pytest.raises(ValueError, match=match):
        RotaryEmbedding(**kwargs).build(shape)


def test_bad_inputs():
    layer = RotaryEmbedding(max_length=16)
    x = X[:, :4]
    with pytest.raises(TypeError, match="floating.*int32"):
        layer(x.astype(np.int32))
    layer(x)  # builds for rank 4, head_dim 16
    with pytest.raises(ValueError, match=r"feature axis of the input is 8.*head_dim=16"):
        layer(x[..., :8])
    with pytest.raises(ValueError, match=r"built for inputs of rank 4.*\(2, 4, 16\)"):
        layer(x[:, :, 0])
    with pytest.raises(ValueError, match=r"start_index.*-1"):
        layer(x, start_index=-1)
    with pytest.raises(ValueError, match=r"start_index must be an int >= 0, got -2"):
        layer(x, start_index=int_tensor(-2))
    with pytest.raises(TypeError, match=r"start_index.*1\.5"):
        layer(x, start_index=1.5)
    with pytest.raises(TypeError, match=r"start_index.*True"):
        layer(x, start_index=True)
    with pytest.raises(TypeError, match="start_index must be an integer.*float32"):
        layer(x, start_index=ops.convert_to_tensor(1.0))
    with pytest.raises(ValueError, match=r"start_index must be a scalar.*\(2,\)"):
        layer(x, start_index=int_tensor([1, 2]))
    with pytest.raises(ValueError, match=r"positions must be whole numbers.*2\.5"):
        layer(x, positions=np.array([0.0, 1.0, 2.5, 3.0]))
    with pytest.raises(TypeError, match="positions must be an integer or floating tensor.*bool"):
        layer(x, positions=[True, False, True, False])
    with pytest.raises(ValueError, match=r"positions must be whole numbers.*nan"):
        layer(x, positions=ops.convert_to_tensor(np.array([0, 1, np.nan, 3], np.float32)))
    with pytest.raises(TypeError, match=r"positions must be an integer or floating.*'0:4'"):
        layer(x, positions="0:4")
    with pytest.raises(ValueError, match=r"seq=4, got shape \(5,\)"):
        layer(x, positions=np.arange(5))
    with pytest.raises(ValueError, match=r"seq=4, got shape \(1, 2, 4\)"):
        layer(x, positions=np.zeros((1, 2, 4), np.int32))
    with pytest.raises(ValueError, match="positions has batch size 3 but the input has 2"):
        layer(x, positions=np.zeros((3, 4), np.int32))
    with pytest.raises(ValueError, match="positions must be >= 0, got -1"):
        layer(x, positions=np.array([0, 1, -1, 2]))
    with pytest.raises(ValueError, match="either start_index or positions.*start_index=3"):
        layer(x, start_index=3, positions=np.arange(4))
    with pytest.raises(ValueError, match="before extending"):
        RotaryEmbedding().extend(10)
    with pytest.raises(ValueError, match="call it"):
        _ = RotaryEmbedding().cos


# --- docs --------------------------------------------------------------------------------


def test_docstring_examples_run():
    result = doctest.testmod(
        posenc.keras.rope, extraglobs={"keras": keras}, optionflags=doctest.ELLIPSIS
    )
    assert result.attempted > 0
    assert result.failed == 0
