"""xPos (RoPE with a relative decay) and axial / multimodal (N-D) RoPE.

Both build on :mod:`posenc.core.rope`: the angles come from :func:`rope_table_values`
(exact angle reduction in float64, rounded once) and the rotation from :func:`apply_rope`.

**xPos** (Sun et al., 2023) multiplies the rotated queries by ``ζ_i^(n/B)`` and the keys by
``ζ_i^(-m/B)``, per feature pair ``i = 0 .. d/2 - 1``, with ``ζ_i = (2i/d + γ)/(1 + γ)``
(``γ = 0.4``, ``B = scale_base = 512``), so the score of query ``n`` and key ``m`` gets the
relative factor ``ζ_i^((n-m)/B)``: a decay with distance for ``n > m`` (each ``ζ_i < 1``).
Conventions of the reference code (microsoft/torchscale
``torchscale/component/xpos_relative_position.py``): the feature pairs are interleaved
(``rotate_every_two``, and ``duplicate_interleave`` repeats each pair's scale and angle
twice); the RoPE angles are ``position · 10000^(-2i/d)`` at the absolute positions
``offset .. offset+L-1``; only the *scale exponent* is centred, at
``c = ceil((L + offset) / 2)`` (``min_pos = -(length + offset) // 2``), which keeps the
scales near 1 and cancels in every score. lucidrains' ``rotary-embedding-torch``
(``use_xpos=True``) centres at ``L // 2`` instead. :func:`apply_xpos` reproduces either
with ``centre="torchscale"`` / ``"lucidrains"``.

**Axial RoPE** splits the ``d/2`` frequency pairs into one contiguous section per
coordinate axis; the pairs of section ``a`` rotate by coordinate ``a``. Two ways to choose
the frequencies are offered by :func:`axial_rope_tables`:

``mode="axial"``
    Each axis gets its own full ladder over its section: ``s_a`` pairs with
    ``θ_j = base^(-j/s_a)`` (= ``rope_frequencies(2·s_a, base)``). This is the RoPE-Axial
    of Heo et al. (2024), ``naver-ai/rope-vit`` ``compute_axial_cis`` (also SAM 2):
    ``dim/4`` pairs per axis with ``theta^(-4j/dim)``, x (column) pairs first, then y.
``mode="mrope"``
    One ladder ``base^(-2j/d)`` over all pairs, cut into contiguous sections: Qwen2-VL's
    multimodal RoPE (``mrope_section = [16, 24, 24]`` for temporal, height, width with
    ``d = 128``; Hugging Face ``Qwen2VLRotaryEmbedding.recomposition_frequencies``).
    The round-robin ("interleaved M-RoPE") assignment of Qwen3-VL is not offered.

The tables have the usual RoPE shape ``(..., rotary_dim)`` in ``layout`` ``"half"`` or
``"interleaved"``, so :func:`apply_rope` applies them and every identity of 1-D RoPE
holds per axis: scores depend only on coordinate differences.

References:
    Sun et al., "A Length-Extrapolatable Transformer", 2023 (xPos);
    microsoft/torchscale ``torchscale/component/xpos_relative_position.py``;
    lucidrains/rotary-embedding-torch ``rotary_embedding_torch.py`` (``use_xpos``);
    Heo et al., "Rotary Position Embedding for Vision Transformer", 2024
    (``naver-ai/rope-vit``);
    Wang et al., "Qwen2-VL", 2024; Hugging Face ``modeling_qwen2_vl.py``.
"""

from __future__ import annotations

import decimal
import math
import numbers
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from .._checks import (
    DEFAULT_MAX_BYTES,
    check_choice,
    check_int,
    check_memory,
    check_positions,
    check_real,
)
from .precision import resolve_dtype, round_to_format, two_prod
from .rope import (
    ROPE_LAYOUTS,
    RopeLayout,
    apply_rope,
    check_inv_freq,
    rope_frequencies,
    rope_table_values,
)

