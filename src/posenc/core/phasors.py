"""The phasor engine: ``e^{ikω}`` for runs of positions, exact and fast, and its thread pool.

Every table of sines and cosines in posenc (sinusoidal, RoPE, xPos, axial) is built from
unit phasors ``e^{ikω} = cos kω + i sin kω``:

* for a run of consecutive integer positions ``s .. s+L-1`` (the common case),
  :func:`phasors` writes each position as ``k = s + aB + b`` with a block size
  ``B ≈ √L`` and multiplies a coarse phasor ``e^{i(s+aB)ω}`` by a fine one ``e^{ibω}``;
  both are themselves runs, so only a few positions per level go through ``sin``/``cos``
  (with exact angle reduction, :mod:`posenc.core.precision`) and every other value costs
  one complex multiply. Each level adds about ``2**-52`` of error; a run of 10**6
  positions is two levels above the leaves;
* any other positions (fractional, negative, N-D, gaps) get the exact reduction per
  element, in chunks of :data:`CHUNK_ELEMENTS` (:func:`posenc.core.precision.unit_phasors`).

:func:`contiguous_range` decides which of the two a request is, and :func:`run_parallel`
spreads the work of a large table over a persistent thread pool (NumPy releases the GIL
inside its ufuncs).
"""

from __future__ import annotations

import math
import numbers
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .._checks import check_length, check_positions
from .precision import unit_phasors

__all__ = [
    "CHUNK_ELEMENTS",
    "MAX_TURNS",
    "check_turns",
    "contiguous_range",
    "leaf_phasors",
    "phasor_factors",
    "phasor_rows",
    "phasors",
    "run_parallel",
    "workers_for",
]

CHUNK_ELEMENTS = 1 << 18
"""(rows × frequencies) per chunk of float64 temporaries."""

MAX_TURNS = 2.0**51
"""The largest angle, in turns, a table may hold: ``|position| × ω / 2π`` up to it keeps
the angle reduction of :mod:`posenc.core.precision` within about ``2**-53`` turns (its
error grows as ``2**-104 × turns``). Frequencies up to 1 rad/position, which every base
>= 1 gives, stay below it at every position within ``±2**53``."""

_LEAF = 32  # runs this short are finished by leaf_phasors
_DIRECT = 8  # ... which calls sin/cos for this many positions and doubles the rest
_PARALLEL_ENTRIES = 1 << 18  # smaller tables gain nothing from a second thread


def contiguous_range(positions: Any) -> tuple[int, int] | None:
    """``(start, length)`` if ``positions`` is an int or a 1-D run of consecutive integers.

    An int ``L`` means ``0 .. L-1``. Anything else is checked as positions (finite reals,
    integers within ``±2**53``) and gives ``None`` unless it is such a run.

    Example:
        >>> contiguous_range(4), contiguous_range([7, 8, 9]), contiguous_range([0, 2])
        ((0, 4), (7, 3), None)
    """
    if isinstance(positions, numbers.Integral) and not isinstance(positions, (bool, np.bool_)):
        return 0, check_length(positions, "positions (a length)")
    if isinstance(positions, (float, np.floating)):
        raise TypeError(
            f"positions must be an int length or an array of positions, got the float "
            f"{positions!r}; pass an int for a length or [{positions!r}] for one position"
        )
    array = check_positions(positions)
    if array.ndim != 1 or array.size == 0:
        return None
    if array.dtype.kind == "f" and not np.array_equal(array, np.rint(array)):
        return None
    start = array[0]
    if array.size > 1 and not (np.diff(array) == 1).all():
        return None
    return int(start), int(array.size)


def largest_position(positions: Any, span: tuple[int, int] | None) -> float:
    """``max |p|`` of validated positions, or of the run ``span`` (``(start, length)``)."""
    if span is not None:
        return float(max(abs(span[0]), abs(span[0] + span[1] - 1))) if span[1] else 0.0
    array = np.asarray(positions)
    return float(np.max(np.abs(array.astype(np.float64)))) if array.size else 0.0


