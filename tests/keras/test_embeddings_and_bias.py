"""The Keras 3 layers on whichever backend ``KERAS_BACKEND`` names (TensorFlow, JAX, torch).

Only ``keras``, ``keras.ops`` and NumPy here, so the same file runs on every backend:
``KERAS_BACKEND=jax pytest tests/keras/test_embeddings_and_bias.py`` (and ``torch``, ``tensorflow``).
Expected values come from the NumPy core (``posenc.sinusoidal``, ``sinusoidal_nd``,
``alibi_bias``, ``t5_bias``), itself tested against closed forms and reference code, and
for the learned layers from the layer's own weights read back as NumPy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import doctest
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")
ml_dtypes = pytest.importorskip("ml_dtypes")

import posenc  # noqa: E402
import posenc.keras.bias  # noqa: E402
import posenc.keras.nd  # noqa: E402
from conformance import keras_traced as traced  # noqa: E402
from posenc.keras import SinusoidalPositionalEncoding  # noqa: E402
from posenc.keras.bias import ALiBiBias, T5RelativeBias  # noqa: E402
from posenc.keras.learned import LearnedPositionalEmbedding  # noqa: E402
from posenc.keras.nd import SinusoidalPositionalEncodingND  # noqa: E402

ops = keras.ops
BACKEND = keras.backend.backend()
RNG = np.random.default_rng(2024)
HEADS = 12  # ALiBi: 8 slopes that are powers of two, then 4 that are not (2**-0.5, ...)

# Keras' own variable -> NumPy conversion (get_weights, saving) warns under NumPy 2.
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


# --- helpers ---------------------------------------------------------------------------


def as_f64(tensor: Any) -> np.ndarray:
    """A backend tensor of any float dtype as float64 NumPy (exact widening)."""
    if keras.backend.standardize_dtype(tensor.dtype) != "float64":
        tensor = ops.cast(tensor, "float32")
    return np.asarray(ops.convert_to_numpy(tensor), dtype=np.float64)


def rounded(values: np.ndarray, fmt: str) -> np.ndarray:
    """``values`` correctly rounded to ``fmt`` (NumPy / ml_dtypes round to nearest even),
    returned as float64."""
    dtype = ml_dtypes.bfloat16 if fmt == "bfloat16" else np.dtype(fmt)
    return np.asarray(values).astype(dtype).astype(np.float64)


def normal(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def int_tensor(value: int) -> Any:
    return ops.convert_to_tensor(value, dtype="int32")


@contextlib.contextmanager
def wide_ints() -> Iterator[None]:
    """Let the backend hold int64 tensors: JAX needs its 64-bit mode for them."""
    if BACKEND == "jax":
        import jax

        with jax.enable_x64(True):
            yield
    else:
        yield


def int64_tensor(value: int) -> Any:
    """An int64 scalar tensor (inside :func:`wide_ints` on JAX)."""
    tensor = ops.convert_to_tensor(np.int64(value), dtype="int64")
    assert keras.backend.standardize_dtype(tensor.dtype) == "int64"
    return tensor


def nan_rows(rows: np.ndarray) -> np.ndarray:
    """Which rows (first axis) are entirely NaN; asserts that no row is only partly NaN."""
    flat = rows.reshape(rows.shape[0], -1)
    nan = np.isnan(flat)
    assert np.all(nan.all(axis=1) | ~nan.any(axis=1)), "a row is partly NaN"
    return nan.all(axis=1)


def weights_of(layer: Any) -> np.ndarray:
    return np.asarray(ops.convert_to_numpy(layer.weights[0].value), dtype=np.float64)


# --- the layers, described once for the generic tests ----------------------------------
#
# ``term(layer, shape, start, fmt)`` is what the layer adds to an input of ``shape``
# (float64 holding values of ``fmt``), from the core; ``start=None`` is the default.


def sinusoidal_term(layer: Any, shape: tuple[int, ...], start: int | None, fmt: str) -> Any:
    # The layer's table covers max_length positions; in float64 the last bits of an
    # entry depend on the table's length, so the reference is the same table, sliced.
    start = start or 0
    table = posenc.sinusoidal(
        layer.max_length,
        shape[2],
        base=layer.spec.base,
        layout=layer.spec.layout,
        formula=layer.spec.formula,
        dtype=fmt,
    )
    return table[start : start + shape[1]].astype(np.float64)  # (seq, d)


def learned_term(layer: Any, shape: tuple[int, ...], start: int | None, fmt: str) -> Any:
    start = start or 0
    return rounded(weights_of(layer)[start : start + shape[1]], fmt)  # (seq, d)


def nd_term(layer: Any, shape: tuple[int, ...], start: int | None, fmt: str) -> Any:
    table = posenc.sinusoidal_nd(shape[1:-1], shape[-1], layout=layer.spec.layout, base=layer.spec.base,
                                 dtype=fmt)  # fmt: skip
    return table.astype(np.float64)  # (*spatial, C)


def alibi_term(layer: Any, shape: tuple[int, ...], start: int | None, fmt: str) -> Any:
    q, k = shape[2], shape[3]
    bias = posenc.alibi_bias(
        q, k, num_heads=layer.num_heads, mode=layer.spec.mode, offset=k - q if start is None else start,
        dtype=fmt,
    )  # fmt: skip
    return bias.astype(np.float64)  # (H, q, k)


def t5_term(layer: Any, shape: tuple[int, ...], start: int | None, fmt: str) -> Any:
    q, k = shape[2], shape[3]
    weights = ops.convert_to_numpy(layer.weights[0].value)  # float32 under mixed policies
    bias = posenc.t5_bias(
        weights,
        q,
        k,
        bidirectional=layer.spec.bidirectional,
        max_distance=layer.spec.max_distance,
        offset=k - q if start is None else start,
        compat=layer.spec.compat,
    )  # (H, q, k), float32
    return rounded(bias, fmt)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    make: Callable[..., Any]  # **layer kwargs -> a new layer
    shape: tuple[int, ...]  # an example input shape
    term: Callable[[Any, tuple[int, ...], int | None, str], np.ndarray]
    kind: str  # "sequence" (batch, seq, d), "grid" (batch, *spatial, C), "bias" (B, H, q, k)
    trainable: bool = False


CASES = [
    Case(
        "sinusoidal",
        lambda **kw: SinusoidalPositionalEncoding(
            max_length=32, base=100.0, layout="split", formula="tensor2tensor", **kw
        ),
        (2, 8, 6),
        sinusoidal_term,
        "sequence",
    ),
    Case(
        "learned",
        lambda **kw: LearnedPositionalEmbedding(max_length=10, **kw),
        (2, 8, 6),
        learned_term,
        "sequence",
        trainable=True,
    ),
    Case(
        "nd",
        lambda **kw: SinusoidalPositionalEncodingND(base=50.0, **kw),
        (2, 4, 5, 6),
        nd_term,
        "grid",
    ),
    Case(
        "alibi",
        # max_length 4 < 7: the table grows on the first call (in fit, on the first step).
        lambda **kw: ALiBiBias(HEADS, mode="symmetric", max_length=4, **kw),
        (2, HEADS, 7, 7),
        alibi_term,
        "bias",
    ),
    Case(
        "t5",
        # max_distance 5 < 6, the longest distance in the example: clamped buckets too.
        lambda **kw: T5RelativeBias(HEADS, num_buckets=8, max_distance=5, **kw),
        (2, HEADS, 7, 7),
        t5_term,
        "bias",
        trainable=True,
    ),
]
IDS = [case.name for case in CASES]
POSITIONAL = [case for case in CASES if case.kind != "grid"]  # take start_index


def expected_output(case: Case, layer: Any, x: np.ndarray, start: int | None = None) -> Any:
    """``x + term`` in float32 arithmetic, as the layer computes it."""
    term = case.term(layer, x.shape, start, "float32").astype(np.float32)
    return (x + term).astype(np.float64)


def built(case: Case, **kwargs: Any) -> tuple[Any, np.ndarray]:
    """A layer called once on a random example input (so learned weights exist)."""
    layer = case.make(**kwargs)
    x = normal(case.shape)
    layer(x)
    return layer, x


# --- values ----------------------------------------------------------------------------


@pytest.mark.backend_independent  # values: every scheme's eager cases in tests/conformance.py
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_eager_values_equal_the_core(case):
    layer, x = built(case)
    out = layer(x)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    assert tuple(out.shape) == x.shape
    np.testing.assert_array_equal(as_f64(out), expected_output(case, layer, x))
    # On zeros the output is the core's table itself, broadcast over the batch.
    zeros = as_f64(layer(np.zeros_like(x)))
    term = case.term(layer, x.shape, None, "float32")
    np.testing.assert_array_equal(zeros, np.broadcast_to(term, x.shape))


@pytest.mark.skipif(BACKEND == "jax", reason="JAX runs without float64 unless x64 is enabled")
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_float64_layers_get_float64_tables(case):
    layer = case.make(dtype="float64")
    x = np.zeros(case.shape, "float64")
    out = layer(x)
    assert keras.backend.standardize_dtype(out.dtype) == "float64"
    term = case.term(layer, x.shape, None, "float64")
    np.testing.assert_array_equal(as_f64(out), np.broadcast_to(term, x.shape))


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize(
    ("policy_name", "fmt"), [("mixed_float16", "float16"), ("mixed_bfloat16", "bfloat16")]
)
def test_mixed_policies_give_correctly_rounded_values(policy, case, policy_name, fmt):
    policy(policy_name)
    layer = case.make()
    assert layer.compute_dtype == fmt
    x = np.zeros(case.shape, "float32")  # cast to fmt by the layer
    out = layer(x)
    assert keras.backend.standardize_dtype(out.dtype) == fmt
    term = case.term(layer, x.shape, None, fmt)
    np.testing.assert_array_equal(as_f64(out), np.broadcast_to(term, x.shape))
    if case.trainable:  # the variable itself stays float32
        assert keras.backend.standardize_dtype(layer.weights[0].dtype) == "float32"
    # The format matters here: the float32 values are not all representable in fmt.
    assert not np.array_equal(term, case.term(layer, x.shape, None, "float32"))


# --- low precision: the naive computation differs, the layers do not -------------------


def test_bfloat16_sinusoidal_nd_is_not_computed_in_bfloat16(policy):
    policy("mixed_bfloat16")
    grid, channels = (300, 2), 8  # axis 0: columns 0-3, ω = 1, 1/50
    out = SinusoidalPositionalEncodingND(base=2500.0)(np.zeros((1, *grid, channels)))
    exact = posenc.sinusoidal_nd(grid, channels, base=2500.0, dtype="float64")
    np.testing.assert_array_equal(as_f64(out)[0], rounded(exact, "bfloat16"))
    # Naive: the position times ω = 1 formed in bfloat16 (spacing 2 above 256), then sin.
    positions = ops.cast(ops.arange(grid[0]), "bfloat16")
    naive = as_f64(ops.sin(positions * ops.cast(1.0, "bfloat16")))
    ours = as_f64(out)[0, :, 0, 0]  # sin(h · 1)
    assert np.abs(naive - exact[:, 0, 0]).max() > 0.5  # whole sinusoids off
    assert np.abs(ours - exact[:, 0, 0]).max() <= 2.0**-9  # half a bfloat16 ulp


def test_bfloat16_sinusoidal_is_not_computed_in_bfloat16(policy):
    policy("mixed_bfloat16")
    length, width = 512, 8
    out = as_f64(SinusoidalPositionalEncoding(max_length=length)(np.zeros((1, length, width))))
    exact = posenc.sinusoidal(length, width, dtype="float64")
    np.testing.assert_array_equal(out[0], rounded(exact, "bfloat16"))
    angles = ops.cast(ops.arange(length), "bfloat16") * ops.cast(1.0, "bfloat16")
    naive = as_f64(ops.sin(angles))  # column 0, ω = 1
    assert np.abs(naive - exact[:, 0]).max() > 0.5


def test_bfloat16_alibi_is_not_a_bfloat16_product(policy):
    policy("mixed_bfloat16")
    heads, keys = 12, 400  # 12 heads: 4 slopes that are not powers of two
    out = as_f64(ALiBiBias(heads)(np.zeros((1, heads, 1, keys))))[0]  # (H, 1, keys)
    exact = posenc.alibi_bias(1, keys, num_heads=heads, offset=keys - 1, dtype="float64")
    np.testing.assert_array_equal(out, rounded(exact, "bfloat16"))
    # Naive: slope and distance rounded to bfloat16, multiplied in bfloat16.
    slopes = ops.cast(posenc.alibi_slopes(heads).astype(np.float32), "bfloat16")
    distance = ops.cast(ops.arange(keys - 1, -1, -1), "bfloat16")  # query at keys - 1
    naive = as_f64(-ops.expand_dims(slopes, 1) * ops.expand_dims(distance, 0))  # (H, keys)
    differ = naive != out[:, 0]
    assert differ.sum() > 50
    assert np.abs(naive - exact[:, 0]).max() > np.abs(out[:, 0] - exact[:, 0]).max()


def test_bfloat16_t5_buckets_are_not_computed_in_bfloat16(policy):
    """T5 only gathers weights; the low-precision trap is the bucket formula itself."""
    policy("mixed_bfloat16")
    keys = 100
    layer = T5RelativeBias(1)  # 32 buckets, max_distance 128: side 16, max_exact 8
    out = as_f64(layer(np.zeros((1, 1, 1, keys))))[0, 0, 0]  # query at keys - 1
    weights = weights_of(layer)[:, 0]
    distance = np.arange(keys - 1, -1, -1)  # |key - query|, keys in the past
    core = posenc.relative_position_bucket(-distance)
    np.testing.assert_array_equal(out, rounded(weights[core], "bfloat16"))
    # Naive: HF's formula evaluated in bfloat16.
    far = ops.cast(ops.maximum(distance, 8), "bfloat16")
    log_ratio = ops.log(far / ops.cast(8.0, "bfloat16")) / ops.cast(np.log(16.0), "bfloat16")
    scaled = ops.cast(log_ratio * ops.cast(8.0, "bfloat16"), "float32")
    large = ops.minimum(8 + ops.cast(ops.floor(scaled), "int32"), 15)
    naive = np.where(distance < 8, distance, ops.convert_to_numpy(large))
    assert np.any(naive != core)  # e.g. distance 45 lands one bucket low in bfloat16
    assert np.any(rounded(weights[naive], "bfloat16") != out)  # and so gets another weight


# --- Keras integration -----------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_symbolic_call_and_compute_output_shape(case):
    layer = case.make()
    symbolic = (None, *case.shape[1:])
    assert tuple(layer.compute_output_shape(symbolic)) == symbolic
    inputs = keras.Input(shape=case.shape[1:])
    outputs = layer(inputs)
    assert tuple(outputs.shape) == symbolic
    model = keras.Model(inputs, outputs)
    x = normal(case.shape)
    np.testing.assert_array_equal(as_f64(model(x)), expected_output(case, layer, x))
    np.testing.assert_array_equal(
        model.predict(x, verbose=0).astype(np.float64), expected_output(case, layer, x)
    )


def tiny_model(case: Case, layer: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """A small trainable model around ``layer`` with random data for one fit step."""
    if case.kind == "sequence":
        ids = keras.Input(shape=case.shape[1:2], dtype="int32")
        hidden = layer(keras.layers.Embedding(20, case.shape[2])(ids))
        x = RNG.integers(0, 20, size=(4, case.shape[1])).astype(np.int32)
    elif case.kind == "grid":
        ids = keras.Input(shape=case.shape[1:])
        hidden = layer(ids)
        x = normal((4, *case.shape[1:]))
    else:  # attention scores → bias → softmax over keys
        ids = keras.Input(shape=case.shape[1:])
        hidden = keras.layers.Softmax(axis=-1)(layer(ids))
        x = normal((4, *case.shape[1:]))
    outputs = keras.layers.Dense(1)(hidden)
    y = normal((4, *outputs.shape[1:]))
    return keras.Model(ids, outputs), x, y


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_one_fit_step(case):
    layer = case.make()
    model, x, y = tiny_model(case, layer)
    before = [w.copy() for w in layer.get_weights()]
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = layer.get_weights()
    if case.trainable:
        assert len(after) == 1
        assert not np.array_equal(before[0], after[0])
    else:
        assert before == after == []
    # The constants the layer cached during fit hold the core's values (on torch, Keras
    # infers shapes by calling layers on "meta" tensors: nothing built then may be kept).
    sample = normal(case.shape)
    np.testing.assert_array_equal(as_f64(layer(sample)), expected_output(case, layer, sample))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_config_round_trip(case):
    layer, x = built(case)
    config = layer.get_config()
    for clone in (
        type(layer).from_config(config),
        keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer)),
    ):
        assert type(clone) is type(layer)
        assert clone.get_config() == config
        clone(x)  # build, then take the original's weights
        clone.set_weights(layer.get_weights())
        np.testing.assert_array_equal(as_f64(clone(x)), as_f64(layer(x)))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_keras_file_round_trip(case, tmp_path):
    layer = case.make()
    inputs = keras.Input(shape=case.shape[1:])
    model = keras.Model(inputs, layer(inputs))
    if case.trainable:  # stand-in for trained weights: anything but the initial values
        layer.set_weights([normal(w.shape) for w in layer.get_weights()])
    x = normal(case.shape)
    expected = as_f64(model(x))
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(as_f64(loaded(x)), expected)
    clone = next(lay for lay in loaded.layers if type(lay) is type(layer))
    assert clone.get_config() == layer.get_config()
    assert len(clone.weights) == len(layer.weights) == int(case.trainable)
    for saved, original in zip(clone.get_weights(), layer.get_weights(), strict=True):
        np.testing.assert_array_equal(saved, original)


# --- decoding with start_index ---------------------------------------------------------


def step_input(case: Case, x: np.ndarray, t: int) -> np.ndarray:
    """Token ``t`` alone: one position, or one query row against every key."""
    return x[:, t : t + 1] if case.kind == "sequence" else x[:, :, t : t + 1, :]


@pytest.mark.backend_independent  # values: the conformance suite's decode cases
@pytest.mark.parametrize("case", POSITIONAL, ids=[case.name for case in POSITIONAL])
def test_decoding_one_token_at_a_time(case):
    layer, x = built(case)
    full = as_f64(layer(x))
    step = traced(lambda chunk, start: layer(chunk, start_index=start))
    for t in range(x.shape[-2]):
        expected = step_input(case, full, t)
        chunk = step_input(case, x, t)
        np.testing.assert_array_equal(as_f64(layer(chunk, start_index=t)), expected)
        np.testing.assert_array_equal(as_f64(layer(chunk, start_index=int_tensor(t))), expected)
        np.testing.assert_array_equal(as_f64(step(chunk, int_tensor(t))), expected)
        if case.kind == "bias":  # the KV-cache default: the query is the last key
            cached = x[:, :, t : t + 1, : t + 1]
            np.testing.assert_array_equal(as_f64(layer(cached)), full[:, :, t : t + 1, : t + 1])


@pytest.mark.parametrize("case", POSITIONAL, ids=[case.name for case in POSITIONAL])
def test_start_index_as_a_functional_model_input(case):
    layer, x = built(case)
    full = as_f64(layer(x))
    chunk_shape = step_input(case, x, 0).shape
    tokens = keras.Input(shape=chunk_shape[1:])
    start = keras.Input(batch_shape=(), dtype="int32")
    outputs = layer(tokens, start_index=start)
    assert tuple(outputs.shape) == (None, *chunk_shape[1:])
    model = keras.Model([tokens, start], outputs)
    run = traced(lambda chunk, t: model([chunk, t]))
    for t in (0, 5, x.shape[-2] - 1):
        expected = step_input(case, full, t)
        chunk = ops.convert_to_tensor(step_input(case, x, t))
        np.testing.assert_array_equal(as_f64(model([chunk, int_tensor(t)])), expected)
        np.testing.assert_array_equal(as_f64(run(chunk, int_tensor(t))), expected)


# --- bad arguments and inputs ----------------------------------------------------------


@pytest.mark.backend_independent  # options: validated by the specs
@pytest.mark.parametrize(
    ("cls", "kwargs", "error", "match"),
    [
        (LearnedPositionalEmbedding, {"max_length": 0}, ValueError, "max_length.*0"),
        (LearnedPositionalEmbedding, {"max_length": 8.0}, TypeError, r"max_length.*8\.0"),
        (LearnedPositionalEmbedding, {"max_length": 8, "dropout": 1.5}, ValueError, "1.5"),
        (LearnedPositionalEmbedding, {"max_length": 8, "initializer": "nope"}, ValueError,
         "initializer.*nope"),
        (SinusoidalPositionalEncodingND, {"layout": "detr"}, ValueError, "layout.*detr"),
        (SinusoidalPositionalEncodingND, {"base": 1.0}, ValueError, "base must not be 1"),
        (SinusoidalPositionalEncodingND, {"dropout": "0.1"}, TypeError, "dropout.*0.1"),
        (ALiBiBias, {"num_heads": 0}, ValueError, "num_heads.*0"),
        (ALiBiBias, {"num_heads": "8"}, TypeError, "num_heads.*'8'"),
        (ALiBiBias, {"num_heads": 8, "mode": "bidirectional"}, ValueError,
         "mode.*bidirectional"),
        (ALiBiBias, {"num_heads": 8, "max_length": -4}, ValueError, "max_length.*-4"),
        (T5RelativeBias, {"num_heads": 0}, ValueError, "num_heads.*0"),
        (T5RelativeBias, {"num_heads": 8, "num_buckets": 3}, ValueError,
         "num_buckets.*>= 4.*got 3"),
        (T5RelativeBias, {"num_heads": 8, "max_distance": 8}, ValueError,
         "max_distance.*max_exact = 8.*got 8"),
        (T5RelativeBias, {"num_heads": 8, "bidirectional": 1}, TypeError, "bidirectional.*1"),
        (T5RelativeBias, {"num_heads": 8, "compat": "mesh"}, ValueError, "compat.*mesh"),
        (T5RelativeBias, {"num_heads": 8, "embeddings_initializer": 3}, ValueError,
         "embeddings_initializer.*3"),
    ],
)  # fmt: skip
def test_bad_constructor_arguments(cls, kwargs, error, match):
    with pytest.raises(error, match=match):
        cls(**kwargs)


def test_learned_bad_inputs_and_no_extrapolation():
    layer = LearnedPositionalEmbedding(max_length=10)
    with pytest.raises(ValueError, match=r"rank 3.*\(5, 8\)"):
        layer(np.zeros((5, 8), "float32"))
    with pytest.raises(TypeError, match="int32.*Embedding"):
        layer(np.zeros((1, 5, 8), "int32"))
    layer(np.zeros((1, 5, 8), "float32"))  # builds with d_model=8
    with pytest.raises(ValueError, match=r"last axis of the input is 6.*d_model=8"):
        layer(np.zeros((1, 5, 6), "float32"))
    with pytest.raises(ValueError, match=r"\(0\) \+ sequence length \(11\).*cannot extrapolate"):
        layer(np.zeros((1, 11, 8), "float32"))
    with pytest.raises(ValueError, match=r"\(7\) \+ sequence length \(4\).*max_length=10"):
        layer(np.zeros((1, 4, 8), "float32"), start_index=7)
    with pytest.raises(ValueError, match=r"\(9\) \+ sequence length \(2\)"):  # eager tensor
        layer(np.zeros((1, 2, 8), "float32"), start_index=int_tensor(9))
    with pytest.raises(ValueError, match=r"start_index.*-1"):
        layer(np.zeros((1, 4, 8), "float32"), start_index=-1)
    with pytest.raises(ValueError, match=r"start_index.*-2"):
        layer(np.zeros((1, 4, 8), "float32"), start_index=int_tensor(-2))
    with pytest.raises(TypeError, match=r"start_index.*float32"):
        layer(np.zeros((1, 4, 8), "float32"), start_index=ops.convert_to_tensor(1.0))
    with pytest.raises(TypeError, match=r"start_index.*'3'"):
        layer(np.zeros((1, 4, 8), "float32"), start_index="3")
    with pytest.raises(ValueError, match=r"start_index must be a scalar.*\(2,\)"):
        layer(np.zeros((1, 4, 8), "float32"), start_index=ops.convert_to_tensor([1, 2]))
    with pytest.raises(ValueError, match="known last"):
        LearnedPositionalEmbedding(4).build((None, None, None))


def test_nd_bad_inputs():
    layer = SinusoidalPositionalEncodingND()
    with pytest.raises(ValueError, match=r"rank >= 3.*\(4, 6\)"):
        layer(np.zeros((4, 6), "float32"))
    with pytest.raises(TypeError, match="int32"):
        SinusoidalPositionalEncodingND()(np.zeros((1, 4, 6), "int32"))
    with pytest.raises(ValueError, match=r"layout='mae'.*shape \(2, 3, 4\)"):
        SinusoidalPositionalEncodingND(layout="mae")(np.zeros((1, 2, 3, 4, 8), "float32"))
    with pytest.raises(ValueError, match=r"divisible by 4.*channels=6"):
        SinusoidalPositionalEncodingND(layout="mae")(np.zeros((1, 2, 3, 6), "float32"))
    with pytest.raises(ValueError, match="call the layer once"):
        SinusoidalPositionalEncodingND().encoding((2, 3))
    layer(np.zeros((1, 4, 5, 6), "float32"))  # builds with channels=6
    with pytest.raises(ValueError, match=r"last axis of the input is 8.*channels=6"):
        layer(np.zeros((1, 4, 5, 8), "float32"))
    with pytest.raises(TypeError, match="shape must be a tuple.*5"):
        layer.encoding(5)
    with pytest.raises(ValueError, match=r"shape\[1\].*0"):
        layer.encoding((4, 0))
    with pytest.raises(TypeError, match="dtype.*int8"):
        layer.encoding((4, 5), dtype="int8")


@pytest.mark.parametrize("cls", [ALiBiBias, T5RelativeBias])
def test_bias_bad_inputs(cls):
    layer = cls(4)
    with pytest.raises(ValueError, match=r"rank 4.*\(2, 3, 3\)"):
        layer(np.zeros((2, 3, 3), "float32"))
    with pytest.raises(ValueError, match=r"num_heads=4.*3 heads.*\(1, 3, 5, 5\)"):
        layer(np.zeros((1, 3, 5, 5), "float32"))
    with pytest.raises(ValueError, match=r"num_heads=4.*2 heads"):
        layer(keras.Input(shape=(2, 5, 5)))
    with pytest.raises(TypeError, match="scores of a floating dtype.*int32"):
        layer(np.zeros((1, 4, 5, 5), "int32"))
    with pytest.raises(
        ValueError,
        match=r"query_length=5 > key_length=3 with no start_index.*query_length <= key_length",
    ):
        layer(np.zeros((1, 4, 5, 3), "float32"))
    with pytest.raises(ValueError, match=r"start_index.*-1"):
        layer(np.zeros((1, 4, 2, 3), "float32"), start_index=-1)
    with pytest.raises(ValueError, match=r"start_index.*-1"):
        layer(np.zeros((1, 4, 2, 3), "float32"), start_index=int_tensor(-1))
    with pytest.raises(TypeError, match=r"start_index.*1.5"):
        layer(np.zeros((1, 4, 2, 3), "float32"), start_index=1.5)
    with pytest.raises(ValueError, match=r"query_length.*-2"):
        layer.compute_bias(-2)
    with pytest.raises(ValueError, match=r"key_length.*-1"):
        layer.compute_bias(2, -1)
    with pytest.raises(ValueError, match=r"query_length=3 > key_length=2 with no start_index"):
        layer.compute_bias(3, 2)
    with pytest.raises(TypeError, match="dtype.*int32"):
        layer.compute_bias(3, dtype="int32")


# --- layer-specific behaviour ----------------------------------------------------------


def test_learned_weight_initializer_and_dropout():
    layer = LearnedPositionalEmbedding(max_length=256, dropout=0.5)
    x = np.ones((2, 256, 16), "float32")
    layer.build(x.shape)
    expected = (x + weights_of(layer).astype(np.float32)).astype(np.float64)
    assert layer.weights[0].name == "embeddings"
    assert tuple(layer.weights[0].shape) == (256, 16)
    config = layer.get_config()["initializer"]
    assert config["class_name"] == "RandomNormal"
    assert config["config"]["stddev"] == 0.02
    assert 0.018 < weights_of(layer).std() < 0.022
    np.testing.assert_array_equal(as_f64(layer(x)), expected)
    np.testing.assert_array_equal(as_f64(layer(x, training=False)), expected)
    dropped = as_f64(layer(x, training=True))
    zeros = dropped == 0
    assert 0.4 < zeros.mean() < 0.6
    np.testing.assert_allclose(dropped[~zeros], 2 * expected[~zeros], rtol=1e-6)
    custom = LearnedPositionalEmbedding(4, initializer="ones")
    custom(np.zeros((1, 4, 2), "float32"))
    np.testing.assert_array_equal(weights_of(custom), np.ones((4, 2)))


@pytest.mark.backend_independent  # values: the conformance suite's nd cases
@pytest.mark.parametrize(
    ("layout", "grid", "channels"),
    [
        ("positional-encodings", (7,), 5),
        ("positional-encodings", (3, 4), 10),
        ("positional-encodings", (2, 3, 4), 9),
        ("mae", (4, 6), 8),
        ("mae", (5,), 6),
    ],
)
def test_nd_layouts_and_encoding(layout, grid, channels):
    layer = SinusoidalPositionalEncodingND(layout=layout)
    x = normal((2, *grid, channels))
    table = posenc.sinusoidal_nd(grid, channels, layout=layout)
    np.testing.assert_array_equal(as_f64(layer(x)), x + table)
    np.testing.assert_array_equal(as_f64(layer.encoding(grid)), table)
    assert layer.encoding(list(grid)) is layer.encoding(grid)  # cached
    half = layer.encoding(grid, dtype="float16")
    assert keras.backend.standardize_dtype(half.dtype) == "float16"
    np.testing.assert_array_equal(as_f64(half), posenc.sinusoidal_nd(grid, channels,
                                  layout=layout, dtype="float16"))  # fmt: skip
    assert layer.weights == []


def test_nd_dropout_only_in_training():
    layer = SinusoidalPositionalEncodingND(dropout=0.5)
    x = np.ones((2, 16, 16, 8), "float32")
    expected = (x + posenc.sinusoidal_nd((16, 16), 8)).astype(np.float64)
    np.testing.assert_array_equal(as_f64(layer(x)), expected)
    dropped = as_f64(layer(x, training=True))
    zeros = dropped == 0
    assert 0.4 < zeros.mean() < 0.6
    np.testing.assert_allclose(dropped[~zeros], 2 * expected[~zeros], rtol=1e-6)
    assert layer.weights == []


def test_nd_other_grids_after_build():
    layer = SinusoidalPositionalEncodingND()
    for grid in [(4, 5), (2, 9), (3, 3, 3), (4, 5)]:
        out = layer(np.zeros((1, *grid, 6), "float32"))
        np.testing.assert_array_equal(as_f64(out)[0], posenc.sinusoidal_nd(grid, 6))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_first_called_inside_a_traced_function(case):
    """A layer built and first called under ``tf.function``/``jax.jit`` caches concrete
    tables, not the trace's tensors: later eager calls still work and agree."""
    layer = case.make()
    x = normal(case.shape)
    if case.trainable:
        # Keras creates weights eagerly (under jax.jit no layer can): build first.
        layer.build(x.shape)
    traced_out = as_f64(traced(lambda x: layer(x))(x))
    eager_out = as_f64(layer(x))
    np.testing.assert_array_equal(traced_out, eager_out)
    np.testing.assert_array_equal(eager_out, expected_output(case, layer, x))


