"""A RoPE scaling registered once in the core reaches every front end, the CLI and the plots.

The scaling (``custom_scaling.BandScaling``) is defined in a test file, not in posenc;
each test registers it, uses it by name (or as a spec, or its dict form) and compares
with the core's numbers computed from the spec, and with the formula written out here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import custom_scaling as band
import posenc
from custom_scaling import HEAD_DIM, NAME, PARAMS, START, X
from posenc.cli import main

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def registered():
    band.register()
    yield
    band.unregister()


def _require(*packages: str) -> None:
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if not missing:
        return
    message = f"{', '.join(missing)} not installed"
    if os.environ.get("POSENC_REQUIRE_ALL_FRONTENDS"):
        pytest.fail(f"{message}, but POSENC_REQUIRE_ALL_FRONTENDS is set")
    pytest.skip(message)


# --- the core -----------------------------------------------------------------------


def test_the_core_knows_it_by_name_as_a_spec_and_as_a_dict():
    expected, attention = band.expected_frequencies()
    inv_freq, factor = posenc.rope_scaling(NAME, HEAD_DIM, **PARAMS)
    np.testing.assert_allclose(inv_freq, expected, rtol=1e-15)
    assert factor == pytest.approx(attention, rel=1e-15)
    assert NAME in posenc.ROPE_SCALING_SPECS
    assert NAME in posenc.ROPE_SCALINGS
    function = posenc.ROPE_SCALINGS[NAME]
    np.testing.assert_array_equal(function(HEAD_DIM, **PARAMS)[0], inv_freq)
    spec = posenc.RopeSpec(head_dim=HEAD_DIM, scaling={"rope_type": NAME, **PARAMS})
    assert spec.scaling == band.BandScaling(**PARAMS)
    assert posenc.SchemeSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    np.testing.assert_array_equal(spec.frequencies()[0], inv_freq)
    with pytest.raises(TypeError, match=r"RoPE scaling 'band': missing \['factor'\]"):
        posenc.rope_scaling(NAME, HEAD_DIM, original_max_position_embeddings=64)


def test_unregistering_removes_it_everywhere_and_built_ins_stay():
    band.unregister()
    try:
        with pytest.raises(ValueError, match="unknown RoPE scaling 'band'"):
            posenc.rope_scaling(NAME, HEAD_DIM, **PARAMS)
        assert NAME not in posenc.ROPE_SCALINGS
        with pytest.raises(ValueError, match="built-in"):
            posenc.unregister_rope_scaling("yarn")
        with pytest.raises(ValueError, match="already registered"):
            posenc.register_rope_scaling("yarn", band.BandScaling)
        with pytest.raises(TypeError, match="subclass of posenc.RopeScaling"):
            posenc.register_rope_scaling("other", dict)
    finally:
        band.register()


# --- the front ends -------------------------------------------------------------------


def test_pytorch():
    _require("torch")
    import torch

    from posenc.torch import RotaryEmbedding

    module = RotaryEmbedding(HEAD_DIM, scaling=NAME, scaling_params=PARAMS, qk_layout="bshd")
    x = torch.from_numpy(X)
    q, _ = module(x, x, offset=START)
    np.testing.assert_allclose(q.numpy(), band.reference(), rtol=0, atol=2e-6)
    assert module.spec.scaling.name == NAME
    assert module.spec.scaling.params() == PARAMS


def test_pytorch_length_dependent():
    # A registered method that depends on the length follows each call's length
    # L = offset + seq (or max(positions) + 1), as dynamic_ntk does, with no state.
    _require("torch")
    import torch

    from posenc.torch import RotaryEmbedding

    module = RotaryEmbedding(
        HEAD_DIM, scaling=band.STRETCH, scaling_params=band.STRETCH_PARAMS, qk_layout="bshd"
    )
    x = torch.from_numpy(X)  # 6 positions
    # Past L₀ = 8; growing; shorter but past L₀ (its own length 10); back under L₀.
    for offset, length in [(0, 8), (3, 9), (10, 16), (4, 10), (0, 8)]:
        q, _ = module(x, x, offset=offset)
        expected = band.stretched_rotation(X, np.arange(offset, offset + 6), length)
        np.testing.assert_allclose(q.numpy(), expected, rtol=0, atol=4e-6)
    assert module.attention_factor == 1.25
    positions = torch.tensor([0, 1, 2, 3, 4, 11])  # L = 12
    q, _ = module(x, x, positions=positions)
    expected = band.stretched_rotation(X, positions.numpy(), 12)
    np.testing.assert_allclose(q.numpy(), expected, rtol=0, atol=4e-6)


def test_keras_length_dependent():
    _require("keras")
    import keras

    from posenc.keras import RotaryEmbedding

    layer = RotaryEmbedding(scaling=band.STRETCH, scaling_params=band.STRETCH_PARAMS, max_length=16)
    # Each call's own length L = start + 6, as in the PyTorch module.
    for start, length in [(0, 8), (3, 9), (10, 16), (4, 10), (0, 8)]:
        got = keras.ops.convert_to_numpy(layer(X, start_index=start))
        expected = band.stretched_rotation(X, np.arange(start, start + 6), length)
        np.testing.assert_allclose(got, expected, rtol=0, atol=4e-6)
    positions = np.array([0, 1, 2, 3, 4, 11])  # L = 12
    got = keras.ops.convert_to_numpy(layer(X, positions=positions))
    np.testing.assert_allclose(got, band.stretched_rotation(X, positions, 12), rtol=0, atol=4e-6)
    tokens = keras.Input(shape=(6, 2, HEAD_DIM))
    with pytest.raises(ValueError, match=r"scaling='stretch'.*known only inside a trace"):
        layer(tokens, start_index=keras.Input(batch_shape=(), dtype="int32"))


def test_a_scaling_with_its_own_length_rule_is_followed_by_torch_and_keras():
    # Like LongRoPE: one fixed length (32) whenever a call passes L₀ = 8.
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Stepped(band.StretchScaling):
        name = "stepped"

        def scaled_length(self, length):
            original = self.original_max_position_embeddings
            return 32 if length > original else original

    posenc.register_rope_scaling("stepped", Stepped)
    try:
        expected = band.stretched_rotation(X, np.arange(3, 9), 32)  # L = 9 uses 32
        rotated = []
        if importlib.util.find_spec("torch"):
            import torch

            from posenc.torch import RotaryEmbedding

            module = RotaryEmbedding(
                HEAD_DIM, scaling="stepped", scaling_params=band.STRETCH_PARAMS, qk_layout="bshd"
            )
            rotated.append(module(torch.from_numpy(X), torch.from_numpy(X), offset=3)[0].numpy())
        if importlib.util.find_spec("keras"):
            import keras

            from posenc.keras import RotaryEmbedding as KerasRotary

            layer = KerasRotary(scaling="stepped", scaling_params=band.STRETCH_PARAMS)
            rotated.append(keras.ops.convert_to_numpy(layer(X, start_index=3)))
        if not rotated:
            _require("torch", "keras")
        for got in rotated:
            np.testing.assert_allclose(got, expected, rtol=0, atol=4e-6)
    finally:
        posenc.unregister_rope_scaling("stepped")


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_keras_on_every_backend(backend):
    _require("keras", backend)
    in_process = os.environ.get("KERAS_BACKEND", "tensorflow")
    if backend == in_process:
        got = band.keras_rotation()
    else:  # Keras fixes its backend at import: the other backends run in a subprocess
        out = HERE / f".band-{backend}-{os.getpid()}.npy"
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
        try:
            done = subprocess.run(
                [sys.executable, str(HERE / "custom_scaling.py"), "--keras", str(out)],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, done.stderr[-3000:]
            got = np.load(out)
        finally:
            out.unlink(missing_ok=True)
    np.testing.assert_allclose(got, band.reference(), rtol=0, atol=2e-6)


def test_jax_functions_eager_and_jitted():
    _require("jax")
    import jax
    import jax.numpy as jnp

    import posenc.jax as pj

    inv_freq, attention = posenc.rope_scaling(NAME, HEAD_DIM, **PARAMS)
    positions = np.arange(START, START + X.shape[1])
    expected = posenc.rope_tables(positions, inv_freq, dtype="float32", scale=attention)
    eager = pj.rope_tables(positions, HEAD_DIM, scaling=NAME, scaling_params=PARAMS)
    jitted = jax.jit(
        lambda p: pj.rope_tables(p, HEAD_DIM, scaling=NAME, scaling_params=PARAMS, max_length=32)
    )(jnp.asarray(positions))
    for got in (eager, jitted):
        np.testing.assert_array_equal(np.asarray(got[0]), expected[0])
        np.testing.assert_array_equal(np.asarray(got[1]), expected[1])
    cos, sin = eager
    rotated = pj.apply_rope(jnp.asarray(X), cos[:, None, :], sin[:, None, :])
    np.testing.assert_allclose(np.asarray(rotated), band.reference(), rtol=0, atol=2e-6)


def test_flax():
    _require("jax", "flax")
    import jax
    import jax.numpy as jnp

    from posenc.jax import linen

    module = linen.RotaryEmbedding(scaling=NAME, scaling_params=PARAMS, max_length=16)
    x = jnp.asarray(X)
    variables = module.init(jax.random.PRNGKey(0), x)
    got = module.apply(variables, x, start_index=START)
    np.testing.assert_allclose(np.asarray(got), band.reference(), rtol=0, atol=2e-6)


# --- the tools ------------------------------------------------------------------------


def test_cli_table(capsys):
    argv = ["table", "--scheme", "rope", "--head-dim", str(HEAD_DIM), "--scaling", NAME]
    argv += ["--factor", "4", "--original-max-position-embeddings", "64", "--format", "json"]
    argv += ["-L", "5", "--start", str(START), "--dtype", "float32"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    inv_freq, attention = posenc.rope_scaling(NAME, HEAD_DIM, **PARAMS)
    cos, sin = posenc.rope_tables(np.arange(START, START + 5), inv_freq, scale=attention)
    assert record["scaling"] == NAME
    assert record["scaling_params"] == PARAMS
    np.testing.assert_array_equal(np.asarray(record["cos"], np.float32), cos)
    np.testing.assert_array_equal(np.asarray(record["sin"], np.float32), sin)
    assert record["attention_factor"] == attention
    # A parameter the method does not take is refused with the method's own list.
    assert main([*argv, "--scaling-param", "beta=2"]) == 2
    assert "takes factor, original_max_position_embeddings" in capsys.readouterr().err


def test_plots_draw_it_with_its_example_parameters():
    _require("matplotlib")
    from posenc import plot

    fig = plot.rope_spectrum(
        head_dim=HEAD_DIM,
        base=10000.0,
        factor=4.0,
        original_max_position_embeddings=64,
        methods=("default", NAME),
    )
    line = fig.axes[0].lines[1]
    assert line.get_label().startswith(NAME)
    inv_freq, _ = posenc.rope_scaling(NAME, HEAD_DIM, **PARAMS)
    np.testing.assert_allclose(line.get_ydata(), 2 * np.pi / inv_freq, rtol=1e-15)


def test_bench_evaluates_with_it():
    from posenc.bench.spec import RunSpec

    spec = RunSpec("copy", "rope", steps=1, rope_eval_scalings=[NAME])
    assert spec.rope_eval_scalings == (NAME,)
