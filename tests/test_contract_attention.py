"""The contract for :class:`posenc.torch.MultiHeadAttention` and :class:`KVCache`: any
argument of the constructor or of the call replaced by a hostile value, for every kind
of position scheme, either gives the right answer or a ``ValueError``/``TypeError`` that
names the argument, in one line.

The right answer of a hostile value is that of the plain value it stands for: a NumPy
scalar's Python number (:func:`contract.plain`), and for a tensor its canonical form
(:func:`canonical`): positions as int64 ``(batch, seq)``, a mask expanded to ``(batch,
heads, seq, keys)`` in the scores' dtype, ``x`` contiguous. Caches are also reused
across calls of other batches, widths, dtypes and positions: every call either equals
the full-sequence call over what the cache holds, or is refused naming the cache and
leaves it as it was.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from contract import (  # noqa: E402
    HOSTILE_VALUES,
    LIMIT_SECONDS,
    Calls,
    argument_name,
    arguments,
    call,
    plain,
)
from posenc.torch import (  # noqa: E402
    ALiBiBias,
    ContextualPositionEncoding,
    KERPLEBias,
    KVCache,
    MultiHeadAttention,
    RotaryEmbedding,
    T5RelativeBias,
    XPosRotaryEmbedding,
)

D_MODEL, HEADS, HEAD_DIM, BATCH, SEQ, PROMPT = 8, 2, 4, 2, 5, 4


def schemes() -> dict[str, Callable[[], Any]]:
    """One scheme of every kind, for HEADS heads of HEAD_DIM."""

    def cope() -> ContextualPositionEncoding:
        module = ContextualPositionEncoding(HEAD_DIM, max_positions=8)
        torch.nn.init.normal_(module.pos_emb)
        return module

    return {
        "none": lambda: None,
        "rope": lambda: RotaryEmbedding(HEAD_DIM, max_length=32),
        "xpos": lambda: XPosRotaryEmbedding(HEAD_DIM, max_length=32),
        "alibi": lambda: ALiBiBias(HEADS),
        "t5": lambda: T5RelativeBias(HEADS, bidirectional=False),
        "kerple": lambda: KERPLEBias(HEADS),
        "cope": cope,
    }


SCHEMES = schemes()


def result(out: Any) -> Any:
    """A call's output as the contract compares it: a NumPy array, or ``"meta(shape)"``."""
    if out.is_meta:
        return f"meta{tuple(out.shape)}"
    return out.detach().numpy()


def module_of(scheme: str, device: str = "cpu") -> MultiHeadAttention:
    torch.manual_seed(0)
    position = SCHEMES[scheme]()
    return MultiHeadAttention(D_MODEL, HEADS, position=position).eval().to(device)


def built(d_model: Any, num_heads: Any, *, position: Any, causal: Any, dropout: Any, bias: Any):
    """The constructor's contract: the module it builds, called on a fixed input."""
    torch.manual_seed(0)
    module = MultiHeadAttention(
        d_model, num_heads, position=position, causal=causal, dropout=dropout, bias=bias
    ).eval()
    torch.manual_seed(1)
    return result(module(torch.randn(BATCH, SEQ, module.d_model)))


def caller(module: MultiHeadAttention, prompt: bool) -> Callable[..., Any]:
    """The call's contract: ``module(x, ...)``, after a prompt of PROMPT tokens in a new
    cache when ``prompt``."""

    def attend(x: Any, *, positions: Any = None, offset: Any = 0, attn_mask: Any = None,
               cache: Any = None) -> Any:  # fmt: skip
        if prompt:
            cache = KVCache()
            torch.manual_seed(3)
            device = module.qkv.weight.device
            module(torch.randn(BATCH, PROMPT, D_MODEL, device=device), cache=cache)
        with torch.no_grad():
            out = module(x, positions=positions, offset=offset, cache=cache, attn_mask=attn_mask)
        return result(out)

    return attend