def test_nd_first_called_inside_a_traced_function():
    layer = SinusoidalPositionalEncodingND()
    run = traced(lambda x: layer(x))
    x = np.zeros((1, 3, 4, 6), "float32")
    np.testing.assert_array_equal(as_f64(run(x))[0], posenc.sinusoidal_nd((3, 4), 6))
    # The cached table is a constant outside the trace: eager calls still work.
    np.testing.assert_array_equal(as_f64(layer(x))[0], posenc.sinusoidal_nd((3, 4), 6))


@pytest.mark.backend_independent  # values: the conformance suite's alibi cases
@pytest.mark.parametrize("mode", ["causal", "symmetric"])
def test_alibi_compute_bias_and_growth_past_max_length(mode):
    layer = ALiBiBias(12, mode=mode, max_length=4)
    for args, kwargs, (q, k, start) in [
        ((6,), {}, (6, 6, 0)),
        ((2, 9), {}, (2, 9, 7)),
        ((3,), {"start_index": 4}, (3, 7, 4)),
        ((3, 5), {"start_index": 1}, (3, 5, 1)),  # keys after the queries
        ((4, 2), {"start_index": 0}, (4, 2, 0)),  # more queries than keys
        ((2, 40), {"start_index": int_tensor(30)}, (2, 40, 30)),  # eager tensor: known
    ]:
        bias = layer.compute_bias(*args, **kwargs)
        assert tuple(bias.shape) == (12, q, k)
        core = posenc.alibi_bias(q, k, num_heads=12, mode=mode, offset=start, dtype="float64")
        np.testing.assert_array_equal(as_f64(bias), rounded(core, "float32"))
    bf16 = layer.compute_bias(3, 300, dtype="bfloat16")
    assert keras.backend.standardize_dtype(bf16.dtype) == "bfloat16"
    core = posenc.alibi_bias(3, 300, num_heads=12, mode=mode, offset=297, dtype="float64")
    np.testing.assert_array_equal(as_f64(bf16), rounded(core, "bfloat16"))
    assert layer.get_config()["max_length"] == 4  # the config keeps what was asked


