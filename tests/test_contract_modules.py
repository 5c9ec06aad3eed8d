"""The contract of the research-scheme PyTorch modules and the score biases, on their call
arguments and the options ``test_contract.py`` does not reach: any input gives the right
answer or one ``ValueError``/``TypeError`` line naming the argument.

Modules: KERPLE, FIRE and Sandwich biases, ALiBi and T5 biases (call arguments: lengths,
offset, positions, key positions, dtype, device), CoPE (its ``q``, ``k``, ``allowed``,
``scale`` and options) and RoPE with learned frequencies (``offset``, ``positions`` and
options). A call that succeeds gives what the call with the plain value gives (int64
positions for narrow integer tensors).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract import (
    HOSTILE_VALUES,
    LIMIT_SECONDS,
    Calls,
    arguments,
    check_contract,
    check_module_options,
    hostile_values,
    plain,
)

torch = pytest.importorskip("torch")

from posenc import torch as pt  # noqa: E402
from posenc.core.positions import MemoryLimitError  # noqa: E402

HEADS = 2


def attempt(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``function``'s result, or the ``ValueError``/``TypeError`` it raised."""
    try:
        return function(*args, **kwargs)
    except (ValueError, TypeError) as exc:
        return exc


def biases() -> dict[str, Any]:
    """One built module of each score bias (seeded: the learned ones' weights fixed)."""
    torch.manual_seed(0)
    return {
        "KERPLEBias": pt.KERPLEBias(HEADS),
        "KERPLEBias power": pt.KERPLEBias(HEADS, kernel="power"),
        "FIREBias": pt.FIREBias(HEADS, mlp_width=4),
        "SandwichBias": pt.SandwichBias(HEADS, dim=8, max_length=8),
        "ALiBiBias": pt.ALiBiBias(HEADS),
        "T5RelativeBias": pt.T5RelativeBias(HEADS, num_buckets=8, max_distance=16),
    }


BIASES = biases()


def bias_calls() -> Calls:
    """Each bias with every call argument given a valid value (float64: exact to compare)."""

    def call(module: Any) -> Callable[..., Any]:
        @functools.wraps(module.forward)  # its signature names the arguments
        def run(*args: Any, **kwargs: Any) -> Any:
            with torch.no_grad():  # the learned biases' outputs as plain arrays
                out = module(*args, **kwargs)
            if out.device.type == "meta":  # no values: its shape
                return np.zeros(out.shape)
            return out.to(torch.float64)  # bfloat16 exactly, as NumPy can read it

        return run

    calls: Calls = {}
    for name, module in BIASES.items():
        calls[name] = (call(module), (4,), {"key_length": 6, "offset": 2,
                                            "dtype": torch.float64, "device": "cpu"})  # fmt: skip
        calls[f"{name} positions"] = (
            call(module),
            (4, 5),
            {"positions": torch.tensor([3, 1, 4, 0]), "key_positions": torch.arange(5)},
        )
    return calls


CALLS = bias_calls()
TENSORS = [
    torch.tensor([0, 1, 2, 3], dtype=torch.int8), torch.tensor([0, 1, 2, 3], dtype=torch.uint8),
    torch.tensor([0, 1, 2, 3], dtype=torch.int16), torch.tensor([0, 1, 2, 3], dtype=torch.int32),
    torch.tensor([-1, 0, 1, 2]), torch.tensor([0.0, 1.0, 2.0, 3.0]), torch.tensor([True] * 4),
    torch.tensor(3), torch.tensor([], dtype=torch.int64), torch.arange(10)[::2],
    torch.arange(8)[::2], torch.tensor([2**40, 1, 2, 3]), torch.tensor([2**62, 0, 1, 2]),
    torch.tensor([-(2**63), 0, 1, 2]), torch.tensor([[0, 1, 2, 3]] * 2), torch.arange(5).view(1, 5),
    torch.arange(4).view(1, 4), torch.empty(4, dtype=torch.int64, device="meta"),
    torch.tensor([0, 1, 2, 3, 4], dtype=torch.int8),
]  # fmt: skip
DEVICES = ["cpu", torch.device("cpu"), "cuda", "cuda:0", "mps", "abc", "float32", 0, -1,
           torch.float32, "meta"]  # fmt: skip
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.bool,
          torch.complex64, "float32", np.float32]  # fmt: skip


def values_for(argument: str) -> st.SearchStrategy[Any]:
    if argument in ("positions", "key_positions"):
        return st.sampled_from(TENSORS + HOSTILE_VALUES[:24])
    if argument == "device":
        return st.sampled_from(DEVICES + HOSTILE_VALUES[:16])
    if argument == "dtype":
        return st.sampled_from(DTYPES + HOSTILE_VALUES[:16])
    return hostile_values()


