"""``posenc embed`` and ``posenc demo``: the tutorials' walk-through from the command line.

``embed`` runs tokens → ids → embedding → + positional encoding on a sentence;
``demo`` writes the tutorials' tables, every picture and a property report
(:mod:`posenc.demo`). Frameworks and matplotlib are imported only when used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run_demo", "run_embed"]


def add_parser(commands: Any) -> None:
    """Add ``posenc embed`` and ``posenc demo`` to the top parser's sub-commands."""
    embed = commands.add_parser("embed", help="run tokens -> embedding -> + encoding on a sentence")
    embed.set_defaults(handler=run_embed)
    embed.add_argument("text", help='a sentence, e.g. "I am a robot"')
    embed.add_argument("--d-model", "-d", type=int, default=4)
    embed.add_argument("--base", "-n", type=float, default=100.0)
    embed.add_argument("--seed", type=int, default=0, help="seed of the embedding weights")
    embed.add_argument("--scale", action="store_true", help="scale embeddings by sqrt(d_model)")
    embed.add_argument("--backend", choices=("numpy", "torch"), default="numpy")

    demo = commands.add_parser("demo", help="the tutorials' walk-through, pictures and a report")
    demo.set_defaults(handler=run_demo)
    demo.add_argument("--output", "-o", type=Path, default=Path("posenc-demo"))
    demo.add_argument("--no-plots", action="store_true", help="skip the pictures")


def run_embed(args: argparse.Namespace) -> None:
    """Print the pipeline's steps (tokens, ids, embedding, encoding) for ``args.text``."""
    from ..demo import embed_sentence

    sys.stdout.write(
        embed_sentence(
            args.text,
            d_model=args.d_model,
            base=args.base,
            seed=args.seed,
            scale=args.scale,
            backend=args.backend,
        )
    )


def run_demo(args: argparse.Namespace) -> None:
    """Write the walk-through into ``args.output`` and print it."""
    from ..demo import run_demo as walk_through

    walk_through(args.output, plots=not args.no_plots, out=sys.stdout)
