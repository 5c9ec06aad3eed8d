"""KERPLE's and FIRE's score biases of given weights, in float64: the reference of every
front end.

Both are functions of trained weights, so each front end writes their arithmetic in its
own framework (for gradients); these are the same formulas in NumPy float64, what the
conformance suite compares the front ends with and what a NumPy user calls. Query ``i``
sits at ``offset + i`` and key ``j`` at ``j`` (no offset: the queries are the last
``query_length`` of the ``key_length`` positions, :func:`posenc.core.plan.align_queries`),
or both are given as integer arrays ``(q,)``/``(batch, q)`` and ``(k,)``/``(batch, k)``.

==========  ============================================================================
scheme      bias of query position ``m`` and key position ``n``
==========  ============================================================================
KERPLE      ``-p_h·log(1 + a_h·|m - n|)`` (``"log"``) or ``-a_h·|m - n|^p_h``
            (``"power"``); ``p_h`` and ``a_h`` held at ``eps`` or more (the power
            kernel's ``p_h`` at most 2), as the authors' code projects them
FIRE        ``f_θ(ψ(m - n) / (ψ(max(|L|, m)) + eps))``, ``ψ(x) = log(|c·x| + 1)``,
            ``f_θ`` an MLP ``1 → width → heads`` with a ReLU
==========  ============================================================================

The weights are named and shaped as PyTorch's modules name them (``bias_p``, ``bias_a``
of shape ``(heads, 1, 1)``; FIRE's state dict ``mlp.0.weight``, ``mlp.0.bias``,
``mlp.2.weight``, ``mlp.2.bias``, ``c``, ``L_multiplier``), so a state dict's values are
passed as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._checks import DEFAULT_MAX_BYTES, check_choice, check_memory, check_real, describe
from .plan import align_queries

__all__ = [
    "FIRE_WEIGHTS",
    "check_fire_weights",
    "check_position_batches",
    "check_position_shape",
    "fire_bias",
    "kerple_bias",
    "query_key_positions",
]

KERNELS = ("log", "power")

# FIRE's trained weights: name → shape, with W the MLP's width and H the heads.
FIRE_WEIGHTS: dict[str, tuple[str, ...]] = {
    "mlp.0.weight": ("W", "1"),
    "mlp.0.bias": ("W",),
    "mlp.2.weight": ("H", "W"),
    "mlp.2.bias": ("H",),
    "c": (),
    "L_multiplier": (),
}


def query_key_positions(
    query_length: int,
    key_length: int | None = None,
    *,
    offset: int | None = None,
    positions: Any = None,
    key_positions: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The positions of a bias call's queries and keys, int64 ``(..., q)`` and ``(..., k)``.

    Example:
        >>> query_key_positions(2, 5)  # the queries are the last two of five positions
        (array([3, 4]), array([0, 1, 2, 3, 4]))
    """
    if positions is not None and offset is not None:
        raise ValueError(
            f"pass either offset or positions, not both (got offset={offset!r} with positions)"
        )
    if positions is None:
        query_length, key_length, offset = align_queries(query_length, key_length, offset)
        queries = offset + np.arange(query_length, dtype=np.int64)
    else:
        queries = _integer_positions(positions, "positions", query_length, "query_length")
        if key_length is None:
            key_length = query_length
    if key_positions is None:
        keys = np.arange(key_length, dtype=np.int64)
    else:
        keys = _integer_positions(key_positions, "key_positions", key_length, "key_length")
    check_position_batches(queries.shape, keys.shape)
    return queries, keys


def check_position_shape(shape: tuple[int, ...], name: str, size: Any, size_name: str) -> None:
    """That positions of ``shape`` are ``(size,)`` or ``(batch, size)``; a ValueError
    naming ``name`` and ``size_name`` otherwise (every front end's check)."""
    if len(shape) not in (1, 2) or shape[-1] != size:
        raise ValueError(
            f"{name} must have shape ({size},) or (batch, {size}) for {size_name}={size}, got "
            f"{tuple(shape)}"
        )


def check_position_batches(query_shape: tuple[int, ...], key_shape: tuple[int, ...]) -> None:
    """That batched query and key positions have one batch size (or 1, broadcast)."""
    batches = {shape[0] for shape in (query_shape, key_shape) if len(shape) == 2} - {1}
    if len(batches) > 1:
        raise ValueError(
            f"positions and key_positions have different batch sizes {tuple(query_shape)} "
            f"and {tuple(key_shape)}"
        )


