"""A RoPE scaling defined outside posenc, for the test that it reaches every front end.

``BandScaling`` divides by ``factor`` every frequency pair whose wavelength ``2π/θ`` is
longer than ``original_max_position_embeddings`` (a hard-edged cousin of Llama 3.1's
scaling) and multiplies the tables by ``1 + 0.1 ln(factor)``. It is not in posenc: the
test registers it with :func:`posenc.register_rope_scaling` and then uses it by name.

Keras fixes its backend when first imported, so for the Keras backends other than the
test process's own this file runs as a script::

    KERAS_BACKEND=jax python tests/custom_scaling.py --keras OUT.npy

which registers the scaling, rotates :data:`X` with a Keras ``RotaryEmbedding`` using it
and saves the result.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Any

import numpy as np

import posenc

NAME = "band"
PARAMS = {"factor": 4.0, "original_max_position_embeddings": 64}
HEAD_DIM, START = 16, 3
X = np.random.default_rng(20261123).standard_normal((1, 6, 2, HEAD_DIM)).astype(np.float32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BandScaling(posenc.RopeScaling):
    """Frequencies slower than ``L₀`` turns divided by ``factor``; attention 1 + 0.1 ln f."""

    factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if not (isinstance(self.factor, (int, float)) and self.factor >= 1):
            raise ValueError(f"factor must be a number >= 1, got {self.factor!r}")
        if not (
            isinstance(self.original_max_position_embeddings, int)
            and self.original_max_position_embeddings >= 1
        ):
            raise ValueError("original_max_position_embeddings must be an int >= 1")

    def _inv_freq(self, rotary_dim: int, base: float, seq_len: int | None) -> tuple[Any, float]:
        inv_freq = posenc.rope_frequencies(rotary_dim, base)
        slow = 2 * math.pi / inv_freq > self.original_max_position_embeddings
        return np.where(slow, inv_freq / self.factor, inv_freq), 1 + 0.1 * math.log(self.factor)


#: A length-dependent method: ``StretchScaling`` divides every frequency by
#: ``max(1, L / original_max_position_embeddings)`` for a sequence of length ``L``
#: (linear interpolation stretched to each length) and scales the tables by 1.25.
STRETCH = "stretch"
STRETCH_PARAMS = {"original_max_position_embeddings": 8}


@dataclasses.dataclass(frozen=True, kw_only=True)
class StretchScaling(posenc.RopeScaling):
    """Frequencies divided by ``max(1, L / L₀)``; attention factor 1.25."""

    length_dependent = True
    original_max_position_embeddings: int

    def _inv_freq(self, rotary_dim: int, base: float, seq_len: int | None) -> tuple[Any, float]:
        original = self.original_max_position_embeddings
        stretch = max(1.0, (original if seq_len is None else seq_len) / original)
        return posenc.rope_frequencies(rotary_dim, base) / stretch, 1.25


def stretched_rotation(x: np.ndarray, positions: np.ndarray, length: int) -> np.ndarray:
    """``x`` (batch, seq, heads, d) rotated with the frequencies of sequence length ``length``,
    written out here (float64, rounded once to float32)."""
    d, original = x.shape[-1], STRETCH_PARAMS["original_max_position_embeddings"]
    inv_freq = 10000.0 ** (-np.arange(0, d, 2) / d) / max(1.0, length / original)
    angle = np.asarray(positions, dtype=np.float64)[:, None] * np.concatenate([inv_freq] * 2)
    cos, sin = 1.25 * np.cos(angle)[:, None, :], 1.25 * np.sin(angle)[:, None, :]
    wide = x.astype(np.float64)
    turned = np.concatenate([-wide[..., d // 2 :], wide[..., : d // 2]], axis=-1)
    return (wide * cos + turned * sin).astype(np.float32)


def register() -> None:
    posenc.register_rope_scaling(NAME, BandScaling)
    posenc.register_rope_scaling(STRETCH, StretchScaling)


def unregister() -> None:
    posenc.unregister_rope_scaling(NAME)
    posenc.unregister_rope_scaling(STRETCH)


def expected_frequencies() -> tuple[np.ndarray, float]:
    """The scaling's numbers computed here, without posenc's registry."""
    inv_freq = 10000.0 ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    slow = 2 * math.pi / inv_freq > PARAMS["original_max_position_embeddings"]
    return np.where(slow, inv_freq / PARAMS["factor"], inv_freq), 1 + 0.1 * math.log(4.0)


def reference(x: np.ndarray = X, start: int = START) -> np.ndarray:
    """``x`` (batch, seq, heads, d) rotated by the core, float64, rounded once to float32."""
    inv_freq, attention = posenc.rope_scaling(NAME, HEAD_DIM, **PARAMS)
    positions = np.arange(start, start + x.shape[1])
    cos, sin = posenc.rope_tables(positions, inv_freq, dtype="float64", scale=attention)
    out = posenc.apply_rope(x.astype(np.float64), cos[:, None, :], sin[:, None, :])
    return out.astype(np.float32)


def keras_rotation() -> np.ndarray:
    """:data:`X` through a Keras ``RotaryEmbedding`` with the scaling, on this backend."""
    import keras

    from posenc.keras import RotaryEmbedding

    layer = RotaryEmbedding(scaling=NAME, scaling_params=PARAMS, max_length=16)
    return keras.ops.convert_to_numpy(layer(X, start_index=START))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keras", required=True, metavar="OUT.npy")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    register()
    np.save(args.keras, keras_rotation())
    sys.exit(0)
