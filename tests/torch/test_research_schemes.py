"""The length-generalisation schemes: KERPLE, FIRE, Sandwich, CoPE and RoPE with trained
frequencies, against their papers' formulas written out element by element (and mpmath),
and inside the attention."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.testing import assert_close  # noqa: E402

import posenc  # noqa: E402
from posenc.core.positions import MemoryLimitError  # noqa: E402
from posenc.torch import (  # noqa: E402
    ContextualPositionEncoding,
    FIREBias,
    KERPLEBias,
    KVCache,
    LearnedRotaryEmbedding,
    MultiHeadAttention,
    RotaryEmbedding,
    SandwichBias,
)

# --- Sandwich ------------------------------------------------------------------------


def sandwich_mp(distance: int, head: int, heads: int, dim: int, base: float) -> mpmath.mpf:
    """The paper's Σ_{i=1}^{d/2} cos(Δ·base^(-2i/d)) - d/2, over 8h/H, at 40 digits."""
    with mpmath.workdps(40):
        total = mpmath.fsum(
            mpmath.cos(distance * mpmath.power(base, mpmath.mpf(-2 * i) / dim))
            for i in range(1, dim // 2 + 1)
        )
        return (total - mpmath.mpf(dim) / 2) / (mpmath.mpf(8 * head) / heads)


@pytest.mark.parametrize(("heads", "dim", "base"), [(1, 2, 10000.0), (4, 16, 10000.0),
                                                    (6, 64, 10000.0), (3, 8, 2.5)])  # fmt: skip
def test_sandwich_equals_the_formula_at_40_digits(heads, dim, base):
    distances = np.array([0, 1, 2, 3, 7, 50, 333, 4096, 100_003])
    ours = posenc.core.sandwich.sandwich_distance_bias(
        distances, num_heads=heads, dim=dim, base=base
    )
    exact = np.array(
        [[float(sandwich_mp(int(d), h, heads, dim, base)) for d in distances]
         for h in range(1, heads + 1)]
    )  # fmt: skip
    # float64 inside, no cancellation: the error is the angles' rounding, Δ·ulp(ω), about
    # 1e-13 of the value at Δ = 10^5 (far below float32's half-ulp, 3e-8)
    assert_close(torch.from_numpy(ours), torch.from_numpy(exact), rtol=5e-13, atol=1e-15)
    near = distances < 1000
    assert_close(torch.from_numpy(ours[:, near]), torch.from_numpy(exact[:, near]),
                 rtol=2e-15, atol=1e-17)  # fmt: skip
    assert ours[:, 0].tolist() == [0.0] * heads  # 0 at distance 0, not -0


def test_sandwich_equals_nemos_form_and_rounds_once():
    """NeMo's SandwichRelativePositionEmbedding computes Σ cos - d/2 over 8h/H in float32
    torch ops; the same formula in float64 agrees, and posenc's float32 values are its
    float64 values rounded once."""
    heads, dim, T = 4, 32, 40
    rel = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # key - query
    rel = torch.tril(rel)  # NeMo masks the future with tril: distance 0 there
    inv_freq = 1.0 / (10000 ** (2 * torch.arange(1, dim / 2 + 1, dtype=torch.float64) / dim))
    inner = torch.cos(rel[:, :, None].double() * inv_freq).sum(-1)  # (T, T)
    scales = (torch.arange(1, heads + 1, dtype=torch.float64) * 8 / heads)[:, None, None]
    reference = (inner - dim / 2) / scales  # (H, T, T)
    ours = posenc.sandwich_bias(T, num_heads=heads, dim=dim, fmt="float64")
    assert_close(torch.from_numpy(ours), reference, rtol=0, atol=1e-12)
    single = posenc.sandwich_bias(T, num_heads=heads, dim=dim, fmt="float32")
    assert np.array_equal(single, ours.astype(np.float32))


@pytest.mark.parametrize("mode", ["causal", "symmetric"])
def test_sandwich_rows_with_an_offset_are_rows_of_the_full_matrix(mode):
    full = posenc.sandwich_bias(12, num_heads=3, dim=8, mode=mode)
    assert np.array_equal(posenc.sandwich_bias(1, 12, num_heads=3, dim=8, offset=11, mode=mode),
                          full[:, 11:])  # fmt: skip
    assert np.array_equal(posenc.sandwich_bias(4, 12, num_heads=3, dim=8, offset=5, mode=mode),
                          full[:, 5:9])  # fmt: skip
    if mode == "causal":
        assert np.all(np.triu(full, 1) == 0)  # future keys: 0 (hidden by the causal mask)
    else:
        assert np.array_equal(full, full.transpose(0, 2, 1))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dim": 7}, ValueError, "dim must be even"),
        ({"dim": 0}, ValueError, "dim must be an int >= 2"),
        ({"base": 1.0}, ValueError, "base must not be 1"),
        ({"num_heads": 0}, ValueError, "num_heads must be an int >= 1"),
        ({"mode": "both"}, ValueError, "mode must be one of"),
        ({"dim": 8.0}, TypeError, "dim must be an int"),
    ],
)
def test_sandwich_refuses_bad_options(kwargs, error, match):
    options = {"num_heads": 2, "dim": 8, **kwargs}
    with pytest.raises(error, match=match):
        posenc.sandwich_bias(4, **options)
    with pytest.raises(error, match=match):
        posenc.SandwichSpec(**options)


