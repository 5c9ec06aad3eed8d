"""Every Python block of README.md runs as written.

The blocks run in order, in one namespace, as a reader pasting them into one session
would (later blocks use the imports of earlier ones). A block that cannot run here says
why in an HTML comment on the line before it: ``<!-- not run: the reason -->``.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->\s*$")
PACKAGES = ("torch", "keras", "tensorflow", "jax", "flax", "ml_dtypes")


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """``(line, code, reason not to run)`` of every fenced ``python`` block."""
    lines = text.splitlines()
    blocks: list[tuple[int, str, str | None]] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, body = i + 1, []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            previous = lines[start - 2] if start >= 2 else ""
            match = NOT_RUN.search(previous)
            blocks.append((start + 1, "\n".join(body) + "\n", match.group(1) if match else None))
        i += 1
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_the_readme_has_python_blocks_and_each_not_run_block_says_why():
    assert len(BLOCKS) >= 5
    for line, _, reason in BLOCKS:
        assert reason is None or len(reason) > 10, f"README.md:{line}: say why it cannot run"


def test_every_python_block_runs(tmp_path, monkeypatch):
    missing = [name for name in PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        message = f"the README's examples need {', '.join(missing)}"
        if os.environ.get("POSENC_REQUIRE_ALL_FRONTENDS"):
            pytest.fail(f"{message}, but POSENC_REQUIRE_ALL_FRONTENDS is set")
        pytest.skip(message)
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    namespace: dict[str, object] = {"__name__": "__readme__"}
    for line, code, reason in BLOCKS:
        if reason is not None:
            continue
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"the block at README.md:{line} failed: {error!r}") from error
