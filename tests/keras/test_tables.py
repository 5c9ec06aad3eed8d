"""The Keras layers' tables: kept once for the layers of one kind and spec, in memory the
backend allocated, on whichever backend KERAS_BACKEND selects.

Backend-agnostic; ``test_backends.py`` runs it again on the Keras backends this process
does not use (on JAX with two host devices). Expected values come from the NumPy core (the
specs' tables, ``posenc.alibi_bias``, ``posenc.t5_bias``, ``apply_rope``), or from a layer
with tables of its own, bit for bit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import os
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")

from keras import ops  # noqa: E402

import posenc  # noqa: E402
from conformance import keras_traced as traced  # noqa: E402
from posenc.core.rope import apply_rope, rope_tables  # noqa: E402
from posenc.keras import (  # noqa: E402
    ALiBiBias,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    T5RelativeBias,
)
from posenc.keras._backend import to_tensor  # noqa: E402
from posenc.keras._tables import shared_count  # noqa: E402
from posenc.specs import SinusoidalSpec  # noqa: E402

# Keras' torch backend converts tensors with np.array(tensor), which warns under NumPy 2.
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

BACKEND = keras.backend.backend()
HEAD_DIM = 16
RNG = np.random.default_rng(20261125)
X = RNG.standard_normal((2, 6, 3, HEAD_DIM)).astype(np.float32)  # (batch, seq, heads, d)
E = RNG.standard_normal((2, 6, HEAD_DIM)).astype(np.float32)  # (batch, seq, d_model)
SCORES = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)  # (batch, heads, q, k)


def to_numpy(tensor: Any) -> np.ndarray:
    """A tensor's values as NumPy, bfloat16 widened to float32 (exact)."""
    if keras.backend.standardize_dtype(tensor.dtype) == "bfloat16":
        tensor = ops.cast(tensor, "float32")
    return np.asarray(ops.convert_to_numpy(tensor))


def int_tensor(value):
    return ops.convert_to_tensor(np.asarray(value, dtype=np.int32))


def rotated(x: np.ndarray, start: int, base: float = 10000.0) -> np.ndarray:
    """``x`` rotated by the core at positions ``start ..``: float64, rounded once."""
    inv_freq = posenc.rope_frequencies(x.shape[-1], base)
    cos, sin = rope_tables(np.arange(start, start + x.shape[1]), inv_freq, dtype="float64")
    return apply_rope(x.astype(np.float64), cos[:, None, :], sin[:, None, :]).astype(np.float32)


def encoded(x: np.ndarray, start: int, base: float = 10000.0) -> np.ndarray:
    """``x`` plus the core's float32 sinusoidal rows ``start ..``, added in float32."""
    spec = SinusoidalSpec(d_model=x.shape[-1], base=base)
    return x + spec.table(x.shape[1], fmt="float32", start=start)


def tensors(layer: Any, fmt: str = "float32") -> tuple[Any, ...]:
    """The backend tensors a layer reads its tables from."""
    return layer._tables.get("int32" if isinstance(layer, T5RelativeBias) else fmt)


def rope(**options: Any) -> RotaryEmbedding:
    layer = RotaryEmbedding(**{"max_length": 8, **options})
    layer.build(X.shape)
    return layer


def sinusoidal(**options: Any) -> SinusoidalPositionalEncoding:
    layer = SinusoidalPositionalEncoding(**{"max_length": 8, **options})
    layer.build(E.shape)
    return layer


def alibi(**options: Any) -> ALiBiBias:
    layer = ALiBiBias(**{"num_heads": 4, "max_length": 8, **options})
    layer.build((1, layer.num_heads, 6, 6))
    return layer


def t5(**options: Any) -> T5RelativeBias:
    layer = T5RelativeBias(**{"num_heads": 4, "num_buckets": 8, "max_distance": 16, **options})
    layer.build(SCORES.shape)
    layer.set_weights([np.arange(32.0, dtype=np.float32).reshape(8, 4)])
    return layer


MAKERS = {"rope": rope, "sinusoidal": sinusoidal, "alibi": alibi, "t5": t5}


def expected_output(kind: str, layer: Any) -> np.ndarray:
    """What the layer must give at start 0, from the core."""
    if kind == "rope":
        return rotated(X, 0)
    if kind == "sinusoidal":
        return encoded(E, 0)
    if kind == "alibi":
        return SCORES + posenc.alibi_bias(6, 6, num_heads=4).astype(np.float32)
    weights = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    return SCORES + posenc.t5_bias(weights, 6, 6, max_distance=16).astype(np.float32)


