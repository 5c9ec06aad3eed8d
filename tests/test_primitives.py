"""The primitives of every front end's ``_backend.py`` carry out the planner's index plans
alike: the rows ``start .. start + count - 1`` of a traced ``start`` in any integer dtype,
exact inside the table and NaN outside it (never another row), and ``to_tensor`` exact
in every format."""

from __future__ import annotations

import importlib
import importlib.util

import numpy as np
import pytest

from posenc.core.plan import INDEX_RANGES, plan_index

ROWS = 300
TABLE = np.arange(2 * ROWS, dtype=np.float32).reshape(ROWS, 2)
# (index dtype, first position): negative, inside, across the end, past int8's range in
# a table longer than it, and 64-bit values that a cast to int32 would wrap into the table.
STARTS = [
    ("int8", -2),
    ("int8", 120),
    ("int16", 296),
    ("int32", -(2**31)),
    ("int32", 2**31 - 3),
    ("uint8", 250),
    ("uint16", 65_534),
    ("uint32", 2**32 - 2),
    ("int64", 2**32 + 1),
    ("uint64", 2**63 + 5),
]
COUNT = 5


def expected(start: int) -> np.ndarray:
    out = np.full((COUNT, 2), np.nan, np.float32)
    for i in range(COUNT):
        if 0 <= start + i < ROWS:
            out[i] = TABLE[start + i]
    return out


def _backend(frontend: str):
    if importlib.util.find_spec(frontend) is None:
        pytest.skip(f"{frontend} is not installed")
    return importlib.import_module(f"posenc.{frontend}._backend")


def _rows(frontend: str, dtype: str, start: int) -> np.ndarray:
    backend = _backend(frontend)
    if frontend == "torch":
        import torch

        first = torch.tensor(np.array(start, dtype=dtype))
        table = torch.from_numpy(TABLE)
    elif frontend == "jax":
        import jax.numpy as jnp

        first, table = jnp.asarray(np.array(start, dtype=dtype)), jnp.asarray(TABLE)
    else:
        from keras import ops

        first = ops.convert_to_tensor(np.array(start, dtype=dtype), dtype=dtype)
        table = ops.convert_to_tensor(TABLE)
    plan = plan_index(backend.dtype_name(first), ROWS, wide=backend.wide_index())
    index = backend.index_range(first, COUNT, plan)
    assert backend.dtype_name(index) == plan.dtype
    return np.asarray(backend.gather_rows(table, index, plan))


@pytest.mark.parametrize(("dtype", "start"), STARTS)
@pytest.mark.parametrize("frontend", ["torch", "jax", "keras"])
def test_a_run_of_traced_positions_is_exact_or_nan(frontend, dtype, start):
    if frontend == "jax" and dtype.endswith("64"):
        jax = pytest.importorskip("jax")
        with jax.enable_x64(True):
            got = _rows(frontend, dtype, start)
    elif frontend == "keras" and dtype.endswith("64"):
        keras = pytest.importorskip("keras")
        # Keras on torch has no uint64 tensors; Keras on JAX stores 64-bit integers as
        # 32-bit ones (it leaves JAX's 64-bit mode off), wrapping them on creation.
        if (keras.backend.backend(), dtype) in {("torch", "uint64"), ("jax", "int64"),
                                                ("jax", "uint64")}:  # fmt: skip
            pytest.skip(f"Keras on {keras.backend.backend()} cannot hold {dtype} tensors")
        got = _rows(frontend, dtype, start)
    else:
        got = _rows(frontend, dtype, start)
    np.testing.assert_array_equal(got, expected(start))


@pytest.mark.parametrize("frontend", ["torch", "jax", "keras"])
@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float32"])
def test_to_tensor_keeps_the_cores_values_exactly(frontend, fmt):
    backend = _backend(frontend)
    import posenc

    values = posenc.sinusoidal(7, 6, dtype=fmt)
    if fmt == "bfloat16":  # the core's container of bfloat16 values is float32
        values = values.astype(np.float32)
    if frontend == "jax":
        import jax

        device = jax.devices("cpu")[0]
    else:
        device = "cpu" if frontend == "torch" else "cpu:0"
    tensor = backend.to_tensor(values, fmt, device)
    assert backend.dtype_name(tensor) == fmt
    assert backend.format_of(tensor.dtype) == fmt
    if frontend == "torch":
        back = tensor.float().numpy()
    elif frontend == "jax":
        back = np.asarray(tensor.astype("float32"))
    else:
        from keras import ops

        back = ops.convert_to_numpy(ops.cast(tensor, "float32"))
    np.testing.assert_array_equal(back, values.astype(np.float32))


def test_the_starts_cover_every_integer_dtype():
    assert {dtype for dtype, _ in STARTS} == set(INDEX_RANGES)
