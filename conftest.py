"""pytest's set-up for the whole repository: the test suite and the docstring examples.

``pytest`` runs ``tests/`` and every docstring example in ``src/posenc``
(``--doctest-modules``, see ``pyproject.toml``). Keras picks its backend when it is first
imported, so it is set here, before any test or module imports it: TensorFlow unless
``KERAS_BACKEND`` says otherwise. A front end whose framework is not installed has its
modules' examples left out, with a notice (under ``POSENC_REQUIRE_ALL_FRONTENDS=1``, which
``scripts/test.sh`` sets, that is an error instead).
"""

from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One compute thread per framework in the test process, set before any framework is
# imported: the suite's models and tensors are tiny, and a second thread per process
# mostly waits for a core (on a shared two-core machine six model-training tests took
# 102 s with PyTorch's default threads, 11.5 s with one). A test about threads sets its
# own count; a variable already set is kept.
for _variable in (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
):
    os.environ.setdefault(_variable, "1")

# Docstring examples of these parts of the package need these packages.
NEEDS = {
    "src/posenc/torch": ("torch",),
    "src/posenc/keras": ("keras", os.environ["KERAS_BACKEND"]),
    "src/posenc/jax": ("jax",),
    "src/posenc/jax/linen": ("jax", "flax"),
    "src/posenc/plot": ("matplotlib",),
    "src/posenc/explore": ("plotly",),
    "src/posenc/bench": ("torch",),
    "src/posenc/extend": ("torch", "transformers"),
}

collect_ignore: list[str] = []
_missing: dict[str, list[str]] = {}
for _path, _packages in NEEDS.items():
    _absent = [name for name in _packages if importlib.util.find_spec(name) is None]
    if _absent:
        collect_ignore.append(_path)
        _missing[_path] = _absent
if _missing and os.environ.get("POSENC_REQUIRE_ALL_FRONTENDS"):
    raise RuntimeError(
        f"POSENC_REQUIRE_ALL_FRONTENDS is set, but the examples of {_missing} cannot run"
    )


def pytest_report_header() -> list[str]:
    return [f"docstring examples left out (missing packages): {_missing}"] if _missing else []
