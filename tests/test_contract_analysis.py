"""The contract (see ``contract.py``) for ``posenc.analysis`` and the frequency ladder:
any value of any argument gives the right answer or a one-line ``ValueError`` /
``TypeError`` naming the argument, within seconds and bounded memory.

No result of these functions is non-finite on purpose: a closest pair, a report row,
a map, a similarity, a distance, a frequency and a wavelength are all finite numbers
for every accepted input, so every accepted call must give finite values.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import posenc
import posenc.analysis
from contract import Calls, arguments, check_contract, hostile_values


def as_array(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with its dataclass results as one float array, so that the contract
    compares them whole and checks that every number in them is finite."""

    @functools.wraps(function)  # keeps the signature: the contract reads argument names
    def wrapper(*args: Any, **kwargs: Any) -> np.ndarray:
        result = function(*args, **kwargs)
        rows = result if isinstance(result, list) else [result]
        return np.array([dataclasses.astuple(row) for row in rows], dtype=np.float64)

    return wrapper


CALLS: Calls = {
    "relative_map": (posenc.relative_map, (2.5, 8, 100.0), {"formula": "paper", "layout": "split", "max_bytes": 10**6}),
    "relative_map (tensor2tensor)": (posenc.relative_map, (-3, 6), {"formula": "tensor2tensor"}),
    "offset_similarity": (posenc.offset_similarity, (np.arange(5), 8, 100.0), {"formula": "paper", "max_bytes": 10**6}),
    "offset_distances": (posenc.offset_distances, ([0, 1.5, -7], 8, 100.0), {"formula": "tensor2tensor", "max_bytes": 10**6}),
    "min_pairwise_distance": (as_array(posenc.min_pairwise_distance), (posenc.sinusoidal(12, 4, base=10.0),), {"block": 5, "max_bytes": 10**7}),
    "min_pairwise_distance (complex)": (as_array(posenc.min_pairwise_distance), (np.array([[1j, 2], [0, 1], [3, 1 + 1j]]),), {}),
    "precision_report": (as_array(posenc.precision_report), ([1e7, 3], 8, 100.0), {"digits": 50, "max_bytes": 10**7}),
    "frequencies": (posenc.frequencies, (8, 100.0), {"formula": "paper"}),
    "frequencies (tensor2tensor)": (posenc.frequencies, (7, 100.0), {"formula": "tensor2tensor"}),
    "wavelengths": (posenc.wavelengths, (8, 100.0), {"formula": "paper"}),
    "wavelengths (tensor2tensor)": (posenc.wavelengths, (7, 100.0), {"formula": "tensor2tensor"}),
}  # fmt: skip


def test_every_function_and_argument_is_covered():
    functions = {
        name
        for name, value in vars(posenc.analysis).items()
        if inspect.isfunction(value)
        and not name.startswith("_")
        and value.__module__ == posenc.analysis.__name__
    }
    covered = {call.split(" ")[0] for call in CALLS}
    assert functions | {"frequencies", "wavelengths"} == covered
    for name, (function, args, kwargs) in CALLS.items():
        if " (" in name:  # a variant: the main call of the function names every argument
            continue
        parameters = list(inspect.signature(function).parameters)
        assert len(args) + len(kwargs) == len(parameters), (name, parameters)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_call_works_as_written(name):
    function, args, kwargs = CALLS[name]
    assert np.all(np.isfinite(np.asarray(function(*args, **kwargs))))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_analysis_function_answers_right_or_refuses_clearly(data):
    name = data.draw(st.sampled_from(sorted(CALLS)), label="function")
    where = data.draw(st.sampled_from(arguments(CALLS, name)), label="argument")
    value = data.draw(hostile_values(), label="value")
    check_contract(CALLS, name, where, value)


@pytest.mark.parametrize("name", sorted(name for name in CALLS if "min_pairwise" not in name))
@pytest.mark.parametrize("base", [1e-320, 5e-324, 1e-300, 1e-30, 0.5, 1 + 2**-52, 1e300, 1e308])
def test_extreme_bases_give_finite_values_or_name_base(name, base):
    """Bases at the ends of the float range: frequencies past float64's range (a base
    below 1 raised to large powers) must be refused naming ``base``, never NaN or inf."""
    function, args, kwargs = CALLS[name]
    parameters = list(inspect.signature(function).parameters)
    index = parameters.index("base")
    where = ("positional", index) if index < len(args) else ("keyword", "base")
    for d_model in (2, 7, 8, 66):
        if "d_model" in parameters and parameters.index("d_model") < len(args):
            args = tuple(
                d_model if i == parameters.index("d_model") else a for i, a in enumerate(args)
            )
            if name.startswith(("relative_map", "offset_")) and d_model % 2:
                continue
        check_contract({name: (function, args, kwargs)}, name, where, base)
