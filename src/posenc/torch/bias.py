"""Attention-score biases: ALiBi and T5's learned relative position bias.

Both return a bias of shape ``(heads, query, key)`` (or ``(batch, heads, query, key)``
with per-example positions) that the attention adds to its scores before the softmax.
The numbers come from the core: ALiBi's slopes from :func:`posenc.alibi_slopes`, T5's
bucket of every relative distance from :func:`posenc.relative_position_bucket`; the
modules only combine them with integer distances on the tensors' device.

Positions follow the convention of every front end (:func:`posenc.core.plan.align_queries`):
keys sit at ``0 .. k-1`` and queries at ``offset .. offset+q-1``; without an offset the
queries are the last ``q`` of the ``k`` positions (KV-cache decoding). Both may be given
explicitly (``positions=``, ``key_positions=``) for packed sequences.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..specs import AlibiSpec, T5Spec
from ..specs.base import module_from_spec
from ._arguments import check_device
from ._backend import format_of, to_tensor
from ._relative import relative_positions
from ._tables import PositionTables
from .protocols import BiasesScores
from .score_mods import distance_score_mod


class ALiBiBias(PositionTables, BiasesScores):
    """ALiBi (Press et al., 2022): a linear penalty ``-m_h · distance`` per head.

    Args:
        num_heads: Number of attention heads; slopes follow the paper's rule for any
            count (geometric for powers of two, interleaved otherwise).
        mode: ``"causal"``: ``-m·(i - j)`` for keys at or before the query and 0 after
            it (hiding future keys is the causal mask's job); ``"symmetric"``:
            ``-m·|i - j|`` for bidirectional attention.

    Call arguments:
        query_length, key_length: Sizes of the score matrix (``key_length`` defaults to
            ``offset + query_length``, or ``query_length`` without an offset).
        offset: Position of the first query (KV-cache decoding); ``None`` (default): the
            queries are the last ``query_length`` of the ``key_length`` positions.
        positions, key_positions: Optional integer tensors of query / key positions.
        dtype, device: Of the returned bias (float32 on the slopes' device by default).

    Shapes:
        output: ``(heads, q, k)``, or ``(batch, heads, q, k)`` with batched positions.

    Example:
        >>> ALiBiBias(2)(3)[0]  # head 0 of 2: slope 2**-4
        tensor([[ 0.0000,  0.0000,  0.0000],
                [-0.0625,  0.0000,  0.0000],
                [-0.1250, -0.0625,  0.0000]])

    References:
        Press, Smith and Lewis, "Train Short, Test Long: Attention with Linear Biases
        Enables Input Length Extrapolation", ICLR 2022.
    """

    spec_class = AlibiSpec
    # the bias as a FlexAttention score_mod: a function of the head and the distance
    score_mod = distance_score_mod

    slopes: Tensor

    def __init__(self, num_heads: int, *, mode: str = "causal") -> None:
        super().__init__()
        self.spec = AlibiSpec(num_heads=num_heads, mode=mode)
        self._register_derived(("slopes",), torch.float64, drop=("alibi",))

    @classmethod
    def from_spec(cls, spec: AlibiSpec, **options: Any) -> ALiBiBias:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @property
    def num_heads(self) -> int:
        """Heads: ``spec.num_heads`` (the :class:`~posenc.torch.protocols.ScoreBias`
        role's attribute)."""
        return self.spec.num_heads

    def _derive_buffers(
        self, dtype: torch.dtype, device: torch.device, rows: int | None = None
    ) -> dict[str, Tensor]:
        return {"slopes": to_tensor(self.spec.slopes(), "float64", device)}  # (H,), exact

    def _table_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float64  # the slopes stay exact whatever the module's dtype

    def forward(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: int | None = None,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | None = None,
    ) -> Tensor:
        format_of(dtype)  # a float dtype: an integer one would truncate the bias
        device = check_device(device, "ALiBiBias") or self.slopes.device
        spec = self.spec
        # per entry: the float64 product and the result, for every head
        per_entry = spec.num_heads * (8 + torch.empty((), dtype=dtype).element_size())
        rel, _ = relative_positions(
            query_length, key_length, offset, positions, key_positions, device, "ALiBiBias",
            per_entry,
        )  # (..., q, k), key - query  # fmt: skip
        distance = rel.clamp(max=0) if spec.mode == "causal" else -rel.abs()  # (..., q, k) ≤ 0
        slopes = self.slopes.to(device).view(-1, 1, 1)  # (H, 1, 1), float64
        # float64 product of an exact slope and an integer, rounded once to dtype.
        bias = slopes * distance.to(torch.float64).unsqueeze(-3)  # (..., H, q, k)
        return bias.to(dtype)  # (format_of has refused a dtype that is not floating)

    def extra_repr(self) -> str:
        return f"num_heads={self.spec.num_heads}, mode={self.spec.mode!r}"


class T5RelativeBias(PositionTables, BiasesScores):
    """T5's learned relative position bias: one weight per (distance bucket, head).

    The bucket of a relative distance (exact up to ``num_buckets/2`` or ``/4``,
    log-spaced up to ``max_distance``, then constant) comes from
    :func:`posenc.relative_position_bucket`, precomputed for every distance within
    ``±max_distance``; longer distances share the last bucket of their side.

    Args:
        num_heads: Number of attention heads.
        bidirectional: Encoder (True) or causal decoder (False) buckets.
        num_buckets: Number of buckets (32 in T5).
        max_distance: Distance from which all buckets saturate (128 in T5).
        compat: ``"hf"`` (bit-equal to Hugging Face's float32 buckets, what trained
            checkpoints assume) or ``"exact"`` (integer maths).

    Call arguments:
        As for :class:`ALiBiBias`.

    The weight is named ``relative_attention_bias`` as in Hugging Face's ``T5Attention``,
    so its ``relative_attention_bias.weight`` loads directly.

    Example:
        >>> bias = T5RelativeBias(4)
        >>> bias(5).shape
        torch.Size([4, 5, 5])
    """

    spec_class = T5Spec
    # the bias as a FlexAttention score_mod: a function of the head and the distance
    score_mod = distance_score_mod

    buckets: Tensor

    def __init__(
        self,
        num_heads: int,
        *,
        bidirectional: bool = True,
        num_buckets: int = 32,
        max_distance: int = 128,
        compat: str = "hf",
    ) -> None:
        super().__init__()
        self.spec = T5Spec(
            num_heads=num_heads,
            bidirectional=bidirectional,
            num_buckets=num_buckets,
            max_distance=max_distance,
            compat=compat,
        )
        self.relative_attention_bias = nn.Embedding(self.spec.num_buckets, self.spec.num_heads)
        self._register_derived(("buckets",), torch.int64)

    @classmethod
    def from_spec(cls, spec: T5Spec, **options: Any) -> T5RelativeBias:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @property
    def num_heads(self) -> int:
        """Heads: ``spec.num_heads`` (the :class:`~posenc.torch.protocols.ScoreBias`
        role's attribute)."""
        return self.spec.num_heads

    def _derive_buffers(
        self, dtype: torch.dtype, device: torch.device, rows: int | None = None
    ) -> dict[str, Tensor]:
        # The bucket of every distance within ±max_distance, int64 (2·max_distance + 1,).
        return {"buckets": to_tensor(self.spec.bucket_table(), "int64", device)}

    def forward(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: int | None = None,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> Tensor:
        if dtype is not None:
            format_of(dtype)  # a float dtype: an integer one would truncate the weights
        weight = self.relative_attention_bias.weight  # (num_buckets, H)
        device = check_device(device, "T5RelativeBias") or weight.device
        spec = self.spec
        # per entry: the bucket index and the bias of every head (and a cast)
        per_entry = 8 + spec.num_heads * weight.element_size() * 2
        rel, _ = relative_positions(
            query_length, key_length, offset, positions, key_positions, device,
            "T5RelativeBias", per_entry,
        )  # (..., q, k)  # fmt: skip
        reach = spec.max_distance
        index = rel.clamp(-reach, reach) + reach
        buckets = self.buckets.to(device)[index]  # (..., q, k)
        bias = nn.functional.embedding(buckets, weight.to(device))  # (..., q, k, H)
        bias = bias.movedim(-1, -3)  # (..., H, q, k)
        return bias if dtype is None else bias.to(dtype)

    def extra_repr(self) -> str:
        spec = self.spec
        return (
            f"num_heads={spec.num_heads}, bidirectional={spec.bidirectional}, "
            f"num_buckets={spec.num_buckets}, max_distance={spec.max_distance}"
        )
