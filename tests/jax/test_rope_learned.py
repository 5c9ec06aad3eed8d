"""Learned RoPE in JAX: ``posenc.jax.learned_rope_tables`` under jit, vmap and grad, and the
Flax module ``posenc.jax.linen.LearnedRotaryEmbedding``.

Expected values come from the NumPy core (``posenc.rope_tables`` of the same frequencies in
float64, ``posenc.apply_rope``, ``learned_rope_frequencies``), closed forms (the gradient of
``cos(p·θ)``) and PyTorch's module, whose trained frequencies load here by name.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import posenc  # noqa: E402
from posenc.core.rope import learned_rope_frequencies, rope_options  # noqa: E402
from posenc.jax import apply_rope, learned_rope_tables  # noqa: E402

RNG = np.random.default_rng(3838)
THETA = (posenc.rope_frequencies(64) * (1 + 0.2 * RNG.standard_normal(32))).astype(np.float32)
YARN = {"factor": 4.0, "original_max_position_embeddings": 16}
# (batch, heads, seq, head_dim) queries and grouped keys: 8 query heads, 2 key heads of 64
Q = RNG.standard_normal((2, 8, 10, 64)).astype(np.float32)
K = RNG.standard_normal((2, 2, 10, 64)).astype(np.float32)


def exact(where, inv_freq=THETA, layout="half", scale=1.0):
    """The core's float64 tables of the same (float32) frequencies."""
    return posenc.rope_tables(where, inv_freq, dtype="float64", layout=layout, scale=scale)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_tables_equal_the_core_concrete_traced_and_mapped(layout):
    where = np.array([[0, 1, 7, 4095, 4096, 10**6], [2**24 - 1, 2**24, 3, 5, 2, 1]])
    cos, sin = learned_rope_tables(where, THETA, layout=layout, attention_factor=1.25)
    ref_cos, ref_sin = exact(where, layout=layout, scale=1.25)
    assert cos.shape == (2, 6, 64) and cos.dtype == jnp.float32  # noqa: PT018
    np.testing.assert_allclose(cos, ref_cos, rtol=0, atol=4e-7)
    np.testing.assert_allclose(sin, ref_sin, rtol=0, atol=4e-7)
    jitted = jax.jit(lambda p, f: learned_rope_tables(p, f, layout=layout, attention_factor=1.25))
    mapped = jax.vmap(jitted, in_axes=(0, None))
    for got in (jitted(jnp.asarray(where), THETA), mapped(jnp.asarray(where), THETA)):
        np.testing.assert_allclose(got[0], ref_cos, rtol=0, atol=4e-7)
        np.testing.assert_allclose(got[1], ref_sin, rtol=0, atol=4e-7)


def test_traced_positions_outside_int32_give_nan():
    where = jnp.array([-1, 0, 5, 2**31 - 1])  # saturated: the last is past the range
    cos, sin = jax.jit(learned_rope_tables)(where, THETA)
    assert np.isnan(cos[jnp.array([0, 3])]).all() and np.isnan(sin[0]).all()  # noqa: PT018
    np.testing.assert_allclose(cos[1:3], exact(np.array([0, 5]))[0], rtol=0, atol=4e-7)


def test_gradient_is_the_closed_form():
    where = np.array([3, 1000, 123457])

    def loss(inv_freq):
        cos, sin = learned_rope_tables(where, inv_freq)
        return cos[..., :32].sum() + 2 * sin[..., :32].sum()

    theta = THETA.astype(np.float64)
    angle = where[:, None] * theta  # d/dθ [cos(pθ) + 2 sin(pθ)] = p(-sin + 2 cos)
    expected = (where[:, None] * (-np.sin(angle) + 2 * np.cos(angle))).sum(0)
    got = jax.jit(jax.grad(loss))(jnp.asarray(THETA))
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-3)


def test_function_refuses_bad_input():
    with pytest.raises(ValueError, match="0 .. 2\\*\\*31 - 1"):
        learned_rope_tables(np.array([-1]), THETA)
    with pytest.raises(TypeError, match="integers"):
        learned_rope_tables(np.array([0.5]), THETA)
    with pytest.raises(ValueError, match="1-D"):
        learned_rope_tables(np.arange(3), THETA[None])
    with pytest.raises(ValueError, match="layout"):
        learned_rope_tables(np.arange(3), THETA, layout="pairs")
    with pytest.raises(TypeError, match="integers"):
        jax.jit(learned_rope_tables)(jnp.arange(3.0), THETA)


# --- Flax linen ------------------------------------------------------------------------------


@pytest.fixture
def linen():
    pytest.importorskip("flax")
    from posenc.jax import linen

    return linen


def reference(x, inv_freq, where, layout="half", factor=1.0):
    """``(b, h, s, d)`` x rotated in float64 by the core, rounded once."""
    cos, sin = exact(where, inv_freq, layout, factor)
    if cos.ndim == 3:
        cos, sin = cos[:, None], sin[:, None]
    return posenc.apply_rope(x.astype(np.float64), cos, sin, layout=layout).astype(np.float32)


