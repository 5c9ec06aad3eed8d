"""The positions of a score-bias call: its sizes checked, its queries aligned with its
keys (the core's planner), and the relative positions ``key - query`` it covers.

Shared by every score bias (:mod:`.bias`, :mod:`.kernel_bias`) and their FlexAttention
``score_mod`` (:mod:`.score_mods`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._checks import DEFAULT_MAX_BYTES, check_int, check_memory, check_span, describe
from ..core.plan import align_queries, traced_offset
from ._arguments import check_offset, check_offset_or_positions
from ._backend import is_traced

__all__ = ["call_positions", "relative_positions"]


def _length(value: Any, name: str) -> Any:
    """An int >= 0, or a symbolic size under torch.export / torch.compile (unchecked)."""
    return value if isinstance(value, torch.SymInt) else check_int(value, name, minimum=0)


def call_positions(
    query_length: int,
    key_length: int | None,
    offset: int | None,
    positions: Tensor | None,
    key_positions: Tensor | None,
    device: Any,
    name: str,
) -> tuple[Any, Any, Any, int]:
    """The sizes of a bias call, checked: ``(query_length, key_length, offset, batch)``,
    the offset 0 when ``positions`` are given (the one convention for ``q != k`` comes
    from the core's planner, :func:`posenc.core.plan.align_queries`)."""
    if positions is not None:
        check_offset_or_positions(0 if offset is None else offset, positions, name)
        offset = 0
    elif offset is not None:
        offset = check_offset(offset, name)
    query_length = _length(query_length, "query_length")
    if key_length is not None:
        key_length = _length(key_length, "key_length")
    if _symbolic(query_length, key_length, offset):  # torch.export: the same rule, unchecked
        if offset is None:
            offset = 0 if key_length is None else traced_offset(query_length, key_length)
        key_length = offset + query_length if key_length is None else key_length
    else:
        query_length, key_length, offset = align_queries(
            query_length, key_length, offset, name=f"{name}: "
        )
    batch = _check_positions(positions, key_positions, query_length, key_length, name, device)
    return query_length, key_length, offset, batch


def relative_positions(
    query_length: int,
    key_length: int | None,
    offset: int | None,
    positions: Tensor | None,
    key_positions: Tensor | None,
    device: torch.device,
    name: str,
    entry_bytes: int,
) -> tuple[Tensor, Any]:
    """``(key position - query position, offset)``: ``(q, k)``, or ``(batch, q, k)`` when
    positions are given (then the offset is 0).

    ``entry_bytes`` is what the caller then needs per ``(q, k)`` entry (all heads): the
    memory of the whole call is checked before anything is allocated.
    """
    query_length, key_length, offset, batch = call_positions(
        query_length, key_length, offset, positions, key_positions, device, name
    )
    check_memory(
        batch * query_length * key_length * (8 + entry_bytes),
        f"{name}'s bias for {query_length} queries and {key_length} keys",
        DEFAULT_MAX_BYTES,
        fix="compute it in blocks of queries (positions=, key_positions=), or attend "
        "through FlexAttention (attn_implementation='flex_attention')",
    )
    if positions is None:
        positions = torch.arange(offset, offset + query_length, device=device)
    if key_positions is None:
        key_positions = torch.arange(key_length, device=device)
    relative = key_positions.to(device).unsqueeze(-2) - positions.to(device).unsqueeze(-1)
    return relative, offset


def _check_positions(
    positions: Any,
    key_positions: Any,
    query_length: Any,
    key_length: Any,
    name: str,
    device: Any,
) -> int:
    """Integer tensors ``(q,)``/``(batch, q)`` and ``(k,)``/``(batch, k)`` within
    ``±2**53`` (read when not tracing: one synchronisation with their device); the batch
    size."""
    for value, what, size, length in ((positions, "positions", query_length, "query_length"),
                                      (key_positions, "key_positions", key_length,
                                       "key_length")):  # fmt: skip
        if value is None:
            continue
        if (
            not isinstance(value, Tensor)
            or value.is_floating_point()
            or value.is_complex()
            or value.dtype == torch.bool
        ):
            raise TypeError(f"{name}: {what} must be an integer tensor, got {describe(value)}")
        if value.dim() not in (1, 2) or value.shape[-1] != size:
            raise ValueError(
                f"{name}: {what} must have shape ({size},) or (batch, {size}) for "
                f"{length}={size}, got {tuple(value.shape)}"
            )
        _check_values(value, what, name, device)
    given = [t for t in (positions, key_positions) if t is not None and t.dim() == 2]
    batches = {t.shape[0] for t in given} - {1}
    if len(batches) > 1:
        raise ValueError(
            f"{name}: positions and key_positions have different batch sizes "
            f"{tuple(given[0].shape)} and {tuple(given[1].shape)}"
        )
    return int(max(batches, default=1))


def _check_values(value: Tensor, what: str, name: str, device: Any) -> None:
    """Positions with values (not on ``meta`` unless the bias is), within ``±2**53``."""
    if value.device.type == "meta":
        if torch.device(device).type != "meta":
            raise ValueError(
                f"{name}: {what} is on the meta device: it has no values to compute a bias from"
            )
        return
    if is_traced() or not value.numel():
        return
    low, high = (int(v) for v in torch.aminmax(value))
    check_span(low, high, f"{name}: {what}")


def _symbolic(*values: Any) -> bool:
    return any(isinstance(value, torch.SymInt) for value in values)
