"""Tables kept once: modules of one spec share one table per dtype and device.

Every behaviour a module had with tables of its own is checked here with shared ones:
casts and moves, meta builds, state dicts, pickling and deep copies, torch.compile,
torch.export and ONNX, gradients, threads; and the sharing itself (identity, growth,
freeing, different specs apart, ``unshare_tables``).
"""

from __future__ import annotations

import copy
import gc
import io
import pickle
import threading
import warnings
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import posenc  # noqa: E402
from posenc.core.rope import rope_table_values  # noqa: E402
from posenc.core.sinusoidal import table_values  # noqa: E402
from posenc.torch import (  # noqa: E402
    ALiBiBias,
    MultiHeadAttention,
    RotaryEmbedding,
    SandwichBias,
    SinusoidalPositionalEncoding,
    SinusoidalPositionalEncodingND,
    T5RelativeBias,
    XPosRotaryEmbedding,
)
from posenc.torch._tables import shared_count  # noqa: E402

LONGROPE = {
    "long_factor": [1.0, 2.0, 4.0, 8.0],
    "short_factor": [1.0, 1.0, 1.5, 2.0],
    "original_max_position_embeddings": 16,
    "factor": 4.0,
}

# Each maker gets a base, so that tests can keep their modules apart from any other
# test's modules still alive (shared tables are shared across the whole process).
MAKERS = {
    "rope": lambda base: RotaryEmbedding(8, base=base, max_length=32),
    "longrope": lambda base: RotaryEmbedding(
        8, base=base, max_length=32, scaling="longrope", scaling_params=LONGROPE
    ),
    "xpos": lambda base: XPosRotaryEmbedding(8, base=base, max_length=32),
    "sinusoidal": lambda base: SinusoidalPositionalEncoding(8, 0.0, 32, base),
}


def tables(module):
    """The module's derived buffers, by name."""
    return {name: module._buffers[name] for name in module._derived_names}


def exact_rope(positions, head_dim, base, fmt="float32", layout="half"):
    inv_freq = posenc.rope_frequencies(head_dim, base=base)
    return rope_table_values(positions, inv_freq, fmt=fmt, layout=layout)


# -- sharing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", MAKERS)
def test_modules_of_one_spec_hold_the_same_tensors_in_aligned_torch_memory(kind):
    a, b = MAKERS[kind](1234.5), MAKERS[kind](1234.5)
    assert a.shares_tables
    for name, table in tables(a).items():
        assert tables(b)[name] is table
        assert table.data_ptr() % 64 == 0  # PyTorch's allocation, not NumPy's (16 bytes)
        assert table.untyped_storage().nbytes() == table.numel() * table.element_size()


def test_the_shared_tables_are_the_cores_exact_values():
    a, b = RotaryEmbedding(16, base=777.0, max_length=40), RotaryEmbedding(16, base=777.0)
    cos, sin = exact_rope(b.table_length, 16, 777.0)
    np.testing.assert_array_equal(b.cos.numpy(), cos)
    np.testing.assert_array_equal(b.sin.numpy(), sin)
    assert b.table_length == 4096  # the longer of the two asked for, one table
    assert a.table_length == 40  # a reads its own rows of it until the tables grow
    np.testing.assert_array_equal(a.cos.numpy(), cos[:40])
    assert a.cos.data_ptr() == b.cos.data_ptr()


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (lambda: RotaryEmbedding(8, base=500.0), lambda: RotaryEmbedding(8, base=501.0)),
        (lambda: RotaryEmbedding(8, base=500.0), lambda: RotaryEmbedding(10, base=500.0)),
        (
            lambda: RotaryEmbedding(8, base=500.0),
            lambda: RotaryEmbedding(8, base=500.0, layout="interleaved"),
        ),
        (
            lambda: RotaryEmbedding(8, base=500.0),
            lambda: RotaryEmbedding(8, base=500.0, rotary_dim=4),
        ),
        (
            lambda: RotaryEmbedding(
                8, base=500.0, scaling="linear", scaling_params={"factor": 2.0}
            ),
            lambda: RotaryEmbedding(
                8, base=500.0, scaling="linear", scaling_params={"factor": 3.0}
            ),
        ),
        (lambda: RotaryEmbedding(8, base=500.0), lambda: XPosRotaryEmbedding(8, base=500.0)),
        (
            lambda: SinusoidalPositionalEncoding(8, 0.0, 16, 500.0),
            lambda: SinusoidalPositionalEncoding(8, 0.0, 16, 500.0, layout="split"),
        ),
        (
            lambda: SinusoidalPositionalEncoding(8, 0.0, 16, 500.0),
            lambda: SinusoidalPositionalEncoding(8, 0.0, 16, 500.0, formula="tensor2tensor"),
        ),
        (lambda: ALiBiBias(4), lambda: ALiBiBias(4, mode="symmetric")),
        (lambda: T5RelativeBias(2), lambda: T5RelativeBias(2, max_distance=64)),
        (lambda: T5RelativeBias(2), lambda: T5RelativeBias(2, bidirectional=False)),
    ],
)
def test_modules_of_different_specs_never_share(one, other):
    a, b = one(), other()
    for table in tables(a).values():
        assert all(t is not table for t in tables(b).values())
        assert all(t.untyped_storage().data_ptr() != table.untyped_storage().data_ptr()
                   for t in tables(b).values())  # fmt: skip


