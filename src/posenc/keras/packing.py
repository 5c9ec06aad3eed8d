"""Position ids of packed and padded batches as backend tensors: :mod:`posenc.core.packing`
on values known when the call runs (the values decide the shapes: not inside
``tf.function``, ``jax.jit`` or a symbolic model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from keras import ops

from ..core import packing
from ._arguments import INT32_END
from ._backend import known_value

__all__ = [
    "mrope_positions",
    "positions_from_attention_mask",
    "positions_from_cu_seqlens",
    "positions_from_document_ids",
]


def _known(function: Callable[[Any], np.ndarray], value: Any, name: str) -> Any:
    """``function`` of ``value`` (a list, a NumPy array or a tensor known now) as an int32
    tensor, the dtype of the Keras layers' positions."""
    return _int32(function(_plain(value, name)), name)


def _plain(value: Any, name: str) -> Any:
    """A tensor's value known now (NumPy, its dtype kept); anything else as it is."""
    if keras.backend.is_keras_tensor(value) or ops.is_tensor(value):
        known = known_value(value)
        if known is None:
            raise TypeError(
                f"{name} must be a tensor whose values are known when the call runs (not "
                "traced or symbolic: its values decide the output's shape)"
            )
        return known
    return value


def _int32(result: np.ndarray, name: str) -> Any:
    if result.size and int(np.abs(result).max()) >= INT32_END:
        raise ValueError(
            f"the positions of {name} reach {int(np.abs(result).max())}, past int32 (the "
            "Keras layers' position dtype): give smaller values"
        )
    return ops.convert_to_tensor(result.astype(np.int32))


def positions_from_cu_seqlens(cu_seqlens: Any) -> Any:
    """int32 positions of packed sequences; see
    :func:`posenc.core.packing.positions_from_cu_seqlens`.

    Example:
        >>> from keras import ops
        >>> ops.convert_to_numpy(positions_from_cu_seqlens([0, 2, 5])).tolist()
        [0, 1, 0, 1, 2]
    """
    return _known(packing.positions_from_cu_seqlens, cu_seqlens, "cu_seqlens")


def positions_from_document_ids(document_ids: Any) -> Any:
    """int32 positions restarting at each new document; see
    :func:`posenc.core.packing.positions_from_document_ids`.

    Example:
        >>> from keras import ops
        >>> ops.convert_to_numpy(positions_from_document_ids([[4, 4, 1]])).tolist()
        [[0, 1, 0]]
    """
    return _known(packing.positions_from_document_ids, document_ids, "document_ids")


def positions_from_attention_mask(attention_mask: Any) -> Any:
    """int32 positions of a padded batch (the Keras layers' position dtype); see
    :func:`posenc.core.packing.positions_from_attention_mask`.

    Example:
        >>> from keras import ops
        >>> ops.convert_to_numpy(positions_from_attention_mask([[0, 1, 1]])).tolist()
        [[0, 0, 1]]
    """
    return _known(packing.positions_from_attention_mask, attention_mask, "attention_mask")


def mrope_positions(token_types: Any, **options: Any) -> tuple[Any, Any]:
    """int32 M-RoPE positions ``(3, batch, seq)`` and deltas ``(batch, 1)`` of Qwen2-VL,
    Qwen2.5-VL and Qwen3-VL; ``options``: the grids and options of
    :func:`posenc.core.packing.mrope_positions` (known tensors, arrays or lists).

    Example:
        >>> from keras import ops
        >>> positions, deltas = mrope_positions([[0, 1, 1, 1, 1, 0]], image_grids=[[1, 4, 4]])
        >>> ops.convert_to_numpy(positions)[:, 0, -1].tolist()
        [3, 3, 3]
        >>> ops.convert_to_numpy(deltas).tolist()
        [[-2]]
    """
    plain = {name: _plain(value, name) for name, value in options.items()}
    positions, deltas = packing.mrope_positions(_plain(token_types, "token_types"), **plain)
    what = "token_types and the grids, tokens_per_second and second_per_grid_ts"
    return _int32(positions, what), _int32(deltas, what)
