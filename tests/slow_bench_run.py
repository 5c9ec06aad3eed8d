"""A bench run function for the interruption tests: slow, and it leaves a trace.

Module-level so that spawned bench workers can import it (``PYTHONPATH`` holds tests/).
Each call writes its process id to ``$POSENC_TEST_TRACE/<pid>``, sleeps
``$POSENC_TEST_SLEEP`` seconds and, given ``$POSENC_TEST_GATE``, waits until that file
exists before returning a record.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def slow_run(spec, *, progress=None):
    trace = os.environ.get("POSENC_TEST_TRACE")
    if trace:
        Path(trace, str(os.getpid())).write_text(spec.key())
    time.sleep(float(os.environ.get("POSENC_TEST_SLEEP", "0.3")))
    gate = os.environ.get("POSENC_TEST_GATE")
    while gate and not Path(gate).exists():
        time.sleep(0.02)
    return {"key": spec.key(), "spec": spec.to_dict(), "results": [], "train_loss": 0.0}