def check_turns(largest: float, turns_hi: np.ndarray, name: str) -> None:
    """Refuse a table whose angles pass :data:`MAX_TURNS` (``name``: what sets the
    frequencies, ``"base"`` or ``"inv_freq"``).

    Example:
        >>> check_turns(2.0**53, np.array([1 / (2 * np.pi)]), "base")  # ω = 1: fine
        >>> check_turns(2.0**53, np.array([10.0]), "inv_freq")
        Traceback (most recent call last):
        ...
        ValueError: inv_freq makes angles of 9.01e+16 turns at position 9.0072e+15 (frequency \
62.8 rad/position); angles are exact up to 2**51 turns: keep |position| × frequency / 2π \
below it (every frequency <= 1, as any base >= 1 gives, is fine at every position within ±2**53)
    """
    if not turns_hi.size or not largest:
        return
    fastest = float(np.max(np.abs(turns_hi)))
    if largest * fastest > MAX_TURNS:
        raise ValueError(
            f"{name} makes angles of {largest * fastest:.3g} turns at position {largest:.6g} "
            f"(frequency {2 * math.pi * fastest:.3g} rad/position); angles are exact up to "
            "2**51 turns: keep |position| × frequency / 2π below it (every frequency <= 1, as "
            "any base >= 1 gives, is fine at every position within ±2**53)"
        )


