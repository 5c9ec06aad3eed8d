"""The RoPE rotation of queries and keys, and the permutation between the two layouts.

``"half"``: ``x·cos + rotate_half(x)·sin`` with ``rotate_half(x) = [-x₂, x₁]`` (Hugging
Face ``apply_rotary_pos_emb``, GPT-NeoX). ``"interleaved"``: each pair ``(x₀, x₁)``
becomes ``(x₀ cos - x₁ sin, x₀ sin + x₁ cos)`` (Meta's complex multiplication, GPT-J).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._checks import check_choice, check_int, describe
from ..precision import FORMATS, round_to_format
from .frequencies import check_rotary_dim
from .tables import ROPE_LAYOUTS, RopeLayout

__all__ = ["QK_AXES", "apply_rope", "check_qk_shapes", "check_rope_shapes", "rope_permutation"]

#: What each axis of a 4-D query or key tensor is, in each ``qk_layout`` of the modules
#: that take queries and keys together (every front end reads it from here).
QK_AXES: dict[str, tuple[str, str, str, str]] = {
    "bhsd": ("batch", "heads", "seq", "head_dim"),  # Hugging Face, scaled_dot_product_attention
    "bshd": ("batch", "seq", "heads", "head_dim"),  # Meta's Llama, flash-attn
}


def check_qk_shapes(
    q_shape: tuple[Any, ...],
    k_shape: tuple[Any, ...],
    head_dim: int,
    qk_layout: str,
    name: str,
    labels: tuple[str, str] = ("q", "k"),
) -> tuple[Any, Any]:
    """``(batch, seq)`` of 4-D queries and keys of ``head_dim`` features read in
    ``qk_layout`` (:data:`QK_AXES`), with the same batch and seq sizes (head counts may
    differ); a ValueError naming the shapes. Sizes unknown while a graph is built
    (``None``) are not compared. Shared by the front ends that take queries and keys
    together.

    Example:
        >>> check_qk_shapes((2, 8, 5, 64), (2, 2, 5, 64), 64, "bhsd", "rope")
        (2, 5)
    """
    axes = ", ".join(QK_AXES[qk_layout])
    for label, shape in zip(labels, (q_shape, k_shape), strict=True):
        if len(shape) != 4 or shape[-1] not in (None, head_dim):
            raise ValueError(
                f"{name}: {label} must have shape ({axes}) with head_dim={head_dim} "
                f"(qk_layout={qk_layout!r}), got shape {tuple(shape)}"
            )
    seq = QK_AXES[qk_layout].index("seq")
    for axis in (0, seq):
        if None not in (q_shape[axis], k_shape[axis]) and q_shape[axis] != k_shape[axis]:
            raise ValueError(
                f"{name}: {labels[0]} and {labels[1]} must have the same batch and seq sizes; "
                f"qk_layout={qk_layout!r} reads {labels[0]} {tuple(q_shape)} and {labels[1]} "
                f"{tuple(k_shape)} as ({axes})"
            )
    return q_shape[0], q_shape[seq]


def _float_format(array: np.ndarray, name: str) -> str:
    dtype_name: str = array.dtype.name
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

    Example:
        >>> check_rope_shapes((2, 5, 8), (5, 8), (5, 8), None)
        8
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
        >>> from posenc.core.rope import rope_tables
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
    r = check_rotary_dim(head_dim, rotary_dim)
    source = check_choice(source, "source", ROPE_LAYOUTS)
    target = check_choice(target, "target", ROPE_LAYOUTS)
    perm = np.arange(head_dim)
    if source == target:
        return perm
    interleaved_to_half = np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2)])
    perm[:r] = interleaved_to_half if source == "interleaved" else np.argsort(interleaved_to_half)
    return perm
