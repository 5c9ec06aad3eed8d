"""Proportional RoPE (p-RoPE): rotate the highest frequencies, leave the lowest at zero.

Barbero et al. ("Round and Round We Go! What makes Rotary Positional Encodings useful?",
2024) keep a fraction ``p`` of RoPE's frequencies, the highest, and set the rest to
zero, so that those feature pairs carry no position and act as semantic channels.
Hugging Face's ``"proportional"`` rope type (``_compute_proportional_rope_parameters``)
keeps the frequencies of the full width, ``θ_i = base^(-2i/d)`` for the first
``⌊p·d/2⌋`` pairs (the exponent over the whole head, unlike a partial rotary width),
zero for the others, all divided by ``factor``; every pair is "rotated", the zero ones
by angle 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..._checks import check_real
from .frequencies import unscaled_frequencies
from .scaling import RopeScaling

__all__ = ["ProportionalScaling"]


@dataclass(frozen=True, kw_only=True)
class ProportionalScaling(RopeScaling):
    """p-RoPE: the first ``⌊p·d/2⌋`` frequencies of ``base^(-2i/d)``, zero for the rest.

    Args:
        partial_rotary_factor: ``p``, the fraction of the frequencies kept (in [0, 1]);
            Hugging Face's key in a ``"proportional"`` config.
        factor: Every kept frequency is divided by it (> 0; 1: none).

    Example:
        >>> ProportionalScaling(partial_rotary_factor=0.5).frequencies(8, 100.0)[0].tolist()
        [1.0, 0.31622776601683794, 0.0, 0.0]
    """

    name: ClassVar[str] = "proportional"
    needs_base_above_one: ClassVar[bool] = True
    partial_rotary_factor: float = 1.0
    factor: float = 1.0

    def __post_init__(self) -> None:
        proportion = check_real(self.partial_rotary_factor, "partial_rotary_factor", minimum=0.0)
        if proportion > 1:
            raise ValueError(f"partial_rotary_factor must be in [0, 1], got {proportion!r}")
        self._set("partial_rotary_factor", proportion)
        self._set("factor", check_real(self.factor, "factor", minimum=0.0, strict=True))

    def kept(self, rotary_dim: int) -> int:
        """How many frequencies rotate at width ``rotary_dim``: ``⌊p·d/2⌋`` (as Hugging
        Face computes ``int(p * d // 2)``)."""
        return math.floor(self.partial_rotary_factor * rotary_dim / 2)

    def _inv_freq(self, rotary_dim: int, base: float, seq_len: int | None) -> tuple[Any, float]:
        inv_freq = unscaled_frequencies(rotary_dim, base) / self.factor
        inv_freq[self.kept(rotary_dim) :] = 0.0
        return np.ascontiguousarray(inv_freq), 1.0

    @classmethod
    def example(
        cls, *, factor: float, original_max_position_embeddings: int, rotary_dim: int
    ) -> RopeScaling:
        """For pictures: a quarter of the frequencies kept (p = 0.25), ``factor`` as given."""
        return cls(partial_rotary_factor=0.25, factor=float(factor))
