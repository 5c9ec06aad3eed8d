"""The contract, as a property: any input either gives the right answer or a
``ValueError``/``TypeError`` that names the argument, within seconds and bounded memory;
the CLI exits 0, or 2 with one line and no traceback.

Each example takes one public function with arguments that work, replaces one of them
by a hostile value (NumPy scalar types, 0-d and non-contiguous arrays, narrow and
unsigned integers, huge and tiny floats, NaN/inf, empty sequences, wrong types) and
calls it. A call that succeeds must give the same result as the call with the value
turned into the plain Python or NumPy value it stands for, or be refused; a call that
fails must raise ``ValueError`` or ``TypeError`` whose message names the argument.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import posenc
from posenc.cli import main
from posenc.core.positions import MemoryLimitError

LIMIT_SECONDS = 5.0


def hostile_values() -> st.SearchStrategy[Any]:
    """Values a user may pass by mistake or on purpose."""
    ints = st.sampled_from([0, 1, 3, -1, -(2**63), 2**63, 10**12, 10**30])
    numpy_ints = st.sampled_from([
        np.int8(-1), np.int8(3), np.uint8(200), np.int16(7), np.uint64(2**64 - 1),
        np.int64(5), np.intp(4), np.int32(-5),
    ])  # fmt: skip
    floats = st.sampled_from([
        0.0, -0.0, 0.5, 2.0, 1e-320, 1e308, -1e308, math.nan, math.inf, -math.inf,
        np.float32(3.0), np.float16(2.0), np.float64(4.5), np.float32(math.nan),
    ])  # fmt: skip
    arrays = st.sampled_from([
        np.array([], dtype=np.int64), np.array(3), np.array(2.5), np.arange(6)[::2],
        np.arange(8, dtype=np.int8), np.arange(4, dtype=np.uint8), np.array([-1], np.int8),
        np.array([np.nan, 1.0]), np.array([np.inf]), np.zeros((2, 3))[:, ::2],
        np.array([True, False]), np.array(["a", "b"]), np.array([1e300]),
        np.arange(4, dtype=np.uint64), np.zeros((0, 4)), np.ones((2, 2), np.float16),
    ])  # fmt: skip
    other = st.sampled_from([
        None, True, False, "abc", "", [], [[1], [1, 2]], (), object(), complex(1, 2),
        [1.5, "x"], {"a": 1}, b"x",
    ])  # fmt: skip
    return st.one_of(ints, numpy_ints, floats, arrays, other)


def plain(value: Any) -> Any:
    """The plain value a hostile one stands for (NumPy scalars as Python numbers)."""
    if isinstance(value, np.generic) and not isinstance(value, np.bool_):
        return value.item()
    if isinstance(value, np.ndarray):
        return np.array(value)  # contiguous copy
    return value


Calls = dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]
"""name -> (function, positional arguments, keyword arguments), all of them valid."""

CALLS: Calls = {
    "sinusoidal": (posenc.sinusoidal, (6, 8), {"base": 100.0, "layout": "split", "dtype": "float32"}),
    "sinusoidal_nd": (posenc.sinusoidal_nd, ((3, 4), 8), {"base": 100.0}),
    "frequencies": (posenc.frequencies, (8,), {"base": 100.0}),
    "wavelengths": (posenc.wavelengths, (8,), {"base": 100.0}),
    "nope": (posenc.nope, (4, 8), {}),
    "rope_frequencies": (posenc.rope_frequencies, (8,), {"base": 100.0}),
    "rope_tables": (posenc.rope_tables, (5, np.array([1.0, 0.1])), {"scale": 1.5}),
    "rope_scaling": (posenc.rope_scaling, ("linear", 8), {"factor": 2.0}),
    "apply_rope": (
        posenc.apply_rope,
        (np.ones((3, 4)), *posenc.rope_tables(3, np.array([1.0, 0.1]), dtype="float64")),
        {"layout": "half"},
    ),
    "alibi_slopes": (posenc.alibi_slopes, (8,), {}),
    "alibi_bias": (posenc.alibi_bias, (4, 6), {"num_heads": 4, "offset": 2}),
    "relative_positions": (posenc.relative_positions, (3, 5), {"offset": 1}),
    "relative_position_bucket": (posenc.relative_position_bucket, (np.arange(-5, 5),), {"num_buckets": 8, "max_distance": 16}),
    "t5_bias": (posenc.t5_bias, (np.ones((8, 2)), 3, 4), {"max_distance": 16}),
    "layout_permutation": (posenc.layout_permutation, (6, "interleaved", "split"), {}),
    "rope_permutation": (posenc.rope_permutation, (8, "half", "interleaved"), {}),
    "xpos_scales": (posenc.xpos_scales, (4, 8), {}),
    "offset_similarity": (posenc.offset_similarity, (np.arange(4), 8), {}),
    "relative_map": (posenc.relative_map, (2, 8), {}),
}  # fmt: skip


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


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_function_answers_right_or_refuses_clearly(data):
    name = data.draw(st.sampled_from(sorted(CALLS)), label="function")
    where = data.draw(st.sampled_from(arguments(CALLS, name)), label="argument")
    value = data.draw(hostile_values(), label="value")
    check_contract(CALLS, name, where, value, checked_elsewhere=("apply_rope", "rope_scaling"))


CLI_OPTIONS = {
    "--length": "4",
    "--d-model": "4",
    "--base": "100",
    "--dtype": "float32",
    "--layout": "interleaved",
    "--format": "csv",
    "--precision": "4",
}
CLI_VALUES = [
    "nan",
    "inf",
    "-1",
    "0",
    "1e400",
    "",
    "abc",
    "99999999999999999999",
    "-0",
    "1.5",
    "--",
]


@settings(max_examples=120, deadline=None)
@given(option=st.sampled_from(sorted(CLI_OPTIONS)), value=st.sampled_from(CLI_VALUES))
def test_the_table_command_exits_0_or_2_with_one_line(option, value):
    argv = ["table"]
    for key, default in CLI_OPTIONS.items():
        argv += [key, value if key == option else default]
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's own errors
            status = exc.code
    assert status in (0, 2), (argv, status, err.getvalue())
    if status == 2:
        lines = err.getvalue().strip().splitlines()
        assert lines, argv
        assert "Traceback" not in err.getvalue(), (argv, err.getvalue())
        assert len([line for line in lines if line.startswith(("error", "posenc"))]) == 1, lines
    assert time.perf_counter() - start < LIMIT_SECONDS


def torch_calls() -> dict[str, Callable[..., Any]]:
    """Each PyTorch module's call, taking ``offset`` and ``positions`` as given."""
    import torch

    from posenc.torch import (
        ALiBiBias,
        LearnedPositionalEmbedding,
        RotaryEmbedding,
        SinusoidalPositionalEncoding,
        T5RelativeBias,
    )

    x, q = torch.ones(1, 4, 8), torch.ones(1, 2, 4, 8)
    sinusoidal = SinusoidalPositionalEncoding(8, dropout=0.0, max_length=16)
    learned = LearnedPositionalEmbedding(16, 8, dropout=0.0)
    rope = RotaryEmbedding(8, max_length=16)
    alibi, t5 = ALiBiBias(2), T5RelativeBias(2)
    return {
        "sinusoidal": lambda **kw: sinusoidal(x, **kw),
        "learned": lambda **kw: learned(x, **kw),
        "rope": lambda **kw: rope(q, q, **kw),
        "alibi": lambda **kw: alibi(4, 6, **kw),
        "t5": lambda **kw: t5(4, 6, **kw),
    }


