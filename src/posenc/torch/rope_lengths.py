"""Dynamic NTK under ``torch.compile``, ``torch.export`` and ONNX: frequencies by length.

A scaling whose frequencies change with every length (dynamic NTK, or one a user
registers) needs the core at each new length, which compiled code cannot run. A
:class:`~posenc.torch.RotaryEmbedding` with such a scaling therefore keeps, beside its
cos/sin tables, the frequencies of every length its tables hold
(:func:`posenc.core.rope.lengths.length_turns`: the core's, split for exact reduction in
float64). Traced code picks the row of its length (``max(positions) + 1``, a tensor) and
forms the angles in float64: ``p·t1`` is exact for positions below ``2**27``, so the
reduced angle is within about ``2**-53`` turns, and each value is rounded once to the
tables' dtype. No Python branch depends on the length, so one graph serves every length.

This costs ``rows × (3·rotary_dim/2 + 1) × 8`` bytes per module (one and a half times
its float32 cos/sin tables), and one call of the scaling per length past the original
when the tables are built or grow (about 40 µs each for dynamic NTK).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.precision import TWO_PI
from ..core.rope.lengths import length_turns
from ._tables import eager_only

__all__ = ["ByLengthFrequencies"]


class ByLengthFrequencies:
    """The per-length frequencies of :class:`~posenc.torch.RotaryEmbedding` (a mixin)."""

    spec: Any
    rotary_dim: int
    layout: str
    _length_table: np.ndarray | None
    _length_tensors: dict[torch.device, Tensor]

    @property
    def _by_length(self) -> bool:
        """Whether the scaling's frequencies change with every length (no two sets)."""
        scaling = self.spec.scaling
        return bool(scaling.length_dependent and scaling.switch_length is None)

    @eager_only  # NumPy: never traced
    def _keep_lengths(self, rows: int, device: Any) -> None:
        """Hold the frequencies of lengths ``1 .. rows`` (more once held), on ``device``."""
        if not self._by_length:
            return
        held = self._length_table
        have = 0 if held is None else held.shape[0]
        if rows > have:
            more = length_turns(
                self.spec.scaling, self.rotary_dim, self.spec.base, rows, first=have + 1
            )
            self._length_table = more if held is None else np.concatenate([held, more])
            self._length_tensors = {}
        device = torch.device(device)
        if device.type != "meta" and device not in self._length_tensors:
            assert self._length_table is not None
            values = torch.from_numpy(self._length_table)
            self._length_tensors = {device: values.to(device)}

    def _rows_by_length(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` ``(*positions.shape, rotary_dim)`` in ``dtype`` at traced integer
        ``positions``, with the frequencies of the length ``max(positions) + 1``; NaN rows
        for positions outside this module's rows (as a traced table read gives)."""
        table = self._length_tensors.get(positions.device)
        if table is None:
            raise ValueError(
                f"{type(self).__name__}: the frequencies of each length are not on "
                f"{positions.device}; move the module there (module.to(...)) before "
                "compiling"
            )
        m = self.rotary_dim // 2
        rows = min(self.table_length, table.shape[0])  # type: ignore[attr-defined]
        wide = positions.to(torch.float64)
        end = positions.max() + 1  # the call's length, a traced scalar
        index = (end - 1).clamp(0, table.shape[0] - 1).reshape(1)
        row = table.index_select(0, index)[0]  # (3m + 1,), selected in the graph
        t1, t2, t3, factor = row[:m], row[m : 2 * m], row[2 * m : 3 * m], row[3 * m]
        p = wide.unsqueeze(-1)  # (..., seq, 1)
        whole = p * t1  # exact: p < 2**27 and t1 of 26 bits
        turns = (whole - torch.round(whole)) + (p * t2 + p * t3)
        angle = (turns - torch.round(turns)) * TWO_PI  # (..., seq, m)
        outside = (positions < 0) | (positions >= rows) | (end > rows)
        nan = torch.tensor(float("nan"), dtype=torch.float64, device=positions.device)
        cos = torch.where(outside.unsqueeze(-1), nan, factor * torch.cos(angle))
        sin = torch.where(outside.unsqueeze(-1), nan, factor * torch.sin(angle))
        if self.layout == "half":  # [v_0 .. v_{m-1}, v_0 .. v_{m-1}]
            cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        else:  # [v_0, v_0, v_1, v_1, ...]
            cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        return cos.to(dtype), sin.to(dtype)  # one rounding from float64
