"""Every Keras layer made from a spec keeps its options in ``spec`` only: no field is
copied onto the layer (``num_heads`` of the score biases is a read-only property over the
spec; ``inv_freq`` and ``attention_factor`` of ``RotaryEmbedding`` are derived, as in
PyTorch), and ``get_config`` writes the keys and values it wrote when the fields were
copies, before and after build, so saved configs and ``.keras`` files load as before.
Backend independent: attributes and configs are Python values."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")

import posenc.keras as pk  # noqa: E402


def _scores(layer):
    return layer(np.zeros((1, 8, 4, 4), "float32"))


# (build with options off their defaults, a call that builds it, get_config as on main
# without the base layer's keys)
LAYERS = {
    "alibi": (
        lambda: pk.ALiBiBias(8, mode="symmetric", max_length=16),
        _scores,
        {"num_heads": 8, "mode": "symmetric", "max_length": 16},
    ),
    "t5": (
        lambda: pk.T5RelativeBias(
            8, bidirectional=False, num_buckets=16, max_distance=64, compat="exact"
        ),
        _scores,
        {
            "num_heads": 8,
            "bidirectional": False,
            "num_buckets": 16,
            "max_distance": 64,
            "compat": "exact",
        },
    ),
    "kerple": (
        lambda: pk.KERPLEBias(8, kernel="power", eps=0.02),
        _scores,
        {"num_heads": 8, "kernel": "power", "eps": 0.02},
    ),
    "fire": (
        lambda: pk.FIREBias(8, mlp_width=16, init_c=0.2, init_L=64.0, eps=1e-5),
        _scores,
        {"num_heads": 8, "mlp_width": 16, "init_c": 0.2, "init_L": 64.0, "eps": 1e-5},
    ),
    "sandwich": (
        lambda: pk.SandwichBias(8, dim=64, base=100.0, mode="symmetric", max_length=16),
        _scores,
        {"num_heads": 8, "dim": 64, "base": 100.0, "mode": "symmetric", "max_length": 16},
    ),
    "sinusoidal": (
        lambda: pk.SinusoidalPositionalEncoding(
            max_length=32, base=100.0, layout="split", formula="tensor2tensor"
        ),
        lambda layer: layer(np.zeros((1, 4, 16), "float32")),
        {
            "max_length": 32,
            "base": 100.0,
            "layout": "split",
            "formula": "tensor2tensor",
            "dropout": 0.0,
            "d_model": None,
        },
    ),
    "nd": (
        lambda: pk.SinusoidalPositionalEncodingND(layout="mae", base=100.0),
        lambda layer: layer(np.zeros((1, 4, 4, 8), "float32")),
        {"layout": "mae", "base": 100.0, "dropout": 0.0},
    ),
    "rope": (
        lambda: pk.RotaryEmbedding(
            base=500.0,
            rotary_dim=32,
            layout="interleaved",
            scaling="linear",
            scaling_params={"factor": 2.0},
            max_length=16,
        ),
        lambda layer: layer(np.zeros((1, 4, 2, 64), "float32")),
        {
            "base": 500.0,
            "rotary_dim": 32,
            "layout": "interleaved",
            "scaling": "linear",
            "scaling_params": {"factor": 2.0},
            "max_length": 16,
            "sequence_axis": 1,
            "feature_axis": -1,
            "head_dim": None,
        },
    ),
}


def _own(config):
    return {k: v for k, v in config.items() if k not in ("name", "trainable", "dtype")}


@pytest.mark.backend_independent
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_the_layer_reads_its_options_from_its_spec(kind):
    make, build, config = LAYERS[kind]
    layer = make()
    if kind == "t5":  # the initializer's config, as Keras writes it
        config = {**config, "embeddings_initializer": layer.get_config()["embeddings_initializer"]}
    assert _own(layer.get_config()) == config  # before build (a width from the input)
    build(layer)
    assert _own(layer.get_config()) == config
    for name, value in layer.spec.fields().items():
        if name == "num_heads":  # the score biases': read only, the spec's
            assert layer.num_heads == value
            assert type(layer).num_heads.fset is None  # a property (not in the instance)
            assert "num_heads" not in vars(layer)
        else:
            assert not hasattr(layer, name), f"{kind}: {name} is copied from the spec"
    again = type(layer).from_config(layer.get_config())
    build(again)
    assert again.spec == layer.spec


def test_rope_derived_values_are_the_specs():
    layer = pk.RotaryEmbedding(scaling="linear", scaling_params={"factor": 2.0})
    assert (layer.spec, layer.inv_freq, layer.attention_factor) == (None, None, None)
    layer(np.zeros((1, 3, 2, 8), "float32"))
    inv_freq, factor = layer.spec.frequencies()
    np.testing.assert_array_equal(layer.inv_freq, inv_freq)
    assert layer.attention_factor == factor
