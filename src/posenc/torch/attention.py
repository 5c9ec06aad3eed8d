"""Multi-head self-attention into which any positional scheme is injected.

Where each scheme acts (the roles of :mod:`posenc.torch.protocols`):

* absolute encodings (sinusoidal, learned, NoPE) act on the input embeddings, before
  this module: pass ``position=None`` here;
* RoPE, xPos and axial RoPE rotate the queries and keys (any
  :class:`~posenc.torch.protocols.QueryKeyRotation`);
* ALiBi, T5, KERPLE, FIRE and Sandwich add a bias to the scores (any
  :class:`~posenc.torch.protocols.ScoreBias`);
* CoPE adds a bias computed from the queries and keys (any
  :class:`~posenc.torch.protocols.ContextualScoreBias`).

The attention takes a scheme by its role, never by its class, so a scheme written
elsewhere plugs in as posenc's own do.

The scores go through :func:`torch.nn.functional.scaled_dot_product_attention`.
Keys and values of earlier steps can be kept in a :class:`KVCache`; decoding one token
at a time then equals the full-sequence call.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import (
    check_bool,
    check_int,
    check_probability,
    check_weights,
    check_width,
    describe,
)
from ._arguments import check_offset
from .protocols import ContextualScoreBias, QueryKeyRotation, ScoreBias


class KVCache:
    """Keys and values of the positions seen so far, ``(batch, heads, seen, head_dim)``.

    Example:
        >>> cache = KVCache()
        >>> k, v = cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
        >>> cache.length, tuple(k.shape)
        (3, (1, 2, 3, 4))
    """

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    @property
    def length(self) -> int:
        """Number of positions cached (the offset of the next query)."""
        return 0 if self.keys is None else self.keys.shape[-2]

    def update(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's keys and values; return all of them."""
        if self.keys is None or self.values is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat([self.keys, keys], dim=-2)  # (B, H, seen + T, hs)
            self.values = torch.cat([self.values, values], dim=-2)
        return self.keys, self.values


