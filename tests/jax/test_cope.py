"""CoPE in JAX: ``posenc.jax.cope_bias`` and the Flax module, against the NumPy core's
float64 :func:`posenc.cope_bias` (the paper's definition, ``tests/core/test_cope.py``)
and the PyTorch module's weights loaded by name."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import posenc  # noqa: E402
from posenc.jax import cope_bias  # noqa: E402

RNG = np.random.default_rng(38)
B, H, T, D, NPOS = 2, 8, 12, 64, 9  # real heads and width; counts past 8 clamp
CAUSAL = np.tril(np.ones((T, T), bool))
PADDED = CAUSAL & (np.arange(T) >= np.array([[0], [4]]))[:, None, None, :]  # (B, 1, T, T)


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


Q, K, E = normal(B, H, T, D), normal(B, H, T, D), normal(1, D, NPOS)


@pytest.mark.parametrize("mask", [CAUSAL, PADDED, None], ids=["causal", "padded", "none"])
def test_equals_the_core_eagerly_under_jit_and_vmap(mask):
    expected = posenc.cope_bias(Q, K, E, allowed=mask, scale=D**-0.5)
    call = jax.jit(lambda q, k, e: cope_bias(q, k, e, allowed=mask, scale=D**-0.5))
    for got in (cope_bias(Q, K, E, allowed=mask, scale=D**-0.5), call(Q, K, E)):
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=1e-5)
    if mask is None:  # vmap over the batch: each row alone
        rows = jax.vmap(lambda q, k: cope_bias(q[None], k[None], E, scale=D**-0.5)[0])(Q, K)
        np.testing.assert_allclose(np.asarray(rows), expected, rtol=0, atol=1e-5)


def test_gradient_reaches_the_vectors():
    """The bias is linear in pos_emb: its derivative along a direction is the core's bias
    of that direction."""
    direction = normal(1, D, NPOS)
    q, k = Q[:, :, -3:], K
    expected = posenc.cope_bias(q, k, direction, allowed=CAUSAL[-3:]).sum()
    grad = jax.grad(lambda e: cope_bias(q, k, e, allowed=CAUSAL[-3:]).sum())(jnp.asarray(E))
    assert float((np.asarray(grad, np.float64) * direction).sum()) == pytest.approx(
        expected, rel=1e-4
    )


def test_bfloat16_counts_in_float32_and_rounds_once():
    q, k = (jnp.asarray(x, jnp.bfloat16) for x in (Q, K))
    got = cope_bias(q, k, jnp.asarray(E), allowed=CAUSAL, scale=0.125)
    assert got.dtype == jnp.bfloat16
    once = cope_bias(q.astype(jnp.float32), k.astype(jnp.float32), jnp.asarray(E),
                     allowed=CAUSAL, scale=0.125).astype(jnp.bfloat16)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(once, np.float32))


def test_nan_queries_give_nan_biases_not_an_index_error():
    q = jnp.ones((1, 1, 2, 2)).at[0, 0, 0, 0].set(jnp.nan)
    bias = np.asarray(cope_bias(q, jnp.ones((1, 1, 2, 2)), jnp.ones((1, 2, 3))))
    assert np.isnan(bias[0, 0, 0]).all()
    assert np.isfinite(bias[0, 0, 1]).all()


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ((Q[..., :3], K, E), ValueError, r"q must have shape \(batch, heads, seq, 64\)"),
        ((Q, K[:1], E), ValueError, "q and k must have the same batch and heads"),
        ((Q, K, E[0]), ValueError, "pos_emb must have shape"),
        ((Q, K, E, {"allowed": np.ones((4, 3), bool)}), ValueError, "allowed must broadcast"),
        ((Q, K, E, {"allowed": np.ones((T, T))}), TypeError, "allowed must be a boolean"),
        ((Q, K, E, {"scale": -1.0}), ValueError, "scale must be a finite real number > 0"),
        ((Q.astype(np.int32), K, E), TypeError, "q must be a floating-point array"),
        (([[1.0]], K, E), TypeError, "q must be a floating-point array"),
    ],
)  # fmt: skip
def test_bad_calls_are_refused_by_name(arguments, error, match):
    *arrays, options = arguments if isinstance(arguments[-1], dict) else (*arguments, {})
    with pytest.raises(error, match=match):
        cope_bias(*arrays, **options)


# --- Flax ------------------------------------------------------------------------------


def test_flax_module_loads_the_pytorch_weights_by_name():
    linen = pytest.importorskip("posenc.jax.linen")
    torch = pytest.importorskip("torch")
    from posenc.torch import ContextualPositionEncoding as TorchCoPE

    module = TorchCoPE(D, max_positions=NPOS)
    with torch.no_grad():
        module.pos_emb.normal_(generator=torch.Generator().manual_seed(5))
    cope = linen.ContextualPositionEncoding(D, max_positions=NPOS)
    initial = cope.init(jax.random.key(0), Q, K)
    assert not np.asarray(initial["params"]["pos_emb"]).any()  # the authors' zeros
    variables = {"params": {n: jnp.asarray(v.numpy()) for n, v in module.state_dict().items()}}
    assert jax.tree_util.tree_map(jnp.shape, variables) == jax.tree_util.tree_map(
        jnp.shape, initial
    )
    expected = module(torch.from_numpy(Q), torch.from_numpy(K), allowed=torch.from_numpy(CAUSAL),
                      scale=0.125).detach().numpy()  # fmt: skip
    got = jax.jit(lambda v, q, k: cope.apply(v, q, k, allowed=CAUSAL, scale=0.125))(variables, Q, K)
    # float32 in both, summed in another order: a few ulps of values up to ~3
    np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=1e-5)


def test_flax_module_options_are_the_specs():
    linen = pytest.importorskip("posenc.jax.linen")
    spec = posenc.CopeSpec(head_dim=16, max_positions=33)
    assert linen.ContextualPositionEncoding.from_spec(spec).max_positions == 33
    with pytest.raises(ValueError, match="max_positions"):
        linen.ContextualPositionEncoding(16, max_positions=0)
    with pytest.raises(ValueError, match="head_dim"):
        linen.ContextualPositionEncoding(0, max_positions=4)
