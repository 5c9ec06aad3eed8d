"""``posenc plot``: draw one of the pictures of :mod:`posenc.plot` to a file.

The kinds are :data:`posenc.plot.PICTURES`' names; ``--help`` lists each with the line on
what it draws and the options its function takes, with their defaults, read from the
function's signature (:func:`kinds_help`). An option that the chosen picture's function
does not take is an error. Without ``--output`` the picture goes to ``KIND.png`` in the
current folder, written whole or not at all (:func:`posenc.plot.save`). matplotlib is
imported when the picture is drawn. The sizes are bounded (:data:`posenc.plot.MAX_VALUES`,
:data:`posenc.plot.MAX_PIXELS`): a ``--length`` or ``--dpi`` past them is refused in one
line, within seconds.
"""

from __future__ import annotations

import argparse
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

from ..plot import PICTURES, save
from ..plot._figure import check_pixels, check_text
from .base import UsageError

__all__ = ["PLOT_KINDS", "add_parser", "kinds_help", "run"]

#: The pictures ``posenc plot KIND`` draws, by name.
PLOT_KINDS: tuple[str, ...] = tuple(PICTURES)

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
_DPI = 100  # the resolution of a picture without --dpi


def add_parser(commands: Any) -> None:
    """Add ``posenc plot`` to the top parser's sub-commands."""
    plot = commands.add_parser(
        "plot",
        help="draw a picture to a file",
        description=textwrap.fill(
            "Draw one picture of posenc.plot (KIND, listed below) to a file. Each kind takes "
            "the options listed under it, with their defaults; any other option is an error.",
            88,
        ),
        epilog=kinds_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plot.set_defaults(handler=run)
    plot.add_argument("kind", choices=PLOT_KINDS, metavar="KIND", help="the picture (see below)")
    plot.add_argument(
        "--output", "-o", type=Path, metavar="FILE",
        help="the file; its extension picks the format (.png, .svg, .pdf, ...); "
        "default KIND.png in the current folder",
    )  # fmt: skip
    plot.add_argument("--length", "-L", type=int, help="number of positions")
    plot.add_argument("--d-model", "-d", type=int, help="encoding width")
    plot.add_argument("--base", "-n", type=float, help="the n of k / n^(2i/d); RoPE's base")
    plot.add_argument("--head-dim", type=int, help="RoPE, xPos: features per head")
    plot.add_argument("--factor", type=float, help="RoPE: the context extension")
    plot.add_argument(
        "--original-max-position-embeddings", type=int, metavar="L0", help="RoPE: trained length"
    )
    plot.add_argument("--heads", type=int, help="ALiBi, Sandwich: number of heads")
    plot.add_argument("--num-buckets", type=int, help="T5: number of buckets")
    plot.add_argument("--max-distance", type=int, help="T5: where buckets saturate")
    plot.add_argument(
        "--dpi", type=int, default=_DPI, help=f"dots per inch, every kind (default {_DPI})"
    )


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _as_flags(message: str) -> str:
    """A picture function's error with its keywords named as the options that set them.

    Example:
        >>> _as_flags("num_heads must be an int >= 1, got 0; length=3 × d_model=7")
        '--heads must be an int >= 1, got 0; --length=3 × --d-model=7'
    """
    for option, parameter in _PLOT_OPTIONS.items():
        message = re.sub(rf"(?<![\w-]){parameter}\b", _flag(option), message)
    return message


def _default(value: Any) -> str:
    """A default as the command line writes it: 10000.0 -> 10000, 2.5 -> 2.5."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def kinds_help() -> str:
    """The kinds of ``posenc plot --help``: each with what it draws and the options its
    function takes, with their defaults.

    Example:
        >>> print(kinds_help().splitlines()[1])
          heatmap          the sinusoidal table, positions × dimensions, as a heat map in [-1, 1]
        >>> print(kinds_help().splitlines()[2])
                           options: --length 100, --d-model 512, --base 10000
    """
    lines = ["kinds (what each draws, and the options it takes with their defaults):"]
    for kind, picture in PICTURES.items():
        parameters = inspect.signature(picture.function).parameters
        taken = [
            f"{_flag(option)} {_default(parameters[name].default)}"
            for option, name in _PLOT_OPTIONS.items()
            if name in parameters
        ]
        lines.append(f"  {kind:16s} {picture.draws}")
        options = "options: " + (", ".join(taken) if taken else "none")
        lines += textwrap.wrap(
            options, 88, initial_indent=" " * 19, subsequent_indent=" " * 28,
            break_on_hyphens=False,
        )  # fmt: skip
    lines.append("every kind also takes --output (default KIND.png) and --dpi (default 100)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> None:
    """Draw the picture ``args.kind`` with the options given and save it."""
    function = PICTURES[args.kind].function
    accepted = inspect.signature(function).parameters
    kwargs: dict[str, Any] = {}
    for option, parameter in _PLOT_OPTIONS.items():
        value = getattr(args, option)
        if value is None:
            continue
        if parameter not in accepted:
            raise UsageError(
                f"posenc plot {args.kind}: {_flag(option)} does not apply to this picture"
            )
        kwargs[parameter] = value
    if args.dpi <= 0:
        raise UsageError(f"posenc plot: --dpi must be > 0, got {args.dpi}")
    output = Path(f"{args.kind}.png") if args.output is None else args.output
    try:
        fig = function(**kwargs)
    except (ValueError, TypeError) as exc:  # said of the options, as given on the line
        raise type(exc)(_as_flags(str(exc))) from None
    width, height = fig.get_size_inches()
    try:  # before anything is drawn, said of the option
        check_pixels((float(width), float(height)), args.dpi)
        check_text(fig, args.dpi, output.suffix.lower().lstrip("."))
    except ValueError as exc:
        raise ValueError(f"--{exc}") from None
    path = save(fig, output, dpi=args.dpi)
    print(f"wrote {path}")