def test_alibi_traced_positions_past_the_table_are_nan():
    """A traced start_index cannot grow the tables: a query position outside 0 .. L-1
    gives NaN (never a saturated distance), every other entry is the core's value."""
    heads, length, keys = 2, 8, 6
    layer = ALiBiBias(heads, max_length=length)
    run = traced(lambda scores, s: layer(scores, start_index=s))
    scores = np.zeros((1, heads, 3, keys), "float32")
    # start 6: positions 6, 7 are in the table, 8 is not; start -1: position -1 is not.
    for start, bad in [(6, [False, False, True]), (-1, [True, False, False]), (2, [False] * 3)]:
        out = as_f64(run(scores, int_tensor(start)))[0]  # (H, 3, keys)
        np.testing.assert_array_equal(nan_rows(out.transpose(1, 0, 2)), bad)
        good = np.flatnonzero(~np.asarray(bad))  # consecutive rows, from position start + good[0]
        expected = posenc.alibi_bias(len(good), keys, num_heads=heads, offset=start + good[0])
        np.testing.assert_array_equal(out[:, good], expected.astype(np.float64))
    # Static keys past the table: it grows to cover them first, so the rows are exact.
    wide = as_f64(run(np.zeros((1, heads, 1, 12), "float32"), int_tensor(10)))[0]
    np.testing.assert_array_equal(wide, posenc.alibi_bias(1, 12, num_heads=heads, offset=10))


