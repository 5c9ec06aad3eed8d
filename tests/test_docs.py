"""Every public function and class shows an example, and every example runs.

pytest runs the docstring examples of every module of ``src/posenc`` itself
(``--doctest-modules`` in ``pyproject.toml``; the root ``conftest.py`` leaves out only the
front ends whose framework is missing). This file checks the other half: that the public
API, every function and class in the ``__all__`` of posenc and of its front ends and
tools, has an example to run in its own docstring.
"""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

PACKAGES = {
    "posenc": None,
    "posenc.specs": None,
    "posenc.core": None,
    "posenc.core.rope": None,
    "posenc.core.rope_nd": None,
    "posenc.torch": "torch",
    "posenc.keras": "keras",
    "posenc.jax": "jax",
    "posenc.jax.linen": "flax",
    "posenc.plot": "matplotlib",
    "posenc.bench": "torch",
}


def public(package: str) -> list[tuple[str, object]]:
    module = importlib.import_module(package)
    names = [name for name in module.__all__ if not name.startswith("_")]
    return [
        (name, obj)
        for name in names
        if inspect.isfunction(obj := getattr(module, name)) or inspect.isclass(obj)
    ]


@pytest.mark.parametrize("package", list(PACKAGES))
def test_every_public_function_and_class_has_an_example(package):
    if PACKAGES[package]:
        pytest.importorskip(PACKAGES[package])
    finder = doctest.DocTestFinder(recurse=False)
    missing = [
        name
        for name, obj in public(package)
        if not any(test.examples for test in finder.find(obj, name))
    ]
    assert missing == [], f"{package}: give these an Example section: {missing}"
