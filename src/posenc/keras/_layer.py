"""The base of posenc's Keras layers: what every one of them does the same way.

:class:`PositionLayer` is each layer's one posenc base (the score biases put their role,
``_ScoreBias``, on it): the call arguments given as Python or NumPy values checked before
Keras converts them (the checks are :mod:`._arguments`'), and the tables a layer shares
with the layers of its kind and spec (their lifecycle is :mod:`._tables`'). What differs
between layers is theirs: a layer made from a spec has ``from_spec``
(:func:`posenc.specs.base.module_from_spec`), and a layer whose output has its input's
shape says so (``compute_output_shape``, ``compute_output_spec``:
:func:`._arguments.output_spec`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import keras
import numpy as np

from ._arguments import check_plain_positions, check_plain_start
from ._tables import GROWTH_LOCK, PositionTables, own_copy, shared_tables

__all__ = ["PositionLayer"]

Layer = TypeVar("Layer", bound="PositionLayer")


class PositionLayer(keras.layers.Layer):
    """Base of posenc's Keras layers.

    **Call arguments.** The arguments of ``call()`` after the inputs that
    ``_plain_arguments`` names are checked before Keras sees them, when given as Python
    or NumPy values: ``start_index`` (unless it is ``None`` and ``_start_may_be_none``)
    and ``positions``. A layer whose ``call`` takes ``positions`` converts its other
    arguments itself, as ``Layer.__call__`` would, and leaves the positions as they are:
    Keras casts every floating argument to the compute dtype, which would round floating
    positions before the layer reads them (``2049.0`` is 2048 in float16, 257 is 256 in
    bfloat16).

    **Tables.** A layer with tables holds them with :meth:`_share_tables` (in
    ``build()``, or ``__init__`` when they need no input shape), shared by the layers of
    its kind and spec; :meth:`unshare_tables` makes them its own.
    """

    _plain_arguments: tuple[str, ...] = ()  # call()'s, after the inputs
    _start_may_be_none = False  # whether start_index=None has a meaning
    _tables: PositionTables | None = None
    _private_tables = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "positions" in self._plain_arguments:
            self._convert_input_args = False  # done in __call__, positions left out

    # -- call arguments --------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        given = dict(zip(self._plain_arguments, args[1:], strict=False)) | kwargs
        if "start_index" in given and (
            given["start_index"] is not None or not self._start_may_be_none
        ):
            check_plain_start(given["start_index"], type(self).__name__)
        if "positions" in self._plain_arguments:
            if given.get("positions") is not None:
                check_plain_positions(given["positions"])
            args, kwargs = self._converted(args, kwargs)
        return super().__call__(*args, **kwargs)

    def _converted(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``args`` and ``kwargs`` converted as ``Layer.__call__`` converts them (floating
        tensors and arrays cast to the input dtype when the layer autocasts), but
        ``positions``."""
        names = ("inputs", *self._plain_arguments)

        def convert(value: Any) -> Any:
            return self.dtype_policy.convert_input(value, self.autocast, self.input_dtype)

        args = tuple(
            arg if names[i : i + 1] == ("positions",) else keras.tree.map_structure(convert, arg)
            for i, arg in enumerate(args)
        )
        kwargs = {
            name: value if name == "positions" else keras.tree.map_structure(convert, value)
            for name, value in kwargs.items()
        }
        return args, kwargs

    # -- tables ----------------------------------------------------------------------------

    def _share_tables(
        self,
        key: Hashable,
        derive: Callable[[int, str], tuple[np.ndarray, ...]],
        length: int,
    ) -> PositionTables:
        """Hold the tables of ``key`` (the layer's kind and spec), ``length`` rows at
        least: shared with the layers of the same key and device, unless this layer's
        are its own."""
        self._tables = shared_tables(None if self._private_tables else key, derive, length)
        return self._tables

    def _held_tables(self) -> PositionTables:
        """The tables this layer reads now (once :meth:`_share_tables` has set them)."""
        assert self._tables is not None  # built, or made in __init__
        return self._tables

    def unshare_tables(self: Layer) -> Layer:
        """Give this layer tables of its own: a copy that no other layer reads or grows,
        also after the layer is built again. Returns the layer.

        For code that must not see the tables grow with other layers' calls (or that
        writes into them). Other layers keep the shared ones. Before ``build()``, the
        layer builds tables of its own when it is built.
        """
        with GROWTH_LOCK:
            self._private_tables = True
            if self._tables is not None:
                self._tables = own_copy(self._tables)
        return self

    @property
    def shares_tables(self) -> bool:
        """Whether other layers of this kind and spec may share this layer's tables
        (``False`` before they exist, after :meth:`unshare_tables`, for a spec that
        cannot be hashed, and for a layer without tables)."""
        return self._tables is not None and self._tables.shared