def plain_tensor(value: Any) -> Any:
    """The plain value: an int64 copy of an integer tensor on the CPU, else :func:`plain`."""
    if isinstance(value, torch.Tensor) and value.device.type != "meta":
        return value.to(torch.int64).contiguous()
    return plain(value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_bias_call_answers_right_or_refuses_clearly(data):
    name = data.draw(st.sampled_from(sorted(CALLS)), label="call")
    where = data.draw(st.sampled_from(arguments(CALLS, name)), label="argument")
    argument = str(where[1]) if where[0] == "keyword" else "query_length"
    value = data.draw(values_for(argument), label="value")
    if isinstance(value, torch.Tensor):
        start = time.perf_counter()
        result = attempt(CALLS[name][0], *_args(name, where, value), **_kwargs(name, where, value))
        if isinstance(result, Exception):
            message = str(result)
            assert "\n" not in message.strip(), message
            assert (
                argument in message
                or argument.rstrip("s") in message
                or (isinstance(result, MemoryLimitError) and "limit" in message)
            ), f"{name}({argument}={value!r}): {message}"
        else:
            reference = CALLS[name][0](
                *_args(name, where, plain_tensor(value)),
                **_kwargs(name, where, plain_tensor(value)),
            )
            assert torch.equal(result, reference), f"{name}({argument}={value!r})"
            assert torch.isfinite(result).all(), f"{name}({argument}={value!r})"
        assert time.perf_counter() - start < LIMIT_SECONDS
        return
    check_contract(CALLS, name, where, value, limit_words=("limit",))


def _args(name: str, where: tuple[str, Any], value: Any) -> list[Any]:
    args = list(CALLS[name][1])
    if where[0] == "positional":
        args[where[1]] = value
    return args


def _kwargs(name: str, where: tuple[str, Any], value: Any) -> dict[str, Any]:
    kwargs = dict(CALLS[name][2])
    if where[0] == "keyword":
        kwargs[where[1]] = value
    return kwargs


@pytest.mark.parametrize("name", sorted(BIASES))
@pytest.mark.parametrize(
    ("device", "error", "says"),
    [
        ("abc", ValueError, "device must be a torch.device or a string"),
        ("cuda:0" if not torch.cuda.is_available() else "cuda:99", ValueError, "device 'cuda"),
        ("mps" if not torch.backends.mps.is_available() else "abc", ValueError, "device"),
        (-1, ValueError, "device must be"),
        (1.5, TypeError, "device must be a torch.device"),
        (True, TypeError, "device must be a torch.device"),
    ],
)
def test_a_bias_refuses_a_device_it_cannot_use_by_name(name, device, error, says):
    """Before: PyTorch's RuntimeError, AssertionError ("Torch not compiled with CUDA") or
    NotImplementedError from the final move; now one line naming ``device``."""
    with pytest.raises(error, match=says):
        BIASES[name](3, device=device)


@pytest.mark.parametrize("name", sorted(BIASES))
def test_a_bias_takes_devices_by_string_object_and_meta(name):
    module = BIASES[name]
    with torch.no_grad():
        expected = module(3, 5, dtype=torch.float32)
        assert torch.equal(module(3, 5, dtype=torch.float32, device="cpu"), expected)
        assert torch.equal(module(3, 5, dtype=torch.float32, device=torch.device("cpu")), expected)
        assert module(3, 5, dtype=torch.float32, device="meta").shape == expected.shape


@pytest.mark.parametrize("name", sorted(BIASES))
@pytest.mark.parametrize("argument", ["positions", "key_positions"])
def test_positions_past_2_53_are_refused_not_wrapped(name, argument):
    """Before: key - query positions overflowed int64 and KERPLE gave NaN (Sandwich an
    error from inside NumPy); now positions beyond ±2**53 are refused by name."""
    given = {"positions": torch.arange(3), "key_positions": torch.arange(3)}
    for bad in (-(2**63), 2**62, 2**53 + 1):
        given[argument] = torch.tensor([0, 1, bad])
        with pytest.raises(ValueError, match=rf"{argument} must lie within ±2\*\*53"):
            BIASES[name](3, 3, **given)
    given[argument] = torch.tensor([0, 1, 2**53])  # the last one taken
    with torch.no_grad():
        BIASES[name](3, 3, **given)


@pytest.mark.parametrize("name", sorted(BIASES))
def test_positions_on_meta_are_refused_by_name(name):
    """Before: NotImplementedError ("Cannot copy out of meta tensor")."""
    meta = torch.empty(3, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="positions is on the meta device"):
        BIASES[name](3, 3, positions=meta)
    with pytest.raises(ValueError, match="key_positions is on the meta device"):
        BIASES[name](3, 3, positions=torch.arange(3), key_positions=meta)


def test_sandwich_far_from_its_table_computes_the_calls_distances():
    """Before: an offset of 10**12 grew the table to 10**12 rows (MemoryError); now the
    memory limit refuses the table and the call gets its own distances from the core."""
    module = pt.SandwichBias(HEADS, dim=8, max_length=8)
    offset = 10**12
    bias = module(2, 3, offset=offset, dtype=torch.float64)
    distances = offset + np.arange(2)[:, None] - np.arange(3)[None]  # query - key, >= 0
    expected = module.spec.distance_bias(distances.ravel()).reshape(HEADS, 2, 3)
    assert torch.equal(bias, torch.from_numpy(expected))
    assert module.table.shape[0] == 8  # the table stays


def cope_calls() -> Calls:
    torch.manual_seed(0)
    cope = pt.ContextualPositionEncoding(8, max_positions=4)
    with torch.no_grad():
        cope.pos_emb.normal_()
    q, k = (
        torch.randn(1, 2, 3, 8, dtype=torch.float64),
        torch.randn(1, 2, 5, 8, dtype=torch.float64),
    )

    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return cope(*args, **kwargs)

    allowed = torch.ones(3, 5, dtype=torch.bool).tril(diagonal=2)
    return {"cope": (run, (q, k), {"allowed": allowed, "scale": 0.35})}


COPE = cope_calls()
COPE_TENSORS = [
    torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8).half(), torch.randn(1, 2, 3, 8).bfloat16(),
    torch.ones(1, 2, 3, 8, dtype=torch.int64), torch.randn(2, 3, 8), torch.randn(1, 2, 3, 4),
    torch.randn(2, 2, 3, 8), torch.randn(1, 2, 0, 8), torch.randn(1, 2, 3, 8, dtype=torch.complex64),
    torch.randn(1, 2, 3, 8, device="meta"), torch.ones(3, 5, dtype=torch.bool),
    torch.ones(3, 5), torch.ones(2, 2, dtype=torch.bool), torch.ones(1, 1, 1, 3, 5, dtype=torch.bool),
    torch.ones(5, dtype=torch.bool), torch.ones(3, 5, dtype=torch.bool, device="meta"),
]  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_cope_answers_right_or_refuses_clearly(data):
    where = data.draw(st.sampled_from(arguments(COPE, "cope")), label="argument")
    argument = str(where[1]) if where[0] == "keyword" else "qk"[int(where[1])]
    value = data.draw(
        st.sampled_from(COPE_TENSORS + HOSTILE_VALUES) if argument != "scale" else hostile_values(),
        label="value",
    )
    start = time.perf_counter()
    result = attempt(COPE["cope"][0], *_cope_args(where, value), **_cope_kwargs(where, value))
    if isinstance(result, Exception):
        message = str(result)
        assert "\n" not in message.strip(), message
        assert (
            f"{argument} " in message
            or f"{argument}:" in message
            or (argument in "qk" and "q and k" in message)
        ), f"cope({argument}={value!r}): {message}"
    else:
        if isinstance(value, torch.Tensor) or value is None:  # a tensor taken as it is
            assert result.shape == (1, 2, 3, 5)
            if result.device.type != "meta" and value is not None and argument != "allowed":
                finite = bool(torch.isfinite(value).all())
                assert bool(torch.isfinite(result).all()) == finite
        else:
            reference = COPE["cope"][0](
                *_cope_args(where, plain(value)), **_cope_kwargs(where, plain(value))
            )
            assert torch.equal(result, reference), f"cope({argument}={value!r})"
            if float(plain(value)) <= 1e30:  # a larger scale may overflow the scores
                assert torch.isfinite(result).all(), f"cope({argument}={value!r})"
    assert time.perf_counter() - start < LIMIT_SECONDS


