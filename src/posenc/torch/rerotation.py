"""Cached keys of RoPE moved to new frequencies or positions: what a KV cache asks of RoPE.

:class:`MovesCachedKeys` is the part of :class:`~posenc.torch.RotaryEmbedding` that a
:class:`~posenc.torch.KVCache` uses (the :class:`~posenc.torch.protocols.CachedKeyRotation`
role): which frequencies a call of a given length uses, the keys rotated from scratch
with them (``"recompute"``), and keys already rotated turned by the difference
(``"rerotate"``: :func:`posenc.core.rope.rerotation_table_values`, exact angles, one
rounding). Nothing here derives a formula: the frequencies and tables come from the
module's spec.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._checks import check_int, describe
from ..core.plan import plan_scaling
from ._arguments import QK_AXES, check_position_tensor
from ._backend import format_of, to_tensor
from ._tables import eager_only, table_dtype
from .rotation import broadcast_tables, rotate

__all__ = ["MovesCachedKeys"]


class MovesCachedKeys:
    """The methods with which a KV cache keeps RoPE-rotated keys exact (a mixin of
    :class:`~posenc.torch.RotaryEmbedding`). Keys are in the module's ``qk_layout``;
    positions are integer tensors ``(seq,)`` or ``(batch, seq)``, or ``None`` for
    ``0 .. seq-1``."""

    spec: Any
    layout: str
    rotary_dim: int
    qk_layout: str

    @property
    def frequencies_change(self) -> bool:
        """Whether the frequencies depend on the length of the call (dynamic NTK,
        LongRoPE): then cached keys can hold other frequencies than a new call's."""
        return bool(self.spec.scaling.length_dependent)

    def frequency_state(self, length: int) -> int | None:
        """The frequencies a call reaching ``length`` positions uses, named by the length
        whose frequencies they are (``None``: those of construction); two calls with the
        same state rotate alike (:func:`posenc.core.plan.plan_scaling`).

        Example:
            >>> from posenc.torch import RotaryEmbedding
            >>> rope = RotaryEmbedding(8, scaling="dynamic_ntk", scaling_params={
            ...     "factor": 2.0, "original_max_position_embeddings": 16}, qk_layout="bhsd")
            >>> rope.frequency_state(16), rope.frequency_state(17)
            (None, 17)
        """
        length = check_int(length, "length", minimum=0)
        return plan_scaling(self.spec.scaling, length).seq_len

    @eager_only  # NumPy: never traced
    def rotate_keys(
        self, keys: Tensor, *, positions: Tensor | None = None, frequencies: int | None = None
    ) -> Tensor:
        """Keys before rotation, rotated at ``positions`` with the frequencies of the state
        ``frequencies`` (:meth:`frequency_state`): what a call rotating them there gives."""
        at = self._key_positions(keys, positions, "rotate_keys")
        dtype = table_dtype(keys.dtype, "rotation")
        cos, sin = self._at(at, 0, dtype, keys.device, frequencies)  # type: ignore[attr-defined]
        cos, sin = broadcast_tables((cos, sin), self.qk_layout, keys.device)
        return rotate(keys, cos, sin, self.layout, self.rotary_dim)

    @eager_only
    def rerotate_keys(
        self,
        keys: Tensor,
        *,
        positions: Tensor | None = None,
        new_positions: Tensor | None = None,
        frequencies: int | None = None,
        new_frequencies: int | None = None,
    ) -> Tensor:
        """Keys rotated at ``positions`` with the frequencies of the state ``frequencies``,
        turned to ``new_positions`` (default: the same) and the state ``new_frequencies``,
        the attention factor's change included: the same keys, within one rounding, as
        :meth:`rotate_keys` there would give from the keys before rotation.

        Example:
            >>> from posenc.torch import RotaryEmbedding
            >>> rope = RotaryEmbedding(8, base=100.0, qk_layout="bhsd")
            >>> k = torch.randn(1, 1, 3, 8, dtype=torch.float64)  # (batch, heads, seq, head_dim)
            >>> at_5 = rope.rotate_keys(k, positions=torch.tensor([5, 6, 7]))
            >>> moved = rope.rerotate_keys(at_5, positions=torch.tensor([5, 6, 7]),
            ...                            new_positions=torch.tensor([0, 1, 2]))
            >>> torch.allclose(moved, rope.rotate_keys(k), atol=1e-15)
            True
        """
        old = self._key_positions(keys, positions, "rerotate_keys")
        new = old if new_positions is None else self._key_positions(keys, new_positions, "")
        if old.shape != new.shape:
            old, new = np.broadcast_arrays(old, new)
        fmt = format_of(table_dtype(keys.dtype, "rotation"))
        cos, sin = self.spec.rerotation(
            old.reshape(-1),
            new.reshape(-1),
            seq_len=frequencies,
            new_seq_len=new_frequencies,
            fmt=fmt,
        )
        shape = (*old.shape, self.rotary_dim)
        tables = (
            to_tensor(cos.reshape(shape), fmt, keys.device),
            to_tensor(sin.reshape(shape), fmt, keys.device),
        )
        cos_t, sin_t = broadcast_tables(tables, self.qk_layout, keys.device)
        return rotate(keys, cos_t, sin_t, self.layout, self.rotary_dim)

    def _key_positions(self, keys: Any, positions: Any, method: str) -> np.ndarray:
        """The keys' positions as int64 NumPy ``(seq,)`` or ``(batch, seq)``."""
        name = f"{type(self).__name__}.{method or 'rerotate_keys'}"
        if not isinstance(keys, Tensor) or keys.dim() != 4 or not keys.is_floating_point():
            raise TypeError(
                f"{name}: keys must be a floating 4-D tensor in qk_layout={self.qk_layout!r}, "
                f"got {describe(keys)}"
            )
        seq = keys.shape[QK_AXES[self.qk_layout].index("seq")]
        if positions is None:
            return np.arange(seq, dtype=np.int64)
        check_position_tensor(
            positions, keys.shape[0], seq, name, of="keys", fractional="posenc.core.rope"
        )
        at: np.ndarray = positions.detach().to("cpu", torch.int64).numpy()
        if at.size and at.min() < 0:
            raise ValueError(f"{name}: positions must be >= 0, got {int(at.min())}")
        return at
