"""Every docstring example in the package runs and prints what it says."""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest

MODULES = {
    "posenc": None,
    "posenc.core.frequencies": None,
    "posenc.core.sinusoidal": None,
    "posenc.core.rope.frequencies": None,
    "posenc.core.rope.scaling": None,
    "posenc.core.rope.scalings": None,
    "posenc.core.rope.registry": None,
    "posenc.core.rope.functions": None,
    "posenc.core.rope.tables": None,
    "posenc.core.rope.rotation": None,
    "posenc.core.alibi": None,
    "posenc.core.t5": None,
    "posenc.core.nope": None,
    "posenc.core.precision": None,
    "posenc.core.nd": None,
    "posenc.core.rope_nd": None,
    "posenc.analysis": None,
    "posenc.vocab": None,
    "posenc.torch": "torch",
    "posenc.torch.modules": "torch",
    "posenc.torch.rope": "torch",
    "posenc.torch.bias": "torch",
    "posenc.torch.attention": "torch",
    "posenc.torch.nd": "torch",
    "posenc.torch.rope_nd": "torch",
    "posenc.plot": "matplotlib",
    "posenc.plot.sinusoidal": "matplotlib",
    "posenc.plot.frequencies": "matplotlib",
    "posenc.plot.rope": "matplotlib",
    "posenc.plot.bias": "matplotlib",
}


@pytest.mark.parametrize("name", list(MODULES))
def test_docstring_examples(name):
    if MODULES[name]:
        pytest.importorskip(MODULES[name])
    module = importlib.import_module(name)
    with np.printoptions(legacy=False):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
    assert result.attempted > 0, f"{name} has no examples"