def _cope_args(where: tuple[str, Any], value: Any) -> list[Any]:
    args = list(COPE["cope"][1])
    if where[0] == "positional":
        args[where[1]] = value
    return args


def _cope_kwargs(where: tuple[str, Any], value: Any) -> dict[str, Any]:
    kwargs = dict(COPE["cope"][2])
    if where[0] == "keyword":
        kwargs[where[1]] = value
    return kwargs


def test_cope_of_nan_or_infinite_queries_is_nan_not_an_index_error():
    """Before: a NaN count cast to an index (-2**63) made ``gather`` raise RuntimeError;
    now the bias is NaN where the gates are, as the scores it joins, and finite elsewhere."""
    torch.manual_seed(0)
    cope = pt.ContextualPositionEncoding(4, max_positions=3)
    k = torch.randn(1, 1, 3, 4)
    for bad in (math.nan, math.inf):
        q = torch.randn(1, 1, 2, 4)
        q[0, 0, 0, 1] = bad
        bias = cope(q, k)
        assert torch.isnan(bias[0, 0, 0]).all()
        assert torch.isfinite(bias[0, 0, 1]).all()
        assert torch.equal(bias[0, 0, 1], cope(q[:, :, 1:], k)[0, 0, 0])  # the other row


def test_cope_refuses_tensors_on_another_device_by_name():
    """Before: RuntimeError ("Tensor on device meta is not on the expected device")."""
    cope = pt.ContextualPositionEncoding(4, max_positions=3)
    q, meta = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4, device="meta")
    with pytest.raises(ValueError, match="k is on meta but the position vectors are on cpu"):
        cope(q, meta)
    with pytest.raises(ValueError, match="allowed is on meta"):
        cope(q, q, allowed=torch.ones(2, 2, dtype=torch.bool, device="meta"))


