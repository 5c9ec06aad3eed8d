"""``posenc convert-rope``: move a safetensors checkpoint between RoPE layouts.

Permutes the query/key projections of every layer (Meta's interleaved pairs ↔ Hugging
Face's halves, grouped-query attention and partial rotary included) with
:func:`posenc.integrations.checkpoints.convert_rope_checkpoint`; the input is never
written and the output is written atomically (through a symbolic link to the file it
names), a new one as private as the input (its permission mode, less the umask). As
for every command, OUT's folder must exist: posenc creates the file it is given, never
the folders above it. Needs PyTorch and safetensors
(``pip install "posenc[transformers]"``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Add ``posenc convert-rope`` to the top parser's sub-commands."""
    convert = commands.add_parser(
        "convert-rope",
        help="permute a checkpoint's q/k projections between RoPE layouts",
        description=(
            "Permute the query and key projections of a safetensors checkpoint so that RoPE "
            "in the target layout gives the attention scores RoPE in the source layout gave "
            "(half: Hugging Face, GPT-NeoX; interleaved: Meta, GPT-J). The source layout is "
            "read from the key names (q_proj/k_proj: half; wq/wk: interleaved) or from the "
            "metadata this command writes."
        ),
    )
    convert.set_defaults(handler=run)
    convert.add_argument("input", type=Path, metavar="IN", help="a .safetensors file")
    convert.add_argument("output", type=Path, metavar="OUT", help="the converted file")
    convert.add_argument("--to", required=True, choices=("half", "interleaved"))
    convert.add_argument("--heads", type=int, required=True, help="query heads")
    convert.add_argument("--kv-heads", type=int, help="key/value heads (default --heads)")
    convert.add_argument("--head-dim", type=int, help="features per head (default: derived)")
    convert.add_argument("--rotary-dim", type=int, help="rotated features per head (default all)")
    convert.add_argument("--force", action="store_true", help="replace OUT if it exists")


def run(args: argparse.Namespace) -> int:
    """Convert ``args.input`` into ``args.output``; print what was done."""
    from ..integrations.checkpoints import convert_rope_checkpoint

    written = convert_rope_checkpoint(
        args.input,
        args.output,
        force=args.force,
        to=args.to,
        heads=args.heads,
        kv_heads=args.heads if args.kv_heads is None else args.kv_heads,
        head_dim=args.head_dim,
        rotary_dim=args.rotary_dim,
    )
    print(f"wrote {written} (RoPE layout {args.to})")
    return 0
