"""The core's one table cache (posenc.core.tables), framework-free: entries, holders,
growth for all, the memory limit, private copies, owners, freeing and the recent few.

The front ends' own behaviours over it are tested in tests/torch/test_shared_tables.py,
tests/keras/test_tables.py and tests/jax.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import posenc
from posenc._checks import MemoryLimitError
from posenc.core.plan import plan_rows
from posenc.core.tables import CACHE, Entry, Holder, TableCache


def sinusoidal_build(rows, fmt):
    """The seeds' table (d_model 8) as the cache's build: the core's exact values."""
    return (posenc.sinusoidal(rows, 8, dtype=fmt),)


def test_holders_of_one_key_read_one_entry_each_its_own_rows():
    cache = TableCache()
    long = cache.hold(("sin", 8), sinusoidal_build, 64)
    short = cache.hold(("sin", 8), sinusoidal_build, 16)
    assert long.shares_with(short)
    assert len(cache) == 1
    assert long.entry.rows == 0  # built on first use
    long.get("float32")
    (table,) = short.get("float32")
    assert table.shape == (64, 8)  # the entry's rows; the holder reads its first 16
    assert short.length == 16
    np.testing.assert_array_equal(table, posenc.sinusoidal(64, 8, dtype="float32"))
    assert short.get("float32")[0] is long.get("float32")[0]  # built once
    other = cache.hold(("sin", 16), sinusoidal_build, 16)
    assert not other.shares_with(long)
    assert len(cache) == 2


def test_growth_for_one_holder_is_growth_for_all_and_builds_every_format_first():
    cache = TableCache()
    a, b = (cache.hold(("sin",), sinusoidal_build, 8) for _ in range(2))
    a.get("float32")
    b.get("float64")
    b.extend(20)
    assert a.length == b.length == 20 == a.entry.rows
    for fmt in ("float32", "float64"):
        np.testing.assert_array_equal(a.get(fmt)[0], posenc.sinusoidal(20, 8, dtype=fmt))
    late = cache.hold(("sin",), sinusoidal_build, 4)  # joins after the growth: its own 4
    assert late.length == 4


def test_the_planners_growth_rule_is_the_holders():
    cache = TableCache()
    holder = cache.hold(("sin",), sinusoidal_build, 16)
    holder.get("float32")
    assert holder.holds(plan_rows(16, start=3, count=4), "float32")
    assert holder.holds(plan_rows(16, start=20, count=4), "float32")  # grows: doubling
    assert holder.length == 32
    far = plan_rows(32, low=0, high=10**6, count=2)  # two far-apart positions
    assert not holder.holds(far, "float32")
    assert holder.length == 32


def test_a_length_the_memory_limit_refuses_is_that_holders_error_alone():
    def build(rows, fmt):
        if rows > 100:
            raise MemoryLimitError("the table of sinusoidal rows needs too much memory")
        return sinusoidal_build(rows, fmt)

    cache = TableCache()
    small = cache.hold(("sin",), build, 10)
    small.get("float32")
    huge = cache.hold(("sin",), build, 1000)
    with pytest.raises(MemoryLimitError, match="max_length=1000"):
        huge.get("float32")
    assert small.get("float32")[0].shape == (10, 8)  # the others' tables stay
    with pytest.raises(MemoryLimitError):
        small.extend(500)  # extend: nothing replaced when refused
    assert small.length == 10
    assert small.entry.rows == 10


def test_entries_are_freed_with_their_last_holder_unless_kept_recent():
    cache = TableCache()
    holders = [cache.hold(("sin", n), sinusoidal_build, 4) for n in range(3)]
    assert len(cache) == 3
    del holders
    assert len(cache) == 0  # by reference counting: no cycle
    for n in range(4):  # JAX's use: no module owns its tables; the 2 most recent stay
        cache.hold(("sin", n), sinusoidal_build, 4, keep=2).get("float32")
    gc.collect()
    assert len(cache) == 2
    assert cache.find(("sin", 3)) is not None
    assert cache.find(("sin", 0)) is None


def test_unhashable_or_none_keys_give_a_private_entry():
    cache = TableCache()
    a = cache.hold(None, sinusoidal_build, 4)
    b = cache.hold(None, sinusoidal_build, 4)
    assert not a.shares_with(b)
    assert not a.shared
    assert len(cache) == 0


def test_a_private_copy_is_new_memory_that_nobody_else_grows():
    cache = TableCache()
    shared = cache.hold(("sin",), sinusoidal_build, 8)
    original = shared.get("float32")[0]
    own = shared.private_copy(np.copy)
    assert own.get("float32")[0] is not original
    np.testing.assert_array_equal(own.get("float32")[0], original)
    shared.extend(30)
    assert own.length == 8
    assert own.entry.rows == 8
    assert not own.shared
    own.extend(12)  # grows by the same build, alone
    np.testing.assert_array_equal(own.get("float32")[0], posenc.sinusoidal(12, 8, dtype="float32"))
    assert shared.length == 30


def test_tables_a_front_end_must_not_keep_are_built_each_time():
    calls = []

    def build(rows, fmt):
        calls.append(rows)
        return sinusoidal_build(rows, fmt)

    holder = TableCache().hold(("sin",), build, 4, kept=lambda tables: False)
    holder.get("float32")
    holder.get("float32")
    assert calls == [4, 4]
    assert holder.entry.formats == {}


class Module:
    """An owner as PyTorch's modules are: it builds the tables and is told of changes."""

    def __init__(self, cache, length):
        self.seen = []
        self.holder = cache.hold(("owned",), None, length, self)

    def _build_tables(self, rows, fmt):
        return sinusoidal_build(rows, fmt)

    def _tables_changed(self):
        self.seen.append(self.holder.length)


def test_owners_build_the_tables_and_are_told_when_they_change_never_kept_alive():
    cache = TableCache()
    first, second = Module(cache, 8), Module(cache, 8)
    np.testing.assert_array_equal(
        second.holder.get("float64")[0], posenc.sinusoidal(8, 8, dtype="float64")
    )
    first.holder.extend(40)
    assert first.seen[-1] == second.seen[-1] == 40
    del first  # the entry is built by any owner still alive
    second.holder.extend(100)
    np.testing.assert_array_equal(
        second.holder.get("float64")[0], posenc.sinusoidal(100, 8, dtype="float64")
    )
    entry = second.holder.entry
    assert isinstance(entry, Entry)
    assert all(isinstance(h, Holder) for h in entry.holders)
    del second, entry
    assert len(cache) == 0


def test_threads_growing_one_entry_end_with_the_longest_exact_table():
    cache = TableCache()
    holders = [cache.hold(("sin",), sinusoidal_build, 8) for _ in range(8)]
    holders[0].get("float32")
    threads = [
        threading.Thread(target=holder.extend, args=(16 * (n + 1),))
        for n, holder in enumerate(holders)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {holder.length for holder in holders} == {128}
    np.testing.assert_array_equal(
        holders[3].get("float32")[0], posenc.sinusoidal(128, 8, dtype="float32")
    )


def test_every_front_end_keeps_its_tables_in_the_one_cache():
    torch = pytest.importorskip("torch")
    from posenc.torch import RotaryEmbedding

    rope = RotaryEmbedding(8, base=97531.5, max_length=16)
    assert CACHE.holds(rope._holder.entry)
    (cos, _) = rope._holder.entry.formats[torch.float32, torch.device("cpu")]
    assert cos is rope.cos
