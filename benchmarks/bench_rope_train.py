"""RoPE forward, and forward + backward (training), of q and k: posenc (eager and fused)
against Hugging Face (eager and ``torch.compile``), and a copy of the same bytes.

q (4, 8, 2048, 64) and k (4, 8, 2048, 64) float32 (batch, heads, seq, head_dim; base
10000). Forward: each contender rotates both under ``torch.no_grad()``. Forward +
backward: q and k require grad, each contender rotates both, then backpropagates given
output gradients into q and k (``torch.autograd.backward``); the gradients are reset
between calls. Contenders:

* ``posenc``: ``RotaryEmbedding(64)(q, k)``; its backward is the rotation by the
  opposite angles from the same tables (:mod:`posenc.torch.rotation`).
* ``posenc fused``: ``RotaryEmbedding(64, fused=True)``: one kernel per tensor, made by
  ``torch.compile`` from the formula (same bits as eager), forward and backward.
* ``HF eager``: ``apply_rotary_pos_emb(q, k, cos, sin)`` from ``transformers``' Llama,
  ``cos, sin`` from ``LlamaRotaryEmbedding`` computed once before timing (the per-layer
  cost in a model), autograd through its formula.
* ``HF compiled``: the same function under ``torch.compile`` (inductor, CPU).
* ``copy``: ``copy_`` of q and k into preallocated tensors (forward), twice (forward +
  backward: the backward reads and writes as much again): the memory-bound floor.

Before timing, posenc's outputs and gradients are checked against Hugging Face's to
within float32 angle error. Timed round-robin at one thread. Ratios to HF eager and to
the copy are printed with the machine and versions.

Run: ``python benchmarks/bench_rope_train.py [--threads 1] [--out FILE.md]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import Contender, fmt_time, machine_info, markdown_table, round_robin
from posenc.torch import RotaryEmbedding

SHAPE = (4, 8, 2048, 64)


def steps(q, k, gq, gk, apply):
    """``(forward, forward + backward)`` calls of ``apply() -> (q_rot, k_rot)``."""

    def forward() -> None:
        with torch.no_grad():
            apply()

    def train() -> None:
        q.grad = k.grad = None
        out_q, out_k = apply()
        torch.autograd.backward((out_q, out_k), (gq, gk))

    return forward, train


def copies(q, k):
    """``(forward, forward + backward)`` memory floors: q and k copied once, twice."""
    q_copy, k_copy = torch.empty_like(q), torch.empty_like(k)

    def copy(times: int):
        def step() -> None:
            for _ in range(times):
                q_copy.copy_(q.detach())
                k_copy.copy_(k.detach())

        return step

    return copy(1), copy(2)


def check(q, k, trains: dict) -> None:
    """posenc's gradients against Hugging Face's (float32 angles: at position 2047 off by
    up to ~2047 * 2**-24, times gradients of a few units), fused against eager exactly."""
    grads = {}
    for name in ("posenc", "posenc fused", "HF eager"):
        trains[name]()
        grads[name] = (q.grad.clone(), k.grad.clone())
    for a, b, c in zip(grads["posenc"], grads["HF eager"], grads["posenc fused"], strict=True):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=0)
        assert torch.equal(a, c)


def timed(title: str, contenders: list[Contender], budget: float) -> str:
    """The contenders timed round-robin, as a table with ratios to HF eager and the copy."""
    round_robin(contenders, budget_s=budget, min_rounds=10)
    eager = next(c for c in contenders if c.name == "HF eager").median
    limit = contenders[-1].median
    rows = [
        [c.name, fmt_time(c.median), f"{c.median / eager:.2f}", f"{c.median / limit:.2f}"]
        for c in contenders
    ]
    return f"{title}:\n\n" + markdown_table([title, "median", "/ HF eager", "/ copy"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", type=float, default=40.0, help="seconds of timing")
    parser.add_argument("--no-compile", action="store_true", help="leave out HF compiled")
    parser.add_argument("--out", type=Path, help="write the Markdown report here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(SHAPE, generator=generator).requires_grad_()
    k = torch.randn(SHAPE, generator=generator).requires_grad_()
    gq, gk = torch.randn(SHAPE, generator=generator), torch.randn(SHAPE, generator=generator)
    seq, head_dim = SHAPE[2], SHAPE[3]

    rope = RotaryEmbedding(head_dim, max_length=seq)
    fused = RotaryEmbedding(head_dim, max_length=seq, fused=True)
    config = LlamaConfig(hidden_size=head_dim * 8, num_attention_heads=8, rope_theta=10000.0)
    with torch.no_grad():
        cos, sin = LlamaRotaryEmbedding(config)(q, torch.arange(seq)[None])
    applies = {
        "posenc": lambda: rope(q, k),
        "posenc fused": lambda: fused(q, k),
        "HF eager": lambda: apply_rotary_pos_emb(q, k, cos, sin),
    }
    if not args.no_compile:
        compiled = torch.compile(apply_rotary_pos_emb)
        applies["HF compiled"] = lambda: compiled(q, k, cos, sin)
    calls = {name: steps(q, k, gq, gk, apply) for name, apply in applies.items()}
    check(q, k, {name: pair[1] for name, pair in calls.items()})
    floors = copies(q, k)
    sections = [
        timed(
            title,
            [Contender(name, pair[i], args.threads) for name, pair in calls.items()]
            + [Contender("copy", floors[i], args.threads)],
            args.budget / 2,
        )
        for i, title in enumerate(("forward", "forward + backward"))
    ]
    report = (
        f"RoPE of q and k {SHAPE} float32, {args.threads} thread(s).\n\n"
        + "\n\n".join(sections)
        + f"\n\n{machine_info([args.threads])}\n"
    )
    print(report)
    if args.out is not None:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
