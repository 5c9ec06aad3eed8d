"""The Flax module of CoPE, contextual position encoding (Golovneva et al., 2024)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ...specs import CopeSpec
from ...specs.base import module_from_spec
from ..cope import cope_bias
from ._specs import module_spec

__all__ = ["ContextualPositionEncoding"]


class ContextualPositionEncoding(nn.Module):
    """CoPE for one attention layer, param ``"pos_emb"`` ``(1, head_dim, max_positions)``.

    The module of :class:`posenc.torch.ContextualPositionEncoding`: the same options,
    param name and shape (so the PyTorch module's state dict loads by name:
    ``{"params": {"pos_emb": state_dict["pos_emb"].numpy()}}``) and call; the bias is
    :func:`posenc.jax.cope_bias` of the param.

    Args:
        head_dim: Width of the queries and keys of one head.
        max_positions: Number of learned vectors (``0 .. max_positions - 1``); the
            authors use the block size plus one. A count beyond the last uses it.
        embedding_init: Initialiser of the param (zeros, as the authors).
        param_dtype: dtype of the param.

    Call arguments:
        q: Queries ``(batch, heads, q, head_dim)``, after any rotation.
        k: Keys ``(batch, heads, k, head_dim)``, every cached one included.
        allowed: Optional boolean mask broadcastable to ``(batch, heads, q, k)``, True
            where a query may attend (the causal mask): other keys are not counted.
        scale: The attention's score scale, ``1/√head_dim`` (default 1).

    Shapes:
        output: ``(batch, heads, q, k)``, in the queries' dtype.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cope = ContextualPositionEncoding(8, max_positions=5)
        >>> q = jnp.ones((2, 4, 3, 8))
        >>> variables = cope.init(jax.random.key(0), q, q)
        >>> jax.tree_util.tree_map(jnp.shape, variables)
        {'params': {'pos_emb': (1, 8, 5)}}
        >>> cope.apply(variables, q, q, scale=8**-0.5).shape
        (2, 4, 3, 3)

    References:
        Golovneva, Wang, Weston and Sukhbaatar, "Contextual Position Encoding: Learning to
        Count What's Important", 2024 (arXiv:2405.18719).
    """

    spec_class = CopeSpec

    head_dim: int
    max_positions: int
    embedding_init: Callable[..., Any] = nn.initializers.zeros
    param_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        module_spec(self, _cope_spec)  # the scheme's checks, once for these options
        super().__post_init__()

    @classmethod
    def from_spec(cls, spec: CopeSpec, **options: Any) -> ContextualPositionEncoding:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @nn.compact
    def __call__(self, q: Any, k: Any, *, allowed: Any = None, scale: float = 1.0) -> jax.Array:
        pos_emb = self.param(
            "pos_emb",
            self.embedding_init,
            (1, self.head_dim, self.max_positions),
            self.param_dtype,
        )  # (1, head_dim, max_positions)
        return cope_bias(q, k, pos_emb, allowed=allowed, scale=scale)


def _cope_spec(module: ContextualPositionEncoding) -> CopeSpec:
    return CopeSpec(head_dim=module.head_dim, max_positions=module.max_positions)