__all__ = [
    "AXIAL_MODES",
    "XPOS_CENTRES",
    "apply_xpos",
    "axial_rope_tables",
    "grid_coordinates",
    "xpos_centre",
    "xpos_scales",
]

XposConvention = Literal["torchscale", "lucidrains"]
AxialMode = Literal["axial", "mrope"]
XPOS_CENTRES: tuple[XposConvention, ...] = ("torchscale", "lucidrains")
AXIAL_MODES: tuple[AxialMode, ...] = ("axial", "mrope")
XposCentre = float | XposConvention


# ---------------------------------------------------------------------------------------
# xPos


def _check_head_dim(head_dim: Any) -> int:
    d = check_int(head_dim, "head_dim", minimum=2)
    if d % 2:
        raise ValueError(f"xPos scales pairs of features, so head_dim must be even, got {d}")
    return d


def _as_positions(positions: Any, name: str) -> np.ndarray:
    """An int ``L`` → ``0 .. L-1``; else an array of finite real positions, as float64."""
    if isinstance(positions, numbers.Integral) and not isinstance(positions, (bool, np.bool_)):
        return np.arange(check_int(positions, f"{name} (a length)", minimum=0), dtype=np.float64)
    return check_positions(positions, name).astype(np.float64)


def xpos_centre(positions: Any, convention: Literal["torchscale", "lucidrains"]) -> float:
    """The number a reference implementation subtracts from positions in the xPos exponent.

    With ``T = max(positions) + 1`` (the length so far, ``length + offset`` in torchscale):
    ``"torchscale"`` gives ``ceil(T / 2)`` (``min_pos = -(length + offset) // 2`` in
    ``XPOS.forward``), ``"lucidrains"`` gives ``floor(T / 2)`` (``t - len(t) // 2`` in
    ``get_scale``). Any common centre cancels in the scores; it only keeps the scales near 1.

    Args:
        positions: An int length or an array of positions (not empty).
        convention: ``"torchscale"`` or ``"lucidrains"``.

    Returns:
        The centre, a float.

    Example:
        >>> xpos_centre(5, "torchscale"), xpos_centre(5, "lucidrains")
        (3.0, 2.0)
    """
    convention = check_choice(convention, "convention", XPOS_CENTRES)
    p = _as_positions(positions, "positions")
    if p.size == 0:
        raise ValueError("positions must not be empty to derive an xPos centre")
    total = float(p.max()) + 1.0
    return float(math.ceil(total / 2) if convention == "torchscale" else math.floor(total / 2))


