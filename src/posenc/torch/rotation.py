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

__all__ = [
    "SMALL",
    "broadcast_tables",
    "rotate",
    "rotate_small_pair",
    "signed_sin",
]


def rotate(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    layout: str,
    rotary_dim: int,
    *,
    inplace: bool = False,
    fused: bool = False,
) -> Tensor:
    """``x·cos + turn(x)·sin`` on the first ``rotary_dim`` features, in the tables' precision.

    float16/bfloat16 inputs are rotated in float32 (the tables' dtype) and cast back;
    features past ``rotary_dim`` pass through. With ``inplace``, the result is written into
    ``x`` and ``x`` returned. ``fused``: one pass over ``x`` by a kernel ``torch.compile``
    makes of the formula (the same roundings, so the same bits). Differentiable in ``x``
    by the inverse rotation (tables that require grad, as learned frequencies would, take
    autograd through the formula).
    """
    if cos.requires_grad or sin.requires_grad or not (x.requires_grad and torch.is_grad_enabled()):
        return _apply(x, cos, sin, layout, rotary_dim, False, inplace, fused)
    result: Tensor = _Rotation.apply(  # type: ignore[no-untyped-call]
        x, cos, sin, layout, rotary_dim, inplace, fused
    )
    return result


def _apply(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str, rotary_dim: int, inverse: bool,
    inplace: bool, fused: bool,
) -> Tensor:  # fmt: skip
    if not fused or torch.compiler.is_compiling():  # compiled code fuses the eager ops
        return _turn(x, cos, sin, layout, rotary_dim, inverse=inverse, inplace=inplace)
    out: Tensor = _compiled()(x, cos, sin, rotary_dim, layout == "interleaved", inverse)
    if inplace:
        x.copy_(out)
        return x
    return out


_KERNELS: dict[str, Any] = {}


def _compiled() -> Any:
    """:func:`_formula` compiled once per process. torch.compile's automatic dynamic
    shapes: the first shape gets a kernel of its own; a second one makes the sizes that
    changed symbolic (the head width stays fixed, which keeps the kernel vectorised:
    ``dynamic=True`` made every size symbolic and the kernel twice as slow)."""
    kernel = _KERNELS.get("formula")
    if kernel is None:
        kernel = _KERNELS["formula"] = torch.compile(_formula)
    return kernel


