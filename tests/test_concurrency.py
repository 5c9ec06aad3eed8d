"""Concurrency: what posenc promises to threads and to forked processes.

The core's functions may be called from any number of threads at once and give the same
bits as one call at a time (large tables are filled by a shared thread pool, which the
callers then share); a process forked after the pool started builds its own; a PyTorch
module shared by threads (a server answering requests with one model) gives each call the
rows it asks for while its tables grow (``tests/torch/test_tables.py`` forces the
interleaving that used to shrink them).
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import posenc

# entries >= 2**18 are filled by the pool (posenc.core.phasors._PARALLEL_ENTRIES)
SIZES = [(300, 16), (5000, 64), (2**13, 64), (2**14, 32)]


def test_threads_calling_the_core_at_once_get_the_bits_of_one_call_at_a_time():
    serial = {size: posenc.sinusoidal(*size, dtype="float32") for size in SIZES}
    rope = {size: posenc.rope_tables(size[0], posenc.rope_frequencies(size[1])) for size in SIZES}

    def job(i: int) -> tuple[tuple[int, int], np.ndarray, tuple[np.ndarray, ...]]:
        size = SIZES[i % len(SIZES)]
        table = posenc.sinusoidal(*size, dtype="float32")
        return size, table, posenc.rope_tables(size[0], posenc.rope_frequencies(size[1]))

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(job, range(32)))
    for size, table, tables in results:
        np.testing.assert_array_equal(table, serial[size])
        for got, expected in zip(tables, rope[size], strict=True):
            np.testing.assert_array_equal(got, expected)


# Run in a fresh interpreter: the test process may hold other frameworks' threads (JAX),
# which a fork does not copy either.
FORK_AFTER_POOL = """
import multiprocessing, sys
import numpy as np
import posenc

expected = posenc.sinusoidal(2**13, 64, dtype="float32")  # starts the pool here
context = multiprocessing.get_context("fork")
queue = context.Queue()
child = context.Process(
    target=lambda: queue.put(posenc.sinusoidal(2**13, 64, dtype="float32"))
)
child.start()
got = queue.get(timeout=60)
child.join(timeout=60)
assert child.exitcode == 0, child.exitcode
np.testing.assert_array_equal(got, expected)
print("same")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="fork is the default start method on Linux")
def test_a_process_forked_after_the_pool_started_builds_the_same_table():
    result = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_POOL], capture_output=True, text=True, timeout=120
    )
    assert (result.returncode, result.stdout.strip()) == (0, "same"), result.stderr


def test_threads_sharing_a_torch_module_get_their_rows_while_it_grows():
    torch = pytest.importorskip("torch")
    from posenc.torch import RotaryEmbedding

    rng = np.random.default_rng(0)
    reference = RotaryEmbedding(8, max_length=1200)
    q = torch.randn(1, 2, 5, 8)
    for _ in range(5):
        shared = RotaryEmbedding(8, max_length=16)  # grows from 16 rows, call after call
        offsets = [int(x) for x in rng.integers(0, 1100, 24)]
        with ThreadPoolExecutor(8) as pool:
            got = list(
                pool.map(lambda offset, module=shared: module(q, q, offset=offset)[0], offsets)
            )
        for offset, rotated in zip(offsets, got, strict=True):
            assert torch.equal(rotated, reference(q, q, offset=offset)[0]), offset
