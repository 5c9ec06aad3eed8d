"""A griffe extension for the API reference: posenc's ``Example:`` sections as examples.

posenc's docstrings follow Google style and head their doctests ``Example:``, which
Google's guide and Sphinx's Napoleon accept; griffe's Google parser knows only
``Examples:``, and would render ``Example:`` as a note whose ``>>>`` lines are prose.
This renames the heading before griffe parses a docstring, so that the examples show as
code, as in the source.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_HEADING = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """``Example:`` → ``Examples:`` in every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _HEADING.sub(r"\1Examples:", obj.docstring.value)