def _integer_positions(value: Any, name: str, size: Any, size_name: str) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an array of integers, got {describe(value)}")
    check_position_shape(array.shape, name, size, size_name)
    return array.astype(np.int64)


def _relative(
    queries: np.ndarray, keys: np.ndarray, entry_bytes: int, what: str, max_bytes: int | None
) -> np.ndarray:
    """``m - n`` of every query and key, ``(..., q, k)`` float64, its memory checked with
    ``entry_bytes`` more per entry."""  # fmt: skip
    batch = max(
        queries.shape[0] if queries.ndim == 2 else 1, keys.shape[0] if keys.ndim == 2 else 1
    )
    entries = batch * queries.shape[-1] * keys.shape[-1]
    check_memory(entries * (16 + entry_bytes), what, max_bytes)
    if queries.ndim == 2 and keys.ndim == 1:
        keys = keys[None]
    distance: np.ndarray = queries[..., :, None] - keys[..., None, :]  # (..., q, k)
    return distance.astype(np.float64)


def _heads(value: Any, name: str) -> np.ndarray:
    """A per-head parameter as float64 ``(H,)``, from ``(H,)`` or PyTorch's ``(H, 1, 1)``."""
    array = np.asarray(value, dtype=np.float64) if _real(value) else None
    if array is None or array.ndim not in (1, 3) or array.shape[1:] not in ((), (1, 1)):
        raise ValueError(f"{name} must have shape (num_heads,) or (num_heads, 1, 1), got "
                         f"{describe(value)}")  # fmt: skip
    if array.size == 0 or not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must hold one finite value per head, got {describe(value)}")
    return array.reshape(-1)


def _real(value: Any) -> bool:
    kind = np.asarray(value).dtype.kind
    return kind in "iuf"


def kerple_bias(
    bias_p: Any,
    bias_a: Any,
    query_length: int,
    key_length: int | None = None,
    *,
    kernel: str = "log",
    eps: float = 0.01,
    offset: int | None = None,
    positions: Any = None,
    key_positions: Any = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """KERPLE's bias of the weights ``bias_p`` and ``bias_a``, float64.

    Args:
        bias_p, bias_a: One value per head, ``(H,)`` or the modules' ``(H, 1, 1)``; used
            as the modules use them, projected into range: both at least ``eps``,
            ``bias_p`` at most 2 for ``"power"``.
        query_length: Number of queries, an int >= 0.
        key_length: Number of keys; ``None``: ``offset + query_length``.
        kernel: ``"log"`` (``-p·log(1 + a·d)``) or ``"power"`` (``-a·d^p``).
        eps: The parameters' least value (KERPLE's 0.01).
        offset: Position of the first query; ``None``: the last of the keys.
        positions, key_positions: Integer positions ``(q,)``/``(batch, q)`` and
            ``(k,)``/``(batch, k)`` instead (with ``positions``, no ``offset``).
        max_bytes: Refuse (``ValueError``) a bias needing more memory; ``None``: no limit.

    Returns:
        ``(H, q, k)``, or ``(batch, H, q, k)`` with batched positions.

    Example:
        >>> kerple_bias([1.0], [1.0], 3)[0].round(4)  # -log(1 + |m - n|)
        array([[-0.    , -0.6931, -1.0986],
               [-0.6931, -0.    , -0.6931],
               [-1.0986, -0.6931, -0.    ]])

    References:
        Chi, Fan, Ramadge and Rudnicky, "KERPLE: Kernelized Relative Positional Embedding
        for Length Extrapolation", NeurIPS 2022.
    """
    kernel = check_choice(kernel, "kernel", KERNELS)
    eps = check_real(eps, "eps", minimum=0.0, strict=True)
    p, a = _heads(bias_p, "bias_p"), _heads(bias_a, "bias_a")
    if p.shape != a.shape:
        raise ValueError(f"bias_p and bias_a must have one value per head each, got "
                         f"{p.size} and {a.size}")  # fmt: skip
    p = np.clip(p, eps, 2.0 if kernel == "power" else None)[:, None, None]  # (H, 1, 1)
    a = np.maximum(a, eps)[:, None, None]
    queries, keys = query_key_positions(
        query_length, key_length, offset=offset, positions=positions, key_positions=key_positions
    )
    distance = np.abs(_relative(queries, keys, 8 * p.size, "this KERPLE bias", max_bytes))
    distance = distance[..., None, :, :]  # (..., 1, q, k)
    if kernel == "log":
        bias: np.ndarray = -p * np.log1p(a * distance)
    else:
        bias = -a * np.power(distance, p)
    return bias  # (..., H, q, k)


def check_fire_weights(weights: Any) -> None:
    """That ``weights`` maps FIRE's six weight names to arrays of matching shapes (any
    arrays with a ``shape``: NumPy, a framework's tensors, traced ones too).

    Example:
        >>> check_fire_weights({"mlp.0.weight": np.zeros((4, 1))})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: weights lacks ['mlp.0.bias', ...]; FIRE's weights are ['mlp.0.weight', ...]
    """
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights must be a mapping of FIRE's weights by name, got "
                        f"{describe(weights)}")  # fmt: skip
    missing = [name for name in FIRE_WEIGHTS if name not in weights]
    if missing:
        raise ValueError(f"weights lacks {missing}; FIRE's weights are {list(FIRE_WEIGHTS)}")
    shapes = {name: tuple(np.shape(weights[name])) for name in FIRE_WEIGHTS}
    width, heads = shapes["mlp.0.bias"][:1] or (0,), shapes["mlp.2.bias"][:1] or (0,)
    sizes = {"W": width[0], "H": heads[0], "1": 1}
    for name, axes in FIRE_WEIGHTS.items():
        shape = tuple(sizes[axis] for axis in axes)
        if shapes[name] != shape:
            raise ValueError(
                f"weights[{name!r}] must have shape {shape} (mlp_width={sizes['W']}, "
                f"num_heads={sizes['H']}), got {shapes[name]}"
            )


