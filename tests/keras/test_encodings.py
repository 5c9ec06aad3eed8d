"""The Keras 3 front end, on the TensorFlow backend.

Expected values come from the NumPy core (``posenc.sinusoidal``, itself tested against
closed forms and mpmath) and from the seed text 001's own TensorFlow function.
"""

from __future__ import annotations

import doctest
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import posenc  # noqa: E402
import posenc.keras.encodings  # noqa: E402
from posenc.keras import SinusoidalPositionalEncoding, generate_positional_encoding  # noqa: E402
from seed_oracles import generate_positional_encoding_numpy  # noqa: E402

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="these tests run on the TensorFlow backend"
)


def as_f32(tensor) -> np.ndarray:
    """A backend tensor of any float dtype as float32 NumPy (exact for f16/bf16/f32)."""
    return keras.ops.convert_to_numpy(keras.ops.cast(tensor, "float32"))


RNG = np.random.default_rng(1234)


# --- seed 001: generate_positional_encoding -------------------------------------------


def test_seed_001_function():
    pe = generate_positional_encoding(60, 256)
    assert isinstance(pe, tf.Tensor)
    assert pe.dtype == tf.float32
    assert tuple(pe.shape) == (1, 60, 256)
    np.testing.assert_array_equal(pe.numpy()[0], posenc.sinusoidal(60, 256))
    oracle = generate_positional_encoding_numpy(60, 256)
    np.testing.assert_allclose(pe.numpy(), oracle, rtol=0, atol=1e-6)


# Seed 001's "Example usage", exactly as the text writes it.
SEED_001_EXAMPLE = """\
sequence_length = 60 # Number of tokens in the sequence
embedding_size = 256 # Dimensionality of each token embedding
position_encodings = generate_positional_encoding(sequence_length, embedding_size)
print("Shape of Positional Encoding:", position_encodings.shape)
"""


def test_seed_001_example_runs_as_written(capsys):
    namespace = {"generate_positional_encoding": generate_positional_encoding}
    exec(SEED_001_EXAMPLE, namespace)
    assert capsys.readouterr().out == "Shape of Positional Encoding: (1, 60, 256)\n"
    encodings = namespace["position_encodings"]
    assert isinstance(encodings, tf.Tensor)
    assert encodings.dtype == tf.float32
    # The layer adds exactly that tensor to a (1, 60, 256) float32 batch.
    layer = SinusoidalPositionalEncoding(max_length=60)
    x = tf.random.stateless_normal((1, 60, 256), seed=(1, 2))
    np.testing.assert_array_equal(layer(x).numpy(), (x + encodings).numpy())
    np.testing.assert_allclose(
        encodings.numpy(), generate_positional_encoding_numpy(60, 256), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize(("length", "width"), [(7, 5), (1, 1), (33, 10)])
def test_seed_001_function_other_shapes(length, width):
    pe = generate_positional_encoding(length, width).numpy()
    oracle = generate_positional_encoding_numpy(length, width)
    assert pe.shape == (1, length, width)
    np.testing.assert_allclose(pe, oracle, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", tf.float64, np.float16])
def test_generate_positional_encoding_dtypes(dtype):
    pe = generate_positional_encoding(50, 12, base=100.0, dtype=dtype)
    name = keras.backend.standardize_dtype(dtype)
    assert keras.backend.standardize_dtype(pe.dtype) == name
    expected = posenc.sinusoidal(50, 12, base=100.0, dtype=name).astype(np.float64)
    values = keras.ops.convert_to_numpy(keras.ops.cast(pe, "float64"))  # exact widening
    np.testing.assert_array_equal(values[0], expected)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"seq_length": -1, "embed_dim": 8}, ValueError, "seq_length.*-1"),
        ({"seq_length": 4.0, "embed_dim": 8}, TypeError, "seq_length.*4.0"),
        ({"seq_length": 4, "embed_dim": 0}, ValueError, "embed_dim.*0"),
        ({"seq_length": 4, "embed_dim": 8, "base": 1}, ValueError, "base must not be 1"),
        ({"seq_length": 4, "embed_dim": 8, "base": -2.0}, ValueError, "base.*-2.0"),
        ({"seq_length": 4, "embed_dim": 8, "dtype": "int32"}, TypeError, "dtype.*int32"),
    ],
)
def test_generate_positional_encoding_bad_args(kwargs, error, match):
    with pytest.raises(error, match=match):
        generate_positional_encoding(**kwargs)


# --- eager values ------------------------------------------------------------------------


