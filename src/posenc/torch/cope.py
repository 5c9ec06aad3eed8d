"""CoPE: contextual position encoding (Golovneva et al., 2024).

Positions counted by the context instead of by tokens. Query ``i`` gives each key ``j``
it may see a gate ``g_ij = σ(q_i·k_j / √d)`` in ``(0, 1)``; the position of key ``j``
from the query is the sum of the gates from ``j`` up to the query,
``p_ij = Σ_{j <= t <= i} g_it``, a fractional count of the keys the gates let through
(with every gate 1 it is the token distance plus one). The score gains ``q_i·e[p_ij]``,
where ``e`` interpolates linearly between learned vectors ``e[0], e[1], ...`` at the
integer positions; counts past the last vector share it.

As in the authors' code (facebookresearch/RAM, ``projects/cope``): the gates come from
the attention's own queries and keys, scaled by ``1/√d``, masked keys have gate 0, the
position vectors start at zero and are shared by the heads of a layer, and the bias joins
the logits before their division by ``√d``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._checks import describe
from ..core.cope import check_cope_call
from ..specs import CopeSpec
from ..specs.base import module_from_spec
from .protocols import BiasesScoresInContext

__all__ = ["ContextualPositionEncoding"]


class ContextualPositionEncoding(BiasesScoresInContext):
    """CoPE for one attention layer: plays the
    :class:`~posenc.torch.protocols.ContextualScoreBias` role.

    Args:
        head_dim: Width of the queries and keys (of one head).
        max_positions: Number of learned position vectors (``0 .. max_positions - 1``);
            the authors use the block size plus one. A count beyond the last uses it.

    Call arguments:
        q: ``(batch, heads, q, head_dim)`` queries (after any rotation).
        k: ``(batch, heads, k, head_dim)`` keys, every cached one included.
        allowed: Optional boolean mask broadcastable to ``(batch, heads, q, k)``, True
            where a query may attend (the causal mask): other keys are not counted.
        scale: The attention's score scale, ``1/√head_dim``: the gates are
            ``σ(scale·q·k)`` and the returned bias is ``scale·q·e[p]``.

    Shapes:
        output: ``(batch, heads, q, k)``, added to the scaled scores.

    The vectors are the parameter ``pos_emb``, ``(1, head_dim, max_positions)`` as in the
    authors' code, so their weights load directly.

    Example:
        >>> cope = ContextualPositionEncoding(2, max_positions=4)
        >>> with torch.no_grad():
        ...     _ = cope.pos_emb[0, 0].copy_(torch.arange(4.0))  # e[p] = (p, 0)
        >>> q = torch.tensor([[1.0, 0.0]] * 3).view(1, 1, 3, 2)
        >>> causal = torch.ones(3, 3, dtype=torch.bool).tril()
        >>> cope(q, torch.zeros(1, 1, 3, 2), allowed=causal)[0, 0]  # every gate σ(0) = 1/2
        tensor([[0.5000, 0.0000, 0.0000],
                [1.0000, 0.5000, 0.0000],
                [1.5000, 1.0000, 0.5000]], grad_fn=<SelectBackward0>)

    References:
        Golovneva, Wang, Weston and Sukhbaatar, "Contextual Position Encoding: Learning to
        Count What's Important", 2024 (arXiv:2405.18719).
    """

    spec_class = CopeSpec

    def __init__(self, head_dim: int, *, max_positions: int) -> None:
        super().__init__()
        self.spec = CopeSpec(head_dim=head_dim, max_positions=max_positions)  # checks them
        self.pos_emb = nn.Parameter(torch.zeros(1, self.spec.head_dim, self.spec.max_positions))

    @classmethod
    def from_spec(cls, spec: CopeSpec, **options: Any) -> ContextualPositionEncoding:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @property
    def head_dim(self) -> int:
        """Width of the queries and keys: ``spec.head_dim`` (the
        :class:`~posenc.torch.protocols.ContextualScoreBias` role's attribute)."""
        return self.spec.head_dim

    def forward(
        self, q: Tensor, k: Tensor, *, allowed: Tensor | None = None, scale: float = 1.0
    ) -> Tensor:
        spec = self.spec
        scale = _check_call(q, k, allowed, scale, spec.head_dim, self.pos_emb.device)
        # The gates, their sums and the interpolation in float32 at least: in bfloat16 a
        # sum of a few hundred gates would be off by whole positions.
        work = torch.promote_types(q.dtype, torch.float32)
        qw, kw = q.to(work), k.to(work)
        gates = torch.sigmoid(torch.matmul(qw, kw.transpose(-1, -2)) * scale)  # (B, H, q, k)
        if allowed is not None:
            gates = gates * allowed.to(work)
        # the count from key j up to the query: a cumulative sum from the last key back
        counts = gates.flip(-1).cumsum(dim=-1).flip(-1).clamp(max=spec.max_positions - 1)
        at_integers = torch.matmul(qw, self.pos_emb.to(work))  # (B, H, q, positions)
        floor = counts.floor()
        # A NaN count (a NaN or infinite query or key) gathers row 0 and its NaN weight
        # makes the bias NaN, as the scores it joins are: never an index out of range.
        upper = at_integers.gather(-1, counts.ceil().nan_to_num(0.0).long())  # (B, H, q, k)
        lower = at_integers.gather(-1, floor.nan_to_num(0.0).long())
        weight = counts - floor  # differentiable in the gates
        bias = (upper * weight + lower * (1 - weight)) * scale
        return bias.to(q.dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.spec.head_dim}, max_positions={self.spec.max_positions}"


def _check_call(
    q: Any, k: Any, allowed: Any, scale: Any, head_dim: int, device: torch.device
) -> float:
    """The call's arguments fit (``ValueError``/``TypeError`` naming them); the scale."""
    name = "ContextualPositionEncoding"
    for label, x in (("q", q), ("k", k)):
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"{name}: {label} must be a floating-point tensor, got {describe(x)}")
    if allowed is not None and (not isinstance(allowed, Tensor) or allowed.dtype != torch.bool):
        raise TypeError(
            f"{name}: allowed must be a boolean tensor (True where a query may attend), "
            f"got {describe(allowed)}"
        )
    mask = None if allowed is None else tuple(allowed.shape)
    checked = check_cope_call(name, tuple(q.shape), tuple(k.shape), mask, scale, head_dim)
    _check_devices(name, device, q=q, k=k, allowed=allowed)
    return checked


def _check_devices(name: str, device: torch.device, **tensors: Any) -> None:
    """Every tensor given on ``device``, the position vectors' (``None``: not given)."""
    for label, x in tensors.items():
        if isinstance(x, Tensor) and x.device != device:
            raise ValueError(
                f"{name}: {label} is on {x.device} but the position vectors are on {device}; "
                "move the module or the tensors"
            )
