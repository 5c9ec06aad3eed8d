"""Speed of a Hugging Face model patched with posenc's exact RoPE, against unpatched.

A Llama-shaped model (llama3 scaling; by default 4 layers, hidden size 512, 8 heads,
random weights, float32, built from a config) is timed round-robin, patched and
unpatched, side by side in one run:

* the rotary module alone, ``rotary_emb(x, position_ids)``, for 2,048 positions and for
  one position (a decode step);
* a forward pass over 2,048 tokens;
* one decode step: a forward of one new token with a KV cache of 2,048 tokens.

Ratios are patched / unpatched (< 1: patched faster): of the medians, and per round (both
timed in the same round, so the machine's drift between rounds cancels) with the
quartiles of those ratios. The targets: forward at 2,048 tokens ≤ 1.02, decode step ≤ 1.0.

Run: ``python benchmarks/bench_hf_speed.py [--threads 1] [--out FILE.md]``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import Contender, fmt_time, machine_info, markdown_table, round_robin
from posenc.integrations.transformers import patch

LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}  # fmt: skip


def build(layers: int, hidden: int, heads: int) -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads // 4,
        num_hidden_layers=layers, intermediate_size=2 * hidden, vocab_size=1024,
        max_position_embeddings=131072, rope_parameters=LLAMA3,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def contenders(model: torch.nn.Module, label: str, threads: int, tokens: int) -> list[Contender]:
    """The four measures of ``model``, named ``label: measure``."""
    ids = torch.randint(0, 1024, (1, tokens), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(tokens)[None]
    rotary = model.model.rotary_emb
    x = torch.zeros(1, 1, 8)
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    step_ids, step_position = ids[:, -1:], torch.tensor([[tokens]])

    def decode() -> None:
        with torch.no_grad():
            model(step_ids, position_ids=step_position, past_key_values=cache, use_cache=True)
        cache.crop(-1)  # back to the cache of `tokens` tokens: every step timed is the same

    def forward() -> None:
        with torch.no_grad():
            model(ids)

    def rotary_all() -> None:
        with torch.no_grad():
            rotary(x, positions)

    def rotary_one() -> None:
        with torch.no_grad():
            rotary(x, step_position)

    return [
        Contender(f"{label}: rotary, {tokens} positions", rotary_all, threads),
        Contender(f"{label}: rotary, 1 position", rotary_one, threads),
        Contender(f"{label}: forward, {tokens} tokens", forward, threads, warm=threads > 1),
        Contender(f"{label}: decode step, cache {tokens}", decode, threads, warm=threads > 1),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of timing")
    parser.add_argument("--out", type=Path, help="write the Markdown report here too")
    args = parser.parse_args()

    unpatched = build(args.layers, args.hidden, args.heads)
    patched = patch(copy.deepcopy(unpatched))
    theirs = contenders(unpatched, "unpatched", args.threads, args.tokens)
    mine = contenders(patched, "patched", args.threads, args.tokens)
    round_robin([*theirs, *mine], budget_s=args.budget, min_rounds=10)
    rows = []
    for a, b in zip(mine, theirs, strict=True):
        measure = a.name.split(": ", 1)[1]
        # Each round times both; the ratio within a round leaves out the machine's drift
        # between rounds (its speed changes by 10-20% over a minute on a shared VM).
        ratios = [x / y for x, y in zip(a.samples, b.samples, strict=True)]
        paired = statistics.quantiles(ratios, n=4)
        rows.append([
            measure, fmt_time(b.median), fmt_time(a.median), f"{a.median / b.median:.3f}",
            f"{paired[1]:.3f} [{paired[0]:.3f}, {paired[2]:.3f}]",
        ])  # fmt: skip
    table = markdown_table(
        ["measure", "unpatched (median)", "patched (median)", "ratio of medians",
         "ratio per round: median [quartiles]"], rows,
    )  # fmt: skip
    report = (
        f"Llama-shaped model: {args.layers} layers, hidden {args.hidden}, {args.heads} heads, "
        f"llama3 scaling, float32, {args.threads} thread(s).\n\n{table}\n\n"
        f"{machine_info([args.threads])}\n"
    )
    print(report)
    if args.out is not None:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