def output(kind: str, layer: Any) -> np.ndarray:
    return to_numpy(layer({"rope": X, "sinusoidal": E}.get(kind, SCORES)))


def check_output(kind: str, layer: Any) -> None:
    out, expected = output(kind, layer), expected_output(kind, layer)
    if kind == "rope":  # rotated in float32: within a few units of the last place
        np.testing.assert_allclose(out, expected, rtol=0, atol=4e-7 * np.abs(X).max())
    else:  # the layer only adds the core's rounded values
        np.testing.assert_array_equal(out, expected)


# -- sharing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MAKERS))
def test_layers_of_one_spec_read_the_very_same_tensors(kind):
    a, b = MAKERS[kind](), MAKERS[kind]()
    assert a.shares_tables
    assert b.shares_tables
    assert a._tables.shares_with(b._tables)
    assert all(t is u for t, u in zip(tensors(a), tensors(b), strict=True))
    check_output(kind, a)
    check_output(kind, b)
    private = MAKERS[kind]().unshare_tables()  # what a layer alone gives, bit for bit
    np.testing.assert_array_equal(output(kind, b), output(kind, private))


def test_a_model_of_many_layers_holds_one_set_of_tables():
    gc.collect()  # the tables of earlier tests' layers, freed now rather than meanwhile
    before = shared_count()
    layers = [rope(base=2718.5) for _ in range(32)]
    assert shared_count() == before + 1
    assert len({id(t) for layer in layers for t in tensors(layer)}) == 2  # cos, sign·sin


def test_growth_for_one_layer_grows_the_tables_of_all():
    a, b = rope(base=3141.5), rope(base=3141.5)
    a.extend(40)
    assert b.table_length == 40
    assert all(t is u for t, u in zip(tensors(a), tensors(b), strict=True))
    assert int(tensors(b)[0].shape[0]) == 40
    # A traced start inside the grown tables: rows, not NaN, and the right ones.
    rotate = traced(lambda x, start: b(x, start_index=start))
    expected = rotated(X, 30, base=3141.5)
    np.testing.assert_allclose(to_numpy(rotate(X, int_tensor(30))), expected, atol=4e-6)
    # A known position past the tables grows them from the other layer's call.
    out = b(X, start_index=70)
    assert a.table_length == b.table_length >= 76
    np.testing.assert_allclose(to_numpy(out), rotated(X, 70, base=3141.5), atol=4e-6)


def test_growth_reaches_every_kind_and_the_other_layers_outputs_stay_right():
    a, b = sinusoidal(), sinusoidal()
    a(E, start_index=8)  # past the 8 rows, within twice them: grows for both
    assert b.table_length == a.table_length >= 14
    np.testing.assert_array_equal(to_numpy(b(E, start_index=8)), encoded(E, 8))
    np.testing.assert_array_equal(to_numpy(b(E, start_index=3)), encoded(E, 3))
    c, d = alibi(), alibi()
    scores = RNG.standard_normal((1, 4, 2, 30)).astype(np.float32)
    c(scores)  # 30 keys: past the 8 positions
    assert d._tables.length == c._tables.length >= 30
    core = posenc.alibi_bias(2, 30, num_heads=4).astype(np.float32)
    np.testing.assert_array_equal(to_numpy(d(scores)), scores + core)


def test_far_apart_positions_get_their_rows_and_grow_no_table():
    # The one growth rule (posenc.core.plan.plan_rows): [0, 3_000_000] reads two rows, so
    # the shared tables stay at 8 rows instead of growing every layer to three million.
    at = np.array([[0, 3_000_000]])
    a, b = rope(base=2718.5), rope(base=2718.5)
    out = a(X[:, :2], positions=int_tensor(at))
    inv_freq = posenc.rope_frequencies(HEAD_DIM, 2718.5)
    cos, sin = rope_tables(at[0], inv_freq, dtype="float64")
    want = apply_rope(X[:, :2].astype(np.float64), cos[:, None, :], sin[:, None, :])
    np.testing.assert_allclose(to_numpy(out), want, rtol=0, atol=4e-7 * np.abs(X).max())
    assert a.table_length == b.table_length == 8
    c = sinusoidal(base=2718.5)
    spec = SinusoidalSpec(d_model=HEAD_DIM, base=2718.5)
    got = to_numpy(c(E[:, :2], positions=int_tensor(at)))
    np.testing.assert_array_equal(got, E[:, :2] + spec.table(at[0], fmt="float32"))
    assert c.table_length == 8


