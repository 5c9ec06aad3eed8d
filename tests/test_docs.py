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
    "posenc.extend": "transformers",
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


ARGS = ("Args:", "Arguments:", "Parameters:")


def documented_parameters(docstring: str) -> list[str]:
    """The names an ``Args:`` section documents; ``a, b: ...`` documents both."""
    names: list[str] = []
    lines = docstring.splitlines()
    for i, line in enumerate(lines):
        if line.strip() not in ARGS:
            continue
        indent = None
        for entry in lines[i + 1 :]:
            if not entry.strip():
                continue
            depth = len(entry) - len(entry.lstrip())
            if indent is None:
                indent = depth
            if depth < indent:
                break  # the section ended
            if depth == indent:
                head = entry.strip().split(":", 1)[0]
                names += [name.strip().lstrip("*") for name in head.split(",")]
    return names


@pytest.mark.parametrize("package", list(PACKAGES))
def test_every_documented_parameter_is_in_the_signature(package):
    """The check griffe would make, for posenc's grouped entries (``cos, sin: ...``): a
    renamed or removed parameter cannot stay documented (mkdocs.yml turns griffe's own
    check off, since it reads ``cos, sin`` as one name)."""
    if PACKAGES[package]:
        pytest.importorskip(PACKAGES[package])
    stale = []
    for name, obj in public(package):
        target = obj.__init__ if inspect.isclass(obj) else obj
        try:
            parameters = set(inspect.signature(target).parameters)
        except (TypeError, ValueError):  # a signature Python cannot read
            continue
        stale += [
            f"{name}: {documented}"
            for documented in documented_parameters(inspect.getdoc(obj) or "")
            if documented not in parameters
        ]
    assert stale == [], f"{package}: documented parameters that are not in the signature"


def test_documented_parameters_reads_grouped_entries_and_ends_with_the_section():
    docstring = """Summary.

    Args:
        cos, sin: Tables, which
            continue here: not a name.
        *args: More.

    Returns:
        value: not a parameter.
    """
    assert documented_parameters(inspect.cleandoc(docstring)) == ["cos", "sin", "args"]
