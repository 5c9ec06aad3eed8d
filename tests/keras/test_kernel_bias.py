"""The Keras KERPLE, FIRE and Sandwich layers: serialization, saved models, mixed precision,
symbolic calls, a fit() step and bad input (their values: the conformance suite).

Runs on every backend (``test_backends.py``)."""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import posenc  # noqa: E402
import posenc.keras as pk  # noqa: E402
from posenc.core.kernel_bias import FIRE_WEIGHTS  # noqa: E402

LAYERS = {
    "kerple": lambda: pk.KERPLEBias(8, kernel="power", eps=0.02),
    "fire": lambda: pk.FIREBias(8, mlp_width=8, init_c=0.2, init_L=16.0),
    "sandwich": lambda: pk.SandwichBias(8, dim=64, base=100.0, mode="symmetric", max_length=8),
}


def _numpy(tensor):
    return keras.ops.convert_to_numpy(keras.ops.cast(tensor, "float32"))


def _reference(layer, q, k, start=None):
    """The core's float64 bias of the layer's weights."""
    if isinstance(layer, pk.KERPLEBias):
        p, a = (np.asarray(w, np.float64) for w in layer.get_weights())
        return posenc.kerple_bias(p, a, q, k, kernel=layer.spec.kernel, eps=layer.spec.eps,
                                  offset=start)  # fmt: skip
    if isinstance(layer, pk.FIREBias):
        weights = dict(zip(FIRE_WEIGHTS, layer.get_weights(), strict=True))
        return posenc.fire_bias(weights, q, k, init_L=layer.spec.init_L, offset=start)
    return layer.spec.bias(q, k, offset=start, fmt="float64")


@pytest.mark.parametrize("scheme", LAYERS)
def test_config_round_trip_and_saved_model(scheme, tmp_path):
    layer = LAYERS[scheme]()
    scores = np.random.default_rng(0).standard_normal((2, 8, 5, 7)).astype("float32")
    inputs = keras.Input((8, 5, 7))
    model = keras.Model(inputs, layer(inputs))  # symbolic call
    expected = _numpy(model(scores))
    np.testing.assert_allclose(expected, scores + _reference(layer, 5, 7), atol=2e-5)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is type(layer)
    assert clone.spec == layer.spec
    assert clone.get_config() == layer.get_config()
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(_numpy(loaded(scores)), expected)


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_rounds_once(policy, policy_name):
    policy(policy_name)
    fmt = policy_name.removeprefix("mixed_")
    sandwich = pk.SandwichBias(4, dim=16)
    scores = keras.ops.zeros((1, 4, 3, 300), fmt)
    got = _numpy(sandwich(scores))[0]  # the core's values rounded once to fmt
    expected = posenc.sandwich_bias(3, 300, num_heads=4, dim=16, fmt=fmt).astype(np.float32)
    np.testing.assert_array_equal(got, expected)
    kerple = pk.KERPLEBias(4)
    out = kerple(keras.ops.zeros((1, 4, 3, 300), fmt))
    assert keras.backend.standardize_dtype(out.dtype) == fmt
    assert keras.backend.standardize_dtype(kerple.bias_p.dtype) == "float32"
    # the kernel in float32, rounded once: the float64 values' rounding, up to one ulp
    ref = _reference(kerple, 3, 300)
    np.testing.assert_allclose(_numpy(out)[0], ref, rtol=2**-7 if fmt == "bfloat16" else 2**-10)


@pytest.mark.parametrize("scheme", ["kerple", "fire"])
def test_fit_step_trains_the_weights_and_kerple_stays_in_range(scheme):
    layer = LAYERS[scheme]()
    inputs = keras.Input((8, 4, 4))
    model = keras.Model(inputs, layer(inputs))
    model.compile(optimizer=keras.optimizers.SGD(100.0), loss="mse")
    before = [np.array(w) for w in layer.get_weights()]
    x = np.zeros((2, 8, 4, 4), "float32")
    model.fit(x, np.full_like(x, 50.0), epochs=1, verbose=0)
    after = layer.get_weights()
    assert any(not np.array_equal(b, a) for b, a in zip(before, after, strict=True))
    if scheme == "kerple":  # projected after the step (a large one pushes them out)
        p, a = after
        assert p.min() >= 0.02
        assert p.max() <= 2.0
        assert a.min() >= 0.02


