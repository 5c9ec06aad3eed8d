"""posenc.jax's xPos and axial RoPE / M-RoPE: functions and Flax modules against the
PyTorch modules and the core, traced coordinates, bfloat16 and errors (their values
eager, jitted and decoded: ``tests/test_conformance.py``)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
linen = pytest.importorskip("posenc.jax.linen")

import posenc.jax as pj  # noqa: E402
from posenc.core.packing import mrope_positions  # noqa: E402
from posenc.core.rope import apply_rope  # noqa: E402
from posenc.specs import AxialRopeSpec  # noqa: E402


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("qk_layout", ["bhsd", "bshd"])
def test_flax_xpos_equals_the_torch_module_with_batched_positions(qk_layout):
    torch = pytest.importorskip("torch")
    import posenc.torch as pt

    options = {"centre": 6.0, "layout": "half", "gamma": 0.3, "scale_base": 128.0}
    q, k = _x((2, 8, 5, 64)), _x((2, 2, 5, 64), seed=1)  # (b, h, s, d): grouped keys
    if qk_layout == "bshd":
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
    positions = np.array([[0, 1, 2, 3, 4], [9, 10, 0, 1, 2]])
    module = linen.XPosRotaryEmbedding(64, max_length=8, qk_layout=qk_layout, **options)
    got = module.apply({}, q, k, positions=positions)
    reference = pt.XPosRotaryEmbedding(64, max_length=8, qk_layout=qk_layout, **options)
    want = reference(torch.from_numpy(q), torch.from_numpy(k), positions=torch.tensor(positions))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=0, atol=2e-6)


def test_flax_mrope_traced_coordinates_gather_and_give_nan_past_the_table():
    ids, _ = mrope_positions([[0, 0, 1, 1, 1, 1, 0, 0, 0, 0]], image_grids=[[1, 4, 4]])
    coords = np.moveaxis(ids, 0, -1)  # (1, 10, 3): positions 0 .. 7
    module = linen.AxialRotaryEmbedding(
        64, n_axes=3, sections=[8, 12, 12], mode="mrope", base=1e6, max_length=6
    )
    q = _x((1, 10, 8, 64))
    eager = module.apply({}, q, q, coords=coords)[0]
    traced = jax.jit(lambda c: module.apply({}, q, q, coords=c)[0])(jnp.asarray(coords))
    inside = coords.max(-1)[0] < 6
    assert inside.tolist() == [True] * 8 + [False] * 2
    # XLA may fuse the jitted rotation into multiply-adds: the last bit may differ
    np.testing.assert_allclose(
        np.asarray(traced)[:, inside], np.asarray(eager)[:, inside], rtol=0, atol=2e-6
    )
    assert np.isnan(np.asarray(traced)[:, ~inside]).all()
    # the gathered tables are the core's, exactly
    spec = module.spec
    options = {"base": 1e6, "sections": [8, 12, 12], "mode": "mrope", "max_length": 6}
    cos = jax.jit(lambda c: pj.axial_rope_tables(c, 64, **options)[0])(jnp.asarray(coords))
    exact = spec.tables(coords)[0][:, inside]
    np.testing.assert_array_equal(np.asarray(cos)[:, inside], exact)


def test_axial_functions_are_exact_at_any_known_coordinate_and_under_vmap():
    coords = np.array([[-4, 7], [100_000, 3], [2, -9]])
    cos, sin = pj.axial_rope_tables(coords, 16, base=100.0, layout="interleaved")
    exact = AxialRopeSpec(head_dim=16, base=100.0, layout="interleaved").tables(coords)
    np.testing.assert_array_equal(np.asarray(cos), exact[0])
    np.testing.assert_array_equal(np.asarray(sin), exact[1])
    grid = np.array([[[0, 1], [2, 3]], [[1, 1], [3, 0]]])  # two images of two tokens

    def tables(c):
        return pj.axial_rope_tables(c, 16, max_length=4)[0]

    mapped = jax.vmap(tables)(jnp.asarray(grid))
    np.testing.assert_array_equal(np.asarray(mapped), AxialRopeSpec(head_dim=16).tables(grid)[0])


def test_xpos_bfloat16_input_is_rotated_and_scaled_in_float32():
    q = jnp.asarray(_x((1, 6, 2, 32))).astype(jnp.bfloat16)
    module = linen.XPosRotaryEmbedding(32, max_length=16)
    got_q, got_k = module.apply({}, q, q, start_index=3)
    want_q, want_k = module.apply({}, q.astype(jnp.float32), q.astype(jnp.float32), start_index=3)
    assert got_q.dtype == got_k.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got_q), np.asarray(want_q.astype(jnp.bfloat16)))
    np.testing.assert_array_equal(np.asarray(got_k), np.asarray(want_k.astype(jnp.bfloat16)))


def test_axial_flax_equals_the_core_for_a_2d_grid():
    coords = np.stack(np.meshgrid(np.arange(3), np.arange(4), indexing="ij"), -1).reshape(-1, 2)
    q = _x((1, 2, 12, 32))
    got, _ = linen.AxialRotaryEmbedding(32, qk_layout="bhsd").apply({}, q, q, coords=coords)
    cos, sin = AxialRopeSpec(head_dim=32).tables(coords, fmt="float64")
    np.testing.assert_allclose(
        np.asarray(got), apply_rope(q.astype(np.float64), cos, sin), rtol=0, atol=2e-6
    )


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: linen.XPosRotaryEmbedding(15).apply({}, _x((1, 2, 2, 15)), _x((1, 2, 2, 15))),
         ValueError, "even"),
        (lambda: linen.XPosRotaryEmbedding(16).apply({}, _x((1, 2, 2, 8)), _x((1, 2, 2, 8))),
         ValueError, "head_dim=16"),
        (lambda: linen.XPosRotaryEmbedding(16, qk_layout="x").apply({}, _x((1, 2, 2, 16)),
                                                                    _x((1, 2, 2, 16))),
         ValueError, "qk_layout"),
        (lambda: linen.AxialRotaryEmbedding(16).apply(
            {}, _x((1, 3, 2, 16)), _x((1, 3, 2, 16)), coords=np.ones((3, 2))),
         TypeError, "integer"),
        (lambda: linen.AxialRotaryEmbedding(16).apply(
            {}, _x((1, 3, 2, 16)), _x((1, 3, 2, 16)), coords=np.ones((4, 2), int)),
         ValueError, "seq=3"),
        (lambda: jax.jit(lambda p: pj.xpos_tables(p, 8))(jnp.arange(3)),
         ValueError, "max_length"),
        (lambda: jax.jit(lambda c: pj.axial_rope_tables(c, 8))(jnp.zeros((3, 2), int)),
         ValueError, "max_length"),
    ],
)  # fmt: skip
def test_bad_input_is_a_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()
