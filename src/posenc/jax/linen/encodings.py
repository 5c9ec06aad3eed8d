"""The Flax modules that add a position encoding to their input: sinusoidal, learned
(N-D: :mod:`.nd`)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ..._checks import (
    FORMULAS,
    LAYOUTS,
    check_base,
    check_choice,
    check_max_length,
    check_probability,
)
from ...core.plan import plan_call, plan_index, plan_rows
from ...specs import LearnedSpec, SinusoidalSpec
from .._arguments import check_offset
from .._backend import dtype_name, format_of, gather_rows, index_range, is_traced, wide_index
from .._tables import call_positions
from ..encodings import SinusoidalTables
from ._inputs import apply_dropout, sequence_input
from ._specs import module_spec

__all__ = [
    "LearnedPositionalEmbedding",
    "SinusoidalPositionalEncoding",
]


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the sinusoidal encoding of "Attention Is All You Need" §3.5, then dropout.

    ``__call__(x) = dropout(x + PE[start : start + seq])`` with the table correctly
    rounded in ``x``'s dtype (the core's float64 values with exact angles, rounded once;
    never a cast of a float32 table). ``d_model`` is ``x.shape[-1]``. The table is a
    constant, not a variable.

    Args:
        max_length: Rows of the table a traced ``start_index`` gathers from; a static
            start past it still gets exact rows (computed for that call).
        base: The ``n`` of ``sin(k / n^(2i/d))``.
        layout: ``"interleaved"`` (paper) or ``"split"`` (tensor2tensor / fairseq).
        formula: ``"paper"`` or ``"tensor2tensor"`` frequency spacing.
        dropout_rate: Dropout probability after the addition (rng ``"dropout"``).

    Call arguments:
        x: ``(batch, seq, d_model)`` or ``(seq, d_model)``, float16, bfloat16, float32 or
            float64.
        start_index: Position of the first token: an int >= 0, or a traced integer
            scalar (positions ``>= max_length`` then give NaN).
        deterministic: ``False`` applies dropout (needs a ``"dropout"`` rng).

    Shapes:
        output: same shape and dtype as ``x``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from posenc.jax import sinusoidal
        >>> pe = SinusoidalPositionalEncoding(max_length=16, base=100)
        >>> out = pe.apply({}, jnp.zeros((1, 3, 4)), start_index=2)
        >>> bool((out[0] == sinusoidal(jnp.arange(2, 5), 4, base=100)).all())
        True

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, §3.5.
    """

    max_length: int = 5000
    base: float = 10000.0
    layout: str = "interleaved"
    formula: str = "paper"
    dropout_rate: float = 0.0

    def __post_init__(self) -> None:
        check_max_length(self.max_length)
        # The spec's checks that need no width (d_model is the input's last axis).
        check_base(self.base)
        check_choice(self.layout, "layout", LAYOUTS)
        check_choice(self.formula, "formula", FORMULAS)
        check_probability(self.dropout_rate, "dropout_rate")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: Any, *, start_index: Any = 0, deterministic: bool = True) -> jax.Array:
        name = type(self).__name__
        x = sequence_input(x, name)
        seq, d_model = x.shape[-2], x.shape[-1]
        spec = module_spec(self, _sinusoidal_spec, d_model)
        start = check_offset(start_index, f"{name}: start_index", seq)
        plan = plan_call(
            self.max_length,
            **call_positions(None, start, seq),
            past="compute",  # a JAX table never grows
            fmt=format_of(x.dtype, "x.dtype"),
            kind="input",
        )
        tables = SinusoidalTables(spec, plan.fmt)
        (rows,) = tables.span(start, seq, max_length=self.max_length, rows=plan.rows)  # (seq, d)
        return apply_dropout(self.dropout_rate, x + rows, deterministic)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a trained embedding per position (param ``"embedding"``), then dropout.

    Learned embeddings cannot represent a position they were not trained with: a static
    ``start_index`` that runs past ``max_length`` raises, and a traced one gives NaN rows
    there (never a clamped or wrapped row).

    Args:
        max_length: Number of positions, ``0 .. max_length-1``.
        init_std: Standard deviation of the normal initialisation (0.02, as GPT-2).
        dropout_rate: Dropout probability after the addition (rng ``"dropout"``).
        param_dtype: dtype of the ``"embedding"`` param ``(max_length, d_model)``.

    Call arguments:
        x, start_index, deterministic: As for :class:`SinusoidalPositionalEncoding`.

    Shapes:
        output: same shape and dtype as ``x`` (the embedding is cast to it).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> emb = LearnedPositionalEmbedding(max_length=16)
        >>> variables = emb.init(jax.random.key(0), jnp.zeros((2, 5, 8)))
        >>> jax.tree_util.tree_map(jnp.shape, variables)
        {'params': {'embedding': (16, 8)}}
    """

    max_length: int
    init_std: float = 0.02
    dropout_rate: float = 0.0
    param_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        module_spec(self, _learned_spec, 1)  # the spec's checks that need no width
        check_probability(self.dropout_rate, "dropout_rate")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: Any, *, start_index: Any = 0, deterministic: bool = True) -> jax.Array:
        name = type(self).__name__
        x = sequence_input(x, name)
        seq, d_model = x.shape[-2], x.shape[-1]
        spec = module_spec(self, _learned_spec, d_model)
        embedding = self.param(
            "embedding",
            nn.initializers.normal(stddev=spec.init_std),
            (spec.max_length, spec.d_model),
            self.param_dtype,
        )  # (max_length, d)
        start = check_offset(start_index, f"{name}: start_index", seq)
        if is_traced(start):
            index_plan = plan_index(dtype_name(start), self.max_length, wide=wide_index())
            index = index_range(start, seq, index_plan)  # (seq,), in the wide dtype
            rows = gather_rows(embedding, index, index_plan)  # (seq, d), NaN past the table
        else:  # a learned embedding has no rows past it: the planner refuses them
            assert isinstance(start, int)  # check_offset makes a known offset an int
            plan = plan_rows(self.max_length, start=start, count=seq, past="refuse")
            if plan.action == "refuse":
                raise ValueError(
                    f"{name}: position {plan.end - 1} (start_index={start}) is beyond "
                    f"max_length={self.max_length} (positions 0..{self.max_length - 1}); "
                    "learned embeddings cannot extrapolate: build it with a larger max_length"
                )
            rows = embedding[plan.start : plan.end]  # (seq, d)
        return apply_dropout(self.dropout_rate, x + rows.astype(x.dtype), deterministic)


def _sinusoidal_spec(module: SinusoidalPositionalEncoding, d_model: int) -> SinusoidalSpec:
    return SinusoidalSpec(
        d_model=d_model, base=module.base, layout=module.layout, formula=module.formula
    )


def _learned_spec(module: LearnedPositionalEmbedding, d_model: int) -> LearnedSpec:
    return LearnedSpec(max_length=module.max_length, d_model=d_model, init_std=module.init_std)