def learned_rope_calls() -> Calls:
    torch.manual_seed(0)
    rope = pt.LearnedRotaryEmbedding(8, base=100.0)
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64)

    def run(**kwargs: Any) -> Any:
        with torch.no_grad():
            return rope(q, q, **kwargs)

    return {
        "offset": (run, (), {"offset": 2}),
        "positions": (run, (), {"positions": torch.tensor([3, 1, 2, 0])}),
    }


LEARNED = learned_rope_calls()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_learned_rope_call_answers_right_or_refuses_clearly(data):
    name = data.draw(st.sampled_from(sorted(LEARNED)), label="argument")
    value = data.draw(
        st.sampled_from(TENSORS + HOSTILE_VALUES[:24]) if name == "positions" else hostile_values(),
        label="value",
    )
    run = LEARNED[name][0]
    result = attempt(run, **{name: value})
    if isinstance(result, Exception):
        message = str(result)
        assert "\n" not in message.strip(), message
        assert name in message, f"{name}={value!r}: {message}"
        return
    reference = run(**{name: plain_tensor(value)})
    for mine, theirs in zip(result, reference, strict=True):
        assert torch.equal(mine, theirs), f"{name}={value!r}"
        assert torch.isfinite(mine).all(), f"{name}={value!r}"


def test_learned_rope_refuses_meta_positions_and_split_devices():
    rope = pt.LearnedRotaryEmbedding(8)
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="positions is on the meta device"):
        rope(q, q, positions=torch.empty(3, dtype=torch.int64, device="meta"))
    with pytest.raises(ValueError, match="q is on cpu but k on meta"):
        rope(q, torch.randn(1, 2, 3, 8, device="meta"))


CONSTRUCTORS: dict[str, tuple[type, dict[str, Any], Callable[[Any], Any]]] = {
    "KERPLEBias": (pt.KERPLEBias, {"num_heads": 2, "kernel": "power", "eps": 0.01},
                   lambda m: m(3, 4)),
    "FIREBias": (pt.FIREBias, {"num_heads": 2, "mlp_width": 4, "init_c": 0.1, "init_L": 512.0,
                               "eps": 1e-6}, lambda m: m(3, 4)),
    "SandwichBias": (pt.SandwichBias, {"num_heads": 2, "dim": 8, "base": 100.0,
                                       "mode": "symmetric", "max_length": 8},
                     lambda m: m(3, 4)),
    "ContextualPositionEncoding": (
        pt.ContextualPositionEncoding, {"head_dim": 4, "max_positions": 3},
        lambda m: m(torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4)),
    ),
    "LearnedRotaryEmbedding": (
        pt.LearnedRotaryEmbedding,
        {"head_dim": 8, "base": 100.0, "rotary_dim": 4, "layout": "interleaved",
         "scaling": "linear", "scaling_params": {"factor": 2.0}, "qk_layout": "bshd"},
        lambda m: m(torch.ones(1, 3, 2, 8), torch.ones(1, 3, 2, 8))[0],
    ),
}  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_research_module_takes_its_options_right_or_refuses_clearly(data):
    name = data.draw(st.sampled_from(sorted(CONSTRUCTORS)), label="module")
    cls, options, use = CONSTRUCTORS[name]
    argument = data.draw(st.sampled_from(sorted(options)), label="argument")
    value = data.draw(hostile_values(), label="value")
    check_module_options(name, cls, options, use, argument, value)
