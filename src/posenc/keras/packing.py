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
from ._backend import INT32_END, known_value

__all__ = [
    "positions_from_attention_mask",
    "positions_from_cu_seqlens",
    "positions_from_document_ids",
]


def _known(function: Callable[[Any], np.ndarray], value: Any, name: str) -> Any:
    """``function`` of ``value`` (a list, a NumPy array or a tensor known now) as an int32
    tensor, the dtype of the Keras layers' positions."""
    if keras.backend.is_keras_tensor(value) or ops.is_tensor(value):
        known = known_value(value)
        if known is None:
            raise TypeError(
                f"{name} must be a tensor whose values are known when the call runs (not "
                "traced or symbolic: its values decide the output's shape)"
            )
        value = known
    result = function(value)
    if result.size and int(result.max()) >= INT32_END:
        raise ValueError(f"positions up to {int(result.max())} do not fit int32")
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
