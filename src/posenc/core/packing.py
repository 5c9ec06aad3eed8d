"""Position ids of packed and padded batches: from ``cu_seqlens``, document ids, a mask.

Packed training concatenates documents into one row, and each document's positions
restart at 0; left-padded generation starts each row's positions at its first real
token. These functions give the position ids such inputs need, as the common tools
define them (tested against ``transformers``' ``DataCollatorWithFlattening`` and
``GenerationMixin``): integer NumPy arrays, int64.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .._checks import (
    DEFAULT_MAX_BYTES,
    check_bool,
    check_int,
    check_memory,
    check_positive,
    describe,
    real_array,
)

__all__ = [
    "mrope_positions",
    "positions_from_attention_mask",
    "positions_from_cu_seqlens",
    "positions_from_document_ids",
]


def _integers(value: Any, name: str, ndims: tuple[int, ...], *, bools: bool = False) -> np.ndarray:
    """``value`` as an int64 array with one of ``ndims`` dimensions (``bools``: True and
    False read as 1 and 0, for a mask)."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of integers, got {describe(value)}") from exc
    if array.size == 0 and array.dtype.kind == "f":  # [] reads as float64
        array = array.astype(np.int64)
    if bools and array.dtype == np.bool_:
        array = array.astype(np.int64)
    if array.dtype == np.bool_ or array.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {describe(array)}")
    if array.ndim not in ndims:
        shapes = " or ".join({1: "(n,)", 2: "(batch, seq)"}[n] for n in ndims)
        raise ValueError(f"{name} must have shape {shapes}, got shape {array.shape}")
    if array.dtype == np.uint64 and array.size and int(array.max()) >= 2**63:
        raise ValueError(f"{name} must fit int64, got {int(array.max())}")
    return array.astype(np.int64)


def positions_from_cu_seqlens(cu_seqlens: Any) -> np.ndarray:
    """Positions of packed sequences from their cumulative lengths.

    Args:
        cu_seqlens: ``[0, n₁, n₁+n₂, ...]`` (FlashAttention's ``cu_seqlens``), 1-D,
            starting at 0 and non-decreasing (an empty sequence is allowed).

    Returns:
        int64 ``(cu_seqlens[-1],)``: ``0 .. n₁-1, 0 .. n₂-1, ...``.

    Example:
        >>> positions_from_cu_seqlens([0, 3, 7, 8]).tolist()
        [0, 1, 2, 0, 1, 2, 3, 0]
    """
    cu = _integers(cu_seqlens, "cu_seqlens", (1,))
    if cu.size == 0 or cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[:3].tolist()}...")
    lengths = np.diff(cu)
    if np.any(lengths < 0):
        at = int(np.flatnonzero(lengths < 0)[0])
        raise ValueError(
            f"cu_seqlens must be non-decreasing, got {int(cu[at])} then {int(cu[at + 1])}"
        )
    total = int(cu[-1])
    check_memory(  # the positions, the ramp and the repeated starts: int64 each
        3 * 8 * total,
        f"the {total} positions of cu_seqlens ending at {total}",
        DEFAULT_MAX_BYTES,
        fix="check cu_seqlens (its last entry is the number of tokens)",
    )
    positions: np.ndarray = np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1], lengths)
    return positions


def positions_from_document_ids(document_ids: Any) -> np.ndarray:
    """Positions that restart at 0 wherever the document id changes.

    Args:
        document_ids: Per-token document (or sequence) ids, ``(seq,)`` or
            ``(batch, seq)``; a document is a run of equal ids (the ids need not be
            increasing or distinct across runs).

    Returns:
        int64, the shape of ``document_ids``.

    Example:
        >>> positions_from_document_ids([[7, 7, 7, 2, 2, 9], [0, 0, 0, 0, 1, 1]]).tolist()
        [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    """
    ids = _integers(document_ids, "document_ids", (1, 2))
    rows = ids[None] if ids.ndim == 1 else ids
    seq = rows.shape[1]
    index = np.broadcast_to(np.arange(seq, dtype=np.int64), rows.shape)
    starts = np.ones(rows.shape, dtype=bool)
    starts[:, 1:] = rows[:, 1:] != rows[:, :-1]
    first = np.maximum.accumulate(np.where(starts, index, 0), axis=1)  # each run's start
    return (index - first).reshape(ids.shape)


def positions_from_attention_mask(attention_mask: Any) -> np.ndarray:
    """Positions of a padded batch: each row counts its real tokens from 0.

    As ``transformers``' generation: ``cumsum(mask) - 1`` along the sequence, with the
    padding positions set to 0 (left padding: the first real token is position 0).

    Args:
        attention_mask: ``(batch, seq)`` of 0 (padding) and 1 (token), ints or bools.

    Returns:
        int64 ``(batch, seq)``.

    Example:
        >>> positions_from_attention_mask([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]).tolist()
        [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    """
    mask = _integers(attention_mask, "attention_mask", (2,), bools=True)
    if np.any((mask != 0) & (mask != 1)):
        bad = int(mask[(mask != 0) & (mask != 1)][0])
        raise ValueError(f"attention_mask must hold 0 and 1 only, got {bad}")
    positions = np.cumsum(mask, axis=1) - 1
    positions[mask == 0] = 0
    return positions


