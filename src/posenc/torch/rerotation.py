"""Cached keys of RoPE moved to new frequencies or positions: what a KV cache asks of RoPE.

The functions behind :class:`~posenc.torch.RotaryEmbedding`'s part of the
:class:`~posenc.torch.protocols.CachedKeyRotation` role, which a
:class:`~posenc.torch.KVCache` uses, over the module's spec and ``qk_layout``: which
frequencies a call of a given length uses, the keys rotated from scratch with them
(``"recompute"``), and keys already rotated turned by the difference (``"rerotate"``:
:func:`posenc.core.rope.rerotation_table_values`, exact angles, one rounding). Nothing
here derives a formula: the frequencies and tables come from the spec.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._checks import check_int, describe
from ..core.plan import plan_scaling
from ..specs import RopeSpec
from ._arguments import QK_AXES, check_position_tensor
from ._backend import format_of, to_tensor
from ._tables import eager_only, table_dtype
from .rotation import broadcast_tables, rotate

__all__ = ["frequency_state", "rerotate_keys", "rotate_keys"]


def frequency_state(spec: RopeSpec, length: int) -> int | None:
    """The frequencies a call reaching ``length`` positions uses, named by the length
    whose frequencies they are (``None``: those of construction); two calls with the
    same state rotate alike (:func:`posenc.core.plan.plan_scaling`).

    Example:
        >>> spec = RopeSpec(head_dim=8, scaling={"rope_type": "dynamic", "factor": 2.0,
        ...                                      "original_max_position_embeddings": 16})
        >>> frequency_state(spec, 16), frequency_state(spec, 17)
        (None, 17)
    """
    length = check_int(length, "length", minimum=0)
    return plan_scaling(spec.scaling, length).seq_len


@eager_only  # NumPy: never traced
def rotate_keys(
    spec: RopeSpec,
    qk_layout: str,
    keys: Tensor,
    positions: Tensor | None,
    frequencies: int | None,
    name: str,
) -> Tensor:
    """Keys before rotation (in ``qk_layout``), rotated at ``positions`` with the
    frequencies of the state ``frequencies`` (:func:`frequency_state`): what a call
    rotating them there gives."""
    at = _key_positions(keys, positions, qk_layout, name)
    fmt = format_of(table_dtype(keys.dtype, "rotation"))
    cos, sin = spec.tables(at, fmt=fmt, seq_len=frequencies)
    tables = to_tensor(cos, fmt, keys.device), to_tensor(sin, fmt, keys.device)
    cos_t, sin_t = broadcast_tables(tables, qk_layout, keys.device)
    return rotate(keys, cos_t, sin_t, spec.layout, rotary_width(spec))


@eager_only
def rerotate_keys(
    spec: RopeSpec,
    qk_layout: str,
    keys: Tensor,
    positions: Tensor | None,
    new_positions: Tensor | None,
    frequencies: int | None,
    new_frequencies: int | None,
    name: str,
) -> Tensor:
    """Keys rotated at ``positions`` with the frequencies of the state ``frequencies``,
    turned to ``new_positions`` (``None``: the same) and the state ``new_frequencies``,
    the attention factor's change included: the same keys, within one rounding, as
    :func:`rotate_keys` there would give from the keys before rotation."""
    old = _key_positions(keys, positions, qk_layout, name)
    new = old if new_positions is None else _key_positions(keys, new_positions, qk_layout, name)
    if old.shape != new.shape:
        old, new = np.broadcast_arrays(old, new)
    fmt = format_of(table_dtype(keys.dtype, "rotation"))
    cos, sin = spec.rerotation(
        old.reshape(-1),
        new.reshape(-1),
        seq_len=frequencies,
        new_seq_len=new_frequencies,
        fmt=fmt,
    )
    shape = (*old.shape, rotary_width(spec))
    tables = (
        to_tensor(cos.reshape(shape), fmt, keys.device),
        to_tensor(sin.reshape(shape), fmt, keys.device),
    )
    cos_t, sin_t = broadcast_tables(tables, qk_layout, keys.device)
    return rotate(keys, cos_t, sin_t, spec.layout, rotary_width(spec))


def rotary_width(spec: RopeSpec) -> int:
    """``spec.rotary_dim``, an int (the spec stores it resolved)."""
    assert spec.rotary_dim is not None
    return spec.rotary_dim


def _key_positions(keys: Any, positions: Any, qk_layout: str, name: str) -> np.ndarray:
    """The keys' positions as int64 NumPy ``(seq,)`` or ``(batch, seq)``."""
    if not isinstance(keys, Tensor) or keys.dim() != 4 or not keys.is_floating_point():
        raise TypeError(
            f"{name}: keys must be a floating 4-D tensor in qk_layout={qk_layout!r}, "
            f"got {describe(keys)}"
        )
    seq = keys.shape[QK_AXES[qk_layout].index("seq")]
    if positions is None:
        return np.arange(seq, dtype=np.int64)
    check_position_tensor(
        positions, keys.shape[0], seq, name, of="keys", fractional="posenc.core.rope"
    )
    at: np.ndarray = positions.detach().to("cpu", torch.int64).numpy()
    if at.size and at.min() < 0:
        raise ValueError(f"{name}: positions must be >= 0, got {int(at.min())}")
    return at
