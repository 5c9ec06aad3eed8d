"""``python -m posenc.bench ARGS`` is ``posenc bench ARGS``."""

from __future__ import annotations

import sys

from posenc.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