def test_a_new_layer_reads_its_own_max_length_of_longer_shared_tables():
    a = sinusoidal(base=2000.0)
    a.extend(32)
    b = sinusoidal(base=2000.0)  # max_length 8: the same tensors, 8 rows of them read
    assert b._tables.shares_with(a._tables)
    assert tensors(b)[0] is tensors(a)[0]
    assert b.table_length == 8
    shift = traced(lambda x, start: b(x, start_index=start))
    out = to_numpy(shift(E[:, :4], int_tensor(6)))  # positions 6 .. 9: two past its 8
    np.testing.assert_array_equal(out[:, :2], encoded(E[:, :4], 6, base=2000.0)[:, :2])
    assert np.isnan(out[:, 2:]).all()
    a.extend(48)  # growth from now on: for both
    assert b.table_length == 48
    shift = traced(lambda x, start: b(x, start_index=start))  # traced again: 48 rows now
    out = to_numpy(shift(E[:, :4], int_tensor(6)))
    np.testing.assert_array_equal(out, encoded(E[:, :4], 6, base=2000.0))


@pytest.mark.parametrize("kind", ["rope", "sinusoidal", "alibi"])
@pytest.mark.parametrize("order", ["too-long-first", "too-long-second"])
def test_a_max_length_the_memory_limit_refuses_is_that_layers_error_alone(kind, order):
    # Tables are built on first use; a layer's max_length too long for the memory limit
    # became the shared tables' length, and every layer of the spec was then refused
    good_options = {"base": 3000.0} if kind != "alibi" else {"num_heads": 3}
    layers = {"rope": RotaryEmbedding, "sinusoidal": SinusoidalPositionalEncoding}
    if order == "too-long-first":  # built on its first call, which it does not make
        huge = layers.get(kind, ALiBiBias)(max_length=2**53, **good_options)
        good = MAKERS[kind](**good_options)
    else:
        good = MAKERS[kind](**good_options)
        huge = layers.get(kind, ALiBiBias)(max_length=2**53, **good_options)
    inputs = {"rope": X, "sinusoidal": E}.get(kind, SCORES[:, :3])
    out = to_numpy(good(inputs))
    if kind == "rope":
        np.testing.assert_allclose(
            out, rotated(X, 0, base=3000.0), rtol=0, atol=4e-7 * np.abs(X).max()
        )
    elif kind == "sinusoidal":
        np.testing.assert_array_equal(out, encoded(E, 0, base=3000.0))
    else:
        expected = SCORES[:, :3] + posenc.alibi_bias(6, 6, num_heads=3).astype(np.float32)
        np.testing.assert_array_equal(out, expected)
    with pytest.raises(posenc.MemoryLimitError, match="max_length"):
        huge(inputs)
    np.testing.assert_array_equal(to_numpy(good(inputs)), out)  # still right after that


def test_tables_no_layer_uses_are_freed():
    gc.collect()
    a, b = rope(base=1234.5), rope(base=1234.5)
    before = shared_count()
    store = weakref.ref(a._tables.entry)
    table = weakref.ref(tensors(a)[0]) if BACKEND != "tensorflow" else None
    del a
    gc.collect()  # Keras layers are reference cycles
    assert store() is not None  # b still reads them
    del b
    gc.collect()
    assert store() is None
    assert table is None or table() is None
    assert shared_count() == before - 1


def test_the_shared_tables_do_not_keep_the_first_layer_alive():
    a, b = rope(base=4321.5), alibi(num_heads=5)
    first_rope, first_alibi = weakref.ref(a), weakref.ref(b)
    others = rope(base=4321.5), alibi(num_heads=5)  # keep the tables alive
    del a, b
    gc.collect()
    assert first_rope() is None
    assert first_alibi() is None
    for layer in others:
        assert layer.shares_tables