def test_sandwich_module_holds_the_cores_numbers_and_grows():
    module = SandwichBias(4, dim=16, max_length=8)
    assert_close(module(6, dtype=torch.float64),
                 torch.from_numpy(posenc.sandwich_bias(6, num_heads=4, dim=16, fmt="float64")),
                 rtol=0, atol=0)  # fmt: skip
    near = module(3, 16, offset=13)  # distances up to 15: the table doubles
    assert module.table.shape == (16, 4)
    expected = posenc.sandwich_bias(3, 16, num_heads=4, dim=16, offset=13)
    assert np.array_equal(near.numpy(), expected)
    far = module(2, 10**5, offset=10**5 - 2)  # far past it: grown to the length needed
    assert module.table.shape == (10**5, 4)
    expected = posenc.sandwich_bias(2, 10**5, num_heads=4, dim=16, offset=10**5 - 2)
    assert np.array_equal(far.numpy(), expected)
    positions = torch.tensor([[3, 4, 5], [10, 11, 12]])
    batched = module(3, 3, positions=positions, key_positions=positions)
    assert batched.shape == (2, 4, 3, 3)
    assert_close(batched[1], module(3, 3), rtol=0, atol=0)  # relative: only distances count


# --- KERPLE --------------------------------------------------------------------------


def kerple_reference(p: np.ndarray, a: np.ndarray, kernel: str, q: int, k: int, offset: int):
    """The kernels of the authors' code, one entry at a time in float64:
    -p·log(1 + a·|m - n|) and -a·|m - n|^p."""
    out = np.zeros((len(p), q, k))
    for h in range(len(p)):
        for i in range(q):
            for j in range(k):
                distance = abs(offset + i - j)
                if kernel == "log":  # the authors' ParallelKerpleLog
                    out[h, i, j] = -p[h] * math.log1p(a[h] * distance)
                else:  # ParallelKerplePower: bias_p is the exponent, bias_a the scale
                    out[h, i, j] = -a[h] * distance ** p[h]
    return out


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_equals_its_kernel(kernel):
    torch.manual_seed(0)
    module = KERPLEBias(3, kernel=kernel).double()
    p = module.bias_p.detach().numpy().ravel()
    a = module.bias_a.detach().numpy().ravel()
    expected = kerple_reference(p, a, kernel, 4, 9, 5)
    assert_close(module(4, 9, offset=5), torch.from_numpy(expected), rtol=1e-14, atol=0,
                 check_dtype=False)  # fmt: skip


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_starts_as_the_authors_draw_it(kernel):
    """The authors' ParallelKerpleLog and ParallelKerplePower: ``bias_p = 2·rand(H)``,
    then ``bias_a = rand(H)``, (H, 1, 1)."""
    torch.manual_seed(5)
    module = KERPLEBias(4, kernel=kernel)
    torch.manual_seed(5)
    p, a = torch.rand(4) * 2, torch.rand(4)  # then held at eps or more, as at their first call
    p, a = p.clamp(min=0.01), a.clamp(min=0.01)
    assert module.bias_p.shape == (4, 1, 1)
    assert_close(module.bias_p.detach().ravel(), p, rtol=0, atol=0)
    assert_close(module.bias_a.detach().ravel(), a, rtol=0, atol=0)