def _fire_weights(weights: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """FIRE's six weights as float64, their shapes checked against one another."""
    check_fire_weights(weights)
    return {name: np.asarray(weights[name], dtype=np.float64) for name in FIRE_WEIGHTS}


def fire_bias(
    weights: Mapping[str, Any],
    query_length: int,
    key_length: int | None = None,
    *,
    init_L: float = 512.0,
    eps: float = 1e-6,
    offset: int | None = None,
    positions: Any = None,
    key_positions: Any = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """FIRE's bias of the weights ``weights``, float64.

    Args:
        weights: The trained weights by PyTorch's names (a ``FIREBias`` state dict's
            values; its buffer ``init_L`` may be there too and is not read):
            ``mlp.0.weight`` ``(W, 1)``, ``mlp.0.bias`` ``(W,)``, ``mlp.2.weight``
            ``(H, W)``, ``mlp.2.bias`` ``(H,)``, ``c`` and ``L_multiplier`` scalars.
        query_length, key_length, offset, positions, key_positions, max_bytes: As for
            :func:`kerple_bias`.
        init_L: The threshold ``L`` is ``|L_multiplier · init_L|``.
        eps: Added to the normaliser.

    Returns:
        ``(H, q, k)``, or ``(batch, H, q, k)`` with batched positions.

    Example:
        >>> weights = {"mlp.0.weight": [[1.0]], "mlp.0.bias": [0.0], "mlp.2.weight": [[1.0]],
        ...            "mlp.2.bias": [0.0], "c": 1.0, "L_multiplier": 1.0}
        >>> fire_bias(weights, 3, init_L=1.0)[0].round(4)  # log(1 + |m - n|) / log(1 + max(1, m))
        array([[0.    , 1.    , 1.585 ],
               [1.    , 0.    , 1.    ],
               [1.    , 0.6309, 0.    ]])

    References:
        Li et al., "Functional Interpolation for Relative Positions Improves Long Context
        Transformers", ICLR 2024 (arXiv:2310.04418).
    """
    w = _fire_weights(weights)
    init_L = check_real(init_L, "init_L", minimum=0.0, strict=True)
    eps = check_real(eps, "eps", minimum=0.0, strict=True)
    queries, keys = query_key_positions(
        query_length, key_length, offset=offset, positions=positions, key_positions=key_positions
    )
    width, heads = w["mlp.0.bias"].size, w["mlp.2.bias"].size
    distance = _relative(queries, keys, 8 * (2 + width + heads), "this FIRE bias", max_bytes)
    c, threshold = w["c"], abs(w["L_multiplier"] * init_L)
    normaliser = np.log(np.abs(c * np.maximum(queries.astype(np.float64), threshold)) + 1) + eps
    x = np.log(np.abs(c * distance) + 1) / normaliser[..., :, None]  # (..., q, k)
    hidden = np.maximum(x[..., None] * w["mlp.0.weight"][:, 0] + w["mlp.0.bias"], 0)  # (..., W)
    bias = hidden @ w["mlp.2.weight"].T + w["mlp.2.bias"]  # (..., q, k, H)
    return np.moveaxis(bias, -1, -3)  # (..., H, q, k)
