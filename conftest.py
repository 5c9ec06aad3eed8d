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

# Docstring examples of these parts of the package need these packages.
NEEDS = {
    "src/posenc/torch": ("torch",),
    "src/posenc/keras": ("keras", os.environ["KERAS_BACKEND"]),
    "src/posenc/jax": ("jax",),
    "src/posenc/jax/linen": ("jax", "flax"),
    "src/posenc/plot": ("matplotlib",),
    "src/posenc/bench": ("torch",),
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
