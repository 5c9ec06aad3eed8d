"""The frequencies of every length, for code that learns the length only as it runs.

A RoPE scaling whose frequencies change with every length (dynamic NTK) cannot be asked
for them inside a compiled or exported graph: the core is NumPy. :func:`length_turns`
computes them beforehand for each length ``L = 1 .. rows`` (the planner's choice for a
call of that length, :func:`posenc.core.plan.plan_scaling`), as the angle per position in
turns split for exact reduction in plain float64 (:func:`posenc.core.precision.split_turns`)
with the attention factor; a graph then picks the row of its traced length.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._checks import check_int
from ..plan import plan_scaling
from ..precision import split_turns

__all__ = ["length_turns"]


def length_turns(
    scaling: Any, rotary_dim: int, base: float, rows: int, *, first: int = 1
) -> np.ndarray:
    """``(rows - first + 1, 3m + 1)`` float64 for the ``m = rotary_dim // 2`` frequencies:
    the row of length ``L`` (``first <= L <= rows``) holds ``t1 | t2 | t3 | factor``, the
    turns per position of the frequencies a call of length ``L`` uses and their
    attention factor.

    Lengths up to the original one share the construction frequencies; each longer one
    costs one :meth:`~posenc.RopeScaling.frequencies` call (about 1 ms for dynamic NTK,
    whose frequencies are correctly rounded at 50 digits).

    Example:
        >>> from posenc.core.rope import DynamicNTKScaling
        >>> table = length_turns(DynamicNTKScaling(factor=2.0,
        ...     original_max_position_embeddings=2), 4, 100.0, 3)
        >>> (table[0] == table[1]).all(), bool(table[2, 1] < table[1, 1])  # slower past L₀
        (np.True_, True)
    """
    rows = check_int(rows, "rows", minimum=1)
    first = check_int(first, "first", minimum=1, maximum=rows)
    m = rotary_dim // 2

    def row(seq_len: int | None) -> np.ndarray:
        inv_freq, factor = scaling.frequencies(rotary_dim, base, seq_len=seq_len)
        return np.concatenate([*split_turns(inv_freq), [factor]])

    table = np.empty((rows - first + 1, 3 * m + 1))
    original = min(max(scaling.original_length or 0, first - 1), rows)
    table[: original - first + 1] = row(None)  # up to the original length: construction
    for length in range(original + 1, rows + 1):
        table[length - first] = row(plan_scaling(scaling, length).seq_len)
    return table