def _formula(
    x: Tensor, cos: Tensor, sin: Tensor, rotary_dim: int, interleaved: bool, inverse: bool
) -> Tensor:
    """The rotation written without in-place updates, for ``torch.compile`` to fuse into
    one loop: each pair ``(a, b)`` becomes ``(a·cos - b·sin, b·cos + a·sin)`` (``inverse``:
    the signs of the sin terms swapped), products rounded, then the sums, as :func:`_turn`."""
    compute = torch.promote_types(x.dtype, cos.dtype)
    xr = x[..., :rotary_dim].to(compute)
    if interleaved:  # members 2i and 2i + 1
        one, other = slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)
    else:  # members i and i + rotary_dim/2
        one, other = slice(None, rotary_dim // 2), slice(rotary_dim // 2, rotary_dim)
    a, b = xr[..., one], xr[..., other]
    cos_a, cos_b, sin_a, sin_b = cos[..., one], cos[..., other], sin[..., one], sin[..., other]
    if inverse:
        first, second = a * cos_a + b * sin_b, b * cos_b - a * sin_a
    else:
        first, second = a * cos_a - b * sin_a, b * cos_b + a * sin_b
    if interleaved:
        turned = torch.stack((first, second), dim=-1).flatten(-2)
    else:
        turned = torch.cat((first, second), dim=-1)
    out = turned.to(x.dtype)
    if rotary_dim < x.shape[-1]:
        out = torch.cat((out, x[..., rotary_dim:]), dim=-1)
    return out


class _Rotation(torch.autograd.Function):
    """The rotation with the inverse rotation as its backward; saves only the tables."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        layout: str,
        rotary_dim: int,
        inplace: bool,
        fused: bool,
    ) -> Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.layout, ctx.rotary_dim, ctx.fused = layout, rotary_dim, fused
        if inplace:
            ctx.mark_dirty(x)
        return _apply(x, cos, sin, layout, rotary_dim, False, inplace, fused)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        cos, sin = ctx.saved_tensors
        turned = _apply(grad, cos, sin, ctx.layout, ctx.rotary_dim, True, False, ctx.fused)
        return turned, None, None, None, None, None, None


def _turn(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str, rotary_dim: int, *, inverse: bool,
    inplace: bool,
) -> Tensor:  # fmt: skip
    """The rotation (``inverse``: by the opposite angles) of ``x``'s first ``rotary_dim``
    features. Each member of a pair: its own feature times cos, then its partner times
    sin subtracted or added, in place on the product (negation is exact, so these are
    the roundings of ``x·cos + turn(x)·sin``)."""
    compute = torch.promote_types(x.dtype, cos.dtype)
    # (never while compiling: a branch on the size would put a guard on the length into
    # the graph, and one compiled or exported program must serve every length)
    if not inverse and not inplace and not torch.compiler.is_compiling() and x.numel() <= SMALL:
        return _turn_small(x, cos, sin, layout, rotary_dim, compute)
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


# Inputs up to this many elements (a decoding step's q and k) are rotated with fewer,
# larger operations: each PyTorch call costs microseconds whatever its size. Larger ones
# keep _turn's in-place updates, which allocate less.
SMALL = 1 << 15
_SIGNS: dict[tuple[str, int, torch.dtype, torch.device], Tensor] = {}


def _turn_small(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str, rotary_dim: int, compute: torch.dtype
) -> Tensor:
    xr = x[..., :rotary_dim].to(compute)
    return _with_rest(_partnered(xr, cos, signed_sin(sin, layout, rotary_dim), layout), x)


def rotate_small_pair(
    q: Tensor, k: Tensor, cos: Tensor, signed: Tensor, layout: str, rotary_dim: int, axis: int
) -> tuple[Tensor, Tensor]:
    """A decoding step's rotation of ``q`` and ``k`` (one batch row, the tables' dtype),
    joined along the heads ``axis`` so that the rotation's operations run once; the
    results are ``q``'s and ``k``'s heads of it (contiguous: one batch row)."""
    both = torch.cat((q, k), dim=axis)
    xr = both if rotary_dim == both.shape[-1] else both[..., :rotary_dim]
    out = _with_rest(_partnered(xr, cos, signed, layout), both)
    q_out, k_out = out.split_with_sizes((q.shape[axis], k.shape[axis]), axis)  # one call
    return q_out, k_out


def _partnered(xr: Tensor, cos: Tensor, signed: Tensor, layout: str) -> Tensor:
    """The forward rotation as ``x·cos + partner(x)·(±sin)``. The sign is exact, so each
    product and the sum round as in :func:`_turn` (tested equal)."""
    if layout == "half":  # [x₂, x₁]
        partner = torch.roll(xr, xr.shape[-1] // 2, dims=-1)
    else:  # (b, a) for each pair (a, b)
        partner = xr.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # type: ignore[no-untyped-call]
    return xr * cos + partner * signed


def _with_rest(out: Tensor, x: Tensor) -> Tensor:
    """``out`` in ``x``'s dtype, followed by ``x``'s features past the rotated ones."""
    if out.dtype != x.dtype:
        out = out.to(x.dtype)
    if out.shape[-1] < x.shape[-1]:
        out = torch.cat((out, x[..., out.shape[-1] :]), dim=-1)
    return out


def signed_sin(sin: Tensor, layout: str, rotary_dim: int) -> Tensor:
    """``sin`` with the first member of each pair negated: what the partner feature is
    multiplied by in :func:`_partnered`."""
    key = (layout, rotary_dim, sin.dtype, sin.device)
    traced = torch.compiler.is_compiling()  # a traced tensor must not outlive its trace
    signs = None if traced else _SIGNS.get(key)
    if signs is None:
        signs = torch.ones(rotary_dim, dtype=sin.dtype, device=sin.device)
        if layout == "half":
            signs[: rotary_dim // 2] = -1
        else:
            signs[0::2] = -1
        if not traced:
            _SIGNS[key] = signs
    return sin * signs


def broadcast_tables(tables: tuple[Tensor, ...], qk_layout: str, device: Any) -> tuple[Tensor, ...]:
    """``(seq, r)`` or ``(batch, seq, r)`` tables → broadcastable over ``qk_layout`` heads.

    ``(seq, r)`` works for bhsd as is; ``(batch, seq, r)`` needs a heads axis at 1 (bhsd);
    for bshd the heads axis sits at -2 in both cases.
    """
    out = []
    for t in tables:
        if qk_layout == "bshd":
            t = t.unsqueeze(-2)  # (..., seq, 1, r)
        elif t.dim() == 3:
            t = t.unsqueeze(1)  # (batch, 1, seq, r)
        out.append(t.to(device))
    return tuple(out)
