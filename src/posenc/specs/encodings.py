"""The specs of the schemes added to the input: sinusoidal (1-D and N-D), learned, NoPE;
and NoPE attention with Llama 4's attention temperature."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .._checks import (
    DEFAULT_MAX_BYTES,
    FORMULAS,
    LAYOUTS,
    check_base,
    check_choice,
    check_d_model,
    check_int,
    check_max_length,
    check_positive,
    check_real,
    check_weights,
)
from ..core.nd import MAX_NDIM, ND_LAYOUTS, check_channels, check_shape, nd_values
from ..core.nope import attention_temperature
from ..core.sinusoidal import table_values
from .base import SchemeSpec

__all__ = ["LearnedSpec", "NopeSpec", "NopeTemperatureSpec", "SinusoidalNDSpec", "SinusoidalSpec"]


@dataclass(frozen=True, kw_only=True)
class SinusoidalSpec(SchemeSpec):
    """The sinusoidal encoding of "Attention Is All You Need" §3.5.

    Args:
        d_model: Width of the encoding, an int >= 1 (odd widths end with a sine column).
        base: The ``n`` of ``sin(k / n^(2i/d))``; finite, > 0 and not 1.
        layout: ``"interleaved"`` (paper) or ``"split"`` (tensor2tensor, fairseq).
        formula: ``"paper"`` or ``"tensor2tensor"`` frequency spacing.

    Example:
        >>> SinusoidalSpec(d_model=4, base=100).table(2, fmt="float64")[1].round(6).tolist()
        [0.841471, 0.540302, 0.099833, 0.995004]
    """

    scheme: ClassVar[str] = "sinusoidal"
    d_model: int
    base: float = 10000.0
    layout: str = "interleaved"
    formula: str = "paper"

    def __post_init__(self) -> None:
        self._set("d_model", check_d_model(self.d_model))
        self._set("base", check_base(self.base))
        self._set("layout", check_choice(self.layout, "layout", LAYOUTS))
        self._set("formula", check_choice(self.formula, "formula", FORMULAS))

    def table(
        self,
        positions: Any,
        *,
        fmt: str = "float32",
        start: int = 0,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Rows at ``positions`` (an int ``L``: ``start .. start+L-1``), ``(..., d_model)``.

        ``out``: the array to fill and return (see
        :func:`posenc.core.sinusoidal.table_values`).
        """
        return table_values(
            positions,
            self.d_model,
            base=self.base,
            layout=self.layout,
            formula=self.formula,
            fmt=fmt,
            start=start,
            max_bytes=max_bytes,
            out=out,
        )


@dataclass(frozen=True, kw_only=True)
class SinusoidalNDSpec(SchemeSpec):
    """N-D sinusoidal encodings (images, video): the channels split between the axes.

    Args:
        channels: Width of the encoding (``"mae"``: a multiple of ``2 · n_axes``).
        base: The ``n`` of ``sin(k / n^(2i/c))``.
        layout: ``"positional-encodings"`` or ``"mae"`` (see :mod:`posenc.core.nd`).
        ndim: The number of spatial axes, or ``None`` for any the layout supports.

    Example:
        >>> SinusoidalNDSpec(channels=4).table((2, 3), fmt="float64")[1, 2].round(6).tolist()
        [0.841471, 0.540302, 0.909297, -0.416147]
    """

    scheme: ClassVar[str] = "sinusoidal_nd"
    channels: int
    base: float = 10000.0
    layout: str = "positional-encodings"
    ndim: int | None = None

    def __post_init__(self) -> None:
        self._set("layout", check_choice(self.layout, "layout", ND_LAYOUTS))
        self._set("channels", check_int(self.channels, "channels", minimum=1))
        self._set("base", check_base(self.base))
        if self.ndim is not None:
            self._set("ndim", check_int(self.ndim, "ndim", minimum=1, maximum=MAX_NDIM))
            check_shape((1,) * self.ndim, self.layout)
            check_channels(self.channels, self.ndim, self.layout)

    def grid(self, shape: Any) -> tuple[int, ...]:
        """``shape`` checked for this spec: sizes for the layout and ``ndim``."""
        sizes = check_shape(shape, self.layout)
        if self.ndim is not None and len(sizes) != self.ndim:
            raise ValueError(
                f"this encoding is for ndim={self.ndim} spatial axes, got grid {sizes}"
            )
        check_channels(self.channels, len(sizes), self.layout)
        return sizes

    def table(
        self, shape: Any, *, fmt: str = "float32", max_bytes: int | None = DEFAULT_MAX_BYTES
    ) -> np.ndarray:
        """The table of a grid, ``(*shape, channels)``."""
        sizes = self.grid(shape)
        return nd_values(
            sizes, self.channels, base=self.base, layout=self.layout, fmt=fmt, max_bytes=max_bytes
        )


