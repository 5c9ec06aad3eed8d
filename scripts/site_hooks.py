"""MkDocs hooks of the documentation site: what posenc makes each time the site is built.

* The pictures: each entry of :data:`PICTURES` is drawn by :mod:`posenc.plot` and added
  to the site as ``pictures/NAME.png``, so a page shows what the code draws today,
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

PICTURES: dict[str, tuple[str, dict[str, Any]]] = {
    # name: (function of posenc.plot, its keyword arguments)
    "heatmap": ("heatmap", {}),
    "sinusoids": ("sinusoids", {}),
    "dimensions": ("dimensions", {}),
    "first-positions": ("first_positions", {}),
    "long-range": ("long_range", {}),
    "wavelengths": ("wavelength_spectrum", {}),
    "similarity": ("similarity", {}),
    "grid": ("grid", {}),
    "rope-spectrum": ("rope_spectrum", {}),
    "rope-spectrum-ntk": ("rope_spectrum", {"methods": ("default", "ntk", "dynamic_ntk")}),
    "rope-score": ("rope_score", {}),
    "alibi": ("alibi", {}),
    "alibi-symmetric": ("alibi", {"mode": "symmetric"}),
    "t5": ("t5", {}),
    "t5-causal": ("t5", {"bidirectional": False}),
    "sandwich": ("sandwich", {}),
    "xpos": ("xpos", {}),
}
"""The pictures of the site: ``pictures/NAME.png`` is ``posenc.plot.FUNCTION(**kwargs)``."""

REPOSITORY: dict[str, str] = {
    # site path: repository path
    "benchmarks/RESULTS.md": "benchmarks/RESULTS.md",
    "benchmarks/kv-cache-error.png": "benchmarks/results/unreleased-kv-cache/kv-cache-error.png",
}
"""Files of the repository outside ``docs/`` that the site publishes as they are."""


def picture(function: str, kwargs: dict[str, Any]) -> bytes:
    """The PNG of ``posenc.plot.FUNCTION(**kwargs)`` at the size ``posenc plot`` saves."""
    from posenc import plot

    figure = getattr(plot, function)(**kwargs)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def on_files(files: Files, config: MkDocsConfig, **kwargs: Any) -> Files:
    """Add the pictures, the explorer and the repository's files to the site."""
    import matplotlib

    matplotlib.use("Agg")
    from posenc.explore import DEFAULT_PATH, explorer_html

    for name, (function, arguments) in PICTURES.items():
        content = picture(function, arguments)
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
