"""The Flax module of RoPE with trained frequencies: :class:`LearnedRotaryEmbedding`."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ..._checks import check_choice
from ...core.rope import (
    QK_AXES,
    RopeScaling,
    check_qk_shapes,
    learned_rope_frequencies,
    rope_options,
)
from ...specs import RopeSpec
from .._arguments import check_offset
from .._backend import is_traced
from ..rope import apply_rope
from ..rope_learned import learned_rope_tables
from ._inputs import float_input, place_rows
from ._specs import module_spec

__all__ = ["LearnedRotaryEmbedding"]


class LearnedRotaryEmbedding(nn.Module):
    """Rotary position embedding with trained frequencies, for queries and keys together.

    The Flax twin of :class:`posenc.torch.LearnedRotaryEmbedding`: the same options, the
    same param (``"inv_freq"``, float32, ``(rotary_dim // 2,)``, so a PyTorch state
    dict's frequencies load by name) and the same rotation. The param starts as the
    frequencies of the fixed RoPE with these options (from the core) and is trained; the
    tables are :func:`posenc.jax.learned_rope_tables` of it (angles formed exactly in
    float32 arithmetic; see there for the precision) and the rotation is
    :func:`posenc.jax.apply_rope` (float16/bfloat16 queries and keys rotated in float32
    and cast back).

    Args:
        head_dim: Features per attention head (int >= 2).
        base, rotary_dim, layout, scaling, scaling_params: As for
            :class:`posenc.jax.linen.RotaryEmbedding`: the initial frequencies and
            attention factor are that module's. A scaling whose frequencies follow the
            sequence length (``"dynamic_ntk"``, ``"longrope"``) is a ``ValueError``.
        qk_layout: ``"bshd"`` (``(batch, seq, heads, head_dim)``, the default: the order
            of :class:`posenc.jax.linen.RotaryEmbedding` and the xPos and axial modules)
            or ``"bhsd"`` (``(batch, heads, seq, head_dim)``, the PyTorch module's default).

    Call arguments:
        q, k: Floating arrays of rank 4 in ``qk_layout``, with the same batch and
            sequence sizes (head counts may differ).
        start_index: Position of the first token (int >= 0, or a traced integer scalar).
        positions: Optional integer positions ``(seq,)`` or ``(batch, seq)`` instead of
            ``start_index``; concrete ones in ``0 .. 2**31 - 1``, traced ones outside
            ``0 .. 2**31 - 2`` rotate into NaN.

    Returns:
        ``(q, k)`` rotated, each of its input's shape and dtype.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> rope = LearnedRotaryEmbedding(8, qk_layout="bhsd")
        >>> q = jnp.cos(jnp.arange(2 * 4 * 6 * 8.0)).reshape(2, 4, 6, 8)  # (b, h, s, d)
        >>> variables = rope.init(jax.random.key(0), q, q)
        >>> variables["params"]["inv_freq"].shape
        (4,)
        >>> full, _ = rope.apply(variables, q, q)
        >>> last, _ = rope.apply(variables, q[:, :, 5:], q[:, :, 5:], start_index=5)
        >>> bool(jnp.allclose(last, full[:, :, 5:], atol=1e-6))
        True

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
    """

    head_dim: int
    base: float = 10000.0
    rotary_dim: int | None = None
    layout: str = "half"
    scaling: str | RopeScaling | Mapping[str, Any] | None = None
    scaling_params: Mapping[str, Any] | None = None
    qk_layout: str = "bshd"

    def __post_init__(self) -> None:
        module_spec(self, _start)  # every option checked when the module is made, once
        super().__post_init__()

    @nn.compact
    def __call__(
        self, q: Any, k: Any, *, start_index: Any = 0, positions: Any = None
    ) -> tuple[jax.Array, jax.Array]:
        name = type(self).__name__
        spec, initial, factor = module_spec(self, _start)
        inv_freq = self.param("inv_freq", lambda _: jnp.asarray(initial))  # (r/2,) float32
        q, k = float_input(q, name, "queries"), float_input(k, name, "keys")
        batch, seq = check_qk_shapes(q.shape, k.shape, spec.head_dim, self.qk_layout, name)
        if positions is None:
            start = check_offset(start_index, f"{name}: start_index", seq)
            # concrete: NumPy int64, checked by the tables; traced: widened, a wrap is negative
            where = start + (jnp.arange(seq) if is_traced(start) else np.arange(seq))
        else:
            if not isinstance(start_index, numbers.Integral) or start_index != 0:
                raise TypeError(f"{name}: pass either start_index= or positions=, not both")
            where = _positions(positions, batch, seq, name)
        cos, sin = learned_rope_tables(
            where, inv_freq, layout=spec.layout, attention_factor=factor
        )  # (seq, r) or (batch, seq, r)
        cos, sin = place_rows(cos, self.qk_layout), place_rows(sin, self.qk_layout)
        return (
            apply_rope(q, cos, sin, layout=spec.layout),
            apply_rope(k, cos, sin, layout=spec.layout),
        )


def _start(module: LearnedRotaryEmbedding) -> tuple[RopeSpec, np.ndarray, float]:
    """The module's spec, and the float32 frequencies (read-only: shared by every module
    of these options) and attention factor the param starts at."""
    check_choice(module.qk_layout, "qk_layout", tuple(QK_AXES))
    method, base, _ = rope_options(
        module.scaling, module.scaling_params, base=module.base, seq_len_owner="module"
    )
    spec = RopeSpec(
        head_dim=module.head_dim,
        base=base,
        rotary_dim=module.rotary_dim,
        layout=module.layout,
        scaling=method,
    )
    assert spec.rotary_dim is not None  # RopeSpec stores it resolved
    initial, factor = learned_rope_frequencies(
        method, spec.rotary_dim, spec.base, owner=type(module).__name__
    )
    initial.flags.writeable = False
    return spec, initial, factor


def _positions(positions: Any, batch: int, seq: int, name: str) -> Any:
    """Integer positions ``(seq,)`` or ``(batch, seq)`` (batch 1 broadcasts)."""
    shape = np.shape(positions)
    if len(shape) not in (1, 2) or shape[-1] != seq:
        raise ValueError(
            f"{name}: positions must have shape (seq,) or (batch, seq) with seq={seq}, got "
            f"shape {shape}"
        )
    if len(shape) == 2 and shape[0] not in (1, batch):
        raise ValueError(f"{name}: positions has batch size {shape[0]} but q and k have {batch}")
    return positions  # its values and dtype: checked by learned_rope_tables
