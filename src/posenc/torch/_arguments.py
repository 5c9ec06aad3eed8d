"""The checks of call arguments every PyTorch module shares: offsets, position tensors,
queries and keys in their layout, and attention masks.

The primitives that move the core's numbers onto tensors are in :mod:`._backend`; the
tables' lifecycle is in :mod:`._tables`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .._checks import MAX_POSITION, describe, position_error, show_number
from ..core.rope import QK_AXES
from ._backend import is_traced

__all__ = [
    "QK_AXES",
    "apply_dropout",
    "check_attn_mask",
    "check_device",
    "check_offset",
    "check_offset_or_positions",
    "check_position_tensor",
    "check_qk",
    "layout_reading",
    "positions_range",
]


def check_offset(offset: Any, name: str, count: int = 1) -> int:
    """An int >= 0 (KV-cache decoding), naming the owner ``name`` in errors; the call's
    ``count`` positions ``offset .. offset + count - 1`` must lie within ``2**53``."""
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, numbers.Integral):
        raise TypeError(
            f"{name}: offset must be an int >= 0, got {describe(offset)} "
            "(per-token positions go in positions=)"
        )
    number = int(offset)
    if number < 0:
        raise ValueError(f"{name}: offset must be an int >= 0, got {show_number(number)}")
    last = number + max(count, 1) - 1
    if last > MAX_POSITION:
        detail = f" (offset + {count} positions - 1)" if last != number else ""
        raise position_error(f"{name}: offset", last, detail)
    return number


def check_offset_or_positions(offset: Any, positions: Any, name: str, count: int = 1) -> int:
    """:func:`check_offset`, and a ``ValueError`` for an offset given with ``positions``
    (positions are absolute: an offset beside them would be silently ignored)."""
    number = check_offset(offset, name, count if positions is None else 1)
    if positions is not None and number:
        raise ValueError(
            f"{name}: give positions= or offset=, not both (got offset={number} with "
            "positions); positions are absolute: add the offset to them"
        )
    return number


def check_device(device: Any, name: str) -> torch.device | None:
    """``None``, or a device that tensors can be placed on here, as a ``torch.device``
    (a ``ValueError``/``TypeError`` naming ``device`` for anything else, rather than
    PyTorch's own error when the bias is moved)."""
    if device is None:
        return None
    if isinstance(device, (bool, np.bool_)) or not isinstance(
        device, (str, torch.device, numbers.Integral)
    ):
        raise TypeError(
            f"{name}: device must be a torch.device or a string such as 'cpu' or 'cuda:0', "
            f"got {describe(device)}"
        )
    try:
        parsed = torch.device(device if not isinstance(device, numbers.Integral) else int(device))
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"{name}: device must be a torch.device or a string such as 'cpu' or 'cuda:0', "
            f"got {device!r}"
        ) from None
    if parsed.type in ("cpu", "meta"):
        return parsed
    backend = getattr(torch, parsed.type, None)
    available = getattr(backend, "is_available", None)
    count = getattr(backend, "device_count", None)
    if not callable(available) or not available():
        raise ValueError(f"{name}: device {str(parsed)!r} is not available in this PyTorch")
    if parsed.index is not None and callable(count) and parsed.index >= count():
        raise ValueError(
            f"{name}: device {str(parsed)!r} does not exist: this machine has {count()} "
            f"{parsed.type} device(s)"
        )
    return parsed


def fits_batch(size: Any, batch: Any) -> bool:
    """``size in (1, batch)``, spelled out: under ``torch.compile`` Dynamo answers the ``in``
    wrongly when ``batch`` is a symbolic size (``2 in (1, s0)`` is False at ``s0 == 2``)."""
    return bool(size == 1 or size == batch)


