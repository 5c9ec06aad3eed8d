"""Attention masks for PyTorch: dense boolean masks and FlexAttention block masks.

A mask is a description from :mod:`posenc.core.masks` (combine them with ``&`` and
``|``); this module makes one of them what an attention kernel takes:

* :func:`dense_mask`: a boolean ``(batch, 1, T, S)`` tensor, True where a query may
  attend, for :func:`torch.nn.functional.scaled_dot_product_attention`;
* :func:`block_mask`: a FlexAttention ``BlockMask``, whose tiles the core plans
  (:func:`posenc.core.masks.block_classes`) without forming the ``T × S`` matrix;
* :func:`mask_mod`: the predicate both evaluate, ``(b, h, q, k) -> bool``.

The keys are ``0 .. S-1`` in the order held and the ``T`` queries the last ``T`` of them.

Example:
    >>> mask = causal() & sliding_window(2, sinks=1)
    >>> dense_mask(mask, 4, 4)[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 1, 1]]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._checks import DEFAULT_MAX_BYTES, check_memory
from ..core import masks as core
from ..core.masks import FULL, PARTIAL, Mask
from ._arguments import check_device, fits_batch
from ._backend import to_tensor
from ._flex_inputs import static_length

__all__ = [
    "Mask",
    "all_keys",
    "block_mask",
    "causal",
    "dense_mask",
    "documents",
    "mask_mod",
    "sliding_window",
]

#: FlexAttention's tile, queries and keys alike.
BLOCK = 128

#: What this module's functions call the core's queries and keys.
NAMES = ("query_length", "key_length")


def all_keys() -> Mask:
    """Every key visible (:class:`posenc.core.masks.AllKeys`): FlexAttention's block mask
    for attention without a mask, whose last tile stops at the last key.

    Example:
        >>> dense_mask(all_keys(), 1, 3)[0, 0].tolist()
        [[True, True, True]]
    """
    return core.AllKeys()


def causal() -> Mask:
    """A query sees the keys up to its own index (:class:`posenc.core.masks.Causal`).

    Example:
        >>> dense_mask(causal(), 2, 4)[0, 0].int().tolist()  # the last 2 of 4 keys
        [[1, 1, 1, 0], [1, 1, 1, 1]]
    """
    return core.Causal()


def sliding_window(window: int, *, sinks: int = 0) -> Mask:
    """Keys less than ``window`` indices away and the first ``sinks``
    (:class:`posenc.core.masks.Window`); with :func:`causal`, a causal sliding window.

    Example:
        >>> dense_mask(sliding_window(2), 4)[0, 0].int().tolist()
        [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    """
    return core.Window(window, sinks)


def documents(document_ids: Any = None, *, cu_seqlens: Any = None) -> Mask:
    """A query sees the keys of its own document (packed sequences).

    Args:
        document_ids: ``(S,)`` or ``(batch, S)`` ids of every key; a document is a run
            of equal ids (as :func:`positions_from_document_ids` reads them).
        cu_seqlens: Or FlashAttention's cumulative lengths ``[0, n₁, n₁+n₂, ...]`` of one
            packed row.

    Example:
        >>> dense_mask(documents(torch.tensor([5, 5, 9])), 3, 3)[0, 0].int().tolist()
        [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    """
    if (document_ids is None) == (cu_seqlens is None):
        raise ValueError("documents() takes document_ids or cu_seqlens, exactly one of them")
    if document_ids is not None:
        return core.Documents(core.segments_from_document_ids(_numpy(document_ids, "ids")))
    return core.Documents(core.segments_from_cu_seqlens(_numpy(cu_seqlens, "cu_seqlens")))


def _numpy(value: Any, name: str) -> Any:
    """A tensor's values for the core (which checks them); anything else as it is."""
    if isinstance(value, Tensor):
        if value.is_meta:
            raise ValueError(f"{name} is on the meta device: it has no values")
        return value.detach().cpu().numpy()
    return value


def _batch(mask: Mask, batch: int | None) -> int:
    """The batch the mask is made for: the attention's, else its documents' (or 1)."""
    sizes = {leaf.segments.shape[0] for leaf in mask.leaves() if isinstance(leaf, core.Documents)}
    sizes.discard(1)
    if len(sizes) > 1:
        raise ValueError(f"the masks' documents have different batch sizes {sorted(sizes)}")
    own = sizes.pop() if sizes else 1
    if batch is None:
        return own
    if not fits_batch(own, batch):
        raise ValueError(f"the documents have batch {own}, the attention {batch}")
    return batch


def mask_mod(
    mask: Mask, query_length: int, key_length: int | None = None, *,
    batch: int | None = None, device: Any = None,
) -> Any:  # fmt: skip
    """The predicate ``(b, h, q, k) -> bool`` of ``mask`` for ``query_length`` queries
    over ``key_length`` keys, as FlexAttention's ``mask_mod`` (its tensors on
    ``device``); it also evaluates on broadcast index tensors (:func:`dense_mask`).

    Example:
        >>> predicate = mask_mod(causal(), 2, 4)  # queries at indices 2 and 3
        >>> bool(predicate(0, 0, torch.tensor(0), torch.tensor(3)))
        False
    """
    queries, keys, batch, device = _call(mask, query_length, key_length, batch, device, "mask_mod")
    return _built(mask, queries, keys, batch, device)


def _call(
    mask: Mask, query_length: Any, key_length: Any, batch: Any, device: Any, name: str
) -> Any:
    """``(queries, keys, batch, device)`` of a call to ``name``, checked."""
    keys = query_length if key_length is None else key_length
    queries, keys = core.check_call(mask, query_length, keys, names=NAMES)
    device = check_device(device, name) or torch.device("cpu")
    return queries, keys, _batch(mask, batch), device


def _built(mask: Mask, queries: int, keys: int, batch: int, device: Any) -> Any:
    """The predicate of a checked call."""
    # The query's index among the keys as a tensor: a new length is the same program.
    past = torch.tensor(keys - queries, device=device)
    last = torch.tensor(keys - 1, device=device)
    return _predicate(mask, past, last, batch, device)


def _predicate(mask: Mask, past: Tensor, last: Tensor, batch: int, device: Any) -> Any:
    if isinstance(mask, core.AllKeys):
        return lambda b, h, q, k: k <= last
    if isinstance(mask, core.Causal):
        return lambda b, h, q, k: k <= past + q
    if isinstance(mask, core.Window):
        # tensors, not ints: a compiled program reads them (an int would become a symbol)
        window = torch.tensor(mask.window, device=device)
        sinks = torch.tensor(mask.sinks, device=device)
        return lambda b, h, q, k: ((past + q - k).abs() < window) | (k < sinks)
    if isinstance(mask, core.Documents):
        segments = to_tensor(mask.segments, "int64", device).expand(batch, -1)  # (B, S)
        segments = static_length(segments.contiguous())  # (B, N), N >= S
        # (indices clamped: a kernel may evaluate a tile's rows past the last key)
        if batch == 1:  # one row of documents for every batch row
            row = segments[0]
            return lambda b, h, q, k: (
                row[torch.minimum(past + q, last)] == row[torch.minimum(k, last)]
            )
        return lambda b, h, q, k: (
            segments[b, torch.minimum(past + q, last)] == segments[b, torch.minimum(k, last)]
        )
    parts = [_predicate(part, past, last, batch, device) for part in mask.parts]  # type: ignore[attr-defined]
    if isinstance(mask, core.AllOf):
        return lambda b, h, q, k: _fold(parts, b, h, q, k, all_of=True)
    return lambda b, h, q, k: _fold(parts, b, h, q, k, all_of=False)


def _fold(parts: list[Any], b: Tensor, h: Tensor, q: Tensor, k: Tensor, all_of: bool) -> Tensor:
    result = parts[0](b, h, q, k)
    for part in parts[1:]:
        result = result & part(b, h, q, k) if all_of else result | part(b, h, q, k)
    return result  # type: ignore[no-any-return]


def dense_mask(
    mask: Mask, query_length: int, key_length: int | None = None, *,
    batch: int | None = None, device: Any = None,
) -> Tensor:  # fmt: skip
    """``mask`` as a boolean tensor ``(batch, 1, T, S)``, True where a query may attend
    (the batch is 1 unless the documents have one).

    Example:
        >>> dense_mask(causal() & documents(torch.tensor([[1, 1, 2]])), 3).shape
        torch.Size([1, 1, 3, 3])
    """
    queries, keys, batch, device = _call(
        mask, query_length, key_length, batch, device, "dense_mask"
    )
    check_memory(
        _dense_bytes(mask, batch, queries, keys),
        f"a dense mask of {batch} × {queries} × {keys} entries",
        DEFAULT_MAX_BYTES,
        fix="attend through FlexAttention (block_mask(), or MultiHeadAttention's "
        "attn_implementation='flex_attention'), which never forms it",
    )
    predicate = _built(mask, queries, keys, batch, device)
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    q = torch.arange(queries, device=device).view(1, 1, -1, 1)
    k = torch.arange(keys, device=device).view(1, 1, 1, -1)
    dense: Tensor = predicate(b, h, q, k).expand(batch, 1, queries, keys)
    return dense


def _dense_bytes(mask: Mask, batch: int, queries: int, keys: int) -> int:
    """The peak memory of :func:`dense_mask`: per single mask a boolean ``T × S`` (and
    one for combining it), per batch row for documents (read row by row), and a window's
    two int64 temporaries (``|i - j|``); the other masks are the same for every batch
    row, a broadcast and not a copy."""
    per_entry = 0
    for leaf in mask.leaves():
        rows = batch if isinstance(leaf, core.Documents) else 1
        per_entry += rows * (16 if isinstance(leaf, core.Window) else 2)
    return queries * keys * per_entry


def block_mask(
    mask: Mask, query_length: int, key_length: int | None = None, *,
    batch: int | None = None, device: Any = None,
) -> Any:  # fmt: skip
    """``mask`` as a FlexAttention ``BlockMask`` of 128 × 128 tiles: the core plans which
    tiles are empty, full or partial (:func:`posenc.core.masks.block_classes`), and the
    partial ones evaluate :func:`mask_mod` key by key.

    Example:
        >>> block_mask(causal(), 300).to_dense()[0, 0].tolist()  # tiles, not keys
        [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    """
    from torch.nn.attention.flex_attention import BlockMask

    queries, keys, batch, device = _call(
        mask, query_length, key_length, batch, device, "block_mask"
    )
    classes = core.block_classes(mask, queries, keys, query_block=BLOCK, key_block=BLOCK)
    partial = _ordered(classes == PARTIAL, device)
    full = _ordered(classes == FULL, device)
    return BlockMask.from_kv_blocks(
        *partial,
        *full,
        BLOCK_SIZE=BLOCK,
        mask_mod=_built(mask, queries, keys, batch, device),
        seq_lengths=(queries, keys),
    )


def _ordered(tiles: np.ndarray, device: Any) -> tuple[Tensor, Tensor]:
    """FlexAttention's form of a set of tiles ``(B, QB, KB)``: how many per row of query
    tiles, and their key tiles first (``(B, 1, QB)``, ``(B, 1, QB, KB)``, int32)."""
    counts = tiles.sum(axis=-1, dtype=np.int32)[:, None]
    order = np.argsort(~tiles, axis=-1, kind="stable").astype(np.int32)[:, None]
    return to_tensor(counts, "int32", device), to_tensor(order, "int32", device)
