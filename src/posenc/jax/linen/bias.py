"""The Flax modules of the attention-score biases: ALiBi and T5's relative position bias."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ..._checks import MemoryLimitError, check_max_length
from ...specs import AlibiSpec, T5Spec
from ...specs.base import module_from_spec
from .._backend import format_of
from ..bias import alibi_rows, t5_bias
from ._specs import module_spec

__all__ = ["ALiBiBias", "T5RelativeBias"]


class ALiBiBias(nn.Module):
    """ALiBi: the bias ``-m_h · distance`` per head, ``(num_heads, q, k)``, no variables.

    The values are the core's (:func:`posenc.alibi_bias`: slope × distance in float64,
    rounded once to ``dtype``) through :func:`posenc.jax.alibi_bias`; a traced ``offset``
    gathers them from a per-distance table (rows with query positions past ``max_length``
    are NaN).

    Args:
        num_heads: Number of heads (slopes by Press et al.'s rule).
        mode: ``"causal"`` (0 for future keys) or ``"symmetric"``.
        max_length: Bound on the query positions for a traced ``offset``; ``None``: the
            key length.
        dtype: dtype of the bias: float32 (default), float16, bfloat16 or float64.

    Call arguments:
        query_length, key_length: Sizes of the score matrix, static ints
            (``key_length`` defaults to ``offset + query_length``, static offsets only).
        offset: Position of the first query, an int >= 0 or a traced integer scalar;
            ``None`` (default): the last ``query_length`` of the ``key_length`` positions.

    Shapes:
        output: ``(num_heads, query_length, key_length)``.

    Example:
        >>> ALiBiBias(2).apply({}, 3).tolist()[1]  # head 1: slope 2**-8
        [[0.0, 0.0, 0.0], [-0.00390625, 0.0, 0.0], [-0.0078125, -0.00390625, 0.0]]

    References:
        Press, Smith and Lewis, "Train Short, Test Long: Attention with Linear Biases
        Enables Input Length Extrapolation", ICLR 2022.
    """

    spec_class = AlibiSpec

    num_heads: int
    mode: str = "causal"
    max_length: int | None = None
    dtype: Any = "float32"

    def __post_init__(self) -> None:
        module_spec(self, _alibi_spec)  # every option checked when the module is made, once
        super().__post_init__()

    @classmethod
    def from_spec(cls, spec: AlibiSpec, **options: Any) -> ALiBiBias:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    def __call__(
        self, query_length: int, key_length: int | None = None, *, offset: Any = None
    ) -> jax.Array:
        spec, fmt = module_spec(self, _alibi_spec)
        with _named_limit(query_length, key_length):
            return alibi_rows(
                spec, fmt, query_length, key_length, offset=offset, max_length=self.max_length
            )


class T5RelativeBias(nn.Module):
    """T5's learned relative position bias, param ``"relative_attention_bias"``.

    The param has shape ``(num_buckets, num_heads)``, the layout of Hugging Face's
    ``relative_attention_bias.weight`` (so its values load as they are); the bias is
    :func:`posenc.jax.t5_bias` of it: the core's buckets, gathered, gradients flowing to
    the weights.

    Args:
        num_heads: Number of heads.
        bidirectional: Encoder (``True``) or causal decoder (``False``) buckets.
        num_buckets: Number of buckets (32 in T5).
        max_distance: Distance from which the buckets saturate (128 in T5).
        compat: ``"hf"`` (Hugging Face's float32 bucket edges) or ``"exact"``.
        embedding_init: Initialiser of the param (normal with stddev 1, as
            ``torch.nn.Embedding``).
        param_dtype: dtype of the param.

    Call arguments:
        query_length, key_length, offset: As for :class:`ALiBiBias` (a traced offset
            needs ``key_length``; rows with negative query positions are NaN).

    Shapes:
        output: ``(num_heads, query_length, key_length)``.

    Example:
        >>> import jax
        >>> bias = T5RelativeBias(4)
        >>> variables = bias.init(jax.random.key(0), 5)
        >>> jax.tree_util.tree_map(jax.numpy.shape, variables)
        {'params': {'relative_attention_bias': (32, 4)}}
        >>> bias.apply(variables, 5).shape
        (4, 5, 5)

    References:
        Raffel et al., "Exploring the Limits of Transfer Learning with a Unified
        Text-to-Text Transformer", JMLR 2020, §2.1.
    """

    spec_class = T5Spec

    num_heads: int
    bidirectional: bool = True
    num_buckets: int = 32
    max_distance: int = 128
    compat: str = "hf"
    embedding_init: Callable[..., Any] = nn.initializers.normal(stddev=1.0)
    param_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        module_spec(self, _t5_spec)  # the scheme's checks, once for these options
        super().__post_init__()

    @classmethod
    def from_spec(cls, spec: T5Spec, **options: Any) -> T5RelativeBias:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @nn.compact
    def __call__(
        self, query_length: int, key_length: int | None = None, *, offset: Any = None
    ) -> jax.Array:
        weights = self.param(
            "relative_attention_bias",
            self.embedding_init,
            (self.num_buckets, self.num_heads),
            self.param_dtype,
        )  # (num_buckets, H)
        with _named_limit(query_length, key_length):
            return t5_bias(
                weights,
                query_length,
                key_length,
                bidirectional=self.bidirectional,
                max_distance=self.max_distance,
                offset=offset,
                compat=self.compat,
            )


def _alibi_spec(module: ALiBiBias) -> tuple[AlibiSpec, str]:
    """The module's spec and the bias's format, every option checked."""
    spec = AlibiSpec(num_heads=module.num_heads, mode=module.mode)
    if module.max_length is not None:
        check_max_length(module.max_length)
    return spec, format_of(module.dtype)


def _t5_spec(module: T5RelativeBias) -> T5Spec:
    return T5Spec(
        num_heads=module.num_heads,
        bidirectional=module.bidirectional,
        num_buckets=module.num_buckets,
        max_distance=module.max_distance,
        compat=module.compat,
    )


@contextlib.contextmanager
def _named_limit(query_length: Any, key_length: Any) -> Iterator[None]:
    """A bias refused by the memory limit, said of the call's lengths (a module has no
    ``max_bytes``)."""
    try:
        yield
    except MemoryLimitError as error:
        raise error.naming(
            f"query_length={query_length}, key_length={key_length}",
            "compute it in blocks of queries (offset=)",
        ) from None