SPEC_CHANGES = [
    ("rope", {"base": 500000.0}),
    ("rope", {"layout": "interleaved"}),
    ("rope", {"rotary_dim": 8}),
    ("rope", {"scaling": "linear", "scaling_params": {"factor": 2.0}}),
    (
        "rope",
        {
            "scaling": "yarn",
            "scaling_params": {"factor": 4.0, "original_max_position_embeddings": 4},
        },
    ),
    ("rope", {"scaling": "linear", "scaling_params": {"factor": 3.0}}),
    ("sinusoidal", {"layout": "split"}),
    ("sinusoidal", {"formula": "tensor2tensor"}),
    ("sinusoidal", {"base": 500.0}),
    ("alibi", {"num_heads": 8}),
    ("alibi", {"mode": "symmetric"}),
    ("t5", {"max_distance": 32}),
    ("t5", {"bidirectional": False}),
    ("t5", {"compat": "exact"}),
]


@pytest.mark.parametrize(("kind", "change"), SPEC_CHANGES)
def test_layers_of_different_specs_never_share(kind, change):
    a, b = MAKERS[kind](), MAKERS[kind](**change)
    assert not a._tables.shares_with(b._tables)
    assert not {id(t) for t in tensors(a)} & {id(t) for t in tensors(b)}
    assert a.shares_tables
    assert b.shares_tables


def test_the_other_width_of_one_sinusoidal_spec_does_not_share():
    a = sinusoidal()
    b = SinusoidalPositionalEncoding(max_length=8)
    b.build((2, 6, 8))
    assert not a._tables.shares_with(b._tables)


def test_max_length_is_not_part_of_the_spec():
    a, b = rope(base=777.5, max_length=16), rope(base=777.5, max_length=8)
    assert a._tables.shares_with(b._tables)
    assert (a.table_length, b.table_length) == (16, 8)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ListScaling(posenc.RopeScaling):
    """Frequencies divided by per-pair ``factors``, kept in a list: an unhashable spec."""

    factors: list

    def _inv_freq(self, rotary_dim: int, base: float, seq_len: int | None) -> tuple[Any, float]:
        return posenc.rope_frequencies(rotary_dim, base) / np.asarray(self.factors), 1.0


def test_an_unhashable_spec_is_simply_not_shared():
    factors = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
    a, b = (rope(scaling=ListScaling(factors=list(factors))) for _ in range(2))
    with pytest.raises(TypeError):
        hash(a.spec)
    assert not a.shares_tables
    assert not a._tables.shares_with(b._tables)
    np.testing.assert_array_equal(output("rope", a), output("rope", b))
    inv_freq = posenc.rope_frequencies(HEAD_DIM, 10000.0) / np.asarray(factors)
    cos, sin = rope_tables(np.arange(6), inv_freq, dtype="float64")
    expected = apply_rope(X.astype(np.float64), cos[:, None, :], sin[:, None, :])
    np.testing.assert_allclose(output("rope", a), expected.astype(np.float32), atol=4e-6)


# -- unshare_tables ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MAKERS))
def test_unshare_tables_after_build_gives_a_private_copy(kind):
    a, b = MAKERS[kind](), MAKERS[kind]()
    assert b.unshare_tables() is b
    assert not b.shares_tables
    assert a.shares_tables
    assert not b._tables.shares_with(a._tables)
    for mine, theirs in zip(tensors(b), tensors(a), strict=True):
        assert mine is not theirs
        np.testing.assert_array_equal(to_numpy(mine), to_numpy(theirs))
    check_output(kind, b)


def test_unshared_tables_do_not_grow_with_the_others_nor_the_others_with_them():
    a, b, c = rope(base=999.5), rope(base=999.5), rope(base=999.5)
    b.unshare_tables()
    a.extend(64)
    assert (a.table_length, b.table_length, c.table_length) == (64, 8, 64)
    b.extend(100)
    assert (a.table_length, b.table_length) == (64, 100)
    np.testing.assert_allclose(
        to_numpy(b(X, start_index=90)), rotated(X, 90, base=999.5), atol=4e-6
    )


def test_unshare_tables_before_build_and_after_a_rebuild():
    shared = rope(base=888.5)
    layer = RotaryEmbedding(base=888.5, max_length=8).unshare_tables()
    layer.build(X.shape)
    assert not layer.shares_tables
    assert not layer._tables.shares_with(shared._tables)
    layer.build(X.shape)  # built again: still its own
    assert not layer.shares_tables
    assert not layer._tables.shares_with(shared._tables)
    np.testing.assert_array_equal(output("rope", layer), output("rope", shared))
    alibi_layer = ALiBiBias(num_heads=4, max_length=8).unshare_tables()
    alibi_layer.build(SCORES.shape)
    assert not alibi_layer._tables.shares_with(alibi()._tables)
    check_output("alibi", alibi_layer)


# -- threads, configs, files, precision, traces --------------------------------------------