def test_the_small_derived_buffers_are_shared_too():
    assert ALiBiBias(6).slopes is ALiBiBias(6).slopes
    one, two = T5RelativeBias(2, num_buckets=16), T5RelativeBias(2, num_buckets=16)
    assert one.buckets is two.buckets
    assert one.relative_attention_bias.weight is not two.relative_attention_bias.weight


def test_a_sandwich_table_is_its_own():
    # It grows by itself, past the distances of each call: a module's own state.
    a, b = SandwichBias(2, dim=8), SandwichBias(2, dim=8)
    assert a.table is not b.table
    assert not a.shares_tables
    a(3000)
    assert a.table.shape[0] > b.table.shape[0] == 1024


def test_a_grown_sandwich_table_stays_whole_through_unshare_and_copies():
    module, fresh = SandwichBias(2, dim=8, max_length=16), SandwichBias(2, dim=8)
    module(40)  # grown past its 16 distances
    rows = module.table.shape[0]
    assert rows >= 40
    expected = fresh(40)
    for same in (
        module.unshare_tables(),
        copy.deepcopy(module),
        pickle.loads(pickle.dumps(module)),
    ):
        assert same.table.shape[0] == rows
        torch.testing.assert_close(same(40), expected, rtol=0, atol=0)
    assert module._holder.entry.formats[module._fmt][0] is module.table


@pytest.mark.parametrize("kind", ["rope", "sinusoidal"])
def test_growing_the_tables_for_one_module_grows_them_for_all(kind):
    a, b = MAKERS[kind](2345.5), MAKERS[kind](2345.5)
    assert a.table_length == b.table_length == 32
    if kind == "rope":
        q = torch.randn(1, 2, 3, 8, dtype=torch.float64)
        a(q.float(), q.float(), offset=50)
    else:
        a(torch.zeros(1, 3, 8), offset=50)
    assert b.table_length == a.table_length >= 53
    assert all(tables(b)[name] is t for name, t in tables(a).items())
    if kind == "rope":  # b reads the grown rows: the exact rotation at 50..52
        q_rot, _ = b(q.float(), q.float(), offset=50)
        cos, sin = exact_rope(np.arange(50, 53), 8, 2345.5, fmt="float64")
        turned = torch.cat([-q[..., 4:], q[..., :4]], dim=-1)
        expected = q * torch.from_numpy(cos) + turned * torch.from_numpy(sin)
        torch.testing.assert_close(q_rot.double(), expected, rtol=0, atol=4e-7)
    else:
        out = b(torch.zeros(1, 3, 8), offset=50)
        expected = table_values(3, 8, base=2345.5, layout="interleaved", formula="paper",
                                fmt="float32", start=50)  # fmt: skip
        np.testing.assert_array_equal(out[0].numpy(), expected)


FAR_APART = [[0, 3_000_000], [5, 10**9], [2_999_999]]  # two far apart, one at 10**9, one far


