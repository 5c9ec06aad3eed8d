"""The keys and values of earlier steps, kept exact when RoPE's frequencies change or
tokens are evicted.

A :class:`KVCache` holds what :class:`~posenc.torch.MultiHeadAttention` computed for the
tokens seen so far, so that decoding one token at a time equals the full-sequence call.
Two things break that equality in the caches people use, and this one repairs both:

* **A frequency change.** With a length-dependent RoPE scaling (dynamic NTK past its
  original length, LongRoPE crossing its switch) a new call rotates its queries with
  other frequencies than the cached keys hold. ``on_frequency_change`` says what
  happens then: ``"rerotate"`` (default) turns every cached key by the difference of
  the two angles, exact in float64 and rounded once
  (:func:`posenc.core.rope.rerotation_table_values`); ``"recompute"`` keeps the keys
  before rotation too (twice the keys' memory) and rotates them again from scratch, the
  same bits as the full call; ``"keep"`` leaves them (Hugging Face's behaviour, for
  comparison).
* **Eviction.** ``KVCache(window=W, sinks=S)`` keeps the first ``S`` tokens ("attention
  sinks", StreamingLLM) and the ``W`` most recent; positions are positions in the cache,
  so keys kept after an eviction move to new positions, by the same exact re-rotation
  (or, with ``"recompute"``, rotated again).

How exact: a re-rotation adds one rounding of the key's dtype to each cached key; a key
re-rotated ``n`` times (dynamic NTK re-rotates at every step past its original length, a
full window at every step) carries ``n`` of them, not the error of an angle formed in
float32. ``"recompute"`` adds none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .._checks import check_choice, check_int, describe
from ..core.plan import scaling_length
from ._arguments import check_position_tensor

__all__ = ["ON_FREQUENCY_CHANGE", "KVCache", "attended_length"]

ON_FREQUENCY_CHANGE: tuple[str, ...] = ("rerotate", "recompute", "keep")
"""What a :class:`KVCache` does with its keys when a call's RoPE frequencies differ."""

_UNKNOWN = object()  # the frequencies of a cache that holds no keys yet


@dataclass
class _Held:
    """What a cache holds for one call, before the call's own keys: after the evictions
    it makes and with the keys moved to its positions and frequencies (nothing is
    committed until the call succeeds)."""

    keys: Tensor | None
    values: Tensor | None
    positions: Tensor | None  # recorded positions (1 or batch, seen), None: the indices
    raw: Tensor | None  # the keys before rotation ("recompute")
    frequencies: Any  # the frequency state the keys hold
    evicted: int  # tokens evicted in all, this call's evictions included
    spec: Any = None  # the spec of the rotation (None: none given)
    attended: int | None = None  # the length a length-dependent scaling sees (None: no such)

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]


