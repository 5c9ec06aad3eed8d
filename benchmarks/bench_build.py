"""Building RoPE's tables: posenc's ``RotaryEmbedding`` against Hugging Face's rotary module.

8,192 positions × head_dim 128, base 10000, float32, one torch thread. Contenders:

* ``posenc cold``: ``RotaryEmbedding(128, max_length=8192, base=...)`` with a spec no
  live module has, so that the tables are computed: modules of one spec share one set of
  tables, and a second module of a live spec computes nothing. Each call takes a fresh
  spec, ``base = 10000 + i·1e-6`` for its ``i``-th call (the same work: only the values
  move, by about 1e-10), and the module is dropped after the call (its tables with it).
  ``unshare_tables()`` could not make a build cold: the tables are built (or found) in
  ``__init__``, before it can be called.
* ``posenc warm``: ``RotaryEmbedding(128, max_length=8192)`` while a module of that spec
  is alive: the module's own cost, its tables found and reused (the report says whether
  they were).
* ``HF rotary + call``: ``LlamaRotaryEmbedding(config)`` and then ``rotary(x,
  position_ids)`` for positions ``0 .. 8191``, which is where Hugging Face computes its
  cos/sin (the module holds only ``inv_freq``); the config and ``position_ids`` are made
  before timing.

and, to say where the cold build's time goes:

* ``core rope_table_values``: ``posenc.core.rope.rope_table_values(8192, inv_freq,
  fmt="float32", layout="half")``, the NumPy tables (float64 angles, exact reduction,
  rounded once) that the module's tables hold.
* ``core into torch``: the same with ``out=`` NumPy views of two ``torch.empty(8192,
  128)`` tensors: the tables computed straight into memory PyTorch allocated, as the
  module builds them (left out where the core has no ``out=``).
* ``copy into torch``: ``torch.empty(8192, 128).copy_(torch.from_numpy(table))`` for cos
  and sin: moving tables the core allocated into memory PyTorch allocated, the other way
  to get them there.

The rest of the cold build (the module, its arguments and spec, the frequencies, the
registry of shared tables) is the cold time less ``core into torch`` (or, with a core
without ``out=``, less ``core rope_table_values``).

Allocation weighs: a build allocates megabytes, and under glibc's default allocator
whether they come as fresh pages (a page fault each 4 KiB) depends on what the process
freed before (glibc's mmap threshold moves with it), so the time of one contender moves
with its neighbours (Hugging Face's module + call took 2 to 8 ms on one machine). The
contenders are therefore timed twice, each time in a fresh process: with glibc's
default allocator, and with freed memory kept (``MALLOC_MMAP_MAX_=0`` and a huge
``MALLOC_TRIM_THRESHOLD_``, as ``bench_rope.py`` does), which measures the work itself.

Tables are checked before timing: a warm module's equal to the live one's, a cold one's
new and within 1e-6 of them, Hugging Face's within its float32 angles' error. Timed
with ``_timing.round_robin``; the target: the
cold build at most 1.5 × Hugging Face's module + call.

Usage::

    python benchmarks/bench_build.py [--output FILE] [--quick]
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import Contender, fmt_time, machine_info, markdown_table, round_robin
from bench_memory import write_atomically
from posenc.core.rope import rope_table_values
from posenc.torch import RotaryEmbedding

HEAD_DIM = 128
LENGTH = 8192
BASE = 10000.0
TARGET = 1.5  # posenc cold build / HF module + call
COLD = "posenc cold"
WARM = "posenc warm"
HF = "HF rotary + call"
CORE = "core rope_table_values"
COPY = "copy into torch"
CORE_OUT = "core into torch"
# glibc's default allocator, and one that keeps freed memory (reused without new page
# faults, as a caching allocator does): where a build's tensors land, and whether their
# pages are new, depends on what ran before it under the default one.
ALLOCATORS: dict[str, dict[str, str]] = {
    "glibc default": {},
    "memory kept": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**40)},
}


def _hf() -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """``make()`` building Hugging Face's rotary module and calling it for the positions."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=32 * HEAD_DIM,
        num_attention_heads=32,
        head_dim=HEAD_DIM,
        max_position_embeddings=LENGTH,
        rope_parameters={"rope_type": "default", "rope_theta": BASE},
    )
    x = torch.empty(1, 1, HEAD_DIM)  # read for its dtype and device only
    position_ids = torch.arange(LENGTH).unsqueeze(0)

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        rotary = LlamaRotaryEmbedding(config)
        cos, sin = rotary(x, position_ids)
        return cos, sin

    return make