def test_layer_on_zeros_is_the_table():
    layer = SinusoidalPositionalEncoding(max_length=100)
    out = layer(np.zeros((2, 37, 24), "float32"))
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    table = posenc.sinusoidal(100, 24)
    np.testing.assert_array_equal(out.numpy(), np.broadcast_to(table[:37], (2, 37, 24)))
    assert layer.spec.d_model == 24


def test_layer_adds_the_table():
    x = RNG.standard_normal((3, 20, 16)).astype(np.float32)
    out = SinusoidalPositionalEncoding(max_length=64)(x)
    np.testing.assert_array_equal(out.numpy(), x + posenc.sinusoidal(20, 16))


@pytest.mark.parametrize(
    ("options", "dtype"),
    [
        ({"layout": "split", "formula": "tensor2tensor", "base": 100.0}, "float32"),
        ({"layout": "interleaved", "formula": "paper", "base": 500.0}, "float64"),
    ],
)
def test_layer_options_and_float64(options, dtype):
    layer = SinusoidalPositionalEncoding(max_length=40, dtype=dtype, **options)
    out = layer(np.zeros((1, 40, 11), dtype))
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    np.testing.assert_array_equal(out.numpy()[0], posenc.sinusoidal(40, 11, dtype=dtype, **options))


def test_start_index_one_token_at_a_time():
    x = RNG.standard_normal((2, 12, 8)).astype(np.float32)
    layer = SinusoidalPositionalEncoding(max_length=12)
    full = layer(x).numpy()
    for t in range(12):
        step = layer(x[:, t : t + 1], start_index=t).numpy()
        np.testing.assert_array_equal(step[:, 0], full[:, t])
        as_tensor = layer(x[:, t : t + 1], start_index=tf.constant(t, tf.int64)).numpy()
        np.testing.assert_array_equal(as_tensor, step)


def test_start_index_tensor_in_tf_function_with_unknown_length():
    layer = SinusoidalPositionalEncoding(max_length=32)
    x = RNG.standard_normal((2, 20, 8)).astype(np.float32)
    full = layer(x).numpy()

    @tf.function(
        input_signature=[tf.TensorSpec((None, None, 8)), tf.TensorSpec((), tf.int32)],
    )
    def encode(chunk, start):
        return layer(chunk, start_index=start)

    for start, length in [(0, 20), (5, 3), (19, 1)]:
        out = encode(x[:, start : start + length], tf.constant(start))
        np.testing.assert_array_equal(out.numpy(), full[:, start : start + length])
    # 30 + 5 > 32, known only when the graph runs: rows 32, 33, 34 are NaN, never wrong.
    past = encode(np.zeros((1, 5, 8), "float32"), tf.constant(30)).numpy()[0]
    np.testing.assert_array_equal(past[:2], posenc.sinusoidal(32, 8)[30:32])
    assert np.all(np.isnan(past[2:]))


def test_layer_first_built_inside_tf_function():
    layer = SinusoidalPositionalEncoding(max_length=16)
    encode = tf.function(lambda x: layer(x))
    x = np.zeros((1, 4, 6), "float32")
    np.testing.assert_array_equal(encode(x).numpy()[0], posenc.sinusoidal(4, 6))
    # The table kept on the layer is eager, so a fresh trace and eager calls still work.
    np.testing.assert_array_equal(layer(x).numpy()[0], posenc.sinusoidal(4, 6))
    np.testing.assert_array_equal(tf.function(layer)(x).numpy()[0], posenc.sinusoidal(4, 6))


def test_symbolic_start_index_in_functional_model():
    tokens = keras.Input(shape=(None, 8))
    start = keras.Input(batch_shape=(), dtype="int32")
    model = keras.Model(
        [tokens, start], SinusoidalPositionalEncoding(64)(tokens, start_index=start)
    )
    x = np.zeros((1, 3, 8), "float32")
    out = model([tf.constant(x), tf.constant(5)])
    np.testing.assert_array_equal(out.numpy()[0], posenc.sinusoidal(64, 8)[5:8])


# --- symbolic use, training, serialization -----------------------------------------------


def test_symbolic_call_and_fit_step():
    inputs = keras.Input(shape=(None, 8))
    encoded = SinusoidalPositionalEncoding(max_length=50, dropout=0.1)(inputs)
    assert tuple(encoded.shape) == (None, None, 8)
    model = keras.Model(inputs, keras.layers.Dense(3)(encoded))
    assert tuple(model.output.shape) == (None, None, 3)
    model.compile(optimizer="adam", loss="mse")
    history = model.fit(
        RNG.standard_normal((4, 10, 8)).astype(np.float32),
        RNG.standard_normal((4, 10, 3)).astype(np.float32),
        batch_size=2,
        epochs=1,
        verbose=0,
    )
    assert np.isfinite(history.history["loss"][0])


