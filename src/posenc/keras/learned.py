"""The Keras 3 layer that adds a trained embedding per position to its input (GPT-2,
BERT). One file for the TensorFlow, JAX and torch backends.

The table is an ordinary trainable weight; the layer reads its rows with the planner's
rows of a table that cannot grow (:func:`._tables.table_rows`): a known call past it is a
``ValueError``, a traced one gives NaN rows there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
from keras import ops

from .._checks import check_int, check_max_length, check_probability, check_weights
from ._arguments import (
    check_float,
    get_initializer,
    output_spec,
    start_position,
)
from ._layer import PositionLayer
from ._tables import table_rows
from .encodings import _dropout_layer

__all__ = ["LearnedPositionalEmbedding"]


@keras.saving.register_keras_serializable(package="posenc")
class LearnedPositionalEmbedding(PositionLayer):
    """Adds a trained embedding per position (GPT-2, BERT), then dropout.

    ``output = dropout(inputs + embeddings[start_index : start_index + seq])``. The weight
    ``embeddings`` of shape ``(max_length, d_model)`` is created in ``build()``, with
    ``d_model`` taken from the input's last axis, and read in the input's dtype (under a
    mixed policy it stays float32 and each value is rounded to the compute dtype).

    Learned embeddings cannot represent a position they were not trained with: a known
    ``start_index + seq > max_length`` is a ``ValueError``, never a wrap-around.

    The layer uses only ``keras.ops`` and runs on the TensorFlow, JAX and torch backends.

    Args:
        max_length: Number of positions, ``0 .. max_length-1`` (int >= 1).
        dropout: Dropout rate applied to the sum, a float in ``[0, 1)``.
        initializer: Initializer of the embeddings (anything
            ``keras.initializers.get`` accepts); ``None`` (default) means
            ``RandomNormal(stddev=0.02)``, as GPT-2.
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        inputs: A floating tensor of shape ``(batch, seq, d_model)``.
        start_index: Position of the first token, a Python int or an integer scalar
            tensor (default 0); for decoding one token at a time with a cache. A value
            known when the call runs (a Python int, or an eager tensor of any integer
            dtype) must lie in ``0 .. 2**31 - 1``, and with a statically known ``seq``
            ``start_index + seq > max_length`` raises ``ValueError``, on every backend.
            When the value or ``seq`` is known only inside a trace (``tf.function``,
            ``jax.jit``, ``torch.compile``, a symbolic model input), the rows are
            gathered and every position outside ``0 .. max_length-1`` gives a row of NaN
            on every backend (never a clamped or wrapped row); wider integer tensors
            saturate to the int32 range, so out-of-range values give NaN rows too.
        training: Whether dropout is active (Keras sets it during ``fit``).

    Returns:
        A tensor of the input's shape and dtype.

    Shapes:
        ``(batch, seq, d_model)`` → ``(batch, seq, d_model)``; weight
        ``(max_length, d_model)``.

    Example:
        >>> import numpy as np
        >>> layer = LearnedPositionalEmbedding(max_length=16)
        >>> out = layer(np.zeros((2, 5, 8), "float32"))
        >>> tuple(out.shape), tuple(layer.embeddings.shape)
        ((2, 5, 8), (16, 8))
        >>> step = layer(np.zeros((2, 1, 8), "float32"), start_index=5)  # the sixth token
        >>> bool(np.all(keras.ops.convert_to_numpy(step)[:, 0] == layer.get_weights()[0][5]))
        True

    References:
        Radford et al., "Language Models are Unsupervised Multitask Learners" (GPT-2),
        2019; Devlin et al., "BERT", NAACL 2019.
    """

    _plain_arguments = ("start_index",)  # checked as Python or NumPy values

    def __init__(
        self,
        max_length: int,
        dropout: float = 0.0,
        initializer: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_length = check_max_length(max_length)
        self.dropout = check_probability(dropout, "dropout")
        if initializer is None:
            initializer = keras.initializers.RandomNormal(mean=0.0, stddev=0.02)
        self.initializer = get_initializer(initializer, "initializer")
        self._dropout_layer = _dropout_layer(self.dropout, self.dtype_policy)
        self.d_model: int | None = None

    def build(self, input_shape: Any) -> None:
        shape = tuple(input_shape)
        if len(shape) != 3:
            raise ValueError(_rank_message(type(self).__name__, shape))
        if shape[-1] is None:
            raise ValueError(
                f"LearnedPositionalEmbedding needs a known last (feature) axis to create its "
                f"weight, got input shape {shape}"
            )
        self.d_model = check_int(shape[-1], "the last axis of the input (d_model)", minimum=1)
        check_weights({"max_length": self.max_length, "d_model": self.d_model}, "the embeddings")
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_length, self.d_model),
            initializer=self.initializer,
            trainable=True,
        )
        if self._dropout_layer is not None:
            self._dropout_layer.build(shape)
        self.built = True

    def call(self, inputs: Any, start_index: Any = 0, training: Any = None) -> Any:
        name = type(self).__name__
        _check_sequence(inputs, self.d_model, name)
        dtype = check_float(inputs.dtype, name, "inputs", _EMBED_HINT)
        seq = ops.shape(inputs)[1]  # an int, or a scalar tensor in a graph with seq None
        start = start_position(start_index, name)
        table = ops.convert_to_tensor(self.embeddings)  # (max_length, d)
        rows = table_rows(table, start, seq, self._too_long(start, seq))  # (seq, d)
        rows = ops.cast(rows, dtype)  # (seq, d)
        outputs = ops.add(inputs, rows)  # (batch, seq, d), rows broadcast over batch
        if self._dropout_layer is not None:
            outputs = self._dropout_layer(outputs, training=training)
        return outputs

    def _too_long(self, start: Any, seq: Any) -> Callable[[int], str]:
        def message(end: int) -> str:
            return (
                f"start_index ({start}) + sequence length ({seq}) = {end} exceeds "
                f"max_length={self.max_length} (positions 0..{self.max_length - 1}); "
                "learned embeddings cannot extrapolate: build the layer with a larger "
                "max_length"
            )

        return message

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape

    def compute_output_spec(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        return output_spec(self, inputs)  # the input's shape, in the dtype the call returns

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                "max_length": self.max_length,
                "dropout": self.dropout,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config


_EMBED_HINT = "; embed token ids first (e.g. keras.layers.Embedding)"


def _check_sequence(inputs: Any, d_model: int | None, name: str) -> None:
    shape = tuple(inputs.shape)
    if len(shape) != 3:
        raise ValueError(_rank_message(name, shape))
    if shape[-1] is not None and d_model is not None and shape[-1] != d_model:
        raise ValueError(
            f"the last axis of the input is {shape[-1]} but {name} was built for "
            f"d_model={d_model} (input shape {shape}); use a new layer per width"
        )


def _rank_message(name: str, shape: tuple[Any, ...]) -> str:
    return (
        f"{name} expects inputs of rank 3, (batch, seq, d_model), got shape {shape} (rank "
        f"{len(shape)}); for one unbatched (seq, d_model) sequence add a batch axis with "
        "keras.ops.expand_dims(x, 0)"
    )