@pytest.mark.parametrize("positions", FAR_APART, ids=["0-3e6", "5-1e9", "one-far"])
@pytest.mark.parametrize("batch", [1, 2], ids=["decode-step", "batch-2"])
def test_far_apart_positions_get_their_rows_and_grow_no_table(positions, batch):
    # The one growth rule (posenc.core.plan.plan_rows): a call grows the shared tables only
    # when its rows end within twice the table plus the call's length. [0, 3_000_000] reads
    # two rows: growing to 3,000,001 rows (366 MiB at head_dim 16, for every module of the
    # spec) is what the rule forbids. A batch of 1 takes RoPE's decoding step, 2 the other.
    rope, other = (RotaryEmbedding(16, base=2468.5, max_length=256) for _ in range(2))
    at = torch.tensor(positions)
    q = torch.randn(batch, 4, len(positions), 16, dtype=torch.float64)
    q_rot, k_rot = rope(q.float(), q[:, :2].float(), positions=at)
    cos, sin = exact_rope(np.array(positions), 16, 2468.5, fmt="float64")
    turned = torch.cat([-q[..., 8:], q[..., :8]], dim=-1)
    expected = q * torch.from_numpy(cos) + turned * torch.from_numpy(sin)
    torch.testing.assert_close(q_rot.double(), expected, rtol=0, atol=4e-7)
    torch.testing.assert_close(k_rot.double(), expected[:, :2], rtol=0, atol=4e-7)
    cos32, sin32 = exact_rope(np.array(positions), 16, 2468.5)
    got = rope.cos_sin(at)
    np.testing.assert_array_equal(got[0].numpy(), cos32)
    np.testing.assert_array_equal(got[1].numpy(), sin32)
    sinusoidal = SinusoidalPositionalEncoding(8, 0.0, 256, 2468.5)
    out = sinusoidal(torch.zeros(1, len(positions), 8), positions=at)
    np.testing.assert_array_equal(
        out[0].numpy(),
        posenc.sinusoidal(np.array(positions), 8, base=2468.5, dtype="float32"),
    )
    assert rope.table_length == other.table_length == sinusoidal.table_length == 256
    sandwich = SandwichBias(4, dim=8, max_length=64)  # a table of distances
    with torch.no_grad():
        bias = sandwich(len(positions), positions=at, key_positions=at)  # (heads, q, k)
    distance = np.maximum(np.subtract.outer(positions, positions), 0)  # causal: query - key
    expected = sandwich.spec.distance_bias(distance.ravel()).reshape(4, *distance.shape)
    np.testing.assert_array_equal(bias.numpy(), expected.astype(np.float32))
    assert sandwich.table.shape[0] == 64


def test_positions_that_read_most_of_the_new_rows_still_grow_the_tables():
    # The same rule grows a table for gathered positions that cover the rows it adds:
    # a packed batch running past the table (0 .. 299 on 256 rows: 300 rows read).
    rope = RotaryEmbedding(8, base=1470.5, max_length=256)
    q = torch.randn(2, 2, 300, 8)
    rope(q, q, positions=torch.arange(300).expand(2, 300))
    assert rope.table_length == 512  # doubled (posenc.core.positions.grown_length)
    rope(q[:, :, :2], q[:, :, :2], positions=torch.tensor([0, 1100]))  # 1101 - 2 > 2·512
    assert rope.table_length == 512
    rope(q[:, :, :2], q[:, :, :2], positions=torch.tensor([0, 1025]))  # 1026 - 2 <= 2·512
    assert rope.table_length == 1026


def test_a_new_module_reads_its_own_max_length_of_longer_shared_tables():
    # As the Keras layers: what a module gives never depends on the longer tables other
    # modules of its spec asked for, until the tables grow for all of them.
    long = RotaryEmbedding(8, base=1357.5, max_length=64)
    short = RotaryEmbedding(8, base=1357.5, max_length=16)
    assert short.table_length == 16
    assert short.cos.data_ptr() == long.cos.data_ptr()  # its rows of the one table
    assert short.cos.untyped_storage().nbytes() == long.cos.untyped_storage().nbytes()
    np.testing.assert_array_equal(short.cos.numpy(), long.cos[:16].numpy())
    positions = torch.tensor([[3, 20]])  # 20: past its 16 rows, inside the 64
    with pytest.raises(Exception):  # noqa: B017, PT011  (gathered past its own rows)
        torch.nn.functional.embedding(positions, short.cos)
    q = torch.randn(1, 1, 2, 8)
    out, _ = short(q, q, positions=positions)  # eager: grows its rows (doubling), for all
    assert short.table_length == 32
    assert long.table_length == 64  # never fewer rows than it had
    torch.testing.assert_close(out, long(q, q, positions=positions)[0], rtol=0, atol=0)
    long.extend(100)  # growth for one grows all
    assert short.cos is long.cos
    pickled = pickle.loads(pickle.dumps(RotaryEmbedding(8, base=1357.5, max_length=16)))
    assert pickled.table_length == 16  # a copy reads its own rows too
    assert pickled.cos.data_ptr() == long.cos.data_ptr()