@pytest.mark.backend_independent  # values: the conformance suite's t5 cases
@pytest.mark.parametrize(
    ("bidirectional", "num_buckets", "max_distance", "compat"),
    [(True, 32, 128, "hf"), (False, 32, 128, "hf"), (False, 12, 20, "exact"), (True, 8, 5, "hf")],
)
def test_t5_bias_equals_the_core_and_hf_layout(bidirectional, num_buckets, max_distance, compat):
    layer = T5RelativeBias(
        4,
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
        compat=compat,
    )
    weights = normal((num_buckets, 4))
    bias = layer.compute_bias(2, 3)  # builds the weight on first use
    assert layer.weights[0].name == "relative_attention_bias"
    assert tuple(layer.weights[0].shape) == (num_buckets, 4)  # HF: (buckets, heads)
    layer.set_weights([weights])
    for q, k, start in [(40, 40, 0), (1, 200, 199), (5, 2, 0)]:
        core = posenc.t5_bias(
            weights,
            q,
            k,
            bidirectional=bidirectional,
            max_distance=max_distance,
            offset=start,
            compat=compat,
        )
        bias = layer.compute_bias(q, k, start_index=start)
        np.testing.assert_array_equal(ops.convert_to_numpy(bias), core)
    scores = normal((2, 4, 7, 9))
    core = posenc.t5_bias(weights, 7, 9, bidirectional=bidirectional,
                          max_distance=max_distance, offset=2, compat=compat)  # fmt: skip
    np.testing.assert_array_equal(as_f64(layer(scores)), (scores + core).astype(np.float64))


