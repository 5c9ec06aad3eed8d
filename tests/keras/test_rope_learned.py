"""The Keras 3 LearnedRotaryEmbedding layer, on whichever backend KERAS_BACKEND selects.

Backend-agnostic (``test_backends.py`` runs it on the other backends). Expected values come
from the NumPy core: the starting frequencies of ``learned_rope_frequencies``, the exact
float64 ``rope_tables`` of the layer's current frequencies and ``apply_rope``; and from
PyTorch's module where trained frequencies move between frameworks by name.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")

from keras import ops  # noqa: E402

from conformance import keras_traced as traced  # noqa: E402
from posenc.core.rope import (  # noqa: E402
    apply_rope,
    learned_rope_frequencies,
    rope_options,
    rope_tables,
)
from posenc.keras import LearnedRotaryEmbedding, RotaryEmbedding  # noqa: E402

# Keras' torch backend converts tensors with np.array(tensor), which warns under NumPy 2.
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

RNG = np.random.default_rng(38)
YARN = {"factor": 4.0, "original_max_position_embeddings": 16}
# (batch, heads, seq, head_dim) queries and grouped keys: 8 query heads, 2 key heads of 64
Q = RNG.standard_normal((2, 8, 12, 64)).astype(np.float32)
K = RNG.standard_normal((2, 2, 12, 64)).astype(np.float32)


def to_numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


def bshd(x):
    return np.ascontiguousarray(np.asarray(x).transpose(0, 2, 1, 3))


def reference(x, inv_freq, where, *, layout="half", factor=1.0):
    """``(b, h, s, d)`` ``x`` rotated by ``inv_freq`` at ``where`` (``(seq,)`` or ``(batch,
    seq)``) in float64 by the core, rounded once to float32."""
    cos, sin = rope_tables(
        where, np.asarray(inv_freq), dtype="float64", layout=layout, scale=factor
    )
    if cos.ndim == 3:  # batched positions: (batch, 1, seq, r)
        cos, sin = cos[:, None], sin[:, None]
    return apply_rope(x.astype(np.float64), cos, sin, layout=layout).astype(np.float32)


def close(got, expected):
    """Compiled code (XLA on JAX) may fuse a product and a sum: the last bit may differ."""
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def trained(layer, seed=0):
    """Give the layer frequencies as after training (its start, perturbed); returns them."""
    values = to_numpy(layer.inv_freq)
    values = values * (1 + 0.2 * np.random.default_rng(seed).standard_normal(values.shape))
    layer.inv_freq.assign(values.astype(np.float32))
    return values.astype(np.float32)


@pytest.mark.backend_independent  # values: the conformance suite's rope_learned cases
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_starts_as_the_fixed_rope(layout):
    layer = LearnedRotaryEmbedding(
        64, qk_layout="bhsd", layout=layout, scaling="yarn", scaling_params=YARN
    )
    q_rot, k_rot = layer(Q, K, start_index=3000)
    scaling, _, _ = rope_options("yarn", YARN)
    start, factor = learned_rope_frequencies(scaling, 64, 10000.0, owner="test")
    assert [w.name for w in layer.trainable_weights] == ["inv_freq"]
    np.testing.assert_array_equal(to_numpy(layer.inv_freq), start)  # float32 of the core's
    assert layer.attention_factor == factor
    # The fixed RoPE's tables are of the float64 frequencies: near position 0 the same.
    fixed = RotaryEmbedding(layout=layout, scaling="yarn", scaling_params=YARN, sequence_axis=2)
    np.testing.assert_allclose(to_numpy(layer(Q, K)[0]), to_numpy(fixed(Q)), rtol=0, atol=1e-5)
    for got, x in ((q_rot, Q), (k_rot, K)):
        np.testing.assert_allclose(
            to_numpy(got), reference(x, start, np.arange(3000, 3012), layout=layout, factor=factor),
            rtol=0, atol=2e-6,
        )  # fmt: skip


# positions= on every backend once; the other layouts' values: the conformance suite's
# rope_learned cases (interleaved bhsd, half bshd)
_ONE_BACKEND = pytest.mark.backend_independent


@pytest.mark.parametrize(
    ("layout", "qk_layout"),
    [
        ("half", "bshd"),
        pytest.param("half", "bhsd", marks=_ONE_BACKEND),
        pytest.param("interleaved", "bhsd", marks=_ONE_BACKEND),
        pytest.param("interleaved", "bshd", marks=_ONE_BACKEND),
    ],
)
def test_rotates_by_its_trained_frequencies_at_positions(layout, qk_layout):
    layer = LearnedRotaryEmbedding(64, rotary_dim=48, layout=layout, qk_layout=qk_layout)
    layer.build()
    inv_freq = trained(layer)
    batched = np.stack([np.arange(12) + 7, RNG.permutation(12) + 2**20])  # (batch, seq)
    for kind, where in (("run", np.arange(500, 512)), ("batched", batched)):
        q, k = (Q, K) if qk_layout == "bhsd" else (bshd(Q), bshd(K))
        if kind == "run":
            q_rot, k_rot = layer(q, k, start_index=500)
        else:
            q_rot, k_rot = layer(q, k, positions=where)
        q_rot, k_rot = to_numpy(q_rot), to_numpy(k_rot)
        if qk_layout == "bshd":
            q_rot, k_rot = bshd(q_rot), bshd(k_rot)
        for got, x in ((q_rot, Q), (k_rot, K)):
            np.testing.assert_allclose(
                got, reference(x, inv_freq, where, layout=layout), rtol=0, atol=2e-6
            )
            np.testing.assert_array_equal(got[..., 48:], x[..., 48:])  # partial rotary
    # The same positions given as (seq,), float whole numbers and a list: the same call.
    ran = to_numpy(layer(Q, K, start_index=500)[0] if qk_layout == "bhsd" else
                   layer(bshd(Q), bshd(K), start_index=500)[0])  # fmt: skip
    q, k = (Q, K) if qk_layout == "bhsd" else (bshd(Q), bshd(K))
    for where in (np.arange(500, 512), np.arange(500, 512.0).astype("float32"),
                  list(range(500, 512))):  # fmt: skip
        np.testing.assert_array_equal(to_numpy(layer(q, k, positions=where)[0]), ran)


def test_angles_are_exact_in_float32_arithmetic_at_far_positions():
    """The angle ``p·θ`` in float32 would be ``p·θ·2^-24`` off (about 0.06 at 10^6 with
    θ = 1): the layer's tables are the core's at positions up to 2^24 and beyond."""
    layer = LearnedRotaryEmbedding(64, qk_layout="bhsd")
    layer.build()
    inv_freq = trained(layer, seed=3)
    for start in (10**6, 2**24 - 6, 2**31 - 12):
        where = np.arange(start, start + 12)
        got = to_numpy(layer(Q, K, start_index=start)[0])
        # past 2**24 the lower part of the angle rounds once: about 2**-18 off in the tables
        atol = 2e-6 if start < 2**24 else 2**-18 * 2 * np.abs(Q).max()
        np.testing.assert_allclose(got, reference(Q, inv_freq, where), rtol=0, atol=atol)
    naive = np.cos(np.float32(10**6) * inv_freq.astype(np.float32)).astype(np.float64)
    assert np.abs(naive - np.cos(10**6 * inv_freq.astype(np.float64))).max() > 1e-3


@pytest.mark.backend_independent  # values: the conformance suite's decode cases
def test_decoding_one_token_at_a_time_equals_the_full_call():
    layer = LearnedRotaryEmbedding(64, qk_layout="bhsd", layout="interleaved")
    layer.build()
    trained(layer)
    full_q, full_k = (to_numpy(t) for t in layer(Q, K, start_index=9))
    steps = [layer(Q[:, :, :4], K[:, :, :4], start_index=9)]  # a prompt, then token by token
    steps += [
        layer(Q[:, :, t : t + 1], K[:, :, t : t + 1], start_index=9 + t) for t in range(4, 12)
    ]
    np.testing.assert_array_equal(np.concatenate([to_numpy(q) for q, _ in steps], 2), full_q)
    np.testing.assert_array_equal(np.concatenate([to_numpy(k) for _, k in steps], 2), full_k)


def test_traced_start_and_positions():
    layer = LearnedRotaryEmbedding(64, qk_layout="bhsd")
    layer.build()
    trained(layer)
    eager = to_numpy(layer(Q, K, start_index=77)[0])
    start = ops.convert_to_tensor(np.int32(77))
    close(to_numpy(traced(lambda q, k, s: layer(q, k, start_index=s)[0])(Q, K, start)), eager)
    where = np.arange(77, 89).astype(np.int32)
    where[3] = -1  # traced: a position that is none rotates into NaN, never another angle
    out = to_numpy(
        traced(lambda q, k, p: layer(q, k, positions=p)[0])(Q, K, ops.convert_to_tensor(where))
    )
    assert np.isnan(out[:, :, 3]).all()
    keep = np.arange(12) != 3
    close(out[:, :, keep], eager[:, :, keep])


def test_symbolic_call_in_a_functional_model():
    q_in, k_in = keras.Input((8, None, 64)), keras.Input((2, None, 64))
    layer = LearnedRotaryEmbedding(64, qk_layout="bhsd")
    q_rot, k_rot = layer(q_in, k_in)
    assert tuple(q_rot.shape) == (None, 8, None, 64)
    assert tuple(k_rot.shape) == (None, 2, None, 64)
    model = keras.Model([q_in, k_in], [q_rot, k_rot])
    out = model.predict([Q, K], verbose=0)
    close(out[0], to_numpy(layer(Q, K)[0]))


def tiny_model(layer):
    """Dense → (batch, heads, seq, d) queries and keys → the learned rotation → a score."""
    tokens = keras.Input((12, 8))
    q = keras.layers.Permute((2, 1, 3))(
        keras.layers.Reshape((12, 2, 16))(keras.layers.Dense(32)(tokens))
    )
    k = keras.layers.Permute((2, 1, 3))(
        keras.layers.Reshape((12, 1, 16))(keras.layers.Dense(16)(tokens))
    )
    q_rot, k_rot = layer(q, k)
    joined = keras.layers.Concatenate(axis=1)([q_rot, k_rot])
    return keras.Model(tokens, keras.layers.Dense(2)(keras.layers.Flatten()(joined)))


def test_fit_step_trains_the_frequencies():
    layer = LearnedRotaryEmbedding(
        16, qk_layout="bhsd", scaling="linear", scaling_params={"factor": 2.0}
    )
    model = tiny_model(layer)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = to_numpy(layer.inv_freq).copy()
    history = model.fit(
        RNG.standard_normal((4, 12, 8)).astype(np.float32),
        RNG.standard_normal((4, 2)).astype(np.float32),
        batch_size=4,
        epochs=1,
        verbose=0,
    )
    assert np.isfinite(history.history["loss"][0])
    after = to_numpy(layer.inv_freq)
    assert after.dtype == np.float32
    assert not np.array_equal(after, before)  # the gradients reached the frequencies


def test_config_round_trip_and_keras_file(tmp_path):
    params = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}  # fmt: skip
    layer = LearnedRotaryEmbedding(
        16, base=500000.0, rotary_dim=8, layout="interleaved", scaling="llama3",
        scaling_params=params, qk_layout="bshd",
    )  # fmt: skip
    config = layer.get_config()
    assert {key: config[key] for key in ("head_dim", "base", "rotary_dim", "layout", "scaling",
            "scaling_params", "qk_layout")} == {"head_dim": 16, "base": 500000.0, "rotary_dim": 8,
            "layout": "interleaved", "scaling": "llama3", "scaling_params": params,
            "qk_layout": "bshd"}  # fmt: skip
    q, k = bshd(Q[:, :, :, :16]), bshd(K[:, :, :, :16])
    expected = to_numpy(layer(q, k, start_index=5)[1])
    for clone in (
        LearnedRotaryEmbedding.from_config(config),
        keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer)),
    ):
        assert isinstance(clone, LearnedRotaryEmbedding)
        assert clone.get_config() == config
        np.testing.assert_array_equal(to_numpy(clone(q, k, start_index=5)[1]), expected)
    # A saved model keeps the trained frequencies.
    model = tiny_model(LearnedRotaryEmbedding(16, qk_layout="bhsd", layout="interleaved"))
    rope = next(lay for lay in model.layers if isinstance(lay, LearnedRotaryEmbedding))
    inv_freq = trained(rope)
    x = RNG.standard_normal((3, 12, 8)).astype(np.float32)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    rope = next(lay for lay in loaded.layers if isinstance(lay, LearnedRotaryEmbedding))
    np.testing.assert_array_equal(to_numpy(rope.inv_freq), inv_freq)


@pytest.mark.parametrize(("policy_name", "fmt"), [("mixed_float16", "float16"),
                                                  ("mixed_bfloat16", "bfloat16")])  # fmt: skip
def test_mixed_precision_keeps_float32_frequencies_and_rotates_in_float32(policy, policy_name, fmt):
    policy(policy_name)
    layer = LearnedRotaryEmbedding(64, qk_layout="bhsd")
    q_rot, _ = layer(Q, K, start_index=2000)
    assert keras.backend.standardize_dtype(q_rot.dtype) == fmt
    assert keras.backend.standardize_dtype(layer.inv_freq.dtype) == "float32"
    inv_freq = to_numpy(layer.inv_freq)
    q_low = to_numpy(ops.cast(Q, fmt)).astype(np.float32)  # the input as Keras casts it
    exact = reference(q_low, inv_freq, np.arange(2000, 2012))
    ulp = 2.0**-10 if fmt == "float16" else 2.0**-7  # one rounding of the float32 result
    np.testing.assert_allclose(to_numpy(q_rot).astype(np.float32), exact, rtol=0,
                               atol=ulp * np.abs(exact).max())  # fmt: skip


@pytest.mark.backend_independent  # the conformance suite sets inv_freq by name
def test_frequencies_trained_in_pytorch_load_by_name():
    torch = pytest.importorskip("torch")
    from posenc.torch import LearnedRotaryEmbedding as TorchLearned

    module = TorchLearned(64, layout="interleaved", scaling="yarn", scaling_params=YARN)
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    q, k = torch.from_numpy(Q), torch.from_numpy(K)
    for _ in range(3):  # a few training steps
        loss = sum(t.square().sum() for t in module(q[:, :1], k, offset=4))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    state = module.state_dict()
    layer = LearnedRotaryEmbedding(
        64, qk_layout="bhsd", layout="interleaved", scaling="yarn", scaling_params=YARN
    )
    layer.build()
    weights = {w.name: w for w in layer.weights}
    for name, value in state.items():  # by name
        weights[name].assign(value.numpy())
    expected = [t.detach().numpy() for t in module(q, k, offset=4)]
    got = [to_numpy(t) for t in layer(Q, K, start_index=4)]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=2e-6)
    # And back: the Keras layer's frequencies load into PyTorch's module by name.
    back = TorchLearned(64, layout="interleaved", scaling="yarn", scaling_params=YARN)
    back.load_state_dict({w.name: torch.from_numpy(to_numpy(w)) for w in layer.weights})
    assert torch.equal(back.inv_freq, module.inv_freq)


@pytest.mark.backend_independent  # options: validated by the specs
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"scaling": "dynamic_ntk", "scaling_params": {"factor": 2.0,
          "original_max_position_embeddings": 8}}, ValueError, "none to train"),
        ({"scaling": "longrope", "scaling_params": {"short_factor": [1.0] * 4,
          "long_factor": [2.0] * 4, "original_max_position_embeddings": 8, "factor": 2.0}}, ValueError,
         "none to train"),
        ({"qk_layout": "bsdh"}, ValueError, "qk_layout"),
        ({"layout": "pairs"}, ValueError, "layout"),
        ({"rotary_dim": 7}, ValueError, "rotary_dim"),
        ({"base": 1e-60}, ValueError, "past float32"),
    ],
)  # fmt: skip
def test_bad_options_are_refused_as_in_pytorch(kwargs, error, match):
    with pytest.raises(error, match=match):
        LearnedRotaryEmbedding(8, **kwargs)
    torch_rope = pytest.importorskip("posenc.torch")
    with pytest.raises(error, match=match):
        torch_rope.LearnedRotaryEmbedding(8, **kwargs)


def test_bad_calls():
    layer = LearnedRotaryEmbedding(64, qk_layout="bhsd")
    cases = [
        ((Q[0], K[0]), {}, ValueError, "must have shape \\(batch, heads, seq, head_dim\\)"),
        ((Q[..., :32], K), {}, ValueError, "head_dim=64"),
        ((Q, K[:, :, :5]), {}, ValueError, "same batch and seq"),
        ((Q, K), {"start_index": -1}, ValueError, "start_index"),
        ((Q, K), {"start_index": 2**31 - 5}, ValueError, "2\\*\\*31"),
        ((Q, K), {"start_index": 1.5}, TypeError, "start_index"),
        ((Q, K), {"start_index": 2, "positions": np.arange(12)}, ValueError, "not both"),
        ((Q, K), {"positions": np.arange(5)}, ValueError, "seq=12"),
        ((Q, K), {"positions": np.arange(12) - 1}, ValueError, ">= 0"),
        ((Q, K), {"positions": np.arange(12) + 0.5}, ValueError, "whole numbers"),
        ((Q.astype(np.int32), K), {}, TypeError, "floating"),
    ]
    for args, kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            layer(*args, **kwargs)
