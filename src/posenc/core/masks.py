"""Attention masks as descriptions, and the blocks of the score matrix each one leaves.

A mask says which keys each query may see. Masks are described here, framework-free,
and combined with ``&`` (both must allow a key) and ``|`` (either may):

==================  ====================================================================
:class:`AllKeys`    every key
:class:`Causal`     key index ``j <= i``, the query's own index among the keys
:class:`Window`     ``|i - j| < window``, or ``j < sinks`` (the first keys stay visible)
:class:`Documents`  ``j`` in the query's own document (packed sequences)
==================  ====================================================================

Indices follow the attention's keys: the keys are ``0 .. S-1`` in the order held (a KV
cache's order), and the ``T`` queries of a call are the last ``T`` of them, so query
``q`` has index ``i = past + q`` with ``past = S - T`` (the one convention of
:func:`posenc.core.plan.align_queries`).

:func:`block_classes` is the planning step of a block-sparse attention (FlexAttention's
block masks): which ``(query block, key block)`` tiles are empty (skipped), full (no
mask to evaluate) or partial (evaluated key by key). It works on block bounds and never
forms the ``T × S`` matrix, so it costs ``(T/128)·(S/128)`` entries at any length.
A tile is called full or empty only when it is; a combination may call partial a tile
that is in fact full or empty (correct, only slower); a tile that reaches past ``T`` or
``S`` is never full, as in PyTorch's own ``create_block_mask``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._checks import DEFAULT_MAX_BYTES, check_int, check_memory, describe
from .packing import positions_from_cu_seqlens, positions_from_document_ids

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "AllOf",
    "AnyOf",
    "Causal",
    "Documents",
    "Mask",
    "Window",
    "block_classes",
    "check_call",
    "segments_from_cu_seqlens",
    "segments_from_document_ids",
]

#: Classes of a tile: no key visible, some, all.
EMPTY, PARTIAL, FULL = 0, 1, 2

#: The largest window or count of sinks: int64's largest value, the index type of the
#: kernels that evaluate a mask (a window this wide already holds every key).
MAX_INDEX = 2**63 - 1


def segments_from_document_ids(document_ids: Any) -> np.ndarray:
    """The document of every token, numbered ``0, 1, ..`` along each row.

    A document is a run of equal ids, as in
    :func:`posenc.core.packing.positions_from_document_ids` (ids need not increase or
    be distinct across runs), so two runs of the same id are two documents.

    Args:
        document_ids: ``(seq,)`` or ``(batch, seq)`` integers.

    Returns:
        int64, the shape of ``document_ids``, non-decreasing along each row.

    Example:
        >>> segments_from_document_ids([7, 7, 2, 2, 2, 7]).tolist()
        [0, 0, 1, 1, 1, 2]
    """
    return _numbered(positions_from_document_ids(document_ids))


def segments_from_cu_seqlens(cu_seqlens: Any) -> np.ndarray:
    """The sequence of every token of a packed row, from FlashAttention's ``cu_seqlens``.

    Args:
        cu_seqlens: ``[0, n₁, n₁+n₂, ...]``, as for
            :func:`posenc.core.packing.positions_from_cu_seqlens`.

    Returns:
        int64 ``(cu_seqlens[-1],)``, the sequences numbered ``0, 1, ..`` in order (an
        empty sequence has no token, and no number).

    Example:
        >>> segments_from_cu_seqlens([0, 2, 2, 5]).tolist()
        [0, 0, 1, 1, 1]
    """
    return _numbered(positions_from_cu_seqlens(cu_seqlens))


def _numbered(positions: np.ndarray) -> np.ndarray:
    """Each token's document from positions that restart at 0 with each document."""
    numbers: np.ndarray = np.cumsum(positions == 0, axis=-1) - 1
    return numbers


class Mask(ABC):
    """A description of which keys each query may see; combine with ``&`` and ``|``."""

    def __and__(self, other: Mask) -> Mask:
        return AllOf((self, _mask(other, "&")))

    def __or__(self, other: Mask) -> Mask:
        return AnyOf((self, _mask(other, "|")))

    @abstractmethod
    def classes(self, bounds: _Bounds) -> np.ndarray:
        """The class of every tile, ``(batch or 1, query blocks, key blocks)`` int8."""

    def leaves(self) -> tuple[Mask, ...]:
        """The single masks this one is made of (itself for a single one)."""
        parts: tuple[Mask, ...] = getattr(self, "parts", ())
        return tuple(leaf for part in parts for leaf in part.leaves()) if parts else (self,)


def _mask(value: Any, operator: str) -> Mask:
    if not isinstance(value, Mask):
        raise TypeError(f"a mask combines with {operator} only with another mask, got "
                        f"{describe(value)}")  # fmt: skip
    return value


