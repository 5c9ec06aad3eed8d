"""The backend-agnostic Keras test files, run on the Keras backends this process does not use.

Keras fixes its backend when it is first imported (the root ``conftest.py`` picks
TensorFlow unless ``KERAS_BACKEND`` says otherwise), so the same files run here once per
other backend in a child pytest with ``KERAS_BACKEND`` set; a failure shows the child's
report. A backend whose package is missing is skipped with the reason in the summary
(and fails under ``POSENC_REQUIRE_ALL_FRONTENDS=1``, which ``scripts/test.sh`` sets).

The child runs what depends on the backend: ``fit`` steps, mixed precision, saving and
serialization, traced and symbolic calls, tensors of the backend as arguments. Tests
marked ``backend_independent`` run in this process only: each compares a layer's values
with the core where the conformance suite (``tests/conformance.py``) compares the same
layer's values on every Keras backend, eagerly, traced and decoded step by step, or checks
options that the specs validate in Python. On JAX every new shape of an eager operation
is an XLA compilation, so those value tests took about a third of the JAX child's time.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FILES = [
    "test_embeddings_and_bias.py",
    "test_rope.py",
    "test_rope_learned.py",
    "test_lengths.py",
    "test_keras_hub_swaps.py",
    "test_rope_nd.py",
    "test_cope.py",
    "test_kernel_bias.py",
    "test_tables.py",
]


def _in_process_backend() -> str | None:
    try:
        import keras
    except ImportError:
        return None
    return keras.backend.backend()


# The process's own backend runs the files directly; the others run here.
OTHER_BACKENDS = [b for b in ("tensorflow", "jax", "torch") if b != _in_process_backend()]


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_keras_files_on_backend(backend):
    missing = [name for name in ("keras", backend) if importlib.util.find_spec(name) is None]
    if missing:
        message = f"Keras on {backend}: {', '.join(missing)} not installed"
        if os.environ.get("POSENC_REQUIRE_ALL_FRONTENDS"):
            pytest.fail(f"{message}, but POSENC_REQUIRE_ALL_FRONTENDS is set")
        pytest.skip(message)
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    if backend == "jax":  # two host devices, for test_tables.py's tables on either
        flags = env.get("XLA_FLAGS", "")
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=2".strip()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not backend_independent",
            *(str(HERE / name) for name in FILES),
        ],
        cwd=HERE.parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    summary = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
    assert done.returncode == 0, (
        f"Keras test files on the {backend} backend failed (exit {done.returncode}): "
        f"{summary[0]}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    )
    assert " passed" in summary[0], summary[0]