def test_kerple_weights_set_out_of_range_are_used_projected():
    layer = pk.KERPLEBias(2)
    layer.build()
    layer.set_weights([np.full((2, 1, 1), -1.0), np.full((2, 1, 1), 0.5)])
    got = _numpy(layer.compute_bias(3))
    expected = posenc.kerple_bias([-1.0, -1.0], [0.5, 0.5], 3)  # held at eps = 0.01
    np.testing.assert_allclose(got, expected, atol=1e-7)
    assert expected[0, 2, 0] == pytest.approx(-0.01 * np.log1p(1.0))


# values: the conformance suite's fire cases (weights set in FIRE_WEIGHTS order); the
# weights' names are Keras's add_weight names, the same on every backend
@pytest.mark.backend_independent
def test_weights_load_from_pytorch_by_name():
    torch = pytest.importorskip("torch")
    import posenc.torch as pt

    with torch.random.fork_rng():  # seeded draws: the same weights in every run
        torch.manual_seed(0)
        source = pt.FIREBias(4, mlp_width=8)
    state = {name: value.numpy() for name, value in source.state_dict().items()}
    layer = pk.FIREBias(4, mlp_width=8)
    layer.build()
    assert [w.name for w in layer.weights] == [n.replace(".", "_") for n in FIRE_WEIGHTS]
    layer.set_weights([state[name] for name in FIRE_WEIGHTS])
    with torch.no_grad():
        expected = source(3, 9).numpy()
    np.testing.assert_allclose(_numpy(layer.compute_bias(3, 9)), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.backend_independent  # values: the conformance suite's sandwich cases
def test_sandwich_grows_past_its_table_and_decodes_like_the_full_call():
    layer = pk.SandwichBias(3, dim=8, max_length=2)
    full = _numpy(layer.compute_bias(6, dtype="float32"))
    np.testing.assert_array_equal(full, posenc.sandwich_bias(6, num_heads=3, dim=8))
    other = pk.SandwichBias(3, dim=8, max_length=2)
    steps = [_numpy(other(keras.ops.zeros((1, 3, 1, t + 1)), start_index=t)) for t in range(6)]
    for t, step in enumerate(steps):
        np.testing.assert_array_equal(step[0, :, 0], full[:, t, : t + 1])


@pytest.mark.backend_independent  # options: validated by the specs
@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: pk.KERPLEBias(0), ValueError, "num_heads"),
        (lambda: pk.KERPLEBias(2, kernel="cubic"), ValueError, "kernel"),
        (lambda: pk.KERPLEBias(2, kernel="power", eps=3.0), ValueError, "eps"),
        (lambda: pk.FIREBias(2, mlp_width=0), ValueError, "mlp_width"),
        (lambda: pk.FIREBias(2, init_L=-1.0), ValueError, "init_L"),
        # c and L = L_multiplier·init_L are float32: infinite, NaN or constant biases
        (lambda: pk.FIREBias(2, init_c=1e39), ValueError, "init_c must be at most 3.40282e"),
        (lambda: pk.FIREBias(2, init_L=1e300), ValueError, "init_L must be at most 3.40282e"),
        (lambda: pk.SandwichBias(2, dim=7), ValueError, "dim must be even"),
        (lambda: pk.SandwichBias(2, dim=8, mode="both"), ValueError, "mode"),
        (lambda: pk.SandwichBias(2, dim=8, max_length=0), ValueError, "max_length"),
    ],
)
def test_bad_options_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("scheme", LAYERS)
def test_bad_calls_are_named(scheme):
    layer = LAYERS[scheme]()
    with pytest.raises(ValueError, match="num_heads=8"):
        layer(np.zeros((1, 4, 3, 3), "float32"))
    with pytest.raises(ValueError, match="start_index"):
        layer(np.zeros((1, 8, 3, 3), "float32"), start_index=-1)
    with pytest.raises(ValueError, match="query_length=4 > key_length=3"):
        layer.compute_bias(4, 3)
    with pytest.raises(TypeError, match="floating"):
        layer(np.zeros((1, 8, 3, 3), "int32"))
