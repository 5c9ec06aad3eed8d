"""Keras xPos and axial RoPE / M-RoPE layers: serialization, mixed precision, symbolic
models, batched positions and errors (their values on every backend, eager, traced and
decoded: ``tests/test_conformance.py``)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

keras = pytest.importorskip("keras")
from keras import ops  # noqa: E402

import posenc.keras as pk  # noqa: E402
from posenc.core.packing import mrope_positions  # noqa: E402
from posenc.core.rope import apply_rope  # noqa: E402
from posenc.core.rope_nd import apply_xpos  # noqa: E402
from posenc.specs import AxialRopeSpec  # noqa: E402


def _x(shape, seed=0, dtype="float32"):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _np(t):
    return ops.convert_to_numpy(ops.cast(t, "float32"))


def _qwen2vl_coords():
    """Qwen2-VL's text + image positions as coordinates ``(1, 10, 3)``."""
    ids, _ = mrope_positions([[0, 0, 1, 1, 1, 1, 0, 0, 0, 0]], image_grids=[[1, 4, 4]])
    return np.moveaxis(ids, 0, -1)


LAYERS = {
    "xpos": lambda: pk.XPosRotaryEmbedding(64, centre=20.0, layout="half", max_length=16),
    "mrope": lambda: pk.AxialRotaryEmbedding(
        64, n_axes=3, sections=[8, 12, 12], mode="mrope", base=1e6, max_length=16
    ),
}


def _call(kind, layer, q, k):
    if kind == "xpos":
        return layer(q, k, start_index=3)
    return layer(q, k, coords=_qwen2vl_coords())


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_config_round_trip_and_saved_model(kind, tmp_path):
    layer = LAYERS[kind]()
    q, k = _x((1, 10, 8, 64)), _x((1, 10, 2, 64), seed=1)  # grouped keys
    want = [_np(t) for t in _call(kind, layer, q, k)]
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert again.get_config() == layer.get_config()
    assert again.spec == layer.spec
    for got, expected in zip(_call(kind, again, q, k), want, strict=True):
        np.testing.assert_array_equal(_np(got), expected)
    # a functional model with a symbolic sequence length, saved and loaded
    qi, ki = keras.Input((None, 8, 64)), keras.Input((None, 2, 64))
    if kind == "xpos":
        outputs = layer(qi, ki, start_index=3)
    else:
        ci = keras.Input((10, 3), dtype="int32", batch_size=1)
        outputs = layer(qi, ki, coords=ci)
    inputs = [qi, ki] if kind == "xpos" else [qi, ki, ci]
    model = keras.Model(inputs, list(outputs))
    path = tmp_path / f"{kind}.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    args = [q, k] if kind == "xpos" else [q, k, _qwen2vl_coords().astype("int32")]
    for got, expected in zip(loaded(args), want, strict=True):
        np.testing.assert_allclose(_np(got), expected, rtol=0, atol=2e-6)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_from_spec_makes_the_layer_of_the_spec(kind):
    # The spec and the layer's own options (max_length, qk_layout) make the layer, as
    # PyTorch's from_spec does; an option the spec gives is refused.
    layer = LAYERS[kind]()
    made = type(layer).from_spec(layer.spec, max_length=16, name=layer.name)
    assert made.spec == layer.spec
    assert made.get_config() == layer.get_config()
    q, k = _x((1, 10, 8, 64)), _x((1, 10, 2, 64), seed=1)
    for got, expected in zip(_call(kind, made, q, k), _call(kind, layer, q, k), strict=True):
        np.testing.assert_array_equal(_np(got), _np(expected))
    with pytest.raises(TypeError, match=r"\['head_dim'\] are given by the spec"):
        type(layer).from_spec(layer.spec, head_dim=32)


def test_xpos_config_keeps_what_extend_gave():
    # As RotaryEmbedding's: a restored layer holds the extended tables, so traced
    # positions that worked in the saved layer work in the restored one.
    # (a centre of this test's own: no other layer shares, or grows, these tables)
    layer = pk.XPosRotaryEmbedding(64, centre=21.5, layout="half", max_length=16)
    assert layer.get_config()["max_length"] == 16
    layer.extend(100)
    config, spec = layer.get_config(), layer.spec
    del layer  # its tables go with it: the restored layer's come from the config
    gc.collect()
    again = pk.XPosRotaryEmbedding.from_config(config)
    assert (again.get_config()["max_length"], again.table_length) == (100, 100)
    assert again.spec == spec


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_mixed_precision_rotates_in_float32_with_the_float32_tables(kind, policy_name, policy):
    """Inputs that the compute dtype holds exactly: the mixed layer's output is the float32
    layer's output rounded once to the compute dtype (float32 tables and arithmetic, never
    tables or products in float16/bfloat16)."""
    compute = policy_name.removeprefix("mixed_")
    q = ops.convert_to_numpy(ops.cast(ops.cast(_x((1, 10, 8, 64)), compute), "float32"))
    full = [_np(t) for t in _call(kind, LAYERS[kind](), q, q)]
    policy(policy_name)
    layer = LAYERS[kind]()
    got = _call(kind, layer, q, q)
    for out, expected in zip(got, full, strict=True):
        assert keras.backend.standardize_dtype(out.dtype) == compute
        expected = _np(ops.cast(expected, compute))
        np.testing.assert_array_equal(_np(out), expected)


