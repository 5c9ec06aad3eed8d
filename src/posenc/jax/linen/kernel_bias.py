"""The Flax modules of KERPLE, FIRE and Sandwich, over :mod:`posenc.jax.kernel_bias`.

The params have PyTorch's names and shapes (``bias_p``, ``bias_a`` ``(heads, 1, 1)``;
FIRE's ``mlp.0.weight`` ... ``L_multiplier``), so a PyTorch state dict's values load as
they are: ``{"params": {name: jnp.asarray(value) for name, value in state.items()}}``
(without FIRE's buffer ``init_L``, an option here).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ..._checks import check_max_length
from ...core.kernel_bias import FIRE_WEIGHTS
from ...specs import FireSpec, KerpleSpec, SandwichSpec
from ...specs.base import module_from_spec
from .._backend import format_of
from ..kernel_bias import fire_bias, kerple_bias, sandwich_rows
from ._specs import module_spec

__all__ = ["FIREBias", "KERPLEBias", "SandwichBias"]


def _uniform(low: float, high: float, clip: tuple[float, float | None] | None = None) -> Any:
    """An initialiser drawing ``U(low, high)``, then clipped into ``clip``."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        value = jax.random.uniform(key, shape, dtype, low, high)
        return value if clip is None else jnp.clip(value, *clip)

    return init


class KERPLEBias(nn.Module):
    """KERPLE (Chi et al., 2022): a learned kernel of the distance per head.

    Params ``"bias_p"`` and ``"bias_a"``, ``(num_heads, 1, 1)``, drawn as PyTorch's
    :class:`posenc.torch.KERPLEBias` draws them (``2·U(0, 1)`` and ``U(0, 1)``, clipped
    into range); the bias is :func:`posenc.jax.kerple_bias` of them (held in range,
    their gradient passed straight through).

    Args:
        num_heads: Number of heads.
        kernel: ``"log"`` (``-p·log(1 + a·d)``) or ``"power"`` (``-a·d^p``).
        eps: The least value of both params (0.01).
        param_dtype: dtype of the params.

    Call arguments:
        query_length, key_length: Sizes of the score matrix, static ints.
        offset: Position of the first query, an int >= 0 or a traced integer scalar;
            ``None`` (default): the last ``query_length`` of the ``key_length`` positions.
        positions, key_positions: Integer positions instead, ``(q,)``/``(batch, q)``
            and ``(k,)``/``(batch, k)``.
        dtype: The bias's dtype; ``None``: the params'.

    Shapes:
        output: ``(num_heads, q, k)``, or ``(batch, num_heads, q, k)``.

    Example:
        >>> import jax
        >>> bias = KERPLEBias(4)
        >>> variables = bias.init(jax.random.key(0), 5)
        >>> jax.tree_util.tree_map(jax.numpy.shape, variables)
        {'params': {'bias_a': (4, 1, 1), 'bias_p': (4, 1, 1)}}
        >>> bias.apply(variables, 1, 5).shape  # one new query against 5 keys
        (4, 1, 5)
    """

    spec_class = KerpleSpec

    num_heads: int
    kernel: str = "log"
    eps: float = 0.01
    param_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        module_spec(self, _kerple_spec)  # the scheme's checks, once for these options
        super().__post_init__()

    @classmethod
    def from_spec(cls, spec: KerpleSpec, **options: Any) -> KERPLEBias:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @nn.compact
    def __call__(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: Any = None,
        positions: Any = None,
        key_positions: Any = None,
        dtype: Any = None,
    ) -> jax.Array:
        top = 2.0 if self.kernel == "power" else None
        shape = (self.num_heads, 1, 1)
        p = self.param("bias_p", _uniform(0.0, 2.0, (self.eps, top)), shape, self.param_dtype)
        a = self.param("bias_a", _uniform(0.0, 1.0, (self.eps, None)), shape, self.param_dtype)
        return kerple_bias(
            p, a, query_length, key_length, kernel=self.kernel, eps=self.eps, offset=offset,
            positions=positions, key_positions=key_positions, dtype=dtype,
        )  # fmt: skip


