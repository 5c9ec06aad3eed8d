"""The Keras layers where keras-hub's ``RotaryEmbedding`` and ``SinePositionEncoding``
stood, on whichever backend ``KERAS_BACKEND`` names (issue 37, items 13 to 15).

* Every layer's output spec says the dtype its call returns, under ``"mixed_float16"``,
  ``"mixed_bfloat16"`` and with ``autocast=False``: a model built symbolically is told
  the dtype it gets.
* Positions may be whole numbers in a floating dtype, as keras-hub's and Gemma's code
  pass them (``ops.cast(..., "float32")``), read exactly even where the layer's mixed
  policy would round them; a fractional value is a ``ValueError`` when known and a NaN
  row in a trace.
* ``SinusoidalPositionalEncoding`` takes ``positions=`` (as ``RotaryEmbedding``) and
  inputs of rank >= 3 with the positions on axis -2, as keras-hub's layer.

Expected values come from the NumPy core (``posenc.sinusoidal``, ``rope_tables``), the
layer's own output at integer positions (the same rows, bit for bit), and, where
keras_hub is installed, keras-hub's ``SinePositionEncoding``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")

from keras import ops  # noqa: E402

import posenc  # noqa: E402
from conformance import keras_traced as traced  # noqa: E402
from posenc.core.rope import rope_tables  # noqa: E402
from posenc.keras import (  # noqa: E402
    ALiBiBias,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    SinusoidalPositionalEncodingND,
    T5RelativeBias,
)

# Keras' torch backend converts tensors with np.array(tensor), which warns under NumPy 2.
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(1315)
HEADS, HEAD_DIM, D_MODEL = 8, 64, 64  # Gemma 2B's head width, 8 heads


def as_f64(tensor: Any) -> np.ndarray:
    """A backend tensor of any float dtype as float64 NumPy (exact widening)."""
    if keras.backend.standardize_dtype(tensor.dtype) in ("float16", "bfloat16"):
        tensor = ops.cast(tensor, "float32")
    return np.asarray(ops.convert_to_numpy(tensor), dtype=np.float64)


def normal(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def ints(values: Any) -> Any:
    return ops.convert_to_tensor(np.asarray(values, dtype=np.int32))


def floats(values: Any, dtype: str = "float32") -> Any:
    """Positions as a floating backend tensor, as keras-hub passes them."""
    return ops.cast(ops.convert_to_tensor(np.asarray(values, dtype=np.int32)), dtype)


def nan_rows(out: np.ndarray, axis: int) -> np.ndarray:
    """Which positions (``axis``) are NaN in every other entry; none only partly NaN."""
    moved = np.moveaxis(out, axis, 0).reshape(out.shape[axis], -1)
    nan = np.isnan(moved)
    assert np.all(nan.all(axis=1) | ~nan.any(axis=1)), "a position is partly NaN"
    return nan.all(axis=1)


# --- item 13: the output spec says the dtype the call returns ----------------------------

LAYERS: dict[str, tuple[Callable[..., Any], tuple[int, ...]]] = {
    "sinusoidal": (lambda **kw: SinusoidalPositionalEncoding(max_length=16, **kw), (2, 5, 8)),
    "learned": (lambda **kw: LearnedPositionalEmbedding(max_length=16, **kw), (2, 5, 8)),
    "rope": (lambda **kw: RotaryEmbedding(max_length=16, **kw), (2, 5, HEADS, 16)),
    "nd": (lambda **kw: SinusoidalPositionalEncodingND(**kw), (2, 4, 5, 6)),
    "alibi": (lambda **kw: ALiBiBias(HEADS, **kw), (2, HEADS, 5, 5)),
    "t5": (lambda **kw: T5RelativeBias(HEADS, **kw), (2, HEADS, 5, 5)),
}


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize(
    ("policy_name", "autocast", "returned"),
    [
        ("mixed_float16", True, "float16"),
        ("mixed_bfloat16", True, "bfloat16"),
        ("mixed_float16", False, "float32"),  # no autocast: the float32 input's dtype
    ],
)
def test_output_spec_says_the_dtype_the_call_returns(policy, name, policy_name, autocast, returned):
    policy(policy_name)
    make, shape = LAYERS[name]
    layer = make(autocast=autocast)
    eager = layer(normal(shape))
    assert keras.backend.standardize_dtype(eager.dtype) == returned
    spec = layer.compute_output_spec(keras.KerasTensor(shape, dtype="float32"))
    assert (tuple(spec.shape), spec.dtype) == (shape, returned)
    symbolic = make(autocast=autocast)(keras.Input(shape=shape[1:]))
    assert (tuple(symbolic.shape), symbolic.dtype) == ((None, *shape[1:]), returned)


# --- item 14: whole positions in a floating dtype ----------------------------------------


def sinusoidal_layer() -> Any:
    return SinusoidalPositionalEncoding(max_length=64)


def rope_layer() -> Any:
    return RotaryEmbedding(max_length=64)


POSITIONAL = {"sinusoidal": sinusoidal_layer, "rope": rope_layer}


def example(name: str, seq: int = 6) -> np.ndarray:
    """Queries ``(batch, seq, heads, head_dim)`` or embeddings ``(batch, seq, d_model)``."""
    return normal((2, seq, HEADS, HEAD_DIM) if name == "rope" else (2, seq, D_MODEL))


def core_output(name: str, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The core's output at integer ``positions`` ``(seq,)`` or ``(batch, seq)``, float64."""
    x = x.astype(np.float64)
    if name == "sinusoidal":  # (seq, d) or (batch, seq, d), broadcast over the batch
        return x + posenc.sinusoidal(positions, D_MODEL, dtype="float32").astype(np.float64)
    cos, sin = rope_tables(positions, posenc.rope_frequencies(HEAD_DIM), dtype="float32")
    cos, sin = cos.astype(np.float64)[..., None, :], sin.astype(np.float64)[..., None, :]
    half = HEAD_DIM // 2
    turned = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + turned * sin


