"""Dynamic NTK under ``torch.compile``, ``torch.export`` and ONNX: frequencies by length.

A scaling whose frequencies change with every length (dynamic NTK, or one a user
registers) needs the core at each new length, which compiled code cannot run. So
:meth:`~posenc.torch.RotaryEmbedding.extend` also keeps, for such a scaling, the
frequencies of every length up to the one asked
(:func:`posenc.core.rope.lengths.length_turns`: the core's, split for exact reduction in
float64), once per spec like the tables, in a :class:`LengthFrequencies`. Traced code
picks the row of its length (``max(positions) + 1``, a tensor) and forms the angles in
float64: ``p·t1`` is exact for positions below ``2**27``, so the reduced angle is within
about ``2**-53`` turns, and each value is rounded once to the tables' dtype. No Python
branch depends on the length, so one graph serves every length.

Building them costs one call of the scaling per length past the original (about 1 ms for
dynamic NTK: its frequencies are correctly rounded at 50 digits), which is why only
``extend()`` builds them, never a call that grows the tables; they take ``(3·rotary_dim/2
+ 1) × 8`` bytes per length.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.precision import TWO_PI
from ..core.rope.lengths import length_turns
from ..core.tables import GROWTH_LOCK, TableCache, share_key
from ._tables import eager_only

__all__ = [
    "LengthFrequencies",
    "keep_lengths",
    "placed_lengths",
    "rows_by_length",
    "varies_by_length",
]


class LengthFrequencies:
    """The frequencies of lengths ``1 .. rows`` of one spec (``(rows, 3m + 1)`` float64,
    :func:`~posenc.core.rope.lengths.length_turns`), with a copy per device."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.table: np.ndarray | None = None
        self.tensors: dict[torch.device, Tensor] = {}

    @property
    def rows(self) -> int:
        return 0 if self.table is None else int(self.table.shape[0])

    def extend(self, rows: int) -> None:
        """Hold at least lengths ``1 .. rows`` (the new ones from the core)."""
        with GROWTH_LOCK:
            if rows <= self.rows:
                return
            scaling, width = self.spec.scaling, self.spec.rotary_dim
            more = length_turns(scaling, width, self.spec.base, rows, first=self.rows + 1)
            self.table = more if self.table is None else np.concatenate([self.table, more])
            devices, self.tensors = list(self.tensors), {}
            for device in devices:
                self.place(device)

    def place(self, device: torch.device) -> None:
        """A copy on ``device``: one without float64 (Apple's MPS) gets none, and compiled
        code on it says so."""
        with GROWTH_LOCK:
            if self.table is None or device.type == "meta" or device in self.tensors:
                return
            try:
                self.tensors[device] = torch.from_numpy(self.table).to(device)
            except (TypeError, RuntimeError):
                return


_REGISTRY = TableCache()


def varies_by_length(spec: Any) -> bool:
    """Whether the spec's scaling has frequencies for every length (no two sets)."""
    scaling = spec.scaling
    return bool(scaling.length_dependent and scaling.switch_length is None)


def _key(spec: Any) -> Any:
    return share_key("rope-lengths", spec)


@eager_only  # NumPy: never traced
def keep_lengths(spec: Any, rows: int, device: torch.device) -> LengthFrequencies:
    """The spec's :class:`LengthFrequencies` (one per spec), holding lengths ``1 .. rows``
    on ``device`` (what :meth:`~posenc.torch.RotaryEmbedding.extend` asks)."""
    holder = _REGISTRY.entry(_key(spec), lambda: LengthFrequencies(spec))
    holder.extend(rows)
    holder.place(device)
    return holder


@eager_only
def placed_lengths(
    spec: Any, held: LengthFrequencies | None, device: torch.device
) -> LengthFrequencies | None:
    """The frequencies kept for the spec (``held``, else those another module of the spec
    made), copied to ``device`` too (after a move); ``None`` where none are kept."""
    if not varies_by_length(spec):
        return None
    holder = held if held is not None else _REGISTRY.find(_key(spec))
    if holder is not None:
        holder.place(device)
    return holder


def rows_by_length(
    held: LengthFrequencies | None,
    spec: Any,
    rows: int,
    positions: Tensor,
    dtype: torch.dtype,
    name: str,
) -> tuple[Tensor, Tensor]:
    """``(cos, sin)`` ``(*positions.shape, rotary_dim)`` in ``dtype`` at traced integer
    ``positions``, with the frequencies of the length ``max(positions) + 1`` from
    ``held`` (a module's :class:`LengthFrequencies`: no registry lookup here, it takes a
    lock, which is not traceable); NaN rows for positions outside the module's ``rows``
    or past the lengths kept (as a traced table read gives)."""
    table = None if held is None else held.tensors.get(positions.device)
    if table is None:
        raise ValueError(
            f"{name}: under torch.compile or torch.export, "
            f"scaling={spec.scaling.name!r} reads the frequencies of each call's "
            "length from those kept per length, which .extend(n) builds (about 1 ms per "
            "length past the original): call .extend(n) for the longest length compiled "
            f"code will see, on the module's device ({positions.device}), before compiling"
        )
    m = spec.rotary_dim // 2
    rows = min(rows, table.shape[0])
    end = positions.max() + 1  # the call's length, a traced scalar
    index = (end - 1).clamp(0, table.shape[0] - 1).reshape(1)
    row = table.index_select(0, index)[0]  # (3m + 1,), selected in the graph
    t1, t2, t3, factor = row[:m], row[m : 2 * m], row[2 * m : 3 * m], row[3 * m]
    p = positions.to(torch.float64).unsqueeze(-1)  # (..., seq, 1)
    whole = p * t1  # exact: p < 2**27 and t1 of 26 bits
    turns = (whole - torch.round(whole)) + (p * t2 + p * t3)
    angle = (turns - torch.round(turns)) * TWO_PI  # (..., seq, m)
    outside = (positions < 0) | (positions >= rows) | (end > rows)
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=positions.device)
    cos = torch.where(outside.unsqueeze(-1), nan, factor * torch.cos(angle))
    sin = torch.where(outside.unsqueeze(-1), nan, factor * torch.sin(angle))
    if spec.layout == "half":  # [v_0 .. v_{m-1}, v_0 .. v_{m-1}]
        cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    else:  # [v_0, v_0, v_1, v_1, ...]
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    return cos.to(dtype), sin.to(dtype)  # one rounding from float64
