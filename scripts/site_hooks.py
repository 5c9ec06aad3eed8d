"""MkDocs hooks of the documentation site: what posenc makes each time the site is built.

* The pictures: every kind of ``posenc plot`` with its defaults, and each entry of
  :data:`VARIANTS`, is drawn by :mod:`posenc.plot` and added to the site as
  ``pictures/NAME.png``, so a page shows what the code draws today,
  never a checked-in copy. A page links one as ``![...](pictures/NAME.png)`` (with as
  many ``../`` as the page is deep).
* The explorer: ``posenc-explorer.html`` (:func:`posenc.explore.explorer_html`),
  embedded by ``explorer.md``.
* Files of the repository outside ``docs/`` that pages link to (:data:`REPOSITORY`):
  the benchmark results, as they are committed.
"""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

LOG = logging.getLogger("mkdocs.hooks.posenc")
# What a docstring looks like when scripts/griffe_docstrings.py missed it: a Sphinx role
# left as text, or an "Example:" section drawn as a note instead of code.
UNREAD = re.compile(r":(?:func|class|mod|meth|attr|data|exc):<code>|<details class=\"example\"")

ROOT = Path(__file__).resolve().parents[1]

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    # name: (a kind of `posenc plot`, the keyword arguments of its function)
    "rope-spectrum-ntk": ("rope-spectrum", {"methods": ("default", "ntk", "dynamic_ntk")}),
    "alibi-symmetric": ("alibi", {"mode": "symmetric"}),
    "t5-causal": ("t5", {"bidirectional": False}),
}
"""The site's pictures besides every kind of ``posenc plot`` with its defaults
(``pictures/KIND.png``, one per :data:`posenc.plot.PICTURES` entry)."""

REPOSITORY: dict[str, str] = {
    # site path: repository path
    "benchmarks/RESULTS.md": "benchmarks/RESULTS.md",
    "benchmarks/kv-cache-error.png": "benchmarks/results/unreleased-kv-cache/kv-cache-error.png",
}
"""Files of the repository outside ``docs/`` that the site publishes as they are."""


def picture(kind: str, kwargs: dict[str, Any]) -> bytes:
    """The PNG of the ``posenc plot`` KIND's function with ``kwargs``, at the size
    ``posenc plot`` saves."""
    from posenc.plot import PICTURES

    figure = PICTURES[kind].function(**kwargs)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def on_files(files: Files, config: MkDocsConfig, **kwargs: Any) -> Files:
    """Add the pictures, the explorer and the repository's files to the site."""
    import matplotlib

    matplotlib.use("Agg")
    from posenc.explore import DEFAULT_PATH, explorer_html
    from posenc.plot import PICTURES

    pictures = {kind: (kind, {}) for kind in PICTURES} | VARIANTS
    for name, (kind, arguments) in pictures.items():
        content = picture(kind, arguments)
        files.append(File.generated(config, f"pictures/{name}.png", content=content))
    files.append(File.generated(config, DEFAULT_PATH, content=explorer_html()))
    for uri, path in REPOSITORY.items():
        files.append(File.generated(config, uri, abs_src_path=str(ROOT / path)))
    return files


def on_post_page(output: str, page: Page, config: MkDocsConfig, **kwargs: Any) -> str:
    """Warn (an error under ``--strict``) about a docstring rendered without the rewrite."""
    found = UNREAD.search(output)
    if found:
        LOG.warning("%s: a docstring is rendered unread: %r", page.file.src_uri, found[0])
    return output
