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
from posenc.specs import RopeSpec, SinusoidalNDSpec, SinusoidalSpec, XPosSpec  # noqa: E402

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
    assert (counted["plan_call"], counted["plan_rows"]) == (1, 0)
    eager = rope.apply({}, q[:, :2], start_index=6)
    np.testing.assert_allclose(np.asarray(out[:, :2]), np.asarray(eager), rtol=0, atol=2e-6)
    assert np.isnan(np.asarray(out[:, 2:])).all()


def test_the_sinusoidal_module_and_xpos_read_the_plans_rows():
    pe = linen.SinusoidalPositionalEncoding(max_length=8, base=100.0)
    x = jnp.zeros((1, 3, 6), jnp.bfloat16)
    for start in (2, 30):  # in the table, past it
        counted = calls(lambda start=start: pe.apply({}, x, start_index=start))
        assert (counted["plan_call"], counted["plan_rows"]) == (1, 1)
        want = SinusoidalSpec(d_model=6, base=100.0).table(
            np.arange(start, start + 3), fmt="bfloat16"
        )
        got = pe.apply({}, x, start_index=start)[0]
        assert got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(got, np.float64), want.astype(np.float64))
    xpos = linen.XPosRotaryEmbedding(16, max_length=8)
    q = jnp.ones((1, 2, 3, 16), jnp.bfloat16)
    counted = calls(lambda: xpos.apply({}, q, q, start_index=5))
    assert (counted["plan_call"], counted["plan_rows"]) == (1, 1)
    cos, sin, q_scale, _ = XPosSpec(head_dim=16).tables(np.arange(5, 7), fmt="float32")
    qx, _ = xpos.apply({}, q, q, start_index=5)
    assert qx.dtype == jnp.bfloat16  # rotated with float32 tables: the plan's format
    want = posenc.apply_rope(np.ones((1, 2, 16)), cos, sin, layout="interleaved") * q_scale
    np.testing.assert_allclose(np.asarray(qx, np.float64)[:, :, 0], want, rtol=2**-8, atol=0)


def test_the_learned_embedding_asks_the_planner_which_rows_it_has():
    emb = linen.LearnedPositionalEmbedding(max_length=6)
    x = jnp.zeros((2, 3, 4))
    variables = emb.init(jax.random.key(0), x)
    table = np.asarray(variables["params"]["embedding"])
    counted = calls(lambda: emb.apply(variables, x, start_index=3))
    assert counted["plan_rows"] == 1  # a slice of rows 3 .. 5, the planner's
    np.testing.assert_array_equal(np.asarray(emb.apply(variables, x, start_index=3))[1], table[3:])
    with pytest.raises(ValueError, match=r"position 6 \(start_index=4\) is beyond max_length=6"):
        emb.apply(variables, x, start_index=4)  # the planner's "refuse": no rows past it


# ---------------------------------------------------------------------------------------
# A Flax module's options, parsed once


def _parsed(counted: Counter[str]) -> dict[str, int]:
    """The calls that parse options or make a spec (``RopeSpec.__post_init__``, ...)."""
    return {
        name: n
        for name, n in counted.items()
        if name.endswith("Spec.__post_init__")
        or name in ("rope_options", "as_rope_scaling", "learned_rope_frequencies")
    }


def test_a_second_apply_or_trace_of_flax_rope_parses_nothing():
    rope = linen.RotaryEmbedding(max_length=64, scaling="yarn", scaling_params=dict(YARN))
    q = _q((1, 4, 2, 16))
    first = rope.apply({}, q, start_index=2)
    again = calls(lambda: rope.apply({}, q, start_index=2))
    traced = calls(lambda: jax.jit(lambda s: rope.apply({}, q, start_index=s))(2))
    twin = linen.RotaryEmbedding(max_length=64, scaling="yarn", scaling_params=dict(YARN))
    other_layer = calls(lambda: twin.apply({}, q, start_index=2))
    assert _parsed(again) == _parsed(traced) == _parsed(other_layer) == {}
    np.testing.assert_array_equal(np.asarray(twin.apply({}, q, start_index=2)), first)


@pytest.mark.parametrize(
    ("make", "call"),
    [
        (
            lambda: linen.XPosRotaryEmbedding(16, max_length=8),
            lambda m, q: m.apply({}, q, q, start_index=1),
        ),
        (
            lambda: linen.AxialRotaryEmbedding(16, n_axes=2, sections=[4, 4]),
            lambda m, q: m.apply({}, q, q, coords=np.stack([np.arange(4)] * 2, -1)),
        ),
        (
            lambda: linen.SinusoidalPositionalEncoding(max_length=8),
            lambda m, q: m.apply({}, q[0], start_index=1),
        ),
    ],
    ids=["xpos", "axial", "sinusoidal"],
)
def test_a_second_apply_of_a_flax_module_without_params_parses_nothing(make, call):
    module, q = make(), _q((1, 4, 2, 16))
    call(module, q)
    assert _parsed(calls(lambda: call(module, q))) == {}