def check_position_tensor(
    positions: Any,
    batch: int | None,
    seq: int,
    name: str,
    *,
    of: str,
    fractional: str = "posenc.sinusoidal",
) -> None:
    """An integer tensor ``(seq,)`` or ``(batch, seq)``; ``batch=None``: unbatched input."""
    if not isinstance(positions, Tensor):
        raise TypeError(f"{name}: positions must be an integer tensor, got {describe(positions)}")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(
            f"{name}: positions must be an integer tensor, got dtype {positions.dtype} "
            f"(fractional positions: use {fractional})"
        )
    if positions.dim() not in (1, 2) or positions.shape[-1] != seq:
        raise ValueError(
            f"{name}: positions must have shape (seq,) or (batch, seq) with seq={seq} (that "
            f"of {of}), got shape {tuple(positions.shape)}"
        )
    if positions.dim() == 2 and batch is None:
        raise ValueError(
            f"{name}: {of} of shape (seq, d_model) takes positions of shape (seq,), got "
            f"{tuple(positions.shape)}; add a batch axis to {of} for batched positions"
        )
    if positions.dim() == 2 and not fits_batch(positions.shape[0], batch):
        verb = "have" if " and " in of else "has"  # "x has", "q and k have"
        raise ValueError(
            f"{name}: positions has batch size {positions.shape[0]} but {of} {verb} {batch}"
        )


def _read(x: Tensor, qk_layout: str) -> str:
    """How ``qk_layout`` reads the shape of ``x``: ``(batch=2, heads=10, seq=4, head_dim=8)``."""
    axes = zip(QK_AXES[qk_layout], x.shape, strict=True)
    return "(" + ", ".join(f"{axis}={size}" for axis, size in axes) + ")"


def _batch_seq(x: Tensor, qk_layout: str) -> tuple[int, int]:
    # shape entries as they are: symbolic sizes stay symbolic under torch.compile/export
    return x.shape[0], x.shape[QK_AXES[qk_layout].index("seq")]


def layout_reading(q: Tensor, k: Tensor, qk_layout: str, length: int | None = None) -> str:
    """What ``qk_layout`` read 4-D ``q`` and ``k`` as and, when the other layout would fit
    them (the same batch and seq, and seq ``length`` where another argument sets it), that
    it would: the end of an error about their shapes."""
    read = f"qk_layout={qk_layout!r} reads q {tuple(q.shape)} as {_read(q, qk_layout)}"
    if k is not q:
        read += f" and k {tuple(k.shape)} as {_read(k, qk_layout)}"
    (other,) = (layout for layout in QK_AXES if layout != qk_layout)
    batch, seq = _batch_seq(q, other)
    if (batch, seq) != _batch_seq(k, other) or length not in (None, seq):
        return read
    return (
        f"{read}; with qk_layout={other!r} ({', '.join(QK_AXES[other])}) they fit: pass "
        f"qk_layout={other!r} if that is their layout"
    )


