"""The ``posenc`` command.

``posenc table``   print or save the encoding matrix (text, csv, json, npy)
``posenc plot``    draw one of the pictures to a file
``posenc embed``   run tokens → ids → embedding → + positional encoding on a sentence
``posenc demo``    the seed walk-through: tables, every picture, a property report

Frameworks and matplotlib are imported only by the sub-commands that need them. Bad
arguments exit with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from . import __version__
from ._checks import FORMULAS, LAYOUTS, check_base, check_choice, check_d_model
from .core.precision import FORMATS
from .core.sinusoidal import table_values

PLOT_KINDS = (
    "heatmap",
    "sinusoids",
    "dimensions",
    "first-positions",
    "long-range",
    "wavelengths",
    "similarity",
    "grid",
)


class UsageError(Exception):
    """A bad command line: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="posenc",
        description="Positional encodings for transformers, exact in every dtype.",
    )
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    def encoding_options(p: argparse.ArgumentParser, *, length: int, d_model: int, base: float):
        p.add_argument("--length", "-L", type=int, default=length, help="number of positions")
        p.add_argument("--d-model", "-d", type=int, default=d_model, help="encoding width")
        p.add_argument("--base", "-n", type=float, default=base, help="the n of k / n^(2i/d)")
        p.add_argument("--layout", choices=LAYOUTS, default="interleaved")
        p.add_argument("--formula", choices=FORMULAS, default="paper")

    table = commands.add_parser("table", help="print or save the encoding matrix")
    encoding_options(table, length=4, d_model=4, base=10000.0)
    table.add_argument("--start", type=int, default=0, help="first position (default 0)")
    table.add_argument("--dtype", choices=list(FORMATS), default="float64")
    table.add_argument("--format", choices=("text", "csv", "json", "npy"), default="text")
    table.add_argument("--output", "-o", type=Path, help="write to this file (npy needs one)")
    table.add_argument("--precision", type=int, default=8, help="decimals in text output")
    table.add_argument("--full", action="store_true", help="print every row in text output")

    plot = commands.add_parser("plot", help="draw a picture to a file")
    plot.add_argument("kind", choices=PLOT_KINDS)
    plot.add_argument("--output", "-o", type=Path, required=True, help="FILE.png|svg|pdf")
    plot.add_argument("--length", "-L", type=int, help="number of positions")
    plot.add_argument("--d-model", "-d", type=int, help="encoding width")
    plot.add_argument("--base", "-n", type=float, help="the n of k / n^(2i/d)")
    plot.add_argument("--dpi", type=int, default=100)

    embed = commands.add_parser("embed", help="run the seed pipeline on a sentence")
    embed.add_argument("text", help='a sentence, e.g. "I am a robot"')
    embed.add_argument("--d-model", "-d", type=int, default=4)
    embed.add_argument("--base", "-n", type=float, default=100.0)
    embed.add_argument("--seed", type=int, default=0, help="seed of the embedding weights")
    embed.add_argument("--scale", action="store_true", help="scale embeddings by sqrt(d_model)")
    embed.add_argument("--backend", choices=("numpy", "torch"), default="numpy")

    demo = commands.add_parser("demo", help="the seed walk-through, pictures and a report")
    demo.add_argument("--output", "-o", type=Path, default=Path("posenc-demo"))
    demo.add_argument("--no-plots", action="store_true", help="skip the pictures")
    return parser


# ---------------------------------------------------------------------------------------


def _cmd_table(args: argparse.Namespace) -> None:
    if args.format == "npy" and args.output is None:
        raise UsageError("posenc table: --format npy needs --output FILE")
    if args.precision < 0:
        raise UsageError(f"posenc table: --precision must be >= 0, got {args.precision}")
    if args.length < 0:
        raise ValueError(f"--length must be >= 0, got {args.length}")
    values = table_values(
        args.length,
        check_d_model(args.d_model),
        base=check_base(args.base),
        layout=args.layout,
        formula=args.formula,
        fmt=args.dtype,
        start=args.start,
    )
    if args.format == "npy":
        # bfloat16 is stored as float32 holding exact bfloat16 values (portable .npy).
        np.save(args.output, values)
        print(f"wrote {args.output} ({values.shape[0]}x{values.shape[1]} {values.dtype})")
        return
    text = _format_table(values, args)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
        print(f"wrote {args.output}")


def _format_table(values: np.ndarray, args: argparse.Namespace) -> str:
    digits = 17 if args.dtype == "float64" else 9  # enough to round-trip the dtype
    if args.format == "csv":
        rows = [",".join(f"{v:.{digits}g}" for v in row) for row in values.astype(np.float64)]
        return "\n".join(rows) + "\n"
    if args.format == "json":
        record = {
            "positions": [args.start, args.start + args.length],
            "d_model": args.d_model,
            "base": args.base,
            "layout": args.layout,
            "formula": args.formula,
            "dtype": args.dtype,
            "values": values.astype(np.float64).tolist(),
        }
        return json.dumps(record) + "\n"
    threshold = sys.maxsize if args.full else 1000
    return (
        np.array2string(
            values.astype(np.float64),
            precision=args.precision,
            suppress_small=True,
            threshold=threshold,
            max_line_width=120,
        )
        + "\n"
    )


def _cmd_plot(args: argparse.Namespace) -> None:
    from . import plot

    function = plot.PLOTS[args.kind]
    accepted = inspect.signature(function).parameters
    kwargs: dict[str, Any] = {}
    for option in ("length", "d_model", "base"):
        value = getattr(args, option)
        if value is None:
            continue
        if option not in accepted:
            flag = "--" + option.replace("_", "-")
            raise UsageError(f"posenc plot {args.kind}: {flag} does not apply to this picture")
        kwargs[option] = value
    if args.dpi <= 0:
        raise UsageError(f"posenc plot: --dpi must be > 0, got {args.dpi}")
    path = plot.save(function(**kwargs), args.output, dpi=args.dpi)
    print(f"wrote {path}")


def _cmd_embed(args: argparse.Namespace) -> None:
    from .demo import embed_sentence

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


def _cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo

    run_demo(args.output, plots=not args.no_plots, out=sys.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``posenc`` console script; returns the exit status."""
    try:
        args = _parser().parse_args(argv)
        check_choice(args.command, "command", ("table", "plot", "embed", "demo"))
        handler = {
            "table": _cmd_table,
            "plot": _cmd_plot,
            "embed": _cmd_embed,
            "demo": _cmd_demo,
        }[args.command]
        handler(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as exc:
        print(f"posenc {_command_of(argv)}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"posenc: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `posenc table ... | head`
        return 0
    return 0


def _command_of(argv: Sequence[str] | None) -> str:
    words = list(sys.argv[1:] if argv is None else argv)
    return next((w for w in words if not w.startswith("-")), "")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