def contenders() -> tuple[list[Contender], RotaryEmbedding, bool]:
    """The contenders, the live module of the warm builds, and whether they reuse its
    tables."""
    keep = RotaryEmbedding(HEAD_DIM, max_length=LENGTH)
    fresh = itertools.count(1)

    def cold() -> RotaryEmbedding:
        return RotaryEmbedding(HEAD_DIM, base=BASE + next(fresh) * 1e-6, max_length=LENGTH)

    def warm() -> RotaryEmbedding:
        return RotaryEmbedding(HEAD_DIM, max_length=LENGTH)

    inv_freq = keep.inv_freq
    cos_np, sin_np = rope_table_values(LENGTH, inv_freq, fmt="float32", layout="half")

    def core() -> tuple[np.ndarray, np.ndarray]:
        return rope_table_values(LENGTH, inv_freq, fmt="float32", layout="half")

    def copy() -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.empty(cos_np.shape).copy_(torch.from_numpy(cos_np)),
            torch.empty(sin_np.shape).copy_(torch.from_numpy(sin_np)),
        )

    def core_out() -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = torch.empty(cos_np.shape), torch.empty(sin_np.shape)
        rope_table_values(
            LENGTH, inv_freq, fmt="float32", layout="half", out=(cos.numpy(), sin.numpy())
        )
        return cos, sin

    has_out = "out" in inspect.signature(rope_table_values).parameters
    hf = _hf()

    # Checks: a cold module really computes (its tables are not the live module's, and
    # are within rounding of them), a warm one equals the live one, HF agrees.
    first = cold()
    assert first.cos is not keep.cos
    torch.testing.assert_close(first.cos, keep.cos, atol=1e-6, rtol=0)
    second = warm()
    assert torch.equal(second.cos, keep.cos)
    assert torch.equal(second.sin, keep.sin)
    reused = second.cos.data_ptr() == keep.cos.data_ptr()
    assert np.array_equal(core()[0], keep.cos.numpy())
    if has_out:
        assert torch.equal(core_out()[1], keep.sin)
    hf_cos, hf_sin = hf()
    # HF forms the angle in float32: off by about position · 2^-24 at position 8191.
    torch.testing.assert_close(hf_cos[0], keep.cos, atol=2e-3, rtol=0)
    torch.testing.assert_close(hf_sin[0], keep.sin, atol=2e-3, rtol=0)
    del first, second

    group = [
        Contender(COLD, cold, threads=1),
        Contender(WARM, warm, threads=1),
        Contender(HF, hf, threads=1),
        Contender(CORE, core, threads=1),
        Contender(COPY, copy, threads=1),
    ]
    if has_out:
        group.append(Contender(CORE_OUT, core_out, threads=1))
    return group, keep, reused


def _share(part: float, whole: float) -> str:
    """``part`` as a time and a share of ``whole``."""
    return f"{fmt_time(part)} ({part / whole:.0%} of cold)"


def worker(budget: float, min_rounds: int) -> dict[str, Any]:
    """One allocator's run: the samples of every contender, JSON-able."""
    torch.set_num_threads(1)
    with torch.no_grad():
        group, keep, reused = contenders()
        round_robin(group, min_rounds=min_rounds, max_rounds=400, budget_s=budget)
    del keep
    return {
        "reused": reused,
        "contenders": {c.name: {"samples": c.samples, "number": c.number} for c in group},
    }


