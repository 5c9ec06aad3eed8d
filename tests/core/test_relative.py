from __future__ import annotations

import numpy as np
import pytest

import posenc
from posenc.core.positions import MemoryLimitError


def test_relative_positions_checks_memory_before_allocating():
    with pytest.raises(
        MemoryLimitError, match=r"relative-position matrix would need about 7\.3 TiB"
    ):
        posenc.relative_positions(10**6)


@pytest.mark.parametrize(("q", "k"), [(0, 10**12), (10**12, 0), (0, 0)])
def test_an_empty_side_allocates_nothing(q, k):
    assert posenc.relative_positions(q, k).shape == (q, k)
    assert posenc.alibi_bias(q, k, num_heads=8).shape == (8, q, k)


def test_relative_positions_values():
    np.testing.assert_array_equal(
        posenc.relative_positions(2, 3, offset=1), [[-1, 0, 1], [-2, -1, 0]]
    )