def test_xpos_batched_positions_equal_the_core():
    layer = pk.XPosRotaryEmbedding(16, max_length=8, qk_layout="bhsd")
    q, k = _x((2, 4, 5, 16)), _x((2, 1, 5, 16), seed=1)
    positions = np.array([[0, 1, 2, 3, 4], [7, 8, 9, 0, 1]])  # packed; rows past the table
    qx, kx = layer(q, k, positions=positions)
    for b in range(2):
        eq, ek = apply_xpos(
            q[b].astype(np.float64),
            k[b].astype(np.float64),
            q_positions=positions[b],
            k_positions=positions[b],
            centre=0.0,
        )
        np.testing.assert_allclose(_np(qx)[b], eq, rtol=0, atol=4e-6)
        np.testing.assert_allclose(_np(kx)[b], ek, rtol=0, atol=4e-6)
    assert layer.table_length >= 10  # grown for known positions


def test_axial_known_coordinates_are_exact_at_any_coordinate():
    """Known coordinates (negative, far past max_length) get the core's tables."""
    layer = pk.AxialRotaryEmbedding(16, n_axes=2, max_length=4, qk_layout="bhsd")
    coords = np.array([[[-3, 5], [70_000, -1], [0, 0]], [[1, 2], [2, 1], [9, 9]]])
    q = _x((2, 2, 3, 16))
    qr, _ = layer(q, q, coords=coords)
    cos, sin = AxialRopeSpec(head_dim=16, n_axes=2).tables(coords, fmt="float64")
    expected = apply_rope(q.astype(np.float64), cos[:, None], sin[:, None], layout="half")
    np.testing.assert_allclose(_np(qr), expected, rtol=0, atol=2e-6)


def test_layers_of_one_spec_share_their_tables():
    a, b = pk.XPosRotaryEmbedding(32, max_length=8), pk.XPosRotaryEmbedding(32, max_length=8)
    assert a._tables.shares_with(b._tables)
    c = pk.AxialRotaryEmbedding(32, max_length=8)
    d = pk.AxialRotaryEmbedding(32, max_length=8)
    assert c._tables.shares_with(d._tables)


@pytest.mark.parametrize(
    ("make", "call", "error", "match"),
    [
        (lambda: pk.XPosRotaryEmbedding(15), None, ValueError, "head_dim must be even"),
        (lambda: pk.XPosRotaryEmbedding(16, centre="torchscale"), None, TypeError, "centre"),
        (lambda: pk.XPosRotaryEmbedding(16, qk_layout="sbhd"), None, ValueError, "qk_layout"),
        (lambda: pk.AxialRotaryEmbedding(16, n_axes=3), None, ValueError, "sections"),
        (
            lambda: pk.XPosRotaryEmbedding(16),
            lambda layer: layer(_x((1, 5, 2, 8)), _x((1, 5, 2, 8))),
            ValueError,
            "head_dim=16",
        ),
        (
            lambda: pk.XPosRotaryEmbedding(16),
            lambda layer: layer(_x((1, 5, 2, 16)), _x((1, 4, 2, 16))),
            ValueError,
            "same batch and seq",
        ),
        (
            lambda: pk.XPosRotaryEmbedding(16),
            lambda layer: layer(_x((1, 5, 2, 16)), _x((1, 5, 2, 16)), start_index=-1),
            ValueError,
            "start_index",
        ),
        (
            lambda: pk.XPosRotaryEmbedding(16),
            lambda layer: layer(
                _x((1, 3, 2, 16)), _x((1, 3, 2, 16)), start_index=2, positions=[0, 1, 2]
            ),
            ValueError,
            "either start_index or positions",
        ),
        (
            lambda: pk.AxialRotaryEmbedding(16),
            lambda layer: layer(_x((1, 3, 2, 16)), _x((1, 3, 2, 16)), coords=np.ones((3, 2))),
            TypeError,
            "integers",
        ),
        (
            lambda: pk.AxialRotaryEmbedding(16),
            lambda layer: layer(_x((1, 3, 2, 16)), _x((1, 3, 2, 16)), coords=np.ones((3, 3), int)),
            ValueError,
            "n_axes=2",
        ),
    ],
)
def test_bad_input_is_a_clear_error(make, call, error, match):
    if call is None:
        with pytest.raises(error, match=match):
            make()
        return
    layer = make()
    with pytest.raises(error, match=match):
        call(layer)