def _spawn(allocator: str, budget: float, min_rounds: int) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(budget)]
    command.append(str(min_rounds))
    env = dict(os.environ, **ALLOCATORS[allocator])
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"the {allocator} run failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(budget: float, min_rounds: int) -> tuple[str, str]:
    """Returns (the contenders' tables, the summary table) as Markdown: one fresh process
    per allocator setting, each timing every contender interleaved."""
    parts, summary = [], []
    for allocator in ALLOCATORS:
        result = _spawn(allocator, budget, min_rounds)
        group = []
        for name, data in result["contenders"].items():
            group.append(Contender(name, lambda: None, number=data["number"]))
            group[-1].samples = data["samples"]
        by = {c.name: c for c in group}
        hf = by[HF]
        rows = [
            [
                c.name,
                fmt_time(c.median),
                fmt_time(c.min),
                f"{fmt_time(c.quartiles[0])} – {fmt_time(c.quartiles[1])}",
                f"{c.median / hf.median:.2f}",
                f"{c.min / hf.min:.2f}",
                len(c.samples),
                c.number,
            ]
            for c in group
        ]
        table = markdown_table(
            ["contender", "median", "min", "IQR", "median / HF", "min / HF", "rounds", "calls"],
            rows,
        )
        parts.append(f"### {allocator}\n\n{table}\n")
        print(parts[-1], flush=True)
        cold, core, copy = by[COLD], by[CORE], by[COPY]
        if CORE_OUT in by:  # the module's way: the core writes into torch's memory
            computed, how = by[CORE_OUT].median, "core into torch"
        else:  # a core without out=: the module's tables hold the core's arrays
            computed, how = core.median, "core"
        rest = cold.median - computed
        ratio, best = cold.median / hf.median, cold.min / hf.min
        summary.append(
            [
                allocator,
                fmt_time(cold.median),
                fmt_time(hf.median),
                f"{ratio:.2f}",
                f"{best:.2f}",
                "met" if ratio <= TARGET else f"missed by {ratio / TARGET:.2f}×",
                f"{fmt_time(by[WARM].median)} ({by[WARM].median / hf.median:.3f})",
                "yes" if result["reused"] else "no",
                _share(core.median, cold.median),
                _share(by[CORE_OUT].median, cold.median) if CORE_OUT in by else "–",
                _share(copy.median, cold.median),
                f"{_share(rest, cold.median)}, cold less {how}",
            ]
        )
    table = markdown_table(
        [
            "allocator",
            "cold",
            "HF",
            "cold / HF (median)",
            "cold / HF (best of)",
            f"target ≤ {TARGET}",
            "warm (/ HF)",
            "warm reuses the live table",
            "core",
            "core into torch",
            "copy into torch",
            "cold: the rest (module, spec, registry)",
        ],
        summary,
    )
    return "\n".join(parts), table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, help="also write the Markdown report here")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (a few seconds)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:  # one allocator's run, started by run(); prints one line of JSON
        print(json.dumps(worker(float(args.worker[0]), int(args.worker[1]))))
        return 0
    budget, min_rounds = (3.0, 5) if args.quick else (40.0, 30)
    command = "python benchmarks/bench_build.py" + " --quick" * args.quick

    start = time.perf_counter()
    tables, summary = run(budget, min_rounds)
    total = time.perf_counter() - start
    text = f"### Summary\n\n{summary}\n\n{tables}"
    print(f"### Summary\n\n{summary}\n\ntotal {total:.0f} s")
    if args.output:
        report = "\n".join(
            [
                "## Building RoPE tables, 8,192 × 128 float32 (`bench_build.py`)",
                "",
                f"Command: `{command}` (total {total:.0f} s).",
                "",
                machine_info((1,)),
                "",
                "One torch thread, timed interleaved (`_timing.round_robin`) in one fresh "
                "process per allocator setting. `posenc cold` builds a module of a spec no "
                "live module has (base 10000 + i·1e-6 for the i-th call), `posenc warm` one "
                "of the spec of a live module; Hugging Face builds "
                "`LlamaRotaryEmbedding(config)` and calls it for positions 0..8191 (where "
                "it computes cos/sin). `core rope_table_values`, `core into torch` and "
                "`copy into torch` are the parts of a cold build that compute the tables "
                "and put them in PyTorch's memory.",
                "",
                text,
            ]
        )
        write_atomically(args.output, report)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