def test_kerple_projects_its_parameters_back_into_range():
    module = KERPLEBias(2, kernel="power")
    with torch.no_grad():
        module.bias_p.copy_(torch.tensor([-1.0, 0.5]).view(2, 1, 1))
        module.bias_a.copy_(torch.tensor([3.0, 0.001]).view(2, 1, 1))
    module(3)
    assert module.bias_p.detach().ravel().tolist() == pytest.approx([0.01, 0.5])
    assert module.bias_a.detach().ravel().tolist() == pytest.approx([3.0, 0.01])
    with torch.no_grad():
        module.bias_p.fill_(2.5)  # the power kernel's exponent: at most 2
        module.bias_a.fill_(3.0)  # its scale: no upper bound
    module(3)
    assert module.bias_p.detach().ravel().tolist() == [2.0, 2.0]
    assert module.bias_a.detach().ravel().tolist() == [3.0, 3.0]
    # traced code cannot update in place: it projects the values it uses the same way,
    # and the parameters keep their gradient (straight through), so they can come back
    with torch.no_grad():
        module.bias_p.fill_(3.0)
    program = torch.export.export(module, (4,))
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    with torch.no_grad():
        module.bias_p.fill_(-1.0)
    traced = compiled(4)
    traced.sum().backward()
    assert module.bias_p.grad.abs().sum() > 0
    assert module.bias_p.detach().ravel().tolist() == [-1.0, -1.0]  # not changed in place
    assert_close(traced, module(4), rtol=0, atol=0)  # the eager call projects in place
    with torch.no_grad():
        module.bias_p.fill_(3.0)
    assert_close(program.module()(4), module(4), rtol=0, atol=0)
    module.zero_grad()
    # in range: two calls and one backward (nothing is changed in place in between)
    (module(5).sum() + module(5).sum()).backward()
    assert module.bias_p.grad is not None
    assert module.bias_a.grad is not None


# --- FIRE ----------------------------------------------------------------------------


def fire_reference(module: FIREBias, q: int, k: int, offset: int) -> np.ndarray:
    """f(ψ(m - n) / (ψ(max(L, m)) + eps)), ψ(x) = log(|c·x| + 1), entry by entry."""
    c = module.c.item()
    L = abs(module.L_multiplier.item() * module.init_L.item())
    out = np.zeros((module.num_heads, q, k))
    for i in range(q):
        m = offset + i
        normaliser = math.log(abs(c * max(L, m)) + 1) + module.spec.eps
        for j in range(k):
            x = math.log(abs(c * (m - j)) + 1) / normaliser
            hidden = torch.relu(module.mlp[0](torch.tensor([x], dtype=torch.float64)))
            out[:, i, j] = module.mlp[2](hidden).detach().numpy()
    return out


@pytest.mark.parametrize("init_L", [512.0, 3.0])
def test_fire_equals_its_formula(init_L):
    torch.manual_seed(0)
    module = FIREBias(2, mlp_width=8, init_L=init_L).double()
    with torch.no_grad():
        module.c.fill_(0.7)
        module.L_multiplier.fill_(1.25)
    expected = fire_reference(module, 6, 10, 4)
    assert_close(module(6, 10, offset=4), torch.from_numpy(expected), rtol=1e-12, atol=1e-14)


