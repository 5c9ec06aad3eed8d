"""The roles a positional scheme plays in attention, declared as protocols.

:class:`~posenc.torch.MultiHeadAttention` takes a scheme by the role it plays, never by
its class: anything with the methods and attributes of one of these protocols plugs in,
posenc's own modules (RoPE, xPos, axial RoPE, ALiBi, T5) and a user's alike.

:class:`InputEncoding`
    acts on the input embeddings, before attention (sinusoidal, learned, NoPE):
    ``encode(x, *, positions=None, offset=0) -> x'``;
:class:`QueryKeyRotation`
    rotates (and may scale) queries and keys inside attention (RoPE, xPos, axial RoPE):
    ``rotate_queries_keys(q, k, *, positions=None, offset=0) -> (q', k')`` on
    ``(batch, heads, seq, head_dim)`` tensors, with ``head_dim`` and ``qk_layout``;
    A rotation that is also a :class:`CachedKeyRotation` (RoPE) lets a
    :class:`~posenc.torch.KVCache` move its cached keys to new frequencies or positions;
:class:`ScoreBias`
    adds a bias to the attention scores (ALiBi, T5, KERPLE, FIRE, Sandwich):
    ``score_bias(query_length, key_length, *, offset, positions, key_positions, dtype,
    device) -> (heads, q, k)`` or ``(batch, heads, q, k)``, with ``num_heads``;
:class:`ContextualScoreBias`
    adds a bias to the scores that depends on the queries and keys themselves (CoPE):
    ``contextual_bias(q, k, *, allowed, scale) -> (batch, heads, q, k)``, with
    ``head_dim``.

Example:
    >>> from posenc.torch import RotaryEmbedding
    >>> class Shift:  # a scheme of its own: every key rotated as if one position later
    ...     head_dim, qk_layout = 8, "bhsd"
    ...     def __init__(self):
    ...         self.rope = RotaryEmbedding(8, qk_layout="bhsd")
    ...     def rotate_queries_keys(self, q, k, *, positions=None, offset=0):
    ...         return self.rope(q, k, offset=offset)[0], self.rope(q, k, offset=offset + 1)[1]
    >>> isinstance(Shift(), QueryKeyRotation)
    True

posenc's modules play their role through a mixin (:class:`EncodesInput`,
:class:`RotatesQueriesKeys`, :class:`BiasesScores`): the role's method is the module's
own call, so a module written the same way needs only its ``forward``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

__all__ = [
    "BiasesScores",
    "BiasesScoresInContext",
    "CachedKeyRotation",
    "ContextualScoreBias",
    "EncodesInput",
    "InputEncoding",
    "QueryKeyRotation",
    "RotatesQueriesKeys",
    "ScoreBias",
]


@runtime_checkable
class InputEncoding(Protocol):
    """Acts on the input embeddings ``(batch, seq, d_model)`` before attention."""

    def encode(self, x: Tensor, *, positions: Tensor | None = None, offset: int = 0) -> Tensor:
        """``x`` with the position information added (or, for NoPE, as it is)."""
        ...


@runtime_checkable
class QueryKeyRotation(Protocol):
    """Rotates queries and keys ``(batch, heads, seq, head_dim)`` inside attention.

    Attributes:
        head_dim: The feature width it rotates (read only: an attribute or a property).
        qk_layout: ``"bhsd"`` (what :class:`~posenc.torch.MultiHeadAttention` passes)
            or ``"bshd"``.
    """

    @property
    def head_dim(self) -> int: ...

    qk_layout: str

    def rotate_queries_keys(
        self, q: Tensor, k: Tensor, *, positions: Any = None, offset: int = 0
    ) -> tuple[Tensor, Tensor]:
        """``(q', k')``, the shapes and dtypes of ``q`` and ``k``."""
        ...


@runtime_checkable
class CachedKeyRotation(Protocol):
    """A :class:`QueryKeyRotation` whose cached keys a :class:`~posenc.torch.KVCache` can
    move: to the frequencies of a later call (length-dependent scalings) and to new
    positions (evictions). :class:`~posenc.torch.RotaryEmbedding` is one
    (its methods call the functions of :mod:`posenc.torch.rerotation`).

    One whose ``frequencies_change`` also takes ``length=`` in ``rotate_queries_keys``:
    the length whose frequencies the call uses, which a KV cache gives (the largest
    position of every key attended + 1, :func:`posenc.core.plan.scaling_length`).

    Attributes:
        frequencies_change: Whether the frequencies depend on the call's length.
    """

    frequencies_change: bool

    def frequency_state(self, length: int) -> Any:
        """A value naming the frequencies of a call reaching ``length`` positions: two
        calls rotate alike when theirs are equal."""
        ...

    def rotate_keys(
        self, keys: Tensor, *, positions: Any = None, frequencies: Any = None
    ) -> Tensor:
        """Keys before rotation, rotated at ``positions`` with ``frequencies``."""
        ...

    def rerotate_keys(
        self,
        keys: Tensor,
        *,
        positions: Any = None,
        new_positions: Any = None,
        frequencies: Any = None,
        new_frequencies: Any = None,
    ) -> Tensor:
        """Keys rotated at ``positions`` with ``frequencies``, moved to ``new_positions``
        with ``new_frequencies``."""
        ...


@runtime_checkable
class ScoreBias(Protocol):
    """Adds a bias to the attention scores ``(batch, heads, query, key)``.

    A score bias may also have ``score_mod(query_length, key_length, *, offset,
    positions, key_positions, dtype, device)``, the arguments of ``score_bias``, giving
    the bias as a FlexAttention ``score_mod`` (every score bias of posenc does:
    :mod:`posenc.torch.score_mods`); attention through FlexAttention uses it, and makes
    the bias whole for one that has none.

    Attributes:
        num_heads: The number of heads it has a bias for (read only: an attribute or a
            property).
    """

    @property
    def num_heads(self) -> int: ...

    def score_bias(
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
        """The bias ``(heads, q, k)``, or ``(batch, heads, q, k)`` with batched positions.

        Keys sit at ``0 .. k-1``, queries at ``offset + i``; without an offset, the last
        ``q`` of the ``k`` positions (:func:`posenc.core.plan.align_queries`).
        :class:`MultiHeadAttention` always passes the offset (its cache's length)."""
        ...


@runtime_checkable
class ContextualScoreBias(Protocol):
    """Adds a bias to the attention scores computed from the queries and keys.

    Attributes:
        head_dim: The feature width of the queries and keys it reads (read only: an
            attribute or a property).
    """

    @property
    def head_dim(self) -> int: ...

    def contextual_bias(
        self, q: Tensor, k: Tensor, *, allowed: Tensor | None = None, scale: float = 1.0
    ) -> Tensor:
        """The bias ``(batch, heads, q, k)`` added to the scaled scores ``scale·q·kᵀ``.

        ``q`` is ``(batch, heads, q, head_dim)`` and ``k`` ``(batch, heads, k,
        head_dim)`` (after any rotation, every cached key included); ``allowed`` is a
        boolean mask broadcastable to the scores, True where a query may attend (None:
        everywhere). Entries where it is False are hidden by the attention whatever
        their value.
        """
        ...


class EncodesInput(nn.Module):
    """An :class:`InputEncoding` whose ``encode`` is the module's call.

    Example:
        >>> import torch
        >>> class Ramp(EncodesInput):  # adds its position to every feature
        ...     def forward(self, x, *, positions=None, offset=0):
        ...         return x + torch.arange(offset, offset + x.shape[-2]).unsqueeze(-1)
        >>> Ramp().encode(torch.zeros(1, 3, 2), offset=1).tolist()
        [[[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]]
    """

    def encode(self, x: Tensor, *, positions: Tensor | None = None, offset: int = 0) -> Tensor:
        """The :class:`InputEncoding` role: this module's call."""
        encoded: Tensor = self(x, positions=positions, offset=offset)
        return encoded


class RotatesQueriesKeys(nn.Module):
    """A :class:`QueryKeyRotation` whose ``rotate_queries_keys`` is the module's call.

    The module has ``head_dim`` (an attribute, or a property of its spec) and
    ``qk_layout``.

    Example:
        >>> import torch
        >>> class Flip(RotatesQueriesKeys):  # a half turn: every feature negated
        ...     head_dim, qk_layout = 2, "bhsd"
        ...     def forward(self, q, k, *, positions=None, offset=0):
        ...         return -q, -k
        >>> q, k = Flip().rotate_queries_keys(torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))
        >>> q.tolist(), isinstance(Flip(), QueryKeyRotation)
        ([[[[-1.0, -1.0]]]], True)
    """

    qk_layout: str

    def rotate_queries_keys(
        self, q: Tensor, k: Tensor, *, positions: Any = None, offset: int = 0, **options: Any
    ) -> tuple[Tensor, Tensor]:
        """The :class:`QueryKeyRotation` role: this module's call (``options``: the
        call's own keywords, such as a :class:`CachedKeyRotation`'s ``length=``)."""
        rotated: tuple[Tensor, Tensor] = self(q, k, positions=positions, offset=offset, **options)
        return rotated


class BiasesScores(nn.Module):
    """A :class:`ScoreBias` whose ``score_bias`` is the module's call.

    The module has ``num_heads`` (an attribute, or a property of its spec).

    Example:
        >>> import torch
        >>> class Recency(BiasesScores):  # -1 per position back, one head
        ...     num_heads = 1
        ...     def forward(self, query_length, key_length=None, *, offset=0, positions=None,
        ...                 key_positions=None, dtype=torch.float32, device=None):
        ...         q = torch.arange(offset, offset + query_length).unsqueeze(-1)
        ...         k = torch.arange(key_length or query_length)
        ...         return (k - q).clamp(max=0).to(dtype).unsqueeze(0)
        >>> Recency().score_bias(2, 3, offset=1).tolist()
        [[[-1.0, 0.0, 0.0], [-2.0, -1.0, 0.0]]]
    """

    def score_bias(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: int | None = None,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        dtype: torch.dtype | None = torch.float32,
        device: torch.device | None = None,
    ) -> Tensor:
        """The :class:`ScoreBias` role: this module's call."""
        bias: Tensor = self(
            query_length,
            key_length,
            offset=offset,
            positions=positions,
            key_positions=key_positions,
            dtype=dtype,
            device=device,
        )
        return bias


class BiasesScoresInContext(nn.Module):
    """A :class:`ContextualScoreBias` whose ``contextual_bias`` is the module's call.

    The module has ``head_dim`` (an attribute, or a property of its spec).

    Example:
        >>> import torch
        >>> class Agreement(BiasesScoresInContext):  # +1 where q and k share a sign
        ...     head_dim = 1
        ...     def forward(self, q, k, *, allowed=None, scale=1.0):
        ...         return (q * k.transpose(-1, -2) > 0).to(q.dtype)
        >>> q = torch.tensor([1.0, -1.0]).view(1, 1, 2, 1)
        >>> Agreement().contextual_bias(q, q).tolist()
        [[[[1.0, 0.0], [0.0, 1.0]]]]
    """

    def contextual_bias(
        self, q: Tensor, k: Tensor, *, allowed: Tensor | None = None, scale: float = 1.0
    ) -> Tensor:
        """The :class:`ContextualScoreBias` role: this module's call."""
        bias: Tensor = self(q, k, allowed=allowed, scale=scale)
        return bias