@pytest.mark.parametrize("qk_layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_linen_starts_as_rope_and_rotates_by_its_params(layout, qk_layout, linen):
    module = linen.LearnedRotaryEmbedding(
        64, rotary_dim=48, layout=layout, scaling="yarn", scaling_params=YARN, qk_layout=qk_layout
    )
    q, k = (Q, K) if qk_layout == "bhsd" else (Q.transpose(0, 2, 1, 3), K.transpose(0, 2, 1, 3))
    variables = module.init(jax.random.key(0), q, k)
    scaling, _, _ = rope_options("yarn", YARN)
    start, factor = learned_rope_frequencies(scaling, 48, 10000.0, owner="test")
    np.testing.assert_array_equal(variables["params"]["inv_freq"], start)
    trained = {"params": {"inv_freq": jnp.asarray(THETA[:24])}}
    batched = np.stack([np.arange(10) + 3, RNG.permutation(10) + 5000])
    for where, kwargs in (
        (np.arange(300, 310), {"start_index": 300}),
        (batched, {"positions": batched}),
    ):
        q_rot, k_rot = module.apply(trained, q, k, **kwargs)
        if qk_layout == "bshd":
            q_rot, k_rot = q_rot.transpose(0, 2, 1, 3), k_rot.transpose(0, 2, 1, 3)
        for got, x in ((q_rot, Q), (k_rot, K)):
            expected = reference(x, THETA[:24], where, layout, factor)
            np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)
    # traced start and decoding token by token equal the full call
    full, _ = module.apply(trained, q, k, start_index=7)
    step = jax.jit(lambda q, k, s: module.apply(trained, q, k, start_index=s))
    axis = 2 if qk_layout == "bhsd" else 1
    steps = [
        step(
            jnp.take(q, jnp.array([t]), axis), jnp.take(k, jnp.array([t]), axis), jnp.int32(7 + t)
        )[0]
        for t in range(10)
    ]
    np.testing.assert_allclose(jnp.concatenate(steps, axis), full, rtol=0, atol=1e-6)


def test_linen_frequencies_train_and_torch_weights_load_by_name(linen):
    torch = pytest.importorskip("torch")
    from posenc.torch import LearnedRotaryEmbedding as TorchLearned

    module = TorchLearned(
        64, layout="interleaved", scaling="linear", scaling_params={"factor": 2.0}
    )
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    for _ in range(3):  # a few training steps in PyTorch
        loss = sum(t.square().sum() for t in module(torch.from_numpy(Q), torch.from_numpy(K)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    flax_module = linen.LearnedRotaryEmbedding(
        64, layout="interleaved", scaling="linear", scaling_params={"factor": 2.0},
        qk_layout="bhsd",
    )  # fmt: skip
    params = {"params": {name: jnp.asarray(v.numpy()) for name, v in module.state_dict().items()}}
    got = flax_module.apply(params, Q, K, start_index=40)
    expected = module(torch.from_numpy(Q), torch.from_numpy(K), offset=40)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e.detach().numpy(), rtol=0, atol=2e-6)
    # The param receives gradients in Flax too.
    grad = jax.grad(lambda p: sum(jnp.sum(t**2) for t in flax_module.apply(p, Q[:, :1], K)))(params)
    assert np.abs(grad["params"]["inv_freq"]).max() > 0


def test_linen_refuses_what_pytorch_refuses(linen):
    pt = pytest.importorskip("posenc.torch")
    dynamic = {"scaling": "dynamic_ntk",
               "scaling_params": {"factor": 2.0, "original_max_position_embeddings": 8}}  # fmt: skip
    for kwargs, error, match in (
        (dynamic, ValueError, "none to train"),
        ({"qk_layout": "bsdh"}, ValueError, "qk_layout"),
        ({"rotary_dim": 7}, ValueError, "rotary_dim"),
        ({"base": 1e-60}, ValueError, "past float32"),
    ):
        with pytest.raises(error, match=match):
            linen.LearnedRotaryEmbedding(8, **kwargs)
        with pytest.raises(error, match=match):
            pt.LearnedRotaryEmbedding(8, **kwargs)
    module = linen.LearnedRotaryEmbedding(64, qk_layout="bhsd")
    variables = module.init(jax.random.key(0), Q, K)
    for args, kwargs, error, match in (
        ((Q[0], K[0]), {}, ValueError, "must have shape"),
        ((Q[..., :32], K), {}, ValueError, "head_dim=64"),
        ((Q, K[:, :, :5]), {}, ValueError, "same batch and seq"),
        ((Q, K), {"start_index": -1}, ValueError, "start_index"),
        ((Q, K), {"start_index": 2, "positions": np.arange(10)}, TypeError, "not both"),
        ((Q, K), {"positions": np.arange(5)}, ValueError, "seq=10"),
        ((Q, K), {"positions": np.arange(10) - 1}, ValueError, "0 .. 2"),
        ((Q.astype(np.int32), K), {}, TypeError, "floating"),
    ):
        with pytest.raises(error, match=match):
            module.apply(variables, *args, **kwargs)


def test_apply_rope_of_the_tables_is_the_module(linen):
    """The pure function and the module are one computation."""
    module = linen.LearnedRotaryEmbedding(64, qk_layout="bhsd")
    variables = {"params": {"inv_freq": jnp.asarray(THETA)}}
    cos, sin = learned_rope_tables(np.arange(5, 15), THETA)
    np.testing.assert_array_equal(
        module.apply(variables, Q, K, start_index=5)[0], apply_rope(Q, cos, sin)
    )


def test_linen_default_order_is_that_of_the_flax_rope(linen):
    # (batch, seq, heads, head_dim), as linen.RotaryEmbedding: swapping one module for the
    # other keeps the positions (a (b, h, s, d) default read such input along the heads)
    q = Q.transpose(0, 2, 1, 3)  # (b, s, h, d)
    learned = linen.LearnedRotaryEmbedding(64)
    variables = learned.init(jax.random.key(0), q, q)
    got, _ = learned.apply(variables, q, q, start_index=7)
    fixed = linen.RotaryEmbedding()
    expected = fixed.apply(fixed.init(jax.random.key(0), q), q, start_index=7)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=0, atol=2e-6)