def test_fire_normalises_by_the_query_position_and_trains_every_parameter():
    torch.manual_seed(0)
    module = FIREBias(2, init_L=2.0)
    full = module(12)
    assert_close(module(3, 12, offset=9), full[:, 9:], rtol=0, atol=0)  # absolute rows
    # past L the distance to the first token always maps to 1: the same bias
    first = full[:, 2:, 0]
    assert_close(first, first[:, :1].expand_as(first), rtol=1e-6, atol=1e-6)
    full.sum().backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None, name
        assert parameter.grad.abs().sum() > 0, name


# --- CoPE ----------------------------------------------------------------------------


def cope_reference(q, k, pos_emb, allowed, scale):
    """The paper's counts written out: p_ij = Σ_{j <= t} σ(scale·q_i·k_t) over the keys
    query i sees, e interpolated at p_ij, bias = scale·q_i·e(p_ij)."""
    B, H, T, _ = q.shape
    S = k.shape[2]
    npos = pos_emb.shape[-1]
    out = torch.zeros(B, H, T, S, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                gates = [
                    float(torch.sigmoid(scale * q[b, h, i] @ k[b, h, t])) if allowed[i, t] else 0.0
                    for t in range(S)
                ]
                for j in range(S):
                    count = min(sum(gates[j:]), npos - 1)
                    low, weight = math.floor(count), count - math.floor(count)
                    high = math.ceil(count)
                    vector = pos_emb[0, :, low] * (1 - weight) + pos_emb[0, :, high] * weight
                    out[b, h, i, j] = scale * float(q[b, h, i] @ vector)
    return out


@pytest.mark.parametrize("npos", [20, 4])  # 4: counts clamp at the last vector
def test_cope_equals_the_counts_written_out(npos):
    torch.manual_seed(0)
    cope = ContextualPositionEncoding(4, max_positions=npos).double()
    with torch.no_grad():
        cope.pos_emb.normal_()
    q, k = (
        torch.randn(2, 2, 6, 4, dtype=torch.float64),
        torch.randn(2, 2, 6, 4, dtype=torch.float64),
    )
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    expected = cope_reference(q, k, cope.pos_emb.detach(), causal, 0.5)
    got = cope(q, k, allowed=causal, scale=0.5)
    assert_close(
        got.masked_fill(~causal, 0), expected.masked_fill(~causal, 0), rtol=1e-12, atol=1e-12
    )


def test_cope_attention_is_the_authors_formula_and_decodes_with_a_cache():
    """softmax((q·kᵀ + q·e[p]) / √d) v, as the authors' ContextPosSelfAttn, with the
    gates σ(q·k/√d) of the causally visible keys."""
    torch.manual_seed(0)
    d_model, heads, T = 16, 2, 7
    hs = d_model // heads
    cope = ContextualPositionEncoding(hs, max_positions=T + 1)
    with torch.no_grad():
        cope.pos_emb.normal_()
    module = MultiHeadAttention(d_model, heads, position=cope).eval()
    x = torch.randn(2, T, d_model)
    q, k, v = module.qkv(x).split(d_model, dim=2)
    q, k, v = (t.view(2, T, heads, hs).transpose(1, 2) for t in (q, k, v))
    logits = q @ k.transpose(-1, -2)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    gates = torch.sigmoid(logits / math.sqrt(hs)) * causal
    counts = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=T)
    fixed = q @ cope.pos_emb[0]
    floor = counts.floor()
    w = counts - floor
    pos = fixed.gather(-1, counts.ceil().long()) * w + fixed.gather(-1, floor.long()) * (1 - w)
    attn = ((logits + pos) / math.sqrt(hs)).masked_fill(~causal, float("-inf")).softmax(-1)
    y = (attn @ v).transpose(1, 2).reshape(2, T, d_model)
    full = module(x)
    assert_close(full, module.out(y), rtol=0, atol=1e-5)
    cache = KVCache()
    steps = [module(x[:, :3], cache=cache)] + [
        module(x[:, t : t + 1], cache=cache) for t in range(3, T)
    ]
    assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