@dataclass(frozen=True)
class AllKeys(Mask):
    """A query sees every key (a mask that hides nothing, for kernels that need one)."""

    def classes(self, bounds: _Bounds) -> np.ndarray:
        i0, _, j0, _ = bounds.grid()
        return np.full((1, i0.shape[1], j0.shape[2]), FULL, dtype=np.int8)


@dataclass(frozen=True)
class Causal(Mask):
    """A query sees the keys up to its own index."""

    def classes(self, bounds: _Bounds) -> np.ndarray:
        i0, i1, j0, j1 = bounds.grid()
        return _tiles(j1 <= i0, j0 > i1)


@dataclass(frozen=True)
class Window(Mask):
    """A query sees the keys less than ``window`` indices away, and the first ``sinks``.

    Combined with :class:`Causal`, the sliding window of Mistral and Gemma (``window``
    keys up to the query's own), with attention sinks (StreamingLLM) when ``sinks > 0``.

    Args:
        window: Keys at ``|i - j| < window`` are visible, an int from 1 to
            ``2**63 - 1`` (int64's largest).
        sinks: The keys ``0 .. sinks-1`` are visible to every query, an int from 0 to
            ``2**63 - 1``.
    """

    window: int
    sinks: int = 0

    def __post_init__(self) -> None:
        window = check_int(self.window, "window", minimum=1, maximum=MAX_INDEX)
        sinks = check_int(self.sinks, "sinks", minimum=0, maximum=MAX_INDEX)
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "sinks", sinks)

    def classes(self, bounds: _Bounds) -> np.ndarray:
        i0, i1, j0, j1 = bounds.grid()
        near = _tiles((i1 - j0 < self.window) & (j1 - i0 < self.window),
                      (i0 - j1 >= self.window) | (j0 - i1 >= self.window))  # fmt: skip
        sink = _tiles(j1 < self.sinks, j0 >= self.sinks)
        classes: np.ndarray = np.maximum(near, sink)
        return classes


@dataclass(frozen=True, eq=False)
class Documents(Mask):
    """A query sees the keys of its own document.

    Args:
        segments: ``(batch, S)`` int64, each key's document, non-decreasing along a row
            (:func:`segments_from_document_ids`, :func:`segments_from_cu_seqlens`); a
            query's document is that of its own index.
    """

    segments: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        segments = np.asarray(self.segments)
        if segments.dtype.kind not in "iu" or segments.ndim not in (1, 2):
            raise TypeError(
                f"segments must be integers of shape (S,) or (batch, S), got {describe(segments)}"
            )
        segments = segments.astype(np.int64)
        segments = segments[None] if segments.ndim == 1 else segments
        if not segments.size:
            raise ValueError(
                "documents need at least one key, got segments of shape "
                f"{segments.shape} (no document ids, or cu_seqlens that end at 0)"
            )
        if segments.shape[1] > 1 and np.any(np.diff(segments, axis=1) < 0):
            raise ValueError(
                "segments must be non-decreasing along each row (number the documents "
                "with segments_from_document_ids or segments_from_cu_seqlens)"
            )
        object.__setattr__(self, "segments", segments)

    def classes(self, bounds: _Bounds) -> np.ndarray:
        # Numbers are consecutive and non-decreasing: two tiles share a document when
        # their ranges overlap, and a tile is full when both hold one and the same.
        lo_q, hi_q = _block_range(self.segments[:, bounds.past :], bounds.query_block)
        lo_k, hi_k = _block_range(self.segments, bounds.key_block)
        lo_q, hi_q = lo_q[:, :, None], hi_q[:, :, None]  # (B, QB, 1)
        lo_k, hi_k = lo_k[:, None, :], hi_k[:, None, :]  # (B, 1, KB)
        full = (lo_q == hi_q) & (lo_k == hi_k) & (lo_q == lo_k)
        return _tiles(full, (hi_q < lo_k) | (hi_k < lo_q))


@dataclass(frozen=True)
class AllOf(Mask):
    """A key is visible when every part allows it."""

    parts: tuple[Mask, ...]

    def classes(self, bounds: _Bounds) -> np.ndarray:
        return _combine(np.minimum, self.parts, bounds)


@dataclass(frozen=True)
class AnyOf(Mask):
    """A key is visible when some part allows it."""

    parts: tuple[Mask, ...]

    def classes(self, bounds: _Bounds) -> np.ndarray:
        return _combine(np.maximum, self.parts, bounds)


def _combine(how: Any, parts: tuple[Mask, ...], bounds: _Bounds) -> np.ndarray:
    result = parts[0].classes(bounds)
    for part in parts[1:]:
        result = how(result, part.classes(bounds))  # broadcasts a batch of 1
    return result


def _tiles(full: np.ndarray, empty: np.ndarray) -> np.ndarray:
    """The tiles' classes from where every key and where no key is visible."""
    return np.where(full, FULL, np.where(empty, EMPTY, PARTIAL)).astype(np.int8)