MAX_INIT_STD = 1e37
"""The widest normal initialisation of a learned table whose float32 draws stay finite
(float32 ends at 3.4e38; draws past 34 standard deviations never occur)."""


@dataclass(frozen=True, kw_only=True)
class LearnedSpec(SchemeSpec):
    """A trained embedding per position (GPT-2, BERT): ``max_length`` rows of ``d_model``.

    Args:
        max_length: Number of positions, ``0 .. max_length-1``.
        d_model: Width of the embeddings.
        init_std: Standard deviation of the normal initialisation (GPT-2: 0.02).

    Example:
        >>> LearnedSpec(max_length=16, d_model=8)
        LearnedSpec(max_length=16, d_model=8, init_std=0.02)
    """

    scheme: ClassVar[str] = "learned"
    max_length: int
    d_model: int
    init_std: float = 0.02

    def __post_init__(self) -> None:
        self._set("max_length", check_max_length(self.max_length))
        self._set("d_model", check_d_model(self.d_model))
        check_weights({"max_length": self.max_length, "d_model": self.d_model}, "a learned table")
        init_std = check_positive(self.init_std, "init_std")
        if init_std > MAX_INIT_STD:
            raise ValueError(
                f"init_std must be at most {MAX_INIT_STD:g} (float32 weights stay finite), "
                f"got {init_std:g}"
            )
        self._set("init_std", init_std)


@dataclass(frozen=True, kw_only=True)
class NopeSpec(SchemeSpec):
    """NoPE: no positional encoding, as an explicit, nameable choice (zeros).

    Args:
        d_model: Width of the (zero) encoding.

    Example:
        >>> NopeSpec(d_model=4).to_dict()
        {'scheme': 'nope', 'd_model': 4}
    """

    scheme: ClassVar[str] = "nope"
    d_model: int

    def __post_init__(self) -> None:
        self._set("d_model", check_d_model(self.d_model))


@dataclass(frozen=True, kw_only=True)
class NopeTemperatureSpec(SchemeSpec):
    """NoPE attention whose queries are scaled by a temperature that grows with the
    position: Llama 4's layers without RoPE (``no_rope_layers`` 0 with
    ``attn_temperature_tuning``), whose query at position ``p`` is multiplied by
    :meth:`scales` = ``1 + attn_scale · log(1 + ⌊(p + 1) / floor_scale⌋)``.

    Args:
        floor_scale: The step of the floor in positions (> 0; Llama 4: 8192).
        attn_scale: The log's coefficient (finite; Llama 4: 0.1).

    Example:
        >>> spec = NopeTemperatureSpec(floor_scale=8192, attn_scale=0.1)
        >>> spec.scales([0, 8191, 131071]).tolist()
        [1.0, 1.06931471824646, 1.2833213806152344]
    """

    scheme: ClassVar[str] = "nope_temperature"
    floor_scale: float = 8192.0
    attn_scale: float = 0.1

    def __post_init__(self) -> None:
        self._set("floor_scale", check_positive(self.floor_scale, "floor_scale"))
        self._set("attn_scale", check_real(self.attn_scale, "attn_scale"))

    def scales(
        self, positions: Any, *, dtype: Any = np.float32, max_bytes: int | None = DEFAULT_MAX_BYTES
    ) -> np.ndarray:
        """The query scale at each position (an int ``L``: ``0 .. L-1``), correctly rounded
        in ``dtype``: :func:`posenc.core.nope.attention_temperature`."""
        return attention_temperature(
            positions,
            floor_scale=self.floor_scale,
            attn_scale=self.attn_scale,
            dtype=dtype,
            max_bytes=max_bytes,
        )
