"""The long text that perplexity is measured on.

The default is the Python documentation that every Python installation ships:
``pydoc_data.topics``, the language reference and library topics that ``help()`` shows
(about 465,000 characters of English prose with code examples on Python 3.11, about
113,000 tokens with a 49,152-token BPE vocabulary), the topics joined in the order of
their names. Nothing is downloaded. The text differs between Python versions, so every
record carries the text's digest (and :meth:`~posenc.extend.probes.Probe.key` holds it):
results of two versions are never mixed. Any UTF-8 file can be used instead.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from .._checks import describe
from .probes import digest

__all__ = ["DEFAULT_TEXT", "load_text"]

#: What the default text is, as records and reports name it.
DEFAULT_TEXT = "the Python documentation's pydoc_data.topics"


@functools.lru_cache(maxsize=4)
def load_text(path: str | None = None) -> tuple[str, str, str]:
    """``(text, source, digest)`` of the file at ``path`` (UTF-8), or of the default text.

    Raises:
        FileNotFoundError: No file at ``path``.
        ValueError: The file is not UTF-8, or is empty.

    Example:
        >>> text, source, sha = load_text()
        >>> source, len(sha), len(text) > 100_000
        ("the Python documentation's pydoc_data.topics", 16, True)
    """
    if path is None:
        from pydoc_data.topics import topics

        text = "\n\n".join(topics[name] for name in sorted(topics))
        return text, DEFAULT_TEXT, digest(text.encode("utf-8"))
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"text must be a path or None, got {describe(path)}")
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"text file {str(file)!r} does not exist (or is not a file)")
    data = file.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"text file {str(file)!r} is not valid UTF-8: {exc}") from None
    if not text.strip():
        raise ValueError(f"text file {str(file)!r} is empty")
    return text, str(file), digest(data)
