"""The specs of the length-generalisation schemes that add to the attention scores:
KERPLE, FIRE, Sandwich and CoPE.

KERPLE, FIRE and CoPE are learned: their specs hold the options the modules are built
with (the parameters live in :mod:`posenc.torch`). Sandwich has no weights: its spec asks
the core for its numbers (:mod:`posenc.core.sandwich`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .._checks import (
    DEFAULT_MAX_BYTES,
    check_choice,
    check_int,
    check_max_length,
    check_real,
    check_weights,
    check_width,
)
from ..core.alibi import MODES, check_heads
from ..core.precision import largest_finite
from ..core.sandwich import check_sandwich_options, sandwich_bias, sandwich_distance_bias
from .base import SchemeSpec

__all__ = ["CopeSpec", "FireSpec", "KerpleSpec", "SandwichSpec"]

KERNELS: tuple[str, ...] = ("log", "power")


@dataclass(frozen=True, kw_only=True)
class KerpleSpec(SchemeSpec):
    """KERPLE (Chi et al., 2022): a learned conditionally positive definite kernel of the
    distance per head, ``-p·log(1 + a·|m - n|)`` (``"log"``) or ``-a·|m - n|^p``
    (``"power"``), with the authors' names for the two parameters.

    Args:
        num_heads: Number of heads, each with its own ``p`` and ``a``.
        kernel: ``"log"`` or ``"power"``.
        eps: The least value of ``p`` and ``a`` (the authors' 0.01): both are held at or
            above it (and the power kernel's exponent ``p`` at most 2, where the kernel
            stays conditionally positive definite).

    Example:
        >>> KerpleSpec(num_heads=8, kernel="power").to_dict()
        {'scheme': 'kerple', 'num_heads': 8, 'kernel': 'power', 'eps': 0.01}
    """

    scheme: ClassVar[str] = "kerple"
    num_heads: int
    kernel: str = "log"
    eps: float = 0.01

    def __post_init__(self) -> None:
        self._set("num_heads", check_heads(self.num_heads))
        self._set("kernel", check_choice(self.kernel, "kernel", KERNELS))
        eps = check_real(self.eps, "eps", minimum=0.0, strict=True)
        if self.kernel == "power" and eps > 2:
            raise ValueError(f"eps must be at most 2 for the power kernel (p <= 2), got {eps!r}")
        self._set("eps", eps)


@dataclass(frozen=True, kw_only=True)
class FireSpec(SchemeSpec):
    """FIRE (Li et al., 2023): a learned function of the progressively interpolated
    distance, ``f(ψ(i - j) / ψ(max(L, i)))`` with ``ψ(x) = log(c·x + 1)``.

    Args:
        num_heads: Number of heads (the outputs of the MLP ``f``).
        mlp_width: Hidden units of ``f`` (one hidden layer, ReLU; 32 in the paper).
        init_c: Initial ``c`` of ``ψ`` (learned; 0.1 in the authors' code).
        init_L: Initial threshold ``L`` of the normaliser (learned as a multiple of it;
            512 in the authors' code).
        eps: Added to the normaliser ``ψ(max(L, i))`` (1e-6).

    Example:
        >>> FireSpec(num_heads=4).init_L
        512.0
    """

    scheme: ClassVar[str] = "fire"
    num_heads: int
    mlp_width: int = 32
    init_c: float = 0.1
    init_L: float = 512.0
    eps: float = 1e-6

    def __post_init__(self) -> None:
        self._set("num_heads", check_heads(self.num_heads))
        self._set("mlp_width", check_int(self.mlp_width, "mlp_width", minimum=1))
        self._set("init_c", check_real(self.init_c, "init_c", minimum=0.0, strict=True))
        self._set("init_L", check_real(self.init_L, "init_L", minimum=0.0, strict=True))
        self._set("eps", check_real(self.eps, "eps", minimum=0.0, strict=True))

    def check_parameter_format(self, fmt: str, owner: str) -> None:
        """That ``init_c`` and ``init_L`` are finite in ``fmt``, the format a module keeps
        its parameters in (``c`` starts at ``init_c``; ``L`` is ``L_multiplier · init_L``
        formed in it): a ``ValueError`` naming the option, not an infinite ``c`` or ``L``
        and NaN or constant biases.

        Example:
            >>> FireSpec(num_heads=2, init_L=1e6).check_parameter_format("float16", "FIREBias")
            Traceback (most recent call last):
            ...
            ValueError: init_L must be at most 65504, the largest float16 (FIREBias keeps its parameters in float16), got 1000000.0
        """  # noqa: E501
        largest = largest_finite(fmt)
        for name in ("init_c", "init_L"):
            value = getattr(self, name)
            if value > largest:
                raise ValueError(
                    f"{name} must be at most {largest:.6g}, the largest {fmt} ({owner} keeps "
                    f"its parameters in {fmt}), got {value!r}"
                )


@dataclass(frozen=True, kw_only=True)
class SandwichSpec(SchemeSpec):
    """Sandwich (Chi et al., 2023): the dot product of two sinusoidal position vectors,
    minus its value at distance 0, a share per head (:mod:`posenc.core.sandwich`).

    Args:
        num_heads: Number of heads; head ``h`` (1-based) takes ``H / (8h)`` of the bias.
        dim: Width of the sinusoidal vectors (even).
        base: Their base (10000).
        mode: ``"causal"`` (0 for future keys) or ``"symmetric"``.

    Example:
        >>> SandwichSpec(num_heads=2, dim=4, base=2.0).bias(2, fmt="float64")[0].round(4)
        array([[ 0.    ,  0.    ],
               [-0.0905,  0.    ]])
    """

    scheme: ClassVar[str] = "sandwich"
    num_heads: int
    dim: int
    base: float = 10000.0
    mode: str = "causal"

    def __post_init__(self) -> None:
        heads, dim, base = check_sandwich_options(self.num_heads, self.dim, self.base)
        self._set("num_heads", heads)
        self._set("dim", dim)
        self._set("base", base)
        self._set("mode", check_choice(self.mode, "mode", MODES))

    def distance_bias(
        self, distances: Any, *, max_bytes: int | None = DEFAULT_MAX_BYTES
    ) -> np.ndarray:
        """The bias of every head at each distance ``>= 0``, float64 ``(num_heads, n)``."""
        return sandwich_distance_bias(
            distances, num_heads=self.num_heads, dim=self.dim, base=self.base, max_bytes=max_bytes
        )

    def bias(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: int | None = None,
        positions: Any = None,
        key_positions: Any = None,
        fmt: str = "float32",
        max_bytes: int | None = DEFAULT_MAX_BYTES,
    ) -> np.ndarray:
        """``(num_heads, query_length, key_length)``, queries at ``offset + i`` (no
        offset: the last ``query_length`` of the ``key_length`` positions), or at
        ``positions`` and keys at ``key_positions`` (:func:`posenc.sandwich_bias`)."""
        return sandwich_bias(
            query_length,
            key_length,
            num_heads=self.num_heads,
            dim=self.dim,
            base=self.base,
            mode=self.mode,
            offset=offset,
            positions=positions,
            key_positions=key_positions,
            fmt=fmt,
            max_bytes=max_bytes,
        )


@dataclass(frozen=True, kw_only=True)
class CopeSpec(SchemeSpec):
    """CoPE (Golovneva et al., 2024): positions counted by gates of the context.

    Each query counts, back from itself, the gates ``σ(q·k/√d)`` of the keys it may see;
    that count is the key's (fractional) position, and the logit gains ``q·e[p]``, ``e``
    interpolated between learned vectors at the integer positions.

    Args:
        head_dim: Width of the queries and of the learned position vectors.
        max_positions: Number of position vectors, ``0 .. max_positions - 1``; counts
            past the last share it (the authors: the block size plus one).

    Example:
        >>> CopeSpec(head_dim=16, max_positions=65).to_dict()
        {'scheme': 'cope', 'head_dim': 16, 'max_positions': 65}
    """

    scheme: ClassVar[str] = "cope"
    head_dim: int
    max_positions: int

    def __post_init__(self) -> None:
        self._set("head_dim", check_width(self.head_dim, "head_dim"))
        self._set("max_positions", check_max_length(self.max_positions, "max_positions"))
        check_weights(
            {"head_dim": self.head_dim, "max_positions": self.max_positions},
            "CoPE's position vectors",
        )