def test_attention_refuses_a_cope_of_another_width():
    with pytest.raises(ValueError, match="head_dim=4, the attention 8"):
        MultiHeadAttention(16, 2, position=ContextualPositionEncoding(4, max_positions=8))


# --- RoPE with trained frequencies -----------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{}, {"layout": "interleaved"}, {"rotary_dim": 4},
     {"scaling": "proportional", "scaling_params": {"partial_rotary_factor": 0.5}},
     {"scaling": "yarn", "scaling_params": {"factor": 4.0,
                                            "original_max_position_embeddings": 32}}],
)  # fmt: skip
def test_learned_rope_starts_as_rope(options):
    torch.manual_seed(0)
    learned, fixed = LearnedRotaryEmbedding(8, **options), RotaryEmbedding(8, **options)
    q, k = torch.randn(2, 3, 20, 8), torch.randn(2, 3, 20, 8)
    for got, expected in zip(learned(q, k, offset=5), fixed(q, k, offset=5), strict=True):
        assert_close(got, expected, rtol=0, atol=2e-6)  # float32 frequencies vs float64


def test_learned_rope_rotates_by_its_current_frequencies_and_trains_them():
    rope = LearnedRotaryEmbedding(4)
    with torch.no_grad():
        rope.inv_freq.copy_(torch.tensor([0.75, -0.125]))
    q = torch.randn(1, 1, 6, 4, dtype=torch.float64)
    positions = torch.tensor([0, 3, 9, 100, 2, 7])
    out, _ = rope(q.float(), q.float(), positions=positions)
    # half layout: pairs (x_i, x_{i+2}) turned by position·θ_i, as complex numbers
    theta = positions.double()[:, None] * torch.tensor([0.75, -0.125], dtype=torch.float64)
    pairs = torch.complex(q[..., :2], q[..., 2:]) * torch.polar(torch.ones_like(theta), theta)
    expected = torch.cat([pairs.real, pairs.imag], dim=-1)
    assert_close(out.double(), expected, rtol=0, atol=1e-6)
    out.sum().backward()
    assert rope.inv_freq.grad is not None
    assert rope.inv_freq.grad.abs().sum() > 0


def test_learned_rope_refuses_a_scaling_without_fixed_frequencies():
    with pytest.raises(ValueError, match="recomputes the frequencies"):
        LearnedRotaryEmbedding(8, scaling="dynamic_ntk", scaling_params={
            "factor": 2.0, "original_max_position_embeddings": 16})  # fmt: skip


# --- every new scheme in the attention --------------------------------------------------


def _cope(head_dim: int) -> ContextualPositionEncoding:
    cope = ContextualPositionEncoding(head_dim, max_positions=32)
    with torch.no_grad():
        cope.pos_emb.normal_()  # the authors start at zero: a bias of 0 would test nothing
    return cope


def research_modules(heads: int = 2, head_dim: int = 8):
    return {
        "kerple": KERPLEBias(heads),
        "kerple_power": KERPLEBias(heads, kernel="power"),
        "fire": FIREBias(heads, init_L=4.0),
        "sandwich": SandwichBias(heads, dim=16),
        "cope": _cope(head_dim),
        "rope_learned": LearnedRotaryEmbedding(head_dim),
    }


@pytest.mark.parametrize("name", list(research_modules()))
def test_kv_cache_decoding_equals_the_full_call(name):
    torch.manual_seed(0)
    module = MultiHeadAttention(16, 2, position=research_modules()[name]).eval()
    x = torch.randn(2, 12, 16)
    full = module(x)
    cache = KVCache()
    steps = [module(x[:, :4], cache=cache)] + [
        module(x[:, t : t + 1], cache=cache) for t in range(4, 12)
    ]
    assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", list(research_modules()))