# --- positions out of range, wide integer start_index -----------------------------------

SLICING = [SinusoidalPositionalEncoding, LearnedPositionalEmbedding]


def every_row(layer: Any, length: int, width: int) -> np.ndarray:
    """The ``(length, width)`` rows a sequence layer adds at positions ``0 .. length-1``."""
    return as_f64(layer(np.zeros((1, length, width), "float32")))[0]


@pytest.mark.parametrize("cls", SLICING)
def test_eager_tensor_start_index_is_checked_like_an_int(cls):
    layer = cls(max_length=8)
    full = every_row(layer, 8, 4)  # (8, 4)
    x = np.zeros((1, 4, 4), "float32")
    if cls is LearnedPositionalEmbedding:  # no rows past its table
        with pytest.raises(
            ValueError, match=r"start_index \(6\) \+ sequence length \(4\) = 10 exc"
        ):
            layer(x, start_index=int_tensor(6))
    else:  # posenc's out-of-range policy: the exact rows, the table grows
        np.testing.assert_array_equal(
            as_f64(layer(x, start_index=int_tensor(6)))[0], posenc.sinusoidal(np.arange(6, 10), 4)
        )
    with pytest.raises(ValueError, match=r"start_index must be an int >= 0, got -2"):
        layer(x, start_index=int_tensor(-2))
    for start in (
        int_tensor(3),
        ops.convert_to_tensor(np.int16(3)),
        ops.convert_to_tensor(3, "uint8"),
    ):
        np.testing.assert_array_equal(as_f64(layer(x, start_index=start))[0], full[3:7])


