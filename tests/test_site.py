"""Every code example of the README and of the documentation site runs as written.

Each page's ``python`` blocks run in order, in one namespace, as a reader pasting them
into one session would (later blocks use the imports of earlier ones), in a temporary
folder. Each ``bash`` (or ``sh``) block's commands run there too: every command line of such a block
must be a ``posenc`` command (``\\`` continues a line, ``#`` starts a comment), run through
the CLI's ``main`` and expected to exit with status 0. What a page registers (a bench
task, a scheme, a RoPE scaling) is unregistered after it. A block that cannot run says why
in an HTML comment on the line before it: ``<!-- not run: the reason -->``. Blocks of
other languages (``text``, plain) are output, not examples: a Python block that prints
is followed by the ``text`` block of what it prints (the next block of the page), and
the two must agree.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(\s*)```(\w*)")
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->\s*$")
PACKAGES = ("torch", "keras", "tensorflow", "jax", "flax", "ml_dtypes", "matplotlib", "plotly",
            "transformers", "safetensors")  # fmt: skip


@dataclass
class Block:
    page: Path
    line: int  # of the block's first line of code
    language: str
    code: str
    not_run: str | None  # the reason, for a block that cannot run
    shown: str | None = None  # a text block that follows it: the output it shows

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced ``python`` and ``bash`` (or ``sh``) blocks of ``page``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, language = fence.groups()
        start, body = i + 1, []
        i += 1
        while not lines[i].strip().startswith("```"):
            body.append(lines[i].removeprefix(indent))
            i += 1
        i += 1
        if language == "text" and found and found[-1].shown is None:
            found[-1].shown = "\n".join(body)
            continue
        if found and found[-1].shown is None:
            found[-1].shown = ""  # another block came first: it shows no output
        if language in ("python", "bash", "sh"):
            previous = lines[start - 2] if start >= 2 else ""
            match = NOT_RUN.search(previous)
            found.append(Block(page, start + 1, language, "\n".join(body) + "\n",
                               match.group(1) if match else None))  # fmt: skip
    return found


def commands(block: Block) -> list[list[str]]:
    """The ``posenc`` commands of a bash block, as argument lists."""
    joined = block.code.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] != "posenc":
            raise AssertionError(
                f"{block.where}: {line.strip()!r} is not a posenc command; mark the block "
                "<!-- not run: the reason --> if it cannot run"
            )
        found.append(words[1:])
    return found


ALL = {page: blocks(page) for page in PAGES}


def test_the_pages_have_examples_and_each_not_run_block_says_why():
    assert sum(len(found) for found in ALL.values()) >= 80  # 86 when written
    for found in ALL.values():
        for block in found:
            assert block.not_run is None or len(block.not_run) > 10, f"{block.where}: say why"


def run_python(block: Block, namespace: dict[str, object]) -> None:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block.code, block.where, "exec"), namespace)
    except Exception as error:
        raise AssertionError(f"the block at {block.where} failed: {error!r}") from error
    printed = out.getvalue().rstrip("\n")
    if printed and block.shown:
        assert printed == block.shown.rstrip("\n"), (
            f"{block.where} prints what its text block does not show"
        )


def run_bash(block: Block) -> None:
    from posenc.cli import main

    for argv in commands(block):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as exit:  # --help and --version end this way
                status = exit.code or 0
        assert status == 0, (
            f"{block.where}: posenc {shlex.join(argv)} -> {status}: {err.getvalue()}"
        )


@pytest.fixture
def registries():
    """Restore the registries a page's examples may add to."""
    from posenc import schemes
    from posenc.bench import plugins
    from posenc.core.rope import registry

    kept = [(table, dict(table)) for table in (plugins._TASKS, plugins._SCHEMES,
                                               registry._SPECS, schemes._SCHEMES)]  # fmt: skip
    yield
    for table, entries in kept:
        table.clear()
        table.update(entries)


@pytest.mark.parametrize(
    "page", [page for page, found in ALL.items() if found], ids=lambda p: str(p.relative_to(ROOT))
)
@pytest.mark.usefixtures("registries")
def test_every_example_of_the_page_runs(page, tmp_path, monkeypatch):
    missing = [name for name in PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        message = f"the pages' examples need {', '.join(missing)}"
        if os.environ.get("POSENC_REQUIRE_ALL_FRONTENDS"):
            pytest.fail(f"{message}, but POSENC_REQUIRE_ALL_FRONTENDS is set")
        pytest.skip(message)
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    namespace: dict[str, object] = {"__name__": "__page__"}
    for block in ALL[page]:
        if block.not_run is not None:
            continue
        if block.language == "python":
            run_python(block, namespace)
        else:
            run_bash(block)
