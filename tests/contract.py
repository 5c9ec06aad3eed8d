"""What the contract tests share: the hostile values and the check of one call.

The contract: any input either gives the right answer or a ``ValueError``/``TypeError``
that names the argument, within seconds and bounded memory. A test names working
calls (:data:`Calls`), replaces one argument by a hostile value and hands the outcome to
:func:`check_contract`. ``test_contract.py`` holds the package's functions, modules and
commands; the other ``test_contract_*.py`` files hold the rest, one area each.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from posenc.core.positions import MemoryLimitError

LIMIT_SECONDS = 5.0


HOSTILE_VALUES: list[Any] = [
    # integers, Python and NumPy
    0, 1, 3, -1, -(2**63), 2**63, 10**12, 10**30,
    # past float64 and at the ±2**53 boundary of exact positions
    10**400, -(10**400), 2**1100, 2**53, -(2**53), 2**53 + 1,
    np.int8(-1), np.int8(3), np.uint8(200), np.int16(7), np.uint64(2**64 - 1), np.int64(5),
    np.intp(4), np.int32(-5),
    # floats: signed zeros, tiny, huge, NaN/inf, NumPy float types
    0.0, -0.0, 0.5, 2.0, 1e-320, 1e308, -1e308, math.nan, math.inf, -math.inf,
    1e-300, -7.213475204444817,
    np.float32(3.0), np.float16(2.0), np.float64(4.5), np.float32(math.nan),
    # arrays: empty, 0-d, non-contiguous, narrow and unsigned, NaN/inf, bool, str
    np.array([], dtype=np.int64), np.array(3), np.array(2.5), np.arange(6)[::2],
    np.arange(8, dtype=np.int8), np.arange(4, dtype=np.uint8), np.array([-1], np.int8),
    np.array([np.nan, 1.0]), np.array([np.inf]), np.zeros((2, 3))[:, ::2],
    np.array([True, False]), np.array(["a", "b"]), np.array([1e300]),
    np.arange(4, dtype=np.uint64), np.zeros((0, 4)), np.ones((2, 2), np.float16),
    # everything else
    None, True, False, "abc", "", [], [[1], [1, 2]], (), object(), complex(1, 2),
    [1.5, "x"], {"a": 1}, b"x",
]  # fmt: skip
"""Values a user may pass by mistake or on purpose."""


def hostile_values() -> st.SearchStrategy[Any]:
    return st.sampled_from(HOSTILE_VALUES)


def plain(value: Any) -> Any:
    """The plain value a hostile one stands for (NumPy scalars as Python numbers)."""
    if isinstance(value, np.generic) and not isinstance(value, np.bool_):
        return value.item()
    if isinstance(value, np.ndarray):
        return np.array(value)  # contiguous copy
    return value


Calls = dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]
"""name -> (function, positional arguments, keyword arguments), all of them valid."""


def arguments(calls: Calls, name: str) -> list[tuple[str, int | str]]:
    """Every argument of a call: ``("positional", index)`` or ``("keyword", key)``."""
    _, args, kwargs = calls[name]
    return [("positional", i) for i in range(len(args))] + [("keyword", k) for k in kwargs]


def argument_name(calls: Calls, name: str, where: tuple[str, int | str]) -> str:
    import inspect

    if where[0] == "keyword":
        return str(where[1])
    return list(inspect.signature(calls[name][0]).parameters)[int(where[1])]


def call(calls: Calls, name: str, where: tuple[str, int | str], value: Any) -> Any:
    function, args, kwargs = calls[name]
    args, kwargs = list(args), dict(kwargs)
    if where[0] == "positional":
        args[int(where[1])] = value
    else:
        kwargs[str(where[1])] = value
    return function(*args, **kwargs)


def check_contract(
    calls: Calls,
    name: str,
    where: tuple[str, int | str],
    value: Any,
    *,
    limit_words: tuple[str, ...] = ("max_bytes",),
    checked_elsewhere: tuple[str, ...] = (),
) -> None:
    """The right answer (that of the plain value, finite) or a one-line error naming the
    argument, in time. ``checked_elsewhere``: functions whose arguments are checked as
    part of another value (a table, a scaling's parameters); ``limit_words``: what a
    memory refusal must mention."""
    argument = argument_name(calls, name, where)
    start = time.perf_counter()
    error: Exception | None = None
    try:
        result = call(calls, name, where, value)
    except (ValueError, TypeError) as exc:
        error = exc
    message = str(error)
    if isinstance(error, MemoryLimitError):  # the size of the whole call: names the limit
        assert any(word in message for word in limit_words), message
    elif error is not None:
        assert message
        assert "\n" not in message.strip(), message
        assert (
            argument in message or argument.rstrip("s") in message or name in checked_elsewhere
        ), f"{name}({argument}={value!r}): {message}"
    else:
        reference = call(calls, name, where, plain(value))
        assert same(result, reference), f"{name}({argument}={value!r})"
        for array in result if isinstance(result, tuple) else (result,):
            array = np.asarray(array)
            if array.dtype.kind == "f":
                assert np.all(np.isfinite(array)), (
                    f"{name}({argument}={value!r}) gave non-finite values"
                )
    assert time.perf_counter() - start < LIMIT_SECONDS, f"{name}({argument}={value!r}) was slow"


def same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "__array__") or hasattr(b, "__array__"):  # NumPy and JAX arrays
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    return bool(a == b)


def check_module_options(
    name: str,
    cls: Callable[..., Any],
    options: dict[str, Any],
    use: Callable[[Any], Any],
    argument: str,
    value: Any,
) -> None:
    """A PyTorch module built with ``argument=value`` (the other ``options`` valid) is
    refused in one line naming the argument, or built as with the plain value: ``use``
    of it (its call on a fixed input) gives the same tensors, finite, or the same
    refusal; in time."""
    import torch

    start = time.perf_counter()
    try:
        torch.manual_seed(0)
        module = cls(**{**options, argument: value})
    except (ValueError, TypeError) as error:
        message = str(error)
        assert "\n" not in message.strip(), message
        assert (
            argument in message
            or argument.rstrip("s") in message
            or (argument.startswith("scaling") and message.startswith("RoPE scaling"))
        ), f"{name}({argument}={value!r}): {message}"
        return
    torch.manual_seed(0)  # the same initial weights
    reference = cls(**{**options, argument: plain(value)})
    outcomes = []  # the call's result or error, with the value and with its plain value
    for built in (module.eval(), reference.eval()):  # eval: no dropout draws
        try:
            with torch.no_grad():
                outcomes.append(use(built))
        except (ValueError, TypeError) as exc:  # the fixed input no longer fits
            outcomes.append(f"{type(exc).__name__}: {exc}")
    mine, theirs = outcomes
    if isinstance(mine, str):
        assert mine == theirs, f"{name}({argument}={value!r}): {mine}"
        assert "\n" not in mine.strip(), mine
    else:
        for a, b in zip(mine if isinstance(mine, tuple) else (mine,),
                        theirs if isinstance(theirs, tuple) else (theirs,),
                        strict=True):  # fmt: skip
            assert torch.isfinite(a).all(), f"{name}({argument}={value!r})"
            assert torch.equal(a, b), f"{name}({argument}={value!r})"
    assert time.perf_counter() - start < LIMIT_SECONDS, f"{name}({argument}={value!r}) was slow"
