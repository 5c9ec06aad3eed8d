"""What every ``posenc`` command shares: the usage error, the argument parser class and
the ``--max-bytes`` option.

A command lives in a module with ``add_parser(commands)``, which adds its sub-parser to
the top parser's sub-commands and sets ``handler`` (``set_defaults(handler=run)``) to its
``run(args) -> int | None`` (the exit status; ``None`` is 0). A command may also set
``memory_fix`` (``args -> str``): what to do on its command line when a table would
outgrow the memory limit. :func:`posenc.cli.main` builds the top parser from these
modules at each call and reports every error in one line, ``posenc COMMAND: error: ...``.

Options are never abbreviated (``allow_abbrev=False``): an abbreviation that works today
would change meaning, or stop working, when an option is added; a mistyped option is an
error that suggests the option meant instead.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
from collections.abc import Sequence
from typing import Any, NoReturn

from .._checks import format_bytes

__all__ = ["Parser", "UsageError", "add_max_bytes", "parse_size"]


class UsageError(Exception):
    """A bad command line: reported in one line, exit status 2.

    The message may start with the command it is about (``"posenc table: ..."``), as
    :meth:`Parser.error` writes it; :func:`posenc.cli.main` puts ``error:`` after it.
    """


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :class:`UsageError` (one line, no usage text),
    whose options are never abbreviated, and which suggests the option meant by one it
    does not know."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")

    def unrecognized(self, words: Sequence[str]) -> NoReturn:
        """Refuse ``words`` that this parser does not know, suggesting close options."""
        known = [s for action in self._actions for s in action.option_strings if len(s) > 2]
        hints = []
        for word in words:
            name = word.partition("=")[0]
            if not name.startswith("--"):
                continue
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            prefixed = [option for option in known if option.startswith(name)]
            for option in close or prefixed[:2]:
                if option not in hints:
                    hints.append(option)
        hint = f"; did you mean {' or '.join(hints)}?" if hints else ""
        self.error(f"unrecognized arguments: {' '.join(words)}{hint}")


_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20,
          "g": 2**30, "gib": 2**30, "t": 2**40, "tib": 2**40}  # fmt: skip
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """A size in bytes from ``"8GiB"``, ``"512M"``, ``"1e9"``; ``"none"``: no limit.

    Example:
        >>> parse_size("8GiB"), parse_size("1.5k"), parse_size("none")
        (8589934592, 1536, None)
    """
    if text.strip().lower() == "none":
        return None
    match = _SIZE.fullmatch(text)
    unit = match and _UNITS.get(match[2].lower())
    number = float(match[1]) * unit if match and unit else math.nan
    if not (math.isfinite(number) and 1 <= number <= 2**63):
        raise argparse.ArgumentTypeError(
            f"must be a size such as 8GiB, 512MiB or 1000000 (bytes), or none for no limit; "
            f"got {text!r}"
        )
    return int(number)


def add_max_bytes(parser: argparse.ArgumentParser, default: int) -> None:
    """The ``--max-bytes`` option: the memory a command's tables may take."""
    parser.add_argument(
        "--max-bytes",
        type=parse_size,
        default=default,
        metavar="SIZE",
        help=f"memory the table may take, e.g. 16GiB, or none ({format_bytes(default)})",
    )
