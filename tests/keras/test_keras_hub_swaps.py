"""The Keras layers where keras-hub's ``RotaryEmbedding`` and ``SinePositionEncoding``
stood, on whichever backend ``KERAS_BACKEND`` names (issue 37, item 13).

Every layer's output spec says the dtype its call returns, under ``"mixed_float16"``,
``"mixed_bfloat16"`` and with ``autocast=False``: a model built symbolically is told the
dtype it gets.
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


@pytest.fixture
def policy():
    """Set a global dtype policy for one test and always restore float32."""
    try:
        yield keras.mixed_precision.set_global_policy
    finally:
        keras.mixed_precision.set_global_policy("float32")


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
