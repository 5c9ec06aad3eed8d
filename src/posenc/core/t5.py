"""T5's relative position buckets and the learned bias gathered from them.

T5 (Raffel et al. 2020) adds to every attention logit a learned scalar per head that
depends only on the *bucket* of the relative position ``d = key - query``. Each
direction has ``side`` buckets (``num_buckets``, or ``num_buckets // 2`` for
bidirectional attention); with ``max_exact = side // 2``:

* ``|d| < max_exact``: one bucket per distance (bucket ``|d|``);
* ``max_exact <= |d| < max_distance``: ``side - max_exact`` buckets with log-spaced
  edges, bucket ``max_exact + ⌊(side - max_exact) · ln(|d|/max_exact) /
  ln(max_distance/max_exact)⌋``;
* ``|d| >= max_distance``: the last bucket, ``side - 1``.

Bidirectional attention (the encoder) gives keys after the query (``d > 0``) the
upper ``num_buckets // 2`` buckets; causal attention (the decoder) sends every
``d >= 0`` to bucket 0.

Which integers sit at the bucket edges is decided by a logarithm, so it depends on
how that logarithm is evaluated. Mesh TensorFlow and Hugging Face (HF) evaluate the
formula in float32; this module offers that (``compat="hf"``) and the exact edges found
with integer arithmetic (``compat="exact"``). See :func:`relative_position_bucket`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any, Literal

import numpy as np

from .._checks import DEFAULT_MAX_BYTES, check_choice, check_int, check_memory, describe
from .plan import align_queries
from .relative import diagonal_expand, diagonal_positions, relative_positions

__all__ = [
    "COMPATS",
    "bucket_values",
    "check_bucket_options",
    "relative_position_bucket",
    "relative_positions",
    "t5_bias",
]

Compat = Literal["hf", "exact"]
COMPATS: tuple[Compat, ...] = ("hf", "exact")
_INT64_MAX = int(np.iinfo(np.int64).max)
_LOG_INT64_MAX = math.log(2**64)  # (a guess past 2**63 - 1 is clipped anyway)


def relative_position_bucket(
    relative_position: Any,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
    compat: str = "hf",
) -> np.ndarray:
    """T5's bucket of each relative position (``key position - query position``).

    Args:
        relative_position: An int or an integer array of any shape (``key -
            query``, see :func:`relative_positions`).
        bidirectional: ``True`` for attention that sees both sides (T5's encoder):
            keys after the query (``d > 0``) get the upper ``num_buckets // 2``
            buckets. ``False`` for causal attention (T5's decoder): every ``d >= 0``
            (the query itself and the future keys the causal mask hides) is bucket 0.
        num_buckets: Number of buckets, the rows of the learned table; an int >= 2
            (>= 4 when bidirectional). An odd count leaves bucket ``num_buckets - 1``
            unused when bidirectional, as in HF.
        max_distance: Distances ``|d| >= max_distance`` share the last bucket of their
            side. An int greater than ``max_exact`` (``num_buckets // 2``, or
            ``num_buckets // 4`` when bidirectional): with ``max_distance <= max_exact`` the formula
            divides by ``ln(max_distance / max_exact) <= 0`` (HF then returns negative
            buckets). Any larger int is valid: one past every int64 distance (``2**63``
            and beyond) only spreads the log buckets wider, leaving the last ones empty.
        compat: How the log-spaced bucket edges are decided:

            ``"hf"`` (default): the formula as Hugging Face's
            ``T5Attention._relative_position_bucket`` (and Mesh TensorFlow) evaluate
            it: ``max_exact + int(float32(log(float32(|d|) / max_exact)) /
            float32(ln(max_distance / max_exact)) * (side - max_exact))`` (``side``:
            the buckets of one direction), every step rounded to float32, with a
            correctly rounded float32 ``log``. The T5
            checkpoints were trained with this float32 formula (in Mesh TensorFlow).

            ``"exact"``: the edges of exact arithmetic, found with integers: ``|d|`` is
            in log bucket ``k`` or above iff ``(|d| / max_exact)^(side - max_exact)
            >= (max_distance / max_exact)^k``.

    Returns:
        int64 array of ``relative_position``'s shape, values in ``[0, num_buckets)``.

    Shapes:
        ``()``, ``(L,)``, ``(Q, K)``, ... → the same shape.

    The two ``compat`` modes agree, and agree with HF's PyTorch function on the CPU, for
    every ``|d| <= 10**5`` at every ``num_buckets`` in {8, 16, 24, 32, 48, 64, 96, 128,
    256} and ``max_distance`` in {16, 32, ..., 65536, 100, 200, 500, 1000, 2000, 5000,
    10**4, 10**5}, both directions (the tests check a part of this grid). They differ
    only next to an edge whose exact value is an integer or within float32 rounding of
    one, which happens for a few unusual settings. With ``num_buckets=17,
    max_distance=27`` (causal), ``(12/8)^9 = (27/8)^3`` and ``(18/8)^9 = (27/8)^6`` put
    ``|d| = 12`` and ``18`` exactly on edges and float32 puts both one bucket lower;
    with ``num_buckets=15, max_distance=636`` float32 rounds ``y = 5.9999995`` up and
    puts ``|d| = 206`` one bucket higher. Exactly on an edge the last bit of the float32
    ``log`` decides, and float32 ``log`` is not correctly rounded everywhere (PyTorch's
    CPU ``log`` is 1 ulp off for about 3% of inputs), so there HF itself lands on
    either side: PyTorch puts 12 in the exact bucket and 18 in the float32 one. Over
    ``num_buckets`` 2..128, ``max_distance`` up to 1100 and ``|d|`` up to
    ``1.2 · max_distance``, ``"exact"`` differs from PyTorch's CPU result at 179
    (setting, distance) pairs and ``"hf"`` at 73, 66 of them exactly on an edge.

    Example:
        >>> relative_position_bucket(np.array([-200, -128, -127, -16, -8, -1, 0, 1, 8, 16, 200]))
        array([15, 15, 15, 10,  8,  1,  0, 17, 24, 26, 31])
        >>> relative_position_bucket([-20, -1, 0, 5], bidirectional=False)
        array([17,  1,  0,  0])

    References:
        Raffel et al., "Exploring the Limits of Transfer Learning with a Unified
        Text-to-Text Transformer", JMLR 2020, §2.1; Mesh TensorFlow
        ``transformer_layers._relative_position_bucket``; Hugging Face
        ``transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket``.
    """
    bidirectional, num_buckets, max_distance, compat = check_bucket_options(
        bidirectional, num_buckets, max_distance, compat
    )
    relative_position = _check_relative_position(relative_position)
    return bucket_values(relative_position, bidirectional, num_buckets, max_distance, compat)


def t5_bias(
    weights: Any,
    query_length: int,
    key_length: int | None = None,
    *,
    bidirectional: bool = True,
    max_distance: int = 128,
    offset: int | None = None,
    compat: str = "hf",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """The learned relative position bias of T5 for every (head, query, key).

    What HF's ``T5Attention.compute_bias`` returns (without its leading batch axis of
    1): ``bias[h, i, j] = weights[bucket(j - (offset + i)), h]``.

    Args:
        weights: The learned table, shape ``(num_buckets, num_heads)`` (the
            ``relative_attention_bias.weight`` of an HF T5 layer, as a NumPy array).
            ``num_buckets`` is its number of rows.
        query_length: Number of queries, an int >= 0.
        key_length: Number of keys, an int >= 0; ``None``: ``offset +
            query_length`` (every cached token and the queries themselves).
        bidirectional: ``True`` for the encoder, ``False`` for the decoder's
            self-attention (HF: ``not config.is_decoder``).
        max_distance: See :func:`relative_position_bucket`
            (``config.relative_attention_max_distance``, 128 in every T5 checkpoint).
        offset: Position of the first query, an int >= 0. ``None`` (default): the
            queries are the last ``query_length`` of the ``key_length`` positions, as
            with a KV cache (:func:`posenc.core.plan.align_queries`; 0 when the lengths
            are equal or ``key_length`` is ``None``).
        compat: ``"hf"`` or ``"exact"``, see :func:`relative_position_bucket`.
        max_bytes: Refuse (``ValueError``) a result larger than this; ``None`` removes
            the limit.

    Returns:
        Array of shape ``(num_heads, query_length, key_length)`` and the dtype of
        ``weights``: the entries are copies of the table's values, nothing is computed.

    Shapes:
        ``weights``: ``(num_buckets, num_heads)`` → ``(num_heads, query_length,
        key_length)``; add a batch axis with ``[None]`` for HF's ``(1, H, Q, K)``.

    Example:
        >>> weights = np.arange(32.0).reshape(16, 2)  # 16 buckets, 2 heads
        >>> t5_bias(weights, 3, bidirectional=False, max_distance=32)[0]
        array([[0., 0., 0.],
               [2., 0., 0.],
               [4., 2., 0.]])
    """
    weights = _check_weights(weights)
    num_buckets, num_heads = weights.shape
    bidirectional, num_buckets, max_distance, compat = check_bucket_options(
        bidirectional, num_buckets, max_distance, compat, name="weights.shape[0] (num_buckets)"
    )
    query_length, key_length, offset = align_queries(query_length, key_length, offset)
    check_memory(
        num_heads * query_length * key_length * weights.dtype.itemsize, "this T5 bias", max_bytes
    )
    positions = diagonal_positions(query_length, key_length, offset)
    buckets = bucket_values(positions, bidirectional, num_buckets, max_distance, compat)
    per_diagonal = np.ascontiguousarray(weights.T)[:, buckets]  # (H, Q + K - 1)
    return diagonal_expand(per_diagonal, query_length, key_length)


# ---------------------------------------------------------------------------------------
# Buckets


MAX_BUCKETS = 1 << 16
"""The most buckets :func:`check_bucket_options` accepts: each log bucket's first distance
is found by bisection, once per (num_buckets, max_distance)."""


def check_bucket_options(
    bidirectional: Any,
    num_buckets: Any,
    max_distance: Any,
    compat: Any,
    *,
    name: str = "num_buckets",
) -> tuple[bool, int, int, str]:
    """Validated ``(bidirectional, num_buckets, max_distance, compat)``."""
    if not isinstance(bidirectional, (bool, np.bool_)):
        raise TypeError(
            "bidirectional must be True (encoder: both directions) or False (decoder: "
            f"causal), a bool, got {describe(bidirectional)}"
        )
    bidirectional = bool(bidirectional)
    minimum = 4 if bidirectional else 2
    num_buckets = check_int(num_buckets, name, minimum=1)
    if num_buckets > MAX_BUCKETS:
        raise ValueError(
            f"{name} must be at most {MAX_BUCKETS} (2**16; T5 uses 32), got {num_buckets}"
        )
    if num_buckets < minimum:
        why = "two per direction" if bidirectional else "one exact bucket and one log bucket"
        raise ValueError(
            f"{name} must be >= {minimum} with bidirectional={bidirectional} ({why}), "
            f"got {num_buckets}"
        )
    max_exact = _side_buckets(bidirectional, num_buckets) // 2
    max_distance = check_int(max_distance, "max_distance", minimum=1)
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance must be > max_exact = {max_exact} ({name}={num_buckets}: the "
            f"distances below max_exact have one bucket each; the log-spaced buckets span "
            f"max_exact .. max_distance), got {max_distance}"
        )
    compat = check_choice(compat, "compat", COMPATS)
    return bidirectional, num_buckets, max_distance, compat


def bucket_values(
    relative_position: np.ndarray,
    bidirectional: bool,
    num_buckets: int,
    max_distance: int,
    compat: str,
) -> np.ndarray:
    """:func:`relative_position_bucket` on validated options and an int64 array."""
    side = _side_buckets(bidirectional, num_buckets)
    if bidirectional:
        upper: np.ndarray | int = np.where(relative_position > 0, side, 0)
        distance = np.abs(relative_position)
    else:
        upper = 0
        distance = np.maximum(-relative_position, 0)
    max_exact = side // 2
    edges = _log_edges(side, max_distance, compat)
    large = max_exact + np.searchsorted(edges, distance, side="right")
    buckets: np.ndarray = (upper + np.where(distance < max_exact, distance, large)).astype(np.int64)
    return buckets


def _side_buckets(bidirectional: bool, num_buckets: int) -> int:
    """Buckets for one direction."""
    return num_buckets // 2 if bidirectional else num_buckets


@lru_cache(maxsize=64)
def _log_edges(side: int, max_distance: int, compat: str) -> np.ndarray:
    """The smallest distance in log bucket ``k``, for ``k = 1 .. side - max_exact - 1``.

    Log bucket 0 starts at ``max_exact``; past the last edge everything is bucket
    ``side - 1``. Both rules are monotone in the distance, so each edge is found by
    bisection near its exact real value ``max_exact · (max_distance/max_exact)^(k/n)``.
    """
    max_exact = side // 2
    n = side - max_exact
    log_ratio = _log_ratio(max_distance, max_exact)
    if compat == "hf":

        def reaches(distance: int, k: int) -> bool:
            return _hf_log_bucket(distance, max_exact, n, log_ratio) >= k

    else:

        def reaches(distance: int, k: int) -> bool:
            return _exact_reaches(distance, k, max_exact, n, log_ratio, max_distance)

    # No distance between int64 positions exceeds 2**63 - 1: an edge past it is never
    # reached, and it and every later edge are left out (a max_distance that large means
    # the last buckets hold no distance at all).
    top = min(max_distance, _INT64_MAX)
    edges: list[int] = []
    for k in range(1, n):
        if top < max_distance and not reaches(top, k):
            break
        guess = math.exp(min(math.log(max_exact) + log_ratio * k / n, _LOG_INT64_MAX))
        low = max(max_exact, math.floor(guess * (1 - 1e-5)) - 2)
        high = min(top, math.ceil(guess * (1 + 1e-5)) + 2)
        if low > high or (low > max_exact and reaches(low, k)) or not reaches(high, k):
            low, high = max_exact, top  # never seen; bisect the whole range
        edges.append(_first(partial(reaches, k=k), low, high))
    array = np.array(edges, dtype=np.int64)
    array.flags.writeable = False
    return array


def _log_ratio(max_distance: int, max_exact: int) -> float:
    """``ln(max_distance / max_exact)``, as Hugging Face computes it (a float quotient),
    or from the logs of the two ints where the quotient is past the largest float."""
    try:
        return math.log(max_distance / max_exact)
    except OverflowError:
        return math.log(max_distance) - math.log(max_exact)


def _first(predicate: Callable[[int], bool], low: int, high: int) -> int:
    """Smallest ``d`` in ``[low, high]`` with ``predicate(d)``, given ``predicate(high)``."""
    while low < high:
        middle = (low + high) // 2
        if predicate(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _hf_log_bucket(distance: int, max_exact: int, n: int, log_ratio: float) -> int:
    """HF's ``int(log(float32(d) / max_exact) / ln(max_distance/max_exact) * n)`` in float32.

    Each step is rounded to float32 as PyTorch does for a float32 tensor and Python
    scalars (the scalars are first rounded to float32); the log is correctly rounded.
    """
    x = np.float32(distance) / np.float32(max_exact)
    log = np.float32(np.log(np.float64(x)))
    scaled = log / np.float32(log_ratio) * np.float32(n)
    return int(scaled)  # truncation toward zero, as .to(torch.long)


def _exact_reaches(
    distance: int, k: int, max_exact: int, n: int, log_ratio: float, max_distance: int
) -> bool:
    """Whether ``n · ln(distance/max_exact) >= k · ln(max_distance/max_exact)`` exactly."""
    left, right = n * math.log(distance / max_exact), k * log_ratio
    if abs(left - right) > 1e-9 * (abs(left) + abs(right) + 1):
        return left > right
    # Too close for float64: compare (d/me)^n with (md/me)^k as integers.
    exact: bool = distance**n * max_exact**k >= max_distance**k * max_exact**n
    return exact


# ---------------------------------------------------------------------------------------
# Input checks


def _check_relative_position(value: Any) -> np.ndarray:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"relative_position must be an int or an integer array, got {value!r}")
    if isinstance(value, numbers.Integral):
        value = int(value)
        if not -_INT64_MAX <= value <= _INT64_MAX:
            raise ValueError(f"relative_position must lie within ±(2**63 - 1), got {value}")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged lists and the like
        raise TypeError(
            f"relative_position must be an integer array, got {describe(value)}"
        ) from exc
    if array.dtype.kind not in "iu":
        hint = (
            "; round it first, e.g. np.rint(x).astype(np.int64)" if array.dtype.kind == "f" else ""
        )
        raise TypeError(
            f"relative_position must hold integers (key position - query position), got an "
            f"array of dtype {array.dtype}{hint}"
        )
    if array.size and array.dtype.kind == "u" and int(array.max()) > _INT64_MAX:
        raise ValueError(f"relative_position must lie within ±(2**63 - 1), got {array.max()}")
    array = array.astype(np.int64, copy=False)
    if array.size and int(array.min()) < -_INT64_MAX:
        raise ValueError(f"relative_position must lie within ±(2**63 - 1), got {array.min()}")
    return array


def _check_weights(value: Any) -> np.ndarray:
    try:
        weights = np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as exc:  # ragged lists, tensors with grad
        raise TypeError(
            "weights must be a NumPy array of shape (num_buckets, num_heads) (for a torch "
            f"tensor pass tensor.detach().cpu().numpy()), got {describe(value)}"
        ) from exc
    if weights.dtype == np.bool_ or weights.dtype.kind not in "iuf":
        raise TypeError(f"weights must hold real numbers, got an array of dtype {weights.dtype}")
    if weights.ndim != 2:
        raise ValueError(
            "weights must have shape (num_buckets, num_heads), like HF's "
            f"relative_attention_bias.weight, got shape {weights.shape}"
        )
    if weights.shape[1] == 0:
        raise ValueError(f"weights must have at least one head (column), got shape {weights.shape}")
    return weights
