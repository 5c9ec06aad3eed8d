"""LongRoPE (Phi-3, PhiMoE): searched divisors per frequency, short and long.

A built-in RoPE scaling method (:mod:`.methods` re-exports it), tested against Hugging
Face's ``_compute_longrope_parameters`` and PhiMoE's ``short_mscale``/``long_mscale``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..._checks import check_int, check_real, describe
from .frequencies import unscaled_frequencies
from .scaling import RopeScaling

__all__ = ["LongRopeScaling"]


def _check_divisors(values: Any, name: str) -> tuple[float, ...]:
    """A non-empty sequence of finite positive numbers, as a tuple of floats."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise TypeError(
            f"{name} must be a list of positive numbers (one per frequency pair), got "
            f"{describe(values)}"
        )
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{name} must be a list of positive numbers, got {describe(values)}"
        ) from exc
    if array.ndim != 1 or array.size == 0:
        raise ValueError(
            f"{name} must be a non-empty 1-D list of divisors, got shape {array.shape}"
        )
    if not np.all(np.isfinite(array) & (array > 0)):
        raise ValueError(f"{name} must be finite and > 0, got {array[~(array > 0)][:3].tolist()}")
    return tuple(array.tolist())


@dataclass(frozen=True, kw_only=True)
class LongRopeScaling(RopeScaling):
    """LongRoPE (Phi-3): a searched divisor per frequency, one set for short, one for long.

    ``short_factor`` is used while the sequence length is at most ``L₀``, ``long_factor``
    past it (Hugging Face fixes the construction-time frequencies with the short factors
    and switches in ``forward`` once ``max(position_ids) + 1 > L₀``). The attention factor
    ``sqrt(1 + ln(factor) / ln(L₀))`` (1 when ``factor <= 1``) does not depend on the
    length.

    Args:
        short_factor: ``d/2`` positive divisors used while ``seq_len <= L₀``.
        long_factor: ``d/2`` positive divisors used when ``seq_len > L₀``.
        original_max_position_embeddings: ``L₀``, the pre-training length (4096 for
            Phi-3-mini-128k).
        max_position_embeddings: The extended length; only used to derive ``factor`` when
            ``factor`` is not given (``max_position_embeddings / L₀``, as Phi-3).
        factor: The context extension; needed (directly or through
            ``max_position_embeddings``) only when ``attention_factor`` is not given.
        attention_factor: Use this factor instead of the derived one (> 0).
        short_mscale, long_mscale: PhiMoE's attention factors, one per side of the switch
            (both or neither; > 0): ``short_mscale`` while ``seq_len <= L₀``,
            ``long_mscale`` past it, in place of the one attention factor.

    Example:
        >>> spec = LongRopeScaling(short_factor=[1.0, 2.0], long_factor=[4.0, 8.0],
        ...                        original_max_position_embeddings=16, factor=4.0)
        >>> spec.frequencies(4, 100.0)[0].tolist()  # short factors up to L₀
        [1.0, 0.05]
        >>> spec.frequencies(4, 100.0, seq_len=17)[0].tolist()
        [0.25, 0.0125]
    """

    name: ClassVar[str] = "longrope"
    length_dependent: ClassVar[bool] = True
    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    max_position_embeddings: int | None = None
    factor: float | None = None
    attention_factor: float | None = None
    short_mscale: float | None = None
    long_mscale: float | None = None

    def __post_init__(self) -> None:
        self._set(
            "original_max_position_embeddings",
            check_int(
                self.original_max_position_embeddings,
                "original_max_position_embeddings",
                minimum=1,
            ),
        )
        self._set("short_factor", _check_divisors(self.short_factor, "short_factor"))
        self._set("long_factor", _check_divisors(self.long_factor, "long_factor"))
        given = [
            name for name in ("short_mscale", "long_mscale") if getattr(self, name) is not None
        ]
        if len(given) == 1:
            raise TypeError(
                f"longrope takes short_mscale and long_mscale together (the attention factor "
                f"on each side of original_max_position_embeddings), got only {given[0]}"
            )
        for name in given:
            self._set(name, check_real(getattr(self, name), name, minimum=0.0, strict=True))
        if self.attention_factor is not None:
            self._set(
                "attention_factor",
                check_real(self.attention_factor, "attention_factor", minimum=0.0, strict=True),
            )
        if self.factor is not None:
            self._set("factor", check_real(self.factor, "factor", minimum=0.0, strict=True))
        if self.max_position_embeddings is not None:
            self._set(
                "max_position_embeddings",
                check_int(self.max_position_embeddings, "max_position_embeddings", minimum=1),
            )
        if (
            self.attention_factor is None
            and self.factor is None
            and self.max_position_embeddings is None
            and self.short_mscale is None
        ):
            raise TypeError(
                "longrope needs factor=, max_position_embeddings= (factor = "
                "max_position_embeddings / original_max_position_embeddings), "
                "attention_factor= or short_mscale= and long_mscale= to set the attention "
                "factor"
            )

    @property
    def derived_attention_factor(self) -> float:
        """The attention factor: given, or ``sqrt(1 + ln(factor) / ln(L₀))``."""
        if self.attention_factor is not None:
            return self.attention_factor
        original = self.original_max_position_embeddings
        factor = self.factor
        if factor is None:
            factor = int(self.max_position_embeddings or original) / original
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))

    def _inv_freq(self, rotary_dim: int, base: float, seq_len: int | None) -> tuple[Any, float]:
        count = rotary_dim // 2
        for name in ("short_factor", "long_factor"):
            size = len(getattr(self, name))
            if size != count:
                raise ValueError(
                    f"{name} must hold one divisor per frequency, rotary_dim // 2 = {count} "
                    f"of them, got shape ({size},)"
                )
        original = self.original_max_position_embeddings
        long = seq_len is not None and seq_len > original
        divisors = np.asarray(self.long_factor if long else self.short_factor)
        attention = self.derived_attention_factor
        if self.short_mscale is not None and self.long_mscale is not None:
            attention = self.long_mscale if long else self.short_mscale
        return unscaled_frequencies(rotary_dim, base) / divisors, attention

    @property
    def switch_length(self) -> int:
        return self.original_max_position_embeddings

    def scaled_length(self, length: int) -> int:
        original = self.original_max_position_embeddings
        return original + 1 if length > original else original

    @classmethod
    def example(
        cls, *, factor: float, original_max_position_embeddings: int, rotary_dim: int
    ) -> RopeScaling:
        """Illustrative divisors, not a searched set.

        ``long_factor[i] = factor^((i/(m-1))²)`` for the ``m = rotary_dim/2`` pairs (1
        for the fastest pair, ``factor`` for the slowest, rising slower than NTK's
        ``factor^(i/(m-1))``), ``short_factor`` all ones.
        """
        pairs = rotary_dim // 2
        ramp = (np.arange(pairs) / max(pairs - 1, 1)) ** 2
        return cls(
            short_factor=(1.0,) * pairs,
            long_factor=tuple((float(factor) ** ramp).tolist()),
            original_max_position_embeddings=int(original_max_position_embeddings),
            factor=float(factor),
        )