class MultiHeadAttention(nn.Module):
    """Causal or bidirectional multi-head self-attention with an injected position scheme.

    Args:
        d_model: Width of the input and output.
        num_heads: Number of heads; must divide ``d_model``.
        position: ``None`` (no positional information inside attention: NoPE, or an
            absolute encoding added to the input), a
            :class:`~posenc.torch.protocols.QueryKeyRotation` (:class:`RotaryEmbedding`,
            :class:`XPosRotaryEmbedding`, :class:`AxialRotaryEmbedding`, or a scheme of
            your own; ``head_dim`` must be ``d_model // num_heads`` and ``qk_layout``
            ``"bhsd"``) or a :class:`~posenc.torch.protocols.ScoreBias`
            (:class:`ALiBiBias`, :class:`T5RelativeBias`, ...; with ``num_heads`` heads)
            or a :class:`~posenc.torch.protocols.ContextualScoreBias`
            (:class:`ContextualPositionEncoding`; with ``head_dim``).
            A scheme that plays both roles both rotates and biases. Make a scheme with
            parameters or buffers an ``nn.Module``: then they train, save and move with
            the attention (another object is kept as a plain attribute).
        causal: Mask future keys (decoder) or not (encoder).
        dropout: Dropout on the attention weights (training only).
        bias: Whether the projections have biases.

    Call arguments:
        x: ``(batch, seq, d_model)``.
        positions: Optional integer tensor ``(seq,)`` or ``(batch, seq)``: the positions
            of the queries (and of the keys, without a cache), for packed sequences;
            for axial RoPE the coordinates ``(seq, n_axes)`` or ``(batch, seq, n_axes)``.
        offset: Position of the first token when no cache is given.
        cache: A :class:`KVCache`; its length is the offset of ``x``.
        attn_mask: Optional boolean mask broadcastable to ``(batch, heads, seq, keys)``,
            True where a query may attend (e.g. block-diagonal for packed documents).

    Example:
        >>> from posenc.torch import ALiBiBias
        >>> attention = MultiHeadAttention(32, 4, position=ALiBiBias(4))
        >>> attention(torch.randn(2, 10, 32)).shape
        torch.Size([2, 10, 32])
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        position: QueryKeyRotation | ScoreBias | ContextualScoreBias | None = None,
        causal: bool = True,
        dropout: float = 0.0,
        bias: bool = False,
    ) -> None:
        super().__init__()
        self.d_model = check_width(d_model, "d_model")
        self.num_heads = check_int(num_heads, "num_heads", minimum=1)
        check_weights({"d_model": self.d_model, "3 * d_model": 3 * self.d_model}, "qkv")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"num_heads must divide d_model, got d_model={self.d_model} and "
                f"num_heads={self.num_heads}"
            )
        self.head_dim = self.d_model // self.num_heads
        self.causal = check_bool(causal, "causal")
        self.dropout = check_probability(dropout)
        _check_position(position, self.num_heads, self.head_dim)
        self.position = position
        bias = check_bool(bias, "bias")
        self.qkv = nn.Linear(self.d_model, 3 * self.d_model, bias=bias)
        self.out = nn.Linear(self.d_model, self.d_model, bias=bias)

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        offset: int = 0,
        cache: KVCache | None = None,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, Tensor) else describe(x)
            raise ValueError(
                f"MultiHeadAttention expects x of shape (batch, seq, {self.d_model}), got {shape}"
            )
        offset = check_offset(offset, "MultiHeadAttention")
        if cache is not None:
            if offset:
                raise ValueError("pass either offset= or cache= (the cache knows its length)")
            offset = cache.length
        B, T, C = x.shape
        nh, hs = self.num_heads, self.head_dim
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 × (B, T, C)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        # The role is looked up by its method (cheap; a runtime-protocol isinstance costs
        # tens of microseconds per call): the scheme was checked when it was given.
        rotate = getattr(self.position, "rotate_queries_keys", None)
        if rotate is not None:
            q, k = rotate(q, k, positions=positions, offset=0 if positions is not None else offset)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, nh, S, hs) with S = offset + T
        S = k.shape[-2]

        cached = cache is not None  # without a cache the keys are this step's: S == T
        allowed = self._allowed(T, S, offset, positions, cached, x.device, attn_mask)
        bias = self._bias(T, S, offset, positions, cached, q, k, allowed)
        mask = _combine(bias, allowed)
        is_causal = self.causal and mask is None and not cached
        y = nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
            scale=1.0 / math.sqrt(hs),
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        out: Tensor = self.out(y)
        return out

    def _bias(
        self,
        T: int,
        S: int,
        offset: int,
        positions: Tensor | None,
        cached: bool,
        q: Tensor,
        k: Tensor,
        allowed: Tensor | None,
    ) -> Tensor | None:
        """The scheme's bias on the scaled scores, or None: ``(nh, T, S)`` or ``(B, nh,
        T, S)`` from a score bias, ``(B, nh, T, S)`` from a contextual one (CoPE); the sum
        of both for a scheme that plays both roles."""
        bias: Tensor | None = None
        score_bias = getattr(self.position, "score_bias", None)
        if score_bias is not None:
            key_positions = positions if (positions is not None and not cached) else None
            bias = score_bias(
                T,
                S,
                offset=offset if positions is None else 0,
                positions=positions,
                key_positions=key_positions,
                dtype=q.dtype,
                device=q.device,
            )  # (nh, T, S) or (B, nh, T, S)
        contextual = getattr(self.position, "contextual_bias", None)
        if contextual is not None:
            # causal attention: ``allowed`` holds the causal mask (see _allowed)
            scale = 1.0 / math.sqrt(self.head_dim)
            counted: Tensor = contextual(q, k, allowed=allowed, scale=scale)  # (B, nh, T, S)
            bias = counted if bias is None else bias + counted
        return bias

    def _allowed(
        self,
        T: int,
        S: int,
        offset: int,
        positions: Tensor | None,
        cached: bool,
        device: torch.device,
        attn_mask: Tensor | None,
    ) -> Tensor | None:
        """Boolean mask of the keys each query may see, or None when plain causal (or no)
        masking suffices: ``is_causal`` then does it inside the attention kernel."""
        allowed = attn_mask
        in_scores = any(hasattr(self.position, role) for role in ("score_bias", "contextual_bias"))
        if self.causal and (in_scores or attn_mask is not None or cached):
            query_pos = torch.arange(offset, offset + T, device=device)
            if positions is not None and not cached:
                query_pos = torch.arange(T, device=device)  # packed: order within the batch row
            causal = torch.arange(S, device=device)[None, :] <= query_pos[:, None]  # (T, S)
            allowed = causal if allowed is None else (allowed & causal)
        return allowed

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, causal={self.causal}"


def _combine(bias: Tensor | None, allowed: Tensor | None) -> Tensor | None:
    """The float mask (bias, and -inf where not allowed), the boolean one, or None."""
    if bias is None:
        return allowed
    if allowed is None:
        return bias
    return bias.masked_fill(~allowed, float("-inf"))


def _check_position(position: object, num_heads: int, head_dim: int) -> None:
    """``position`` plays one of the roles of :mod:`posenc.torch.protocols`, and fits."""
    if position is None:
        return
    name = type(position).__name__
    if isinstance(position, QueryKeyRotation) and (
        position.head_dim != head_dim or position.qk_layout != "bhsd"
    ):
        raise ValueError(
            f"the {name} must have head_dim={head_dim} and qk_layout='bhsd', "
            f"got head_dim={position.head_dim}, qk_layout={position.qk_layout!r}"
        )
    if isinstance(position, ScoreBias) and position.num_heads != num_heads:
        raise ValueError(f"the {name} has {position.num_heads} heads, the attention {num_heads}")
    if isinstance(position, ContextualScoreBias) and position.head_dim != head_dim:
        raise ValueError(f"the {name} has head_dim={position.head_dim}, the attention {head_dim}")
    if isinstance(position, (QueryKeyRotation, ScoreBias, ContextualScoreBias)):
        return
    raise TypeError(
        "position must be None, a scheme that rotates queries and keys (a RotaryEmbedding, "
        "XPosRotaryEmbedding, AxialRotaryEmbedding, or any object with head_dim, qk_layout "
        "and rotate_queries_keys) or one that adds a bias to the scores (an ALiBiBias, "
        "T5RelativeBias, or any object with num_heads and score_bias), or one whose bias "
        "reads the queries and keys (a ContextualPositionEncoding, or any object with "
        "head_dim and contextual_bias); absolute encodings "
        f"act on the input, not in attention; got {describe(position)}"
    )
