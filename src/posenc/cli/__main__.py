"""``python -m posenc.cli ARGS`` is ``posenc ARGS``."""

from __future__ import annotations

import sys

from posenc.cli import main

if __name__ == "__main__":
    sys.exit(main())