def leaf_phasors(start: float, n: int, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """``e^{i k ω}`` for ``k = start .. start+n-1`` (``n <= 32``), complex128 ``(n, m)``.

    ``hi + lo`` is ``ω / 2π`` as a double-double. One exact ``sin``/``cos`` evaluation
    covers positions ``start .. start+7`` and the steps ``e^{i8ω}``, ``e^{i16ω}``; the
    rest follows by doubling (at most two complex multiplies per value).
    """
    direct = min(n, _DIRECT)
    steps: list[float] = []
    while direct * 2 ** len(steps) < n:
        steps.append(float(direct * 2 ** len(steps)))
    positions = np.concatenate([start + np.arange(direct, dtype=np.float64), steps])
    sin, cos = unit_phasors(positions[:, None], hi, lo)
    z = np.empty((direct * 2 ** len(steps), hi.size), np.complex128)
    z.real[: positions.size], z.imag[: positions.size] = cos, sin
    step = z[direct : direct + len(steps)].copy()  # the exact e^{i·step·ω} rows
    size = direct
    for row in step:
        np.multiply(z[:size], row, out=z[size : 2 * size])
        size *= 2
    return z[:n]


def phasors(start: float, n: int, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """``e^{i k ω}`` for ``k = start .. start+n-1`` as complex128 ``(n, m)``, to ~1e-15.

    Recursive: ``k = start + aB + b`` with ``B ≈ √n`` a power of two; the fine phasors
    ``e^{ibω}`` and the coarse ones ``e^{iaBω}`` are themselves runs (the latter of the
    frequencies ``Bω``, whose double-double turns are ``B·hi + B·lo`` exactly), so only
    a few positions per level ever go through ``sin``/``cos``.

    Example:
        >>> from posenc.core.precision import turns_of
        >>> z = phasors(0.0, 3, *turns_of([1.0]))
        >>> np.angle(z[:, 0]).round(12).tolist()
        [0.0, 1.0, 2.0]
    """
    if n <= _LEAF:
        return leaf_phasors(start, n, hi, lo)
    fine, coarse, _ = phasor_factors(start, n, hi, lo)
    product: np.ndarray = (coarse[:, None, :] * fine[None, :, :]).reshape(-1, hi.size)
    return product[:n]


def phasor_factors(
    start: float, n: int, hi: np.ndarray, lo: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """The top level of :func:`phasors`: ``(fine, coarse, B)`` with
    ``e^{i(start + aB + b)ω} = coarse[a] · fine[b]`` for ``0 <= b < B``.

    ``fine`` is ``(B, m)``, ``coarse`` ``(ceil(n / B), m)``; ``B`` is a power of two
    (``n`` itself for a run of at most 32, with ``coarse`` a row of ones). A caller that
    multiplies the two a chunk at a time (:func:`phasor_rows`) gets the values of
    :func:`phasors` without holding the whole product.

    Example:
        >>> from posenc.core.precision import turns_of
        >>> fine, coarse, block = phasor_factors(5.0, 100, *turns_of([1.0, 0.5]))
        >>> fine.shape, coarse.shape, block
        ((16, 2), (7, 2), 16)
    """
    if n <= _LEAF:
        return leaf_phasors(start, n, hi, lo), np.ones((1, hi.size), np.complex128), max(n, 1)
    block = 1 << math.ceil(math.log2(math.sqrt(n)))
    n_blocks = -(-n // block)
    fine = phasors(0.0, block, hi, lo)  # (B, m)
    coarse = phasors(0.0, n_blocks, hi * block, lo * block)  # (A, m), e^{iaBω}
    if start:
        coarse *= leaf_phasors(start, 1, hi, lo)
    return fine, coarse, block


def phasor_rows(
    fine: np.ndarray, coarse: np.ndarray, block: int, first: int, rows: int, buffer: np.ndarray
) -> np.ndarray:
    """Rows ``first .. first+rows-1`` of the run of :func:`phasor_factors`, written into
    ``buffer`` (complex128, C-contiguous, at least ``(rows, m)``) and returned as a view
    of it.

    ``rows`` is a power of two and ``first`` a multiple of it, as a loop over
    ``range(0, n, rows)`` gives, so that a chunk lies inside one block or is made of
    whole blocks. Near the end of the run the view may be shorter than ``rows`` or
    reach past the run's last row (to the end of its block): slice what you need.
    """
    m = fine.shape[1]
    a, b0 = divmod(first, block)
    if b0 or rows < block:  # part of one block
        b1 = min(b0 + rows, block)
        z = buffer[: b1 - b0]
        np.multiply(fine[b0:b1], coarse[a], out=z)
        return z
    a1 = min(a + -(-rows // block), coarse.shape[0])
    z = buffer[: (a1 - a) * block]
    np.multiply(fine, coarse[a:a1, None], out=z.reshape(a1 - a, block, m))
    return z


# ---------------------------------------------------------------------------------------
# The thread pool

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _forget_pool_after_fork() -> None:
    """A forked child has none of the parent's threads, and maybe a lock held by one."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def run_parallel(task: Callable[[int], None], items: Sequence[int], workers: int) -> None:
    """``task(item)`` for every item on ``workers`` threads (the caller is one of them).

    NumPy releases the GIL inside ufuncs, so the threads run in parallel. The pool is
    made once per process (a forked child makes its own) and reused, so that tables
    of a few hundred microseconds gain from it too.
    """
    if workers <= 1 or len(items) <= 1:
        for item in items:
            task(item)
        return
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(_cpu_count(), thread_name_prefix="posenc")
        pool = _POOL
    # Interleave the items so each worker gets an even share, run share 0 here.
    shares = [items[i::workers] for i in range(workers)]
    futures = [pool.submit(_run_all, task, share) for share in shares[1:]]
    _run_all(task, shares[0])
    for future in futures:
        future.result()


def _run_all(task: Callable[[int], None], items: Sequence[int]) -> None:
    for item in items:
        task(item)


def workers_for(threads: int | None, entries: int, blocks: int) -> int:
    """How many threads fill a table: ``threads``, or all CPUs for a large table."""
    if threads is None:
        threads = _cpu_count() if entries >= _PARALLEL_ENTRIES else 1
    return max(1, min(threads, blocks))


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
