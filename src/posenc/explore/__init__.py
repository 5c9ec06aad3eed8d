"""An interactive explorer of positional encodings: one self-contained HTML page.

:func:`write_explorer` writes a page (``posenc explore`` on the command line) with five
panels: the sinusoidal matrix and one position's vector; columns against position and
the dot product against offset; RoPE's wavelength of each frequency pair under every
registered scaling method and the score against distance; ALiBi's slopes and one head's
bias; T5's bucket matrix and bucket rule. Each has controls (sliders, lists, boxes).

Every number on the page comes from posenc's core, computed when the page is written
for each combination of the settings in :data:`GRID`; the page's script only picks the
arrays of the chosen setting and hands them to Plotly, whose script is inlined, so the
file works offline, from disk, with nothing fetched. Needs Plotly
(``pip install "posenc[explore]"``) to write the page, nothing to view it.

The page is about 7.6 MB: Plotly's script is 4.8 MB of it, the numbers 2.7 MB (base64
of the float32 tables and float64 curves, each distinct array once). A grid that would
take the page past :data:`MAX_PAGE_BYTES` is refused when the page is written: a page
grows with the product of its controls' ranges, and one that a browser (or a reader of
the documentation site, where the same page is embedded) must load whole should stay a
download of seconds.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from .. import __version__
from .._extras import require
from .._files import atomic_write, check_output_path
from ._data import GRID, explorer_data

__all__ = ["DEFAULT_PATH", "GRID", "MAX_PAGE_BYTES", "explorer_html", "write_explorer"]

DEFAULT_PATH = "posenc-explorer.html"
"""Where ``posenc explore`` writes the page unless told otherwise."""

MAX_PAGE_BYTES = 10 * 1024 * 1024
"""The largest page written (10 MiB): Plotly's script (4.8 MB) and twice the numbers
the default grid holds."""


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def explorer_html() -> str:
    """The explorer page: HTML with its script, style, Plotly and numbers inlined.

    Returns:
        The whole page, a ``str`` of at most :data:`MAX_PAGE_BYTES` bytes in UTF-8.

    Raises:
        ImportError: Plotly is not installed.
        ValueError: The page would be larger than :data:`MAX_PAGE_BYTES`.

    Example:
        >>> page = explorer_html()
        >>> page.startswith("<!DOCTYPE html>"), "https://" in page.split("<script")[0]
        (True, False)
    """
    plotly = require("plotly.offline", "posenc explore")
    data = json.dumps(explorer_data(), separators=(",", ":"), allow_nan=False)
    parts = {
        "@VERSION@": __version__,
        "@STYLE@": _asset("page.css"),
        "@PLOTLY@": plotly.get_plotlyjs(),
        "@DATA@": data.replace("</", "<\\/"),  # never ends its <script> element
        "@SCRIPT@": _asset("page.js"),
    }
    page = _asset("page.html")
    for marker in ("@VERSION@", "@STYLE@", "@DATA@", "@SCRIPT@", "@PLOTLY@"):
        # Plotly last: its script is not searched for the other markers.
        page = page.replace(marker, parts[marker])
    size = len(page.encode("utf-8"))
    if size > MAX_PAGE_BYTES:
        raise ValueError(
            f"the explorer page would be {size:,} bytes, more than MAX_PAGE_BYTES = "
            f"{MAX_PAGE_BYTES:,}; offer fewer settings in posenc.explore.GRID"
        )
    return page


def write_explorer(path: str | os.PathLike[str] = DEFAULT_PATH) -> Path:
    """Write the explorer page to ``path``, whole or not at all.

    Args:
        path: The HTML file to write. Its folder must exist; an existing file is
            replaced only once the new page is complete.

    Returns:
        The path written.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     written = write_explorer(Path(folder, "explorer.html"))
        ...     written.name, 7_000_000 < written.stat().st_size <= MAX_PAGE_BYTES
        ('explorer.html', True)
    """
    path = check_output_path(path)  # before the seconds the page takes
    page = explorer_html()
    with atomic_write(path) as file:
        file.write(page)
    return path
