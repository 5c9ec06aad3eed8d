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

The page is about 7.6 MB: Plotly's script (4.8 MB in Plotly 7.1) and the numbers, 2.7 MB
(base64 of the float32 tables and float64 curves, each distinct array once). Numbers past
:data:`MAX_DATA_BYTES` are refused when the page is written: they grow with the product
of the controls' ranges, and a page that a browser (or a reader of the documentation
site, where the same page is embedded) must load whole should stay a download of
seconds.
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

__all__ = ["DEFAULT_PATH", "GRID", "MAX_DATA_BYTES", "explorer_html", "write_explorer"]

DEFAULT_PATH = "posenc-explorer.html"
"""Where ``posenc explore`` writes the page unless told otherwise."""

MAX_DATA_BYTES = 4 * 1024 * 1024
"""The most bytes of numbers a page holds (4 MiB, half again the default grid's 2.7 MB);
with Plotly's script the page stays under 10 MB."""


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def explorer_html() -> str:
    """The explorer page: HTML with its script, style, Plotly and numbers inlined.

    Returns:
        The whole page, a ``str``: Plotly's script and at most :data:`MAX_DATA_BYTES`
        bytes of numbers.

    Raises:
        ImportError: Plotly is not installed.
        ValueError: The numbers would be more than :data:`MAX_DATA_BYTES`.

    Example:
        >>> page = explorer_html()
        >>> page.startswith("<!DOCTYPE html>"), "https://" in page.split("<script")[0]
        (True, False)
    """
    plotly = require("plotly.offline", "posenc explore")
    data = json.dumps(explorer_data(), separators=(",", ":"), allow_nan=False)
    if len(data) > MAX_DATA_BYTES:  # ASCII: characters are bytes
        raise ValueError(
            f"the explorer's numbers would take {len(data):,} bytes, more than "
            f"MAX_DATA_BYTES = {MAX_DATA_BYTES:,}; offer fewer settings in posenc.explore.GRID"
        )
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
        ...     written.name, written.stat().st_size > 4_000_000  # Plotly and the numbers
        ('explorer.html', True)
    """
    path = check_output_path(path)  # before the seconds the page takes
    page = explorer_html()
    with atomic_write(path) as file:
        file.write(page)
    return path
