"""Position ids of packed and padded batches as JAX arrays: :mod:`posenc.core.packing`
on concrete values (the values decide the shapes: not under ``jax.jit``).

Example:
    >>> import jax.numpy as jnp
    >>> positions_from_document_ids(jnp.array([3, 3, 5, 5, 5])).tolist()
    [0, 1, 0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ..core import packing
from ._backend import _x64_enabled, is_traced

__all__ = [
    "mrope_positions",
    "positions_from_attention_mask",
    "positions_from_cu_seqlens",
    "positions_from_document_ids",
]


def _check_concrete(value: Any, name: str) -> None:
    if is_traced(value):
        raise TypeError(
            f"{name} is traced (inside jax.jit): its values decide the output's shape; "
            "compute the positions outside the traced function"
        )


def _concrete(function: Callable[[Any], np.ndarray], value: Any, name: str) -> jax.Array:
    _check_concrete(value, name)
    return _to_jax(function(_plain(value)), name)


def _to_jax(result: np.ndarray, name: str) -> jax.Array:
    """The core's int64 positions as a JAX array: int32 without x64, so a position past
    int32 is an error rather than a wrapped value."""
    if not _x64_enabled() and result.size:
        largest = int(np.abs(result).max())
        if largest >= 2**31:
            raise ValueError(
                f"the positions of {name} reach {largest}, past int32 (JAX's integer without "
                "jax_enable_x64): enable x64 or give smaller values"
            )
    converted: jax.Array = jax.numpy.asarray(result)
    return converted


def positions_from_cu_seqlens(cu_seqlens: Any) -> jax.Array:
    """Positions of packed sequences; see :func:`posenc.core.packing.positions_from_cu_seqlens`.

    Example:
        >>> positions_from_cu_seqlens(jax.numpy.array([0, 2, 5])).tolist()
        [0, 1, 0, 1, 2]
    """
    return _concrete(packing.positions_from_cu_seqlens, cu_seqlens, "cu_seqlens")


def positions_from_document_ids(document_ids: Any) -> jax.Array:
    """Positions restarting at each new document; see
    :func:`posenc.core.packing.positions_from_document_ids`.

    Example:
        >>> positions_from_document_ids(jax.numpy.array([[4, 4, 1]])).tolist()
        [[0, 1, 0]]
    """
    return _concrete(packing.positions_from_document_ids, document_ids, "document_ids")


def positions_from_attention_mask(attention_mask: Any) -> jax.Array:
    """Positions of a padded batch; see
    :func:`posenc.core.packing.positions_from_attention_mask`.

    Example:
        >>> positions_from_attention_mask(jax.numpy.array([[0, 1, 1]])).tolist()
        [[0, 0, 1]]
    """
    return _concrete(packing.positions_from_attention_mask, attention_mask, "attention_mask")


def mrope_positions(token_types: Any, **options: Any) -> tuple[jax.Array, jax.Array]:
    """M-RoPE positions ``(3, batch, seq)`` and deltas ``(batch, 1)`` of Qwen2-VL,
    Qwen2.5-VL and Qwen3-VL; ``options``: the grids and options of
    :func:`posenc.core.packing.mrope_positions` (concrete arrays or lists).

    Example:
        >>> positions, deltas = mrope_positions(jax.numpy.array([[0, 1, 1, 1, 1, 0]]),
        ...                                     image_grids=[[1, 4, 4]])
        >>> positions[:, 0, -1].tolist(), deltas.tolist()
        ([3, 3, 3], [[-2]])
    """
    for name, value in {"token_types": token_types, **options}.items():
        _check_concrete(value, name)
    plain: dict[str, Any] = {name: _plain(value) for name, value in options.items()}
    positions, deltas = packing.mrope_positions(_plain(token_types), **plain)
    what = "token_types and the grids, tokens_per_second and second_per_grid_ts"
    return _to_jax(positions, what), _to_jax(deltas, what)


def _plain(value: Any) -> Any:
    """A JAX array as NumPy (its dtype kept); anything else as it is."""
    return np.asarray(value) if isinstance(value, jax.Array) else value
