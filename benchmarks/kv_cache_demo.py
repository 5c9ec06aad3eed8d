"""How far decoding with a KV cache lands from the full-sequence call, per cache mode.

One attention layer (``MultiHeadAttention(256, 4)``, head_dim 64) with RoPE scaled by
dynamic NTK (factor 4) or LongRoPE (illustrative divisors, ``LongRopeScaling.example``),
both with an original length of 64, decodes 320 tokens one at a time after a 16-token
prompt, with ``KVCache(on_frequency_change=...)`` set to ``keep`` (what other caches do),
``rerotate`` (posenc's default) and ``recompute``. At every step the output is compared
with the last row of a full call on the same prefix (the same module, no cache), in
float32 and in bfloat16. A single layer: there every cached key comes from the input, so
the full call is what an exact cache must give (in a deeper model the later layers'
keys of earlier tokens were computed with other frequencies; see docs/kv-cache.md).

Second, the exactness of a shift on eviction: keys cached at position ``p`` moved back by
one position (a window with attention sinks evicting one token), against the keys
rotated there from scratch in float64, for posenc's re-rotation and for the re-rotation
transformers' former ``SinkCache`` did (the model's float32 tables at both positions).

Run: ``python benchmarks/kv_cache_demo.py --out-dir DIR`` (about a minute): writes
``kv-cache-error.png`` and ``kv-cache-error.md`` there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import machine_info, markdown_table
from posenc.core.rope import LongRopeScaling
from posenc.torch import KVCache, MultiHeadAttention, RotaryEmbedding

ORIGINAL, PROMPT, TOKENS, HEAD_DIM = 64, 16, 336, 64
MODES = ("keep", "rerotate", "recompute")


def attention(scaling: str, dtype: torch.dtype) -> MultiHeadAttention:
    if scaling == "dynamic_ntk":
        params = {"factor": 4.0, "original_max_position_embeddings": ORIGINAL}
        rope = RotaryEmbedding(HEAD_DIM, scaling=scaling, scaling_params=params, max_length=512)
    else:
        spec = LongRopeScaling.example(
            factor=4.0, original_max_position_embeddings=ORIGINAL, rotary_dim=HEAD_DIM
        )
        rope = RotaryEmbedding(HEAD_DIM, scaling=spec, max_length=512)
    torch.manual_seed(0)
    return MultiHeadAttention(256, 4, position=rope).to(dtype).eval()


def errors(scaling: str, mode: str, dtype: torch.dtype) -> np.ndarray:
    """Max |output − full call's last row| at each decoding step, relative to the full
    call's largest output."""
    module = attention(scaling, dtype)
    x = torch.randn(1, TOKENS, 256, generator=torch.Generator().manual_seed(1)).to(dtype)
    cache = KVCache(on_frequency_change=mode)
    out = []
    with torch.no_grad():
        module(x[:, :PROMPT], cache=cache)
        for t in range(PROMPT, TOKENS):
            step = module(x[:, t : t + 1], cache=cache).float()
            full = module(x[:, : t + 1])[:, -1:].float()
            out.append(((step - full).abs().max() / full.abs().max()).item())
    return np.array(out)


def float32_rerotation(cached: torch.Tensor, old: torch.Tensor, new: torch.Tensor,
                       inv_freq: np.ndarray) -> torch.Tensor:  # fmt: skip
    """Keys moved from ``old`` to ``new`` positions as transformers' former ``SinkCache``
    did: the model's float32 tables at both positions (angles ``p × θ`` formed in float32),
    combined into the rotation by the difference, applied in float32."""
    theta = torch.from_numpy(inv_freq).float()

    def tables(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angle = p[:, None].float() * theta  # float32, as Hugging Face's rotary modules
        return torch.cos(angle).repeat(1, 2), torch.sin(angle).repeat(1, 2)

    cos_old, sin_old = tables(old)
    cos_new, sin_new = tables(new)
    cos = cos_new * cos_old + sin_new * sin_old  # cos(new − old)
    sin = sin_new * cos_old - cos_new * sin_old  # sin(new − old)
    half = cached.shape[-1] // 2
    turned = torch.cat([-cached[..., half:], cached[..., :half]], dim=-1)
    return cached * cos + turned * sin


def shift_errors() -> list[list[str]]:
    rope64 = RotaryEmbedding(128, max_length=16).double()
    rope32 = RotaryEmbedding(128, max_length=16)
    k = torch.randn(1, 8, 64, 128, generator=torch.Generator().manual_seed(2))
    rows = []
    for position in (1_000, 10_000, 100_000, 1_000_000):
        old = torch.arange(position, position + 64)
        new = old - 1  # one eviction
        exact = rope64.rotate_keys(k.double(), positions=new)
        cached = rope32.rotate_keys(k, positions=old)
        ours = rope32.rerotate_keys(cached, positions=old, new_positions=new)
        theirs = float32_rerotation(cached, old, new, rope32.inv_freq)
        ulp = 2.0**-24 * exact.abs().max().item()
        rows.append(
            [
                f"{position:,}",
                f"{(ours.double() - exact).abs().max().item() / ulp:.2f}",
                f"{(theirs.double() - exact).abs().max().item() / ulp:.1f}",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    results = {
        (scaling, mode, dtype): errors(scaling, mode, dtype)
        for scaling in ("dynamic_ntk", "longrope")
        for mode in MODES
        for dtype in (torch.float32, torch.bfloat16)
    }
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True, layout="constrained")
    steps = np.arange(PROMPT, TOKENS) + 1  # the length after each step
    for ax, scaling in zip(axes, ("dynamic_ntk", "longrope"), strict=True):
        for mode, colour in zip(MODES, ("tab:red", "tab:blue", "tab:green"), strict=True):
            values = np.maximum(results[(scaling, mode, torch.float32)], 1e-9)
            ax.semilogy(steps, values, color=colour, label=mode)
        ax.axvline(ORIGINAL, color="grey", linestyle=":", label="original length")
        ax.set_title(f"{scaling}: decoding against the full call (float32)")
        ax.set_xlabel("length after the step")
    axes[0].set_ylabel("max |error| / max |output|")
    axes[0].legend()
    figure.savefig(args.out_dir / "kv-cache-error.png", dpi=110)
    rows = []
    for (scaling, mode, dtype), values in results.items():
        before, after = values[: ORIGINAL - PROMPT], values[ORIGINAL - PROMPT :]
        rows.append(
            [
                scaling,
                str(dtype).removeprefix("torch."),
                mode,
                f"{before.max():.1e}",
                f"{after.max():.1e}",
                f"{after[-1]:.1e}",
            ]
        )
    table = markdown_table(
        ["scaling", "dtype", "cache", "max before L₀", "max past L₀", "last step"], rows
    )
    shifts = markdown_table(
        ["position", "posenc (ulps)", "float32 tables, as SinkCache (ulps)"], shift_errors()
    )
    report = (
        "Decoding one attention layer token by token (prompt 16, up to 336 tokens, original "
        "length 64): max |output − full call's last row| / max |full output| per step.\n\n"
        f"{table}\n\nKeys moved back by one position (head_dim 128, base 10000, 64 keys, 8 "
        "heads): max error against the keys rotated there in float64, in float32 ulps of "
        f"the largest entry.\n\n{shifts}\n\n{machine_info([1])}\n"
    )
    (args.out_dir / "kv-cache-error.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
