"""RoPE whose frequencies are trained.

RoPE fixes the angle per position of each feature pair, ``θ_i = base^(-2i/d)`` (or a
scaling's); here those angles start as any :class:`~posenc.RopeSpec` gives them (from the
core) and are parameters afterwards, trained with the model. The rotation is RoPE's own
(:func:`posenc.torch.rotation.rotate`, by autograd through the formula since the tables
now require gradients); the angles ``position · θ_i`` are formed in float64 from the
float32 parameters, so a long position loses no more than the parameter's own rounding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from .._checks import check_choice
from ..core.rope import RopeScaling, learned_rope_frequencies, rope_options
from ..specs import RopeSpec
from ..specs.base import module_from_spec
from ._arguments import check_offset_or_positions
from .protocols import RotatesQueriesKeys
from .rope import QK_LAYOUTS, check_qk, check_rope_positions
from .rotation import broadcast_tables, rotate

__all__ = ["LearnedRotaryEmbedding"]


class LearnedRotaryEmbedding(RotatesQueriesKeys):
    """Rotary position embedding with trained frequencies.

    Args:
        head_dim, base, rotary_dim, layout, scaling, scaling_params: As for
            :class:`RotaryEmbedding`: the initial frequencies (and attention factor) are
            that module's. A scaling whose frequencies follow the sequence length
            (``dynamic_ntk``, ``longrope``) has no fixed frequencies to start from and is
            refused.
        qk_layout: ``"bhsd"`` (the default) or ``"bshd"``.

    Call arguments:
        As for :class:`RotaryEmbedding` (``q``, ``k``, ``positions=`` or ``offset=``).

    The trained frequencies are the parameter ``inv_freq`` (float32,
    ``(rotary_dim // 2,)``); ``attention_factor`` scales the tables as RoPE's does. The
    angles are formed in float64 from it whatever the inputs' dtype, but casting the
    module (``.half()``, ``.to(torch.bfloat16)``) casts this parameter as any other,
    which rounds the frequencies (by up to 2^-8 of each in bfloat16): keep the module in
    float32 under mixed precision, as trained parameters usually are.

    Example:
        >>> rope = LearnedRotaryEmbedding(8, qk_layout="bhsd")
        >>> rope.inv_freq.requires_grad, rope.inv_freq.shape
        (True, torch.Size([4]))
        >>> from posenc.torch import RotaryEmbedding
        >>> q = torch.randn(1, 2, 5, 8)
        >>> fixed = RotaryEmbedding(8, qk_layout="bhsd")
        >>> torch.allclose(rope(q, q)[0], fixed(q, q)[0], atol=1e-6)  # at the start
        True
    """

    spec_class = RopeSpec

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: Literal["half", "interleaved"] = "half",
        scaling: str | RopeScaling | Mapping[str, Any] | None = None,
        scaling_params: Mapping[str, Any] | None = None,
        qk_layout: Literal["bhsd", "bshd"] = "bhsd",
    ) -> None:
        super().__init__()
        self.qk_layout = check_choice(qk_layout, "qk_layout", QK_LAYOUTS)
        spec_scaling, base, _ = rope_options(
            scaling, scaling_params, base=base, seq_len_owner="module"
        )
        self.spec = RopeSpec(
            head_dim=head_dim, base=base, rotary_dim=rotary_dim, layout=layout, scaling=spec_scaling
        )
        assert self.spec.rotary_dim is not None  # RopeSpec stores it resolved
        initial, self.attention_factor = learned_rope_frequencies(
            spec_scaling, self.spec.rotary_dim, self.spec.base, owner=type(self).__name__
        )  # float32, from the core
        self.inv_freq = nn.Parameter(torch.tensor(initial))  # float32, the default device

    @classmethod
    def from_spec(cls, spec: RopeSpec, **options: Any) -> LearnedRotaryEmbedding:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @property
    def head_dim(self) -> int:
        """Features per head: ``spec.head_dim`` (the
        :class:`~posenc.torch.protocols.QueryKeyRotation` role's attribute)."""
        return self.spec.head_dim

    def _tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``cos`` and ``sin`` ``(..., rotary_dim)`` at integer ``positions`` in this layout,
        float32, differentiable in the frequencies."""
        angles = positions.to(torch.float64).unsqueeze(-1) * self.inv_freq.to(torch.float64)
        if self.spec.layout == "half":
            angles = torch.cat((angles, angles), dim=-1)
        else:
            angles = angles.repeat_interleave(2, dim=-1)
        factor = self.attention_factor
        cos, sin = torch.cos(angles) * factor, torch.sin(angles) * factor
        return cos.to(torch.float32), sin.to(torch.float32)

    def forward(
        self, q: Tensor, k: Tensor, *, positions: Tensor | None = None, offset: int = 0
    ) -> tuple[Tensor, Tensor]:
        name, spec = type(self).__name__, self.spec
        batch, seq = check_qk(q, k, spec.head_dim, self.qk_layout, name, positions)
        if q.device != k.device:
            raise ValueError(f"{name}: q is on {q.device} but k on {k.device}; give both on one")
        offset = check_offset_or_positions(offset, positions, name)
        device = self.inv_freq.device
        if positions is None:
            rows = torch.arange(offset, offset + seq, device=device)  # (seq,)
        else:
            check_rope_positions(positions, batch, seq, name)
            if positions.device.type == "meta" and device.type != "meta":
                raise ValueError(f"{name}: positions is on the meta device: it has no values")
            rows = positions.to(device)  # (seq,) or (batch, seq)
        cos, sin = broadcast_tables(self._tables(rows), self.qk_layout, q.device)
        layout, width = spec.layout, cast(int, spec.rotary_dim)
        return rotate(q, cos, sin, layout, width), rotate(k, cos, sin, layout, width)

    def extra_repr(self) -> str:
        spec = self.spec
        return (
            f"head_dim={spec.head_dim}, rotary_dim={spec.rotary_dim}, layout={spec.layout!r}, "
            f"qk_layout={self.qk_layout!r}, scaling={spec.scaling.name!r}"
        )
