"""The built-in RoPE scaling methods, each a :class:`~.scaling.RopeScaling` spec.

``"default"``, ``"linear"``, ``"ntk"``, ``"dynamic_ntk"`` (Hugging Face ``"dynamic"``),
``"yarn"``, ``"llama3"`` and ``"longrope"`` (:mod:`.longrope`): each validates its
parameters when it is made and computes ``(inv_freq, attention_factor)`` for a width, a
base and (for the length-dependent ones) a sequence length. Each is tested against
Hugging Face's ``ROPE_INIT_FUNCTIONS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..._checks import check_bool, check_int, check_real
from .frequencies import rope_frequencies, unscaled_frequencies
from .longrope import LongRopeScaling
from .scaling import RopeScaling

__all__ = [
    "DefaultScaling",
    "DynamicNTKScaling",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "NTKScaling",
    "YarnScaling",
]


def _check_factor(value: Any) -> float:
    # Every method here extends the context: Hugging Face's validators also ask for >= 1.
    return check_real(value, "factor", minimum=1.0)


def _check_original(value: Any) -> int:
    return check_int(value, "original_max_position_embeddings", minimum=1)


def _exponent(rotary_dim: int, method: str) -> float:
    """``d / (d - 2)``, the NTK base exponent; needs ``d > 2``."""
    if rotary_dim <= 2:
        raise ValueError(
            f"{method} scales the base by factor^(d/(d-2)), which needs a rotary width "
            f"d > 2, got {rotary_dim}"
        )
    return rotary_dim / (rotary_dim - 2)


@dataclass(frozen=True, kw_only=True)
class DefaultScaling(RopeScaling):
    """Unscaled RoPE: ``θ_i = base^(-2i/d)`` and attention factor 1.

    Hugging Face: the ``compute_default_rope_parameters`` of each model's rotary class.

    Example:
        >>> DefaultScaling().frequencies(4, 100.0)[0].tolist()
        [1.0, 0.1]
    """

    name: ClassVar[str] = "default"

    def _inv_freq(self, rotary_dim: int, base: float, seq_len: int | None) -> tuple[Any, float]:
        return unscaled_frequencies(rotary_dim, base), 1.0


@dataclass(frozen=True, kw_only=True)
class LinearScaling(RopeScaling):
    """Linear position interpolation: every frequency divided by ``factor``.

    Position ``p`` gets the angles position ``p / factor`` had (kaiokendev's SuperHOT,
    Chen et al.'s position interpolation; Hugging Face ``"linear"``).

    Args:
        factor: The context extension, a finite number >= 1.

    Example:
        >>> LinearScaling(factor=4.0).frequencies(4, 100.0)[0].tolist()
        [0.25, 0.025]
    """

    name: ClassVar[str] = "linear"
    factor: float

    def __post_init__(self) -> None:
        self._set("factor", _check_factor(self.factor))

    def _inv_freq(self, rotary_dim: int, base: float, seq_len: int | None) -> tuple[Any, float]:
        return unscaled_frequencies(rotary_dim, base) / self.factor, 1.0


@dataclass(frozen=True, kw_only=True)
class NTKScaling(RopeScaling):
    """Static NTK-aware scaling: the base becomes ``base · factor^(d/(d-2))``.

    The highest frequency (``i = 0``) is kept and the lowest is divided by exactly
    ``factor``; the ones between follow the geometric ladder of the new base (bloc97,
    "NTK-Aware Scaled RoPE", 2023); not in Hugging Face's registry (see
    :mod:`posenc.core.rope` for how it relates to ``"dynamic"``). Needs ``d > 2``.

    Args:
        factor: The context extension (bloc97's ``alpha``), a finite number >= 1.

    Example:
        >>> NTKScaling(factor=4.0).frequencies(4, 100.0)[0].tolist()  # base 100·4² = 1600
        [1.0, 0.025]
    """

    name: ClassVar[str] = "ntk"
    needs_base_above_one: ClassVar[bool] = True
    factor: float

    def __post_init__(self) -> None:
        self._set("factor", _check_factor(self.factor))

    def _inv_freq(self, rotary_dim: int, base: float, seq_len: int | None) -> tuple[Any, float]:
        scaled = base * self.factor ** _exponent(rotary_dim, "ntk")
        return rope_frequencies(rotary_dim, scaled), 1.0


@dataclass(frozen=True, kw_only=True)
class DynamicNTKScaling(RopeScaling):
    """Dynamic NTK scaling (Hugging Face ``"dynamic"``): the base grows with the length.

    With ``L = max(seq_len, L₀)`` the base becomes
    ``base · (factor · L / L₀ - (factor - 1))^(d/(d-2))``: unchanged up to ``L₀``, then the
    static NTK base of the extension ``factor · L / L₀ - (factor - 1)``. Needs ``d > 2``.
    keras-hub's and vLLM's "dynamic" differ (see :mod:`posenc.core.rope`).

    Args:
        factor: Hugging Face ``rope_parameters["factor"]``, a finite number >= 1.
        original_max_position_embeddings: ``L₀``, the length trained on (Hugging Face
            reads it from ``config.max_position_embeddings`` for this method).

    Example:
        >>> spec = DynamicNTKScaling(factor=3.0, original_max_position_embeddings=8)
        >>> spec.frequencies(4, 100.0)[0].tolist()  # at L₀: unchanged
        [1.0, 0.1]
        >>> spec.frequencies(4, 100.0, seq_len=16)[0].tolist()  # 3·16/8 - 2 = 4: base 1600
        [1.0, 0.025]
    """

    name: ClassVar[str] = "dynamic_ntk"
    needs_base_above_one: ClassVar[bool] = True
    length_dependent: ClassVar[bool] = True
    factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        self._set("factor", _check_factor(self.factor))
        self._set(
            "original_max_position_embeddings",
            _check_original(self.original_max_position_embeddings),
        )

    def _inv_freq(self, rotary_dim: int, base: float, seq_len: int | None) -> tuple[Any, float]:
        original = self.original_max_position_embeddings
        length = original if seq_len is None else max(seq_len, original)
        stretch = self.factor * length / original - (self.factor - 1)
        scaled = base * stretch ** _exponent(rotary_dim, "dynamic_ntk")
        return rope_frequencies(rotary_dim, scaled), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    # YaRN's attention temperature, sqrt(1/t) = 0.1 ln(s) + 1 (Peng et al., eq. 22).
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True, kw_only=True)
class YarnScaling(RopeScaling):
    """YaRN ("NTK-by-parts" interpolation plus an attention temperature), as Hugging Face.

    Frequency pairs that turn more than ``beta_fast`` times over ``L₀`` positions keep
    their frequency (extrapolation), those that turn fewer than ``beta_slow`` times are
    divided by ``factor`` (interpolation), and a linear ramp over the pair index blends
    the ones between. The pair index where a frequency makes ``r`` turns over ``L₀`` is
    ``d · ln(L₀ / (2π r)) / (2 ln base)``. keras-hub's ``"yarn"`` differs (see
    :mod:`posenc.core.rope`).

    Args:
        factor: The context extension, a finite number >= 1.
        original_max_position_embeddings: ``L₀``, the length trained on.
        beta_fast: Turns over ``L₀`` above which a pair is left unchanged (> 0; 32).
        beta_slow: Turns over ``L₀`` below which a pair is fully interpolated
            (``0 < beta_slow <= beta_fast``; 1).
        mscale, mscale_all_dim: DeepSeek's variant of the temperature: when both are
            given and non-zero, the attention factor is
            ``(0.1 mscale ln f + 1) / (0.1 mscale_all_dim ln f + 1)`` (1.0 when they are
            equal, as in DeepSeek-V3, whose attention applies ``mscale`` itself). Either
            alone is ignored, as in Hugging Face.
        attention_factor: Use this factor instead of deriving one (> 0).
        truncate: Round the ramp's ends outwards to whole pair indices (floor/ceil), as
            the YaRN paper and Hugging Face do by default; ``False`` keeps them fractional.

    Raises:
        ValueError: also when ``mscale``/``mscale_all_dim`` make the attention factor
            zero or negative.

    Example:
        >>> spec = YarnScaling(factor=4.0, original_max_position_embeddings=64)
        >>> inv_freq, attention = spec.frequencies(8, 10000.0)
        >>> inv_freq.tolist(), round(attention, 6)  # attention 0.1 ln 4 + 1
        ([1.0, 0.0625, 0.0025, 0.00025], 1.138629)
    """

    name: ClassVar[str] = "yarn"
    needs_base_above_one: ClassVar[bool] = True
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        self._set("factor", _check_factor(self.factor))
        self._set(
            "original_max_position_embeddings",
            _check_original(self.original_max_position_embeddings),
        )
        beta_fast = check_real(self.beta_fast, "beta_fast", minimum=0.0, strict=True)
        beta_slow = check_real(self.beta_slow, "beta_slow", minimum=0.0, strict=True)
        if beta_slow > beta_fast:
            raise ValueError(
                f"beta_fast (turns above which frequencies are kept) must be >= beta_slow "
                f"(turns below which they are interpolated), got beta_fast={beta_fast}, "
                f"beta_slow={beta_slow}"
            )
        self._set("beta_fast", beta_fast)
        self._set("beta_slow", beta_slow)
        self._set("truncate", check_bool(self.truncate, "truncate"))
        for name in ("mscale", "mscale_all_dim"):
            if getattr(self, name) is not None:
                self._set(name, check_real(getattr(self, name), name))
        if self.attention_factor is not None:
            self._set(
                "attention_factor",
                check_real(self.attention_factor, "attention_factor", minimum=0.0, strict=True),
            )
        elif self.mscale and self.mscale_all_dim:
            for name in ("mscale", "mscale_all_dim"):
                self._check_temperature(name)

    def _check_temperature(self, name: str) -> None:
        """``0.1·value·ln(factor) + 1`` of ``mscale`` or ``mscale_all_dim`` must be finite
        and > 0: DeepSeek's attention factor is the ratio of the two."""
        value, log = getattr(self, name), math.log(self.factor)
        temperature = _yarn_mscale(self.factor, value)
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(
                f"{name} must be a finite real number > {-10 / log:.6g} at factor="
                f"{self.factor:g} (0.1·{name}·ln(factor) + 1 must be > 0: the attention factor "
                f"is the ratio of those of mscale and mscale_all_dim), got {value!r}"
            )

    @property
    def derived_attention_factor(self) -> float:
        """The attention factor: given, DeepSeek's ratio, or ``0.1 ln(factor) + 1``."""
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(
                self.factor, self.mscale_all_dim
            )
        return _yarn_mscale(self.factor)

    def _inv_freq(self, rotary_dim: int, base: float, seq_len: int | None) -> tuple[Any, float]:
        d, original = rotary_dim, self.original_max_position_embeddings

        def correction_dim(turns: float) -> float:
            return (d * math.log(original / (turns * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        # Hugging Face and the YaRN reference clamp the upper end at d - 1 (not d/2 - 1).
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001  # as Hugging Face: avoid 0/0
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        keep = 1.0 - ramp  # the share of the original (extrapolated) frequency
        extrapolated = unscaled_frequencies(d, base)
        interpolated = extrapolated / self.factor
        inv_freq = interpolated * (1.0 - keep) + extrapolated * keep
        return inv_freq, self.derived_attention_factor


@dataclass(frozen=True, kw_only=True)
class Llama3Scaling(RopeScaling):
    """Llama 3.1's frequency-dependent interpolation (Hugging Face ``"llama3"``).

    With wavelength ``λ = 2π/θ``: pairs with ``λ < L₀/high_freq_factor`` are unchanged,
    pairs with ``λ > L₀/low_freq_factor`` are divided by ``factor``, and between them
    ``θ`` is blended, ``(1 - s) θ/factor + s θ`` with ``s = (L₀/λ - low) / (high - low)``.

    Args:
        factor: Division of the low frequencies (>= 1; 8 for Llama 3.1, 32 for 3.2 1B/3B).
        low_freq_factor: ``L₀ / low_freq_factor`` is the wavelength above which pairs are
            fully interpolated (> 0; 1 for Llama 3.1).
        high_freq_factor: ``L₀ / high_freq_factor`` is the wavelength below which pairs
            are unchanged (> low_freq_factor; 4 for Llama 3.1).
        original_max_position_embeddings: ``L₀`` (8192 for Llama 3.1).

    Example:
        >>> spec = Llama3Scaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        ...                      original_max_position_embeddings=1024)
        >>> spec.frequencies(8, 10000.0)[0].round(6).tolist()  # λ 6.3, 63 kept; 628 blended
        [1.0, 0.1, 0.003087, 0.000125]
    """

    name: ClassVar[str] = "llama3"
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        self._set("factor", _check_factor(self.factor))
        low = check_real(self.low_freq_factor, "low_freq_factor", minimum=0.0, strict=True)
        high = check_real(self.high_freq_factor, "high_freq_factor", minimum=0.0, strict=True)
        if high <= low:
            raise ValueError(
                f"high_freq_factor must be greater than low_freq_factor, got "
                f"high_freq_factor={self.high_freq_factor}, low_freq_factor={self.low_freq_factor}"
            )
        self._set("low_freq_factor", low)
        self._set("high_freq_factor", high)
        self._set(
            "original_max_position_embeddings",
            _check_original(self.original_max_position_embeddings),
        )

    def _inv_freq(self, rotary_dim: int, base: float, seq_len: int | None) -> tuple[Any, float]:
        low, high = self.low_freq_factor, self.high_freq_factor
        original, factor = self.original_max_position_embeddings, self.factor
        inv_freq = unscaled_frequencies(rotary_dim, base)
        wavelength = 2 * math.pi / inv_freq
        low_freq_wavelength = original / low  # longer than this: divide by factor
        high_freq_wavelength = original / high  # shorter than this: keep
        scaled = np.where(wavelength > low_freq_wavelength, inv_freq / factor, inv_freq)
        smooth = (original / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
        return np.where(medium, smoothed, scaled), 1.0

    @classmethod
    def example(
        cls, *, factor: float, original_max_position_embeddings: int, rotary_dim: int
    ) -> RopeScaling:
        """Llama 3.1's ``low_freq_factor`` 1 and ``high_freq_factor`` 4."""
        return cls(
            factor=float(factor),
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=int(original_max_position_embeddings),
        )