def _block_range(values: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Least and greatest value of every block of ``block`` columns, ``(B, blocks)``."""
    batch, length = values.shape
    blocks = -(-length // block)
    padded = np.pad(values, ((0, 0), (0, blocks * block - length)), mode="edge")
    tiles = padded.reshape(batch, blocks, block)
    return tiles.min(axis=2), tiles.max(axis=2)


@dataclass(frozen=True)
class _Bounds:
    """The first and last query and key index of every tile of a call."""

    queries: int
    keys: int
    past: int
    query_block: int
    key_block: int

    def grid(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(i0, i1, j0, j1)``: query indices ``(1, QB, 1)``, key indices ``(1, 1, KB)``."""
        q0 = np.arange(0, self.queries, self.query_block, dtype=np.int64)
        q1 = np.minimum(q0 + self.query_block, self.queries) - 1
        j0 = np.arange(0, self.keys, self.key_block, dtype=np.int64)
        j1 = np.minimum(j0 + self.key_block, self.keys) - 1
        shape_q, shape_k = (1, -1, 1), (1, 1, -1)
        return (
            (q0 + self.past).reshape(shape_q),
            (q1 + self.past).reshape(shape_q),
            j0.reshape(shape_k),
            j1.reshape(shape_k),
        )


def check_call(
    mask: Any, queries: Any, keys: Any, *, names: tuple[str, str] = ("queries", "keys")
) -> tuple[int, int]:
    """The one check of a mask for an attention of ``queries`` over ``keys``, which every
    path that evaluates a mask passes (:func:`block_classes`, and the front ends' dense
    masks and mask functions).

    Args:
        mask: A :class:`Mask`.
        queries: ``T``, an int >= 1; they are the last ``T`` keys.
        keys: ``S``, an int >= ``T``.
        names: What the caller calls ``queries`` and ``keys``, for its messages.

    Returns:
        ``(queries, keys)`` as ints.

    Raises:
        TypeError: ``mask`` is not a :class:`Mask`, or a size not an int.
        ValueError: A size out of range, or documents that do not give the document of
            every key (a mask never guesses the documents of keys it was not given).

    Example:
        >>> check_call(Causal() & Documents(np.array([0, 0, 1])), 2, 3)
        (2, 3)
        >>> try:
        ...     check_call(Documents(np.array([0, 0, 1])), 1, 5)
        ... except ValueError as error:
        ...     print(str(error).split(":")[0])
        the documents cover 3 keys, the attention has 5
    """
    if not isinstance(mask, Mask):
        raise TypeError(
            "mask must be a posenc mask (causal(), sliding_window(), documents() or a "
            f"combination with & and |), got {describe(mask)}"
        )
    query_name, key_name = names
    queries = check_int(queries, query_name, minimum=1)
    keys = check_int(keys, key_name, minimum=1)
    if keys < queries:
        raise ValueError(
            f"{key_name} must be at least {query_name} (the queries are the last keys), "
            f"got {keys} keys for {queries} queries"
        )
    for leaf in mask.leaves():
        covered = leaf.segments.shape[1] if isinstance(leaf, Documents) else keys
        if covered != keys:
            raise ValueError(
                f"the documents cover {covered} keys, the attention has {keys}: give the "
                "document of every key (the queries take their own keys')"
            )
    return queries, keys


def block_classes(
    mask: Mask,
    queries: int,
    keys: int,
    *,
    query_block: int = 128,
    key_block: int = 128,
) -> np.ndarray:
    """The class of every tile of a ``queries × keys`` score matrix under ``mask``.

    Args:
        mask: A :class:`Mask`.
        queries: ``T``, the call's queries, an int >= 1; they are the last ``T`` keys.
        keys: ``S >= T``, the keys.
        query_block, key_block: Tile sizes (128, FlexAttention's).

    Returns:
        int8 ``(batch or 1, ceil(T / query_block), ceil(S / key_block))`` of
        :data:`EMPTY`, :data:`PARTIAL`, :data:`FULL`.

    Example:
        >>> block_classes(Causal(), 4, 4, query_block=2, key_block=2)[0].tolist()
        [[1, 0], [2, 1]]
    """
    queries, keys = check_call(mask, queries, keys)
    query_block = check_int(query_block, "query_block", minimum=1)
    key_block = check_int(key_block, "key_block", minimum=1)
    tiles = -(-queries // query_block) * -(-keys // key_block)
    check_memory(8 * tiles, f"the classes of {tiles} tiles", DEFAULT_MAX_BYTES,
                 fix="use larger blocks")  # fmt: skip
    bounds = _Bounds(queries, keys, keys - queries, query_block, key_block)
    classes = np.array(mask.classes(bounds), dtype=np.int8)  # a copy of our own
    # a tile reaching past the last query or key holds positions that do not exist
    if queries % query_block:
        classes[:, -1, :] = np.minimum(classes[:, -1, :], PARTIAL)
    if keys % key_block:
        classes[:, :, -1] = np.minimum(classes[:, :, -1], PARTIAL)
    return classes
