"""The ``posenc`` command.

``posenc table``   print or save a scheme's numbers (text, csv, json, npy): the sinusoidal
                  table, RoPE cos/sin tables, ALiBi biases, T5 buckets or NoPE zeros
``posenc plot``    draw one of the pictures to a file
``posenc embed``   run tokens → ids → embedding → + positional encoding on a sentence
``posenc demo``    the tutorials' walk-through: tables, every picture, a property report
``posenc bench``   train tiny transformers per task, scheme and seed; accuracy by length
``posenc convert-rope``  permute a safetensors checkpoint's q/k projections between RoPE
                  layouts (Meta's interleaved pairs, Hugging Face's halves)

One module per command: :mod:`.table` (with :mod:`.scheme_tables`), :mod:`.plot`,
:mod:`.demo` (``embed`` and ``demo``), :mod:`.convert` and the bench's own
:mod:`posenc.bench.cli`. The
top parser is built at each :func:`main` call, so the choices that come from registries
(schemes, RoPE scalings) are current. Frameworks and matplotlib are imported only by the
sub-commands that need them. Bad arguments exit with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from . import convert, demo, plot, table
from .base import Parser, UsageError
from .plot import PLOT_KINDS
from .table import SCHEMES

__all__ = ["PLOT_KINDS", "SCHEMES", "UsageError", "main"]


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="posenc",
        description="Positional encodings for transformers, exact in every dtype.",
    )
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    table.add_parser(commands)
    plot.add_parser(commands)
    demo.add_parser(commands)  # embed and demo
    # The bench's command lives beside the bench; imported here, when the parser is built.
    from ..bench import cli as bench_cli

    bench_cli.add_parser(commands)
    convert.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``posenc`` console script; returns the exit status."""
    try:
        args = _parser().parse_args(argv)
        status = args.handler(args)
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
    except OSError as exc:  # a file that cannot be written or read: one line, no traceback
        print(f"posenc {_command_of(argv)}: error: {exc}", file=sys.stderr)
        return 2
    return status or 0


def _command_of(argv: Sequence[str] | None) -> str:
    words = list(sys.argv[1:] if argv is None else argv)
    return next((w for w in words if not w.startswith("-")), "")
