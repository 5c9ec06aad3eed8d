"""docs/cli.md, the command line's page: every ``posenc`` line of its ``bash`` blocks runs
and exits 0, and the page keeps up with the commands.

The site's conventions: each line of a ``bash`` block that begins with ``posenc`` (with
``\\`` continuations) runs in a temporary folder; a block that cannot run says why in an
HTML comment on the line before it, ``<!-- not run: the reason -->``; output goes in
``text`` blocks, which are not run; links to other pages are relative ``.md`` links
within docs/.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from posenc.cli import _parser, main
from posenc.cli.plot import kinds_help

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = DOCS / "cli.md"
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->\s*$")


def blocks(language: str) -> list[tuple[int, list[str], str | None]]:
    """``(line, body lines, reason not to run)`` of every fenced block of ``language``."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == f"```{language}":
            start, body = i, []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            match = NOT_RUN.search(lines[start - 1]) if start else None
            found.append((start + 2, body, match.group(1) if match else None))
        i += 1
    return found


def commands(body: list[str]) -> list[str]:
    """The ``posenc`` command lines of a block, continuations joined."""
    joined, lines = [], iter(body)
    for line in lines:
        if not line.startswith("posenc"):
            continue
        while line.endswith("\\"):
            line = line[:-1] + " " + next(lines).strip()
        joined.append(line)
    return joined


RUN = [
    (f"cli.md:{line}", command)
    for line, body, reason in blocks("bash")
    if reason is None
    for command in commands(body)
]


def test_the_page_has_commands_and_each_block_not_run_says_why():
    assert len(RUN) >= 15
    for line, body, reason in blocks("bash"):
        assert commands(body), f"cli.md:{line}: a bash block without a posenc line"
        assert reason is None or len(reason) > 10, f"cli.md:{line}: say why it cannot run"


@pytest.mark.slow
@pytest.mark.parametrize(("where", "command"), RUN, ids=[where for where, _ in RUN])
def test_every_command_of_the_page_exits_0(where, command, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    words = shlex.split(command)
    assert words[0] == "posenc"
    try:
        status = main(words[1:])
    except SystemExit as exc:  # --help, --version
        status = exc.code
    assert status in (0, None), f"{where}: {command}: {capsys.readouterr().err}"


def test_the_page_lists_the_kinds_as_posenc_plot_help_does():
    texts = ["\n".join(body) for _, body, _ in blocks("text")]
    assert kinds_help() in texts


@pytest.mark.parametrize("command", ["table", "plot", "embed", "demo", "convert-rope"])
def test_the_page_names_every_option_of_every_command(command):
    text = PAGE.read_text(encoding="utf-8")
    parser = _parser()[1][command]
    named = [a.option_strings[0] for a in parser._actions if a.option_strings and a.dest != "help"]
    missing = [option for option in named if f"`{option}" not in text]
    assert missing == [], f"docs/cli.md does not document posenc {command} {missing}"


def test_links_stay_within_docs():
    text = PAGE.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert links, "the page links to the others"
    for link in links:
        page, _, _ = link.partition("#")
        assert page.endswith(".md"), link
        assert "/" not in page, link  # a page of docs/, never a file outside it
        assert (DOCS / page).is_file(), link
