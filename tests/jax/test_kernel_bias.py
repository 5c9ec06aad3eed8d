"""posenc.jax's KERPLE, FIRE and Sandwich functions and Flax modules: gradients, vmap,
positions, PyTorch's params by name and bad input (their values at offsets: the
conformance suite)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import posenc  # noqa: E402
import posenc.jax as pj  # noqa: E402


def _fire_weights(heads=8, width=16, seed=0):
    from posenc.core.kernel_bias import FIRE_WEIGHTS

    rng = np.random.default_rng(seed)
    sizes = {"W": width, "H": heads, "1": 1}
    weights = {
        n: rng.uniform(-1, 1, tuple(sizes[a] for a in axes)) for n, axes in FIRE_WEIGHTS.items()
    }
    weights["c"], weights["L_multiplier"] = np.float64(0.3), np.float64(0.02)
    return {n: np.asarray(v, np.float32) for n, v in weights.items()}


def test_batched_and_traced_positions_equal_the_core():
    positions = np.array([[3, 4, 5], [10, 11, 12]])  # (batch, q)
    key_positions = np.arange(13)
    p, a = np.full((8, 1, 1), 1.5, np.float32), np.linspace(0.1, 1, 8, dtype=np.float32)
    weights = _fire_weights()
    calls = {
        "kerple": (lambda q, k: pj.kerple_bias(p, a, 3, 13, positions=q, key_positions=k),
                   posenc.kerple_bias(p, a, 3, 13, positions=positions, key_positions=key_positions)),
        "fire": (lambda q, k: pj.fire_bias(weights, 3, 13, init_L=8.0, positions=q, key_positions=k),
                 posenc.fire_bias(weights, 3, 13, init_L=8.0, positions=positions,
                                  key_positions=key_positions)),
        "sandwich": (lambda q, k: pj.sandwich_bias(3, 13, num_heads=8, dim=64, positions=q,
                                                   key_positions=k, max_length=16),
                     posenc.sandwich_bias(3, 13, num_heads=8, dim=64, positions=positions,
                                          key_positions=key_positions)),
    }  # fmt: skip
    for name, (function, expected) in calls.items():
        for call in (function, jax.jit(function)):
            got = np.asarray(call(jnp.asarray(positions), jnp.asarray(key_positions)))
            assert got.shape == (2, 8, 3, 13), name
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5, err_msg=name)


def test_traced_sandwich_is_nan_past_its_distances_and_at_negative_positions():
    step = jax.jit(lambda o: pj.sandwich_bias(2, 4, num_heads=2, dim=8, offset=o, max_length=4))
    got = np.asarray(step(jnp.int32(3)))  # queries 3, 4: distance 4 is past the table
    expected = posenc.sandwich_bias(2, 4, num_heads=2, dim=8, offset=3)
    assert np.isnan(got[:, 1, 0]).all()
    np.testing.assert_array_equal(got[:, 0], expected[:, 0])
    np.testing.assert_array_equal(got[:, 1, 1:], expected[:, 1, 1:])
    negative = jax.jit(lambda p: pj.sandwich_bias(2, 4, num_heads=2, dim=8, positions=p))
    assert np.isnan(np.asarray(negative(jnp.array([-1, 2])))[:, 0]).all()


def test_gradients_reach_the_weights_and_kerple_passes_them_straight_through():
    p = jnp.array([-0.5, 1.0, 3.0]).reshape(3, 1, 1)  # the first and last out of range
    a = jnp.full((3, 1, 1), 0.5)
    grad_p = jax.grad(lambda p: pj.kerple_bias(p, a, 4, kernel="power").sum())(p)
    assert np.all(np.asarray(grad_p) != 0)  # the clipped ones too, as PyTorch's compiled
    weights = {n: jnp.asarray(v) for n, v in _fire_weights(2, 4).items()}
    grads = jax.grad(lambda w: pj.fire_bias(w, 4, init_L=2.0).sum())(weights)
    assert all(np.any(np.asarray(g) != 0) for g in grads.values())


def test_vmap_over_offsets_equals_each_offset():
    p, a = jnp.ones((2, 1, 1)), jnp.full((2, 1, 1), 0.5)
    offsets = jnp.array([0, 3, 7])
    got = jax.vmap(lambda o: pj.kerple_bias(p, a, 1, 8, offset=o))(offsets)
    for row, offset in zip(np.asarray(got), [0, 3, 7], strict=True):
        np.testing.assert_allclose(row, posenc.kerple_bias(np.ones(2), np.full(2, 0.5), 1, 8,
                                                           offset=offset), atol=1e-6)  # fmt: skip


def test_flax_params_are_pytorch_names_and_load_a_state_dict():
    torch = pytest.importorskip("torch")
    pytest.importorskip("flax")
    import posenc.torch as pt
    from posenc.jax import linen

    with torch.random.fork_rng():  # seeded draws: the same weights in every run
        torch.manual_seed(0)
        sources = (pt.KERPLEBias(8, kernel="power"), pt.FIREBias(8, mlp_width=16))
    for source, module in zip(
        sources, (linen.KERPLEBias(8, kernel="power"), linen.FIREBias(8, mlp_width=16)), strict=True
    ):
        state = {n: v.numpy() for n, v in source.state_dict().items() if n != "init_L"}
        shapes = jax.tree_util.tree_map(jnp.shape, module.init(jax.random.key(0), 4)["params"])
        assert shapes == {n: v.shape for n, v in state.items()}
        with torch.no_grad():
            expected = source(5, 9, offset=4).numpy()
        variables = {"params": {n: jnp.asarray(v) for n, v in state.items()}}
        got = np.asarray(module.apply(variables, 5, 9, offset=4))
        # float32 in another order: a few ulps of values up to ~10^2 (KERPLE's power kernel)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_flax_initial_params_are_drawn_in_range():
    pytest.importorskip("flax")
    from posenc.jax import linen

    params = linen.KERPLEBias(64, kernel="power", eps=0.05).init(jax.random.key(1), 2)["params"]
    p, a = np.asarray(params["bias_p"]), np.asarray(params["bias_a"])
    assert p.min() >= 0.05
    assert p.max() <= 2.0
    assert a.min() >= 0.05
    assert a.max() <= 1.0


def _flax_init(**options):
    from posenc.jax import linen

    return linen.FIREBias(2, mlp_width=4, **options).init(jax.random.key(0), 2)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: pj.kerple_bias(np.ones(2), np.ones(3), 2), ValueError, "one value per head"),
        (lambda: pj.kerple_bias(np.ones((2, 2)), np.ones(2), 2), ValueError, "bias_p must have"),
        (lambda: pj.kerple_bias(np.ones(2, int), np.ones(2), 2), TypeError, "floating"),
        (lambda: pj.kerple_bias(np.ones(2), np.ones(2), 2, kernel="x"), ValueError, "kernel"),
        (lambda: pj.kerple_bias(np.ones(2), np.ones(2), 3, 2), ValueError, "query_length=3"),
        (lambda: pj.fire_bias({"c": 1.0}, 2), ValueError, "lacks"),
        (lambda: pj.fire_bias(_fire_weights(), 2, offset=1, positions=[0, 1]), ValueError,
         "either offset or positions"),
        (lambda: pj.fire_bias(_fire_weights(), 2, positions=[0.5, 1.0]), TypeError, "integers"),
        (lambda: pj.fire_bias(_fire_weights(), 2, positions=[0, 1, 2]), ValueError, "shape"),
        (lambda: pj.sandwich_bias(2, num_heads=2, dim=7), ValueError, "dim must be even"),
        (lambda: jax.jit(lambda o: pj.sandwich_bias(2, num_heads=2, dim=8, offset=o))(
            jnp.int32(1)), ValueError, "key_length must be given"),
        (lambda: pj.sandwich_bias(2, 2, num_heads=2, dim=8, offset=-1), ValueError, "offset"),
        # L = L_multiplier·init_L formed in float32: infinite, the bias a constant
        (lambda: pj.fire_bias(_fire_weights(), 2, init_L=1e300), ValueError,
         "init_L must be at most 3.40282e"),
        # c would start infinite, every bias NaN
        (lambda: _flax_init(init_c=1e39), ValueError, "init_c must be at most 3.40282e"),
        (lambda: _flax_init(init_L=7e4, param_dtype=jnp.float16), ValueError,
         "init_L must be at most 65504, the largest float16"),
    ],
)  # fmt: skip
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()