def test_compile_fullgraph_and_export(name):
    torch._dynamo.reset()  # each scheme recompiles forward: keep under the limit
    torch.manual_seed(0)
    module = MultiHeadAttention(16, 2, position=research_modules()[name]).eval()
    x = torch.randn(2, 12, 16)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    assert_close(compiled(x), module(x), rtol=0, atol=1e-6)
    program = torch.export.export(module, (x,))
    assert_close(program.module()(x), module(x), rtol=0, atol=1e-6)


def test_cope_counts_in_float32_for_low_precision_inputs():
    """bfloat16 in, bfloat16 out, float32 inside: the same bits as the float32 call on
    the same (bfloat16) values, rounded once. Summed in bfloat16, 600 gates of about 1/2
    would be off by whole positions."""
    torch.manual_seed(0)
    cope = ContextualPositionEncoding(8, max_positions=700)
    with torch.no_grad():
        cope.pos_emb.normal_()
    low = cope.bfloat16()
    q, k = torch.randn(1, 1, 600, 8).bfloat16(), torch.randn(1, 1, 600, 8).bfloat16()
    causal = torch.ones(600, 600, dtype=torch.bool).tril()
    got = low(q, k, allowed=causal, scale=0.35)
    assert got.dtype == torch.bfloat16
    reference = ContextualPositionEncoding(8, max_positions=700)
    reference.load_state_dict({"pos_emb": low.pos_emb.float()})
    expected = reference(q.float(), k.float(), allowed=causal, scale=0.35).bfloat16()
    assert torch.equal(got, expected)


@pytest.mark.parametrize(
    ("q_shape", "k_shape", "allowed", "scale", "error", "match"),
    [
        ((2, 2, 3, 4), (1, 2, 3, 4), None, 1.0, ValueError, "same batch and heads"),
        ((2, 2, 3, 4), (2, 3, 3, 4), None, 1.0, ValueError, "same batch and heads"),
        ((2, 2, 3, 5), (2, 2, 3, 5), None, 1.0, ValueError, r"\(batch, heads, seq, 4\)"),
        ((2, 2, 3, 4), (2, 2, 3, 4), torch.ones(4, 4, dtype=torch.bool), 1.0, ValueError,
         "broadcast to the scores"),
        ((2, 2, 3, 4), (2, 2, 3, 4), torch.ones(3, 3), 1.0, TypeError, "boolean tensor"),
        ((2, 2, 3, 4), (2, 2, 3, 4), None, "a", TypeError, "scale must be"),
        ((2, 2, 3, 4), (2, 2, 3, 4), None, 0.0, ValueError, "scale must be"),
    ],
)  # fmt: skip
def test_cope_refuses_arguments_that_do_not_fit(q_shape, k_shape, allowed, scale, error, match):
    cope = ContextualPositionEncoding(4, max_positions=8)
    with pytest.raises(error, match=match):
        cope(torch.randn(q_shape), torch.randn(k_shape), allowed=allowed, scale=scale)
    with pytest.raises(TypeError, match="q must be a floating-point tensor"):
        cope(torch.ones(1, 1, 2, 4, dtype=torch.int64), torch.randn(1, 1, 2, 4))


def test_sandwich_refuses_a_table_past_the_memory_limit():
    with pytest.raises(MemoryLimitError, match=r"SandwichBias \(a table of 1000000000 distances"):
        SandwichBias(2, dim=512, max_length=10**9)
    with pytest.raises(MemoryLimitError, match="max_bytes"):
        posenc.sandwich_bias(1, 10**9, num_heads=1, dim=8, offset=10**9 - 1)


