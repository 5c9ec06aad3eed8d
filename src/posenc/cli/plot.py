"""``posenc plot``: draw one of the pictures of :mod:`posenc.plot` to a file.

The kinds are :data:`posenc.plot.PLOTS`' names; an option that the chosen picture's
function does not take is an error. matplotlib is imported when the picture is drawn.
The sizes are bounded (:data:`posenc.plot.MAX_VALUES`, :data:`posenc.plot.MAX_PIXELS`):
a ``--length`` or ``--dpi`` past them is refused in one line, within seconds.
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path
from typing import Any

from ..plot import PLOTS, save
from ..plot._figure import check_pixels
from .base import UsageError

__all__ = ["PLOT_KINDS", "add_parser", "run"]

#: The pictures ``posenc plot KIND`` draws, by name.
PLOT_KINDS: tuple[str, ...] = tuple(PLOTS)

# `posenc plot` options -> the keyword of the picture's function that they set.
_PLOT_OPTIONS = {
    "length": "length",
    "d_model": "d_model",
    "base": "base",
    "head_dim": "head_dim",
    "factor": "factor",
    "original_max_position_embeddings": "original_max_position_embeddings",
    "heads": "num_heads",
    "num_buckets": "num_buckets",
    "max_distance": "max_distance",
}


def add_parser(commands: Any) -> None:
    """Add ``posenc plot`` to the top parser's sub-commands."""
    plot = commands.add_parser("plot", help="draw a picture to a file")
    plot.set_defaults(handler=run)
    plot.add_argument("kind", choices=PLOT_KINDS)
    plot.add_argument("--output", "-o", type=Path, required=True, help="FILE.png|svg|pdf")
    plot.add_argument("--length", "-L", type=int, help="number of positions")
    plot.add_argument("--d-model", "-d", type=int, help="encoding width")
    plot.add_argument("--base", "-n", type=float, help="the n of k / n^(2i/d); RoPE's base")
    plot.add_argument("--head-dim", type=int, help="RoPE: features per head")
    plot.add_argument("--factor", type=float, help="RoPE: the context extension")
    plot.add_argument(
        "--original-max-position-embeddings", type=int, metavar="L0", help="RoPE: trained length"
    )
    plot.add_argument("--heads", type=int, help="ALiBi: number of heads")
    plot.add_argument("--num-buckets", type=int, help="T5: number of buckets")
    plot.add_argument("--max-distance", type=int, help="T5: where buckets saturate")
    plot.add_argument("--dpi", type=int, default=100)


def run(args: argparse.Namespace) -> None:
    """Draw the picture ``args.kind`` with the options given and save it."""
    function = PLOTS[args.kind]
    accepted = inspect.signature(function).parameters
    kwargs: dict[str, Any] = {}
    for option, parameter in _PLOT_OPTIONS.items():
        value = getattr(args, option)
        if value is None:
            continue
        if parameter not in accepted:
            flag = "--" + option.replace("_", "-")
            raise UsageError(f"posenc plot {args.kind}: {flag} does not apply to this picture")
        kwargs[parameter] = value
    if args.dpi <= 0:
        raise UsageError(f"posenc plot: --dpi must be > 0, got {args.dpi}")
    fig = function(**kwargs)
    width, height = fig.get_size_inches()
    try:  # before anything is drawn, said of the option
        check_pixels((float(width), float(height)), args.dpi)
    except ValueError as exc:
        raise ValueError(f"--{exc}") from None
    path = save(fig, args.output, dpi=args.dpi)
    print(f"wrote {path}")
