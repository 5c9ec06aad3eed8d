"""Where PyTorch's CPU FlexAttention is wrong: a sweep against SDPA, and posenc's route.

Each case calls PyTorch's own compiled ``flex_attention`` (no posenc in between but the
block mask) over many key lengths, and compares it with SDPA on the same inputs, in
float64; a call is wrong when it is off by more than the dtype allows (float32: 1e-5,
the kernel's ``exp`` having up to 20 ulp of error) or NaN. The cases cross head dims,
query counts, key lengths, block masks and their tiles, ``score_mod``, batch and heads
(grouped keys with ``enable_gqa``) and dtypes. Then ``posenc.torch.flex_attention``,
which pads head dims under 24, runs the cases of those head dims again, and must be
right in every one.

``tests/torch/test_flex_cpu.py`` keeps a part of this sweep in the suite, with the
domain expected from PyTorch 2.13's source; this script is the wider map behind
``docs/reliability.md`` ("FlexAttention on the CPU"). It compiles about 100 programs:
855 s on this project's 2-core CPU, 144 to 288 s with the compile cache warm.

Run: ``python benchmarks/sweep_flex_cpu.py [--out FILE.md] [--quick]``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention.flex_attention import create_block_mask
from torch.nn.attention.flex_attention import flex_attention as flex
from torch.nn.functional import scaled_dot_product_attention as sdpa

from posenc.torch import ALiBiBias
from posenc.torch import flex as posenc_flex
from posenc.torch.masks import (
    all_keys,
    block_mask,
    causal,
    dense_mask,
    documents,
    mask_mod,
    sliding_window,
)

HEAD_DIMS = (4, 8, 12, 16, 20, 24, 32, 48, 64, 80, 96, 128, 256)
KEYS = (300, 264, 257, 256, 255, 200, *range(140, 0, -1))  # longest first (one program)
FEW = (264, 200, 136, 129, 128, 127, 120, 72, 40, 24, 17, 16, 9, 8, 3)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float64: 1e-12}


def case(
    head_dim: int,
    queries: int | None,
    keys: tuple[int, ...],
    *,
    mask: Callable[[int], Any] = lambda n: all_keys(),
    tiles: int | None = 128,
    alibi: bool = False,
    batch: int = 1,
    heads: int = 2,
    key_heads: int | None = None,
    dtype: torch.dtype = torch.float32,
    attend: Any = None,
) -> list[int]:
    """The key lengths a call of this case gets wrong (``queries=None``: as many as keys).

    ``tiles``: the block mask's key tile (128: posenc's; None: PyTorch's default mask).
    """
    key_heads = key_heads or heads
    wrong = []
    for n in keys:
        t = n if queries is None else queries
        if n < t:
            continue
        g = torch.Generator().manual_seed(n)
        q = torch.randn(batch, heads, t, head_dim, generator=g).to(dtype)
        k, v = (torch.randn(batch, key_heads, n, head_dim, generator=g).to(dtype) for _ in "kv")
        options: dict[str, Any] = {}
        bias = torch.zeros(())
        if alibi:
            options["score_mod"] = ALiBiBias(heads).score_mod(t, n)
            bias = ALiBiBias(heads)(t, n).double()
        if key_heads != heads:
            options["enable_gqa"] = True
        if tiles == 128:
            options["block_mask"] = block_mask(mask(n), t, n)
        elif tiles is not None:
            options["block_mask"] = create_block_mask(
                mask_mod(mask(n), t, n), 1, 1, t, n, device="cpu", BLOCK_SIZE=tiles
            )
        with torch.no_grad():
            out = (attend or raw)(q, k, v, **options).double()
        allowed = dense_mask(mask(n), t, n, batch=batch)
        hidden = torch.where(allowed, 0.0, float("-inf")).double() + bias
        expand = heads // key_heads
        want = sdpa(q.double(), k.double().repeat_interleave(expand, 1),
                    v.double().repeat_interleave(expand, 1), attn_mask=hidden)  # fmt: skip
        if not (out - want).abs().max().item() < TOLERANCE[dtype]:
            wrong.append(n)
    return sorted(wrong)


#: PyTorch's own FlexAttention, compiled as posenc compiles it.
raw = torch.compile(flex, dynamic=True)


Cases = list[tuple[str, dict[str, Any]]]


def query_count(count: int) -> str:
    return "1 query" if count == 1 else f"{count} queries"


def head_dim_cases(quick: bool) -> Cases:
    """Every head dim, one query and two, every key length (the fault's domain)."""
    dims, keys = ((8, 16, 24, 64), FEW) if quick else (HEAD_DIMS, KEYS)
    return [(f"head dim {d}, {query_count(t)}", {"head_dim": d, "queries": t, "keys": keys})
            for d in dims for t in (1, 2)]  # fmt: skip


def mask_cases() -> Cases:
    """More queries, as many as keys, masks and a ``score_mod``."""
    masks = {
        "causal": lambda n: causal(),
        "causal sliding window of 6, 2 sinks": lambda n: causal() & sliding_window(6, sinks=2),
        "causal, documents of 5": lambda n: causal() & documents(torch.arange(n) // 5),
    }
    out: Cases = []
    for d in (8, 64):
        out += [(f"head dim {d}, {t} queries", {"head_dim": d, "queries": t, "keys": FEW})
                for t in (3, 5)]  # fmt: skip
        square = {"head_dim": d, "queries": None, "keys": FEW, "mask": masks["causal"]}
        out.append((f"head dim {d}, as many queries as keys, causal", square))
        out += [(f"head dim {d}, 3 queries, {name}",
                 {"head_dim": d, "queries": 3, "keys": FEW, "mask": mask})
                for name, mask in masks.items()]  # fmt: skip
        out.append((f"head dim {d}, 3 queries, causal, ALiBi score_mod",
                    {"head_dim": d, "queries": 3, "keys": FEW, "alibi": True,
                     "mask": masks["causal"]}))  # fmt: skip
    return out


def layout_cases() -> Cases:
    """Batch and heads, grouped keys, dtypes, PyTorch's default mask, 64-key tiles."""
    out: Cases = []
    for d in (8, 16, 64):
        many = {"head_dim": d, "queries": 2, "keys": FEW, "batch": 2, "heads": 8}
        out.append((f"head dim {d}, batch 2 × 8 heads", many))
        out.append((f"head dim {d}, 8 query heads over 2 key heads (enable_gqa)",
                    {**many, "key_heads": 2}))  # fmt: skip
    out += [(f"head dim {d}, 2 queries, {str(dtype)[6:]}",
             {"head_dim": d, "queries": 2, "keys": FEW, "dtype": dtype})
            for dtype in (torch.bfloat16, torch.float16) for d in (4, 8, 16, 24)]  # fmt: skip
    for d in (8, 64):
        out += [(f"head dim {d}, {query_count(t)}, PyTorch's default mask (one tile)",
                 {"head_dim": d, "queries": t, "keys": (*FEW, 152, 168, 280), "tiles": None})
                for t in (1, 2)]  # fmt: skip
        out.append((f"head dim {d}, 2 queries, 64-key tiles",
                    {"head_dim": d, "queries": 2, "keys": (*FEW, 56, 65, 72, 88, 192),
                     "tiles": 64}))  # fmt: skip
    return out


def outcome(attend: Any) -> str:
    """What a float64 call gives: the exception it raises (the CPU kernel takes none)."""
    q = torch.randn(1, 2, 2, 8, dtype=torch.float64)
    try:
        with torch.no_grad():
            case_error = (attend(q, q, q).double() - sdpa(q, q, q)).abs().max().item()
    except Exception as error:  # the table says what was raised
        return f"raises {type(error).__name__}"
    return f"runs, off by {case_error:.2g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    parser.add_argument("--quick", action="store_true", help="fewer head dims and lengths")
    args = parser.parse_args()
    torch._dynamo.config.recompile_limit = 10_000
    torch._dynamo.config.accumulated_recompile_limit = 100_000
    start = time.time()
    lines = [
        f"PyTorch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads",
        "",
        "| case | raw FlexAttention wrong at key lengths | posenc's flex_attention |",
        "|---|---|---|",
    ]
    for label, arguments in head_dim_cases(args.quick) + mask_cases() + layout_cases():
        try:
            wrong = ", ".join(map(str, case(**arguments))) or "none"
        except Exception as error:  # the table says what the kernel raised
            wrong = f"raises {type(error).__name__}"
        # posenc pads head dims under 24 (the others are the raw calls), takes no grouped
        # keys, and passes 128-key tiles
        routed = "not padded"
        if "key_heads" in arguments or "tiles" in arguments:
            routed = ""
        elif arguments["head_dim"] < posenc_flex.SAFE_HEAD_DIM:
            bad = case(**arguments, attend=posenc_flex.flex_attention)
            routed = "right" if not bad else "WRONG at " + ", ".join(map(str, bad))
        lines.append(f"| {label} | {wrong} | {routed} |")
        print(lines[-1], flush=True)
    lines.append(f"| head dim 8, 2 queries, float64 | {outcome(raw)} | "
                 f"{outcome(posenc_flex.flex_attention)} |")  # fmt: skip
    print(lines[-1], flush=True)
    lines += ["", f"{time.time() - start:.0f} s"]
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
