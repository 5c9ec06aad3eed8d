"""A griffe extension for the API reference: posenc's docstrings read as they are meant.

posenc's docstrings follow Google style with Sphinx's cross-reference roles, as Python's
own documentation tools read them. Before griffe parses a docstring this extension:

* renames ``Example:`` headings (which Google's guide and Sphinx's Napoleon accept) to
  ``Examples:``, the one griffe's Google parser knows, so the doctests show as code
  rather than as a note whose ``>>>`` lines are prose;
* writes a role such as ``:func:`posenc.sinusoidal``` (``:class:``, ``:mod:``,
  ``:meth:``, ``:attr:``, ``:data:``, ``:exc:``) as the code span ```posenc.sinusoidal```,
  which Markdown renders; the name shows as written, without the role.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_HEADING = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):`[~.]?([^`]+)`")


def rewrite(obj: griffe.Object) -> None:
    """Rewrite ``obj``'s docstring in place (see the module's docstring)."""
    if obj.docstring is not None:
        text = _HEADING.sub(r"\1Examples:", obj.docstring.value)
        obj.docstring.value = _ROLE.sub(r"`\1`", text)


class PosencDocstrings(griffe.Extension):
    """``Example:`` → ``Examples:``, and roles → code, in every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        rewrite(obj)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        rewrite(pkg)  # the top package, which on_object is not called for
