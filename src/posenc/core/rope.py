"""Rotary position embedding (RoPE): frequencies, scaling registry, exact tables, rotation.

RoPE (Su et al., 2021) rotates each pair of query/key features by the angle
``position × θ_i`` with ``θ_i = base^(-2i/d)``, ``i = 0 .. d/2 - 1``, where ``d`` is the
rotary width (``rotary_dim``, the whole head or its first part). Scaled variants change
the ``θ_i`` (and sometimes multiply the tables by an ``attention_factor``); they live
in one registry, :data:`ROPE_SCALINGS`, whose functions share one signature::

    fn(head_dim, base=10000.0, *, rotary_dim=None, **params) -> (inv_freq, attention_factor)

``inv_freq`` is float64 of shape ``(rotary_dim // 2,)``; ``attention_factor`` is the
factor Hugging Face multiplies the cos/sin tables by (1.0 where a method has none).
Every method is tested against Hugging Face ``transformers`` (``ROPE_INIT_FUNCTIONS``,
and the models' ``compute_default_rope_parameters`` for ``"default"``) up to the float32
rounding those functions compute in; the values here are float64.

Two layouts of the feature pairs are in use, and :func:`rope_permutation` converts:

``"half"``
    Feature ``j`` pairs with ``j + d/2`` (``rotate_half``): GPT-NeoX, Hugging Face,
    keras-hub. Tables are ``[θ_0 .. θ_{d/2-1}, θ_0 .. θ_{d/2-1}]``.
``"interleaved"``
    Feature ``2i`` pairs with ``2i + 1`` (complex multiplication): Meta's Llama
    reference code, torchtune, GPT-J. Tables are ``[θ_0, θ_0, θ_1, θ_1, ...]``.

Same name, different maths (keras-hub: ``keras_hub/src/layers/modeling/rotary_embedding.py``
as of the version with ``rope_type``; vLLM: its API reference):

* ``"linear"`` here and in Hugging Face divides every ``θ_i`` by ``factor``, which is
  the same as dividing positions by ``factor``. That is what keras-hub's
  ``RotaryEmbedding(scaling_factor=...)`` does with its default ``rope_type="linear"``
  (documented as "the scaling factor used to scale positions of the tokens"); with its
  other ``rope_type`` values the same argument is those methods' factor.
* ``"dynamic_ntk"`` here is Hugging Face's ``"dynamic"``: the NTK base change
  ``base · (factor·L/L₀ - (factor - 1))^(d/(d-2))`` evaluated at the current sequence
  length ``L`` (no change while ``L <= L₀``). keras-hub's ``RotaryEmbedding`` also has a
  ``rope_type="dynamic"``, but it divides *every* inverse frequency by
  ``scaling_factor^(d/(d-2))``: a linear scaling by that number, independent of the
  sequence length and not a base change. vLLM's ``DynamicNTKScalingRotaryEmbedding``
  evaluates Hugging Face's formula once, at ``L = factor · L₀``, for every length; that
  is ``dynamic_ntk(..., seq_len=factor * L0)`` here.
* ``"ntk"`` (static NTK-aware scaling, base ``base · factor^(d/(d-2))``) is not in
  Hugging Face's registry; it equals Hugging Face's ``"dynamic"`` at the length where
  ``factor_hf · L/L₀ - (factor_hf - 1) = factor``.
* ``"yarn"``: keras-hub's ``rope_type="yarn"`` defaults to ``truncate=False`` (Hugging
  Face: ``True``), clamps the ramp's upper end at ``d/2 - 1`` (Hugging Face: ``d - 1``),
  always uses ``0.1 ln(factor) + 1`` as attention factor (no ``mscale`` options) and,
  with ``truncate=True``, clips the *positions* at ``original_max_position_embeddings``.
  The functions here follow Hugging Face.

Tables (:func:`rope_tables`) are exact: the angle ``position × θ`` is reduced with
``θ/2π`` held as a double-double (:func:`posenc.core.precision.turns_of`), so every
float32 value is within 0.5 ulp (+1e-15) of the exact cos/sin of ``position × θ`` with
``θ`` the given float64 number, at any position; peers form the angle in float32.

References:
    Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
    kaiokendev, "Things I'm learning while training SuperHOT" (linear interpolation), 2023;
    bloc97, "NTK-Aware Scaled RoPE" (Reddit r/LocalLLaMA), 2023;
    Peng et al., "YaRN: Efficient Context Window Extension of Large Language Models", 2023;
    Meta, Llama 3.1 ``apply_scaling`` (``llama3``), 2024;
    Ding et al., "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens", 2024;
    Hugging Face ``transformers/modeling_rope_utils.py``.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from .._checks import (
    DEFAULT_MAX_BYTES,
    check_base,
    check_choice,
    check_int,
    check_memory,
    describe,
)
from .frequencies import _frequency_table
from .precision import FORMATS, resolve_dtype, round_to_format, turns_of, unit_phasors
from .sinusoidal import _CHUNK_ELEMENTS, _CONTAINERS, _contiguous_range, _phasors

__all__ = [
    "ROPE_LAYOUTS",
    "ROPE_SCALINGS",
    "apply_rope",
    "default_rope",
    "dynamic_ntk_rope",
    "linear_rope",
    "llama3_rope",
    "longrope_rope",
    "ntk_rope",
    "rope_frequencies",
    "rope_permutation",
    "rope_scaling",
    "rope_table_values",
    "rope_tables",
    "yarn_rope",
]

RopeLayout = Literal["half", "interleaved"]
ROPE_LAYOUTS: tuple[str, ...] = ("half", "interleaved")


# ---------------------------------------------------------------------------------------
# Validation


def _check_rotary_dim(head_dim: Any, rotary_dim: Any) -> int:
    """The rotary width: ``rotary_dim`` (default ``head_dim``), even, in ``[2, head_dim]``."""
    head_dim = check_int(head_dim, "head_dim", minimum=1)
    if rotary_dim is None:
        rotary_dim = head_dim
        what = f"head_dim (the default rotary_dim), got {head_dim}"
    else:
        rotary_dim = check_int(rotary_dim, "rotary_dim", minimum=2)
        what = f"rotary_dim, got {rotary_dim}"
        if rotary_dim > head_dim:
            raise ValueError(
                f"rotary_dim must be at most head_dim={head_dim} (only the first rotary_dim "
                f"features rotate), got {rotary_dim}"
            )
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"RoPE rotates pairs of features, so the rotary width must be an even int >= 2: "
            f"{what}; pass an even rotary_dim to rotate only the first features"
        )
    return rotary_dim


def _check_real(
    value: Any, name: str, *, minimum: float | None = None, strict: bool = False
) -> float:
    """A finite real number (not bool), ``> minimum`` if ``strict`` else ``>= minimum``."""
    bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a finite real number{bound}, got {describe(value)}")
    number = float(value)
    if not math.isfinite(number) or (
        minimum is not None and (number <= minimum if strict else number < minimum)
    ):
        raise ValueError(f"{name} must be a finite real number{bound}, got {value!r}")
    return number


def _check_factor(value: Any) -> float:
    # Every method here extends the context: Hugging Face's validators also ask for >= 1.
    return _check_real(value, "factor", minimum=1.0)


def _check_length(value: Any, name: str) -> int:
    return check_int(value, name, minimum=1)


def _exponent(rotary_dim: int, method: str) -> float:
    """``d / (d - 2)``, the NTK base exponent; needs ``d > 2``."""
    if rotary_dim <= 2:
        raise ValueError(
            f"{method} scales the base by factor^(d/(d-2)), which needs a rotary width "
            f"d > 2, got {rotary_dim}"
        )
    return rotary_dim / (rotary_dim - 2)


# ---------------------------------------------------------------------------------------
# Frequencies and the scaling registry


def rope_frequencies(
    head_dim: int, base: float = 10000.0, *, rotary_dim: int | None = None
) -> np.ndarray:
    """RoPE inverse frequencies ``θ_i = base^(-2i/d)``, ``i = 0 .. d/2 - 1``.

    Args:
        head_dim: Features per attention head (int >= 1).
        base: The RoPE base (``rope_theta``; 10000 in RoFormer and Llama 2, 500000 in
            Llama 3). Finite, > 0 and not 1.
        rotary_dim: The rotary width ``d``: even, ``2 <= d <= head_dim``. Defaults to
            ``head_dim``. Hugging Face derives it as
            ``int(head_dim * partial_rotary_factor)``.

    Returns:
        float64 array of shape ``(d // 2,)``, radians per position, each value the
        correctly rounded ``base^(-2i/d)`` (computed at 50 digits, as the sinusoidal
        frequencies: it is the same formula).

    Example:
        >>> rope_frequencies(8, 10000.0).tolist()
        [1.0, 0.1, 0.01, 0.001]
        >>> rope_frequencies(8, 100.0, rotary_dim=4).tolist()
        [1.0, 0.1]
    """
    d = _check_rotary_dim(head_dim, rotary_dim)
    base = check_base(base)
    return _frequency_table(d, base, "paper")[0].copy()


def default_rope(
    head_dim: int, base: float = 10000.0, *, rotary_dim: int | None = None
) -> tuple[np.ndarray, float]:
    """Unscaled RoPE: :func:`rope_frequencies` and attention factor 1.

    Hugging Face: the ``compute_default_rope_parameters`` of each model's rotary class
    (``"default"`` is not in ``ROPE_INIT_FUNCTIONS``); Llama's ignores
    ``partial_rotary_factor``.

    Example:
        >>> inv_freq, attention_factor = default_rope(4, 100.0)
        >>> inv_freq.tolist(), attention_factor
        ([1.0, 0.1], 1.0)
    """
    return rope_frequencies(head_dim, base, rotary_dim=rotary_dim), 1.0


def linear_rope(
    head_dim: int, base: float = 10000.0, *, rotary_dim: int | None = None, factor: float
) -> tuple[np.ndarray, float]:
    """Linear position interpolation: every frequency divided by ``factor``.

    Args:
        head_dim, base, rotary_dim: As in :func:`rope_frequencies`.
        factor: The context extension (>= 1); position ``p`` gets the angles that
            position ``p / factor`` had. Hugging Face ``rope_parameters["factor"]``.

    Returns:
        ``(rope_frequencies(...) / factor, 1.0)``.

    Example:
        >>> linear_rope(4, 100.0, factor=4.0)[0].tolist()
        [0.25, 0.025]
    """
    factor = _check_factor(factor)
    return rope_frequencies(head_dim, base, rotary_dim=rotary_dim) / factor, 1.0


def ntk_rope(
    head_dim: int, base: float = 10000.0, *, rotary_dim: int | None = None, factor: float
) -> tuple[np.ndarray, float]:
    """Static NTK-aware scaling: the base becomes ``base · factor^(d/(d-2))``.

    The highest frequency (``i = 0``) is kept and the lowest is divided by exactly
    ``factor``; the ones between follow the geometric ladder of the new base.

    Args:
        head_dim, base, rotary_dim: As in :func:`rope_frequencies` (``d > 2``).
        factor: The context extension (>= 1), bloc97's ``alpha``.

    Returns:
        ``(rope_frequencies(head_dim, base · factor^(d/(d-2)), rotary_dim=d), 1.0)``.

    Example:
        >>> inv_freq, _ = ntk_rope(4, 100.0, factor=4.0)
        >>> inv_freq.tolist()  # base 100·4² = 1600
        [1.0, 0.025]
    """
    d = _check_rotary_dim(head_dim, rotary_dim)
    base = check_base(base)
    factor = _check_factor(factor)
    scaled = base * factor ** _exponent(d, "ntk")
    return rope_frequencies(d, scaled), 1.0


def dynamic_ntk_rope(
    head_dim: int,
    base: float = 10000.0,
    *,
    rotary_dim: int | None = None,
    factor: float,
    original_max_position_embeddings: int,
    seq_len: int | None = None,
) -> tuple[np.ndarray, float]:
    """Dynamic NTK scaling (Hugging Face ``"dynamic"``): the base grows with the length.

    With ``L = max(seq_len, L₀)`` the base becomes
    ``base · (factor · L / L₀ - (factor - 1))^(d/(d-2))``: unchanged up to ``L₀``, then
    growing linearly in ``L`` inside the power (the static :func:`ntk_rope` base for the
    extension ``factor · L / L₀ - (factor - 1)``).

    Args:
        head_dim, base, rotary_dim: As in :func:`rope_frequencies` (``d > 2``).
        factor: Hugging Face ``rope_parameters["factor"]`` (>= 1).
        original_max_position_embeddings: ``L₀``, the length trained on. Hugging Face
            reads it from ``config.max_position_embeddings`` for this method.
        seq_len: The current sequence length (Hugging Face: ``max(position_ids) + 1``,
            re-evaluated in ``forward`` whenever it grows past the cached length, and
            reset to the original frequencies when it falls back under ``L₀``).
            ``None`` means ``L₀`` (the frequencies at model construction).

    Returns:
        ``(inv_freq, 1.0)``.

    Example:
        >>> dynamic_ntk_rope(4, 100.0, factor=2.0, original_max_position_embeddings=8)[0]
        array([1. , 0.1])
        >>> inv_freq, _ = dynamic_ntk_rope(
        ...     4, 100.0, factor=3.0, original_max_position_embeddings=8, seq_len=16)
        >>> inv_freq.tolist()  # 3·16/8 - 2 = 4: base 100·4² = 1600
        [1.0, 0.025]
    """
    d = _check_rotary_dim(head_dim, rotary_dim)
    base = check_base(base)
    factor = _check_factor(factor)
    original = _check_length(original_max_position_embeddings, "original_max_position_embeddings")
    length = original if seq_len is None else max(_check_length(seq_len, "seq_len"), original)
    scaled = base * ((factor * length / original) - (factor - 1)) ** _exponent(d, "dynamic_ntk")
    return rope_frequencies(d, scaled), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    # YaRN's attention temperature, sqrt(1/t) = 0.1 ln(s) + 1 (Peng et al., eq. 22).
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_rope(
    head_dim: int,
    base: float = 10000.0,
    *,
    rotary_dim: int | None = None,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
    truncate: bool = True,
) -> tuple[np.ndarray, float]:
    """YaRN ("NTK-by-parts" interpolation plus an attention temperature), as Hugging Face.

    Frequency pairs that turn more than ``beta_fast`` times over ``L₀`` positions keep
    their frequency (extrapolation), those that turn fewer than ``beta_slow`` times are
    divided by ``factor`` (interpolation), and a linear ramp over the pair index blends
    the ones between. The pair index where a frequency makes ``r`` turns over ``L₀`` is
    ``d · ln(L₀ / (2π r)) / (2 ln base)``.

    Args:
        head_dim, base, rotary_dim: As in :func:`rope_frequencies`.
        factor: The context extension (>= 1).
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

    Returns:
        ``(inv_freq, attention_factor)``; by default the factor is
        ``0.1 ln(factor) + 1``.

    Example:
        >>> inv_freq, attention = yarn_rope(
        ...     8, 10000.0, factor=4.0, original_max_position_embeddings=64)
        >>> inv_freq.tolist(), round(attention, 6)
        ([1.0, 0.0625, 0.0025, 0.00025], 1.138629)
    """
    d = _check_rotary_dim(head_dim, rotary_dim)
    base = check_base(base)
    factor = _check_factor(factor)
    original = _check_length(original_max_position_embeddings, "original_max_position_embeddings")
    beta_fast = _check_real(beta_fast, "beta_fast", minimum=0.0, strict=True)
    beta_slow = _check_real(beta_slow, "beta_slow", minimum=0.0, strict=True)
    if beta_slow > beta_fast:
        raise ValueError(
            f"beta_fast (turns above which frequencies are kept) must be >= beta_slow (turns "
            f"below which they are interpolated), got beta_fast={beta_fast}, "
            f"beta_slow={beta_slow}"
        )
    if not isinstance(truncate, (bool, np.bool_)):
        raise TypeError(f"truncate must be a bool, got {describe(truncate)}")

    if attention_factor is not None:
        attention = _check_real(attention_factor, "attention_factor", minimum=0.0, strict=True)
    else:
        if mscale is not None:
            mscale = _check_real(mscale, "mscale")
        if mscale_all_dim is not None:
            mscale_all_dim = _check_real(mscale_all_dim, "mscale_all_dim")
        if mscale and mscale_all_dim:
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention = _yarn_mscale(factor)

    def correction_dim(turns: float) -> float:
        return (d * math.log(original / (turns * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    # Hugging Face and the YaRN reference clamp the upper end at d - 1 (not d/2 - 1).
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # as Hugging Face: avoid 0/0
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # the share of the original (extrapolated) frequency
    extrapolated = rope_frequencies(d, base)
    interpolated = extrapolated / factor
    inv_freq = interpolated * (1.0 - keep) + extrapolated * keep
    return inv_freq, float(attention)


def llama3_rope(
    head_dim: int,
    base: float = 10000.0,
    *,
    rotary_dim: int | None = None,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> tuple[np.ndarray, float]:
    """Llama 3.1's frequency-dependent interpolation (Hugging Face ``"llama3"``).

    With wavelength ``λ = 2π/θ``: pairs with ``λ < L₀/high_freq_factor`` are unchanged,
    pairs with ``λ > L₀/low_freq_factor`` are divided by ``factor``, and between them
    ``θ`` is blended, ``(1 - s) θ/factor + s θ`` with ``s = (L₀/λ - low) / (high - low)``.

    Args:
        head_dim, base, rotary_dim: As in :func:`rope_frequencies`.
        factor: Division of the low frequencies (>= 1; 8 for Llama 3.1, 32 for 3.2 1B/3B).
        low_freq_factor: ``L₀ / low_freq_factor`` is the wavelength above which pairs are
            fully interpolated (> 0; 1 for Llama 3.1).
        high_freq_factor: ``L₀ / high_freq_factor`` is the wavelength below which pairs
            are unchanged (> low_freq_factor; 4 for Llama 3.1).
        original_max_position_embeddings: ``L₀`` (8192 for Llama 3.1).

    Returns:
        ``(inv_freq, 1.0)``.

    Example:
        >>> inv_freq, _ = llama3_rope(
        ...     8, 10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        ...     original_max_position_embeddings=1024)
        >>> inv_freq.round(6).tolist()  # λ = 2π/θ: 6.3 and 63 kept, 628 blended, 6283 / 8
        [1.0, 0.1, 0.003087, 0.000125]
    """
    d = _check_rotary_dim(head_dim, rotary_dim)
    base = check_base(base)
    factor = _check_factor(factor)
    low = _check_real(low_freq_factor, "low_freq_factor", minimum=0.0, strict=True)
    high = _check_real(high_freq_factor, "high_freq_factor", minimum=0.0, strict=True)
    if high <= low:
        raise ValueError(
            f"high_freq_factor must be greater than low_freq_factor, got "
            f"high_freq_factor={high_freq_factor}, low_freq_factor={low_freq_factor}"
        )
    original = _check_length(original_max_position_embeddings, "original_max_position_embeddings")

    inv_freq = rope_frequencies(d, base)
    wavelength = 2 * math.pi / inv_freq
    low_freq_wavelength = original / low  # longer than this: divide by factor
    high_freq_wavelength = original / high  # shorter than this: keep
    scaled = np.where(wavelength > low_freq_wavelength, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
    return np.where(medium, smoothed, scaled), 1.0


def longrope_rope(
    head_dim: int,
    base: float = 10000.0,
    *,
    rotary_dim: int | None = None,
    short_factor: Sequence[float],
    long_factor: Sequence[float],
    original_max_position_embeddings: int,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    factor: float | None = None,
    attention_factor: float | None = None,
) -> tuple[np.ndarray, float]:
    """LongRoPE (Phi-3): a searched divisor per frequency, one set for short, one for long.

    Args:
        head_dim, base, rotary_dim: As in :func:`rope_frequencies`.
        short_factor: ``d/2`` positive divisors used while ``seq_len <= L₀``.
        long_factor: ``d/2`` positive divisors used when ``seq_len > L₀``.
        original_max_position_embeddings: ``L₀``, the pre-training length (4096 for
            Phi-3-mini-128k).
        seq_len: The current sequence length; ``None`` selects ``short_factor`` (as
            Hugging Face at construction; its ``forward`` switches to ``long_factor`` once
            ``max(position_ids) + 1 > L₀``).
        max_position_embeddings: The extended length; only used to derive ``factor``
            when ``factor`` is not given (``max_position_embeddings / L₀``, as Phi-3).
        factor: The context extension; needed (directly or through
            ``max_position_embeddings``) only when ``attention_factor`` is not given.
        attention_factor: Use this factor instead of
            ``sqrt(1 + ln(factor) / ln(L₀))`` (1 when ``factor <= 1``). It does not depend
            on ``seq_len``: Hugging Face fixes it at construction.

    Returns:
        ``(rope_frequencies(...) / ext, attention_factor)`` with ``ext`` the selected
        divisors.

    Example:
        >>> inv_freq, attention = longrope_rope(
        ...     4, 100.0, short_factor=[1.0, 2.0], long_factor=[4.0, 8.0],
        ...     original_max_position_embeddings=16, max_position_embeddings=64)
        >>> inv_freq.tolist(), round(attention, 6)
        ([1.0, 0.05], 1.224745)
        >>> longrope_rope(
        ...     4, 100.0, short_factor=[1.0, 2.0], long_factor=[4.0, 8.0],
        ...     original_max_position_embeddings=16, seq_len=17, factor=4.0)[0].tolist()
        [0.25, 0.0125]
    """
    d = _check_rotary_dim(head_dim, rotary_dim)
    base = check_base(base)
    original = _check_length(original_max_position_embeddings, "original_max_position_embeddings")
    short = _check_divisors(short_factor, "short_factor", d // 2)
    long = _check_divisors(long_factor, "long_factor", d // 2)
    if seq_len is not None:
        seq_len = _check_length(seq_len, "seq_len")

    if attention_factor is not None:
        attention = _check_real(attention_factor, "attention_factor", minimum=0.0, strict=True)
    else:
        if factor is not None:
            factor = _check_real(factor, "factor", minimum=0.0, strict=True)
        elif max_position_embeddings is not None:
            factor = _check_length(max_position_embeddings, "max_position_embeddings") / original
        else:
            raise TypeError(
                "longrope needs factor=, max_position_embeddings= (factor = "
                "max_position_embeddings / original_max_position_embeddings) or "
                "attention_factor= to set the attention factor"
            )
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))

    divisors = long if seq_len is not None and seq_len > original else short
    return rope_frequencies(d, base) / divisors, float(attention)


def _check_divisors(values: Any, name: str, count: int) -> np.ndarray:
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise TypeError(
            f"{name} must be a list of {count} positive numbers, got {describe(values)}"
        )
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a list of {count} positive numbers") from exc
    if array.shape != (count,):
        raise ValueError(
            f"{name} must hold one divisor per frequency, rotary_dim // 2 = {count} of them, "
            f"got shape {array.shape}"
        )
    if not np.all(np.isfinite(array) & (array > 0)):
        raise ValueError(f"{name} must be finite and > 0, got {array[~(array > 0)][:3].tolist()}")
    return array


ScalingFunction = Callable[..., tuple[np.ndarray, float]]

ROPE_SCALINGS: dict[str, ScalingFunction] = {
    "default": default_rope,
    "linear": linear_rope,
    "ntk": ntk_rope,
    "dynamic_ntk": dynamic_ntk_rope,
    "yarn": yarn_rope,
    "llama3": llama3_rope,
    "longrope": longrope_rope,
}
"""RoPE scaling methods by name; each ``fn(head_dim, base, *, rotary_dim, **params)``."""

# Names other libraries use for a method registered here under another name.
_ALIASES = {"dynamic": "dynamic_ntk", "ntk-aware": "ntk", "ntk_aware": "ntk"}


def rope_scaling(
    name: str,
    head_dim: int,
    base: float = 10000.0,
    *,
    rotary_dim: int | None = None,
    **params: Any,
) -> tuple[np.ndarray, float]:
    """Inverse frequencies and attention factor of the scaling method ``name``.

    Args:
        name: A key of :data:`ROPE_SCALINGS`: ``"default"``, ``"linear"``, ``"ntk"``,
            ``"dynamic_ntk"``, ``"yarn"``, ``"llama3"``, ``"longrope"``.
        head_dim, base, rotary_dim: As in :func:`rope_frequencies`.
        **params: The method's own parameters (see each function).

    Returns:
        ``(inv_freq, attention_factor)``: float64 ``(rotary_dim // 2,)`` and a float.

    Example:
        >>> inv_freq, attention = rope_scaling("linear", 4, 100.0, factor=2.0)
        >>> inv_freq.tolist(), attention
        ([0.5, 0.05], 1.0)
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be one of {list(ROPE_SCALINGS)}, got {describe(name)}")
    if name not in ROPE_SCALINGS:
        hint = ""
        if name in _ALIASES:
            hint = f" ({name!r} is called {_ALIASES[name]!r} here)"
        raise ValueError(f"unknown RoPE scaling {name!r}{hint}; valid: {list(ROPE_SCALINGS)}")
    function = ROPE_SCALINGS[name]
    parameters = inspect.signature(function).parameters
    accepted = [
        p for p in parameters.values() if p.kind is p.KEYWORD_ONLY and p.name != "rotary_dim"
    ]
    unknown = sorted(set(params) - {p.name for p in accepted})
    missing = [p.name for p in accepted if p.default is p.empty and p.name not in params]
    if unknown or missing:
        problem = f"unknown {unknown}" if unknown else f"missing {missing}"
        raise TypeError(
            f"RoPE scaling {name!r}: {problem} parameters; it takes "
            f"{[p.name for p in accepted] or 'none'} "
            f"(required: {[p.name for p in accepted if p.default is p.empty] or 'none'})"
        )
    return function(head_dim, base, rotary_dim=rotary_dim, **params)


# ---------------------------------------------------------------------------------------
# Tables


def _check_inv_freq(inv_freq: Any) -> np.ndarray:
    try:
        array = np.asarray(inv_freq)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"inv_freq must be a 1-D array of numbers, got {describe(inv_freq)}"
        ) from exc
    if array.dtype == np.bool_ or array.dtype.kind not in "iuf":
        raise TypeError(f"inv_freq must hold real numbers, got {describe(inv_freq)}")
    if array.ndim != 1 or array.size == 0:
        raise ValueError(
            f"inv_freq must be a non-empty 1-D array (one frequency per feature pair), got "
            f"shape {array.shape}"
        )
    array = array.astype(np.float64)  # exact for float16/32/64 and for ints below 2**53
    if not np.all(np.isfinite(array)):
        raise ValueError("inv_freq must be finite")
    return array


def rope_tables(
    positions: Any,
    inv_freq: Any,
    *,
    dtype: Any = "float32",
    layout: RopeLayout = "half",
    scale: float = 1.0,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``(cos, sin)`` tables of RoPE, correctly rounded in ``dtype`` at any position.

    ``cos[..., j] = scale · cos(position · θ_k)`` with ``k`` the frequency of column
    ``j`` in ``layout``, computed with exact angle reduction in float64 and rounded once.

    Args:
        positions: An int ``L`` (positions ``0 .. L-1``, the fast path; so is any 1-D run
            of consecutive integers) or an array of any shape of integer or fractional
            positions (finite, ``|p| <= 2**53``).
        inv_freq: The ``θ_k``, 1-D (from :func:`rope_frequencies` or a scaling method);
            each value is taken as the exact number it holds, so a float32 ``inv_freq``
            from another library gives that library's angles, exactly.
        dtype: float16, bfloat16 (needs ``ml_dtypes``), float32 or float64.
        layout: ``"half"`` (``[θ_0 .. θ_{m-1}, θ_0 .. θ_{m-1}]``, Hugging Face /
            GPT-NeoX) or ``"interleaved"`` (``[θ_0, θ_0, θ_1, θ_1, ...]``, Meta / GPT-J).
        scale: Multiplies both tables before rounding: the ``attention_factor`` of YaRN
            and LongRoPE (Hugging Face multiplies its float32 tables by it).
        max_bytes: Refuse tables whose memory exceeds this (``None``: no limit).

    Returns:
        ``(cos, sin)``, each of shape ``(*positions.shape, 2 * len(inv_freq))``.

    Example:
        >>> cos, sin = rope_tables(3, [1.0, 0.1], dtype="float64")
        >>> cos.round(6)
        array([[ 1.      ,  1.      ,  1.      ,  1.      ],
               [ 0.540302,  0.995004,  0.540302,  0.995004],
               [-0.416147,  0.980067, -0.416147,  0.980067]])
        >>> rope_tables([2], [1.0, 0.1], dtype="float64", layout="interleaved")[1].round(6)
        array([[0.909297, 0.909297, 0.198669, 0.198669]])
    """
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    fmt, np_dtype = resolve_dtype(dtype)
    cos, sin = rope_table_values(
        positions, inv_freq, fmt=fmt, layout=layout, scale=scale, max_bytes=max_bytes
    )
    if cos.dtype != np_dtype:
        cos, sin = cos.astype(np_dtype), sin.astype(np_dtype)
    return cos, sin


def rope_table_values(
    positions: Any,
    inv_freq: Any,
    *,
    fmt: str,
    layout: str,
    scale: float = 1.0,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    start: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rope_tables` in the container of ``fmt`` (bfloat16 values as exact float32).

    For the framework adapters. With an int ``positions`` (a length), ``start`` shifts
    the range to ``start .. start+positions-1``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {list(FORMATS)}, got {fmt!r}")
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    scale = _check_real(scale, "scale")
    inv_freq = _check_inv_freq(inv_freq)
    container = _CONTAINERS[fmt]
    span = _contiguous_range(positions)
    if start:
        if not isinstance(positions, numbers.Integral):
            raise TypeError("start= applies only when positions is an int length")
        start = check_int(start, "start", minimum=-(2**53))
        span = (span[0] + start, span[1])
    shape = (span[1],) if span is not None else np.shape(positions)
    count, m = math.prod(shape), inv_freq.size
    check_memory(2 * count * 2 * m * container.itemsize, "these RoPE tables", max_bytes)
    hi, lo = turns_of(inv_freq)
    cos = np.empty((count, 2 * m), container)
    sin = np.empty((count, 2 * m), container)
    rows = max(64, _CHUNK_ELEMENTS // m)
    if span is not None:
        first, length = span
        if abs(first) + length > 2**53:
            raise ValueError("positions must lie within ±2**53 to be represented exactly")
        for r0 in range(0, length, rows):
            n = min(rows, length - r0)
            z = _phasors(float(first + r0), n, hi, lo)  # e^{ikθ}, (n, m)
            _write(cos[r0 : r0 + n], z.real, fmt, layout, scale)
            _write(sin[r0 : r0 + n], z.imag, fmt, layout, scale)
    else:
        flat = np.asarray(positions, dtype=np.float64).reshape(-1, 1)
        for r0 in range(0, count, rows):
            s, c = unit_phasors(flat[r0 : r0 + rows], hi, lo)
            _write(cos[r0 : r0 + rows], c, fmt, layout, scale)
            _write(sin[r0 : r0 + rows], s, fmt, layout, scale)
    return cos.reshape((*shape, 2 * m)), sin.reshape((*shape, 2 * m))


def _write(out: np.ndarray, values: np.ndarray, fmt: str, layout: str, scale: float) -> None:
    """Round float64 ``values`` (rows, m) once into ``out`` (rows, 2m) in ``layout``."""
    if scale != 1.0:
        values = values * scale
    rounded = round_to_format(values, fmt)
    m = values.shape[-1]
    if layout == "half":
        out[:, :m] = rounded
        out[:, m:] = rounded
    else:
        out[:, 0::2] = rounded
        out[:, 1::2] = rounded


# ---------------------------------------------------------------------------------------
# Rotation


def _float_format(array: np.ndarray, name: str) -> str:
    dtype_name = array.dtype.name
    if dtype_name not in FORMATS:
        raise TypeError(
            f"{name} must be a floating array of dtype float16, bfloat16, float32 or float64, "
            f"got {describe(array)}"
        )
    return dtype_name


def check_rope_shapes(
    x_shape: tuple[int, ...],
    cos_shape: tuple[int, ...],
    sin_shape: tuple[int, ...],
    rotary_dim: int | None,
) -> int:
    """The rotary width of :func:`apply_rope`'s arguments, or a ValueError naming the shapes.

    Shared by the front ends' ``apply_rope``: the tables' last axis is the rotated width
    (``rotary_dim`` must equal it when given), even, at most ``x``'s feature axis, and the
    tables broadcast to ``x[..., :rotary_dim]`` without enlarging it.
    """
    if cos_shape != sin_shape:
        raise ValueError(f"cos and sin must have the same shape, got {cos_shape} and {sin_shape}")
    if len(x_shape) < 1 or len(cos_shape) < 1:
        raise ValueError(f"x and cos/sin need a feature axis, got shapes {x_shape} and {cos_shape}")
    head_dim, width = x_shape[-1], cos_shape[-1]
    if rotary_dim is None:
        rotary_dim = width
    elif rotary_dim != width:
        raise ValueError(
            f"rotary_dim={rotary_dim} does not match the tables' last axis {width}; "
            "build the tables for the rotated width only"
        )
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"the rotary width (the tables' last axis) must be an even int >= 2, got {rotary_dim}"
        )
    if rotary_dim > head_dim:
        raise ValueError(
            f"the rotary width {rotary_dim} exceeds x's feature axis {head_dim} "
            f"(x has shape {x_shape})"
        )
    rotated_shape = (*x_shape[:-1], rotary_dim)
    try:
        broadcast = np.broadcast_shapes(rotated_shape, cos_shape)
    except ValueError:
        broadcast = None
    if broadcast != rotated_shape:
        raise ValueError(
            f"cos/sin of shape {cos_shape} do not broadcast to x[..., :{rotary_dim}] of shape "
            f"{rotated_shape} without enlarging it: expected (seq, rotary_dim) = "
            f"{rotated_shape[-2:]}; for x of shape (batch, seq, heads, head_dim) pass "
            "cos[:, None, :] and sin[:, None, :]"
        )
    return int(rotary_dim)


def apply_rope(
    x: Any,
    cos: Any,
    sin: Any,
    *,
    layout: RopeLayout = "half",
    rotary_dim: int | None = None,
) -> np.ndarray:
    """Rotate the feature pairs of ``x`` by the angles whose ``cos``/``sin`` are given.

    ``"half"``: ``x·cos + rotate_half(x)·sin`` with ``rotate_half(x) = [-x₂, x₁]`` (Hugging
    Face ``apply_rotary_pos_emb``). ``"interleaved"``: each pair ``(x₀, x₁)`` becomes
    ``(x₀ cos - x₁ sin, x₀ sin + x₁ cos)`` (Meta's complex multiplication). Only the
    first ``rotary_dim`` features rotate; the rest pass through unchanged. The arithmetic
    is float64 and the result is rounded once to ``x.dtype``.

    Args:
        x: Queries or keys, shape ``(..., seq, head_dim)``, a float dtype.
        cos, sin: Tables from :func:`rope_tables` in the same ``layout``, shape
            ``(seq, rotary_dim)`` or anything that broadcasts to ``x[..., :rotary_dim]``
            without enlarging it (e.g. ``(batch, 1, seq, rotary_dim)`` for
            ``x`` of shape ``(batch, heads, seq, head_dim)``).
        layout: ``"half"`` or ``"interleaved"``; must match the tables.
        rotary_dim: The rotated width; defaults to ``cos.shape[-1]`` and must equal it.

    Returns:
        Array of ``x``'s shape and dtype.

    Example:
        >>> cos, sin = rope_tables(2, [1.0], dtype="float64")
        >>> apply_rope(np.array([[1.0, 0.0], [1.0, 0.0]]), cos, sin).round(6)
        array([[1.      , 0.      ],
               [0.540302, 0.841471]])
    """
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    x = np.asarray(x)
    cos, sin = np.asarray(cos), np.asarray(sin)
    fmt = _float_format(x, "x")
    _float_format(cos, "cos")
    _float_format(sin, "sin")
    rotary_dim = check_rope_shapes(
        x.shape,
        cos.shape,
        sin.shape,
        None if rotary_dim is None else check_int(rotary_dim, "rotary_dim", minimum=2),
    )

    xr = x[..., :rotary_dim].astype(np.float64)
    c, s = cos.astype(np.float64), sin.astype(np.float64)
    turned = np.empty_like(xr)  # the pair partner, rotated by 90°
    if layout == "half":
        h = rotary_dim // 2
        turned[..., :h] = -xr[..., h:]
        turned[..., h:] = xr[..., :h]
    else:
        turned[..., 0::2] = -xr[..., 1::2]
        turned[..., 1::2] = xr[..., 0::2]
    out = np.empty(x.shape, x.dtype)
    out[..., :rotary_dim] = round_to_format(xr * c + turned * s, fmt)
    out[..., rotary_dim:] = x[..., rotary_dim:]
    return out


def rope_permutation(
    head_dim: int, source: RopeLayout, target: RopeLayout, *, rotary_dim: int | None = None
) -> np.ndarray:
    """Feature indices ``perm`` with ``x_in_target = x_in_source[..., perm]``.

    With matching tables, ``apply_rope(x[..., perm], layout=target)`` equals
    ``apply_rope(x, layout=source)[..., perm]``, so permuting the rows of the query and
    key projection weights (per head) moves a checkpoint between layouts.
    ``"interleaved"`` → ``"half"`` is the permutation Hugging Face's Llama conversion
    script applies to Meta's ``wq``/``wk`` (``permute``: ``(d/2, 2) → (2, d/2)`` per head).
    Features past ``rotary_dim`` stay where they are.

    Args:
        head_dim: Features per head.
        source, target: ``"half"`` or ``"interleaved"``.
        rotary_dim: The rotated width (even, <= head_dim); defaults to ``head_dim``.

    Returns:
        int64 array of shape ``(head_dim,)``.

    Example:
        >>> rope_permutation(6, "interleaved", "half").tolist()
        [0, 2, 4, 1, 3, 5]
        >>> rope_permutation(6, "half", "interleaved", rotary_dim=4).tolist()
        [0, 2, 1, 3, 4, 5]
    """
    r = _check_rotary_dim(head_dim, rotary_dim)
    source = check_choice(source, "source", ROPE_LAYOUTS)
    target = check_choice(target, "target", ROPE_LAYOUTS)
    perm = np.arange(head_dim)
    if source == target:
        return perm
    interleaved_to_half = np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2)])
    perm[:r] = interleaved_to_half if source == "interleaved" else np.argsort(interleaved_to_half)
    return perm
