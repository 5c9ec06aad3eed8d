"""The starting frequencies of RoPE whose frequencies are trained (learned RoPE).

Learned RoPE starts from the frequencies of a fixed RoPE (any scaling whose frequencies
do not follow the sequence length) and trains them. Every front end's module takes its
parameter's initial values and the tables' attention factor from here, and refuses the
same options with the same words. The rotation by trained frequencies is RoPE's own:
:func:`~posenc.core.rope.rope_tables` takes any ``inv_freq`` (its float64 reference).
"""

from __future__ import annotations

import numpy as np

from .scaling import RopeScaling

__all__ = ["learned_rope_frequencies"]


def learned_rope_frequencies(
    scaling: RopeScaling, rotary_dim: int, base: float, *, owner: str
) -> tuple[np.ndarray, float]:
    """``(inv_freq, attention_factor)`` a learned RoPE starts from: the scaling's
    frequencies (float64) as the float32 its parameter holds, and the factor on its
    tables.

    Args:
        scaling: A parsed scaling (:func:`~posenc.core.rope.rope_options`).
        rotary_dim: The rotated width (checked by the caller's spec).
        base: The RoPE base.
        owner: The module's name, for the errors.

    Returns:
        ``inv_freq`` float32 of shape ``(rotary_dim // 2,)`` and ``attention_factor``.

    Raises:
        ValueError: For a scaling whose frequencies follow the sequence length (there are
            none to train), or frequencies past float32's range.

    Example:
        >>> from posenc.core.rope import DefaultScaling
        >>> inv_freq, factor = learned_rope_frequencies(DefaultScaling(), 4, 100.0, owner="m")
        >>> inv_freq.tolist(), inv_freq.dtype.name, factor
        ([1.0, 0.10000000149011612], 'float32', 1.0)
    """
    if scaling.length_dependent:
        raise ValueError(
            f"{owner}: scaling={scaling.name!r} recomputes the frequencies from each sequence "
            "length, so there are none to train; use a fixed scaling (default, linear, ntk, "
            "yarn, llama3, proportional)"
        )
    initial, factor = scaling.frequencies(rotary_dim, base)  # float64, from the core
    if initial.size and not float(np.abs(initial).max()) <= np.finfo(np.float32).max:
        raise ValueError(
            f"{owner}: base={base!r} gives frequencies up to {float(np.abs(initial).max()):.3g}, "
            "past float32 (the trained parameter's dtype); use a base > 1"
        )
    return initial.astype(np.float32), float(factor)
