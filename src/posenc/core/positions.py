"""What a front end does with positions past its table: the one out-of-range policy.

Modules and layers keep a table of rows ``0 .. rows-1`` (sinusoidal, RoPE, xPos, ALiBi
distances) and gather from it. Every front end answers positions outside the table the
same way:

**Positions known when the call runs** (eager calls; Python-int offsets while tracing)
get the exact rows, at any position:

* inside the table: gathered from it;
* past it, for a call whose rows end within twice the table's length plus the call's
  length, its positions per sequence (a contiguous call that starts within twice the table: a longer
  prompt, decoding one token after another): the table grows to hold them, at least
  doubling so that decoding one token at a time grows it rarely (:func:`grown_length`;
  a doubled table the memory limit refuses falls back to the length needed); the rule
  is :func:`posenc.core.plan.plan_rows`'s;
* for a call that starts farther (decoding at position 10**7 with a table of 2048
  rows), explicit positions far apart (``[0, 3_000_000]`` reads two rows, and growing
  to three million would cost every module of the spec 366 MiB at head_dim 16), or when
  the memory limit refuses even the length needed: only the rows of the call are
  computed by the core, and the table stays as it was.

A learned embedding has no rows past its table: there a ``ValueError`` says so.

**Positions known only inside a trace** (tensors under ``torch.compile``, ``jax.jit``,
``tf.function``) cannot grow a table. A position outside ``0 .. rows-1`` gives a row of
NaN (never a wrapped, clamped or zero row), in every front end; where the framework
knows the positions while tracing but cannot call NumPy (a Python-int offset under
``torch.compile``), a ``ValueError`` says to extend the table before compiling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .._checks import MemoryLimitError

__all__ = ["MemoryLimitError", "grow", "grown_length"]

T = TypeVar("T")


def grown_length(end: int, rows: int) -> int:
    """The length to grow a ``rows``-row table to for positions up to ``end - 1``.

    ``rows`` when the table holds them already, else ``max(end, 2·rows)``: doubling, so
    that a sequence growing one position at a time rebuilds its table rarely.

    Example:
        >>> grown_length(100, 128), grown_length(130, 128), grown_length(1000, 128)
        (128, 256, 1000)
    """
    return rows if end <= rows else max(end, 2 * rows)


def grow(build: Callable[[int], T], end: int, rows: int) -> T | None:
    """``build(length)`` for the length :func:`grown_length` chooses, or ``None``.

    Called for ``end > rows``, where the planner (:func:`posenc.core.plan.plan_rows`) says
    to grow. ``build`` raises :class:`MemoryLimitError` when a length is refused: a
    refused doubling is retried at ``end``, the length the call needs, and a refused
    ``end`` gives ``None``: compute the call's rows directly and keep the table as it is.
    Any other error of ``build`` propagates.

    Example:
        >>> def build(length):  # a builder whose limit is 150 rows
        ...     if length > 150:
        ...         raise MemoryLimitError(f"{length} rows")
        ...     return length
        >>> grow(build, 130, 100), grow(build, 140, 100), grow(build, 160, 100)
        (130, 140, None)
    """
    target = grown_length(end, rows)
    for length in dict.fromkeys((target, end)):  # the doubled length, then the one needed
        try:
            return build(length)
        except MemoryLimitError:
            continue
    return None
