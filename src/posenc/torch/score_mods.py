"""Score biases as FlexAttention ``score_mod`` functions: the bias of a key, computed when
its score is, so that no ``(heads, query, key)`` tensor is ever formed.

A ``score_mod`` is called with a score and the indices ``(b, h, q, k)`` of its batch
row, head, query and key; it returns the score with the bias added. For the schemes whose
bias depends on the head and the distance ``key position - query position`` alone (ALiBi,
T5, KERPLE, Sandwich: their ``score_mod`` is :func:`distance_score_mod`), the module's
own call gives the bias of every distance the call contains, ``(heads, distances)``, a
few megabytes at any length, and the ``score_mod`` looks its distance up in it: the
values are the materialised bias's, bit for bit for ALiBi, T5 and Sandwich (an exact
product, lookups), to one float32 ulp for KERPLE (PyTorch vectorises ``pow`` and
``log1p`` differently for tensors of different shapes), and a learned bias keeps its
gradient (through the table). FIRE's bias also reads the query's own position: its
``score_mod`` evaluates the MLP score by score (:meth:`posenc.torch.FIREBias.score_mod`).

Indices into tensors are clamped to their range: a kernel may evaluate the rows of a
tile that lie past the last query or key, whose results it then drops.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from .._checks import DEFAULT_MAX_BYTES, MemoryLimitError, check_memory
from ._arguments import check_device
from ._backend import is_traced
from ._flex_inputs import static_length
from ._relative import call_positions
from .protocols import ScoreBias

__all__ = ["PositionReader", "distance_score_mod", "read_positions"]


class PositionReader(Protocol):
    """``(b, index) -> position`` of a query or key, inside a ``score_mod``."""

    def __call__(self, b: Tensor, index: Tensor) -> Tensor: ...


def read_positions(positions: Tensor | None, start: Any, length: Any, device: Any) -> Any:
    """A :class:`PositionReader`: the token at ``index`` of batch row ``b`` sits at
    ``positions[b, index]`` (or ``positions[index]``, also for positions ``(1, n)``, which
    every batch row shares, as SDPA's broadcast bias does), else at ``start + index``."""
    if positions is None:
        first = torch.as_tensor(start, device=device)  # a tensor: a new offset, one program
        return lambda b, index: index + first
    if positions.dim() == 2 and positions.shape[0] == 1:  # one row for every batch row
        positions = positions[0]
    held = static_length(positions.to(device=device, dtype=torch.long))
    last = torch.tensor(length - 1, device=device)
    if held.dim() == 1:
        return lambda b, index: held[torch.minimum(index, last)]
    return lambda b, index: held[b, torch.minimum(index, last)]


def distance_score_mod(
    module: ScoreBias,
    query_length: int,
    key_length: int | None = None,
    *,
    offset: int | None = None,
    positions: Tensor | None = None,
    key_positions: Tensor | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> Any:
    """The bias of ``module`` as a FlexAttention ``score_mod``: ``score + bias[h, q, k]``,
    the values (in ``dtype``) of the module's call with the same arguments.

    The ``score_mod`` method of the score biases that depend on the head and the distance
    alone (ALiBi, T5, KERPLE, Sandwich: ``score_mod = distance_score_mod`` in the class):
    their call gives ``(heads, 1, n)`` for one query at a position and ``n`` keys at
    positions around it.

    Args:
        module: The bias module (the method's ``self``).
        query_length, key_length, offset, positions, key_positions: As for the
            module's call (queries at ``offset ..`` or the last ``query_length`` of
            the keys; explicit positions for packed or cached tokens).
        dtype, device: Of the bias (the module's call's defaults).

    Example:
        >>> import torch
        >>> from posenc.torch import ALiBiBias
        >>> alibi = ALiBiBias(2)
        >>> mod = alibi.score_mod(3)
        >>> zero = torch.tensor(0.0)
        >>> index = torch.tensor
        >>> float(mod(zero, index(0), index(0), index(2), index(0)))  # = alibi(3)[0, 2, 0]
        -0.125
    """
    name = type(module).__name__
    device = check_device(device, name)
    queries, keys, first, _ = call_positions(
        query_length, key_length, offset, positions, key_positions, device, name
    )
    if queries == 0 or keys == 0:  # no score to add to: the module's own empty bias
        return _unchanged
    query_span = _span(positions, first, queries, name)
    key_span = _span(key_positions, 0, keys, name)
    low, high = key_span[0] - query_span[1], key_span[1] - query_span[0]  # key - query
    try:
        table = _distance_table(module, low, high, dtype, device)  # (H, n)
    except MemoryLimitError as error:
        raise error.naming(
            f"{name}.score_mod (a table of the {high - low + 1} distances from the "
            "call's first query to its last key)",
            "give positions that span fewer distances, or attend through SDPA",
        ) from None
    where = table.device
    top = torch.tensor(table.shape[1] - 1, device=where)
    table = static_length(table)  # (H, N), N >= n: one of a few fixed lengths
    start = torch.tensor(low, device=where)
    query = read_positions(positions, first, queries, where)
    key = read_positions(key_positions, 0, keys, where)

    def mod(score: Tensor, b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
        column = torch.clamp(key(b, k) - query(b, q) - start, min=0)
        return score + table[h, torch.minimum(column, top)]

    return mod


def _distance_table(
    module: ScoreBias, low: int, high: int, dtype: torch.dtype | None, device: torch.device | None
) -> Tensor:
    """The bias ``(H, n)`` of the distances ``low .. high`` (key position minus query
    position): the module's call for one query at a position >= 0 and a key at every
    distance from it."""
    count = high - low + 1
    # the key positions and the bias, with the module's intermediates (8 bytes each)
    check_memory(8 * count * (2 + 2 * module.num_heads), f"a table of {count} distances",
                 DEFAULT_MAX_BYTES)  # fmt: skip
    at = max(-low, 0)
    where = device or torch.device("cpu")
    query = torch.tensor([at], device=where)
    around = torch.arange(at + low, at + high + 1, device=where)
    call: Any = module
    extra = {} if dtype is None else {"dtype": dtype}
    bias: Tensor = call(1, around.numel(), positions=query, key_positions=around,
                        device=device, **extra)  # fmt: skip
    return bias[:, 0, :]


def _unchanged(score: Tensor, b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
    """The ``score_mod`` of a call with no scores (no queries or no keys)."""
    return score


def _span(positions: Tensor | None, start: int, length: int, name: str) -> tuple[int, int]:
    """Least and greatest position of the tokens (read back from their device; the call's
    checks have bounded them)."""
    if positions is None:
        return start, start + length - 1
    if is_traced() or positions.is_meta:
        raise ValueError(
            f"{name}: a score_mod needs the values of the positions (they are on the meta "
            "device or traced); give them as a tensor with values"
        )
    if not positions.numel():
        return 0, 0
    low, high = (int(value) for value in torch.aminmax(positions))
    return low, high
