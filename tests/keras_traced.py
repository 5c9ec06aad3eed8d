"""``traced(fn)``: a function compiled by the Keras backend's tracer, for the Keras tests.

Shared by the test files of ``tests/keras/``: inside it, tensor arguments have no known
value, which is the case the layers' traced code paths are for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import keras


def traced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by the backend so that tensor arguments have no known value inside:
    ``tf.function`` on TensorFlow, ``jax.jit`` on JAX. On torch it runs eagerly with
    ``torch.compiler.is_compiling()`` reporting True, which is how the layers learn that
    they are inside ``torch.compile`` (tensor values unknown): the traced code path runs
    with torch's own ops, without the compiler's cost."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn)
    if backend == "jax":
        import jax

        return jax.jit(fn)
    import torch

    def compiling(*args: Any) -> Any:
        with mock.patch.object(torch.compiler, "is_compiling", return_value=True):
            return fn(*args)

    return compiling