def mrope_positions(
    token_types: Any,
    *,
    image_grids: Any = None,
    video_grids: Any = None,
    spatial_merge_size: int = 2,
    tokens_per_second: float | None = None,
    second_per_grid_ts: Any = None,
    split_video_frames: bool = False,
    attention_mask: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """M-RoPE position ids of text and vision tokens (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), and
    their deltas.

    Text tokens advance one position on all three axes (time, height, width); an image
    or video of ``(T, H, W)`` patches is ``T·(H/m)·(W/m)`` tokens at
    ``start + (t·s, h, w)``, after which the next token starts at ``start + max(H, W)/m``
    (``m``: the spatial merge size; ``s``: the time step, 1 for images). As
    ``transformers``' ``get_rope_index`` of the three models (installed version 5), chosen
    by the arguments:

    - Qwen2-VL: the defaults (``s = 1``).
    - Qwen2.5-VL: ``tokens_per_second`` from the vision config and the processor's
      ``second_per_grid_ts``; a video's time positions are ``⌊t · tokens_per_second ·
      seconds⌋``, the product rounded as the reference rounds it: in float64 when
      ``second_per_grid_ts`` is a float64 array, else in float32 (a list: what
      ``torch.tensor`` makes of it).
    - Qwen3-VL: ``split_video_frames=True``: the model puts a timestamp between a video's
      frames, so each frame is its own run of tokens, a video grid ``(T, H, W)`` standing
      for ``T`` grids ``(1, H, W)``.

    Padding (``attention_mask`` 0) gets position 0 on every axis.

    Args:
        token_types: ``(batch, seq)`` ints: 0 text, 1 image, 2 video.
        image_grids, video_grids: ``(count, 3)`` ``(T, H, W)`` of each image/video, in
            the order they appear (row by row through the batch).
        spatial_merge_size: ``m`` (2 in all three models).
        tokens_per_second: Time positions per second of video (Qwen2.5-VL), or ``None``:
            one per frame.
        second_per_grid_ts: ``(videos,)`` seconds per temporal grid step of each video
            (with ``tokens_per_second``; ``None``: 1 second each).
        split_video_frames: Each video frame a run of its own (Qwen3-VL).
        attention_mask: ``(batch, seq)`` of 0 and 1, or ``None``.

    Returns:
        ``(positions, deltas)``: int64 ``(3, batch, seq)`` and ``(batch, 1)``, where
        ``delta = max position + 1 - tokens`` (added to the positions of generated
        tokens).

    Example:
        >>> positions, deltas = mrope_positions([[0, 1, 1, 1, 1, 0]], image_grids=[[1, 4, 4]])
        >>> positions[:, 0].tolist(), deltas.tolist()
        ([[0, 1, 1, 1, 1, 3], [0, 1, 1, 2, 2, 3], [0, 1, 2, 1, 2, 3]], [[-2]])
        >>> video, _ = mrope_positions([[2, 2]], video_grids=[[2, 2, 2]], tokens_per_second=2,
        ...                            second_per_grid_ts=[0.75])
        >>> video[0, 0].tolist()  # t = 0, 1 at 0 and 1.5 seconds
        [0, 1]
    """
    types = _integers(token_types, "token_types", (2,))
    if np.any((types < 0) | (types > 2)):
        raise ValueError("token_types must hold 0 (text), 1 (image) and 2 (video) only")
    merge = _check_merge(spatial_merge_size)
    split = check_bool(split_video_frames, "split_video_frames")
    videos = _grids(video_grids, "video_grids", merge)
    steps = _time_steps(tokens_per_second, second_per_grid_ts, len(videos))
    timed: Iterable[tuple[int, int, int, Any]] = [
        (*grid, step) for grid, step in zip(videos, steps, strict=True)
    ]
    if split:  # T frames of (1, H, W), each at the video's time step (drawn as needed:
        # a mistyped T of 10**12 must not become a list of 10**12 frames)
        timed = ((1, h, w, step) for t, h, w, step in timed for _ in range(t))
    grids = {
        1: iter([(*grid, None) for grid in _grids(image_grids, "image_grids", merge)]),
        2: iter(timed),
    }
    batch, seq = types.shape
    mask = np.ones((batch, seq), dtype=bool)
    if attention_mask is not None:
        positions_from_attention_mask(attention_mask)  # its checks: 2-D, 0 and 1 only
        mask = np.asarray(attention_mask) != 0
        if mask.shape != types.shape:
            raise ValueError(
                f"attention_mask has shape {mask.shape}, token_types {types.shape}; they must match"
            )
    positions = np.zeros((3, batch, seq), dtype=np.int64)
    deltas = np.zeros((batch, 1), dtype=np.int64)
    for row in range(batch):
        kinds = types[row][mask[row]]
        if kinds.size:
            ids = _row_positions(kinds, grids, merge, split)
            positions[:, row, mask[row]] = ids
            deltas[row, 0] = int(ids.max()) + 1 - kinds.size
    for kind, name in ((1, "image_grids"), (2, "video_grids")):
        if next(grids[kind], None) is not None:  # a grid no run of tokens took: a mismatch
            what = "image" if kind == 1 else "video"
            frames = " (or frames, with split_video_frames=True)" if kind == 2 and split else ""
            raise ValueError(
                f"{name} has more grids{frames} than token_types has runs of {what} tokens "
                f"(type {kind}); give one grid per {what}, in the order they appear"
            )
    return positions, deltas


def _row_positions(kinds: np.ndarray, grids: dict[int, Any], merge: int, split: bool) -> np.ndarray:
    """``(3, len(kinds))`` M-RoPE positions of one row's tokens (padding removed)."""
    parts, current, start = [], 0, 0
    while start < kinds.size:
        kind = int(kinds[start])
        stop = start + 1
        while stop < kinds.size and kinds[stop] == kind:
            stop += 1
        if kind == 0:  # text: one step on every axis
            parts.append(np.stack([np.arange(stop - start) + current] * 3))
            current += stop - start
        else:
            what = "image" if kind == 1 else "video"
            t, h, w, step = next(grids[kind], (0, 0, 0, None))
            if t * h * w != stop - start:
                frames = f", split_video_frames={split}" if kind == 2 else ""
                raise ValueError(
                    f"a run of {stop - start} {what} tokens does not match its grid in "
                    f"{what}_grids: {t} x {h} x {w} tokens with spatial_merge_size={merge}"
                    f"{frames} (0: no grid left)"
                )
            times = np.arange(t)
            if step is not None:  # the product rounded in the step's precision, truncated
                scaled = times.astype(step.dtype) * step
                if scaled.size and not float(scaled[-1]) < 2.0**53:
                    raise ValueError(
                        f"a video's time positions reach {float(scaled[-1]):g}: give smaller "
                        "tokens_per_second or second_per_grid_ts"
                    )
                times = scaled.astype(np.int64)
            axes = np.meshgrid(times, np.arange(h), np.arange(w), indexing="ij")
            parts.append(np.stack([a.reshape(-1) for a in axes]) + current)
            current += max(h, w)
        start = stop
    return np.concatenate(parts, axis=1)


def _time_steps(tokens_per_second: Any, seconds: Any, videos: int) -> list[Any]:
    """Each video's time step ``tokens_per_second · seconds`` (a NumPy float32 or float64
    scalar, the precision the reference computes in), or ``None`` (one per frame)."""
    if tokens_per_second is None:
        if seconds is not None:
            raise ValueError("second_per_grid_ts needs tokens_per_second (Qwen2.5-VL's)")
        return [None] * videos
    rate = check_positive(tokens_per_second, "tokens_per_second")
    if seconds is None:
        seconds = [1.0] * videos
    array = real_array(seconds, "second_per_grid_ts")
    if array.shape != (videos,):
        raise ValueError(
            f"second_per_grid_ts must have shape ({videos},), one per video in video_grids, "
            f"got shape {array.shape}"
        )
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError("second_per_grid_ts must hold finite seconds >= 0")
    # An array's float64 is kept; a list's numbers are float32, as torch.tensor makes them.
    kind = np.float64 if getattr(seconds, "dtype", None) == np.float64 else np.float32
    with np.errstate(over="ignore"):
        steps = [kind(rate) * kind(value) for value in array.tolist()]
    if not all(np.isfinite(step) for step in steps):
        raise ValueError(
            f"tokens_per_second={rate!r} times second_per_grid_ts overflows {kind.__name__}"
        )
    return steps


def _check_merge(value: Any) -> int:
    return check_int(value, "spatial_merge_size", minimum=1, maximum=1 << 16)


def _grids(value: Any, name: str, merge: int) -> list[tuple[int, int, int]]:
    """``(count, 3)`` grids ``(T, H, W)`` as merged ``(T, H/m, W/m)`` tuples."""
    if value is None:
        return []
    array = _integers(value, name, (2,))
    if array.shape[-1] != 3:
        raise ValueError(f"{name} must have shape (count, 3) of (T, H, W), got {array.shape}")
    if np.any(array < 1):
        raise ValueError(f"{name} must hold sizes >= 1")
    if np.any(array[:, 1:] % merge):
        raise ValueError(f"{name}: H and W must be multiples of spatial_merge_size={merge}")
    return [(int(t), int(h) // merge, int(w) // merge) for t, h, w in array]
