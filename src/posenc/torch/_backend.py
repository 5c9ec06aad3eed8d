"""The PyTorch primitives: how the torch modules move the core's numbers onto tensors.

Every front end has a ``_backend.py`` with these primitives, the same names and
signatures in each (:mod:`posenc.keras._backend`, :mod:`posenc.jax._backend`), and
nothing else: what a call needs is decided once, by the planner
(:mod:`posenc.core.plan`); a front end carries the plan out with these.

``format_of(dtype, name)``
    the core's format name (``"float32"``, ...) of a framework dtype, or a ``TypeError``;
``to_tensor(values, fmt, device)``
    a tensor holding a NumPy array the core rounded to ``fmt``, exactly;
``known_value(value)``
    the value of a tensor if it is known while the call runs, else ``None`` (traced);
``is_traced(value)``
    whether the value is known only inside a trace;
``dtype_name(value)``
    the NumPy-style name of a tensor's dtype, what the planner takes;
``wide_index()``
    the widest integer dtype the front end indexes with (the planner's ``wide=``);
``to_index(index, plan)``
    traced positions in the plan's index dtype, saturated where the cast would wrap;
``index_range(start, count, plan)``
    the positions ``start .. start + count - 1`` of a traced ``start``, in the plan's dtype;
``gather_rows(table, index, plan)``
    rows of a table; with a plan, a row of NaN wherever a traced index is outside it.

The checks of call arguments are in :mod:`._arguments`, the tables' lifecycle in
:mod:`._tables`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .._checks import describe
from ..core.plan import IndexPlan

__all__ = [
    "dtype_name",
    "format_of",
    "gather_rows",
    "index_range",
    "is_traced",
    "known_value",
    "to_index",
    "to_tensor",
    "wide_index",
]

FORMATS: dict[torch.dtype, str] = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}
DTYPES: dict[str, torch.dtype] = {fmt: dtype for dtype, fmt in FORMATS.items()}


def format_of(dtype: Any, name: str = "dtype") -> str:
    """The core's format name of a torch floating dtype; ``TypeError`` for any other."""
    if dtype not in FORMATS:
        raise TypeError(f"{name} must be one of {[str(d) for d in FORMATS]}, got {describe(dtype)}")
    return FORMATS[dtype]


_TENSOR_DTYPES: dict[str, torch.dtype] = {**DTYPES, "int64": torch.int64, "int32": torch.int32}


def to_tensor(values: np.ndarray, fmt: str, device: Any = None) -> Tensor:
    """A tensor of format ``fmt`` (or ``"int64"``, ``"int32"``) on ``device`` (the default
    device when ``None``) holding the core's ``values`` exactly, in memory PyTorch allocated.

    Never a view of the NumPy buffer: PyTorch aligns its CPU tensors to 64 bytes, NumPy
    its arrays to 16, and an add that reads a table at an odd alignment is measurably
    slower. The core returns bfloat16 values in a float32 container, so the cast is exact.
    """
    tensor = torch.empty(np.shape(values), dtype=_TENSOR_DTYPES[fmt], device=device)
    return tensor.copy_(torch.from_numpy(np.ascontiguousarray(values)))


def is_traced(value: object = None) -> bool:
    """Whether the code is being traced (``torch.compile``, ``torch.export``).

    In PyTorch tracing is a state of the whole call, not of one tensor: ``value`` is
    accepted for the primitives' common signature and not needed.
    """
    return bool(torch.compiler.is_compiling())


def known_value(value: Tensor) -> np.ndarray | None:
    """The value of ``value`` if it is known now: not while tracing, not on ``meta``."""
    if is_traced() or value.is_meta:
        return None
    return value.detach().cpu().numpy()


def dtype_name(value: Tensor) -> str:
    """The NumPy-style name of a tensor's dtype (``"int8"``, ``"float32"``)."""
    return str(value.dtype).removeprefix("torch.")


def wide_index() -> str:
    """The integer dtype torch indexes with: int64."""
    return "int64"


def to_index(index: Tensor, plan: IndexPlan) -> Tensor:
    """Traced positions as ``plan.dtype`` (int64 here), saturated where the cast would wrap.

    PyTorch cannot clamp unsigned 64-bit tensors; their values past ``2**63 - 1`` become
    negative in the cast instead, outside every table as the saturated value would be.
    """
    if plan.clip is not None and index.dtype not in (torch.int64, torch.uint64):
        index = index.clamp(*plan.clip)
    return index.to(torch.int64)


def index_range(start: Any, count: int, plan: IndexPlan) -> Tensor:
    """``start + i`` for ``i < count`` in ``plan.dtype``, ``start`` a traced scalar.

    An addition that overflows can only wrap a position past the table to a negative
    one: still outside the table, so :func:`gather_rows` gives NaN there too.
    """
    if not isinstance(start, Tensor):  # a symbolic or known int
        run: Tensor = torch.arange(count, dtype=torch.int64) + start
        return run
    return to_index(start, plan) + torch.arange(count, dtype=torch.int64, device=start.device)


def gather_rows(table: Tensor, index: Tensor, plan: IndexPlan | None = None) -> Tensor:
    """``table[index]`` along axis 0; with a ``plan`` (traced positions), NaN rows where
    ``index`` lies outside ``0 .. plan.rows-1``.

    Without a plan the index was checked (and the table grown) by the planner before, so
    this is a plain gather. A traced index cannot be checked, so the plan's bounds give a
    row of NaN outside the table, the sentinel every front end uses
    (:mod:`posenc.core.positions`), in any integer dtype (:func:`posenc.core.plan.plan_index`).
    """
    if plan is None:
        if index.dtype != torch.int64 or index.device != table.device:
            index = index.to(device=table.device, dtype=torch.int64)
        return nn.functional.embedding(index, table)
    index = to_index(index, plan).to(table.device)
    valid = (index >= 0) & (index < plan.rows)
    safe = torch.where(valid, index, torch.zeros_like(index))
    gathered = nn.functional.embedding(safe, table)  # (*index.shape, width)
    filled: Tensor = gathered.masked_fill(~valid.unsqueeze(-1), float("nan"))
    return filled