def test_dropout_only_in_training():
    layer = SinusoidalPositionalEncoding(max_length=10, dropout=0.5)
    x = np.ones((4, 10, 32), "float32")
    expected = x + posenc.sinusoidal(10, 32)
    np.testing.assert_array_equal(layer(x).numpy(), expected)
    np.testing.assert_array_equal(layer(x, training=False).numpy(), expected)
    dropped = layer(x, training=True).numpy()
    zeros = dropped == 0
    assert 0.3 < zeros.mean() < 0.7
    np.testing.assert_allclose(dropped[~zeros], 2 * expected[~zeros], rtol=1e-6)
    assert layer.weights == []


def test_no_weights():
    layer = SinusoidalPositionalEncoding(max_length=20)
    layer(np.zeros((1, 5, 4), "float32"))
    assert layer.weights == []
    assert layer.get_weights() == []


def test_config_round_trip():
    layer = SinusoidalPositionalEncoding(
        max_length=77, base=500.0, layout="split", formula="tensor2tensor", dropout=0.25
    )
    config = layer.get_config()
    for key, value in {
        "max_length": 77,
        "base": 500.0,
        "layout": "split",
        "formula": "tensor2tensor",
        "dropout": 0.25,
    }.items():
        assert config[key] == value
    x = RNG.standard_normal((2, 9, 6)).astype(np.float32)
    for clone in (
        SinusoidalPositionalEncoding.from_config(config),
        keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer)),
    ):
        assert isinstance(clone, SinusoidalPositionalEncoding)
        assert clone.get_config() == config
        np.testing.assert_array_equal(clone(x).numpy(), layer(x).numpy())


# Keras' own variable -> NumPy conversion warns under NumPy 2 when saving any weights.
@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")
def test_keras_file_round_trip(tmp_path):
    inputs = keras.Input(shape=(None, 16))
    encoded = SinusoidalPositionalEncoding(max_length=40, base=100.0)(inputs)
    model = keras.Model(inputs, keras.layers.Dense(5)(encoded))
    x = RNG.standard_normal((3, 12, 16)).astype(np.float32)
    expected = model.predict(x, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), expected)
    layer = next(lay for lay in loaded.layers if isinstance(lay, SinusoidalPositionalEncoding))
    assert layer.get_config()["base"] == 100.0
    assert layer.weights == []
    # Only the Dense kernel and bias are saved.
    assert len(loaded.weights) == 2


# --- mixed precision -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy_name", "fmt"), [("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")]
)
def test_mixed_precision_table_is_correctly_rounded(policy, policy_name, fmt):
    policy(policy_name)
    length, width = 2048, 64
    layer = SinusoidalPositionalEncoding(max_length=length)
    assert layer.compute_dtype == fmt
    out = layer(np.zeros((2, length, width), "float32"))
    assert keras.backend.standardize_dtype(out.dtype) == fmt
    expected = posenc.sinusoidal(length, width, dtype=fmt).astype(np.float32)
    np.testing.assert_array_equal(as_f32(out)[0], expected)
    np.testing.assert_array_equal(as_f32(out)[1], expected)