def hostile_tensors() -> st.SearchStrategy[Any]:
    import torch

    return st.sampled_from([
        torch.tensor([0, 1, 2, 3], dtype=torch.int8), torch.tensor([0, 1, 2, 3], dtype=torch.uint8),
        torch.tensor([-1, 0, 1, 2]), torch.tensor([0.0, 1.0, 2.0, 3.0]), torch.tensor([True] * 4),
        torch.tensor(3), torch.tensor([], dtype=torch.int64), torch.arange(8)[::2],
        torch.tensor([2**40, 1, 2, 3]), torch.tensor([[0, 1, 2, 3]] * 2), torch.arange(4).view(1, 4),
        torch.tensor([0, 1, 2, 3], dtype=torch.int16), [0, 1, 2, 3], np.arange(4), None,
    ])  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_torch_module_answers_right_or_refuses_clearly(data):
    import torch

    calls = torch_calls()
    name = data.draw(st.sampled_from(sorted(calls)), label="module")
    argument = data.draw(st.sampled_from(["offset", "positions"]), label="argument")
    value = data.draw(
        hostile_values() if argument == "offset" else hostile_tensors(), label="value"
    )
    start = time.perf_counter()
    error: Exception | None = None
    try:
        result = calls[name](**{argument: value})
    except (ValueError, TypeError) as exc:
        error = exc
    if error is not None:
        assert argument in str(error), f"{name}({argument}={value!r}): {error}"
    else:
        if argument == "offset":
            reference = calls[name](offset=plain(value))
        elif value is None:
            reference = calls[name]()
        else:
            reference = calls[name](positions=value.to(torch.int64).contiguous())
        for mine, theirs in zip(result if isinstance(result, tuple) else (result,),
                                reference if isinstance(reference, tuple) else (reference,),
                                strict=True):  # fmt: skip
            assert torch.equal(mine, theirs), f"{name}({argument}={value!r})"
            assert torch.isfinite(mine).all(), f"{name}({argument}={value!r})"
    assert time.perf_counter() - start < LIMIT_SECONDS