def calls() -> Calls:
    table: Calls = {}
    torch.manual_seed(2)
    x = torch.randn(BATCH, SEQ, D_MODEL)
    for scheme in SCHEMES:
        table[f"MultiHeadAttention {scheme}"] = (
            built, (D_MODEL, HEADS),
            {"position": SCHEMES[scheme](), "causal": True, "dropout": 0.1, "bias": False},
        )  # fmt: skip
        module = module_of(scheme)
        table[f"call {scheme}"] = (
            caller(module, False), (x,),
            {"positions": torch.arange(SEQ), "offset": 0, "attn_mask": None, "cache": None},
        )  # fmt: skip
        table[f"offset {scheme}"] = (caller(module, False), (x,), {"offset": 3})
        table[f"step {scheme}"] = (
            caller(module, True), (x,),
            {"positions": torch.arange(PROMPT, PROMPT + SEQ), "attn_mask": None},
        )  # fmt: skip
        if scheme not in META_GAPS:
            meta = module_of(scheme, "meta")
            table[f"meta {scheme}"] = (
                caller(meta, False), (x.to("meta"),),
                {"positions": torch.arange(SEQ, device="meta"), "attn_mask": None},
            )  # fmt: skip
    return table


# Schemes that read values the meta device does not have (posenc.torch.kernel_bias,
# posenc.torch._tables for positions of RoPE and xPos): not in the meta calls yet.
META_GAPS = {"kerple", "rope", "xpos"}
CALLS = calls()


def tensors(draw: Any, keys: int) -> Any:
    """A hostile tensor: any rank, sizes around those of a call, any dtype, values
    small, negative, huge or NaN, sometimes on the meta device or not contiguous."""
    sizes = st.sampled_from([0, 1, BATCH, HEADS + 1, SEQ, keys, 7])
    near = [  # shapes an argument of the call has, or nearly
        (BATCH, SEQ, D_MODEL), (1, SEQ, D_MODEL), (BATCH, 0, D_MODEL), (0, SEQ, D_MODEL),
        (BATCH, SEQ, D_MODEL + 1), (SEQ, D_MODEL), (SEQ,), (1, SEQ), (BATCH, SEQ), (3, SEQ),
        (SEQ + 1,), (BATCH, SEQ, 1), (), (keys,), (SEQ, keys), (1, 1, SEQ, keys),
        (BATCH, 1, 1, keys), (BATCH, HEADS, SEQ, keys), (SEQ, 1), (HEADS, SEQ, keys),
    ]  # fmt: skip
    shape = draw(st.one_of(st.sampled_from(near), st.lists(sizes, max_size=5).map(tuple)))
    dtype = draw(st.sampled_from([torch.bool, torch.int8, torch.uint8, torch.int32, torch.int64,
                                  torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                  torch.complex64, torch.int64, torch.float32, torch.bool]))  # fmt: skip
    kind = draw(st.sampled_from(["small", "small", "negative", "huge", "special"]))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 12, shape, generator=generator).double()
    if kind == "negative":
        values = values - 6
    elif kind == "huge":
        values = values * 2.0**58
    elif kind == "special":
        flat = values.view(-1)
        if flat.numel():
            flat[seed % flat.numel()] = [float("nan"), float("inf"), float("-inf")][seed % 3]
    if dtype == torch.bool:
        tensor = values > 3
    elif dtype.is_floating_point or dtype.is_complex:
        tensor = values.to(dtype)
    else:
        tensor = values.nan_to_num(0.0, 0.0, 0.0).clamp(-(2.0**62), 2.0**62).to(torch.int64)
        tensor = tensor.to(dtype)  # wraps in a narrow dtype: hostile all the same
    if draw(st.booleans()) and tensor.dim() >= 1 and tensor.shape[-1] > 1:
        tensor = torch.cat([tensor, tensor], dim=-1)[..., ::2]  # not contiguous
    if draw(st.integers(0, 9)) == 0:
        tensor = tensor.to("meta")
    return tensor


def canonical(name: str, argument: str, value: Any) -> Any:
    """The plain value a hostile one stands for: for tensors the canonical form of the
    argument (what an answer given for the hostile one must equal)."""
    if isinstance(value, KVCache):
        return copy.deepcopy(value)  # a cache in the state the hostile call found it
    if not isinstance(value, torch.Tensor):
        return plain(value)
    if argument == "positions":
        if value.dim() == 1:
            value = value.expand(BATCH, -1)
        return value.to(torch.int64).contiguous()
    if argument == "attn_mask":
        keys = SEQ + (PROMPT if name.startswith("step") else 0)
        full = value.expand(BATCH, HEADS, SEQ, keys).contiguous()
        return full if full.dtype == torch.bool else full.to(torch.float32)
    return value.contiguous()


