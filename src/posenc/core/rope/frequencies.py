"""RoPE's unscaled frequencies ``θ_i = base^(-2i/d)`` and the rotary width they need."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._checks import check_base, check_width
from ..frequencies import frequency_table

__all__ = ["check_rotary_dim", "rope_frequencies", "unscaled_frequencies"]


def check_rotary_dim(head_dim: Any, rotary_dim: Any) -> int:
    """The rotary width: ``rotary_dim`` (default ``head_dim``), even, in ``[2, head_dim]``.

    Example:
        >>> check_rotary_dim(64, 32), check_rotary_dim(64, None)
        (32, 64)
    """
    head_dim = check_width(head_dim, "head_dim")
    if rotary_dim is None:
        rotary_dim = head_dim
        what = f"head_dim (the default rotary_dim), got {head_dim}"
    else:
        rotary_dim = check_width(rotary_dim, "rotary_dim", minimum=2)
        what = f"rotary_dim, got {rotary_dim}"
        if rotary_dim > head_dim:
            raise ValueError(
                f"rotary_dim must be at most head_dim={head_dim} (only the first rotary_dim "
                f"features rotate), got {rotary_dim}"
            )
    if rotary_dim < 2 or rotary_dim % 2:
        if what.startswith("rotary_dim"):
            what += f"; rotary_dim must be even ({rotary_dim} is odd)"
        raise ValueError(
            f"RoPE rotates pairs of features, so the rotary width must be an even int >= 2: "
            f"{what}; pass an even rotary_dim to rotate only the first features"
        )
    return int(rotary_dim)


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
    return unscaled_frequencies(check_rotary_dim(head_dim, rotary_dim), check_base(base))


def unscaled_frequencies(d: int, base: float) -> np.ndarray:
    """:func:`rope_frequencies` of a validated even width ``d`` and base: what a scaling
    method's ``_inv_freq`` starts from (its width and base checked once, by
    :meth:`~posenc.core.rope.RopeScaling.frequencies` or the spec).

    Example:
        >>> unscaled_frequencies(4, 100.0).tolist()
        [1.0, 0.1]
    """
    omega: np.ndarray = frequency_table(d, base, "paper")[0].copy()
    return omega
