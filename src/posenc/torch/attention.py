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
from typing import Any

import torch
from torch import Tensor, nn

from .._checks import (
    check_bool,
    check_choice,
    check_int,
    check_probability,
    check_span,
    check_weights,
    check_width,
    describe,
)
from ..core.masks import Mask
from ._arguments import (
    check_attn_mask,
    check_offset_or_positions,
    check_position_tensor,
    positions_range,
)
from ._attend import (
    IMPLEMENTATIONS,
    attend_dense,
    attend_flex,
    choose,
    combine_masks,
    refuse,
)
from .cache import KVCache
from .protocols import ContextualScoreBias, QueryKeyRotation, ScoreBias

__all__ = ["KVCache", "MultiHeadAttention"]


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
        attn_implementation: How the scores are attended (Hugging Face's names):
            ``"sdpa"`` (default): the bias and masks made whole, ``(heads, T, S)``, and
            :func:`~torch.nn.functional.scaled_dot_product_attention`;
            ``"flex_attention"``: FlexAttention (:func:`posenc.torch.flex_attention`),
            the scheme's bias as a ``score_mod`` and the masks as a block mask, so memory
            grows with ``T + S``, not ``T·S`` (forward only on the CPU; no dropout; not
            CoPE, whose bias sums over keys); ``"eager"``: a softmax written out, any
            backward anywhere; ``"auto"``: FlexAttention for calls of ``2**26`` scores or
            more where it can run them, SDPA otherwise.

    Call arguments:
        x: ``(batch, seq, d_model)``, floating, the dtype and device of the weights
            (any dtype under autocast).
        positions: Optional integer tensor ``(seq,)`` or ``(batch, seq)``, positions >= 0
            of the tokens of ``x`` (packed sequences, left padding); for axial RoPE the
            coordinates ``(seq, n_axes)`` or ``(batch, seq, n_axes)``. Without a cache the
            keys are these tokens; with one the cache records them, so that a score bias
            sees every key's true position. A scheme that reads no positions (``None``,
            CoPE) ignores them. Not together with ``offset``.
        offset: Position of the first token when neither positions nor a cache are given.
        cache: A :class:`KVCache`. The queries follow the keys it holds (the causal mask
            by index), at the positions given, else after its last ones (its length, when
            it records none).
        attn_mask: Optional mask broadcastable to ``(batch, heads, seq, keys)``, as
            :func:`torch.nn.functional.scaled_dot_product_attention` takes it: boolean,
            True where a query may attend (e.g. block-diagonal for packed documents), or
            floating, added to the scores (``-inf`` hides a key; cast to the scores'
            dtype); or a mask of :mod:`posenc.torch.masks` (``sliding_window(...)``,
            ``documents(...)``, combined with ``&`` and ``|``), a block mask under
            FlexAttention and a dense one otherwise. Combined with the causal mask and
            the scheme's bias.

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
        attn_implementation: str = "sdpa",
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
        self.attn_implementation = check_choice(
            attn_implementation, "attn_implementation", IMPLEMENTATIONS
        )
        refuse(self.attn_implementation, position, self.dropout)
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
        self._check_input(x)
        offset = check_offset_or_positions(offset, positions, NAME, x.shape[1])
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"{NAME}: cache must be a KVCache or None, got {describe(cache)}")
        if cache is not None and offset:
            raise ValueError(
                f"{NAME}: pass either offset= or cache= (the cache knows its length), got "
                f"offset={offset} with a cache"
            )
        B, T, C = x.shape
        coordinates = getattr(self.position, "n_axes", None) is not None
        if positions is not None:
            self._check_positions(positions, x, coordinates)
            positions = positions.long()  # a narrow or unsigned dtype would wrap distances
        nh, hs = self.num_heads, self.head_dim
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 × (B, T, C)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        # The role is looked up by its method (cheap; a runtime-protocol isinstance costs
        # tens of microseconds per call): the scheme was checked when it was given.
        rotate = getattr(self.position, "rotate_queries_keys", None)
        held = None
        if cache is not None:  # evictions, and the keys held moved to this call's frequencies
            cache._check(k, v, NAME)  # before the cache's positions are read: its batch
            rotation = None if rotate is None else self.position
            held, given = cache._begin(T, None if coordinates else positions, rotation, NAME)
            if not coordinates:
                positions = given  # None: the keys at their indices
        past = 0 if held is None else held.length  # keys before this step's
        raw = k
        if rotate is not None:
            start = 0 if positions is not None else offset + past
            # with a cache, a length-dependent scaling sees every key attended (the cache's)
            length = {} if held is None or held.attended is None else {"length": held.attended}
            q, k = rotate(q, k, positions=positions, offset=start, **length)
        key_positions = positions
        extended = None
        if cache is not None and held is not None:  # every key: (B, nh, S, hs), S = past + T
            record = None if coordinates else positions
            extended = cache._extend(k, v, record, NAME, held, raw)
            _, k, v, key_positions, _ = extended
        S = k.shape[-2]
        structured = attn_mask if isinstance(attn_mask, Mask) else None
        given = attn_mask if structured is None else None  # a tensor, checked as SDPA takes it
        mask = check_attn_mask(given, (B, nh, T, S), x, q.dtype, NAME)
        dropout = self.dropout if self.training else 0.0
        first = offset if cache is None else 0  # the position of the first key, if no positions
        arguments = self._bias_arguments(T, first, past, positions, key_positions, q.device)
        how = self._implementation(dropout, q, k, v)
        scale = 1.0 / math.sqrt(hs)
        if how == "flex_attention":
            y = attend_flex(
                q,
                k,
                v,
                position=self.position,
                causal=self.causal,
                bias_arguments=arguments,
                mask=mask,
                structured=structured,
                scale=scale,
            )  # (B, nh, T, hs)
        else:
            mask = mask if structured is None else combine_masks(mask, structured, q, S)
            y = self._attend_whole(how, q, k, v, mask, past, arguments, dropout, scale)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        out: Tensor = self.out(y)
        if cache is not None and extended is not None:  # the call succeeded: keep its keys
            cache._commit(*extended)
        return out

    def _attend_whole(
        self,
        how: str,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        past: int,
        arguments: dict[str, Any] | None,
        dropout: float,
        scale: float,
    ) -> Tensor:
        """SDPA or eager attention over the scores made whole: the causal mask, the call's
        mask and the scheme's bias in one float mask (``-inf`` where hidden)."""
        T, S = q.shape[-2], k.shape[-2]
        user = mask if mask is not None and mask.dtype == torch.bool else None
        additive = mask if mask is not None and mask.dtype != torch.bool else None
        allowed = self._allowed(T, S, past, q.device, user, masked=mask is not None)
        bias = self._bias(T, S, arguments, q, k, allowed, additive)
        scores = additive if bias is None else bias if additive is None else bias + additive
        mask = allowed if scores is None else _hide(scores, allowed)
        return attend_dense(
            how,
            q,
            k,
            v,
            mask,
            dropout=dropout,
            scale=scale,
            is_causal=self.causal and mask is None and past == 0,
        )  # (B, nh, T, hs)

    def _check_input(self, x: Any) -> None:
        """``x`` is ``(batch, seq, d_model)``, floating, where the weights are and (outside
        autocast) in their dtype: what the projection would otherwise refuse deep inside."""
        expected = f"(batch, seq, {self.d_model})"
        if not isinstance(x, Tensor):
            raise TypeError(f"{NAME}: x must be a tensor of shape {expected}, got {describe(x)}")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"{NAME} expects x of shape {expected}, got {tuple(x.shape)}")
        weight = self.qkv.weight
        if not x.is_floating_point():
            raise TypeError(f"{NAME}: x must be a floating tensor, got dtype {x.dtype}")
        if x.device != weight.device:
            raise ValueError(
                f"{NAME}: x is on {x.device} but the weights on {weight.device}; move one of "
                "them (module.to(x.device))"
            )
        kind = x.device.type  # autocast exists for some device types only (not "meta")
        autocast = torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind)
        if x.dtype != weight.dtype and not autocast:
            raise TypeError(
                f"{NAME}: x has dtype {x.dtype} but the weights {weight.dtype}; cast one of "
                f"them (module.to({x.dtype}) or x.to({weight.dtype})), or run under autocast"
            )

    def _check_positions(self, positions: Any, x: Tensor, coordinates: bool) -> None:
        """Integer positions >= 0 of the tokens of ``x`` (coordinates ``(.., n_axes)`` for a
        scheme with ``n_axes``), with values unless ``x`` has none (``meta``)."""
        B, T = x.shape[0], x.shape[1]
        tokens = positions
        if coordinates and isinstance(positions, Tensor):
            axes = getattr(self.position, "n_axes", None)
            if positions.dim() not in (2, 3) or positions.shape[-1] != axes:
                raise ValueError(
                    f"{NAME}: positions must be coordinates of shape (seq, n_axes) or (batch, "
                    f"seq, n_axes) with seq={T}, n_axes={axes}, got {tuple(positions.shape)}"
                )
            tokens = positions[..., 0]
        check_position_tensor(tokens, B, T, NAME, of="x")
        if positions.is_meta and not x.is_meta:
            raise ValueError(
                f"{NAME}: positions are on the meta device (no values) but x on {x.device}"
            )
        span = positions_range(positions, NAME)  # >= 0 (None: values unknown)
        if span is not None:
            check_span(span[0], span[1], f"{NAME}: positions")

    def _bias_arguments(
        self,
        T: int,
        first: int,
        past: int,
        positions: Tensor | None,
        key_positions: Tensor | None,
        device: torch.device,
    ) -> dict[str, Any] | None:
        """The positions a score bias is called with (None for a scheme without one).

        Without positions the keys sit at ``first ..`` (the call's offset, or 0 with a
        cache) and the queries at ``first + past ..``."""
        if getattr(self.position, "score_bias", None) is None:
            return None
        if positions is None and first:  # no cache, an offset: keys and queries there
            positions = key_positions = torch.arange(first, first + T, device=device)
        if positions is not None:
            return {"offset": None, "positions": positions, "key_positions": key_positions}
        return {"offset": past, "positions": None, "key_positions": key_positions}

    def _implementation(self, dropout: float, q: Tensor, k: Tensor, v: Tensor) -> str:
        """The attention of this call: the module's, or what ``"auto"`` chooses for it."""
        if self.attn_implementation != "auto":
            return self.attn_implementation
        position = self.position
        parameters = tuple(position.parameters()) if isinstance(position, nn.Module) else ()
        scores = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
        return choose(position, dropout, self.training, scores, (q, k, v, *parameters))

    def _bias(
        self,
        T: int,
        S: int,
        arguments: dict[str, Any] | None,
        q: Tensor,
        k: Tensor,
        allowed: Tensor | None,
        additive: Tensor | None,
    ) -> Tensor | None:
        """The scheme's bias on the scaled scores, or None: ``(nh, T, S)`` or ``(B, nh,
        T, S)`` from a score bias, ``(B, nh, T, S)`` from a contextual one (CoPE); the sum
        of both for a scheme that plays both roles."""
        bias: Tensor | None = None
        score_bias = getattr(self.position, "score_bias", None)
        if score_bias is not None and arguments is not None:
            bias = score_bias(T, S, **arguments, dtype=q.dtype, device=q.device)
        contextual = getattr(self.position, "contextual_bias", None)
        if contextual is not None:
            if additive is not None:  # keys a floating mask hides are not counted either
                shown = additive != float("-inf")
                allowed = shown if allowed is None else shown & allowed
            scale = 1.0 / math.sqrt(self.head_dim)
            counted: Tensor = contextual(q, k, allowed=allowed, scale=scale)  # (B, nh, T, S)
            bias = counted if bias is None else bias + counted
        return bias

    def _allowed(
        self, T: int, S: int, past: int, device: torch.device, user: Tensor | None, masked: bool
    ) -> Tensor | None:
        """Boolean mask of the keys each query may see, or None when plain causal (or no)
        masking suffices: ``is_causal`` then does it inside the attention kernel. Causal
        order is the order of the keys: query ``i`` sees keys ``0 .. past + i``. ``user``:
        the call's boolean mask; ``masked``: whether the call has a mask at all."""
        in_scores = any(hasattr(self.position, role) for role in ("score_bias", "contextual_bias"))
        # one query after every key sees them all: no causal mask
        if self.causal and T > 1 and (in_scores or masked or past):
            query_index = torch.arange(past, past + T, device=device)
            causal = torch.arange(S, device=device)[None, :] <= query_index[:, None]  # (T, S)
            return causal if user is None else (user & causal)
        return user

    def extra_repr(self) -> str:
        implementation = self.attn_implementation
        return f"d_model={self.d_model}, num_heads={self.num_heads}, causal={self.causal}" + (
            "" if implementation == "sdpa" else f", attn_implementation={implementation!r}"
        )


