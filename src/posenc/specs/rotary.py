"""The specs of the schemes that rotate queries and keys: RoPE, xPos, axial RoPE."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any, ClassVar

import numpy as np

from .._checks import (
    DEFAULT_MAX_BYTES,
    check_base,
    check_choice,
    check_int,
    check_real,
)
from ..core.rope import (
    ROPE_LAYOUTS,
    RopeLayout,
    RopeScaling,
    check_rotary_dim,
    rerotation_table_values,
    rope_frequencies,
    rope_options,
    rope_table_values,
)
from ..core.rope_nd import (
    AXIAL_MODES,
    AxialMode,
    axial_column_axes,
    axial_rope_tables,
    xpos_scales,
)
from .base import SchemeSpec
from .hf import mrope_spec_from_hf_config, rope_spec_from_hf_config, rope_spec_to_hf_dict

__all__ = ["AxialRopeSpec", "RopeSpec", "XPosSpec"]


@dataclass(frozen=True, kw_only=True)
class RopeSpec(SchemeSpec):
    """Rotary position embedding with any registered scaling method.

    Args:
        head_dim: Features per attention head.
        base: The RoPE base (``rope_theta``).
        rotary_dim: The rotated width (even, ``<= head_dim``); ``None``: ``head_dim``.
            Stored resolved.
        layout: ``"half"`` (Hugging Face, GPT-NeoX) or ``"interleaved"`` (Meta, GPT-J).
        scaling: A :class:`~posenc.core.rope.RopeScaling` spec, its dict form (a model
            config's ``rope_parameters`` too: its ``rope_theta`` is the base where
            ``base`` is left at 10000, :func:`~posenc.core.rope.rope_options`), a
            registered name without parameters, or ``None`` (``"default"``).

    Example:
        >>> spec = RopeSpec(head_dim=8, scaling={"rope_type": "linear", "factor": 2.0})
        >>> spec.frequencies()[0].tolist()
        [0.5, 0.05, 0.005, 0.0005]
        >>> cos, sin = spec.tables(3, fmt="float64")
        >>> cos.shape
        (3, 8)
    """

    scheme: ClassVar[str] = "rope"
    head_dim: int
    base: float = 10000.0
    rotary_dim: int | None = None
    layout: str = "half"
    scaling: RopeScaling | Any = None

    def __post_init__(self) -> None:
        head_dim = check_int(self.head_dim, "head_dim", minimum=1)
        self._set("rotary_dim", check_rotary_dim(head_dim, self.rotary_dim))
        self._set("head_dim", head_dim)
        scaling, base = self.scaling, self.base
        if not isinstance(scaling, RopeScaling):  # parsed here, once (a dict's rope_theta too)
            scaling, base, _ = rope_options(scaling, base=base)
        self._set("base", check_base(base))
        self._set("layout", check_choice(self.layout, "layout", ROPE_LAYOUTS))
        self._set("scaling", scaling)
        _ = self._initial  # the construction frequencies, once: the scaling's width checks

    @cached_property
    def _initial(self) -> tuple[np.ndarray, float]:
        assert self.rotary_dim is not None  # stored resolved by __post_init__
        return self.scaling._checked_frequencies(self.rotary_dim, self.base)

    def frequencies(self, seq_len: int | None = None) -> tuple[np.ndarray, float]:
        """``(inv_freq, attention_factor)`` of the scaling at sequence length ``seq_len``
        (``None``: those of construction, computed once; a copy)."""
        if seq_len is None:
            inv_freq, attention = self._initial
            return inv_freq.copy(), attention
        assert self.rotary_dim is not None  # stored resolved by __post_init__
        return self.scaling._checked_frequencies(self.rotary_dim, self.base, seq_len)

    @classmethod
    def from_hf_config(cls, config: Any, *, layer_type: str | None = None) -> RopeSpec:
        """The RoPE of a Hugging Face ``transformers`` config (object or dict).

        Reads what ``transformers`` reads: ``rope_parameters`` (v5, also per layer type:
        pass ``layer_type=``) or ``rope_theta`` and ``rope_scaling`` (v4),
        ``partial_rotary_factor``, ``head_dim``, ``max_position_embeddings``,
        ``original_max_position_embeddings`` (see :mod:`posenc.specs.hf`).

        Example:
            >>> spec = RopeSpec.from_hf_config({
            ...     "hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 2048,
            ...     "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3",
            ...     "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            ...     "original_max_position_embeddings": 8192}})
            >>> spec.head_dim, spec.base, spec.scaling.name
            (64, 500000.0, 'llama3')
        """
        return cls(**rope_spec_from_hf_config(config, layer_type=layer_type))

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``transformers`` config keys of this RoPE: ``head_dim`` and
        ``rope_parameters`` (v5), with ``rope_interleave`` for the interleaved layout.

        Example:
            >>> RopeSpec(head_dim=64, base=1e6, rotary_dim=32).to_hf_dict()
            {'head_dim': 64, 'rope_parameters': {'rope_type': 'default', 'rope_theta': 1000000.0, \
'partial_rotary_factor': 0.5}}
        """
        assert self.rotary_dim is not None  # stored resolved by __post_init__
        return rope_spec_to_hf_dict(
            self.head_dim, self.base, self.rotary_dim, self.layout, self.scaling
        )

    def tables(
        self,
        positions: Any,
        *,
        fmt: str = "float32",
        start: int = 0,
        seq_len: int | None = None,
        inv_freq: np.ndarray | None = None,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        out: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(cos, sin)`` at ``positions``, ``(..., rotary_dim)``, times the attention factor.

        ``seq_len`` selects a length-dependent scaling's frequencies; ``inv_freq``
        overrides them (the attention factor stays the scaling's). ``out``: the
        ``(cos, sin)`` arrays to fill and return (see
        :func:`posenc.core.rope.rope_table_values`).
        """
        frequencies, attention = self.frequencies(seq_len)
        return rope_table_values(
            positions,
            frequencies if inv_freq is None else inv_freq,
            fmt=fmt,
            layout=self.layout,
            scale=attention,
            start=start,
            max_bytes=max_bytes,
            out=out,
        )

    def rerotation(
        self,
        positions: Any,
        new_positions: Any = None,
        *,
        seq_len: int | None = None,
        new_seq_len: int | None = None,
        fmt: str = "float32",
        max_bytes: int | None = DEFAULT_MAX_BYTES,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(cos, sin)`` ``(len(positions), rotary_dim)`` that move keys rotated at
        ``positions`` with the frequencies of ``seq_len`` to ``new_positions`` (default:
        the same) with those of ``new_seq_len``, the attention factors' ratio folded in
        (:func:`posenc.core.rope.rerotation_table_values`).

        Example:
            >>> from posenc.core.rope import LongRopeScaling
            >>> spec = RopeSpec(head_dim=4, base=100.0, scaling=LongRopeScaling(
            ...     short_factor=[1.0, 1.0], long_factor=[2.0, 4.0],
            ...     original_max_position_embeddings=8, attention_factor=1.0))
            >>> cos, sin = spec.rerotation([3], seq_len=8, new_seq_len=9, fmt="float64")
            >>> bool(np.allclose(sin[0, :2], np.sin([3 * 0.5 - 3, 3 * 0.025 - 3 * 0.1])))
            True
        """
        old_freq, old_factor = self.frequencies(seq_len)
        new_freq, new_factor = self.frequencies(new_seq_len)
        return rerotation_table_values(
            positions,
            positions if new_positions is None else new_positions,
            old_freq,
            new_freq,
            fmt=fmt,
            layout=self.layout,
            scale=new_factor / old_factor,
            max_bytes=max_bytes,
        )


@dataclass(frozen=True, kw_only=True)
class XPosSpec(SchemeSpec):
    """xPos: RoPE whose queries grow and keys shrink with position (Sun et al., 2023).

    Args:
        head_dim: Features per head (even; all of them rotate and scale).
        base: The RoPE base.
        gamma: ``γ`` in ``ζ_i = (2i/d + γ)/(1 + γ)`` (> 0; 0.4).
        scale_base: ``B`` (> 0; 512).
        centre: A fixed number subtracted from every position in the scale exponent.
        layout: ``"interleaved"`` (torchscale, lucidrains) or ``"half"``.

    Example:
        >>> cos, sin, q_scale, k_scale = XPosSpec(head_dim=4).tables(2, fmt="float64")
        >>> q_scale.round(6).tolist()  # ζ_i^(p/512) at p = 0 and 1
        [[1.0, 1.0, 1.0, 1.0], [0.997556, 0.997556, 0.999137, 0.999137]]
    """

    scheme: ClassVar[str] = "xpos"
    head_dim: int
    base: float = 10000.0
    gamma: float = 0.4
    scale_base: float = 512.0
    centre: float = 0.0
    layout: RopeLayout = "interleaved"

    def __post_init__(self) -> None:
        self._set("layout", check_choice(self.layout, "layout", ROPE_LAYOUTS))
        if isinstance(self.centre, str):
            raise TypeError(
                f"centre must be a fixed number, got {self.centre!r}: a centre that follows "
                "the sequence length breaks cached decoding; pass a number, e.g. "
                "posenc.core.rope_nd.xpos_centre(max_length, 'torchscale')"
            )
        self._set("centre", check_real(self.centre, "centre"))
        self._set("gamma", check_real(self.gamma, "gamma", minimum=0.0, strict=True))
        self._set("scale_base", check_real(self.scale_base, "scale_base", minimum=0.0, strict=True))
        head_dim = check_int(self.head_dim, "head_dim", minimum=2)
        if head_dim % 2:
            raise ValueError(
                f"xPos rotates pairs of features, so head_dim must be even, got {head_dim}"
            )
        self._set("head_dim", head_dim)
        self._set("base", check_base(self.base))

    @property
    def inv_freq(self) -> np.ndarray:
        """The RoPE inverse frequencies, ``(head_dim // 2,)`` float64."""
        return rope_frequencies(self.head_dim, self.base)

    def tables(
        self, positions: Any, *, fmt: str = "float32", start: int = 0
    ) -> tuple[np.ndarray, ...]:
        """``(cos, sin, q_scale, k_scale)`` at ``positions``, each ``(..., head_dim)``."""
        if start:
            positions = start + np.arange(check_int(positions, "positions", minimum=0))
        cos, sin = rope_table_values(positions, self.inv_freq, fmt=fmt, layout=self.layout)
        scales = partial(
            xpos_scales,
            positions,
            self.head_dim,
            gamma=self.gamma,
            scale_base=self.scale_base,
            centre=self.centre,
            layout=self.layout,
            dtype=fmt,
        )
        q_scale = scales(role="query")
        k_scale = scales(role="key")
        return cos, sin, q_scale, k_scale


@dataclass(frozen=True, kw_only=True)
class AxialRopeSpec(SchemeSpec):
    """N-D RoPE: one section of frequency pairs per coordinate axis (RoPE-Axial, M-RoPE).

    Args:
        head_dim: Features per head (even; all of them rotate).
        n_axes: Number of coordinate axes.
        base: The RoPE base.
        sections: Pairs per axis, adding up to ``head_dim // 2``; ``None``: equal.
        mode: ``"axial"`` (a ladder per axis) or ``"mrope"`` (one ladder, cut).
        layout: ``"half"`` or ``"interleaved"``.

    Example:
        >>> cos, _ = AxialRopeSpec(head_dim=8, n_axes=2).tables([[1, 2]], fmt="float64")
        >>> cos.round(6).tolist()  # x = 1 turns pairs 0-1, y = 2 pairs 2-3; ladder [1, .01]
        [[0.540302, 0.99995, -0.416147, 0.9998, 0.540302, 0.99995, -0.416147, 0.9998]]
    """

    scheme: ClassVar[str] = "axial_rope"
    head_dim: int
    n_axes: int = 2
    base: float = 10000.0
    sections: tuple[int, ...] | None = None
    mode: AxialMode = "axial"
    layout: RopeLayout = "half"

    @classmethod
    def from_hf_config(
        cls, config: Any, *, interleaved: bool | None = None, sections: Any = None
    ) -> AxialRopeSpec:
        """The M-RoPE of a Hugging Face multimodal config (Qwen2-VL, Qwen2.5-VL:
        contiguous sections; Qwen3-VL: ``interleaved=True``); see
        :func:`posenc.specs.hf.mrope_spec_from_hf_config`.

        Example:
            >>> AxialRopeSpec.from_hf_config({"head_dim": 128, "rope_parameters": {
            ...     "rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}
            ... }).sections
            (16, 24, 24)
        """
        return cls(**mrope_spec_from_hf_config(config, interleaved=interleaved, sections=sections))

    def __post_init__(self) -> None:
        self._set("mode", check_choice(self.mode, "mode", AXIAL_MODES))
        self._set("layout", check_choice(self.layout, "layout", ROPE_LAYOUTS))
        self._set("n_axes", check_int(self.n_axes, "n_axes", minimum=1))
        self._set("head_dim", check_int(self.head_dim, "head_dim", minimum=2))
        pairs = rope_frequencies(self.head_dim, self.base).size  # validates head_dim, base
        self._set("base", float(self.base))
        sections = self.sections
        if sections is None:
            if pairs % self.n_axes:
                raise ValueError(
                    f"cannot split head_dim // 2 = {pairs} frequency pairs equally over "
                    f"n_axes={self.n_axes} axes; pass sections= (pairs per axis)"
                )
            sections = (pairs // self.n_axes,) * self.n_axes
        if isinstance(sections, Sequence) and not isinstance(sections, (str, bytes)):
            sections = tuple(sections)
        self._set("sections", sections)
        self.tables(np.zeros((1, self.n_axes), np.int64), fmt="float64")  # the core's checks

    def tables(self, coords: Any, *, fmt: str = "float32") -> tuple[np.ndarray, np.ndarray]:
        """``(cos, sin)`` of ``coords`` ``(..., n_axes)``, each ``(..., head_dim)``."""
        return axial_rope_tables(
            coords,
            self.head_dim,
            self.base,
            sections=self.sections,
            mode=self.mode,
            layout=self.layout,
            dtype=fmt,
        )

    @property
    def column_axes(self) -> np.ndarray:
        """The coordinate axis each column of the tables turns by, ``(head_dim,)`` int64
        (:func:`posenc.core.rope_nd.axial_column_axes`)."""
        assert self.sections is not None  # resolved in __post_init__
        return axial_column_axes(self.sections, self.mode, self.layout)

    def axis_tables(
        self, positions: Any, *, axis: int, fmt: str = "float32", start: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(cos, sin)`` at coordinate ``positions`` along ``axis``, every other axis at 0:
        the rows a front end gathers for that axis when the coordinates are traced (the
        columns of the other axes hold cos 1 and sin 0; :attr:`column_axes` says which
        columns are the axis's own). ``positions``: an int ``n`` (``start .. start+n-1``)
        or an array; each result ``(*positions.shape, head_dim)``.

        Example:
            >>> spec = AxialRopeSpec(head_dim=4, n_axes=2, layout="interleaved")
            >>> cos, _ = spec.axis_tables(2, axis=1, fmt="float64")
            >>> cos.round(6).tolist(), spec.column_axes.tolist()
            ([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.540302, 0.540302]], [0, 0, 1, 1])
        """
        if isinstance(positions, int):
            positions = start + np.arange(check_int(positions, "positions", minimum=0))
        along = np.asarray(positions)
        coords = np.zeros((*along.shape, self.n_axes), dtype=along.dtype)
        coords[..., check_int(axis, "axis", minimum=0, maximum=self.n_axes - 1)] = along
        return self.tables(coords, fmt=fmt)