def test_threads_building_and_growing_one_spec_share_one_set():
    layers, errors = [], []
    made, barrier = threading.Barrier(6), threading.Barrier(6)

    def work(i: int) -> None:
        try:
            made.wait()
            layer = sinusoidal(base=6543.5)  # six layers made at once: one set of tables
            layers.append(layer)
            barrier.wait()  # then grown at once: the longest tables win, for all of them
            layer.extend(16 + 8 * i)
            out = layer(E, start_index=10 + 8 * i)  # up to 15 + 8i: inside, at least
            np.testing.assert_array_equal(to_numpy(out), encoded(E, 10 + 8 * i, base=6543.5))
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len({id(layer._tables.entry) for layer in layers}) == 1
    assert {layer.table_length for layer in layers} == {56}
    (table,) = tensors(layers[0])
    base = SinusoidalSpec(d_model=HEAD_DIM, base=6543.5).table(56, fmt="float32")
    np.testing.assert_array_equal(to_numpy(table), base)


def test_from_config_and_a_saved_model_share_with_the_layers_of_their_spec(tmp_path):
    a = rope(base=5555.5)
    restored = RotaryEmbedding.from_config(a.get_config())
    restored.build(X.shape)
    assert restored._tables.shares_with(a._tables)
    inputs = keras.Input(shape=X.shape[1:])
    first = RotaryEmbedding(base=5555.5, max_length=8)
    second = RotaryEmbedding(base=5555.5, max_length=8)
    model = keras.Model(inputs, second(first(inputs)))
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    layers = [layer for layer in loaded.layers if isinstance(layer, RotaryEmbedding)]
    assert len(layers) == 2
    assert layers[0]._tables.shares_with(layers[1]._tables)
    assert layers[0]._tables.shares_with(a._tables)
    np.testing.assert_array_equal(to_numpy(loaded(X)), to_numpy(model(X)))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16", "float64"])
def test_formats_of_one_spec_live_together_each_correctly_rounded(policy):
    if BACKEND == "jax" and policy == "float64":
        pytest.skip("float64 on Keras JAX needs JAX's 64-bit mode")
    fmt = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}.get(policy, policy)
    plain = sinusoidal(base=4444.5)
    mixed = SinusoidalPositionalEncoding(max_length=8, base=4444.5, dtype=policy)
    mixed.build(E.shape)
    assert mixed._tables.shares_with(plain._tables)
    (table,) = tensors(mixed, fmt)
    assert keras.backend.standardize_dtype(table.dtype) == fmt
    expected = SinusoidalSpec(d_model=HEAD_DIM, base=4444.5).table(8, fmt=fmt)
    np.testing.assert_array_equal(to_numpy(table), expected)
    assert tensors(plain)[0] is not table  # float32 beside it, unchanged
    np.testing.assert_array_equal(
        to_numpy(tensors(plain)[0]), SinusoidalSpec(d_model=HEAD_DIM, base=4444.5).table(8)
    )


def test_tables_made_while_tracing_are_concrete_and_shared():
    layer = RotaryEmbedding(base=3333.5, max_length=8)  # built by its first, traced call
    rotate = traced(lambda x, start: layer(x, start_index=start))
    traced_out = to_numpy(rotate(X, int_tensor(2)))
    other = rope(base=3333.5)  # eager: reads the tables the trace made
    assert other._tables.shares_with(layer._tables)
    eager_out = to_numpy(other(X, start_index=2))  # XLA may fuse the traced one (FMA)
    np.testing.assert_allclose(eager_out, traced_out, rtol=0, atol=4e-7 * np.abs(X).max())
    np.testing.assert_allclose(traced_out, rotated(X, 2, base=3333.5), atol=4e-6)


def test_a_symbolic_call_leaves_no_meta_tensor_in_the_shared_tables():
    layer = RotaryEmbedding(base=2222.5, max_length=8)
    layer(keras.Input(shape=X.shape[1:]))  # torch: shapes inferred on the meta device
    for tables in layer._tables.entry.formats.values():
        assert not any(getattr(t, "is_meta", False) for t in tables)
    np.testing.assert_allclose(to_numpy(rope(base=2222.5)(X)), rotated(X, 0, 2222.5), atol=4e-6)


# -- memory the backend allocated --------------------------------------------------------------


