"""The KV caches of a patched ``transformers`` model, kept exact.

A model :func:`posenc.integrations.transformers.patch` patched rotates with posenc's
exact tables. Its cache (the model's own ``DynamicCache``, or a :class:`SinkCache`) then
needs two more things, which this module does from hooks on the module that owns the
rotary embedding (``model.model``), around each forward:

* **A frequency change** (dynamic NTK past its original length, LongRoPE past its
  switch): before a call whose frequencies differ from those of the keys cached, every
  cached key is turned by the difference of the angles
  (:meth:`posenc.torch.RotaryEmbedding.rerotate_keys`: exact angles, one rounding), so
  that decoding equals the full-sequence call (``on_frequency_change="rerotate"``);
  ``"keep"`` leaves them, as transformers does.
* **Eviction** (:class:`SinkCache`): before a call, the oldest tokens that do not fit
  beside the call's are evicted, the keys kept move to their new positions in the cache,
  and the call's ``position_ids`` and ``attention_mask`` are those of the tokens kept.

The hooks record, per cache object, the positions of the keys it holds and the
frequencies they were rotated with. A cache filled before the model was patched has
no such record: its keys are left as they are.
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass, field
from typing import Any, cast

from .._extras import require

require("torch", "posenc.integrations.transformers_cache", extra="posenc[transformers]")
require("transformers", "posenc.integrations.transformers_cache", extra="posenc[transformers]")

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from transformers.cache_utils import DynamicCache, DynamicLayer  # noqa: E402

from .._checks import check_choice, check_int  # noqa: E402
from ..torch.cache import attended_length  # noqa: E402

__all__ = ["CACHE_MODES", "CacheKeeper", "SinkCache", "cache_owner", "keep_caches"]

CACHE_MODES: tuple[str, ...] = ("rerotate", "keep")
"""What a patched model does with its cached keys when a call's frequencies change
(``"recompute"``, posenc's :class:`~posenc.torch.KVCache` option, needs the keys before
rotation, which a transformers cache does not hold)."""


class SinkCache(DynamicCache):
    """A ``transformers`` cache that keeps the first ``sinks`` tokens and the ``window``
    most recent ones (StreamingLLM's attention sinks), for a model patched by posenc.

    Positions are positions in the cache: when tokens are evicted, the keys kept are
    re-rotated to their new positions with posenc's exact angles, and each call's
    ``position_ids`` and ``attention_mask`` are those of the tokens kept, so that every
    step equals a full forward pass over the tokens the cache holds. The attention mask
    a call is given covers every token given to the cache (as ``generate()`` passes it).

    Args:
        window: The number of recent tokens kept besides the sinks (>= 1).
        sinks: The number of first tokens never evicted (>= 0; StreamingLLM uses 4).

    Example::

        patch(model)
        model.generate(input_ids, cache=SinkCache(window=1020, sinks=4))
    """

    def __init__(self, window: int, sinks: int = 4) -> None:
        super().__init__()
        self.window = check_int(window, "window", minimum=1)
        self.sinks = check_int(sinks, "sinks", minimum=0)
        self.evicted = 0  # tokens evicted so far
        self._ready = False  # set by a patched model's hook for the call in flight

    def update(
        self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        if not self._ready:
            raise ValueError(
                "SinkCache evicts tokens and moves the keys kept from the hooks of a model "
                "patched by posenc.integrations.transformers.patch(); this model is not "
                "patched (or its rotary module is not posenc's)"
            )
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        return keys, values

    def __repr__(self) -> str:
        return (
            f"SinkCache(window={self.window}, sinks={self.sinks}, length={self.get_seq_length()}, "
            f"evicted={self.evicted})"
        )


@dataclass
class _Record:
    """What posenc knows of a cache's keys."""

    positions: Tensor | None = None  # (1 or batch, held): where the keys were rotated
    frequencies: dict[str, Any] = field(default_factory=dict)  # per rope: the state held
    seen: int = 0  # tokens given to the cache in all
    pending: Tensor | None = None  # the positions of the call in flight
    states: dict[str, Any] = field(default_factory=dict)  # the call in flight's states


class CacheKeeper:
    """The hooks that keep a patched model's caches exact (see the module's text).

    Args:
        ropes: The posenc RoPE modules of the rotary embedding, by layer type (``"all"``
            when the model has one).
        config: The model config (its ``layer_types`` name each layer's rope).
        mode: ``"rerotate"`` or ``"keep"``.
    """

    def __init__(self, ropes: nn.ModuleDict, config: Any, mode: str) -> None:
        self.mode = check_choice(mode, "on_frequency_change", CACHE_MODES)
        self.ropes = ropes
        self.layer_types = list(getattr(config, "layer_types", None) or [])
        self.records: weakref.WeakKeyDictionary[Any, _Record] = weakref.WeakKeyDictionary()
        self.handles: list[Any] = []
        # The length a length-dependent scaling sees in the call under way: the largest
        # position of every key attended + 1, cached keys included (None: no cache). The
        # rotary modules read it, so that the call's own rows share the cached keys'.
        self.attended: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A copy or pickle of a patched model starts with no record of any cache (the
        records are weak references to caches, which stay with the original)."""
        state = dict(self.__dict__)
        del state["records"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.records = weakref.WeakKeyDictionary()

    def attach(self, owner: nn.Module) -> None:
        """Hook ``owner`` (the module whose forward takes the cache and position ids)."""
        self.handles = [
            owner.register_forward_pre_hook(self.before, with_kwargs=True),
            owner.register_forward_hook(self.after, with_kwargs=True),
            owner.register_forward_hook(self._done, always_call=True),  # on errors too
        ]

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    # -- the hooks ---------------------------------------------------------------------------

    def before(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        self.attended = None
        cache = _cache_of(kwargs)
        if cache is None:
            return None
        sink = isinstance(cache, SinkCache)
        count = _call_length(args, kwargs)
        held = cache.get_seq_length()
        _check_batch(cache, _call_input(args, kwargs).shape[0], held)
        record = self._record(cache, held, sink)
        if record is None:
            return None
        drop = 0
        kept: Tensor | None = None
        new_held: Tensor | None = record.positions
        if sink:
            excess = held + count - (cache.sinks + cache.window)
            drop = max(0, min(excess, held - cache.sinks))
            kept, positions = self._sink_inputs(cache, record, kwargs, held, drop, count)
            calls = positions[:, held - drop :]
            new_held = positions[:, : held - drop]
        else:
            given = kwargs.get("position_ids")
            calls = (torch.arange(count) + held).unsqueeze(0) if given is None else given
        device = _call_input(args, kwargs).device
        calls = calls.to(torch.int64)
        end = attended_length(held - drop, new_held, calls, calls.shape[-1])
        self.attended = end
        states = self._states(end)
        self._move(cache, record, states, drop, kept, new_held)
        record.pending, record.states = calls, states
        if sink:
            cache.evicted += drop
            cache._ready = True
            kwargs["position_ids"] = calls.to(device)
        return args, kwargs

    def after(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        cache = _cache_of(kwargs)
        if cache is None:  # a cache the model made itself: the one it returns
            cache = _returned_cache(output)
        if cache is None:
            return
        count = _call_length(args, kwargs)
        record = self.records.get(cache)
        if record is None or record.pending is None:
            if cache.get_seq_length() != count:  # not a cache this call filled from empty
                return
            record = _Record()
            self.records[cache] = record
            given = kwargs.get("position_ids")
            calls = torch.arange(count).unsqueeze(0) if given is None else given
            record.pending = calls.to(torch.int64)
            record.states = self._states(int(calls.max()) + 1 if count else 0)
        calls = record.pending.to("cpu")
        if record.positions is None:
            record.positions = calls
        else:
            batch = max(record.positions.shape[0], calls.shape[0])
            record.positions = torch.cat(
                [record.positions.expand(batch, -1), calls.expand(batch, -1)], dim=-1
            )
        for key, state in record.states.items():  # ("keep": the frequencies of keys held)
            if self.mode == "rerotate" or key not in record.frequencies:
                record.frequencies[key] = state
        record.seen += count
        record.pending = None
        if isinstance(cache, SinkCache):
            cache._ready = False

    def _done(self, module: nn.Module, args: Any, output: Any) -> None:
        self.attended = None  # the call is over (or failed)

    # -- the work ----------------------------------------------------------------------------

    def _states(self, end: int) -> dict[str, Any]:
        """The frequency state of each rope for a call reaching ``end`` positions."""
        return {key: cast(Any, rope).frequency_state(end) for key, rope in self.ropes.items()}

    def _record(self, cache: Any, held: int, sink: bool) -> _Record | None:
        """The cache's record, made for an empty cache, fitted to a cropped one; ``None``
        for keys of unknown origin (left as they are)."""
        record = self.records.get(cache)
        if record is None or held == 0:
            if held and sink:
                raise ValueError(
                    "this SinkCache holds keys posenc did not see; give the model a new one"
                )
            if held:
                return None
            record = _Record(seen=0 if record is None else record.seen)
            if sink:
                cache.evicted = 0
                record.seen = 0
            self.records[cache] = record
            return record
        known = 0 if record.positions is None else record.positions.shape[-1]
        if known < held:  # filled outside posenc's sight
            del self.records[cache]
            return None
        if known > held and record.positions is not None:  # cropped (assisted decoding)
            record.positions = record.positions[:, :held]
            record.seen -= known - held
        return record

    def _sink_inputs(
        self,
        cache: SinkCache,
        record: _Record,
        kwargs: dict[str, Any],
        held: int,
        drop: int,
        count: int,
    ) -> tuple[Tensor, Tensor]:
        """The indices of the keys kept, and the positions of those keys and the call's
        tokens in the cache; the call's attention mask cut to the tokens kept."""
        first = min(cache.sinks, held)
        kept = torch.cat([torch.arange(first), torch.arange(first + drop, held)])
        mask = kwargs.get("attention_mask")
        if mask is None:
            positions = torch.arange(held - drop + count).unsqueeze(0)
            return kept, positions
        if not isinstance(mask, Tensor) or mask.dim() != 2:
            raise ValueError(
                "a SinkCache takes a 2-D attention_mask (batch, tokens given), got "
                f"{type(mask).__name__} of shape {tuple(getattr(mask, 'shape', ()))}"
            )
        seen = record.seen
        if mask.shape[-1] != seen + count:
            raise ValueError(
                f"a SinkCache takes an attention_mask over every token given to it ({seen} "
                f"before this call and {count} now: {seen + count} columns, as generate() "
                f"passes it), got {mask.shape[-1]} columns"
            )
        start = cache.evicted + first + drop  # the first kept token after the sinks
        columns = torch.cat(
            [torch.arange(first), torch.arange(start, seen), torch.arange(seen, seen + count)]
        ).to(mask.device)
        mask = mask.index_select(1, columns)
        kwargs["attention_mask"] = mask
        positions = mask.long().cumsum(-1) - 1
        positions = positions.masked_fill(mask == 0, 0).to("cpu")  # as generate() does
        return kept, positions

    def _move(
        self,
        cache: Any,
        record: _Record,
        states: dict[str, Any],
        drop: int,
        kept: Tensor | None,
        new_held: Tensor | None,
    ) -> None:
        """Evict and re-rotate each layer's keys for the call's frequencies ``states``."""
        changed = self.mode == "rerotate" and any(
            states[key] != record.frequencies.get(key) for key in self.ropes
        )
        if (drop or changed) and record.positions is not None:
            layers = [
                (index, layer, self._rope_key(index))
                for index, layer in enumerate(getattr(cache, "layers", []))
                if isinstance(getattr(layer, "keys", None), Tensor) and layer.keys.numel()
            ]
            for index, layer, key in layers:
                if key is None or drop or states[key] != record.frequencies.get(key):
                    self._check_layer(index, layer, key)
            for _, layer, key in layers:
                self._move_layer(layer, record, cast(str, key), states, drop, kept, new_held)
        if drop and new_held is not None:
            record.positions = new_held
        for key in self.ropes:
            if self.mode == "rerotate":
                record.frequencies[key] = states[key]

    def _rope_key(self, index: int) -> str | None:
        """The rope of cache layer ``index``: the one rope, or that of the layer's type;
        ``None`` where the layer's type is none of the rotary module's."""
        if "all" in self.ropes:
            return "all"
        kind = self.layer_types[index] if index < len(self.layer_types) else None
        return kind if isinstance(kind, str) and kind in self.ropes else None

    def _check_layer(self, index: int, layer: Any, key: str | None) -> None:
        """A layer whose keys posenc can evict and re-rotate (before any is changed)."""
        if key is None:
            kind = self.layer_types[index] if index < len(self.layer_types) else None
            raise ValueError(
                f"posenc re-rotates a cache's keys with the rope of each layer's type; layer "
                f"{index} is of type {kind!r}, which the rotary module does not have "
                f"({sorted(self.ropes)}). Use patch(model, on_frequency_change='keep') and a "
                "cache that does not evict"
            )
        if not isinstance(layer, DynamicLayer):
            raise ValueError(
                f"posenc re-rotates the cached keys of DynamicCache layers; this cache has "
                f"a {type(layer).__name__} at layer {index}. Use DynamicCache (the "
                "default), or patch(model, on_frequency_change='keep')"
            )

    def _move_layer(
        self,
        layer: Any,
        record: _Record,
        key: str,
        states: dict[str, Any],
        drop: int,
        kept: Tensor | None,
        new_held: Tensor | None,
    ) -> None:
        """Evict one layer's tokens and turn its keys to their new positions and frequencies."""
        rope = cast(Any, self.ropes[key])  # a posenc RotaryEmbedding
        old_state = record.frequencies.get(key)
        state = states[key] if self.mode == "rerotate" else old_state
        if not drop and state == old_state:
            return
        keys = layer.keys
        held = keys.shape[-2]
        old = cast(Tensor, record.positions)
        old = old[:, -held:] if getattr(layer, "is_sliding", False) else old[:, :held]
        new = old
        if drop and kept is not None and new_held is not None:
            index_on = kept.to(keys.device)
            keys = keys.index_select(2, index_on)
            layer.values = layer.values.index_select(2, index_on)
            old, new = old[:, kept], new_held
        layer.keys = rope.rerotate_keys(
            keys,
            positions=old.to(keys.device),
            new_positions=new.to(keys.device),
            frequencies=old_state,
            new_frequencies=state,
        )


def cache_owner(model: nn.Module, name: str) -> str:
    """The qualified name of the module whose forward takes the tokens and the cache
    above the rotary module ``name``: the nearest whose forward takes ``input_ids`` or
    ``inputs_embeds`` (``model.model`` in most models; Moshi's rotary modules sit in
    every attention layer, whose forward takes neither), else its parent."""
    parts = name.split(".")[:-1]
    for end in range(len(parts), -1, -1):
        owner = ".".join(parts[:end])
        forward = getattr(model.get_submodule(owner), "forward", None)
        try:
            parameters = inspect.signature(forward).parameters if forward else {}
        except (TypeError, ValueError):  # a forward without a signature
            continue
        if "input_ids" in parameters or "inputs_embeds" in parameters:
            return owner
    return ".".join(parts)


def keep_caches(owner: nn.Module, modules: list[Any], mode: str) -> None:
    """Hook ``owner`` (:func:`cache_owner`) so that the model's caches stay exact: one
    :class:`CacheKeeper` for the rotary ``modules`` under it (posenc's replacements,
    which rotate alike), set on each as its ``keeper``; patching again sets its mode."""
    keeper = next((m.keeper for m in modules if m.keeper is not None), None)
    if keeper is None:
        keeper = CacheKeeper(modules[0].ropes, modules[0].config, mode)
        keeper.attach(owner)
    keeper.mode = mode
    for module in modules:
        module.keeper = keeper


def _returned_cache(output: Any) -> Any:
    """The cache a model's output holds: its ``cache`` field (transformers >= 5.x names
    it so; reading ``past_key_values`` there logs a deprecation), else
    ``past_key_values``."""
    fields = getattr(type(output), "__dataclass_fields__", None) or {}
    for name in ("cache", "past_key_values"):
        if name in fields:
            return getattr(output, name)
    return None


def _check_batch(cache: Any, batch: int, held: int) -> None:
    """A cache holding keys serves the batch size it was filled with (as posenc's
    :class:`~posenc.torch.KVCache`), an error that says so rather than a size error from
    inside transformers."""
    if not held:
        return
    for layer in getattr(cache, "layers", []):
        keys = getattr(layer, "keys", None)
        if isinstance(keys, Tensor) and keys.dim() == 4 and keys.numel():
            if keys.shape[0] != batch:
                raise ValueError(
                    f"this {type(cache).__name__} holds the keys of a batch of {keys.shape[0]} "
                    f"sequences, and the call gives {batch}; a cache serves the batch it was "
                    "filled with: give the model a new cache for another batch size"
                )
            return


def _cache_of(kwargs: dict[str, Any]) -> Any:
    cache = kwargs.get("cache")
    return kwargs.get("past_key_values") if cache is None else cache


def _call_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    """The tokens of a decoder call, ``(batch, seq, ...)``: input_ids or inputs_embeds."""
    for value in (kwargs.get("input_ids"), kwargs.get("inputs_embeds"), *args[:1]):
        if isinstance(value, Tensor) and value.dim() >= 2:
            return value
    raise ValueError("posenc's cache hooks found neither input_ids nor inputs_embeds in the call")


def _call_length(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    return int(_call_input(args, kwargs).shape[1])