def test_extend_grows_every_module_of_the_spec():
    a, b = RotaryEmbedding(8, base=3456.5, max_length=16), RotaryEmbedding(8, base=3456.5)
    b.extend(5000)
    assert a.table_length == 5000
    assert a.cos is b.cos
    np.testing.assert_array_equal(a.cos.numpy(), exact_rope(5000, 8, 3456.5)[0])


def test_tables_no_module_uses_are_freed():
    gc.collect()  # tables of other tests' modules, in garbage cycles
    before = shared_count()
    modules = [RotaryEmbedding(8, base=4567.5, max_length=64) for _ in range(4)]
    cos = weakref.ref(modules[0].cos)
    assert shared_count() == before + 1
    del modules[:3]
    assert cos() is not None  # one module still uses them
    del modules
    assert cos() is None  # freed by reference counting: no cycle keeps a module alive
    gc.collect()
    assert shared_count() == before


def test_a_stack_of_32_layers_holds_one_table():
    layers = torch.nn.ModuleList(
        MultiHeadAttention(32, 4, position=RotaryEmbedding(8, base=5678.5, max_length=1024))
        for _ in range(32)
    )
    storages = {
        buffer.untyped_storage().data_ptr()
        for layer in layers
        for name, buffer in layer.named_buffers()
        if name.endswith(("cos", "sin"))
    }
    assert len(storages) == 2  # one cos and one sin for all 32 layers


# -- casts, moves and devices ----------------------------------------------------------------


def test_double_moves_a_module_to_the_shared_float64_tables_only():
    a, b, c = (RotaryEmbedding(8, base=6789.5, max_length=32) for _ in range(3))
    b.double()
    c.double()
    assert b.cos.dtype == torch.float64
    assert b.cos is c.cos
    assert a.cos.dtype == torch.float32
    np.testing.assert_array_equal(b.cos.numpy(), exact_rope(32, 8, 6789.5, fmt="float64")[0])
    b.float()
    assert b.cos is a.cos


@pytest.mark.parametrize("cast", ["half", "bfloat16"])
def test_a_cast_rope_keeps_the_shared_float32_tables(cast):
    a, b = RotaryEmbedding(8, base=7890.5), RotaryEmbedding(8, base=7890.5)
    cos = a.cos
    getattr(b, cast)()
    assert b.cos is cos
    assert b.cos.dtype == torch.float32


@pytest.mark.parametrize(("cast", "fmt"), [("half", "float16"), ("bfloat16", "bfloat16")])
def test_cast_sinusoidal_modules_share_correctly_rounded_tables(cast, fmt):
    a = getattr(SinusoidalPositionalEncoding(64, 0.0, 4096, 8901.5), cast)()
    b = getattr(SinusoidalPositionalEncoding(64, 0.0, 4096, 8901.5), cast)()
    assert a.pe is b.pe
    assert a.pe.dtype == getattr(torch, fmt)
    options = {"base": 8901.5, "layout": "interleaved", "formula": "paper"}
    exact = table_values(4096, 64, fmt=fmt, **options)
    np.testing.assert_array_equal(a.pe.float().numpy(), exact)  # rounded once
    # (a cast of the float32 table rounds twice: some of its 262,144 values differ)
    float32 = torch.from_numpy(table_values(4096, 64, fmt="float32", **options))
    assert not np.array_equal(float32.to(a.pe.dtype).float().numpy(), exact)