def check(name: str, where: tuple[str, int | str], value: Any) -> None:
    """The right answer (that of the canonical value, finite) or one line naming the
    argument, in time."""
    argument = argument_name(CALLS, name, where)
    before = copy.deepcopy(value) if isinstance(value, KVCache) else value  # its state now
    start = time.perf_counter()
    try:
        got = call(CALLS, name, where, value)
    except (ValueError, TypeError) as error:
        message = str(error)
        assert message, name
        assert "\n" not in message.strip(), message
        named = argument in message or argument.rstrip("s") in message
        assert named, f"{name}({argument}={value!r}): {message}"
    else:
        reference = call(CALLS, name, where, canonical(name, argument, before))
        if isinstance(got, str):
            assert got == reference == f"meta({BATCH}, {SEQ}, {D_MODEL})", (name, argument)
        else:
            assert np.allclose(got, reference, rtol=0, atol=1e-6, equal_nan=True), (
                f"{name}({argument}={value!r})"
            )
            # NaN in, NaN out; and activations whose products overflow: attention does
            # not read its input (a synchronisation per call), as no torch layer does
            finite_input = not (
                argument == "x"
                and isinstance(value, torch.Tensor)
                and not bool((value.double().abs() < 1e15).all())
            )
            if finite_input:
                assert np.all(np.isfinite(got)), (
                    f"{name}({argument}={value!r}) gave non-finite values"
                )
    assert time.perf_counter() - start < LIMIT_SECONDS, f"{name}({argument}={value!r}) was slow"