def test_a_second_apply_of_flax_learned_rope_parses_nothing():
    rope = linen.LearnedRotaryEmbedding(16, scaling="linear", scaling_params={"factor": 2.0})
    q = _q((1, 4, 2, 16))
    variables = rope.init(jax.random.key(0), q, q)
    assert _parsed(calls(lambda: rope.apply(variables, q, q, start_index=3))) == {}
    # the param starts at the core's frequencies, whatever module made them first
    spec = RopeSpec(head_dim=16, scaling={"rope_type": "linear", "factor": 2.0})
    want = spec.frequencies()[0].astype(np.float32)
    np.testing.assert_array_equal(np.asarray(variables["params"]["inv_freq"]), want)
    again = linen.LearnedRotaryEmbedding(16, scaling="linear", scaling_params={"factor": 2.0})
    np.testing.assert_array_equal(
        np.asarray(again.init(jax.random.key(1), q, q)["params"]["inv_freq"]), want
    )


def test_bad_options_are_refused_at_every_construction():
    for _ in range(2):  # nothing is kept for options that fail
        with pytest.raises(ValueError, match="factor"):
            linen.RotaryEmbedding(scaling="yarn", scaling_params={**YARN, "factor": -1.0})
        with pytest.raises(ValueError, match="rotary_dim"):
            linen.RotaryEmbedding(head_dim=8, rotary_dim=16)  # the spec, made at once
        with pytest.raises(ValueError, match="gamma"):
            linen.XPosRotaryEmbedding(16, gamma=-1.0)


def test_options_are_kept_by_value_and_type():
    params = {"factor": 2.0}
    q = _q((1, 3, 2, 8))
    linear = linen.RotaryEmbedding(scaling="linear", scaling_params=params)
    doubled = np.asarray(linear.apply({}, q))
    params["factor"] = 4.0  # the same dict, another value: another spec
    quadrupled = np.asarray(
        linen.RotaryEmbedding(scaling="linear", scaling_params=params).apply({}, q)
    )
    for factor, got in ((2.0, doubled), (4.0, quadrupled)):
        cos, sin = RopeSpec(head_dim=8, scaling={"rope_type": "linear", "factor": factor}).tables(3)
        want = posenc.apply_rope(np.asarray(q, np.float64), cos[:, None], sin[:, None])
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    # True is not 1: a bool refused, even after the int's module was made
    linen.SinusoidalPositionalEncoding(max_length=1)
    with pytest.raises(TypeError, match="max_length"):
        linen.SinusoidalPositionalEncoding(max_length=True)


@pytest.mark.parametrize(
    ("module", "want"),
    [
        (lambda: linen.ALiBiBias(8), lambda: posenc.alibi_bias(1, 6, num_heads=8, offset=5)),
        (
            lambda: linen.SandwichBias(8, dim=64),
            lambda: posenc.sandwich_bias(1, 6, num_heads=8, dim=64, offset=5),
        ),
    ],
    ids=["alibi", "sandwich"],
)
def test_a_second_apply_of_a_flax_bias_makes_no_spec(module, want):
    bias = module()
    bias.apply({}, 1, 6, offset=5)
    assert _parsed(calls(lambda: bias.apply({}, 1, 6, offset=5))) == {}
    got = np.asarray(bias.apply({}, 1, 6, offset=5))
    np.testing.assert_array_equal(got, np.asarray(want(), np.float32))


@pytest.mark.parametrize(
    "module",
    [lambda: linen.KERPLEBias(8), lambda: linen.FIREBias(8), lambda: linen.T5RelativeBias(8)],
    ids=["kerple", "fire", "t5"],
)
def test_a_flax_bias_of_weights_makes_its_spec_once_per_apply(module):
    bias = module()
    variables = bias.init(jax.random.key(0), 4)
    bias.apply(variables, 4)
    made = _parsed(calls(lambda: bias.apply(variables, 4)))
    assert list(made.values()) == [1]  # the function's, from the weights' shapes


def test_a_second_apply_of_the_flax_nd_encoding_makes_no_spec():
    pe = linen.SinusoidalPositionalEncodingND(layout="mae")
    x = jnp.zeros((1, 4, 5, 8), jnp.bfloat16)
    pe.apply({}, x)
    assert _parsed(calls(lambda: pe.apply({}, x))) == {}
    # the core's float64 values rounded once to bfloat16 (kept in float32: exact)
    want = SinusoidalNDSpec(channels=8, layout="mae").table((4, 5), fmt="bfloat16")
    got = pe.apply({}, x)[0]
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)
