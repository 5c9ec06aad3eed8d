"""PyTorch module for N-D sinusoidal encodings (images, video), over :mod:`posenc.core.nd`.

Input is channels-last, ``(batch, *spatial, channels)``, as the ``positional_encodings``
package's ``PositionalEncoding2D/3D`` take it. The tables come from the NumPy core,
exact and rounded once to the input's dtype.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._checks import check_probability, describe
from ..specs import SinusoidalNDSpec
from ..specs.base import module_from_spec
from ._arguments import apply_dropout
from ._backend import format_of, to_tensor
from ._tables import PositionTables, eager_only

_CACHE_SIZE = 16  # tables kept per module (one per grid shape, dtype and device in use)


class SinusoidalPositionalEncodingND(PositionTables):
    """Adds an N-D sinusoidal encoding to channels-last input, then dropout.

    ``forward(x) = dropout(x + table)`` with ``table`` of shape ``(*spatial, channels)``
    from :func:`posenc.core.nd.sinusoidal_nd` for the grid ``x.shape[1:-1]``, correctly
    rounded in ``x.dtype``. :meth:`encoding` returns the table alone, which is what the
    ``positional_encodings`` package's ``PositionalEncoding2D(channels)(x)`` returns
    (there repeated over the batch; here without the batch axis, ready to broadcast).

    Tables are cached per (grid shape, dtype, device), at most 16, and are not
    buffers: nothing goes into ``state_dict``, and the package's ``inv_freq`` /
    ``cached_penc`` entries in a loaded state dict are dropped. Moving or casting the
    module clears the cache (the next call rebuilds exact tables).

    Under ``torch.compile(fullgraph=True)`` the table for each grid shape/dtype/device
    must already be cached: run the module once eagerly (or call :meth:`encoding`)
    before compiling; a missing table raises a ``ValueError`` that says so.

    Args:
        channels: Width of the channel axis (last axis of ``x``); the rules of
            :func:`~posenc.core.nd.sinusoidal_nd` for ``layout`` apply.
        layout: ``"positional-encodings"`` (the package's split, any number of spatial
            axes) or ``"mae"`` (MAE 2-D sin-cos; 1 or 2 spatial axes).
        base: The ``n`` of ``sin(k / n^(2i/c))`` (10000 in both references).
        dropout: Dropout probability applied after the addition.
        ndim: Number of spatial axes expected (2 for images, 3 for video), or ``None``
            to accept any rank the layout supports.

    Call arguments:
        x: ``(batch, *spatial, channels)`` floating-point features (float16, bfloat16,
            float32 or float64).

    Shapes:
        output: same shape and dtype as ``x``.

    Example:
        >>> pe = SinusoidalPositionalEncodingND(6)
        >>> x = torch.zeros(2, 4, 5, 6)  # (batch, height, width, channels)
        >>> pe(x).shape
        torch.Size([2, 4, 5, 6])
        >>> bool((pe(x)[1] == pe.encoding((4, 5))).all())
        True

    References:
        He et al., "Masked Autoencoders Are Scalable Vision Learners", CVPR 2022
        (facebookresearch/mae); Carion et al., "End-to-End Object Detection with
        Transformers", ECCV 2020 (the per-axis split; DETR's own variant is neither
        layout); the ``positional-encodings`` package
        (tatp22/multidim-positional-encoding).
    """

    spec_class = SinusoidalNDSpec

    def __init__(
        self,
        channels: int,
        *,
        layout: str = "positional-encodings",
        base: float = 10000.0,
        dropout: float = 0.0,
        ndim: int | None = None,
    ) -> None:
        super().__init__()
        self.spec = SinusoidalNDSpec(channels=channels, base=base, layout=layout, ndim=ndim)
        self.dropout = nn.Dropout(check_probability(dropout))
        self._tables: dict[tuple[tuple[int, ...], torch.dtype, torch.device], Tensor] = {}
        # No buffers; state dicts of the package's modules carry these derived entries.
        self._register_derived((), torch.float32, drop=("inv_freq", "cached_penc"))

    @classmethod
    def from_spec(cls, spec: SinusoidalNDSpec, **options: Any) -> SinusoidalPositionalEncodingND:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    def _empty_caches(self) -> dict[str, Any]:
        # A cast or move rebuilds exact tables on the next call; a pickle keeps none.
        return {"_tables": {}}

    def encoding(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """The table ``(*shape, channels)`` alone, correctly rounded in ``dtype``.

        Cached: later calls (and :meth:`forward` on input of that grid, dtype and device)
        reuse it.
        """
        device = torch.device("cpu") if device is None else torch.device(device)
        key = (tuple(shape), dtype, device)
        table = self._tables.get(key)
        if table is not None:
            return table
        if torch.compiler.is_compiling():
            raise ValueError(
                f"{type(self).__name__} has no table for grid {tuple(shape)}, {dtype} on "
                f"{device}; under torch.compile run the module once on such input (or call "
                f".encoding({tuple(shape)}, {dtype}, '{device}')) before compiling"
            )
        return self._build(key)

    @eager_only
    def _build(self, key: tuple[tuple[int, ...], torch.dtype, torch.device]) -> Tensor:
        """Build, cache and return the table for ``key``; never traced by dynamo."""
        shape, dtype, device = key
        fmt = format_of(dtype)
        table = to_tensor(self.spec.table(shape, fmt=fmt), fmt, device)
        if len(self._tables) >= _CACHE_SIZE:
            self._tables.pop(next(iter(self._tables)))
        self._tables[key] = table
        return table

    def forward(self, x: Tensor) -> Tensor:
        _check_input(x, self.spec.channels, self.spec.ndim, type(self).__name__)
        table = self.encoding(tuple(x.shape[1:-1]), x.dtype, x.device)  # (*spatial, C)
        return apply_dropout(self.dropout, x + table)

    def extra_repr(self) -> str:
        spec = self.spec
        ndim = "" if spec.ndim is None else f", ndim={spec.ndim}"
        return f"channels={spec.channels}, layout={spec.layout!r}, base={spec.base:g}{ndim}"


def _check_input(x: Any, channels: int, ndim: int | None, name: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} expects a torch.Tensor, got {describe(x)}")
    if x.dim() < 3 or (ndim is not None and x.dim() != ndim + 2):
        rank = "rank >= 3" if ndim is None else f"rank {ndim + 2} for ndim={ndim}"
        raise ValueError(
            f"{name} expects channels-last x of shape (batch, *spatial, channels), {rank}, "
            f"got shape {tuple(x.shape)}"
        )
    if x.shape[-1] != channels:
        raise ValueError(
            f"{name} was built for channels={channels}, but x has last dimension "
            f"{x.shape[-1]} (shape {tuple(x.shape)}); input must be channels-last"
        )
    if not x.is_floating_point():
        raise TypeError(f"{name} expects floating-point features, got dtype {x.dtype}")