def assert_core(name: str, out: Any, x: np.ndarray, positions: np.ndarray) -> None:
    """Exact for the sinusoidal sum, to float32 rounding for the rotation."""
    expected = core_output(name, x, positions)
    out = as_f64(out) if not isinstance(out, np.ndarray) else out.astype(np.float64)
    if name == "sinusoidal":
        np.testing.assert_array_equal(out, expected.astype(np.float32))
    else:
        atol = 2e-7 * 1.3 * np.abs(x).max()
        np.testing.assert_allclose(out, expected, rtol=0, atol=atol)


@pytest.mark.parametrize("name", list(POSITIONAL))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_whole_positions_in_a_floating_dtype(name, dtype):
    if dtype == "float64" and BACKEND == "jax":
        pytest.skip("JAX runs without float64 unless x64 is enabled")
    layer = POSITIONAL[name]()
    x = example(name)
    packed = np.array([0, 1, 2, 0, 1, 2])  # two sequences of three, keras-hub's ops.cast
    batched = np.stack([np.arange(6), np.arange(40, 46)])  # 40..45 within the table
    for positions in (packed, batched):
        expected = as_f64(layer(x, positions=positions))  # integer positions
        assert_core(name, expected, x, positions)
        given = floats(positions, dtype)
        np.testing.assert_array_equal(as_f64(layer(x, positions=given)), expected)
    run = traced(lambda x, p: layer(x, positions=p))  # traced: compared with a trace
    np.testing.assert_array_equal(
        as_f64(run(x, floats(batched, dtype))), as_f64(run(x, ints(batched)))
    )
    # a NumPy array or list of floats, as an integer one
    expected = as_f64(layer(x, positions=packed))
    np.testing.assert_array_equal(as_f64(layer(x, positions=packed.astype(dtype))), expected)
    np.testing.assert_array_equal(as_f64(layer(x, positions=[float(p) for p in packed])), expected)


