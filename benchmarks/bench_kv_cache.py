"""What keeping a KV cache exact costs: re-rotation against recomputing, per cached token
and per decoding step.

* **Per cached token**: keys (1, 8, S, 128) float32 held with dynamic NTK's frequencies of
  one length, moved to those of another (S = 1,024, 4,096, 16,384; one thread):
  ``RotaryEmbedding.rerotate_keys`` (posenc's exact angle differences, from the core in
  float64) against ``rotate_keys`` on the keys before rotation (what ``"recompute"``
  does) and against the float32 re-rotation transformers' former ``SinkCache`` did
  (the model's float32 tables at both positions, combined; not exact, for scale).
* **Per decoding step**: one token through ``MultiHeadAttention(1024, 8)`` with a cache
  of S keys, RoPE with dynamic NTK past its original length (so that every step changes
  the frequencies), for ``on_frequency_change`` = ``keep``, ``rerotate`` and
  ``recompute``; and a full window (``KVCache(window=S - 4, sinks=4)``, every step evicts
  one token and moves the others) against a plain cache of the same length.
  The cache is put back to the same S keys before every step.

Run: ``python benchmarks/bench_kv_cache.py [--budget SECONDS] [--out FILE.md]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import Contender, fmt_time, machine_info, markdown_table, round_robin
from kv_cache_demo import float32_rerotation
from posenc.torch import KVCache, MultiHeadAttention, RotaryEmbedding

SIZES = (1024, 4096, 16384)


def dynamic(original: int, rows: int) -> RotaryEmbedding:
    params = {"factor": 4.0, "original_max_position_embeddings": original}
    return RotaryEmbedding(128, scaling="dynamic_ntk", scaling_params=params, max_length=rows)


def per_token(size: int, budget: float) -> list[list[str]]:
    rope = dynamic(size // 2, 16)  # the original length: half the cache
    generator = torch.Generator().manual_seed(0)
    raw = torch.randn(1, 8, size, 128, generator=generator)
    before, after = rope.frequency_state(size), rope.frequency_state(size + 1)
    held = rope.rotate_keys(raw, frequencies=before)
    positions = torch.arange(size)
    calls = {
        "rerotate (posenc)": lambda: rope.rerotate_keys(
            held, frequencies=before, new_frequencies=after
        ),
        "recompute (posenc)": lambda: rope.rotate_keys(raw, frequencies=after),
        "float32 tables, as SinkCache": lambda: float32_rerotation(
            held, positions, positions - 1, rope.inv_freq
        ),
    }
    want = calls["recompute (posenc)"]()
    torch.testing.assert_close(calls["rerotate (posenc)"](), want, rtol=0, atol=1e-5)
    contenders = [Contender(name, call, 1) for name, call in calls.items()]
    round_robin(contenders, budget_s=budget, min_rounds=10, min_sample_s=0.05)
    base = contenders[1].median
    return [
        [
            f"{size:,}",
            c.name,
            fmt_time(c.median),
            fmt_time(c.median / size),
            f"{c.median / base:.2f}",
        ]
        for c in contenders
    ]


def step_contender(name: str, module: MultiHeadAttention, cache: KVCache, x: torch.Tensor) -> Any:
    """A decoding step from the cache as it is now, put back before each call."""
    state = dict(vars(cache))

    def call() -> None:
        vars(cache).update(state)
        module(x, cache=cache)

    return Contender(name, call, 1)


def per_step(size: int, budget: float) -> list[list[str]]:
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randn(1, size, 1024, generator=generator)
    x = torch.randn(1, 1, 1024, generator=generator)
    contenders = []
    with torch.no_grad():
        for mode in ("keep", "rerotate", "recompute"):
            torch.manual_seed(0)
            module = MultiHeadAttention(1024, 8, position=dynamic(size // 2, size + 64)).eval()
            cache = KVCache(on_frequency_change=mode)
            module(prompt, cache=cache)
            contenders.append(step_contender(f"dynamic NTK, {mode}", module, cache, x))
        torch.manual_seed(0)
        plain = MultiHeadAttention(1024, 8, position=RotaryEmbedding(128, max_length=size + 64))
        for name, cache in (
            ("plain cache, fixed RoPE", KVCache()),
            ("full window, fixed RoPE", KVCache(window=size - 4, sinks=4)),
        ):
            plain.eval()(prompt, cache=cache)
            contenders.append(step_contender(name, plain, cache, x))
    torch.set_grad_enabled(False)
    round_robin(contenders, budget_s=budget, min_rounds=10, min_sample_s=0.05)
    torch.set_grad_enabled(True)
    base = contenders[0].median
    return [[f"{size:,}", c.name, fmt_time(c.median), f"{c.median / base:.2f}"] for c in contenders]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=10.0, help="seconds per table row group")
    parser.add_argument("--out", type=Path, help="write the Markdown report here too")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokens = [row for size in SIZES for row in per_token(size, args.budget)]
    steps = [row for size in SIZES for row in per_step(size, args.budget)]
    report = (
        "Moving S cached keys (1, 8, S, 128) float32 to new dynamic-NTK frequencies, 1 "
        "thread:\n\n"
        + markdown_table(["S", "how", "median", "per cached token", "/ recompute"], tokens)
        + "\n\nOne decoding step of MultiHeadAttention(1024, 8) with S cached keys, 1 thread "
        "(dynamic NTK with its original length at S/2: every step changes the "
        "frequencies):\n\n"
        + markdown_table(["S", "step", "median", "/ keep"], steps)
        + f"\n\n{machine_info([1])}\n"
    )
    print(report)
    if args.out is not None:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