def jax_calls() -> Calls:
    import posenc.jax as pj

    return {
        "sinusoidal": (pj.sinusoidal, (6, 8), {"base": 100.0, "layout": "split"}),
        "sinusoidal_nd": (pj.sinusoidal_nd, ((3, 4), 8), {"base": 100.0}),
        "rope_tables": (pj.rope_tables, (5, 8), {"base": 100.0}),
        "alibi_slopes": (pj.alibi_slopes, (8,), {}),
        "alibi_bias": (pj.alibi_bias, (4, 6), {"num_heads": 4, "offset": 2}),
        "t5_bias": (pj.t5_bias, (np.ones((8, 2)), 3, 4), {"max_distance": 16}),
    }


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_jax_function_answers_right_or_refuses_clearly(data):
    calls = jax_calls()
    name = data.draw(st.sampled_from(sorted(calls)), label="function")
    where = data.draw(st.sampled_from(arguments(calls, name)), label="argument")
    value = data.draw(hostile_values(), label="value")
    check_contract(calls, name, where, value, limit_words=("max_bytes", "limit"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_keras_layer_takes_its_options_right_or_refuses_clearly(data):
    import inspect

    from posenc.keras import (
        ALiBiBias,
        LearnedPositionalEmbedding,
        RotaryEmbedding,
        SinusoidalPositionalEncoding,
        T5RelativeBias,
    )

    layers = {
        "SinusoidalPositionalEncoding": (SinusoidalPositionalEncoding, {"max_length": 16}),
        "RotaryEmbedding": (RotaryEmbedding, {"max_length": 16}),
        "ALiBiBias": (ALiBiBias, {"num_heads": 2}),
        "T5RelativeBias": (T5RelativeBias, {"num_heads": 2}),
        "LearnedPositionalEmbedding": (LearnedPositionalEmbedding, {"max_length": 16}),
    }
    name = data.draw(st.sampled_from(sorted(layers)), label="layer")
    cls, options = layers[name]
    parameters = [p for p in inspect.signature(cls).parameters if p != "kwargs"]
    argument = data.draw(st.sampled_from(parameters), label="argument")
    value = data.draw(hostile_values(), label="value")
    error: Exception | None = None
    try:
        layer = cls(**{**options, argument: value})
    except (ValueError, TypeError) as exc:
        error = exc
    if error is not None:
        assert argument in str(error) or argument.rstrip("s") in str(error), (
            f"{name}({argument}={value!r}): {error}"
        )
    else:
        reference = cls(**{**options, argument: plain(value)})
        mine, theirs = layer.get_config(), reference.get_config()
        mine.pop("name", None)
        theirs.pop("name", None)
        assert mine == theirs, f"{name}({argument}={value!r})"