@pytest.mark.parametrize("name", list(POSITIONAL))
@pytest.mark.parametrize(
    ("policy_name", "exact_up_to"), [("mixed_float16", 2048), ("mixed_bfloat16", 256)]
)
def test_float32_positions_are_not_rounded_by_a_mixed_policy(
    policy, name, policy_name, exact_up_to
):
    """Keras casts a layer's floating arguments to its compute dtype: float16 holds the
    integers only up to 2048, bfloat16 up to 256. The positions are read before that."""
    policy(policy_name)
    layer = POSITIONAL[name]()
    x = example(name)
    positions = np.arange(exact_up_to + 1, exact_up_to + 7)  # not all representable there
    float_positions = floats(positions)
    expected = as_f64(layer(x, positions=positions))
    np.testing.assert_array_equal(as_f64(layer(x, positions=float_positions)), expected)
    layer.extend(exact_up_to + 8)  # traced positions read the table: no NaN rows
    run = traced(lambda x, p: layer(x, positions=p))
    np.testing.assert_array_equal(as_f64(run(x, float_positions)), as_f64(run(x, ints(positions))))
    # ... and the rounded positions would have given other rows
    rounded = ops.convert_to_numpy(ops.cast(float_positions, layer.compute_dtype))
    assert not np.array_equal(rounded.astype(np.int64), positions)
    assert not np.array_equal(as_f64(layer(x, positions=rounded.astype(np.int64))), expected)


@pytest.mark.parametrize("name", list(POSITIONAL))
def test_float_positions_input_of_a_functional_model(name):
    layer = POSITIONAL[name]()
    x = example(name)
    tokens = keras.Input(shape=x.shape[1:])
    positions = keras.Input(shape=(x.shape[1],), dtype="float32")
    model = keras.Model([tokens, positions], layer(tokens, positions=positions))
    batched = np.stack([np.arange(6), np.array([3, 4, 5, 0, 1, 2])])
    expected = as_f64(layer(x, positions=batched))
    assert_core(name, expected, x, batched)
    np.testing.assert_array_equal(as_f64(model([x, batched.astype(np.float32)])), expected)
    predicted = model.predict([x, batched.astype(np.float32)], verbose=0)  # compiled
    assert_core(name, predicted, x, batched)


@pytest.mark.parametrize("name", list(POSITIONAL))
def test_fractional_positions(name):
    layer = POSITIONAL[name]()
    x = example(name, seq=4)
    for bad, shown in ((2.5, "2.5"), (np.nan, "nan"), (np.inf, "inf"), (-1.0, "-1")):
        values = np.array([0.0, 1.0, bad, 3.0])
        match = "must be >= 0" if bad == -1.0 else f"must be whole numbers.*got {shown}"
        with pytest.raises(ValueError, match=match):
            layer(x, positions=values)  # NumPy: before Keras converts it
        with pytest.raises(ValueError, match=match):
            layer(x, positions=ops.convert_to_tensor(values.astype(np.float32)))
    # In a trace the values are unknown: a position that is not a whole number in
    # 0 .. 2**31 - 1 reads as one outside every table, so its row is NaN.
    run = traced(lambda x, p: layer(x, positions=p))
    values = np.array([[0.0, 2.5, 2.0, np.nan], [np.inf, 1.0, -1.0, 2.0**31]], np.float32)
    out = as_f64(run(x, ops.convert_to_tensor(values)))  # (batch, seq, ...)
    for row, whole in ((0, [0, 2]), (1, [1])):
        assert nan_rows(out[row], axis=0).tolist() == [i not in whole for i in range(4)]
        expected = core_output(name, x[row, whole][None], values[row, whole].astype(int))
        np.testing.assert_allclose(out[row, whole][None], expected, rtol=0, atol=1e-6)


# --- item 15: the sinusoidal layer as keras-hub's SinePositionEncoding ------------------


