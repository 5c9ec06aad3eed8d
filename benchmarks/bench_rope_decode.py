"""RoPE per decoding step: one new token, posenc against Hugging Face's rotary + apply.

q (1, 32, 1, 128) and k (1, 8, 1, 128) float32 (a Llama-shaped step with grouped-query
attention), position 2048, base 10000, under ``torch.no_grad()``:

* ``posenc offset=``: ``RotaryEmbedding(128)(q, k, offset=2048)`` (KV-cache decoding).
* ``posenc positions=``: the same with ``positions=torch.tensor([[2048]])``.
* ``HF rotary + apply``: ``LlamaRotaryEmbedding(x, position_ids)`` then
  ``apply_rotary_pos_emb(q, k, cos, sin)``, what a step of a Hugging Face model pays.
* ``HF apply only``: ``apply_rotary_pos_emb`` with ``cos, sin`` computed before timing.

Outputs are checked against each other (float32 angles at 2048: within 1e-3) before
timing; timed round-robin at one thread. The target: posenc's step at most 0.5x HF's
rotary + apply.

Run: ``python benchmarks/bench_rope_decode.py [--out FILE.md]``.
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

POSITION = 2048


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=30.0, help="seconds of timing")
    parser.add_argument("--out", type=Path, help="write the Markdown report here too")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 32, 1, 128, generator=generator)
    k = torch.randn(1, 8, 1, 128, generator=generator)
    position = torch.tensor([[POSITION]])
    rope = RotaryEmbedding(128, max_length=4096)
    hf = LlamaRotaryEmbedding(LlamaConfig(hidden_size=4096, num_attention_heads=32))
    cos, sin = hf(q, position)
    calls = {
        "posenc offset=": lambda: rope(q, k, offset=POSITION),
        "posenc positions=": lambda: rope(q, k, positions=position),
        "HF rotary + apply": lambda: apply_rotary_pos_emb(q, k, *hf(q, position)),
        "HF apply only": lambda: apply_rotary_pos_emb(q, k, cos, sin),
    }
    reference = calls["HF rotary + apply"]()
    for name in ("posenc offset=", "posenc positions="):
        for mine, theirs in zip(calls[name](), reference, strict=True):
            torch.testing.assert_close(mine, theirs, atol=1e-3, rtol=0)
    contenders = [Contender(name, call, 1) for name, call in calls.items()]
    round_robin(contenders, budget_s=args.budget, min_rounds=30, min_sample_s=0.01)
    base = contenders[2].median
    rows = [[c.name, fmt_time(c.median), f"{c.median / base:.2f}"] for c in contenders]
    table = markdown_table(["per step", "median", "/ HF rotary + apply"], rows)
    report = (
        "RoPE decoding step: q (1, 32, 1, 128), k (1, 8, 1, 128) float32, position "
        f"{POSITION}, 1 thread.\n\n{table}\n\n{machine_info([1])}\n"
    )
    print(report)
    if args.out is not None:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
