"""The ``posenc`` command.

``posenc table``   print or save a scheme's numbers (text, csv, json, npy): the sinusoidal
                  table, RoPE cos/sin tables, ALiBi biases, T5 buckets or NoPE zeros
``posenc plot``    draw one of the pictures to a file
``posenc embed``   run tokens → ids → embedding → + positional encoding on a sentence
``posenc demo``    the tutorials' walk-through: tables, every picture, a property report
``posenc bench``   train tiny transformers per task, scheme and seed; accuracy by length
``posenc extend``  which RoPE scaling for my model? passkey retrieval and perplexity of a
                  Hugging Face causal LM past its context, per RoPE scaling
``posenc explore`` write the interactive explorer, one HTML page that works offline
``posenc convert-rope``  permute a safetensors checkpoint's q/k projections between RoPE
                  layouts (Meta's interleaved pairs, Hugging Face's halves)

One module per command: :mod:`.table` (with :mod:`.scheme_tables`), :mod:`.plot`,
:mod:`.demo` (``embed`` and ``demo``), :mod:`.explore`, :mod:`.convert`, :mod:`.bench`
(the experiment bench of :mod:`posenc.bench`, which never imports the command) and
:mod:`.extend` (:mod:`posenc.extend`). The top
parser is built at each :func:`main` call, so the choices that come from registries
(schemes, RoPE scalings) are current. Frameworks and matplotlib are imported only by the
sub-commands that need them.

Every error of every command is one line on stderr, ``posenc COMMAND: error: message``,
never a traceback: a bad command line, a bad value (``ValueError``, ``TypeError``), a
table past the memory limit (said with the command's options), a file that cannot be
read or written (``OSError``) exit with status 2; a missing optional dependency
(``ImportError``, with the ``pip install`` that brings it) exits with status 1. A
closed standard output (``posenc table | head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence

from .. import __version__
from .._checks import MemoryLimitError, format_bytes
from .._files import STDOUT, OutputWriteError
from . import bench, convert, demo, explore, extend, plot, table
from .base import Parser, UsageError
from .plot import PLOT_KINDS
from .table import SCHEMES

__all__ = ["PLOT_KINDS", "SCHEMES", "UsageError", "main"]

# The options that size a command's tables, named when a table outgrows the memory limit.
_SIZE_OPTIONS = ("--length", "--d-model", "--head-dim", "--heads", "--eval-lengths",
                 "--batch-size", "--eval-samples")  # fmt: skip
# "posenc table: message" -> ("posenc table", "message"): a usage error's own command.
_PROG = re.compile(r"(posenc(?: [^\s:]+)*): (.*)", re.DOTALL)
# A missing module -> the extra that brings it, for an ImportError that does not say.
_EXTRAS = {"torch": "torch", "matplotlib": "plot", "safetensors": "transformers",
           "transformers": "transformers", "keras": "tf", "tensorflow": "tf", "jax": "jax",
           "flax": "jax", "tqdm": "bench", "plotly": "explore"}  # fmt: skip


def _parser() -> tuple[argparse.ArgumentParser, dict[str, Parser]]:
    """The top parser and its sub-commands' parsers by name."""
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
    bench.add_parser(commands)
    extend.add_parser(commands)
    convert.add_parser(commands)
    explore.add_parser(commands)
    return parser, dict(commands.choices)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``posenc`` console script; returns the exit status."""
    parser, commands = _parser()
    prog, args = "posenc", argparse.Namespace()
    try:
        args, extras = parser.parse_known_args(argv)
        prog = f"posenc {args.command}"
        if extras:  # said by the sub-command, which knows its options
            commands[args.command].unrecognized(extras)
        status = args.handler(args)
    except BrokenPipeError:  # standard output closed by its reader: `posenc table | head`
        _quiet_stdout()
        return 0
    except (UsageError, ValueError, TypeError, MemoryError, ImportError, OSError) as exc:
        command = commands.get(getattr(args, "command", None) or "")
        return _report(*_explain(exc, prog, args, command))
    return int(status or 0)


def _explain(
    exc: Exception, prog: str, args: argparse.Namespace, command: Parser | None
) -> tuple[str, str, int]:
    """``(prog, message, exit status)`` of an error of the command ``prog``."""
    if isinstance(exc, UsageError):  # its message may name its own command
        match = _PROG.fullmatch(str(exc))
        return (match[1], match[2], 2) if match else (prog, str(exc), 2)
    if isinstance(exc, MemoryLimitError):
        return prog, _memory_message(exc, args, command), 2
    if isinstance(exc, (ValueError, TypeError)):
        return prog, str(exc), 2
    if isinstance(exc, MemoryError):  # past a limit the user raised (--max-bytes)
        advice = _memory_advice(args, None, command)
        return prog, f"this machine has not the memory for it ({exc}); {advice}", 2
    if isinstance(exc, ImportError):  # not a usage error: the command needs an extra
        return prog, _import_message(exc), 1
    assert isinstance(exc, OSError)
    if isinstance(exc, OutputWriteError):
        if STDOUT in (exc.strerror or ""):
            _quiet_stdout()
        return prog, str(exc), 2
    # A file that cannot be read or written.
    where = f"{exc.filename}: " if exc.filename is not None else ""
    return prog, f"{where}{exc.strerror or exc}", 2


def _report(prog: str, message: str, status: int) -> int:
    """Print ``prog: error: message`` as one line; return ``status``."""
    line = " ".join(message.split())  # one line, whatever the message holds
    print(f"{prog}: error: {line}", file=sys.stderr)
    return status


def _memory_message(exc: MemoryLimitError, args: argparse.Namespace, command: Parser | None) -> str:
    """A refusal for a table past the memory limit, with what to do on the command line."""
    advice = _memory_advice(args, exc, command)
    if exc.what is None or exc.nbytes is None or exc.max_bytes is None:
        return f"{str(exc).partition('; ')[0]}; {advice}"
    return (
        f"{exc.what} would need about {format_bytes(exc.nbytes)}, more than the limit of "
        f"{format_bytes(exc.max_bytes)}; {advice}"
    )


def _memory_advice(
    args: argparse.Namespace, exc: MemoryLimitError | None, command: Parser | None
) -> str:
    """What to do on the command line when a table needs more memory (``exc``: past the
    limit; ``None``: past what the machine has)."""
    fix: Callable[[argparse.Namespace, MemoryLimitError | None], str] | None
    fix = getattr(args, "memory_fix", None)
    if fix is not None:
        return str(fix(args, exc))
    known = {s for action in (command or Parser())._actions for s in action.option_strings}
    lower = [option for option in _SIZE_OPTIONS if option in known]
    return f"ask for less ({', '.join(lower)})" if lower else "ask for less"


def _import_message(exc: ImportError) -> str:
    """The ``ImportError``'s message, with the ``pip install`` that brings the module."""
    message = str(exc)
    if "pip install" in message:
        return message
    root = (exc.name or "").partition(".")[0]
    extra = _EXTRAS.get(root)
    hint = f'pip install "posenc[{extra}]"' if extra else f"pip install {root}" if root else ""
    return f"{message}: {hint}" if hint else message


def _quiet_stdout() -> None:
    """Point the real standard output at /dev/null, so that Python's last flush of what
    could not be written is not a second error at exit."""
    try:
        descriptor = os.open(os.devnull, os.O_WRONLY)
        os.dup2(descriptor, sys.stdout.fileno())
        os.close(descriptor)
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        pass