@pytest.mark.parametrize("cls", SLICING)
def test_traced_start_index_outside_the_table_gives_nan_rows(cls):
    layer = cls(max_length=10)
    full = every_row(layer, 10, 4)  # (10, 4)
    run = traced(lambda x, start: layer(x, start_index=start))
    x = np.zeros((1, 4, 4), "float32")
    for start in (0, 6, 8, 12, -2, -9):
        out = as_f64(run(x, int_tensor(start)))[0]  # (4, 4)
        positions = start + np.arange(4)
        inside = (positions >= 0) & (positions < 10)
        np.testing.assert_array_equal(nan_rows(out), ~inside)
        np.testing.assert_array_equal(out[inside], full[positions[inside]])


@pytest.mark.parametrize("case", POSITIONAL, ids=[case.name for case in POSITIONAL])
def test_int64_start_index_is_checked_before_any_cast(case):
    layer, x = built(case)
    chunk = step_input(case, x, 0)
    expected = as_f64(layer(chunk, start_index=3))
    with wide_ints():
        with pytest.raises(ValueError, match=r"start_index must be below 2\*\*31.*got 4294967299"):
            layer(chunk, start_index=int64_tensor(2**32 + 3))  # was read as 3
        np.testing.assert_array_equal(as_f64(layer(chunk, start_index=int64_tensor(3))), expected)
    with pytest.raises(ValueError, match=r"start_index must be below 2\*\*31.*got 2147483648"):
        layer(chunk, start_index=2**31)