class FIREBias(nn.Module):
    """FIRE (Li et al., 2023): a learned function of the progressively normalised distance.

    Params by PyTorch's :class:`posenc.torch.FIREBias` names and shapes: the MLP
    ``1 → mlp_width → num_heads`` (``"mlp.0.weight"`` ``(W, 1)``, ``"mlp.0.bias"``
    ``(W,)``, ``"mlp.2.weight"`` ``(H, W)``, ``"mlp.2.bias"`` ``(H,)``, drawn as
    ``torch.nn.Linear`` draws them), ``"c"`` (``init_c``) and ``"L_multiplier"`` (1);
    the bias is :func:`posenc.jax.fire_bias` of them.

    Args:
        num_heads: Number of heads (the MLP's outputs).
        mlp_width: Hidden units of the MLP (32).
        init_c: Initial ``c`` (0.1).
        init_L: ``L`` is ``|L_multiplier · init_L|`` (512).
        eps: Added to the normaliser (1e-6).
        param_dtype: dtype of the params.

    Call arguments:
        As for :class:`KERPLEBias`.

    Example:
        >>> import jax
        >>> bias = FIREBias(4, mlp_width=8)
        >>> variables = bias.init(jax.random.key(0), 5)
        >>> sorted(variables["params"])
        ['L_multiplier', 'c', 'mlp.0.bias', 'mlp.0.weight', 'mlp.2.bias', 'mlp.2.weight']
        >>> bias.apply(variables, 5, offset=3).shape  # 5 queries after 3 cached tokens
        (4, 5, 8)
    """

    spec_class = FireSpec

    num_heads: int
    mlp_width: int = 32
    init_c: float = 0.1
    init_L: float = 512.0
    eps: float = 1e-6
    param_dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        module_spec(self, _fire_spec)  # the scheme's checks, once for these options
        super().__post_init__()

    @classmethod
    def from_spec(cls, spec: FireSpec, **options: Any) -> FIREBias:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @nn.compact
    def __call__(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: Any = None,
        positions: Any = None,
        key_positions: Any = None,
        dtype: Any = None,
    ) -> jax.Array:
        width, heads = self.mlp_width, self.num_heads
        inits = {  # torch.nn.Linear's: U(±1/sqrt(fan_in)) for weight and bias
            "mlp.0.weight": _uniform(-1.0, 1.0),
            "mlp.0.bias": _uniform(-1.0, 1.0),
            "mlp.2.weight": _uniform(-1 / math.sqrt(width), 1 / math.sqrt(width)),
            "mlp.2.bias": _uniform(-1 / math.sqrt(width), 1 / math.sqrt(width)),
            "c": nn.initializers.constant(self.init_c),
            "L_multiplier": nn.initializers.constant(1.0),
        }
        sizes = {"W": width, "H": heads, "1": 1}
        weights = {
            name: self.param(name, inits[name], tuple(sizes[a] for a in axes), self.param_dtype)
            for name, axes in FIRE_WEIGHTS.items()
        }
        return fire_bias(
            weights, query_length, key_length, init_L=self.init_L, eps=self.eps, offset=offset,
            positions=positions, key_positions=key_positions, dtype=dtype,
        )  # fmt: skip


class SandwichBias(nn.Module):
    """Sandwich (Chi et al., 2023): the dot product of sinusoidal position vectors, no
    variables.

    The values are the core's (:func:`posenc.sandwich_bias`, float64 rounded once to
    ``dtype``) through :func:`posenc.jax.sandwich_bias`; a traced offset or traced
    positions gather them from a table of ``max_length`` distances (NaN past it).

    Args:
        num_heads: Number of heads; head ``h`` (1-based) takes ``H / (8h)`` of the bias.
        dim: Width of the sinusoidal vectors (even).
        base: Their base (10000).
        mode: ``"causal"`` or ``"symmetric"``.
        max_length: Distances a traced call's table covers; ``None``: the key length.
        dtype: dtype of the bias: float32 (default), float16, bfloat16 or float64.

    Call arguments:
        query_length, key_length, offset, positions, key_positions: As for
            :class:`KERPLEBias`.

    Example:
        >>> import numpy as np
        >>> np.asarray(SandwichBias(2, dim=4, base=2.0).apply({}, 3)[1], float).round(4).tolist()
        [[0.0, 0.0, 0.0], [-0.0453, 0.0, 0.0], [-0.163, -0.0453, 0.0]]
    """

    spec_class = SandwichSpec

    num_heads: int
    dim: int
    base: float = 10000.0
    mode: str = "causal"
    max_length: int | None = None
    dtype: Any = "float32"

    def __post_init__(self) -> None:
        module_spec(self, _sandwich_spec)  # every option checked when the module is made, once
        super().__post_init__()

    @classmethod
    def from_spec(cls, spec: SandwichSpec, **options: Any) -> SandwichBias:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    def __call__(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: Any = None,
        positions: Any = None,
        key_positions: Any = None,
    ) -> jax.Array:
        spec, fmt = module_spec(self, _sandwich_spec)
        return sandwich_rows(
            spec, fmt, query_length, key_length, offset=offset, positions=positions,
            key_positions=key_positions, max_length=self.max_length,
        )  # fmt: skip


def _kerple_spec(module: KERPLEBias) -> KerpleSpec:
    return KerpleSpec(num_heads=module.num_heads, kernel=module.kernel, eps=module.eps)


def _fire_spec(module: FIREBias) -> FireSpec:
    spec = FireSpec(num_heads=module.num_heads, mlp_width=module.mlp_width, init_c=module.init_c,
                    init_L=module.init_L, eps=module.eps)  # fmt: skip
    spec.check_parameter_format(format_of(module.param_dtype), type(module).__name__)
    return spec


def _sandwich_spec(module: SandwichBias) -> tuple[SandwichSpec, str]:
    """The module's spec and the bias's format, every option checked."""
    spec = SandwichSpec(num_heads=module.num_heads, dim=module.dim, base=module.base,
                        mode=module.mode)  # fmt: skip
    if module.max_length is not None:
        check_max_length(module.max_length)
    return spec, format_of(module.dtype)
