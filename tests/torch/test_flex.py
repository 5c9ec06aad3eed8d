"""FlexAttention for every score bias: score_mods equal to the materialised biases, block
masks equal to the dense masks and to PyTorch's own, MultiHeadAttention's three
implementations equal, decoding with a KV cache equal to the full call."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
flex_module = pytest.importorskip("torch.nn.attention.flex_attention")

from torch.testing import assert_close  # noqa: E402

from posenc.torch import (  # noqa: E402
    ALiBiBias,
    ContextualPositionEncoding,
    FIREBias,
    KERPLEBias,
    KVCache,
    MultiHeadAttention,
    RotaryEmbedding,
    SandwichBias,
    T5RelativeBias,
    _attend,
    block_mask,
    causal,
    dense_mask,
    documents,
    flex_attention,
    sliding_window,
)
from posenc.torch import attention as attention_module  # noqa: E402
from posenc.torch.masks import all_keys, mask_mod  # noqa: E402

H, C = 4, 32  # heads, width: head_dim 8
DISTANCE_SCHEMES = {
    "alibi": lambda: ALiBiBias(H),
    "alibi-symmetric": lambda: ALiBiBias(H, mode="symmetric"),
    "t5": lambda: T5RelativeBias(H, bidirectional=False, num_buckets=8, max_distance=20),
    "kerple-log": lambda: KERPLEBias(H),
    "kerple-power": lambda: KERPLEBias(H, kernel="power"),
    "sandwich": lambda: SandwichBias(H, dim=16, max_length=8),
}


def indices(batch, queries, keys):
    """The arguments of a score_mod or mask_mod as broadcast index tensors."""
    return (
        torch.arange(batch).view(-1, 1, 1, 1),
        torch.arange(H).view(1, -1, 1, 1),
        torch.arange(queries).view(1, 1, -1, 1),
        torch.arange(keys).view(1, 1, 1, -1),
    )


CALLS = {  # (queries, keys, call arguments)
    "square": (6, 6, {}),
    "cached": (3, 11, {}),
    "offset": (4, 9, {"offset": 2}),
    "positions": (4, 7, {"positions": torch.tensor([30, 31, 40, 41]),
                         "key_positions": torch.tensor([0, 5, 30, 31, 33, 40, 41])}),
    "batched": (3, 5, {"positions": torch.tensor([[2, 3, 4], [7, 8, 9]]),
                       "key_positions": torch.tensor([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]])}),
}  # fmt: skip


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("scheme", sorted(DISTANCE_SCHEMES))
def test_score_mod_is_the_materialised_bias(scheme, call):
    """Bit for bit where the bias is an exact product or a lookup (ALiBi, T5, Sandwich);
    KERPLE's pow and log1p round alike to one float32 ulp (PyTorch vectorises them
    differently for tensors of different shapes)."""
    torch.manual_seed(0)
    bias = DISTANCE_SCHEMES[scheme]()
    queries, keys, arguments = CALLS[call]
    want = bias(queries, keys, **arguments).detach()  # (H, q, k) or (B, H, q, k)
    batch = want.shape[0] if want.dim() == 4 else 2
    score = torch.zeros(batch, H, queries, keys)
    got = bias.score_mod(queries, keys, **arguments)(score, *indices(batch, queries, keys))
    want = want.expand(batch, H, queries, keys)
    if scheme.startswith("kerple"):
        assert_close(got.detach(), want, rtol=1.2e-7, atol=0)
    else:
        assert torch.equal(got.detach(), want)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_fire_score_mod_is_its_bias_to_float32_rounding(call):
    torch.manual_seed(0)
    bias = FIREBias(H, mlp_width=8, init_L=4.0)
    queries, keys, arguments = CALLS[call]
    want = bias(queries, keys, **arguments).detach()
    batch = want.shape[0] if want.dim() == 4 else 2
    score = torch.zeros(batch, H, queries, keys)
    got = bias.score_mod(queries, keys, **arguments)(score, *indices(batch, queries, keys))
    assert_close(got.detach(), want.expand(batch, H, queries, keys), rtol=2e-6, atol=2e-6)


def written_out(kind, queries, keys, ids=None):
    """Dense masks built without posenc: tril, a band with sinks, blocks of ids."""
    past = keys - queries
    i = torch.arange(past, keys)[:, None]
    j = torch.arange(keys)[None, :]
    if kind == "causal":
        return j <= i
    if kind == "window":
        return ((i - j).abs() < 5) | (j < 2)
    return ids[:, past:, None] == ids[:, None, :]  # documents, (B, T, S)


@pytest.mark.parametrize(("queries", "keys"), [(9, 9), (1, 9), (4, 13), (130, 130), (1, 300)])
def test_dense_masks_are_the_masks_written_out(queries, keys):
    ids = torch.stack([torch.arange(keys) // 4, torch.arange(keys) // 3])
    causal_mask = written_out("causal", queries, keys)
    window = written_out("window", queries, keys)
    docs = written_out("documents", queries, keys, ids)
    assert torch.equal(dense_mask(causal(), queries, keys)[0, 0], causal_mask)
    assert torch.equal(dense_mask(sliding_window(5, sinks=2), queries, keys)[0, 0], window)
    assert torch.equal(dense_mask(documents(ids), queries, keys)[:, 0], docs)
    both = dense_mask(causal() & sliding_window(5, sinks=2) & documents(ids), queries, keys)
    assert torch.equal(both[:, 0], causal_mask & window & docs)
    either = dense_mask(causal() | sliding_window(5, sinks=2), queries, keys)
    assert torch.equal(either[0, 0], causal_mask | window)
    cu = documents(cu_seqlens=torch.tensor([0, 4, 4, keys]))
    assert torch.equal(dense_mask(cu, queries, keys)[0, 0], written_out(
        "documents", queries, keys, (torch.arange(keys) >= 4).long()[None])[0])  # fmt: skip


@pytest.mark.parametrize(("queries", "keys"), [(300, 300), (1, 300), (130, 500), (256, 256)])
def test_block_masks_are_pytorchs_own(queries, keys):
    ids = (torch.arange(keys) // 100)[None]
    for mask in (
        all_keys(),
        causal(),
        causal() & sliding_window(64),
        sliding_window(200, sinks=4),
        documents(ids),
        causal() & documents(ids),
    ):
        ours = block_mask(mask, queries, keys)
        theirs = flex_module.create_block_mask(
            mask_mod(mask, queries, keys), 1, 1, queries, keys, device="cpu"
        )
        for got, want in zip(ours.as_tuple()[2:6], theirs.as_tuple()[2:6], strict=True):
            assert torch.equal(got, want), mask


def pair(position, implementation, seed=0):
    """An sdpa attention and one with ``implementation``, the same weights."""
    torch.manual_seed(seed)
    reference = MultiHeadAttention(C, H, position=position).eval()
    other = MultiHeadAttention(C, H, position=position, attn_implementation=implementation)
    other.load_state_dict(reference.state_dict())
    return reference, other.eval()


SCHEMES = {
    **DISTANCE_SCHEMES,
    "rope": lambda: RotaryEmbedding(C // H),
    "none": lambda: None,
}


@pytest.mark.slow
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_flex_and_eager_equal_sdpa_with_masks_and_a_cache(scheme):
    torch.manual_seed(1)
    sdpa, flex = pair(SCHEMES[scheme](), "flex_attention")
    eager = pair(SCHEMES[scheme](), "eager")[1]
    eager.load_state_dict(sdpa.state_dict())
    x = torch.randn(2, 150, C)  # two tiles of 128 keys, the second partial
    mask = sliding_window(40, sinks=3) & documents(torch.tensor([0] * 70 + [1] * 80))
    with torch.no_grad():
        want = sdpa(x)
        assert_close(flex(x), want, rtol=0, atol=2e-6)
        assert_close(eager(x), want, rtol=0, atol=2e-6)
        assert_close(flex(x, attn_mask=mask), sdpa(x, attn_mask=mask), rtol=0, atol=2e-6)
        cache = KVCache()
        steps = [flex(x[:, :130], cache=cache)]
        steps += [flex(x[:, t : t + 1], cache=cache) for t in range(130, 133)]
    assert_close(torch.cat(steps, dim=1), want[:, :133], rtol=0, atol=2e-6)


@pytest.mark.slow
def test_fire_through_flex_equals_sdpa():
    torch.manual_seed(2)
    sdpa, flex = pair(FIREBias(H, mlp_width=8), "flex_attention")
    x = torch.randn(2, 140, C)
    with torch.no_grad():
        assert_close(flex(x), sdpa(x), rtol=0, atol=2e-6)


@pytest.mark.slow
def test_explicit_positions_and_a_dense_mask_through_flex():
    torch.manual_seed(3)
    sdpa, flex = pair(ALiBiBias(H), "flex_attention")
    x = torch.randn(2, 140, C)
    positions = torch.stack([torch.arange(140), torch.arange(140) % 70])  # packed, row 2
    additive = torch.randn(2, 1, 140, 140).tril()  # a floating mask, added to the scores
    with torch.no_grad():
        assert_close(flex(x, positions=positions), sdpa(x, positions=positions), rtol=0,
                     atol=2e-6)  # fmt: skip
        shared = positions[:1] + 3  # (1, T): every batch row's, as SDPA broadcasts them
        assert_close(flex(x, positions=shared), sdpa(x, positions=shared), rtol=0, atol=2e-6)
        assert_close(flex(x, attn_mask=additive), sdpa(x, attn_mask=additive), rtol=0,
                     atol=2e-6)  # fmt: skip


@pytest.mark.slow
def test_one_program_for_every_length_and_every_distance_bias():
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    torch.manual_seed(4)
    with torch.no_grad():
        for length in (200, 260, 400):  # one table length (1,024 columns): one program
            part = torch.randn(1, H, length, 8)  # (contiguous alike: strides are guarded)
            for scheme in ("alibi", "t5", "kerple-log"):
                bias = DISTANCE_SCHEMES[scheme]()
                flex_attention(part, part, part, score_mod=bias.score_mod(length),
                               block_mask=block_mask(causal(), length))  # fmt: skip
    assert counters["stats"]["unique_graphs"] == 1


def test_cpu_flex_says_it_is_forward_only():
    _, flex = pair(ALiBiBias(H), "flex_attention")
    x = torch.randn(1, 5, C)
    with pytest.raises(RuntimeError, match=r"forward only on the CPU.*torch.no_grad\(\)"):
        flex(x)


def test_auto_takes_flex_for_long_calls_it_can_run(monkeypatch):
    chosen = []
    monkeypatch.setattr(_attend, "AUTO_SCORES", 2 * H * 16 * 16)
    original = attention_module.attend_flex
    monkeypatch.setattr(attention_module, "attend_flex",
                        lambda *a, **k: chosen.append(True) or original(*a, **k))  # fmt: skip
    sdpa, auto = pair(ALiBiBias(H), "auto")
    short, long = torch.randn(2, 8, C), torch.randn(2, 16, C)
    out = auto(long)  # gradients on the CPU: SDPA, and it trains
    out.sum().backward()
    assert not chosen
    with torch.no_grad():
        assert_close(auto(short), sdpa(short))
        assert not chosen
        assert_close(auto(long), sdpa(long), rtol=0, atol=2e-6)
    assert chosen == [True]


def test_flex_refuses_cope_and_dropout_saying_why():
    cope = ContextualPositionEncoding(C // H, max_positions=8)
    with pytest.raises(ValueError, match="CoPE has no FlexAttention score_mod.*reduction"):
        MultiHeadAttention(C, H, position=cope, attn_implementation="flex_attention")
    with pytest.raises(ValueError, match="no dropout on the attention weights, got dropout=0.1"):
        MultiHeadAttention(C, H, dropout=0.1, attn_implementation="flex_attention")
    with pytest.raises(ValueError, match="attn_implementation must be one of"):
        MultiHeadAttention(C, H, attn_implementation="flash")


def test_masks_refuse_what_they_cannot_be():
    with pytest.raises(ValueError, match="documents\\(\\) takes document_ids or cu_seqlens"):
        documents()
    with pytest.raises(ValueError, match="the documents cover 4 keys, the attention has 6"):
        block_mask(documents(torch.tensor([0, 0, 1, 1])), 6)
    with pytest.raises(ValueError, match="key_length must be at least query_length"):
        dense_mask(causal(), 5, 3)
    with pytest.raises(TypeError, match="mask must be a posenc mask"):
        block_mask(torch.ones(3, 3), 3)
    far = torch.tensor([0, 2**40])  # distances far apart: a table too large, refused
    with pytest.raises(ValueError, match=r"ALiBiBias.score_mod \(a table of the 2199023255553 "):
        ALiBiBias(H).score_mod(2, 2, positions=far, key_positions=far)
    with pytest.raises(ValueError, match="query must be a \\(batch, heads, length, head_dim\\)"):
        flex_attention(torch.ones(3, 3), torch.ones(1, 1, 3, 3), torch.ones(1, 1, 3, 3))


@pytest.mark.slow
def test_the_bench_model_evaluates_long_lengths_through_flex(monkeypatch):
    from posenc.bench.model import GPT, GPTConfig

    torch.manual_seed(5)
    model = GPT(GPTConfig(vocab_size=12, scheme="kerple", d_model=16, n_heads=2)).eval()
    tokens = torch.randint(0, 12, (2, 140))
    chosen = []
    original = attention_module.attend_flex
    monkeypatch.setattr(attention_module, "attend_flex",
                        lambda *a, **k: chosen.append(True) or original(*a, **k))  # fmt: skip
    with torch.no_grad():
        want = model(tokens)  # 2·2·140² scores: SDPA
        assert not chosen
        monkeypatch.setattr(_attend, "AUTO_SCORES", 2 * 2 * 140 * 140)  # now a long call
        got = model(tokens)
    assert chosen == [True, True]  # both layers
    assert_close(got, want, rtol=0, atol=2e-5)


UNCOVERED = {  # documents that do not give the document of every key: (mask, T, S, covered)
    "keys past the last document": (lambda: documents([0, 0, 1]), 5, 5, 3),
    "ids of keys that are not there": (lambda: documents(torch.arange(6)), 3, 3, 6),
    "cu_seqlens short of the keys": (lambda: documents(cu_seqlens=[0, 2, 3]), 6, 6, 3),
    "inside a combination": (lambda: causal() & documents([0, 1]), 1, 3, 2),
}


@pytest.mark.parametrize("case", sorted(UNCOVERED))
def test_documents_that_do_not_cover_the_keys_are_refused_on_every_path(case):
    """One check in the core (check_call): the dense mask, the mask function, the block
    mask, and MultiHeadAttention through SDPA, eager and FlexAttention all refuse it."""
    make, queries, keys, covered = UNCOVERED[case]
    message = f"the documents cover {covered} keys, the attention has {keys}"
    for build in (dense_mask, mask_mod, block_mask):
        with pytest.raises(ValueError, match=message):
            build(make(), queries, keys)
    x = torch.randn(1, keys, C)
    for implementation in ("sdpa", "eager", "flex_attention"):
        attention = MultiHeadAttention(C, H, attn_implementation=implementation).eval()
        with torch.no_grad(), pytest.raises(ValueError, match=message):
            attention(x, attn_mask=make())
    attention, cache = MultiHeadAttention(C, H).eval(), KVCache()
    with torch.no_grad():
        attention(x[:, :2], cache=cache)
        with pytest.raises(ValueError, match=message):  # the keys held and the call's
            attention(x[:, 2:], cache=cache, attn_mask=make())


def test_masks_refuse_empty_documents_huge_windows_and_dense_masks_past_the_limit():
    for empty in (lambda: documents([]), lambda: documents(cu_seqlens=torch.tensor([0]))):
        with pytest.raises(ValueError, match="documents need at least one key"):
            empty()
    with pytest.raises(ValueError, match="window must be at most 9223372036854775807"):
        sliding_window(2**63)
    widest = sliding_window(2**63 - 1, sinks=2**63 - 1)  # every key, in int64
    assert torch.equal(dense_mask(widest, 2, 3), torch.ones(1, 1, 2, 3, dtype=torch.bool))
    from posenc import MemoryLimitError

    with pytest.raises(MemoryLimitError, match=r"a dense mask of 1 × 1000000 × 1000000 .*"
                       r"1\.8 TiB.*attn_implementation='flex_attention'"):  # fmt: skip
        dense_mask(causal(), 10**6, 10**6)
    with pytest.raises(MemoryLimitError, match="a dense mask of 2 × 40000 × 40000"):
        dense_mask(causal() & sliding_window(4096), 40000, batch=2)  # int64 temporaries
    # a mask alike for every batch row is made once: 36 MB, not 256 times over the limit
    assert dense_mask(causal(), 6000, batch=256).shape == (256, 1, 6000, 6000)
    with pytest.raises(MemoryLimitError, match="a dense mask of 256 × 6000 × 6000"):
        dense_mask(causal() & documents(torch.arange(6000) // 7), 6000, batch=256)  # per row


@pytest.mark.parametrize("scheme", sorted({*DISTANCE_SCHEMES, "fire"}))
def test_score_mods_of_calls_without_scores_and_of_positions_one_row_for_the_batch(scheme):
    """A call with no queries or no keys has the module's empty bias; positions (1, T)
    are every batch row's, as the module's own bias (1, H, T, S) broadcasts."""
    torch.manual_seed(0)
    bias = FIREBias(H, mlp_width=8) if scheme == "fire" else DISTANCE_SCHEMES[scheme]()
    for sizes in ((0,), (0, 3), (2, 0)):
        assert bias(*sizes).numel() == 0
        score = torch.randn(2, H, *bias(*sizes).shape[-2:])
        mod = bias.score_mod(*sizes)
        assert torch.equal(mod(score, *indices(2, *score.shape[-2:])), score)
    positions = torch.tensor([[3, 4, 9]])  # (1, T): shared by a batch of 2
    want = bias(3, positions=positions, key_positions=positions).detach()  # (1, H, T, T)
    score = torch.zeros(2, H, 3, 3)
    got = bias.score_mod(3, positions=positions, key_positions=positions)(score, *indices(2, 3, 3))
    assert_close(got.detach(), want.expand(2, H, 3, 3), rtol=2e-6, atol=2e-6)


@pytest.mark.slow
def test_every_decoding_step_through_flex_equals_the_full_call():
    """One token at a time with a KVCache after a causal prefill of 8 or 3: the calls
    whose cache holds 8, 24 or 40 keys are those PyTorch's CPU kernel gets wrong at head
    dims 8 and 16 (posenc.torch.flex routes them around it); every step equals SDPA's
    full call. ALiBi and T5 at head_dim 8 (one program), and a model's shape: 8 heads of
    64."""
    models = {  # (position, heads, head_dim, prefill)
        "alibi": (lambda: ALiBiBias(2), 2, 8, 8),
        "t5": (lambda: T5RelativeBias(4, bidirectional=False), 4, 8, 3),
        "alibi, 8 heads of 64": (lambda: ALiBiBias(8), 8, 64, 3),
    }
    for name, (position, heads, head_dim, prefill) in models.items():
        torch.manual_seed(6)
        width = heads * head_dim
        sdpa = MultiHeadAttention(width, heads, position=position()).eval()
        flex = MultiHeadAttention(width, heads, position=position(),
                                  attn_implementation="flex_attention").eval()  # fmt: skip
        flex.load_state_dict(sdpa.state_dict())
        x = torch.randn(2, 41, width)
        with torch.no_grad():
            want = sdpa(x)  # (B, T, C)
            cache = KVCache()
            steps = [flex(x[:, :prefill], cache=cache)]
            steps += [flex(x[:, t : t + 1], cache=cache) for t in range(prefill, 41)]
        assert_close(torch.cat(steps, dim=1), want, rtol=0, atol=1e-5, msg=name)


def test_auto_keeps_sdpa_for_what_the_cpu_kernel_does_not_take(monkeypatch):
    """float64: PyTorch 2.13's CPU FlexAttention fails inside its lowering; "auto" keeps
    SDPA, and "flex_attention" refuses by name."""
    monkeypatch.setattr(_attend, "AUTO_SCORES", 1)
    sdpa, auto = pair(ALiBiBias(H), "auto")
    sdpa, auto = sdpa.double(), auto.double()
    x = torch.randn(2, 6, C, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(auto(x), sdpa(x))
        flex = pair(ALiBiBias(H), "flex_attention")[1].double()
        with pytest.raises(TypeError, match="takes float32, bfloat16 or float16.*float64"):
            flex(x)
