"""Typed specs of the schemes: one frozen, validated dataclass per scheme.

A spec holds every option of one positional scheme, checks them once when it is made
(``TypeError``/``ValueError`` naming the value and what is valid), and asks the core for
the scheme's numbers: :meth:`SinusoidalSpec.table`, :meth:`RopeSpec.tables`,
:meth:`AlibiSpec.bias`, :meth:`T5Spec.buckets`, ... Every front end builds its modules and
layers on these specs, so the options are parsed and validated in one place and a
module only moves the numbers onto its framework's device and dtype.

A spec converts to and from a plain dict (``{"scheme": "rope", "head_dim": 64, ...,
"scaling": {"rope_type": "yarn", ...}}``), so it round-trips through JSON, a Keras
``get_config`` and a model config::

    >>> from posenc import YarnScaling
    >>> spec = RopeSpec(head_dim=64, base=500000.0, scaling=YarnScaling(
    ...     factor=4.0, original_max_position_embeddings=2048))
    >>> SchemeSpec.from_dict(spec.to_dict()) == spec
    True

The numbers are in the NumPy container of the format asked for (bfloat16 values as
exact float32; see :data:`posenc.core.precision.CONTAINERS`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import numpy as np

from ._checks import (
    DEFAULT_MAX_BYTES,
    FORMULAS,
    LAYOUTS,
    check_base,
    check_choice,
    check_d_model,
    check_int,
    check_positive,
    check_real,
    describe,
)
from .core.alibi import MODES, alibi_bias_values, alibi_slopes
from .core.nd import ND_LAYOUTS, check_channels, check_shape, nd_values
from .core.rope import (
    ROPE_LAYOUTS,
    RopeLayout,
    RopeScaling,
    as_rope_scaling,
    check_rotary_dim,
    rope_frequencies,
    rope_table_values,
)
from .core.rope_nd import AXIAL_MODES, AxialMode, axial_rope_tables, xpos_scales
from .core.sinusoidal import table_values
from .core.t5 import bucket_values, check_bucket_options

__all__ = [
    "AlibiSpec",
    "AxialRopeSpec",
    "FromSpec",
    "LearnedSpec",
    "NopeSpec",
    "RopeSpec",
    "SchemeSpec",
    "SinusoidalNDSpec",
    "SinusoidalSpec",
    "T5Spec",
    "XPosSpec",
]

_SPEC_CLASSES: dict[str, type[SchemeSpec]] = {}


@dataclass(frozen=True, kw_only=True)
class SchemeSpec:
    """Base of the scheme specs: validation on construction, and the dict form.

    Attributes:
        scheme: The scheme's name in :data:`posenc.SCHEMES` (the dict's ``"scheme"``).
    """

    scheme: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.scheme:
            _SPEC_CLASSES[cls.scheme] = cls

    def to_dict(self) -> dict[str, Any]:
        """``{"scheme": name, **fields}``, plain JSON values (nested specs as dicts)."""
        out: dict[str, Any] = {"scheme": self.scheme}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, RopeScaling):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            out[field.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SchemeSpec:
        """The spec of a dict from :meth:`to_dict` (on the base class: any scheme's).

        Example:
            >>> SchemeSpec.from_dict({"scheme": "alibi", "num_heads": 8})
            AlibiSpec(num_heads=8, mode='causal')
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"a scheme spec dict must be a mapping, got {describe(data)}")
        fields = dict(data)
        name = fields.pop("scheme", cls.scheme or None)
        if name not in _SPEC_CLASSES:
            raise ValueError(
                f"unknown scheme {name!r} in a spec dict; valid: {sorted(_SPEC_CLASSES)}"
            )
        target = _SPEC_CLASSES[name]
        if cls.scheme and target is not cls:
            raise ValueError(f"{cls.__name__}.from_dict got a spec of scheme {name!r}")
        accepted = {f.name for f in dataclasses.fields(target)}
        unknown = sorted(set(fields) - accepted)
        if unknown:
            raise TypeError(
                f"scheme {name!r}: unknown {unknown} in the spec dict; it takes {sorted(accepted)}"
            )
        return target(**fields)

    def fields(self) -> dict[str, Any]:
        """The fields as keyword arguments (nested specs stay specs)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def _set(self, name: str, value: Any) -> None:
        """Store a validated, normalised value on the frozen instance."""
        object.__setattr__(self, name, value)


class FromSpec:
    """Mixin of the front ends' modules and layers: ``Module.from_spec(spec, **options)``.

    A module's arguments are its spec's fields plus options of its own (``max_length``,
    ``dropout``, ``qk_layout``, ...), so a spec and those options make the module.
    """

    spec_class: ClassVar[type[SchemeSpec]]

    @classmethod
    def from_spec(cls, spec: SchemeSpec, **options: Any) -> Any:
        """The module of ``spec`` (a :attr:`spec_class` instance) with ``options``."""
        if not isinstance(spec, cls.spec_class):
            raise TypeError(
                f"{cls.__name__}.from_spec takes a {cls.spec_class.__name__}, got {describe(spec)}"
            )
        overlap = sorted(set(options) & set(spec.fields()))
        if overlap:
            raise TypeError(f"{cls.__name__}.from_spec: {overlap} are given by the spec already")
        return cls(**spec.fields(), **options)


# ---------------------------------------------------------------------------------------
# Added to the input


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
    ) -> np.ndarray:
        """Rows at ``positions`` (an int ``L``: ``start .. start+L-1``), ``(..., d_model)``."""
        return table_values(
            positions,
            self.d_model,
            base=self.base,
            layout=self.layout,
            formula=self.formula,
            fmt=fmt,
            start=start,
            max_bytes=max_bytes,
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
            self._set("ndim", check_int(self.ndim, "ndim", minimum=1))
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


@dataclass(frozen=True, kw_only=True)
class LearnedSpec(SchemeSpec):
    """A trained embedding per position (GPT-2, BERT): ``max_length`` rows of ``d_model``.

    Args:
        max_length: Number of positions, ``0 .. max_length-1``.
        d_model: Width of the embeddings.
        init_std: Standard deviation of the normal initialisation (GPT-2: 0.02).
    """

    scheme: ClassVar[str] = "learned"
    max_length: int
    d_model: int
    init_std: float = 0.02

    def __post_init__(self) -> None:
        self._set("max_length", check_int(self.max_length, "max_length", minimum=1))
        self._set("d_model", check_d_model(self.d_model))
        self._set("init_std", check_positive(self.init_std, "init_std"))


@dataclass(frozen=True, kw_only=True)
class NopeSpec(SchemeSpec):
    """NoPE: no positional encoding, as an explicit, nameable choice (zeros).

    Args:
        d_model: Width of the (zero) encoding.
    """

    scheme: ClassVar[str] = "nope"
    d_model: int

    def __post_init__(self) -> None:
        self._set("d_model", check_d_model(self.d_model))


# ---------------------------------------------------------------------------------------
# Rotating queries and keys


@dataclass(frozen=True, kw_only=True)
class RopeSpec(SchemeSpec):
    """Rotary position embedding with any registered scaling method.

    Args:
        head_dim: Features per attention head.
        base: The RoPE base (``rope_theta``).
        rotary_dim: The rotated width (even, ``<= head_dim``); ``None``: ``head_dim``.
            Stored resolved.
        layout: ``"half"`` (Hugging Face, GPT-NeoX) or ``"interleaved"`` (Meta, GPT-J).
        scaling: A :class:`~posenc.core.rope.RopeScaling` spec, its dict form, a
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
        self._set("base", check_base(self.base))
        self._set("layout", check_choice(self.layout, "layout", ROPE_LAYOUTS))
        self._set("scaling", as_rope_scaling(self.scaling)[0])
        self.frequencies()  # the width-dependent checks of the scaling

    def frequencies(self, seq_len: int | None = None) -> tuple[np.ndarray, float]:
        """``(inv_freq, attention_factor)`` of the scaling at sequence length ``seq_len``."""
        assert self.rotary_dim is not None  # stored resolved by __post_init__
        return self.scaling.frequencies(self.rotary_dim, self.base, seq_len=seq_len)

    def tables(
        self,
        positions: Any,
        *,
        fmt: str = "float32",
        start: int = 0,
        seq_len: int | None = None,
        inv_freq: np.ndarray | None = None,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(cos, sin)`` at ``positions``, ``(..., rotary_dim)``, times the attention factor.

        ``seq_len`` selects a length-dependent scaling's frequencies; ``inv_freq``
        overrides them (the attention factor stays the scaling's).
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
    """

    scheme: ClassVar[str] = "axial_rope"
    head_dim: int
    n_axes: int = 2
    base: float = 10000.0
    sections: tuple[int, ...] | None = None
    mode: AxialMode = "axial"
    layout: RopeLayout = "half"

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
                    f"{self.n_axes} axes; pass sections= (pairs per axis)"
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


# ---------------------------------------------------------------------------------------
# Added to the attention scores


@dataclass(frozen=True, kw_only=True)
class AlibiSpec(SchemeSpec):
    """ALiBi: the linear bias ``-m_h · distance`` per head (Press et al., 2022).

    Args:
        num_heads: Number of heads; slopes by the paper's rule for any count.
        mode: ``"causal"`` (0 for future keys) or ``"symmetric"``.

    Example:
        >>> AlibiSpec(num_heads=2).bias(2, fmt="float64")[0].tolist()
        [[0.0, 0.0], [-0.0625, 0.0]]
    """

    scheme: ClassVar[str] = "alibi"
    num_heads: int
    mode: str = "causal"

    def __post_init__(self) -> None:
        self._set("num_heads", check_int(self.num_heads, "num_heads", minimum=1))
        self._set("mode", check_choice(self.mode, "mode", MODES))

    def slopes(self) -> np.ndarray:
        """The slope of each head, float64 ``(num_heads,)``."""
        return alibi_slopes(self.num_heads)

    def bias(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: int = 0,
        fmt: str = "float32",
        max_bytes: int | None = DEFAULT_MAX_BYTES,
    ) -> np.ndarray:
        """``(num_heads, query_length, key_length)``, queries at ``offset + i``."""
        return alibi_bias_values(
            query_length,
            key_length,
            num_heads=self.num_heads,
            mode=self.mode,
            offset=offset,
            fmt=fmt,
            max_bytes=max_bytes,
        )


@dataclass(frozen=True, kw_only=True)
class T5Spec(SchemeSpec):
    """T5's learned relative position bias: one weight per (distance bucket, head).

    Args:
        num_heads: Number of heads (the columns of the learned table).
        bidirectional: Encoder (``True``) or causal decoder (``False``) buckets.
        num_buckets: Number of buckets (32 in T5).
        max_distance: Distance from which the buckets saturate (128 in T5).
        compat: ``"hf"`` (Hugging Face's float32 edges) or ``"exact"``.

    Example:
        >>> T5Spec(num_heads=1, bidirectional=False).buckets(np.arange(-3, 1)).tolist()
        [3, 2, 1, 0]
    """

    scheme: ClassVar[str] = "t5"
    num_heads: int
    bidirectional: bool = True
    num_buckets: int = 32
    max_distance: int = 128
    compat: str = "hf"

    def __post_init__(self) -> None:
        self._set("num_heads", check_int(self.num_heads, "num_heads", minimum=1))
        options = check_bucket_options(
            self.bidirectional, self.num_buckets, self.max_distance, self.compat
        )
        for name, value in zip(
            ("bidirectional", "num_buckets", "max_distance", "compat"), options, strict=True
        ):
            self._set(name, value)

    def buckets(self, relative_position: Any) -> np.ndarray:
        """The bucket (int64) of each relative position ``key - query``."""
        return bucket_values(
            np.asarray(relative_position, dtype=np.int64),
            self.bidirectional,
            self.num_buckets,
            self.max_distance,
            self.compat,
        )

    def bucket_table(self) -> np.ndarray:
        """The bucket of every distance ``-max_distance .. max_distance`` (index ``d + max``).

        Farther distances share the end buckets, so a front end clamps ``key - query`` to
        ``±max_distance`` and gathers from this table.
        """
        return self.buckets(np.arange(-self.max_distance, self.max_distance + 1))