@lru_cache(maxsize=64)
def _log_zeta_dd(head_dim: int, gamma: float, scale_base: float) -> tuple[np.ndarray, np.ndarray]:
    """``log(ζ_i) / B`` as a double-double ``(hi, lo)``, ``(d/2,)``, at 50 digits.

    ``ζ_i = (2i + γd) / ((1 + γ)d)`` with the float64 ``γ`` and ``B`` taken as exact.
    """
    ctx = decimal.Context(prec=50)
    g, b = decimal.Decimal(gamma), decimal.Decimal(scale_base)
    denominator = ctx.multiply(ctx.add(1, g), head_dim)
    hi = np.empty(head_dim // 2)
    lo = np.empty(head_dim // 2)
    for i in range(head_dim // 2):
        zeta = ctx.divide(ctx.add(2 * i, ctx.multiply(g, head_dim)), denominator)
        w = ctx.divide(zeta.ln(ctx), b)
        hi[i] = float(w)
        lo[i] = float(ctx.subtract(w, decimal.Decimal(hi[i])))
    hi.flags.writeable = False
    lo.flags.writeable = False
    return hi, lo


def _xpos_scale_values(
    positions: np.ndarray, head_dim: int, gamma: float, scale_base: float, centre: float
) -> np.ndarray:
    """float64 ``ζ_i^((p - c)/B)``, ``(*positions.shape, d/2)``, within ~2 ulp, not rounded.

    The exponent ``(p - c) · log(ζ_i)/B`` is formed exactly (Dekker's product with the
    double-double ``log(ζ_i)/B``), so the only errors are those of ``exp`` and one
    correction: large exponents do not amplify a rounded argument.
    """
    hi, lo = _log_zeta_dd(head_dim, gamma, scale_base)
    x = positions[..., None] - centre
    p, e = two_prod(x, hi)
    tail = x * lo + e
    with np.errstate(over="ignore"):
        value = np.exp(p)
    if not np.all(np.isfinite(value)):
        _too_far(x)
    scales: np.ndarray = value + value * tail
    return scales


def _too_far(distance: np.ndarray, fmt: str = "float64") -> None:
    raise ValueError(
        f"xPos scales overflow {fmt} at a distance |p - centre| = {np.abs(distance).max():g} "
        "from the centre; centre the positions (centre= near their middle, or "
        "xpos_centre(...)) or use a wider dtype"
    )


def _check_xpos_params(gamma: Any, scale_base: Any) -> tuple[float, float]:
    gamma = check_real(gamma, "gamma", minimum=0.0, strict=True)
    scale_base = check_real(scale_base, "scale_base", minimum=0.0, strict=True)
    return gamma, scale_base


def _lay_out(values: np.ndarray, layout: str) -> np.ndarray:
    """``(..., m)`` per-pair values → ``(..., 2m)`` in ``layout``."""
    if layout == "half":
        return np.concatenate([values, values], axis=-1)
    return np.repeat(values, 2, axis=-1)


def xpos_scales(
    positions: Any,
    head_dim: int,
    *,
    gamma: float = 0.4,
    scale_base: float = 512.0,
    centre: float = 0.0,
    role: Literal["query", "key"] = "query",
    layout: RopeLayout = "interleaved",
    dtype: Any = "float32",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """The xPos scale of every position and feature, correctly rounded in ``dtype``.

    ``scale[..., j] = ζ_i^(±(p - centre)/scale_base)`` with ``ζ_i = (2i/d + γ)/(1 + γ)``,
    ``i`` the pair of column ``j`` in ``layout``, ``+`` for queries and ``-`` for keys.
    Computed as ``exp(±(p - c) · log(ζ_i)/B)`` in float64 with the exponent formed exactly
    (``log(ζ_i)/B`` held as a double-double; ``γ`` and ``B`` taken as the exact float64
    numbers they are), within ~2 ulp of float64 at any position, then rounded once; a key
    scale is the rounded reciprocal, not the reciprocal of a rounded query scale.

    Recipe: with ``cos, sin = rope_tables(positions, rope_frequencies(d), layout=...)``
    the xPos query is ``apply_rope(q, cos·s_q, sin·s_q)`` and the key
    ``apply_rope(k, cos·s_k, sin·s_k)``; :func:`apply_xpos` does exactly that in float64.

    Args:
        positions: An int ``L`` (positions ``0 .. L-1``) or an array of positions.
        head_dim: The xPos width ``d`` (even; torchscale scales the whole head).
        gamma: ``γ`` in ``ζ_i`` (> 0; 0.4 in the paper and both reference codes).
        scale_base: ``B`` (> 0; 512).
        centre: Subtracted from every position in the exponent (see :func:`xpos_centre`);
            use the same centre for the queries and keys of one attention.
        role: ``"query"`` (``ζ^(+(p-c)/B)``) or ``"key"`` (``ζ^(-(p-c)/B)``).
        layout: ``"interleaved"`` (torchscale, lucidrains) or ``"half"``.
        dtype: float16, bfloat16, float32 or float64. Scales far from the centre overflow
            (a ValueError) or underflow a narrow format (``ζ_0^(1/512) ≈ 0.99755``: a
            factor 10 every ~940 positions); centre them.
        max_bytes: Refuse outputs larger than this (``None``: no limit).

    Returns:
        Array of shape ``(*positions.shape, head_dim)``.

    Example:
        >>> s = xpos_scales([0, 512], 4, dtype="float64")
        >>> s.round(6).tolist()  # ζ = (0.4/1.4, 0.9/1.4), each twice, at p = 0 and p = B
        [[1.0, 1.0, 1.0, 1.0], [0.285714, 0.285714, 0.642857, 0.642857]]
        >>> bool(np.allclose(s * xpos_scales([0, 512], 4, role="key", dtype="float64"), 1))
        True
    """
    d = _check_head_dim(head_dim)
    gamma, scale_base = _check_xpos_params(gamma, scale_base)
    centre = check_real(centre, "centre")
    role = check_choice(role, "role", ("query", "key"))
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    fmt, np_dtype = resolve_dtype(dtype)
    p = _as_positions(positions, "positions")
    check_memory(p.size * d * 16, "these xPos scales", max_bytes)
    sign = 1.0 if role == "query" else -1.0
    values = _xpos_scale_values(p, d, gamma, sign * scale_base, centre)
    with np.errstate(over="ignore"):
        rounded = round_to_format(values, fmt)
    if not np.all(np.isfinite(rounded)):
        _too_far(p - centre, fmt)
    return _lay_out(rounded, layout).astype(np_dtype)


def apply_xpos(
    q: Any,
    k: Any,
    *,
    q_positions: Any = None,
    k_positions: Any = None,
    base: float = 10000.0,
    inv_freq: Any = None,
    gamma: float = 0.4,
    scale_base: float = 512.0,
    centre: XposCentre = "torchscale",
    layout: RopeLayout = "interleaved",
) -> tuple[np.ndarray, np.ndarray]:
    """Rotate and scale queries and keys with xPos; each result is rounded once.

    ``q'_n = ζ^((n-c)/B) ⊙ R(n) q_n`` and ``k'_m = ζ^(-(m-c)/B) ⊙ R(m) k_m``, so
    ``q'_n · k'_m = Σ_i ζ_i^((n-m)/B) · (RoPE score of pair i)``: relative, and decaying
    with ``n - m > 0``. The tables (:func:`rope_table_values`) and scales are float64;
    their product multiplies ``q``/``k`` inside :func:`apply_rope`.

    Args:
        q: Queries ``(..., Lq, d)``, a float dtype; ``d`` even (the whole head rotates,
            as in torchscale).
        k: Keys ``(..., Lk, d)``, same ``d``.
        q_positions: Positions of the queries, shape ``(Lq,)`` or anything broadcasting
            to ``q.shape[:-1]`` without enlarging it. Default ``Lk-Lq .. Lk-1``: the
            queries are the last ``Lq`` tokens (torchscale's ``offset = src_len - 1`` for
            one decoded token; the full sequence when ``Lq == Lk``).
        k_positions: Positions of the keys; default ``0 .. Lk-1``.
        base: RoPE base for the default ``inv_freq = rope_frequencies(d, base)``
            (torchscale: 10000).
        inv_freq: The ``d/2`` RoPE frequencies, overriding ``base``.
        gamma, scale_base: As in :func:`xpos_scales`.
        centre: A number subtracted from all positions in the scale exponent, or
            ``"torchscale"`` / ``"lucidrains"``: :func:`xpos_centre` of the query and key
            positions together (so the same centre serves both and cancels exactly).
            Mathematically the scores do not depend on it; numerically it keeps the
            scales near 1.
        layout: ``"interleaved"`` (torchscale) or ``"half"``.

    Returns:
        ``(q_xpos, k_xpos)`` with the shapes and dtypes of ``q`` and ``k``.

    Example:
        >>> q = np.ones((3, 4)); k = np.ones((3, 4))
        >>> qx, kx = apply_xpos(q, k, inv_freq=[0.0, 0.0])  # no rotation: only the decay
        >>> (qx @ kx.T).round(4)  # query n, key m: Σ_i 2 ζ_i^((n-m)/512), < 4 for n > m
        array([[4.    , 4.0066, 4.0133],
               [3.9934, 4.    , 4.0066],
               [3.9868, 3.9934, 4.    ]])
    """
    layout = check_choice(layout, "layout", ROPE_LAYOUTS)
    gamma, scale_base = _check_xpos_params(gamma, scale_base)
    q, k = np.asarray(q), np.asarray(k)
    if q.ndim < 2 or k.ndim < 2:
        raise ValueError(f"q and k need shape (..., seq, head_dim), got {q.shape} and {k.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share head_dim, got {q.shape[-1]} and {k.shape[-1]}")
    d = _check_head_dim(q.shape[-1])
    lq, lk = q.shape[-2], k.shape[-2]
    if inv_freq is None:
        inv_freq = rope_frequencies(d, base)
    inv_freq = check_inv_freq(inv_freq)
    if 2 * inv_freq.size != d:
        raise ValueError(
            f"inv_freq must hold head_dim // 2 = {d // 2} frequencies, got {inv_freq.size}"
        )
    if q_positions is None:
        if lq > lk:
            raise ValueError(
                f"with more queries ({lq}) than keys ({lk}) pass q_positions explicitly"
            )
        q_positions = np.arange(lk - lq, lk)
    if k_positions is None:
        k_positions = np.arange(lk)
    qp = _as_positions(q_positions, "q_positions")
    kp = _as_positions(k_positions, "k_positions")
    if isinstance(centre, str):
        both = np.concatenate([qp.ravel(), kp.ravel()])
        centre = xpos_centre(both, check_choice(centre, "centre", XPOS_CENTRES))
    centre = check_real(centre, "centre")

    def one(x: np.ndarray, p: np.ndarray, sign: float) -> np.ndarray:
        cos, sin = rope_table_values(p, inv_freq, fmt="float64", layout=layout)
        s = _lay_out(_xpos_scale_values(p, d, gamma, sign * scale_base, centre), layout)
        return apply_rope(x, cos * s, sin * s, layout=layout)

    return one(q, qp, 1.0), one(k, kp, -1.0)


# ---------------------------------------------------------------------------------------
# Axial / multimodal RoPE


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
                f"{n_axes} axes; pass sections= (pairs per axis) or another rotary_dim"
            )
        sections = [pairs // n_axes] * n_axes
    sections = _check_sections(sections, pairs, n_axes)
    if mode == "mrope":
        return np.split(full, np.cumsum(sections)[:-1])
    return [rope_frequencies(2 * s, base) for s in sections]


def _mrope_ladders(inv_freq: Any, sections: Sequence[int] | None, n_axes: int) -> list[np.ndarray]:
    """:func:`axial_rope_tables`' frequencies of each axis: one given ladder, cut."""
    full = check_inv_freq(inv_freq)
    if sections is None:
        if full.size % n_axes:
            raise ValueError(
                f"cannot split {full.size} frequencies equally over {n_axes} axes; pass sections="
            )
        sections = [full.size // n_axes] * n_axes
    sections = _check_sections(sections, full.size, n_axes)
    return np.split(full, np.cumsum(sections)[:-1])


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
        raise TypeError(f"sections must be a sequence of ints (pairs per axis), got {sections!r}")
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
    mode: Literal["axial", "mrope"] = "axial",
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
    else:
        ladders = _axial_ladders(inv_freq, sections, n_axes)
    pairs = sum(f.size for f in ladders)
    lead = coords.shape[:-1]
    check_memory(2 * math.prod(lead) * 2 * pairs * 8 * 2, "these axial RoPE tables", max_bytes)
    cos_parts, sin_parts = [], []
    for a, f in enumerate(ladders):
        # "half" layout: the first len(f) columns are the values of this axis's pairs.
        c, s = rope_table_values(
            coords[..., a], f, fmt=fmt, layout="half", scale=scale, max_bytes=None
        )
        cos_parts.append(c[..., : f.size])
        sin_parts.append(s[..., : f.size])
    cos = _lay_out(np.concatenate(cos_parts, axis=-1), layout)
    sin = _lay_out(np.concatenate(sin_parts, axis=-1), layout)
    return cos.astype(np_dtype, copy=False), sin.astype(np_dtype, copy=False)
