"""What every ``posenc`` command shares: the usage error and the argument parser class.

A command lives in a module with ``add_parser(commands)``, which adds its sub-parser to
the top parser's sub-commands and sets ``handler`` (``set_defaults(handler=run)``) to its
``run(args) -> int | None`` (the exit status; ``None`` is 0). :func:`posenc.cli.main`
builds the top parser from these modules at each call and reports errors.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["Parser", "UsageError"]


class UsageError(Exception):
    """A bad command line: reported in one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :class:`UsageError` (one line, no usage text)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")
