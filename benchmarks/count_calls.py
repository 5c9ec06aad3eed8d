"""How much of posenc a module's build and forward go through: calls, functions and files.

Not a timing. ``sys.setprofile`` sees every Python call; a call counts when its code lives
in posenc's package directory (the ``posenc`` that this interpreter imports, so
``PYTHONPATH=<another tree>/src`` measures another revision). Each operation runs once to
warm up (imports, caches of the core, a first table), then once measured, so the counts
are those of a module built or called in a program that already uses posenc:

* ``build RotaryEmbedding(64, max_length=2048)``: a spec no live module has (a fresh
  ``base`` each run), so the build computes its tables;
* ``build RotaryEmbedding(64, max_length=2048)``, another layer: the spec of a live module
  (the other layers of a model), so the build finds its tables in the core's cache;
* ``build SinusoidalPositionalEncoding(512)``: the same, a fresh ``max_length`` each run;
* ``RotaryEmbedding forward``: q and k of shape ``(2, 8, 128, 64)``;
* ``RotaryEmbedding`` decoding step: q ``(1, 32, 1, 64)`` and k ``(1, 8, 1, 64)`` at
  ``offset=100``;
* ``SinusoidalPositionalEncoding forward``: x of shape ``(2, 128, 512)``.

Usage::

    python benchmarks/count_calls.py            # prints a Markdown table
    python benchmarks/count_calls.py --files    # and the files each operation visits
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

import posenc

ROOT = os.path.dirname(os.path.abspath(posenc.__file__)) + os.sep


def count(operation: Callable[[], Any]) -> Counter[tuple[str, str]]:
    """The posenc calls ``operation()`` makes: ``(file, function)`` → number of calls."""
    calls: Counter[tuple[str, str]] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(ROOT):
            calls[frame.f_code.co_filename[len(ROOT) :], frame.f_code.co_qualname] += 1

    sys.setprofile(profile)
    try:
        operation()
    finally:
        sys.setprofile(None)
    return calls


def operations() -> dict[str, Callable[[int], Any]]:
    """Each measured operation as a function of the run's index (0: the warm-up)."""
    from posenc.torch import RotaryEmbedding, SinusoidalPositionalEncoding

    rope = RotaryEmbedding(64, max_length=2048)
    sinusoidal = SinusoidalPositionalEncoding(512, dropout=0.0).eval()
    q, k = torch.randn(2, 8, 128, 64), torch.randn(2, 8, 128, 64)
    x = torch.randn(2, 128, 512)
    q1, k1 = torch.randn(1, 32, 1, 64), torch.randn(1, 8, 1, 64)
    return {
        "build `RotaryEmbedding(64, max_length=2048)`": lambda i: RotaryEmbedding(
            64, max_length=2048, base=10000.0 + i
        ),
        "build `RotaryEmbedding(64, max_length=2048)`, another layer": lambda i: RotaryEmbedding(
            64, max_length=2048
        ),  # the spec of `rope`, alive
        "build `SinusoidalPositionalEncoding(512)`": lambda i: SinusoidalPositionalEncoding(
            512, max_length=5000 + i
        ),
        "`RotaryEmbedding` forward, `(2, 8, 128, 64)`": lambda i: rope(q, k),
        "`RotaryEmbedding` decoding step, `(1, 32, 1, 64)`": lambda i: rope(q1, k1, offset=100),
        "`SinusoidalPositionalEncoding` forward, `(2, 128, 512)`": lambda i: sinusoidal(x),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", action="store_true", help="list the files visited")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"posenc from `{ROOT}`, torch {torch.__version__}\n")
    print("| operation | calls | functions | files |\n|---|---|---|---|")
    visited = {}
    with torch.no_grad():
        for name, operation in operations().items():
            operation(0)  # warm-up: imports and the core's caches
            calls = count(lambda op=operation: op(1))
            files = sorted({file for file, _ in calls})
            visited[name] = files
            print(f"| {name} | {sum(calls.values())} | {len(calls)} | {len(files)} |")
    if args.files:
        for name, files in visited.items():
            print(f"\n{name}: " + ", ".join(files))


if __name__ == "__main__":
    main()