def test_mixed_bfloat16_avoids_low_precision_angles(policy):
    """The trap: angles formed in bfloat16 put whole positions in the wrong place."""
    policy("mixed_bfloat16")
    length, width = 2048, 64
    out = as_f32(SinusoidalPositionalEncoding(max_length=length)(np.zeros((1, length, width))))
    exact = posenc.sinusoidal(length, width, dtype="float64")
    # Ours: within half a bfloat16 ulp (2**-9 for |v| < 1) of the exact encoding.
    assert np.abs(out[0] - exact).max() <= 2.0**-9
    # Naive: positions and frequencies in bfloat16, multiplied and sin/cos'd in bfloat16.
    ops = keras.ops
    positions = ops.cast(ops.arange(length)[:, None], "bfloat16")
    frequencies = ops.cast(posenc.frequencies(width)[None, :], "bfloat16")
    angles = positions * frequencies
    naive = np.empty((length, width), np.float32)
    naive[:, 0::2] = as_f32(ops.sin(angles))
    naive[:, 1::2] = as_f32(ops.cos(angles))
    assert np.abs(naive - exact).max() > 0.5  # whole sinusoids off at large positions


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_length": 0}, ValueError, "max_length.*0"),
        ({"max_length": 10.5}, TypeError, "max_length.*10.5"),
        ({"base": 0.0}, ValueError, "base.*0.0"),
        ({"base": "big"}, TypeError, "base.*big"),
        ({"layout": "halves"}, ValueError, "layout.*halves"),
        ({"formula": "fairseq"}, ValueError, "formula.*fairseq"),
        ({"dropout": 1.0}, ValueError, "dropout.*1.0"),
        ({"dropout": -0.1}, ValueError, r"dropout.*-0\.1"),
        ({"d_model": 0}, ValueError, "d_model must be an int >= 1, got 0"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        SinusoidalPositionalEncoding(**kwargs)


def test_bad_inputs():
    layer = SinusoidalPositionalEncoding(max_length=10)
    with pytest.raises(ValueError, match=r"rank >= 3.*\(8,\)"):
        layer(np.zeros((8,), "float32"))
    with pytest.raises(ValueError, match=r"rank >= 3.*\(5, 8\)"):
        layer(np.zeros((5, 8), "float32"))
    with pytest.raises(TypeError, match="int32"):
        layer(np.zeros((1, 5, 8), "int32"))
    layer(np.zeros((1, 5, 8), "float32"))  # builds with d_model=8
    with pytest.raises(ValueError, match=r"last axis of the input is 6.*d_model=8"):
        layer(np.zeros((1, 5, 6), "float32"))
    # Past max_length, positions known when the call runs get the exact rows (posenc's
    # one out-of-range policy, posenc.core.positions): the table grows.
    np.testing.assert_array_equal(
        layer(np.zeros((1, 11, 8), "float32")).numpy()[0], posenc.sinusoidal(11, 8)
    )
    np.testing.assert_array_equal(
        layer(np.zeros((1, 4, 8), "float32"), start_index=7).numpy()[0],
        posenc.sinusoidal(np.arange(7, 11), 8),
    )
    assert layer.table_length >= 11
    # A table to position 2**31 - 8 would take 4 TiB: refused by the memory limit, so the
    # call's rows come from the core directly and the table stays as it was.
    wide = SinusoidalPositionalEncoding(max_length=16)
    far = 2**31 - 10
    np.testing.assert_array_equal(
        wide(np.zeros((1, 2, 512), "float32"), start_index=far).numpy()[0],
        posenc.sinusoidal(np.arange(far, far + 2), 512),
    )
    assert wide.table_length == 16
    with pytest.raises(ValueError, match=r"start_index.*-1"):
        layer(np.zeros((1, 4, 8), "float32"), start_index=-1)
    with pytest.raises(TypeError, match=r"start_index.*float32"):
        layer(np.zeros((1, 4, 8), "float32"), start_index=tf.constant(1.0))
    with pytest.raises(ValueError, match=r"start_index must be a scalar.*\(2,\)"):
        layer(np.zeros((1, 4, 8), "float32"), start_index=tf.constant([1, 2]))
    with pytest.raises(ValueError, match=r"last .*axis"):
        SinusoidalPositionalEncoding().build((None, None, None))


# --- docs ------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [posenc.keras, posenc.keras.encodings])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, extraglobs={"keras": keras}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


def test_import_posenc_imports_no_framework():
    import subprocess
    import sys

    code = (
        "import sys, posenc; posenc.sinusoidal(4, 4); "
        "bad = [m for m in ('keras', 'tensorflow', 'torch', 'jax') if m in sys.modules]; "
        "sys.exit(bool(bad))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_threads_growing_one_layers_tables_leave_the_longest():
    """Two threads grow one layer's tables at once, the shorter growth slower: the
    tables end at the longer length with the core's rows."""
    import threading

    from posenc.keras._tables import shared_tables

    inside, go = threading.Event(), threading.Event()

    def derive(length, fmt):
        if length == 240:
            inside.set()
            go.wait(timeout=5)
        return (posenc.sinusoidal(length, 4, dtype=fmt),)

    tables = shared_tables(None, derive, 16)  # a layer's own tables
    tables.get("float32")
    shorter = threading.Thread(target=tables.extend, args=(240,))
    shorter.start()
    assert inside.wait(timeout=5)
    longer = threading.Thread(target=tables.extend, args=(300,))
    longer.start()
    threading.Timer(0.2, go.set).start()
    shorter.join(timeout=10)
    longer.join(timeout=10)
    assert tables.length == 300
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(tables.get("float32")[0]),
        posenc.sinusoidal(300, 4, dtype="float32"),
    )
