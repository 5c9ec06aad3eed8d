"""Keras models over several sequence lengths, on whichever backend ``KERAS_BACKEND`` names.

One model per layer, built on ``keras.Input`` with the length ``None``, runs ``fit`` and
``predict`` at lengths 10, 12 and 14 and one past the layer's initial table (16 rows),
and on TensorFlow a ``tf.function`` whose ``input_signature`` leaves the length ``None``.
TensorFlow's ``fit`` and ``predict`` trace a model for any length once they have seen two
lengths (``reduce_retracing``), so from the second length on the layers see it only in
the graph, while their ``start_index`` is the Python int 0: the case of issue 37's item 5
(an ``AttributeError`` from the planner's index plan before it was fixed). JAX and torch
see each call's length.

Expected values come from the NumPy core (``posenc.sinusoidal``, ``rope_scaling`` and
``rope_tables``, ``alibi_bias``, ``t5_bias``, ``sinusoidal_nd``) or, for the learned
layers, from their weights read back. Where a length is known only in a graph and the
layer cannot serve it, the result is posenc's one policy (:mod:`posenc.core.positions`):
NaN rows past the table, or a ``ValueError`` that says what to change.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")

from keras import ops  # noqa: E402

import posenc  # noqa: E402
from posenc.core.rope import rope_scaling, rope_tables  # noqa: E402
from posenc.keras import (  # noqa: E402
    ALiBiBias,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    SinusoidalPositionalEncodingND,
    T5RelativeBias,
)

# Keras' torch backend converts tensors with np.array(tensor), which warns under NumPy 2.
# A model of a layer without weights has nothing to train: fit still runs its step.
pytestmark = [
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The model does not have any trainable weights"),
]

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(37)
TABLE = 16  # every layer's initial table (max_length)
LENGTHS = (10, 12, 14)  # within the table
FIT_PAST = 20  # past the initial table: a layer that can grow holds 32 rows after it
PREDICT_PAST = 40  # past those 32 rows too
WIDTH, HEADS, HEAD_DIM = 8, 4, 8


@dataclasses.dataclass(frozen=True)
class Refused:
    """The ``ValueError`` a call must raise, its message matching ``match``."""

    match: str


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], Any]
    shape: Callable[[int], tuple[int, ...]]  # length -> input shape, batch first
    symbolic: tuple[Any, ...]  # keras.Input's shape (no batch), the length None
    # (layer, x, traced) -> the output, NaN where the policy says, or a Refused
    expect: Callable[[Any, np.ndarray, bool], np.ndarray | Refused]
    call: Callable[[Any, Any], Any] = lambda layer, x: layer(x)
    grows: bool = True  # whether known lengths past the table are served
    rotation: bool = False  # float32 products of the layer's own: compared to rounding


def nan_past(values: np.ndarray, axes: tuple[int, ...], rows: int) -> np.ndarray:
    """``values`` with NaN wherever an index on one of ``axes`` is ``rows`` or more."""
    out = values.astype(np.float64)
    for axis in axes:
        index = [slice(None)] * out.ndim
        index[axis] = slice(rows, None)
        out[tuple(index)] = np.nan
    return out


def sinusoidal(layer: Any, x: np.ndarray, traced: bool) -> np.ndarray:
    length = x.shape[1]
    out = x + posenc.sinusoidal(length, WIDTH).astype(np.float32)  # float32 sum
    return nan_past(out, (1,), TABLE) if traced else out.astype(np.float64)


def learned(layer: Any, x: np.ndarray, traced: bool) -> np.ndarray | Refused:
    length = x.shape[1]
    if length > TABLE and not traced:
        return Refused(f"= {length} exceeds max_length={TABLE}")
    weights = ops.convert_to_numpy(layer.embeddings)
    rows = np.zeros((length, WIDTH), np.float32)
    rows[: min(length, TABLE)] = weights[:length]
    return nan_past(x + rows, (1,), TABLE)


SCALINGS = {
    "linear": {"factor": 4.0},  # a fixed scaling
    "llama3": {  # Llama 3.1's factors, L₀ = 1024 so that some pairs are blended at d = 8
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
    "longrope": {  # two sets of factors: the long ones past L₀ = 12
        "short_factor": [1.0, 1.5, 2.0, 2.5],
        "long_factor": [1.0, 3.0, 5.0, 8.0],
        "original_max_position_embeddings": 12,
        "max_position_embeddings": 48,
    },
    "dynamic_ntk": {"factor": 4.0, "original_max_position_embeddings": 12},
}


def rope(name: str) -> Callable[[Any, np.ndarray, bool], np.ndarray | Refused]:
    def expect(layer: Any, x: np.ndarray, traced: bool) -> np.ndarray | Refused:
        length = x.shape[1]
        if traced and name == "dynamic_ntk":
            return Refused("recomputes the frequencies from the length L")
        extra = {"seq_len": length} if name in ("longrope", "dynamic_ntk") else {}
        inv_freq, factor = rope_scaling(name, HEAD_DIM, **SCALINGS[name], **extra)
        cos, sin = rope_tables(length, inv_freq, dtype="float64", scale=factor)  # (L, d)
        cos = cos.astype(np.float32).astype(np.float64)[:, None]  # the layer's f32 tables
        sin = sin.astype(np.float32).astype(np.float64)[:, None]
        half = HEAD_DIM // 2
        turned = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        out = x * cos + turned * sin  # (batch, L, heads, d), float64
        return nan_past(out, (1,), TABLE) if traced else out

    return expect


def rope_layer(name: str) -> Callable[[], Any]:
    return lambda: RotaryEmbedding(max_length=TABLE, scaling=name, scaling_params=SCALINGS[name])


def alibi(layer: Any, x: np.ndarray, traced: bool) -> np.ndarray:
    length = x.shape[2]
    bias = posenc.alibi_bias(length, length, num_heads=HEADS, offset=0, dtype="float32")
    out = x + bias  # (batch, heads, q, k), float32 sum
    return nan_past(out, (2, 3), TABLE) if traced else out.astype(np.float64)


def t5(layer: Any, x: np.ndarray, traced: bool) -> np.ndarray:
    length = x.shape[2]
    weights = ops.convert_to_numpy(layer.relative_attention_bias)
    bias = posenc.t5_bias(weights, length, length, bidirectional=True, max_distance=12)
    return (x + bias).astype(np.float64)  # the buckets saturate: exact at any length


def nd(layer: Any, x: np.ndarray, traced: bool) -> np.ndarray | Refused:
    if traced:
        return Refused("needs the spatial sizes known when it runs")
    return (x + posenc.sinusoidal_nd(x.shape[1:-1], x.shape[-1])).astype(np.float64)


CASES = [
    Case(
        "sinusoidal",
        lambda: SinusoidalPositionalEncoding(max_length=TABLE),
        lambda n: (2, n, WIDTH),
        (None, WIDTH),
        sinusoidal,
    ),
    Case(
        "learned",
        lambda: LearnedPositionalEmbedding(max_length=TABLE),
        lambda n: (2, n, WIDTH),
        (None, WIDTH),
        learned,
        grows=False,
    ),
    *(
        Case(
            f"rope-{name}",
            rope_layer(name),
            lambda n: (2, n, 2, HEAD_DIM),
            (None, 2, HEAD_DIM),
            rope(name),
            rotation=True,
        )
        for name in SCALINGS
    ),
    Case(
        "alibi",
        lambda: ALiBiBias(HEADS, max_length=TABLE),
        lambda n: (1, HEADS, n, n),
        (HEADS, None, None),
        alibi,
        call=lambda layer, x: layer(x, start_index=0),  # a Python int with traced lengths
    ),
    Case(
        "t5",
        lambda: T5RelativeBias(HEADS, num_buckets=8, max_distance=12),
        lambda n: (1, HEADS, n, n),
        (HEADS, None, None),
        t5,
    ),
    Case(
        "nd",
        lambda: SinusoidalPositionalEncodingND(),
        lambda n: (1, n // 2, 3, 6),  # (batch, height, width, channels): the height varies
        (None, None, 6),
        nd,
    ),
]
IDS = [case.name for case in CASES]


def normal(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def model_of(case: Case) -> tuple[Any, Any]:
    """The case's layer and one model around it, for inputs of any length."""
    layer = case.make()
    inputs = keras.Input(shape=case.symbolic)
    model = keras.Model(inputs, case.call(layer, inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return layer, model


def assert_output(case: Case, out: Any, expected: np.ndarray, x: np.ndarray) -> None:
    """The output equals ``expected`` (NaN where it is NaN): exactly, or for a rotation
    up to the float32 rounding of its products (bounded by 1.3 |x|)."""
    out = np.asarray(ops.convert_to_numpy(out), dtype=np.float64)
    assert out.shape == expected.shape
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    if case.rotation:
        atol = 2e-7 * 1.3 * np.abs(x).max()
        np.testing.assert_allclose(out, expected, rtol=0, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(out, expected)


def graph_length(step: int) -> bool:
    """Whether ``fit``/``predict`` see the ``step``-th length only in the graph."""
    return BACKEND == "tensorflow" and step > 0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fit_and_predict_over_several_lengths(case):
    layer, model = model_of(case)
    fit_lengths = (*LENGTHS, FIT_PAST) if case.grows else LENGTHS
    for step, length in enumerate(fit_lengths):
        x = normal(case.shape(length))
        expected = case.expect(layer, x, graph_length(step))  # before the step's update
        if isinstance(expected, Refused):
            with pytest.raises(ValueError, match=expected.match):
                model.fit(x, np.zeros_like(x), batch_size=len(x), verbose=0)
            continue
        history = model.fit(x, np.zeros_like(x), batch_size=len(x), verbose=0)
        (loss,) = history.history["loss"]  # the mean square of the output: y = 0
        np.testing.assert_allclose(loss, np.mean(expected**2), rtol=1e-5)
    for step, length in enumerate((*LENGTHS, PREDICT_PAST)):
        x = normal(case.shape(length))
        expected = case.expect(layer, x, graph_length(step))
        if isinstance(expected, Refused):
            with pytest.raises(ValueError, match=expected.match):
                model.predict(x, verbose=0)
        else:
            assert_output(case, model.predict(x, verbose=0), expected, x)
    if hasattr(layer, "table_length"):
        # Known lengths past the table grow it, doubling: 16 -> 32 (fit) -> 64 (predict);
        # lengths known only in a graph cannot, nor does a dynamic NTK call past L₀ = 12
        # (the core computes its rows at the call's own frequencies).
        stays = BACKEND == "tensorflow" or case.name == "rope-dynamic_ntk"
        assert layer.table_length == (TABLE if stays else 4 * TABLE)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.function: the TensorFlow backend")
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_tf_function_with_an_unknown_length(case):
    import tensorflow as tf

    layer = case.make()
    x = normal(case.shape(LENGTHS[0]))
    assert_output(case, case.call(layer, x), case.expect(layer, x, False), x)  # eager
    signature = [tf.TensorSpec((None, *case.symbolic), tf.float32)]
    run = tf.function(lambda x: case.call(layer, x), input_signature=signature)
    for length in (*LENGTHS, PREDICT_PAST):
        x = normal(case.shape(length))
        expected = case.expect(layer, x, True)
        if isinstance(expected, Refused):
            with pytest.raises(ValueError, match=expected.match):
                run(x)
        else:
            assert_output(case, run(x), expected, x)
