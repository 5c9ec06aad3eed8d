"""posenc.jax does each thing once: a call is planned once, by the core's planner, and a
Flax module's options are parsed once (not at every ``apply``, clone or trace).

Counted with ``sys.setprofile``, as ``benchmarks/count_calls.py`` counts calls into
posenc; the values are checked against the core's."""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
linen = pytest.importorskip("posenc.jax.linen")

import posenc  # noqa: E402
from posenc.specs import RopeSpec, SinusoidalSpec, XPosSpec  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(posenc.__file__)) + os.sep


def calls(operation: Callable[[], Any]) -> Counter[str]:
    """The calls into posenc that ``operation()`` makes, by function (qualified name)."""
    counted: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(ROOT):
            counted[frame.f_code.co_qualname] += 1

    sys.setprofile(profile)
    try:
        operation()
    finally:
        sys.setprofile(None)
    return counted


def _q(shape: tuple[int, ...]) -> Any:
    return jnp.asarray(np.random.default_rng(0).standard_normal(shape), jnp.float32)


YARN = {"factor": 4.0, "original_max_position_embeddings": 16}


# ---------------------------------------------------------------------------------------
# One plan per call


@pytest.mark.parametrize("start", [3, 200], ids=["slice", "direct"])
def test_a_rope_call_is_planned_once(start):
    rope = linen.RotaryEmbedding(max_length=64, scaling="yarn", scaling_params=YARN)
    q = _q((2, 4, 8, 64))  # (batch, seq, heads, head_dim)
    rope.apply({}, q, start_index=start)  # warm: the tables, the spec
    counted = calls(lambda: rope.apply({}, q, start_index=start))
    assert counted["plan_call"] == 1
    assert counted["plan_rows"] == 1  # the plan's rows, read as they are: no second plan
    spec = RopeSpec(head_dim=64, scaling={"rope_type": "yarn", **YARN})
    cos, sin = spec.tables(np.arange(start, start + 4), fmt="float32")
    want = posenc.apply_rope(np.asarray(q, np.float64), cos[:, None], sin[:, None])
    got = np.asarray(rope.apply({}, q, start_index=start), np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_a_traced_start_is_planned_once_and_gathers():
    rope = linen.RotaryEmbedding(max_length=8)
    q = _q((1, 4, 2, 16))
    counted: Counter[str] = Counter()

    def trace(start: Any) -> Any:
        counted.update(calls(lambda: rope.apply({}, q, start_index=start)))
        return rope.apply({}, q, start_index=start)

    out = jax.jit(trace)(jnp.int32(6))  # positions 6 .. 9: 8 and 9 past the table
    assert counted["plan_call"] == 1 and counted["plan_rows"] == 0
    eager = rope.apply({}, q[:, :2], start_index=6)
    np.testing.assert_allclose(np.asarray(out[:, :2]), np.asarray(eager), rtol=0, atol=2e-6)
    assert np.isnan(np.asarray(out[:, 2:])).all()


def test_the_sinusoidal_module_and_xpos_read_the_plans_rows():
    pe = linen.SinusoidalPositionalEncoding(max_length=8, base=100.0)
    x = jnp.zeros((1, 3, 6), jnp.bfloat16)
    for start in (2, 30):  # in the table, past it
        counted = calls(lambda start=start: pe.apply({}, x, start_index=start))
        assert counted["plan_call"] == 1 and counted["plan_rows"] == 1
        want = SinusoidalSpec(d_model=6, base=100.0).table(
            np.arange(start, start + 3), fmt="bfloat16"
        )
        got = pe.apply({}, x, start_index=start)[0]
        assert got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(got, np.float64), want.astype(np.float64))
    xpos = linen.XPosRotaryEmbedding(16, max_length=8)
    q = jnp.ones((1, 2, 3, 16), jnp.bfloat16)
    counted = calls(lambda: xpos.apply({}, q, q, start_index=5))
    assert counted["plan_call"] == 1 and counted["plan_rows"] == 1
    cos, sin, q_scale, _ = XPosSpec(head_dim=16).tables(np.arange(5, 7), fmt="float32")
    qx, _ = xpos.apply({}, q, q, start_index=5)
    assert qx.dtype == jnp.bfloat16  # rotated with float32 tables: the plan's format
    want = posenc.apply_rope(np.ones((1, 2, 16)), cos, sin, layout="interleaved") * q_scale
    np.testing.assert_allclose(np.asarray(qx, np.float64)[:, :, 0], want, rtol=2**-8, atol=0)