def data_pointer(tensor: Any) -> int | None:
    """The address of a tensor's first element (``None`` where it cannot be read)."""
    if BACKEND == "torch":
        return int(tensor.data_ptr())
    if BACKEND == "jax":
        return int(tensor.unsafe_buffer_pointer())
    if keras.backend.standardize_dtype(tensor.dtype) == "bfloat16":
        return None  # NumPy has no bfloat16 to view it with
    return int(np.from_dlpack(tensor).ctypes.data)


def aligned_array(values: np.ndarray) -> np.ndarray:
    """``values`` copied into a 64-byte aligned NumPy buffer (which JAX would wrap)."""
    raw = np.empty(values.nbytes + 64, np.uint8)
    offset = -raw.ctypes.data % 64
    out = raw[offset : offset + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    return out


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float32", "int32"])
@pytest.mark.parametrize("align", [True, False])
def test_tables_live_in_memory_the_backend_allocated(fmt, align):
    container = {"bfloat16": "float32"}.get(fmt, fmt)
    values = (RNG.standard_normal((64, 24)) * 100).astype(container)
    if fmt == "bfloat16":  # values the format holds exactly
        values = posenc.core.precision.round_to_format(values, "bfloat16")
    values = aligned_array(values) if align else values[1:]  # 64-aligned, or 96 bytes off
    tensor = to_tensor(values, fmt)
    assert keras.backend.standardize_dtype(tensor.dtype) == fmt
    np.testing.assert_array_equal(to_numpy(tensor), values)
    pointer = data_pointer(tensor)
    if pointer is not None:
        assert pointer != values.ctypes.data
        assert pointer % 64 == 0
    values[...] = 0  # no view: the tensor keeps its values
    assert np.any(to_numpy(tensor) != 0)


def _resident_mib() -> float:
    """This process's resident memory (MiB) after freeing what can be freed."""
    gc.collect()
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    with open("/proc/self/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status")
@pytest.mark.skipif(ctypes.util.find_library("c") is None, reason="needs malloc_trim")
def test_a_table_holds_its_memory_once():
    # TensorFlow's tensor converted from a NumPy array held twice its memory while it
    # lived; to_tensor hands over one that holds it once.
    warm = to_tensor(np.ones((4, 4), np.float32), "float32")
    del warm
    values = RNG.standard_normal((65536, 128)).astype(np.float32)  # 32 MiB
    first = values[0].copy()
    before = _resident_mib()
    tensor = to_tensor(values, "float32")
    del values
    grown = _resident_mib() - before + 32  # the 32 MiB of values freed in between
    assert grown < 1.25 * 32, f"a 32 MiB table holds {grown:.0f} MiB"
    np.testing.assert_array_equal(to_numpy(tensor)[0], first)


def test_a_layers_tables_are_not_views_of_the_cores_arrays():
    layer = sinusoidal(base=1111.5)
    (table,) = tensors(layer)
    pointer = data_pointer(table)
    assert pointer is not None
    assert pointer % 64 == 0


# -- devices --------------------------------------------------------------------------------


def _two_devices() -> list[str]:
    """Two Keras device names of this process (JAX: ``test_backends.py``'s child run
    forces two host devices), or skip."""
    if BACKEND != "jax":
        pytest.skip(f"two devices of one kind are forced on the JAX backend only ({BACKEND})")
    import jax

    devices = jax.devices("cpu")
    if len(devices) < 2:
        pytest.skip("one host device (XLA_FLAGS forces two in test_backends.py's run)")
    return [f"cpu:{device.id}" for device in devices[:2]]


def _devices_of(tensor: Any) -> set[str]:
    return {f"{device.platform}:{device.id}" for device in tensor.devices()}


def test_layers_on_two_devices_keep_a_set_of_tables_each():
    first, second = _two_devices()
    with keras.device(first):
        a = sinusoidal(base=2121.5)
    with keras.device(second):
        b = sinusoidal(base=2121.5)
        c = sinusoidal(base=2121.5)
    assert not a._tables.shares_with(b._tables)
    assert b._tables.shares_with(c._tables)
    assert _devices_of(tensors(a)[0]) == {first}
    assert _devices_of(tensors(b)[0]) == {second}
    with keras.device(first):  # growth called under the other device's scope
        b.extend(40)
    assert _devices_of(tensors(c)[0]) == {second}  # grown where they were made
    assert a.table_length == 8
    assert c.table_length == 40
    with keras.device(second):
        np.testing.assert_array_equal(to_numpy(c(E, start_index=30)), encoded(E, 30, base=2121.5))