def test_a_meta_build_computes_nothing_and_to_empty_finds_the_shared_tables():
    with torch.device("meta"):
        huge = RotaryEmbedding(8, base=9012.5, max_length=2**40)  # no memory, no values
        small = RotaryEmbedding(8, base=9012.5, max_length=64)
    assert huge.cos.is_meta
    assert huge.cos.shape == (2**40, 8)
    assert not huge.shares_tables
    live = RotaryEmbedding(8, base=9012.5, max_length=64)
    small.to_empty(device="cpu")
    assert small.cos is live.cos
    np.testing.assert_array_equal(small.sin.numpy(), exact_rope(64, 8, 9012.5)[1])


def test_moving_to_meta_keeps_shapes_without_values():
    a = RotaryEmbedding(8, base=9123.5, max_length=48).to("meta")
    assert a.cos.is_meta
    assert a.cos.shape == (48, 8)
    q = torch.randn(1, 1, 4, 8, device="meta")
    assert a(q, q)[0].is_meta


# -- state dicts, pickling, copies -----------------------------------------------------------


def test_state_dicts_carry_nothing_derived_and_loading_keeps_the_shared_tables():
    a, b = T5RelativeBias(2, num_buckets=8), T5RelativeBias(2, num_buckets=8)
    rope_a, rope_b = RotaryEmbedding(8, base=1357.5), RotaryEmbedding(8, base=1357.5)
    assert list(a.state_dict()) == ["relative_attention_bias.weight"]
    assert rope_a.state_dict() == {}
    b.load_state_dict(a.state_dict())
    rope_b.load_state_dict({"cos": rope_a.cos.clone(), "sin": rope_a.sin.clone()})  # dropped
    assert torch.equal(b.relative_attention_bias.weight, a.relative_attention_bias.weight)
    assert b.buckets is a.buckets
    assert rope_b.cos is rope_a.cos


@pytest.mark.parametrize("kind", MAKERS)
def test_pickle_and_deepcopy_keep_no_values_and_rejoin_the_shared_tables(kind):
    module = MAKERS[kind](2468.5)
    module.extend(3000)
    data = pickle.dumps(module)
    assert len(data) < 20_000  # no table of 3000 rows inside
    for copied in (pickle.loads(data), copy.deepcopy(module)):
        assert copied.table_length == 3000
        assert all(tables(copied)[name] is t for name, t in tables(module).items())


def test_pickles_after_calls_in_other_dtypes_keep_no_values():
    # A float16 input makes a float32 module read shared float16 tables beside its own:
    # neither their values nor the registry's objects go into a pickle.
    sinusoidal = SinusoidalPositionalEncoding(64, 0.0, 4096, 2603.5)
    rope = RotaryEmbedding(64, base=2603.5, max_length=4096)
    half = torch.randn(1, 5, 64, dtype=torch.float16)
    out = sinusoidal(half)
    cos, sin = rope.cos_sin(torch.arange(5), dtype=torch.float16)
    for module in (sinusoidal, rope):
        data = pickle.dumps(module)
        assert len(data) < 20_000  # no table of 4096 × 64 inside, in any dtype
        for copied in (pickle.loads(data), copy.deepcopy(module)):
            assert copied._other_tables == {}
    torch.testing.assert_close(pickle.loads(pickle.dumps(sinusoidal))(half), out, rtol=0, atol=0)
    again = pickle.loads(pickle.dumps(rope)).cos_sin(torch.arange(5), dtype=torch.float16)
    assert all(torch.equal(x, y) for x, y in zip(again, (cos, sin), strict=True))


def test_a_pickled_nd_module_keeps_no_cached_grid():
    module = SinusoidalPositionalEncodingND(16, base=2603.5)
    grid = module.encoding((64, 64))  # (64, 64, 16) float32: 256 KiB
    data = pickle.dumps(module)
    assert len(data) < 20_000
    torch.testing.assert_close(pickle.loads(data).encoding((64, 64)), grid, rtol=0, atol=0)


def test_torch_save_of_a_whole_module_loads_where_map_location_says():
    module = RotaryEmbedding(8, base=3579.5, max_length=100)
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.cos is module.cos
    q = torch.randn(1, 2, 5, 8)
    assert all(torch.equal(x, y) for x, y in zip(loaded(q, q), module(q, q), strict=True))
    buffer.seek(0)
    on_meta = torch.load(buffer, weights_only=False, map_location="meta")
    assert on_meta.cos.is_meta
    assert on_meta.cos.shape == (100, 8)


