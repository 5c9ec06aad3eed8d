"""Fixtures the Keras test files share (each file also runs on the other backends,
through ``test_backends.py``, with this set-up)."""

from __future__ import annotations

import pytest


@pytest.fixture
def policy():
    """Set a global dtype policy for one test and always restore float32."""
    keras = pytest.importorskip("keras")
    try:
        yield keras.mixed_precision.set_global_policy
    finally:
        keras.mixed_precision.set_global_policy("float32")
