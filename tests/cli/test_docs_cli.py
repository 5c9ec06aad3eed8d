"""docs/cli.md, the command line's page, keeps up with the commands.

Its examples run with every other page's (``tests/test_site.py``) and its links are
checked by the site's strict build; here: it names every option of every command, and
lists the picture kinds as ``posenc plot --help`` does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from posenc.cli import _parser
from posenc.cli.plot import kinds_help

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
TEXT_BLOCK = re.compile(r"^```text\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_the_page_lists_the_kinds_as_posenc_plot_help_does():
    texts = [body.rstrip("\n") for body in TEXT_BLOCK.findall(PAGE.read_text(encoding="utf-8"))]
    assert kinds_help() in texts


@pytest.mark.parametrize("command", ["table", "plot", "embed", "demo", "explore", "convert-rope"])
def test_the_page_names_every_option_of_every_command(command):
    text = PAGE.read_text(encoding="utf-8")
    parser = _parser()[1][command]
    named = [a.option_strings[0] for a in parser._actions if a.option_strings and a.dest != "help"]
    missing = [option for option in named if f"`{option}" not in text]
    assert missing == [], f"docs/cli.md does not document posenc {command} {missing}"