def test_a_private_module_stays_private_through_copies_and_casts():
    shared = RotaryEmbedding(8, base=4680.5, max_length=32)
    private = RotaryEmbedding(8, base=4680.5, max_length=32).unshare_tables()
    assert private.cos is not shared.cos
    assert torch.equal(private.cos, shared.cos)
    assert not private.shares_tables
    assert shared.shares_tables
    shared.extend(500)
    assert private.table_length == 32  # not grown with the others
    private.cos[0, 0] = 5.0  # its own to write into
    assert shared.cos[0, 0] == 1.0
    for copied in (copy.deepcopy(private), pickle.loads(pickle.dumps(private))):
        assert copied.cos is not private.cos
        assert not copied.shares_tables
    private.double()
    other = RotaryEmbedding(8, base=4680.5).double()
    assert private.cos is not other.cos
    torch.testing.assert_close(private.cos, other.cos[:32], rtol=0, atol=1e-15)


def test_cpu_and_cpu_0_name_one_device_and_one_table():
    module = RotaryEmbedding(8, base=6802.5, max_length=64)
    before = shared_count()
    cos, sin = module._tables_in(torch.float32, torch.device("cpu:0"))
    assert cos is module.cos
    assert sin is module.sin
    assert shared_count() == before
    moved = RotaryEmbedding(8, base=6802.5, max_length=64).to("cpu:0")
    assert moved.cos is module.cos


def test_the_memory_limit_of_a_modules_tables_is_the_cores(monkeypatch):
    # The tables are allocated before the core fills them, so the module checks the
    # limit first: the same bytes the core checks when it allocates them itself. A spec
    # of its own: live shared tables long enough would need no new memory.
    limit = 2 * 40 * 8 * 4  # cos and sin of 40 rows of 8 float32
    monkeypatch.setattr(posenc.torch._tables, "DEFAULT_MAX_BYTES", limit)
    inv_freq = posenc.rope_frequencies(8, base=7919.25)
    rope = {"fmt": "float32", "layout": "half", "max_bytes": limit}
    rope_table_values(40, inv_freq, **rope)  # the core accepts 40
    with pytest.raises(posenc.MemoryLimitError):
        rope_table_values(41, inv_freq, **rope)  # not 41
    assert RotaryEmbedding(8, base=7919.25, max_length=40).table_length == 40
    with pytest.raises(posenc.MemoryLimitError, match="max_length=41"):
        RotaryEmbedding(8, base=7919.25, max_length=41)
    table = 40 * 16 * 4  # the sinusoidal table of 40 rows of 16 float32
    monkeypatch.setattr(posenc.torch._tables, "DEFAULT_MAX_BYTES", table)
    sinusoidal = {"base": 7919.25, "layout": "interleaved", "formula": "paper", "fmt": "float32"}
    table_values(40, 16, **sinusoidal, max_bytes=table)  # the core accepts 40
    with pytest.raises(posenc.MemoryLimitError):
        table_values(41, 16, **sinusoidal, max_bytes=table)  # not 41
    assert SinusoidalPositionalEncoding(16, 0.0, 40, 7919.25).table_length == 40
    with pytest.raises(posenc.MemoryLimitError, match="max_length=41"):
        SinusoidalPositionalEncoding(16, 0.0, 41, 7919.25)


def test_buffers_set_by_hand_are_the_modules_own_once_grown():
    module, other = RotaryEmbedding(8, base=8024.5), RotaryEmbedding(8, base=8024.5)
    module.cos = module.cos.clone()  # set by hand: no longer the shared tensor
    module.extend(9000)
    assert not module.shares_tables
    assert other.shares_tables
    assert other.table_length == 4096  # not grown with it
    np.testing.assert_array_equal(module.cos.numpy(), exact_rope(9000, 8, 8024.5)[0])


def test_an_unhashable_spec_is_simply_not_shared(monkeypatch):
    a, b = RotaryEmbedding(8, base=5791.5), RotaryEmbedding(8, base=5791.5)
    monkeypatch.setattr(type(a), "_share_key", lambda self: (type(self), [self.spec]))
    c, d = RotaryEmbedding(8, base=5791.5), RotaryEmbedding(8, base=5791.5)
    assert c.cos is not d.cos
    assert torch.equal(c.cos, d.cos)
    assert not c.shares_tables
    assert a.cos is b.cos


