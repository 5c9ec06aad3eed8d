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

from ..demo import DEMO_FOLDER

__all__ = ["add_parser", "run_demo", "run_embed"]


def add_parser(commands: Any) -> None:
    """Add ``posenc embed`` and ``posenc demo`` to the top parser's sub-commands."""
    embed = commands.add_parser(
        "embed",
        help="run tokens -> embedding -> + encoding on a sentence",
        description=(
            "Run the tutorials' pipeline on one sentence and print each step: the tokens "
            "(lower-cased words), their vocabulary ids, the embedding lookup (weights drawn "
            "from N(0, 1)), the sinusoidal positional encoding and their sum, the input of "
            "a transformer's first layer."
        ),
    )
    embed.set_defaults(handler=run_embed)
    embed.add_argument("text", help='the sentence, e.g. "I am a robot"')
    embed.add_argument(
        "--d-model", "-d", type=int, default=4,
        help="width of the embedding and of the encoding (default 4, the tutorial's)",
    )  # fmt: skip
    embed.add_argument(
        "--base", "-n", type=float, default=100.0,
        help="the n of k / n^(2i/d) (default 100, the tutorial's; the paper's is 10000)",
    )  # fmt: skip
    embed.add_argument(
        "--seed", type=int, default=0, help="seed of the embedding weights (default 0)"
    )
    embed.add_argument(
        "--scale", action="store_true",
        help="multiply the embedding by sqrt(d_model) before adding the encoding, as the "
        "Transformer paper does (default: not scaled, as in the tutorials)",
    )  # fmt: skip
    embed.add_argument(
        "--backend", choices=("numpy", "torch"), default="numpy",
        help="numpy (default) or torch: posenc.torch.InputEmbedding (needs posenc[torch])",
    )  # fmt: skip

    demo = commands.add_parser(
        "demo",
        help="the tutorials' walk-through, pictures and a report",
        description=(
            "The tutorials' walk-through, reproduced and checked: print their worked tables, "
            "the pipeline on 'I am a robot' and a few numbers of the relative schemes "
            "(ALiBi, T5, RoPE); write every picture of posenc plot (PNG), two tables (CSV) "
            "and report.json into the output folder; end with a report of the properties "
            "the paper and the tutorials claim (unique vectors, bounds, relative positions, "
            "precision), each measured."
        ),
    )
    demo.set_defaults(handler=run_demo)
    demo.add_argument(
        "--output", "-o", type=Path, default=Path(DEMO_FOLDER), metavar="FOLDER",
        help=f"the folder to write into, created if missing (its parent must exist); "
        f"default ./{DEMO_FOLDER}",
    )  # fmt: skip
    demo.add_argument(
        "--no-plots", action="store_true",
        help="write no pictures, so matplotlib is not needed (default: draw them all)",
    )  # fmt: skip


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