@pytest.mark.parametrize("cls", SLICING)
def test_traced_int64_start_index_saturates_to_nan_rows(cls):
    layer = cls(max_length=8)
    full = every_row(layer, 8, 4)  # (8, 4)
    x = np.zeros((1, 2, 4), "float32")
    with wide_ints():
        run = traced(lambda x, start: layer(x, start_index=start))
        for start in (2**32 + 3, -(2**32) + 3, 2**31 + 3):  # would wrap to 3, 3, -2**31 + 3
            assert np.all(np.isnan(as_f64(run(x, int64_tensor(start)))))
        np.testing.assert_array_equal(as_f64(run(x, int64_tensor(3)))[0], full[3:5])


def test_t5_start_index_far_away_or_traced_negative():
    weights = normal((8, 2))
    layer = T5RelativeBias(2, num_buckets=8, max_distance=20)
    layer.build()
    layer.set_weights([weights])
    scores = np.zeros((1, 2, 3, 5), "float32")

    def core(start: int, q: int = 3) -> np.ndarray:
        return posenc.t5_bias(weights, q, 5, bidirectional=True, max_distance=20, offset=start)

    # int32 arithmetic near 2**31 used to overflow into wrong buckets.
    for start in (2**31 - 1, 2**30 + 7):
        np.testing.assert_array_equal(as_f64(layer(scores, start_index=start))[0], core(start))
    run = traced(lambda scores, start: layer(scores, start_index=start))
    np.testing.assert_array_equal(as_f64(run(scores, int_tensor(2**31 - 1)))[0], core(2**31 - 1))
    out = as_f64(run(scores, int_tensor(-1)))[0]  # (H, 3, 5); position -1 does not exist
    np.testing.assert_array_equal(nan_rows(out.transpose(1, 0, 2)), [True, False, False])
    np.testing.assert_array_equal(out[:, 1:], core(0, q=2))
    with wide_ints():  # saturated to 2**31 - 1: the same (saturated) buckets as the core's
        wide = as_f64(run(scores, int64_tensor(2**32 + 3)))[0]
        np.testing.assert_array_equal(wide, core(2**32 + 3))
        assert np.all(np.isnan(as_f64(run(scores, int64_tensor(-(2**32) + 3)))))


