"""A bench run function for the interruption tests: slow, and it leaves a trace.

Module-level so that spawned bench workers can import it (``PYTHONPATH`` holds tests/).
Each call writes its process id to ``$POSENC_TEST_TRACE/<pid>`` and sleeps
``$POSENC_TEST_SLEEP`` seconds before returning a record.
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
    return {"key": spec.key(), "spec": spec.to_dict(), "results": [], "train_loss": 0.0}