@st.composite
def caches(draw: Any) -> KVCache:
    """A cache, new or holding keys of some batch, heads, head_dim and dtype (positions
    recorded or not)."""
    cache = KVCache()
    shape = (
        draw(st.sampled_from([1, BATCH])),
        draw(st.sampled_from([1, HEADS])),
        draw(st.sampled_from([0, 3])),
        draw(st.sampled_from([HEAD_DIM // 2, HEAD_DIM])),
    )
    if draw(st.booleans()):
        dtype = draw(st.sampled_from([torch.float32, torch.float64]))
        keys = torch.randn(shape, dtype=dtype)
        positions = torch.arange(3, 3 + shape[2]) if draw(st.booleans()) else None
        cache.update(keys, -keys, positions=positions)
    return cache


def likely(argument: str, keys: int) -> list[Any]:
    """Tensors that an argument of a call often gets: valid in another form (dtype, rank,
    batch, layout, device) or invalid in one respect."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(BATCH, SEQ, D_MODEL, generator=g)
    if argument == "x":
        return [
            x, x.transpose(0, 1).contiguous().transpose(0, 1), x[:1], x[:, :0], x[:0],
            x.double(), x.half(), x.to(torch.int64), x.to("meta"), x[..., :-1], x[0],
            x.clone().requires_grad_(), x.masked_fill(x > 1, float("nan")), x * 1e30,
        ]  # fmt: skip
    if argument == "positions":
        run = torch.arange(SEQ)
        return [
            run, run.to(torch.int8), run.to(torch.uint8), run.to(torch.int32), run[None],
            run.expand(BATCH, SEQ), run.flip(0), torch.zeros(SEQ, dtype=torch.int64),
            torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]), run + 10**6,
            torch.arange(2 * SEQ)[::2], run - 1, run + 2**60, run.float(), run.bool(),
            run.expand(3, SEQ), torch.arange(SEQ + 1), run[:, None], run.to("meta"),
            torch.zeros(0, dtype=torch.int64), torch.tensor(3),
        ]  # fmt: skip
    if argument == "attn_mask":
        allowed = torch.rand(BATCH, HEADS, SEQ, keys, generator=g) > 0.4
        scores = torch.randn(BATCH, HEADS, SEQ, keys, generator=g)
        added = scores.masked_fill(~allowed, float("-inf"))
        return [
            allowed, allowed[:1], allowed[:, :1], allowed[0, 0], allowed[0, 0, 0],
            allowed[:, :1, :1], allowed[..., :1], torch.tensor(True), added, added[0],
            added.double(), added.half(), added[:, :, :, :1], allowed.to(torch.uint8),
            added.masked_fill(~allowed, float("nan")), added.to("meta"), allowed[..., :-1],
            allowed.transpose(-1, -2), allowed[None], scores.to(torch.complex64),
            torch.zeros(SEQ, keys).fill_(float("-inf")),  # every key hidden
        ]  # fmt: skip
    return []


def hostile(name: str, argument: str) -> st.SearchStrategy[Any]:
    keys = SEQ + (PROMPT if name.startswith("step") else 0)
    made = st.composite(lambda draw: tensors(draw, keys))()
    options = [st.sampled_from(HOSTILE_VALUES), made, caches()]
    if likely(argument, keys):
        options += [st.sampled_from(likely(argument, keys))] * 3  # most often
    return st.one_of(*options)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_argument_gives_the_right_answer_or_is_refused_by_name(data):
    name = data.draw(st.sampled_from(sorted(CALLS)), label="call")
    where = data.draw(st.sampled_from(arguments(CALLS, name)), label="argument")
    value = data.draw(hostile(name, argument_name(CALLS, name, where)), label="value")
    check(name, where, value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_mask_shape_and_dtype_is_the_expanded_mask_or_refused(data):
    # masks only: the ranks and sizes that broadcast and those that do not
    name = data.draw(st.sampled_from([n for n in sorted(CALLS) if n.startswith(("call", "step"))]))
    keys = SEQ + (PROMPT if name.startswith("step") else 0)
    sizes = st.sampled_from([1, 1, BATCH, HEADS, SEQ, keys, 3])
    shape = tuple(data.draw(st.lists(sizes, min_size=0, max_size=5), label="shape"))
    dtype = data.draw(st.sampled_from([torch.bool, torch.float16, torch.float32, torch.float64,
                                       torch.int64]), label="dtype")  # fmt: skip
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    mask = torch.rand(shape, generator=generator) > 0.3
    if dtype != torch.bool:
        mask = torch.where(mask, torch.randn(shape, generator=generator), float("-inf"))
        mask = (
            mask.to(dtype) if dtype.is_floating_point else mask.nan_to_num(0.0, 0.0, 0.0).to(dtype)
        )
    check(name, ("keyword", "attn_mask"), mask)


MODULES = {(scheme, dtype, heads): None for scheme in SCHEMES for dtype in ("float32", "float64")
           for heads in (HEADS, 2 * HEADS) if heads == HEADS or SCHEMES[scheme]() is None}  # fmt: skip


def variant(scheme: str, dtype: str, heads: int) -> MultiHeadAttention:
    """The scheme's attention in ``dtype`` (the same weights), with ``heads`` heads."""
    if MODULES[scheme, dtype, heads] is None:
        torch.manual_seed(0)
        module = MultiHeadAttention(D_MODEL, heads, position=SCHEMES[scheme]()).eval()
        MODULES[scheme, dtype, heads] = module.to(getattr(torch, dtype))
    return MODULES[scheme, dtype, heads]


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_reused_cache_gives_the_full_call_or_refuses_naming_the_cache(scheme, data):
    cache, inputs = KVCache(), []  # the accepted inputs, in order
    bound = None  # (batch, dtype, heads) of the first accepted call
    for _ in range(data.draw(st.integers(1, 4), label="calls")):
        batch = data.draw(st.sampled_from([1, 2]), label="batch")
        seq = data.draw(st.sampled_from([0, 1, 3]), label="seq")
        dtype = data.draw(st.sampled_from(["float32", "float64"]), label="dtype")
        heads = data.draw(st.sampled_from(sorted({h for s, d, h in MODULES if s == scheme})))
        module = variant(scheme, dtype, heads)
        x = torch.randn(batch, seq, D_MODEL, dtype=getattr(torch, dtype))
        rows = data.draw(st.sampled_from([None, 1, batch]), label="positions batch")
        positions = None if rows is None else torch.randint(0, 20, (rows, seq))
        before = (cache.keys, cache.values, cache.positions)
        try:
            out = module(x, positions=positions, cache=cache)
        except ValueError as error:
            refusal = str(error)
        else:
            refusal = None
        if refusal is not None:  # only of a call unlike the first, naming the cache
            assert bound is not None, refusal
            assert bound != (batch, dtype, heads), refusal
            assert "cache" in refusal, refusal
            assert "\n" not in refusal, refusal
            assert (cache.keys, cache.values, cache.positions) == before
            continue
        assert bound in (None, (batch, dtype, heads))
        bound = (batch, dtype, heads)
        inputs.append(x)
        everything = torch.cat(inputs, dim=1)
        full = module(everything, positions=cache.positions)  # the keys' recorded positions
        assert cache.length == everything.shape[1]
        tolerance = 1e-5 if dtype == "float32" else 1e-12
        torch.testing.assert_close(
            out, full[:, everything.shape[1] - seq :], rtol=0, atol=tolerance
        )
