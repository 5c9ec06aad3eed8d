from __future__ import annotations

import numpy as np
import pytest

import posenc
from posenc.core.positions import MemoryLimitError


def test_nope_is_zeros_shaped_like_the_sinusoidal_table():
    np.testing.assert_array_equal(posenc.nope(np.zeros((2, 3)), 5), np.zeros((2, 3, 5), np.float32))


def test_nope_checks_memory_before_allocating():
    with pytest.raises(MemoryLimitError, match=r"this NoPE table would need about 3\.6 TiB"):
        posenc.nope(10**7, 10**5)
    assert posenc.nope(10**3, 10**3, max_bytes=None).shape == (1000, 1000)
