"""Axial and multimodal (N-D) RoPE: one section of frequency pairs per coordinate axis.

See :mod:`posenc.core.rope_nd` for the two ways of choosing the frequencies.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from ..._checks import (
    DEFAULT_MAX_BYTES,
    check_choice,
    check_int,
    check_memory,
    check_positions,
    describe,
)
from ..precision import CONTAINERS, resolve_dtype
from ..rope import (
    ROPE_LAYOUTS,
    RopeLayout,
    check_inv_freq,
    pair_layout,
    rope_frequencies,
    rope_table_values,
)

__all__ = [
    "AXIAL_MODES",
    "AxialMode",
    "axial_column_axes",
    "axial_rope_tables",
    "grid_coordinates",
]

AxialMode = Literal["axial", "mrope", "mrope-interleaved"]
AXIAL_MODES: tuple[AxialMode, ...] = ("axial", "mrope", "mrope-interleaved")


def _base_ladders(
    head_dim: int,
    base: float,
    rotary_dim: int | None,
    sections: Sequence[int] | None,
    mode: AxialMode,
    n_axes: int,
) -> list[np.ndarray]:
    """:func:`axial_rope_tables`' frequencies of each axis from ``head_dim`` and ``base``."""
    full = rope_frequencies(head_dim, base, rotary_dim=rotary_dim)
    pairs = full.size
    if sections is None:
        if pairs % n_axes:
            raise ValueError(
                f"cannot split rotary_dim // 2 = {pairs} frequency pairs equally over "
                f"n_axes={n_axes} axes; pass sections= (pairs per axis) or another rotary_dim"
            )
        sections = [pairs // n_axes] * n_axes
    sections = _check_sections(sections, pairs, n_axes)
    if mode == "mrope":
        return np.split(full, np.cumsum(sections)[:-1])
    if mode == "mrope-interleaved":
        return [full[index] for index in _interleaved_pairs(sections, pairs)]
    return [rope_frequencies(2 * s, base) for s in sections]


def _interleaved_pairs(sections: Sequence[int], pairs: int) -> list[np.ndarray]:
    """Each axis's pair indices in interleaved M-RoPE (Qwen3-VL ``apply_interleaved_mrope``):
    axis ``a >= 1`` takes pairs ``a, a+n, a+2n, ...`` (``sections[a]`` of them), axis 0
    all the others."""
    n = len(sections)
    owner = np.zeros(pairs, dtype=np.int64)
    for a in range(1, n):
        index = np.arange(a, a + n * sections[a], n)
        if index.size and index[-1] >= pairs:
            raise ValueError(
                f"sections {list(sections)}: axis {a} would take pair {int(index[-1])} of "
                f"{pairs} in interleaved M-RoPE (pairs {a}, {a + n}, ...)"
            )
        owner[index] = a
    return [np.flatnonzero(owner == a) for a in range(n)]


def _mrope_ladders(inv_freq: Any, sections: Sequence[int] | None, n_axes: int) -> list[np.ndarray]:
    """:func:`axial_rope_tables`' frequencies of each axis: one given ladder, cut."""
    full = check_inv_freq(inv_freq)
    if sections is None:
        if full.size % n_axes:
            raise ValueError(
                f"cannot split {full.size} frequencies equally over n_axes={n_axes} axes; pass "
                "sections="
            )
        sections = [full.size // n_axes] * n_axes
    sections = _check_sections(sections, full.size, n_axes)
    return np.split(full, np.cumsum(sections)[:-1])


def _pair_order(ladders: list[np.ndarray], sections: Any, mode: AxialMode) -> list[np.ndarray]:
    """Where each axis's pairs go: contiguous sections, or interleaved M-RoPE's places."""
    sizes = [f.size for f in ladders]
    if mode == "mrope-interleaved":
        return _interleaved_pairs(sizes if sections is None else list(sections), sum(sizes))
    starts = np.cumsum([0, *sizes])
    return [np.arange(starts[a], starts[a + 1]) for a in range(len(sizes))]


def axial_column_axes(
    sections: Sequence[int], mode: AxialMode = "axial", layout: RopeLayout = "half"
) -> np.ndarray:
    """The coordinate axis each column of :func:`axial_rope_tables`' tables turns by.

    A front end that gathers one table per axis (traced coordinates: rows ``0 ..
    max_length-1`` along each axis) takes column ``j`` from the table of axis
    ``axes[j]``.

    Args:
        sections: Pairs per axis (as validated by :func:`axial_rope_tables`).
        mode: ``"axial"``, ``"mrope"`` or ``"mrope-interleaved"``.
        layout: ``"half"`` or ``"interleaved"``.

    Returns:
        An int64 array ``(2 * sum(sections),)``.

    Example:
        >>> axial_column_axes([1, 2], "mrope", "half").tolist()
        [0, 1, 1, 0, 1, 1]
        >>> axial_column_axes([2, 1], "mrope-interleaved", "interleaved").tolist()
        [0, 0, 1, 1, 0, 0]
    """
    mode = check_choice(mode, "mode", AXIAL_MODES)
    n_axes = len(sections) if isinstance(sections, Sequence) else 0
    sections = _check_sections(sections, None, n_axes)
    pairs = sum(sections)
    ladders = [np.zeros(s) for s in sections]  # only their sizes matter to _pair_order
    owner = np.zeros(pairs, dtype=np.int64)
    for axis, index in enumerate(_pair_order(ladders, sections, mode)):
        owner[index] = axis
    return pair_layout(owner, check_choice(layout, "layout", ROPE_LAYOUTS))


def _axial_ladders(inv_freq: Any, sections: Sequence[int] | None, n_axes: int) -> list[np.ndarray]:
    """:func:`axial_rope_tables`' frequencies of each axis: given, one ladder per axis."""
    if isinstance(inv_freq, np.ndarray) and inv_freq.ndim == 1:
        raise TypeError(
            "mode='axial' takes inv_freq as a sequence of 1-D arrays, one per axis; "
            "for one ladder cut into sections use mode='mrope'"
        )
    if isinstance(inv_freq, (str, bytes)) or not isinstance(inv_freq, Sequence):
        raise TypeError(
            f"inv_freq must be a sequence of 1-D arrays, one per axis, got {inv_freq!r}"
        )
    ladders = [check_inv_freq(f) for f in inv_freq]
    if len(ladders) != n_axes:
        raise ValueError(
            f"inv_freq needs one ladder per coordinate axis ({n_axes}), got {len(ladders)}"
        )
    if sections is not None:
        _check_sections(sections, None, n_axes)
        if list(sections) != [f.size for f in ladders]:
            raise ValueError(
                f"sections {list(sections)} disagree with the ladder lengths "
                f"{[f.size for f in ladders]}"
            )
    return ladders


def grid_coordinates(shape: Sequence[int]) -> np.ndarray:
    """Integer coordinates of every cell of a grid, ``(*shape, len(shape))``, ``"ij"`` order.

    Example:
        >>> grid_coordinates((2, 3))[..., ::-1].reshape(-1, 2).tolist()  # (x, y) = (col, row)
        [[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1]]
    """
    if isinstance(shape, numbers.Integral) or not isinstance(shape, Sequence) or not shape:
        raise TypeError(f"shape must be a non-empty sequence of ints, got {shape!r}")
    sizes = [check_int(n, "shape entries", minimum=0) for n in shape]
    mesh = np.meshgrid(*[np.arange(n) for n in sizes], indexing="ij")
    return np.stack(mesh, axis=-1)


def _check_sections(sections: Any, pairs: int | None, n_axes: int) -> list[int]:
    if isinstance(sections, (str, bytes)) or not isinstance(sections, Sequence):
        raise TypeError(
            f"sections must be a sequence of ints (pairs per axis), got {describe(sections)}"
        )
    out = [check_int(s, "each section", minimum=1) for s in sections]
    if len(out) != n_axes:
        raise ValueError(
            f"sections needs one entry per coordinate axis ({n_axes}), got {len(out)}: {out}"
        )
    if pairs is not None and sum(out) != pairs:
        raise ValueError(
            f"sections must add up to the {pairs} frequency pairs (rotary_dim // 2), got "
            f"{out} (sum {sum(out)})"
        )
    return out


def axial_rope_tables(
    coords: Any,
    head_dim: int | None = None,
    base: float = 10000.0,
    *,
    inv_freq: Any = None,
    sections: Sequence[int] | None = None,
    mode: AxialMode = "axial",
    rotary_dim: int | None = None,
    layout: RopeLayout = "half",
    dtype: Any = "float32",
    scale: float = 1.0,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)`` tables of N-D RoPE: each axis rotates its own section of pairs.

    The ``rotary_dim // 2`` pairs are cut into contiguous sections, one per axis in the
    order of ``coords``' last axis; pair ``j`` of section ``a`` rotates by
    ``coords[..., a] · θ_j``. With one axis this is :func:`rope_tables`.

    Args:
        coords: Positions ``(..., n_axes)`` (integer or fractional, finite). For
            Qwen2-VL's ``position_ids`` of shape ``(3, batch, seq)`` pass
            ``np.moveaxis(position_ids, 0, -1)``; for an image grid see
            :func:`grid_coordinates`.
        head_dim: Features per head; with ``base`` it gives the frequencies unless
            ``inv_freq`` is passed.
        base: The RoPE base (10000; 100 in Heo et al.'s ViT experiments).
        inv_freq: Explicit frequencies instead of ``head_dim``/``base``. ``mode="axial"``:
            a sequence of 1-D arrays, one ladder per axis (sections are their lengths).
            ``mode="mrope"``: one 1-D array over all pairs.
        sections: Pairs per axis, adding up to ``rotary_dim // 2``. Default: an equal
            split (an error if it does not divide).
        mode: ``"axial"``: axis ``a`` uses ``base^(-j/s_a)``, ``j < s_a``, i.e.
            :func:`rope_frequencies` ``(2·s_a, base)`` (RoPE-Axial, rope-vit, SAM 2).
            ``"mrope"``: pairs keep their place on one ladder ``base^(-2j/rotary_dim)``
            (Qwen2-VL M-RoPE; ``sections=[16, 24, 24]`` with ``head_dim=128``).
            ``"mrope-interleaved"``: the same ladder, axis ``a >= 1`` rotating pairs
            ``a, a+n, a+2n, ...`` (``sections[a]`` of them) and axis 0 the others
            (Qwen3-VL; ``sections=[24, 20, 20]``).
        rotary_dim: Rotated width (even, <= head_dim); default ``head_dim``.
        layout: ``"half"`` (Hugging Face) or ``"interleaved"`` (rope-vit's complex
            multiplication), for :func:`apply_rope` with the same layout.
        dtype: float16, bfloat16, float32 or float64.
        scale: Multiplies both tables before rounding (as in :func:`rope_tables`).
        max_bytes: Refuse tables larger than this (``None``: no limit).

    Returns:
        ``(cos, sin)``, each ``(*coords.shape[:-1], rotary_dim)``; each value correctly
        rounded from the exact angle of its own axis.

    Example:
        >>> cos, sin = axial_rope_tables([[0, 0], [1, 2]], 8, 100.0, dtype="float64")
        >>> np.arccos(cos[1, :4]).round(6).tolist()  # x: 1·[1, 0.1]; y: 2·[1, 0.1]
        [1.0, 0.1, 2.0, 0.2]
        >>> cos, _ = axial_rope_tables([[1, 2]], 8, mode="mrope", dtype="float64")
        >>> np.arccos(cos[0, :4]).round(6).tolist()  # one ladder [1, .1, .01, .001]
        [1.0, 0.1, 0.02, 0.002]
    """
    mode = check_choice(mode, "mode", AXIAL_MODES)
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    fmt, np_dtype = resolve_dtype(dtype)
    coords = check_positions(coords, "coords")
    if coords.ndim < 1 or coords.shape[-1] < 1:
        raise ValueError(
            f"coords must have shape (..., n_axes) with n_axes >= 1, got {coords.shape}"
        )
    n_axes = coords.shape[-1]

    ladders: list[np.ndarray]
    if inv_freq is None:
        if head_dim is None:
            raise TypeError("axial_rope_tables needs head_dim (and base) or inv_freq")
        ladders = _base_ladders(head_dim, base, rotary_dim, sections, mode, n_axes)
    elif mode == "mrope":
        ladders = _mrope_ladders(inv_freq, sections, n_axes)
    elif mode == "mrope-interleaved":
        full = check_inv_freq(inv_freq)
        sections = _check_sections(sections, full.size, n_axes) if sections else None
        if sections is None:
            raise TypeError("mode='mrope-interleaved' needs sections (pairs per axis)")
        ladders = [full[index] for index in _interleaved_pairs(sections, full.size)]
    else:
        ladders = _axial_ladders(inv_freq, sections, n_axes)
    pairs = sum(f.size for f in ladders)
    lead = coords.shape[:-1]
    check_memory(2 * math.prod(lead) * 2 * pairs * 8 * 2, "these axial RoPE tables", max_bytes)
    order = _pair_order(ladders, sections, mode)
    cos_half = np.empty((*lead, pairs), dtype=CONTAINERS[fmt])
    sin_half = np.empty_like(cos_half)
    for a, f in enumerate(ladders):
        # "half" layout: the first len(f) columns are the values of this axis's pairs.
        c, s = rope_table_values(
            coords[..., a], f, fmt=fmt, layout="half", scale=scale, max_bytes=None
        )
        cos_half[..., order[a]] = c[..., : f.size]
        sin_half[..., order[a]] = s[..., : f.size]
    cos = pair_layout(cos_half, layout)
    sin = pair_layout(sin_half, layout)
    return cos.astype(np_dtype, copy=False), sin.astype(np_dtype, copy=False)