def test_a_scheme_with_both_score_roles_adds_both():
    class Both(KERPLEBias):
        head_dim = 8

        def contextual_bias(self, q, k, *, allowed=None, scale=1.0):
            return torch.ones(q.shape[0], q.shape[1], q.shape[2], k.shape[2])

    torch.manual_seed(0)
    both = Both(2)
    plain = KERPLEBias(2)
    plain.load_state_dict(both.state_dict())
    module = MultiHeadAttention(16, 2, position=both).eval()
    reference = MultiHeadAttention(16, 2, position=plain).eval()
    reference.load_state_dict(module.state_dict())
    x = torch.randn(1, 5, 16)
    assert_close(module(x), reference(x), rtol=0, atol=1e-6)  # +1 on every visible score


def test_the_learned_schemes_build_on_the_meta_device():
    with torch.device("meta"):
        modules = [KERPLEBias(2), KERPLEBias(2, kernel="power"), FIREBias(2),
                   ContextualPositionEncoding(8, max_positions=16), LearnedRotaryEmbedding(8)]  # fmt: skip
    assert all(p.is_meta for module in modules for p in module.parameters())


def test_sandwich_grows_as_far_as_the_memory_limit_lets_it(monkeypatch):
    """A refused doubling is retried at the length the call needs; when that is refused
    too, the call's own distances come from the core and the table stays (as every
    posenc table, posenc.core.positions.grow)."""
    module = SandwichBias(2, dim=4, max_length=64)
    original = posenc.SandwichSpec.distance_bias
    limit = {"values": 100}

    def limited(self, distances, *, max_bytes=None):
        if np.size(distances) > limit["values"]:
            raise MemoryLimitError("too large", what="a table", nbytes=1, max_bytes=0)
        return original(self, distances)

    monkeypatch.setattr(posenc.SandwichSpec, "distance_bias", limited)
    got = module(1, 100, offset=99)  # distances up to 99: 128 refused, 100 allowed
    assert module.table.shape == (100, 2)
    assert np.array_equal(got.numpy(), posenc.sandwich_bias(1, 100, num_heads=2, dim=4, offset=99))
    limit["values"] = 10  # no table longer than 10 rows now: a call's own 4 distances
    positions, keys = torch.tensor([500, 501]), torch.tensor([0, 500, 501])
    got = module(2, 3, positions=positions, key_positions=keys)  # distances up to 501
    assert module.table.shape == (100, 2)
    distances = np.array([[500, 0, 0], [501, 1, 0]])  # query - key, 0 for future keys
    values = original(module.spec, distances.ravel()).reshape(2, 2, 3)
    assert np.array_equal(got.numpy(), values.astype(np.float32))


def test_sandwich_sums_as_accurately_at_any_width():
    """The blocks of frequencies change nothing but the memory: one block or many, within
    a few ulp of math.fsum of the same terms."""
    distances = np.array([1, 17, 999, 123_456])
    for dim in (64, 4096):
        ours = posenc.core.sandwich.sandwich_distance_bias(distances, num_heads=1, dim=dim)[0]
        omega = np.power(10000.0, -2.0 * np.arange(1, dim // 2 + 1, dtype=np.float64) / dim)
        terms = [np.square(np.sin(0.5 * float(d) * omega)) for d in distances]  # the same
        exact = [-2.0 * math.fsum(t) / 8.0 for t in terms]
        assert_close(torch.from_numpy(ours), torch.tensor(exact, dtype=torch.float64),
                     rtol=4e-16 * math.log2(dim), atol=0)  # fmt: skip


@pytest.mark.parametrize("name", ["init_c", "init_L"])
def test_fire_refuses_initial_values_its_float32_parameters_cannot_hold(name):
    # 1e308 would become inf as a float32 parameter, and every bias NaN.
    with pytest.raises(ValueError, match=rf"{name} must be at most 3\.40282e\+38.*got 1e\+308"):
        FIREBias(2, **{name: 1e308})
    largest = float(torch.finfo(torch.float32).max)
    module = FIREBias(2, **{name: largest})
    assert torch.isfinite(module.c if name == "init_c" else module.init_L).all()
