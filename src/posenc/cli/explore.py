"""``posenc explore``: write the interactive explorer, one self-contained HTML page.

The page (:mod:`posenc.explore`) holds Plotly's script and every number it draws, so it
opens from disk in any browser, offline. ``--open`` shows it in the default browser
once it is written. Needs Plotly (``pip install "posenc[explore]"``).
"""

from __future__ import annotations

import argparse
import webbrowser
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Add ``posenc explore`` to the top parser's sub-commands."""
    from ..explore import DEFAULT_PATH

    explore = commands.add_parser(
        "explore",
        help="write the interactive explorer, one HTML page that works offline",
        description=(
            "Write an interactive HTML page of positional encodings: the sinusoidal matrix "
            "and its columns, the dot product against offset, RoPE wavelengths and scores "
            "under every scaling method, ALiBi slopes and biases, T5 buckets, each with "
            "controls. Every number is computed by posenc when the page is written; the "
            "page needs no server and fetches nothing."
        ),
    )
    explore.set_defaults(handler=run)
    explore.add_argument(
        "--output",
        "-o",
        type=Path,
        default=Path(DEFAULT_PATH),
        metavar="FILE",
        help=f"the HTML file to write (default: {DEFAULT_PATH} in the current folder)",
    )
    explore.add_argument(
        "--open", action="store_true", help="open the page in the default web browser"
    )


def run(args: argparse.Namespace) -> int:
    """Write the page to ``args.output``; open it if asked."""
    from ..explore import write_explorer

    written = write_explorer(args.output)
    size = written.stat().st_size
    print(f"wrote {written} ({size / 1e6:.1f} MB): open it in a web browser")
    if args.open and not webbrowser.open(written.resolve().as_uri()):
        print("no web browser could be started here; open the file yourself")
    return 0
