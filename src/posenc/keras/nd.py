"""The Keras 3 layer that adds an N-D sinusoidal encoding to channels-last input (images,
video), on the TensorFlow, JAX and torch backends (``keras.ops`` only).

The table comes from :mod:`posenc.core.nd`, computed in float64 with exact angle
reduction and rounded once to the input's dtype; the layer only moves it onto the backend.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
from keras import ops

from .._checks import check_probability
from ..core.nd import check_channels, check_shape
from ..specs import SinusoidalNDSpec
from ._arguments import check_float, output_spec
from ._backend import format_of, to_tensor
from ._layer import PositionLayer
from ._tables import cacheable, outside_traces
from .encodings import _dropout_layer

__all__ = ["SinusoidalPositionalEncodingND"]

_CACHE_SIZE = 16  # N-D tables kept per layer (one per grid shape and format in use)


# ---------------------------------------------------------------------------------------
# N-D sinusoidal


@keras.saving.register_keras_serializable(package="posenc")
class SinusoidalPositionalEncodingND(PositionLayer):
    """Adds an N-D sinusoidal encoding to channels-last input (images, video), then dropout.

    ``output = dropout(inputs + table)`` with ``table`` of shape ``(*spatial, channels)``
    from :func:`posenc.core.nd.sinusoidal_nd` for the grid ``inputs.shape[1:-1]``: each
    spatial axis gets its own block of channels holding a 1-D sinusoidal encoding of the
    index along it (``layout`` decides the split, see :mod:`posenc.core.nd`). The table is
    computed by the core in float64 with exact angle reduction and correctly rounded to
    the input's dtype (float16, bfloat16, float32 or float64): under ``"mixed_bfloat16"``
    it holds the bfloat16 values nearest to the exact encoding, not an encoding computed
    in bfloat16. :meth:`encoding` returns the table alone.

    Tables are constants, not weights: ``layer.weights`` is empty. They are cached per
    (grid shape, format), at most 16, and created eagerly even when first needed inside
    ``tf.function`` or ``jax.jit``.

    The channel count is taken from the input's last axis when the layer is built (from
    ``keras.Input((None, None, channels))`` too); the spatial sizes may differ between
    calls but must be known when the layer runs: eagerly, in a JAX or torch model (whose
    traces see each call's shape), or in a TensorFlow graph of static shape. A size left
    ``None`` in a TensorFlow graph (``fit``/``predict`` after a second size, a
    ``tf.function`` with such an ``input_signature``) is a ``ValueError`` saying what to
    change.

    Args:
        layout: ``"positional-encodings"`` (the ``positional_encodings`` package's split:
            every axis gets ``2·ceil(channels / 2n)`` channels, cut to ``channels``; any
            number of spatial axes) or ``"mae"`` (MAE 2-D sin-cos: 1 or 2 spatial axes,
            ``channels`` a multiple of ``2n``).
        base: The ``n`` of ``sin(k / n^(2i/c))`` (10000 in both references).
        dropout: Dropout rate applied to the sum, a float in ``[0, 1)``.
        **kwargs: Standard layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        inputs: A floating tensor ``(batch, *spatial, channels)``, e.g. ``(batch, height,
            width, channels)``, with static spatial sizes.
        training: Whether dropout is active (Keras sets it during ``fit``).

    Returns:
        A tensor of the input's shape and dtype.

    Shapes:
        ``(batch, *spatial, channels)`` → the same; :meth:`encoding`:
        ``(*spatial, channels)``.

    Example:
        >>> import numpy as np
        >>> import posenc
        >>> layer = SinusoidalPositionalEncodingND()
        >>> out = layer(np.zeros((2, 4, 5, 6), "float32"))  # (batch, height, width, C)
        >>> tuple(out.shape)
        (2, 4, 5, 6)
        >>> table = keras.ops.convert_to_numpy(layer.encoding((4, 5)))
        >>> bool(np.all(table == posenc.sinusoidal_nd((4, 5), 6)))
        True

    References:
        He et al., "Masked Autoencoders Are Scalable Vision Learners", CVPR 2022
        (facebookresearch/mae); Carion et al., "End-to-End Object Detection with
        Transformers", ECCV 2020 (the per-axis split); the ``positional-encodings``
        package (tatp22/multidim-positional-encoding).
    """

    def __init__(
        self,
        layout: str = "positional-encodings",
        base: float = 10000.0,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # The channel count comes from the input at build(); the options are checked now
        # by a spec of one channel (they do not depend on the count), which build() gives
        # the input's count.
        self._options = SinusoidalNDSpec(channels=1, base=base, layout=layout)
        self.spec: SinusoidalNDSpec | None = None
        self.dropout = check_probability(dropout, "dropout")
        self._dropout_layer = _dropout_layer(self.dropout, self.dtype_policy)
        # (grid shape, format) → (*shape, channels) backend tensor
        self._grids: dict[tuple[tuple[int, ...], str], Any] = {}

    def build(self, input_shape: Any) -> None:
        shape = tuple(input_shape)
        if len(shape) < 3:
            raise ValueError(
                f"SinusoidalPositionalEncodingND expects channels-last inputs (batch, "
                f"*spatial, channels) of rank >= 3, got shape {shape} (rank {len(shape)})"
            )
        if shape[-1] is None:
            raise ValueError(
                f"SinusoidalPositionalEncodingND needs a known last (channel) axis, got "
                f"input shape {shape}"
            )
        known = None not in shape[1:-1]  # a grid known now: its table is built eagerly
        layout = self._options.layout
        grid = self._grid(shape) if known else check_shape((1,) * (len(shape) - 2), layout)
        channels = check_channels(shape[-1], len(grid), layout)
        self.spec = dataclasses.replace(self._options, channels=channels)
        self._grids = {}
        if known:
            self._table(grid, format_of(self.compute_dtype, "the layer's compute dtype"))
        if self._dropout_layer is not None:
            self._dropout_layer.build(shape)
        self.built = True

    def _grid(self, shape: tuple[Any, ...]) -> tuple[int, ...]:
        """The spatial sizes of a ``(batch, *spatial, channels)`` input shape, checked."""
        spatial = shape[1:-1]
        if any(size is None for size in spatial):
            raise ValueError(
                f"SinusoidalPositionalEncodingND needs the spatial sizes known when it runs "
                f"(its table is the grid's), got input shape {shape} inside a graph; "
                "TensorFlow's fit, predict and evaluate trace a model for any size once they "
                "have seen two sizes: call the model itself (model(x)), compile it with "
                "run_eagerly=True, or give keras.Input the full shape (height, width, "
                "channels), one model per grid size"
            )
        return check_shape(tuple(int(size) for size in spatial), self._options.layout)

    def _table(self, shape: tuple[int, ...], fmt: str) -> Any:
        """The ``(*shape, channels)`` table in ``fmt``, built by the core on first use."""
        key = (shape, fmt)
        table = self._grids.get(key)
        if table is None:
            assert self.spec is not None  # made in build()
            values = self.spec.table(shape, fmt=fmt)  # (*shape, channels)
            with outside_traces():
                table = to_tensor(values, fmt)
            if not cacheable(table):
                return table
            if len(self._grids) >= _CACHE_SIZE:
                self._grids.pop(next(iter(self._grids)))
            self._grids[key] = table
        return table

    def encoding(self, shape: Any, dtype: Any = None) -> Any:
        """The table ``(*shape, channels)`` alone, correctly rounded in ``dtype``.

        Args:
            shape: Grid sizes, a tuple of positive ints such as ``(height, width)``.
            dtype: ``"float16"``, ``"bfloat16"``, ``"float32"`` or ``"float64"`` (or the
                equivalent backend dtype); ``None`` means the layer's compute dtype.

        Returns:
            A backend tensor of shape ``(*shape, channels)``; cached, so :meth:`call`
            on input of that grid and dtype reuses it.
        """
        if self.spec is None:
            raise ValueError(
                "SinusoidalPositionalEncodingND takes its channel count from its input: call "
                "the layer once (or build it with layer.build((batch, *spatial, channels))) "
                "before asking for an encoding"
            )
        fmt = format_of(self.compute_dtype if dtype is None else dtype)
        return self._table(check_shape(shape, self.spec.layout), fmt)

    def call(self, inputs: Any, training: Any = None) -> Any:
        name = type(self).__name__
        shape = tuple(inputs.shape)
        spatial = self._grid(shape)
        assert self.spec is not None  # built
        if shape[-1] != self.spec.channels:
            raise ValueError(
                f"the last axis of the input is {shape[-1]} but {name} was built for "
                f"channels={self.spec.channels} (input shape {shape}); inputs must be "
                "channels-last, and each width needs its own layer"
            )
        dtype = check_float(inputs.dtype, name, "features")
        table = self._table(spatial, format_of(dtype, "the input dtype"))  # (*spatial, C)
        outputs = ops.add(inputs, table)  # (batch, *spatial, C), broadcast over batch
        if self._dropout_layer is not None:
            outputs = self._dropout_layer(outputs, training=training)
        return outputs

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape

    def compute_output_spec(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        return output_spec(self, inputs)  # the input's shape, in the dtype the call returns

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        options = self._options
        config.update({"layout": options.layout, "base": options.base, "dropout": self.dropout})
        return config
