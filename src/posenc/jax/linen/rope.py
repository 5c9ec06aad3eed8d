"""The Flax module of rotary position embedding (RoPE): :class:`RotaryEmbedding`."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from ..._checks import (
    check_base,
    check_choice,
    check_int,
    check_max_length,
    check_positions,
    describe,
)
from ...core.rope import ROPE_LAYOUTS, RopeScaling, rope_options
from ...specs import RopeSpec
from .._arguments import check_offset, check_traced_index
from .._backend import format_of, is_traced
from ..rope import apply_rope, rope_rows
from ._inputs import float_input
from ._specs import module_spec

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(nn.Module):
    """Rotary position embedding for ``(batch, seq, heads, head_dim)`` queries or keys.

    Call it on the queries and on the keys (any head counts: grouped-query attention).
    The cos/sin tables come from the core (frequencies and attention factor from
    :func:`~posenc.core.rope.rope_scaling`, exact angles, one rounding to float32, or
    float64 for float64 input) and are constants, not variables; the rotation is
    :func:`posenc.jax.apply_rope` (float16/bfloat16 input rotated in float32 and cast
    back). ``head_dim`` is ``x.shape[-1]``.

    Length-dependent scalings follow the call's length ``L = start_index + seq`` (or
    ``max(positions) + 1``), as in every front end (:func:`posenc.core.plan.plan_scaling`):
    LongRoPE's factors are selected in the graph when ``L`` is traced; dynamic NTK needs
    ``L`` known when the call runs (a ``ValueError`` otherwise).

    Args:
        base: The RoPE base (``rope_theta``).
        rotary_dim: The rotated width (even, ``<= head_dim``); ``None``: all of it.
        layout: ``"half"`` (Hugging Face, GPT-NeoX) or ``"interleaved"`` (Meta, GPT-J).
        scaling: ``None`` or a key of :data:`posenc.ROPE_SCALINGS`; or a
            :class:`~posenc.core.rope.RopeScaling` spec, or its dict form, without
            ``scaling_params`` (read by :func:`~posenc.core.rope.rope_options`).
        scaling_params: The method's parameters (see :mod:`posenc.core.rope`).
        max_length: Rows of the tables traced positions gather from; static positions
            past it still get exact rows (computed for that call).
        head_dim: ``None``, or the width the input must have (``from_hf_config`` sets
            the config's, so that an input of another width is an error).

    Call arguments:
        x: ``(batch, seq, heads, head_dim)``, a float dtype.
        start_index: Position of the first token (int >= 0 or traced integer scalar).
        positions: Optional integer positions ``(seq,)`` or ``(batch, seq)`` instead of
            ``start_index``; concrete ones must be >= 0, traced ones outside
            ``0 .. max_length-1`` give NaN.

    Shapes:
        output: same shape and dtype as ``x``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> rope = RotaryEmbedding(max_length=32)
        >>> q = jnp.cos(jnp.arange(2 * 6 * 4 * 16.0)).reshape(2, 6, 4, 16)
        >>> full = rope.apply({}, q)
        >>> last = rope.apply({}, q[:, 5:], start_index=5)  # KV-cache decoding
        >>> bool((last == full[:, 5:]).all())
        True

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
    """

    base: float = 10000.0
    rotary_dim: int | None = None
    layout: str = "half"
    scaling: str | RopeScaling | Mapping[str, Any] | None = None
    scaling_params: Mapping[str, Any] | None = None
    max_length: int = 4096
    head_dim: int | None = None

    @classmethod
    def from_hf_config(
        cls, config: Any, *, layer_type: str | None = None, **options: Any
    ) -> RotaryEmbedding:
        """The module of a Hugging Face ``transformers`` config's RoPE (object or dict);
        see :meth:`posenc.RopeSpec.from_hf_config`. ``options``: ``max_length``, ..."""
        spec = RopeSpec.from_hf_config(config, layer_type=layer_type)
        fields = spec.fields()
        overlap = sorted(set(options) & set(fields))
        if overlap:
            raise TypeError(f"{cls.__name__}.from_hf_config: {overlap} are given by the config")
        return cls(**fields, **options)

    def __post_init__(self) -> None:
        # Every option checked when the module is made (with head_dim, the whole spec),
        # once for equal options: Flax makes the module again at every apply.
        if self.head_dim is None:
            module_spec(self, _options)
        else:
            module_spec(self, _spec, self.head_dim)
        super().__post_init__()

    def __call__(self, x: Any, *, start_index: Any = 0, positions: Any = None) -> jax.Array:
        name = type(self).__name__
        x = float_input(x, name, "queries or keys")
        if x.ndim != 4:
            raise ValueError(
                f"{name} expects x of shape (batch, seq, heads, head_dim), got shape {x.shape}"
            )
        batch, seq, head_dim = x.shape[0], x.shape[1], x.shape[-1]
        if self.head_dim is not None and head_dim != self.head_dim:
            raise ValueError(
                f"{name} was made for head_dim={self.head_dim}, got x of shape {x.shape}"
            )
        spec = module_spec(self, _spec, head_dim)
        # (float32 tables for float16 and bfloat16 input too: apply_rope rotates in float32)
        fmt = format_of(x.dtype, "x.dtype")
        if positions is None:
            start = check_offset(start_index, f"{name}: start_index", seq)
            cos, sin = rope_rows(
                spec, fmt, start=start, count=seq, max_length=self.max_length, name=name
            )  # (seq, r)
        else:
            if not isinstance(start_index, numbers.Integral) or start_index != 0:
                raise TypeError(f"{name}: pass either start_index= or positions=, not both")
            positions = _rope_positions(positions, batch, seq, name)
            cos, sin = rope_rows(
                spec, fmt, positions=positions, max_length=self.max_length, name=name
            )  # (seq, r) or (batch, seq, r)
        # a heads axis before the features
        return apply_rope(x, cos[..., None, :], sin[..., None, :], layout=spec.layout)


def _options(module: RotaryEmbedding) -> tuple[RopeScaling, float]:
    """The scaling and base of the module's options, parsed by the core's one parser;
    every option checked but those that need the width (the input's last axis)."""
    check_base(module.base)
    if module.head_dim is not None:
        check_int(module.head_dim, "head_dim", minimum=2)
    if module.rotary_dim is not None:
        check_int(module.rotary_dim, "rotary_dim", minimum=2)
    check_choice(module.layout, "layout", ROPE_LAYOUTS)
    check_max_length(module.max_length)
    method, base, _ = rope_options(
        module.scaling, module.scaling_params, base=module.base, seq_len_owner="module"
    )
    return method, base


def _spec(module: RotaryEmbedding, head_dim: int) -> RopeSpec:
    """The module's :class:`~posenc.specs.RopeSpec` for queries and keys of ``head_dim``."""
    method, base = module_spec(module, _options)
    return RopeSpec(
        head_dim=head_dim, base=base, rotary_dim=module.rotary_dim, layout=module.layout,
        scaling=method,
    )  # fmt: skip


def _rope_positions(positions: Any, batch: int, seq: int, name: str) -> Any:
    """Integer positions ``(seq,)`` or ``(batch, seq)``: traced as is, concrete as NumPy."""
    if not is_traced(positions):
        if isinstance(positions, (np.bool_, numbers.Number)):
            raise TypeError(
                f"{name}: positions must be an integer array of shape (seq,) or (batch, seq), "
                f"got {describe(positions)}"
            )
        positions = check_positions(positions, f"{name}: positions")
        if positions.dtype.kind not in "iu":
            raise TypeError(
                f"{name}: positions must hold integers, got an array of dtype {positions.dtype}"
            )
    else:
        check_traced_index(positions, f"{name}: positions")
    if positions.ndim not in (1, 2) or positions.shape[-1] != seq:
        raise ValueError(
            f"{name}: positions must have shape (seq,) or (batch, seq) with seq={seq}, got "
            f"shape {positions.shape}"
        )
    if positions.ndim == 2 and positions.shape[0] not in (1, batch):
        raise ValueError(f"{name}: positions has batch size {positions.shape[0]} but x has {batch}")
    if not is_traced(positions) and positions.size and int(positions.min()) < 0:
        raise ValueError(f"{name}: positions must be >= 0, got {int(positions.min())}")
    return positions