# -- compiled, exported, trained ---------------------------------------------------------------


class Stack(torch.nn.Module):
    """Layers with a position module each, of one spec: the shape of a real model."""

    def __init__(self, position, layers=2):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(
            MultiHeadAttention(16, 2, position=position()) for _ in range(layers)
        )

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


POSITIONS = {
    "rope": lambda: RotaryEmbedding(8, base=6802.5, max_length=64),
    "alibi": lambda: ALiBiBias(2),
    "t5": lambda: T5RelativeBias(2, bidirectional=False),
}


@pytest.mark.parametrize("name", POSITIONS)
def test_a_stack_sharing_tables_compiles_and_exports(name):
    stack = Stack(POSITIONS[name]).eval()
    first, second = (layer.position for layer in stack.layers)
    assert all(tables(second)[key] is t for key, t in tables(first).items())
    x = torch.randn(2, 10, 16)
    expected = stack(x)
    compiled = torch.compile(stack, fullgraph=True)
    torch.testing.assert_close(compiled(x), expected, rtol=0, atol=1e-6)
    seq = torch.export.Dim("seq", max=64)
    program = torch.export.export(stack, (x,), dynamic_shapes=({1: seq},))
    longer = torch.randn(2, 37, 16)
    assert torch.equal(program.module()(longer), stack(longer))


@pytest.mark.slow
def test_a_stack_sharing_tables_exports_to_onnx(tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    stack = Stack(POSITIONS["rope"]).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(stack, (torch.randn(2, 10, 16),), dynamo=True, verbose=False)
    path = tmp_path / "stack.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.randn(2, 10, 16)
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(out, stack(x).detach().numpy(), rtol=0, atol=1e-6)


def test_gradients_through_learned_parts_are_those_of_private_tables():
    x = torch.randn(2, 10, 16)
    grads = []
    for private in (False, True):
        stack = Stack(POSITIONS["t5"])
        if private:
            for layer in stack.layers:
                layer.position.unshare_tables()
        stack(x).square().sum().backward()
        grads.append([p.grad for p in stack.parameters()])
    assert all(torch.equal(g, h) for g, h in zip(*grads, strict=True))
    assert all(g is not None and g.abs().sum() > 0 for g in grads[0])


# -- threads ---------------------------------------------------------------------------------


def test_threads_building_and_growing_one_spec_end_with_one_exact_table():
    modules, errors = [], []
    barrier = threading.Barrier(6)

    def work(i):
        try:
            barrier.wait()
            module = RotaryEmbedding(8, base=7913.5, max_length=16 * (i + 1))
            modules.append(module)
            module.extend(100 * (i + 1))
            q = torch.ones(1, 1, 1, 8)
            module(q, q, offset=150 * i)  # past 100 (i + 1) from i = 2: grows, doubling
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len({m.cos.data_ptr() for m in modules}) == 1  # one table, read by all
    rows = max(m.table_length for m in modules)
    assert rows >= 751
    exact = exact_rope(rows, 8, 7913.5)[0]
    for m in modules:  # each its rows of it, at least those it asked for, all exact
        np.testing.assert_array_equal(m.cos.numpy(), exact[: m.table_length])


@pytest.mark.parametrize("fmt", ["float64", "float32", "float16", "bfloat16", "int64"])
def test_values_enter_pytorch_as_its_own_aligned_memory(fmt):
    from posenc.torch._backend import to_tensor

    values = np.arange(1, 25, dtype=np.int64 if fmt == "int64" else np.float32)
    values = values.astype(np.float64) if fmt == "float64" else values
    view = np.zeros(len(values) + 1, values.dtype)[1:]  # a NumPy buffer off 64 bytes
    view[...] = values
    tensor = to_tensor(view, fmt)
    assert tensor.data_ptr() % 64 == 0
    assert tensor.data_ptr() != view.ctypes.data
    np.testing.assert_array_equal(tensor.float().numpy(), values.astype(np.float32))


def test_the_examples_of_docs_tables_md_run():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "tables.md").read_text()
    blocks = [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]
    assert len(blocks) == 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/tables.md", "exec"), namespace)
    assert namespace["rope"].cos[0, 0] == 2.0
    assert RotaryEmbedding(128).cos[0, 0] == 1.0  # the shared table, untouched
