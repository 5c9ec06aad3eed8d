"""What a bench needs before its first run: a usable lm text, a device that exists here.

Checked once, before any run starts, so that a bad ``text`` file or a device this
machine lacks is one clear refusal instead of every run failing into the failure log.
:func:`check_specs` checks a list of specs (the Python API names ``text`` and
``device``); the command line calls :func:`check_text` and :func:`check_device` with its
own option names. PyTorch is imported only to ask about a GPU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from .spec import RunSpec

__all__ = ["check_device", "check_specs", "check_text", "text_characters_needed"]


def text_characters_needed(train_high: int, eval_high: int) -> int:
    """The fewest characters of an lm text whose parts fit every window.

    The first ``⌈0.9 N⌉`` characters train (windows of up to ``train_high``) and the
    last ``N - ⌈0.9 N⌉`` evaluate (windows of up to ``eval_high``); at least 20 in all
    (:class:`posenc.bench.tasks.TextTask`).

    Example:
        >>> text_characters_needed(16, 64)
        640
        >>> text_characters_needed(4, 1)
        20
    """
    n = max(20, train_high, 10 * eval_high)
    while math.ceil(0.9 * n) < train_high or n - math.ceil(0.9 * n) < eval_high:
        n += 1
    return n


def check_text(path: str | os.PathLike[str], specs: Sequence[RunSpec], name: str = "text") -> None:
    """Refuse an lm text file that is missing, not UTF-8 text, or too short for ``specs``.

    ``name`` is how the message calls the argument (``"--text"`` on the command line).

    Raises:
        ValueError: The file cannot be read, is not UTF-8, holds NUL characters (a binary
            file) or has fewer characters than the longest windows of ``specs`` need.

    Example:
        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     short = pathlib.Path(tmp, "short.txt")
        ...     _ = short.write_text("just a few words")
        ...     check_text(short, [RunSpec("lm", "rope", text=str(short))], "--text")
        Traceback (most recent call last):
        ...
        ValueError: --text .../short.txt must be UTF-8 text of at least 640 characters for \
the lm runs' lengths (training up to 16, evaluation up to 64; the last 10% is held out for \
evaluation), got 16 characters
    """
    lm = [spec for spec in specs if spec.task == "lm"] or list(specs)
    train_high = max((spec.train_lengths[1] for spec in lm), default=1)
    eval_high = max((max(spec.eval_lengths) for spec in lm), default=1)
    need = text_characters_needed(train_high, eval_high)
    rule = (
        f"{name} {os.fspath(path)} must be UTF-8 text of at least {need:,} characters for the "
        f"lm runs' lengths (training up to {train_high}, evaluation up to {eval_high}; the "
        "last 10% is held out for evaluation)"
    )
    try:
        with open(path, encoding="utf-8") as handle:
            content = handle.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{rule}; byte {exc.start} is not UTF-8") from None
    except OSError as exc:
        raise ValueError(f"{rule}; it cannot be read ({exc.strerror or exc})") from None
    if "\x00" in content:
        raise ValueError(f"{rule}; it holds NUL characters (a binary file?)")
    if len(content) < need:
        raise ValueError(f"{rule}, got {len(content):,} characters")


def check_device(device: str, name: str = "device", *, here: bool = True) -> None:
    """Refuse a device name that is not one, or (``here``) a device that this machine
    does not have (``"cpu"`` and ``"auto"`` always work; ``"cuda"``, ``"cuda:<n>"`` and
    ``"mps"`` need PyTorch to find them).

    Example:
        >>> check_device("cpu")
        >>> check_device("tpu", "--device")
        Traceback (most recent call last):
        ...
        ValueError: --device must be 'cpu', 'cuda', 'cuda:<n>', 'mps' or 'auto', got 'tpu'
    """
    valid = "'cpu', 'cuda', 'cuda:<n>', 'mps' or 'auto'"
    try:
        RunSpec("copy", "nope", device=device)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {valid}, got {device!r}") from None
    if not here or device in ("cpu", "auto"):
        return
    import torch

    if device == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(
                f"{name} mps: this machine has no MPS device (Apple GPU) that PyTorch can "
                "use; use cpu or auto"
            )
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        have = f"CUDA devices 0 .. {count - 1}" if count else "no CUDA device PyTorch can use"
        raise ValueError(f"{name} {device}: this machine has {have}; use cpu or auto")


def check_specs(specs: Sequence[RunSpec]) -> None:
    """:func:`check_text` for each lm text and :func:`check_device` for each device of
    ``specs``, as the Python API names them (``text``, ``device``)."""
    for path in sorted({spec.text for spec in specs if spec.text is not None}):
        check_text(path, [spec for spec in specs if spec.text == path], "text")
    for device in sorted({spec.device for spec in specs}):
        check_device(device, "device")
