"""The Keras CoPE layer on whichever backend ``KERAS_BACKEND`` names (TensorFlow, JAX,
torch; ``test_backends.py`` runs this file on the others).

Expected values come from the NumPy core's float64 :func:`posenc.cope_bias` (itself the
paper's definition, ``tests/core/test_cope.py``) and from the PyTorch module with the same
weights loaded by name.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")
ml_dtypes = pytest.importorskip("ml_dtypes")

import posenc  # noqa: E402
from conformance import keras_traced as traced  # noqa: E402
from posenc.keras import ContextualPositionEncoding  # noqa: E402

ops = keras.ops
RNG = np.random.default_rng(38)
B, H, T, D, NPOS = 2, 8, 12, 64, 9  # real heads and width; counts past 8 clamp
CAUSAL = np.tril(np.ones((T, T), bool))

# Keras' own variable -> NumPy conversion (get_weights, saving) warns under NumPy 2.
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def numpy(tensor) -> np.ndarray:
    return np.asarray(ops.convert_to_numpy(ops.cast(tensor, "float32")), np.float64)


@pytest.fixture(scope="module")
def data():
    return {"q": normal(B, H, T, D), "k": normal(B, H, T, D), "pos_emb": normal(1, D, NPOS)}


def layer_with(pos_emb: np.ndarray, **kwargs) -> ContextualPositionEncoding:
    layer = ContextualPositionEncoding(pos_emb.shape[1], max_positions=pos_emb.shape[2], **kwargs)
    layer.build()
    layer.pos_emb.assign(pos_emb)
    return layer


# Masks: causal (T, T); padding per batch row (B, 1, 1, T) with causal; none.
PADDED = CAUSAL & (np.arange(T) >= np.array([[0], [4]]))[:, None, None, :]
MASKS = {"causal": CAUSAL, "padded": PADDED, "none": None}


@pytest.mark.backend_independent  # values: the conformance suite's cope cases
@pytest.mark.parametrize("mask", MASKS)
def test_equals_the_core_eagerly_and_traced(data, mask):
    layer = layer_with(data["pos_emb"])
    allowed = MASKS[mask]
    expected = posenc.cope_bias(
        data["q"], data["k"], data["pos_emb"], allowed=allowed, scale=D**-0.5
    )

    def call(q, k):
        return layer(q, k, allowed=allowed, scale=D**-0.5)

    for run in (call, traced(call)):
        got = run(ops.convert_to_tensor(data["q"]), ops.convert_to_tensor(data["k"]))
        assert keras.backend.standardize_dtype(got.dtype) == "float32"
        np.testing.assert_allclose(numpy(got), expected, rtol=0, atol=1e-5)


def test_queries_after_cached_keys_and_their_gradient(data):
    """Three queries, the last of twelve keys (a decode step's shape), at the scale 1
    (gates near 0 and 1, biases up to ~20); the gradient of the bias reaches the weight:
    the bias is linear in it, so its derivative along a direction is the core's bias of
    that direction."""
    layer = layer_with(data["pos_emb"])
    allowed = CAUSAL[-3:]
    got = layer(data["q"][:, :, -3:], data["k"], allowed=allowed)
    full = posenc.cope_bias(data["q"], data["k"], data["pos_emb"], allowed=CAUSAL)
    np.testing.assert_allclose(numpy(got), full[:, :, -3:], rtol=1e-5, atol=1e-5)
    direction = normal(1, D, NPOS)
    q64, k64 = data["q"][:, :, -3:].astype(np.float64), data["k"].astype(np.float64)
    slope = posenc.cope_bias(q64, k64, direction, allowed=allowed).sum()
    assert slope == pytest.approx(
        _directional_derivative(layer, q64, k64, allowed, direction), rel=1e-4
    )


def _directional_derivative(layer, q, k, allowed, direction) -> float:
    """d/dt Σ bias(pos_emb + t·direction) at t = 0, by the backend's autodiff."""
    backend = keras.backend.backend()
    qt, kt = (
        ops.convert_to_tensor(q.astype(np.float32)),
        ops.convert_to_tensor(k.astype(np.float32)),
    )
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            total = ops.sum(layer(qt, kt, allowed=allowed))
        grad = tape.gradient(total, layer.pos_emb.value)
    elif backend == "jax":
        import jax

        def total(weight):
            values, _ = layer.stateless_call([weight], [], qt, kt, allowed=allowed)
            return ops.sum(values)

        grad = jax.grad(total)(layer.pos_emb.value)
    else:
        layer.pos_emb.value.grad = None
        ops.sum(layer(qt, kt, allowed=allowed)).backward()
        grad = layer.pos_emb.value.grad
    return float((np.asarray(ops.convert_to_numpy(grad), np.float64) * direction).sum())


def test_weights_load_by_name_from_the_pytorch_module(data):
    torch = pytest.importorskip("torch")
    from posenc.torch import ContextualPositionEncoding as TorchCoPE

    module = TorchCoPE(D, max_positions=NPOS)
    with torch.no_grad():
        module.pos_emb.normal_(generator=torch.Generator().manual_seed(5))
    layer = ContextualPositionEncoding(D, max_positions=NPOS)
    layer.build()
    for name, value in module.state_dict().items():
        getattr(layer, name).assign(value.numpy())
    q, k = data["q"], data["k"]
    expected = module(
        torch.from_numpy(q), torch.from_numpy(k), allowed=torch.from_numpy(CAUSAL), scale=0.125
    )
    got = layer(q, k, allowed=CAUSAL, scale=0.125)
    # float32 in both, summed in another order: a few ulps of values up to ~3
    np.testing.assert_allclose(numpy(got), expected.detach().double().numpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_counts_in_float32_and_rounds_once(data, policy, policy_name):
    """Under a mixed policy the inputs are rounded to the compute dtype, the bias is the
    float32 computation of those inputs (the weight stays float32) rounded once."""
    policy(policy_name)
    layer = layer_with(data["pos_emb"])
    assert keras.backend.standardize_dtype(layer.pos_emb.dtype) == "float32"
    got = layer(data["q"], data["k"], allowed=CAUSAL, scale=0.125)
    compute = policy_name.removeprefix("mixed_")
    assert keras.backend.standardize_dtype(got.dtype) == compute
    policy("float32")
    exact = layer_with(data["pos_emb"])
    fmt = ml_dtypes.bfloat16 if compute == "bfloat16" else np.float16
    q, k = (x.astype(fmt).astype(np.float32) for x in (data["q"], data["k"]))
    once = numpy(ops.cast(exact(q, k, allowed=CAUSAL, scale=0.125), compute))
    np.testing.assert_array_equal(numpy(got), once)
    # and that is the core's float64 bias of the rounded inputs, to the format's rounding
    core = posenc.cope_bias(q, k, data["pos_emb"], allowed=CAUSAL, scale=0.125)
    np.testing.assert_allclose(
        numpy(got), core, rtol=2.0 ** -(8 if compute == "bfloat16" else 11), atol=1e-6
    )


def tiny_model(layer: ContextualPositionEncoding) -> keras.Model:
    """Queries and keys → CoPE bias (causal) → softmax → a score per query."""
    q, k = keras.Input(shape=(2, 5, 8)), keras.Input(shape=(2, 5, 8))
    bias = layer(q, k, allowed=np.tril(np.ones((5, 5), bool)), scale=8**-0.5)
    hidden = keras.layers.Softmax(axis=-1)(bias)
    return keras.Model([q, k], keras.layers.Dense(1)(hidden))


def test_symbolic_call_and_one_fit_step():
    layer = ContextualPositionEncoding(8, max_positions=6)
    model = tiny_model(layer)
    assert tuple(model.outputs[0].shape) == (None, 2, 5, 1)
    before = layer.get_weights()[0].copy()
    assert not before.any()  # the authors' zeros
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    x = [normal(4, 2, 5, 8), normal(4, 2, 5, 8)]
    history = model.fit(x, normal(4, 2, 5, 1), batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert not np.array_equal(layer.get_weights()[0], before)


def test_config_round_trips_and_keras_file(tmp_path, data):
    layer = layer_with(data["pos_emb"], embeddings_initializer="ones")
    config = layer.get_config()
    assert (config["head_dim"], config["max_positions"]) == (D, NPOS)
    q, k = data["q"][:1, :2], data["k"][:1, :2]
    for clone in (
        ContextualPositionEncoding.from_config(config),
        keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer)),
    ):
        assert type(clone) is ContextualPositionEncoding
        assert clone.get_config() == config
        assert clone.spec == layer.spec
        if not clone.built:
            clone.build()
        np.testing.assert_array_equal(clone.get_weights()[0], np.ones((1, D, NPOS)))
        clone.set_weights(layer.get_weights())
        np.testing.assert_array_equal(numpy(clone(q, k)), numpy(layer(q, k)))
    model = tiny_model(ContextualPositionEncoding(8, max_positions=6))
    model.layers[2].set_weights([normal(1, 8, 6)])
    x = [normal(3, 2, 5, 8), normal(3, 2, 5, 8)]
    model.save(tmp_path / "cope.keras")
    loaded = keras.models.load_model(tmp_path / "cope.keras")
    np.testing.assert_array_equal(numpy(loaded(x)), numpy(model(x)))


def test_from_spec():
    spec = posenc.CopeSpec(head_dim=16, max_positions=33)
    assert ContextualPositionEncoding.from_spec(spec).spec == spec


@pytest.mark.backend_independent  # options: validated by the specs
@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: ContextualPositionEncoding(0, max_positions=4), ValueError, "head_dim"),
        (lambda: ContextualPositionEncoding(4, max_positions=0), ValueError, "max_positions"),
        (lambda: ContextualPositionEncoding(4, max_positions=4, embeddings_initializer=3), ValueError, "embeddings_initializer"),
    ],
)  # fmt: skip
def test_bad_options_are_refused_by_name(make, error, match):
    with pytest.raises(error, match=match):
        make()


Q = np.zeros((2, 2, 3, 4), np.float32)


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ((Q[..., :3], Q), ValueError, r"q must have shape \(batch, heads, seq, 4\)"),
        ((Q, Q[:1]), ValueError, "q and k must have the same batch and heads"),
        ((Q, Q, {"allowed": np.ones((4, 3), bool)}), ValueError, "allowed must broadcast"),
        ((Q, Q, {"allowed": np.ones((3, 3), np.float32)}), TypeError, "allowed must be a boolean"),
        ((Q, Q, {"scale": 0.0}), ValueError, "scale must be a finite real number > 0"),
        ((Q, Q, {"scale": "a"}), TypeError, "scale must be a finite real number"),
        ((Q.astype(np.int32), Q), TypeError, "floating dtype"),
    ],
)  # fmt: skip
def test_bad_calls_are_refused_by_name(arguments, error, match):
    layer = ContextualPositionEncoding(4, max_positions=3)
    *tensors, options = arguments if isinstance(arguments[-1], dict) else (*arguments, {})
    with pytest.raises(error, match=match):
        layer(*tensors, **options)
