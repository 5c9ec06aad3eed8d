"""Turning feature pairs by the angles of cos/sin tables, forward and backward.

:func:`rotate` computes ``x·cos + turn(x)·sin`` on the first ``rotary_dim`` features of
``x`` (``turn``: ``rotate_half`` in the half layout, ``(a, b) → (-b, a)`` on each pair in
the interleaved one), with the roundings of that formula, as Hugging Face's
``apply_rotary_pos_emb`` has them. Its backward is a rotation too: the transpose of a
rotation is the rotation by the opposite angle, so the gradient of ``x`` is the incoming
gradient turned back with the same tables. That needs neither ``x`` nor any temporary of
the forward, only the tables, and is one rotation's work, where autograd through the
formula replays its slices and in-place updates. ``inplace=True`` writes the result into
``x`` itself (as flash-attn's ``apply_rotary_emb(..., inplace=True)``), which saves the
output's allocation; under autograd the input is then marked as modified.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["rotate"]


def rotate(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str, rotary_dim: int, *, inplace: bool = False
) -> Tensor:
    """``x·cos + turn(x)·sin`` on the first ``rotary_dim`` features, in the tables' precision.

    float16/bfloat16 inputs are rotated in float32 (the tables' dtype) and cast back;
    features past ``rotary_dim`` pass through. With ``inplace``, the result is written into
    ``x`` and ``x`` returned. Differentiable in ``x`` by the inverse rotation (tables
    that require grad, as learned frequencies would, take autograd through the formula).
    """
    if cos.requires_grad or sin.requires_grad or not (x.requires_grad and torch.is_grad_enabled()):
        return _turn(x, cos, sin, layout, rotary_dim, inverse=False, inplace=inplace)
    result: Tensor = _Rotation.apply(  # type: ignore[no-untyped-call]
        x, cos, sin, layout, rotary_dim, inplace
    )
    return result


class _Rotation(torch.autograd.Function):
    """The rotation with the inverse rotation as its backward; saves only the tables."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, cos: Tensor, sin: Tensor, layout: str, rotary_dim: int, inplace: bool
    ) -> Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.layout, ctx.rotary_dim = layout, rotary_dim
        if inplace:
            ctx.mark_dirty(x)
        return _turn(x, cos, sin, layout, rotary_dim, inverse=False, inplace=inplace)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        cos, sin = ctx.saved_tensors
        turned = _turn(grad, cos, sin, ctx.layout, ctx.rotary_dim, inverse=True, inplace=False)
        return turned, None, None, None, None, None


def _turn(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str, rotary_dim: int, *, inverse: bool,
    inplace: bool,
) -> Tensor:  # fmt: skip
    """The rotation (``inverse``: by the opposite angles) of ``x``'s first ``rotary_dim``
    features. Each member of a pair: its own feature times cos, then its partner times
    sin subtracted or added, in place on the product (negation is exact, so these are
    the roundings of ``x·cos + turn(x)·sin``)."""
    compute = torch.promote_types(x.dtype, cos.dtype)
    if layout == "half":
        half = rotary_dim // 2  # the sin table repeats each frequency in both halves
        first, second = slice(None, half), slice(half, rotary_dim)
    else:
        first, second = slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)
    # (to first, to second): the partner's product and the sign it is added with
    partner_sin = (
        (sin[..., second], sin[..., first]) if inverse else (sin[..., first], sin[..., second])
    )
    sign = 1.0 if inverse else -1.0
    xr = x[..., :rotary_dim]
    if inplace and x.dtype == compute:  # the partner products first, from the unchanged x
        to_first = xr[..., second] * partner_sin[0]
        to_second = xr[..., first] * partner_sin[1]
        out = xr.mul_(cos)
    else:
        xw = xr.to(compute)
        to_first = xw[..., second] * partner_sin[0]
        to_second = xw[..., first] * partner_sin[1]
        out = xw * cos
    out[..., first].add_(to_first, alpha=sign)
    out[..., second].add_(to_second, alpha=-sign)
    if inplace:
        if out is not xr:
            xr.copy_(out)
        return x
    out = out.to(x.dtype)
    if rotary_dim < x.shape[-1]:
        out = torch.cat((out, x[..., rotary_dim:]), dim=-1)
    return out