def check_qk(
    q: Any, k: Any, head_dim: int, qk_layout: str, name: str, positions: Any = None
) -> tuple[int, int]:
    """Queries and keys of a module that rotates them, read in its ``qk_layout``; returns
    their ``(batch, seq)``.

    ``(batch, seq, heads, head_dim)`` queries given to a ``"bhsd"`` module would be read
    with their seq axis as heads: when the shapes disagree (with ``head_dim``, with each
    other, with the length of ``positions``), the error names the layout in use and what
    it read each axis as, and, when the other layout would fit, says to pass it
    (:func:`layout_reading`). The rest of ``positions`` is checked by
    :func:`check_position_tensor`.

    Example:
        >>> q, k = torch.zeros(1, 5, 4, 8), torch.zeros(1, 5, 2, 8)  # (batch, seq, heads, d)
        >>> check_qk(q, k, 8, "bshd", "RotaryEmbedding")
        (1, 5)
        >>> check_qk(q, k, 8, "bhsd", "RotaryEmbedding")
        Traceback (most recent call last):
        ...
        ValueError: RotaryEmbedding: q and k must have the same batch and seq sizes; \
qk_layout='bhsd' reads q (1, 5, 4, 8) as (batch=1, heads=5, seq=4, head_dim=8) and k \
(1, 5, 2, 8) as (batch=1, heads=5, seq=2, head_dim=8); with qk_layout='bshd' (batch, seq, \
heads, head_dim) they fit: pass qk_layout='bshd' if that is their layout
    """
    for label, x in (("q", q), ("k", k)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: {label} must be a torch.Tensor, got {describe(x)}")
        if x.dim() != 4:
            raise ValueError(
                f"{name}: {label} must have shape ({', '.join(QK_AXES[qk_layout])}) "
                f"(qk_layout={qk_layout!r}), got shape {tuple(x.shape)}"
            )
        if x.shape[-1] != head_dim:
            raise ValueError(
                f"{name} was built for head_dim={head_dim}, but {label} has last dimension "
                f"{x.shape[-1]}: qk_layout={qk_layout!r} reads its shape {tuple(x.shape)} as "
                f"{_read(x, qk_layout)}"
            )
        if not x.is_floating_point():
            raise TypeError(f"{name}: {label} must be a floating-point tensor, got dtype {x.dtype}")
    batch, seq = _batch_seq(q, qk_layout)
    if (batch, seq) != _batch_seq(k, qk_layout):
        raise ValueError(
            f"{name}: q and k must have the same batch and seq sizes; "
            f"{layout_reading(q, k, qk_layout)}"
        )
    if isinstance(positions, Tensor) and positions.dim() in (1, 2) and positions.shape[-1] != seq:
        raise ValueError(
            f"{name}: positions must have shape (seq,) or (batch, seq) with seq={seq} (that of "
            f"q and k), got shape {tuple(positions.shape)}; "
            f"{layout_reading(q, k, qk_layout, positions.shape[-1])}"
        )
    return batch, seq


def positions_range(positions: Tensor, name: str) -> tuple[int, int] | None:
    """``(lowest, highest)`` of a call's positions, after checking that none is negative
    (``(0, -1)`` for none); ``None`` where the values are unknown: while tracing, and on
    the ``meta`` device (a model built without memory). Reading the values synchronises
    with the device."""
    if is_traced() or positions.is_meta:
        return None
    if positions.numel() <= 1:  # a decoding step: one read, no reduction
        if not positions.numel():
            return 0, -1
        low = high = int(positions.item())
    else:
        low, high = (int(v) for v in torch.aminmax(positions))
    if low < 0:
        raise ValueError(f"{name}: positions must be >= 0, got {low}")
    return low, high


def check_attn_mask(
    mask: Any, shape: tuple[int, ...], x: Tensor, dtype: torch.dtype, name: str
) -> Tensor | None:
    """An attention mask of a call, as :func:`torch.nn.functional.scaled_dot_product_attention`
    takes it: ``None``, a boolean tensor (True where a query may attend) or a floating one
    (added to the scores; returned in ``dtype``, that of the scores), broadcastable to
    ``shape``, ``(batch, heads, queries, keys)``, on the device of ``x``.

    A floating mask holds finite values or ``-inf`` (a hidden key): NaN or ``+inf`` would
    make every weight of its row NaN. Checking them reads the mask (a synchronisation);
    traced or ``meta`` masks are taken unread. An integer mask is refused, as it would be
    ambiguous (1 meaning "attend" or "add 1").
    """
    if mask is None:
        return None
    valid = (
        "a boolean tensor (True where a query may attend) or a floating one (added to the scores)"
    )
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name}: attn_mask must be None or {valid}, got {describe(mask)}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        hint = "; for a 0/1 mask of the keys to attend pass attn_mask.bool()"
        raise TypeError(
            f"{name}: attn_mask must be {valid}, got dtype {mask.dtype}"
            + ("" if mask.is_complex() else hint)
        )
    try:
        broadcast = torch.broadcast_shapes(mask.shape, shape)  # type: ignore[no-untyped-call]
    except RuntimeError:
        broadcast = None
    if mask.dim() > len(shape) or broadcast != torch.Size(shape):
        raise ValueError(
            f"{name}: attn_mask must broadcast to (batch, heads, seq, keys) = {tuple(shape)}, "
            f"got shape {tuple(mask.shape)}"
        )
    if mask.device != x.device:
        raise ValueError(
            f"{name}: attn_mask is on {mask.device} but x on {x.device}; move it there "
            "(attn_mask.to(x.device))"
        )
    if mask.dtype == torch.bool:
        return mask
    mask = mask.to(dtype)  # as the scores: large values may round to ±inf here
    checked: Tensor = mask
    if not (is_traced() or mask.is_meta) and bool((mask.isnan() | (mask == math.inf)).any()):
        raise ValueError(
            f"{name}: a floating attn_mask must hold finite values or -inf (a hidden key) in "
            f"{dtype}, got NaN or +inf, which would make the weights of their rows NaN"
        )
    return checked


def apply_dropout(dropout: nn.Dropout, x: Tensor) -> Tensor:
    """``dropout(x)``, skipping the module call where it is the identity (eval or p=0)."""
    return dropout(x) if dropout.training and dropout.p > 0 else x