class KVCache:
    """Keys and values of the tokens seen so far, and the positions of those tokens.

    ``keys`` and ``values`` are ``(batch, heads, seen, head_dim)``. ``positions`` is
    ``None`` while every key sits at its index ``0 .. seen-1`` (no call gave positions);
    once a call gives positions the cache records those of every key it holds, int64
    ``(1 or batch, seen)``: a score bias then sees the keys' true positions, and a call
    without positions continues each row after its last position (left padding).

    A cache serves one batch of one attention: keys of another batch size, number of
    heads, head_dim, dtype or device are refused with a ``ValueError``.

    Args:
        on_frequency_change: What happens to the cached keys when a call's RoPE
            frequencies differ from theirs (a length-dependent scaling): ``"rerotate"``
            (turn them by the difference, exact angles, one rounding), ``"recompute"``
            (keep the keys before rotation as well and rotate them again: the full call's
            bits, twice the keys' memory) or ``"keep"`` (leave them: the usual behaviour).
        window: Keep at most this many recent tokens besides the sinks (``None``: keep
            every token). Positions are then positions in the cache: a call evicts the
            oldest tokens that do not fit with its own, and the keys kept move to their
            new positions (re-rotated, or rotated again with ``"recompute"``). A call of
            more tokens than fit attends to all of them; the next call evicts.
        sinks: With a window, the number of first tokens that are never evicted.

    Example:
        >>> cache = KVCache()
        >>> k, v = cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
        >>> cache.length, tuple(k.shape), cache.positions
        (3, (1, 2, 3, 4), None)
        >>> _ = cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4),
        ...                  positions=torch.tensor([7]))
        >>> cache.positions.tolist(), cache.next_positions(2).tolist()
        ([[0, 1, 2, 7]], [[8, 9]])
        >>> window = KVCache(window=2, sinks=1)
        >>> for _ in range(5):
        ...     _ = window.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
        >>> window.length, window.tokens.tolist()  # the sink and the last 2 of 5 tokens
        (3, [0, 3, 4])
    """

    def __init__(
        self,
        *,
        on_frequency_change: str = "rerotate",
        window: int | None = None,
        sinks: int = 0,
    ) -> None:
        self.on_frequency_change = check_choice(
            on_frequency_change, "on_frequency_change", ON_FREQUENCY_CHANGE
        )
        self.window = None if window is None else check_int(window, "window", minimum=1)
        self.sinks = check_int(sinks, "sinks", minimum=0)
        if self.sinks and self.window is None:
            raise ValueError(
                f"sinks={self.sinks} needs a window (sink tokens are those kept when a "
                "window evicts the others); pass window= too, or sinks=0"
            )
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self._positions: Tensor | None = None  # None: every key at its index
        self._raw: Tensor | None = None  # the keys before rotation ("recompute")
        self._frequencies: Any = _UNKNOWN
        self._spec: Any = None  # the spec of the rotation that rotated the keys held
        self.evicted = 0  # tokens evicted so far

    @property
    def length(self) -> int:
        """Number of positions cached (the index of the next query among the keys)."""
        return 0 if self.keys is None else self.keys.shape[-2]

    @property
    def positions(self) -> Tensor | None:
        """The positions of the keys held, int64 ``(1 or batch, seen)``; ``None`` while
        every key sits at its index ``0 .. seen-1``."""
        return self._positions

    @property
    def tokens(self) -> Tensor:
        """Which tokens the cache holds, int64 ``(seen,)``: the index of each among all
        tokens given to it (``0 .. seen-1`` until a window evicts)."""
        held, first = self.length, min(self.sinks, self.length)
        start = first + self.evicted
        return torch.cat([torch.arange(first), torch.arange(start, start + held - first)])

    def scaling_length(self, count: int, positions: Tensor | None = None) -> int:
        """The length ``L`` a length-dependent RoPE scaling (dynamic NTK, LongRoPE) uses
        for a call of ``count`` new tokens at ``positions`` (``None``: after the keys
        held): the largest position of every key the call attends to, those held (after
        the call's evictions) and its own, + 1 (:func:`posenc.core.plan.scaling_length`).
        The full call over every token uses the same ``L``, so a step whose position goes
        back (``0, 1, 30, 31, 2``) rotates as it does.

        :class:`~posenc.torch.MultiHeadAttention` passes it itself; attention of your own
        that rotates before :meth:`update` passes it to the rotation::

            length = cache.scaling_length(seq, positions)
            q, k = rope(q, k, positions=positions, length=length)
            k, v = cache.update(k, v, positions=positions, rotation=rope)

        Example:
            >>> cache = KVCache()
            >>> _ = cache.update(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2),
            ...                  positions=torch.tensor([0, 1, 30, 31]))
            >>> cache.scaling_length(1, torch.tensor([2])), cache.scaling_length(1)
            (32, 33)
        """
        count = check_int(count, "count", minimum=0)
        if positions is not None:  # of the batch the cache holds (any, while it is empty)
            batch = positions.shape[0] if isinstance(positions, Tensor) else 1
            batch = batch if self.keys is None else self.keys.shape[0]
            name = "KVCache.scaling_length"
            check_position_tensor(positions, batch, count, name, of="the cache")
        drop = self._to_evict(count)
        recorded = self._positions
        if positions is None and recorded is not None:
            positions = _after(recorded, count)
        return attended_length(self.length - drop, recorded, positions, count)

    def next_positions(self, count: int) -> Tensor | None:
        """The positions ``count`` new tokens get when a call gives none: ``None`` (at the
        indices ``length .. length+count-1``) while no positions are recorded, else each
        row's last position + 1, + 2, ..., ``(1 or batch, count)``."""
        return _after(self._positions, count)

    def update(
        self,
        keys: Tensor,
        values: Tensor,
        *,
        positions: Tensor | None = None,
        rotation: Any = None,
    ) -> tuple[Tensor, Tensor]:
        """Append this step's keys and values ``(batch, heads, seq, head_dim)`` (and their
        integer ``positions`` ``(seq,)`` or ``(batch, seq)``; ``None``: the
        :meth:`next_positions`); return every key and value held.

        ``rotation``: the RoPE module (a :class:`~posenc.torch.protocols.CachedKeyRotation`)
        that rotated the keys, so that a frequency change or an eviction moves the cached
        keys; without it they stay as they are. ``"recompute"`` needs the keys before
        rotation, which only :class:`~posenc.torch.MultiHeadAttention` has."""
        name = "KVCache.update"
        self._check(keys, values, name)
        if rotation is not None and self.on_frequency_change == "recompute":
            raise ValueError(
                f"{name}: on_frequency_change='recompute' rotates the keys again from the "
                "keys before rotation, which update() is not given; use it through "
                "MultiHeadAttention(cache=...), or 'rerotate'"
            )
        if positions is not None:
            check_position_tensor(positions, keys.shape[0], keys.shape[2], name, of="keys")
        held, positions = self._begin(keys.shape[2], positions, rotation, name)
        return self._commit(*self._extend(keys, values, positions, name, held))

    # -- the steps of a call (MultiHeadAttention runs them; nothing changes before commit)

    def _begin(
        self, count: int, positions: Any, rotation: Any, name: str
    ) -> tuple[_Held, Tensor | None]:
        """What the cache holds for a call of ``count`` new tokens at ``positions``
        (``None``: after the keys held), and those positions: the oldest tokens that do
        not fit evicted, the keys held moved to their positions and to the call's
        frequencies (``rotation``: the scheme that rotates keys, or ``None``)."""
        if positions is not None and self.window is not None:
            raise ValueError(
                f"{name}: a KVCache with a window places every token itself (positions in "
                "the cache, which move as tokens are evicted); call it without positions"
            )
        moves = _mover(rotation)
        drop = self._to_evict(count)
        self._check_rotation(rotation, moves, drop, name)
        spec = self._spec if rotation is None else getattr(rotation, "spec", None)
        held = _Held(
            self.keys,
            self.values,
            self._positions,
            self._raw,
            self._frequencies,
            self.evicted,
            spec,
        )
        if positions is not None:  # (checked by the caller)
            rows = positions.shape[0] if positions.dim() == 2 else 1
            positions = positions.to(torch.int64).reshape(rows, count)  # (b, T)
        if drop:
            held = self._evicted(held, drop)
        if positions is None:
            positions = _after(held.positions, count)
        if moves is None:
            return held, positions
        frequencies = self._frequencies_of(moves, held, positions, count, name)
        changed = held.keys is not None and frequencies != held.frequencies
        if held.keys is not None and (drop or (changed and self.on_frequency_change != "keep")):
            held.keys = self._moved(moves, held, drop, frequencies)
        if held.keys is None or self.on_frequency_change != "keep":
            held.frequencies = frequencies  # ("keep": the frequencies of the keys held)
        return held, positions

    def _frequencies_of(
        self, moves: Any, held: _Held, positions: Tensor | None, count: int, name: str
    ) -> Any:
        """The frequency state of the call (``held.frequencies`` set where unknown)."""
        if held.frequencies is _UNKNOWN:  # keys given without their rotation (update())
            if moves.frequencies_change and held.keys is not None:
                raise ValueError(
                    f"{name}: the cache holds keys given without rotation=, so it cannot tell "
                    f"which frequencies of {type(moves).__name__}'s length-dependent "
                    "scaling they hold; pass rotation= from the first call on"
                )
            held.frequencies = None  # a fixed scaling has only its construction frequencies
        if not moves.frequencies_change:
            return None  # the construction frequencies, the only ones of most scalings
        held.attended = attended_length(held.length, held.positions, positions, count)
        return moves.frequency_state(held.attended)

    def _check_rotation(self, rotation: Any, moves: Any, drop: int, name: str) -> None:
        """A rotation that works on the cache's ``(batch, heads, seq, head_dim)`` keys, the
        one the keys held were rotated by (a cache serves one attention), and one that can
        move them where this call evicts."""
        if rotation is None:
            return
        if drop and moves is None:
            raise ValueError(
                f"{name}: KVCache(window={self.window}) moves the cached keys to new "
                f"positions when it evicts, which {type(rotation).__name__} cannot do (it "
                "has no rerotate_keys and rotate_keys); use RotaryEmbedding, or a cache "
                "without a window"
            )
        layout = getattr(rotation, "qk_layout", "bhsd")
        if layout != "bhsd":
            raise ValueError(
                f"{name}: the cache holds keys as (batch, heads, seq, head_dim), but "
                f"{type(rotation).__name__} has qk_layout={layout!r}; give it "
                "qk_layout='bhsd'"
            )
        spec = getattr(rotation, "spec", None)
        held = self._spec
        if self.keys is not None and held is not None and spec is not held and spec != held:
            raise ValueError(
                f"{name}: the cache holds keys rotated by {self._spec!r} but was given "
                f"{type(rotation).__name__} with {spec!r}; a KVCache serves one attention "
                "(use one cache per attention layer)"
            )

    def _to_evict(self, count: int) -> int:
        """How many tokens a call of ``count`` evicts: the oldest that are not sinks and
        do not fit in the window beside the call's own."""
        if self.window is None:
            return 0
        excess = self.length + count - (self.sinks + self.window)
        return max(0, min(excess, self.length - self.sinks))

    def _evicted(self, held: _Held, drop: int) -> _Held:
        """``held`` without its ``drop`` oldest tokens after the sinks (not yet moved)."""
        assert held.keys is not None
        assert held.values is not None
        device, n, sinks = held.keys.device, held.length, self.sinks
        keep = torch.cat([torch.arange(sinks), torch.arange(sinks + drop, n)]).to(device)
        pick = [None if t is None else t.index_select(2, keep) for t in (held.keys, held.raw)]
        return _Held(
            pick[0],
            held.values.index_select(2, keep),
            held.positions,
            pick[1],
            held.frequencies,
            held.evicted + drop,
            held.spec,
        )

    def _moved(self, moves: Any, held: _Held, drop: int, frequencies: Any) -> Tensor:
        """The held keys at their positions after this call's evictions and with the
        call's frequencies (``"keep"``: their own)."""
        assert held.keys is not None
        n = held.length
        device = held.keys.device
        new = held.positions  # (b, seen) or None: the indices
        if new is None:
            new = torch.arange(n, device=device)
        if self.on_frequency_change == "keep":
            frequencies = held.frequencies
        if self.on_frequency_change == "recompute":
            if held.raw is None:
                raise ValueError(
                    "KVCache(on_frequency_change='recompute') holds no keys before rotation "
                    "for the keys it has (filled by update()); fill it through "
                    "MultiHeadAttention(cache=...)"
                )
            return _tensor(moves.rotate_keys(held.raw, positions=new, frequencies=frequencies))
        old = new
        if drop:  # the keys after the sinks sat `drop` positions later
            old = new + (torch.arange(n, device=device) >= self.sinks) * drop
        return _tensor(
            moves.rerotate_keys(
                held.keys,
                positions=old,
                new_positions=new,
                frequencies=held.frequencies,
                new_frequencies=frequencies,
            )
        )

    def _extend(
        self,
        keys: Any,
        values: Any,
        positions: Any,
        name: str,
        held: _Held,
        raw: Tensor | None = None,
    ) -> tuple[_Held, Tensor, Tensor, Tensor | None, Tensor | None]:
        """What the cache would hold after this call (it is unchanged: a call that fails
        after this leaves it as it was): keys, values, the keys' positions and the keys
        before rotation (``raw``, kept with ``"recompute"``)."""
        self._check(keys, values, name)
        if positions is not None and held.keys is not None:
            recorded = held.positions
            if recorded is None:  # the keys so far at their indices
                recorded = torch.arange(held.length, device=keys.device).unsqueeze(0)
            batch = max(recorded.shape[0], positions.shape[0])
            recorded, positions = recorded.expand(batch, -1), positions.expand(batch, -1)
            positions = torch.cat([recorded, positions], dim=-1)  # (b, seen + T)
        if raw is None or self.on_frequency_change != "recompute":
            raw = None  # not kept
        elif held.keys is not None:  # appended to those held (none: keys held without theirs)
            raw = None if held.raw is None else torch.cat([held.raw, raw], dim=-2)
        if held.keys is not None and held.values is not None:
            keys = torch.cat([held.keys, keys], dim=-2)  # (B, H, seen + T, hs)
            values = torch.cat([held.values, values], dim=-2)
        return held, keys, values, positions, raw

    def _commit(
        self,
        held: _Held,
        keys: Tensor,
        values: Tensor,
        positions: Tensor | None,
        raw: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        if positions is not None and not positions.shape[-1]:  # no key: none to record
            positions = None
        self.keys, self.values, self._positions, self._raw = keys, values, positions, raw
        self._frequencies, self.evicted, self._spec = held.frequencies, held.evicted, held.spec
        return keys, values

    def _check(self, keys: Any, values: Any, name: str) -> None:
        """Keys and values of one step that fit each other and what the cache holds."""
        for label, given in (("keys", keys), ("values", values)):
            if not isinstance(given, Tensor):
                raise TypeError(
                    f"{name}: the cache takes {label} as a tensor (batch, heads, seq, "
                    f"head_dim), got {describe(given)}"
                )
            if given.dim() != 4:
                raise ValueError(
                    f"{name}: the cache takes {label} of shape (batch, heads, seq, head_dim), "
                    f"got {tuple(given.shape)}"
                )
        if (keys.shape[:3], keys.dtype, keys.device) != (
            values.shape[:3],
            values.dtype,
            values.device,
        ):
            raise ValueError(
                f"{name}: the cache takes keys and values of one batch, heads, seq, dtype and "
                f"device, got keys {_summary(keys)} and values {_summary(values)}"
            )
        for label, given, held in (("keys", keys, self.keys), ("values", values, self.values)):
            if held is not None and (
                (held.shape[:2], held.shape[3], held.dtype, held.device)
                != (given.shape[:2], given.shape[3], given.dtype, given.device)
            ):
                source = "was given" if name == "KVCache.update" else "x gives"
                raise ValueError(
                    f"{name}: the cache holds {label} {_summary(held)} but {source} "
                    f"{label} {_summary(given)}; a KVCache serves one batch of one attention "
                    "(use a new one)"
                )

    def __repr__(self) -> str:
        text = f"KVCache(length={self.length}, on_frequency_change={self.on_frequency_change!r}"
        if self.window is not None:
            text += f", window={self.window}, sinks={self.sinks}, evicted={self.evicted}"
        return text + ")"


def attended_length(
    held: int, recorded: Tensor | None, positions: Tensor | None, count: int
) -> int:
    """The length a length-dependent scaling sees for a call of ``count`` new tokens at
    ``positions`` (``None``: after the keys held) that attends to ``held`` cached keys at
    ``recorded`` positions (``None``: their indices): the planner's rule,
    :func:`posenc.core.plan.scaling_length`, on the two ends (also the Hugging Face cache
    hooks')."""
    own = held + count if positions is None else int(positions.max()) + 1 if count else 0
    cached = None
    if held:
        cached = held if recorded is None or not recorded.numel() else int(recorded.max()) + 1
    length = scaling_length(own, cached)
    assert length is not None  # known positions: a known length
    return length


def _after(positions: Tensor | None, count: int) -> Tensor | None:
    """Each row's last position + 1, + 2, ..., ``(1 or batch, count)``; ``None`` for none."""
    if positions is None:
        return None
    step = torch.arange(1, count + 1, device=positions.device)
    return positions[:, -1:] + step  # (b, count)


def _mover(rotation: Any) -> Any:
    """``rotation`` if it can move cached keys (``rotate_keys``, ``rerotate_keys``,
    ``frequency_state``, ``frequencies_change``), else ``None``."""
    needed = ("rotate_keys", "rerotate_keys", "frequency_state", "frequencies_change")
    if rotation is not None and all(hasattr(rotation, attr) for attr in needed):
        return rotation
    return None


def _tensor(value: Any) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"a scheme's rotate_keys/rerotate_keys returned {describe(value)}")
    return value


def _summary(t: Tensor) -> str:
    """``batch 1, 2 heads, seq 3, head_dim 4, torch.float32 on cpu``."""
    B, H, T, D = t.shape
    return f"of batch {B}, {H} heads, seq {T}, head_dim {D}, {t.dtype} on {t.device}"