NAME = "MultiHeadAttention"


def _hide(scores: Tensor, allowed: Tensor | None) -> Tensor:
    """The float mask: ``scores`` (bias and additive mask), ``-inf`` where not allowed."""
    if allowed is None:
        return scores
    return torch.where(allowed, scores, float("-inf"))


def _check_position(position: object, num_heads: int, head_dim: int) -> None:
    """``position`` plays one of the roles of :mod:`posenc.torch.protocols`, and fits."""
    if position is None:
        return
    name = type(position).__name__
    if isinstance(position, QueryKeyRotation) and (
        position.head_dim != head_dim or position.qk_layout != "bhsd"
    ):
        raise ValueError(
            f"the {name} must have head_dim={head_dim} (d_model // num_heads) and "
            f"qk_layout='bhsd', got head_dim={position.head_dim}, "
            f"qk_layout={position.qk_layout!r}"
        )
    if isinstance(position, ScoreBias) and position.num_heads != num_heads:
        raise ValueError(
            f"the {name} has {position.num_heads} heads, the attention num_heads={num_heads}"
        )
    if isinstance(position, ContextualScoreBias) and position.head_dim != head_dim:
        raise ValueError(
            f"the {name} has head_dim={position.head_dim}, the attention {head_dim} "
            "(d_model // num_heads)"
        )
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
