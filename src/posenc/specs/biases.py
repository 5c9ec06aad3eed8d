"""The specs of the schemes that add a bias to the attention scores: ALiBi and T5."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .._checks import (
    DEFAULT_MAX_BYTES,
    check_choice,
    check_memory,
)
from ..core.alibi import MODES, alibi_bias_values, alibi_slopes, check_heads
from ..core.t5 import bucket_values, check_bucket_options
from .base import SchemeSpec

__all__ = ["AlibiSpec", "T5Spec"]


@dataclass(frozen=True, kw_only=True)
class AlibiSpec(SchemeSpec):
    """ALiBi: the linear bias ``-m_h · distance`` per head (Press et al., 2022).

    Args:
        num_heads: Number of heads; slopes by the paper's rule for any count.
        mode: ``"causal"`` (0 for future keys) or ``"symmetric"``.

    Example:
        >>> AlibiSpec(num_heads=2).bias(2, fmt="float64")[0].tolist()
        [[0.0, 0.0], [-0.0625, 0.0]]
    """

    scheme: ClassVar[str] = "alibi"
    num_heads: int
    mode: str = "causal"

    def __post_init__(self) -> None:
        self._set("num_heads", check_heads(self.num_heads))
        self._set("mode", check_choice(self.mode, "mode", MODES))

    def slopes(self) -> np.ndarray:
        """The slope of each head, float64 ``(num_heads,)``."""
        return alibi_slopes(self.num_heads)

    def bias(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: int | None = None,
        fmt: str = "float32",
        max_bytes: int | None = DEFAULT_MAX_BYTES,
    ) -> np.ndarray:
        """``(num_heads, query_length, key_length)``, queries at ``offset + i`` (no
        offset: the last ``query_length`` of the ``key_length`` positions)."""
        return alibi_bias_values(
            query_length,
            key_length,
            num_heads=self.num_heads,
            mode=self.mode,
            offset=offset,
            fmt=fmt,
            max_bytes=max_bytes,
        )


@dataclass(frozen=True, kw_only=True)
class T5Spec(SchemeSpec):
    """T5's learned relative position bias: one weight per (distance bucket, head).

    Args:
        num_heads: Number of heads (the columns of the learned table).
        bidirectional: Encoder (``True``) or causal decoder (``False``) buckets.
        num_buckets: Number of buckets (32 in T5).
        max_distance: Distance from which the buckets saturate (128 in T5).
        compat: ``"hf"`` (Hugging Face's float32 edges) or ``"exact"``.

    Example:
        >>> T5Spec(num_heads=1, bidirectional=False).buckets(np.arange(-3, 1)).tolist()
        [3, 2, 1, 0]
    """

    scheme: ClassVar[str] = "t5"
    num_heads: int
    bidirectional: bool = True
    num_buckets: int = 32
    max_distance: int = 128
    compat: str = "hf"

    def __post_init__(self) -> None:
        self._set("num_heads", check_heads(self.num_heads))
        options = check_bucket_options(
            self.bidirectional, self.num_buckets, self.max_distance, self.compat
        )
        for name, value in zip(
            ("bidirectional", "num_buckets", "max_distance", "compat"), options, strict=True
        ):
            self._set(name, value)

    def buckets(self, relative_position: Any) -> np.ndarray:
        """The bucket (int64) of each relative position ``key - query``."""
        return bucket_values(
            np.asarray(relative_position, dtype=np.int64),
            self.bidirectional,
            self.num_buckets,
            self.max_distance,
            self.compat,
        )

    def bucket_table(self) -> np.ndarray:
        """The bucket of every distance ``-max_distance .. max_distance`` (index ``d + max``).

        Farther distances share the end buckets, so a front end clamps ``key - query`` to
        ``±max_distance`` and gathers from this table. Its memory is checked first
        (:meth:`check_table_memory`).
        """
        self.check_table_memory()
        return self.buckets(np.arange(-self.max_distance, self.max_distance + 1))

    def check_table_memory(self) -> None:
        """A ``MemoryLimitError`` when the bucket table would pass 4 GiB (``max_distance``
        of about 1.3e8), saying to lower ``max_distance``."""
        check_memory(
            (2 * self.max_distance + 1) * 8 * 2,
            f"the bucket table of max_distance={self.max_distance} (2·max_distance + 1 entries)",
            DEFAULT_MAX_BYTES,
            fix="use a smaller max_distance (T5 uses 128; every distance past it shares the "
            "last bucket)",
        )