def test_sinusoidal_inputs_of_rank_four_and_five():
    layer = SinusoidalPositionalEncoding(max_length=64)
    table = posenc.sinusoidal(64, D_MODEL, dtype="float32")
    x = normal((2, 3, 10, D_MODEL))  # (batch, extra, seq, d_model)
    np.testing.assert_array_equal(as_f64(layer(x)), x + table[:10])
    np.testing.assert_array_equal(as_f64(layer(x, start_index=7)), x + table[7:17])
    positions = np.stack([np.arange(10), np.arange(30, 40)])  # (batch, seq)
    out = as_f64(layer(x, positions=positions))
    np.testing.assert_array_equal(out, x + table[positions][:, None])  # over the extra axis
    five = normal((2, 2, 3, 10, D_MODEL))
    np.testing.assert_array_equal(
        as_f64(layer(five, positions=positions)), five + table[positions][:, None, None]
    )
    step = traced(lambda x, s: layer(x, start_index=s))
    start = ops.convert_to_tensor(np.int32(5))
    np.testing.assert_array_equal(as_f64(step(x[:, :, :1], start)), x[:, :, :1] + table[5:6])
    # a symbolic rank-4 input with an unknown length
    inputs = keras.Input(shape=(3, None, D_MODEL))
    model = keras.Model(inputs, layer(inputs))
    for length in (10, 12):
        x = normal((2, 3, length, D_MODEL))
        np.testing.assert_array_equal(model.predict(x, verbose=0), x + table[:length])


def test_sinusoidal_positions():
    layer = SinusoidalPositionalEncoding(max_length=16)
    x = example("sinusoidal", seq=5)
    for positions in (
        [0, 1, 2, 0, 1],
        np.array([[4, 3, 2, 1, 0]]),
        np.array([[0, 1, 2, 3, 4], [9, 10, 11, 12, 13]]),
    ):
        assert_core("sinusoidal", layer(x, positions=positions), x, np.asarray(positions))
    # positions past the table, known: it grows; far past it: the core's rows
    near = np.arange(20, 25)
    assert_core("sinusoidal", layer(x, positions=near), x, near)
    assert layer.table_length == 32
    far = np.array([10**6 + 3, 10**6, 10**6 + 7, 10**6 + 1, 10**6 + 5])
    assert_core("sinusoidal", layer(x, positions=far), x, far)
    assert layer.table_length == 32
    # traced: NaN rows outside the table
    run = traced(lambda x, p: layer(x, positions=p))
    out = as_f64(run(x, ops.convert_to_tensor(np.array([0, 31, 32, 5, 1000], np.int32))))
    assert nan_rows(out[0], axis=0).tolist() == [False, False, True, False, True]
    with pytest.raises(ValueError, match="either start_index or positions.*start_index=2"):
        layer(x, start_index=2, positions=near)
    with pytest.raises(ValueError, match=r"seq=5, got shape \(4,\)"):
        layer(x, positions=np.arange(4))


def test_sinusoidal_positions_input_of_a_functional_model():
    layer = SinusoidalPositionalEncoding(max_length=64)
    tokens = keras.Input(shape=(None, D_MODEL))
    positions = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model([tokens, positions], layer(tokens, positions=positions))
    for length in (5, 7):
        x = example("sinusoidal", seq=length)
        batched = np.stack([np.arange(length), np.arange(length)[::-1]]).astype(np.int32)
        np.testing.assert_array_equal(
            model.predict([x, batched], verbose=0).astype(np.float64),
            core_output("sinusoidal", x, batched).astype(np.float32),
        )


def test_sinusoidal_agrees_with_keras_hub():
    """keras-hub's layer returns the encoding alone, computed in float32 (angles formed in
    float32: off by up to position · 2**-24 radians); posenc adds the correctly rounded
    one to its input."""
    keras_hub = pytest.importorskip("keras_hub")
    x = np.zeros((2, 3, 50, D_MODEL), np.float32)
    theirs = as_f64(keras_hub.layers.SinePositionEncoding()(x, start_index=4))
    ours = as_f64(SinusoidalPositionalEncoding(max_length=64)(x, start_index=4))
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(ours[0, 0], posenc.sinusoidal(np.arange(4, 54), D_MODEL))