@pytest.mark.parametrize("cls", [ALiBiBias, T5RelativeBias])
def test_default_start_index_with_more_queries_than_keys_in_a_trace(cls):
    layer = cls(2)
    layer.build()
    scores = np.zeros((1, 2, 4, 2), "float32")  # 4 queries, 2 keys: start = 2 - 4 < 0
    with pytest.raises(
        ValueError,
        match=r"query_length=4 > key_length=2 with no start_index.*query_length <= key_length",
    ):
        traced(lambda scores: layer(scores))(scores)  # static shapes: checked when traced
    if BACKEND != "tensorflow":
        return  # only a TensorFlow graph has lengths unknown while the layer is called
    import tensorflow as tf

    spec = tf.TensorSpec((None, 2, None, None))
    dynamic = tf.function(lambda scores: layer(scores), input_signature=[spec])
    term = alibi_term if cls is ALiBiBias else t5_term
    out = as_f64(dynamic(scores))[0]  # (H, 4, 2)
    np.testing.assert_array_equal(nan_rows(out.transpose(1, 0, 2)), [True, True, False, False])
    np.testing.assert_array_equal(out[:, 2:], term(layer, (1, 2, 2, 2), 0, "float32"))
    fine = normal((1, 2, 3, 5))  # query <= key: the same values as the eager call
    np.testing.assert_array_equal(as_f64(dynamic(fine)), as_f64(layer(fine)))


@pytest.mark.parametrize("mode", ["causal", "symmetric"])
def test_alibi_start_far_past_the_table_is_computed_by_the_core(mode):
    layer = ALiBiBias(8, mode=mode, max_length=16)
    scores = normal((1, 8, 1, 4))
    for start in (300_000_000, 2**31 - 1, int_tensor(300_000_000)):
        offset = int(ops.convert_to_numpy(start))
        core = posenc.alibi_bias(1, 4, num_heads=8, mode=mode, offset=offset)
        np.testing.assert_array_equal(as_f64(layer(scores, start_index=start)), scores + core)
    # No table was grown for those: the layer still serves nearby positions, and grows.
    for q, k, start in [(1, 4, 3), (2, 20, 18), (3, 40, 37)]:
        core = posenc.alibi_bias(q, k, num_heads=8, mode=mode, offset=start)
        np.testing.assert_array_equal(as_f64(layer.compute_bias(q, k, start_index=start)), core)


def test_alibi_refused_growth_leaves_the_layer_working():
    layer = ALiBiBias(4096, max_length=4)
    # Positions up to 199_994 would need a (4096, 399_987) float32 table (6.1 GiB): refused;
    # the bias alone, (4096, 4, 100_001), would need 6.1 GiB too: a ValueError of the layer.
    with pytest.raises(ValueError, match=r"4096 heads x 4 queries x 100001 keys.*6\.1 GiB.*fewer"
                       ) as info:  # fmt: skip
        layer.compute_bias(4, 100_001, start_index=199_990)
    assert "max_bytes" not in str(info.value)  # not an argument of the layer
    for q, k, start in [(3, 5, 2), (2, 9, 7)]:  # the layer works on, growing as usual
        core = posenc.alibi_bias(q, k, num_heads=4096, offset=start)
        np.testing.assert_array_equal(as_f64(layer.compute_bias(q, k, start_index=start)), core)
    with pytest.raises(ValueError, match=r"covering 1000000 positions.*smaller max_length") as info:
        ALiBiBias(4096, max_length=10**6).build()
    assert "max_bytes" not in str(info.value)


@pytest.mark.parametrize("module", [posenc.keras.nd, posenc.keras.bias])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, extraglobs={"keras": keras}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
