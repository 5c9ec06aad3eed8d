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
from ._backend import is_traced

__all__ = [
    "positions_from_attention_mask",
    "positions_from_cu_seqlens",
    "positions_from_document_ids",
]


def _concrete(function: Callable[[Any], np.ndarray], value: Any, name: str) -> jax.Array:
    if is_traced(value):
        raise TypeError(
            f"{name} is traced (inside jax.jit): its values decide the output's shape; "
            "compute the positions outside the traced function"
        )
    result: jax.Array = jax.numpy.asarray(function(np.asarray(value)))  # int32 without x64
    return result


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
