"""PyTorch RoPE: equal to Hugging Face and Meta, exact in any precision, exportable."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.testing import assert_close  # noqa: E402

from posenc.core.precision import round_to_format  # noqa: E402
from posenc.core.rope import apply_rope, rope_scaling, rope_tables  # noqa: E402
from posenc.torch.rope import RotaryEmbedding, convert_rope_weights  # noqa: E402

F32_EPS = 2.0**-24  # unit roundoff of float32


def _randn(*shape, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


def _core_rotation(x, positions, module):
    """The NumPy core's rotation of ``x`` (bhsd, float64) at ``positions`` (seq,)/(B, seq)."""
    cos, sin = rope_tables(
        np.asarray(positions),
        module.inv_freq,
        dtype="float64",
        layout=module.spec.layout,
        scale=module.attention_factor,
    )
    if cos.ndim == 3:  # (batch, seq, r) -> (batch, 1, seq, r)
        cos, sin = cos[:, None], sin[:, None]
    return torch.from_numpy(
        apply_rope(
            x.double().numpy(),
            cos,
            sin,
            layout=module.spec.layout,
            rotary_dim=module.spec.rotary_dim,
        )
    )


# ---------------------------------------------------------------------------------------
# Hugging Face LlamaRotaryEmbedding + apply_rotary_pos_emb


def _llama_config(head_dim, base, rope_parameters, max_position_embeddings):
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters, rope_theta=base),
    )


def _hf_rotate(hf_rope, q, k, position_ids):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cos, sin = hf_rope(q, position_ids)
    return apply_rotary_pos_emb(q, k, cos, sin)


def _hf_tolerance(position_ids, x, base, amplification, attention):
    """Bound on |HF - exact| per position: HF's float32 θ and float32 angle ``p·θ``.

    HF's float32 inverse frequencies are off by <= (4 + ln base) units of 2^-24
    relatively (times ``amplification`` for blended methods: YaRN's ramp and Llama 3's
    smoothing amplify it by up to the factor; dynamic NTK adds a float32 base), the
    angle ``p·θ`` (θ <= 1) is rounded once more, cos/sin and the attention factor round
    a few times. A pair (x, y) rotates into x·cos ± y·sin, hence 2·max|x|.
    """
    rtol = ((4 + math.log(base)) * amplification + 1) * F32_EPS
    per_position = position_ids.double() * rtol + 8 * F32_EPS  # (batch, seq)
    return 2 * attention * x.abs().max().double() * per_position[:, None, :, None]


HF_CASES = {
    "default": (64, 10000.0, {"rope_type": "default"}, 4096, 1.0),
    "linear": (64, 10000.0, {"rope_type": "linear", "factor": 4.0}, 4096, 1.0),
    "yarn": (64, 10000.0, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512}, 4096, 8.0),
    "llama3": (128, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}, 8192, 8.0),
}  # fmt: skip
OUR_SCALING = {"default": None, "linear": "linear", "yarn": "yarn", "llama3": "llama3"}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_matches_hugging_face_to_its_float32_angle_error(case):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    head_dim, base, parameters, max_positions, amplification = HF_CASES[case]
    hf_rope = LlamaRotaryEmbedding(_llama_config(head_dim, base, parameters, max_positions))
    params = {key: value for key, value in parameters.items() if key != "rope_type"}
    ours = RotaryEmbedding(
        head_dim, base=base, scaling=OUR_SCALING[case], scaling_params=params or None
    )
    assert ours.attention_factor == pytest.approx(hf_rope.attention_scaling, rel=1e-12)
    q, k = _randn(2, 4, 300, head_dim, seed=1), _randn(2, 2, 300, head_dim, seed=2)
    position_ids = torch.stack([torch.arange(300), 7 * torch.arange(300) + 5])  # up to 2098
    q_hf, k_hf = _hf_rotate(hf_rope, q, k, position_ids)
    q_rot, k_rot = ours(q, k, positions=position_ids)
    for hf, mine, x in ((q_hf, q_rot, q), (k_hf, k_rot, k)):
        tolerance = _hf_tolerance(position_ids, x, base, amplification, ours.attention_factor)
        assert torch.all((hf.double() - mine.double()).abs() <= tolerance)
    # In float64 the module is the NumPy core's rotation, to float64 arithmetic.
    ours.double()
    for x in (q, k):
        exact = _core_rotation(x.double(), position_ids, ours)
        rotated = ours(x.double(), x.double(), positions=position_ids)[0]
        assert_close(rotated, exact, rtol=0, atol=1e-12)


def test_at_position_2_20_hugging_face_drifts_and_we_do_not():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf_rope = LlamaRotaryEmbedding(_llama_config(8, 10000.0, {"rope_type": "default"}, 4096))
    ours = RotaryEmbedding(8, max_length=16)
    q, k = _randn(1, 1, 2, 8, seed=1), _randn(1, 1, 2, 8, seed=2)
    position_ids = torch.tensor([[2**20 - 3, 2**20]])
    exact = _core_rotation(q, position_ids[0].numpy(), ours)
    q_hf, _ = _hf_rotate(hf_rope, q, k, position_ids)
    q_rot, _ = ours(q, k, positions=position_ids)
    # HF's float32 θ and float32 p·θ: off by ~p·2^-24 rad; ours: float32 rounding only.
    assert (q_hf.double() - exact).abs().max() > 1e-4
    assert (q_rot.double() - exact).abs().max() < 1e-6


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_length_dependent_scalings_follow_hugging_face_call_by_call(rope_type):
    """HF's dynamic_rope_update on each call's own length L = max(position) + 1: every
    call equals a fresh Hugging Face module's (posenc keeps no state between calls; HF
    keeps the longest L until a call falls back under L0, which differs only for a call
    shorter than an earlier one but still past L0: (0, 40) after (0, 50) here)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    head_dim, base, original = 32, 10000.0, 32
    if rope_type == "dynamic":
        parameters = {"rope_type": "dynamic", "factor": 2.0}
        max_positions = original  # HF's L0 for dynamic is max_position_embeddings
        scaling, params = "dynamic_ntk", {"factor": 2.0}
    else:
        rng = np.random.default_rng(3)
        short, long = (1 + rng.random(16)).tolist(), (1 + 10 * rng.random(16)).tolist()
        params = {"short_factor": short, "long_factor": long, "factor": 4.0}
        parameters = {"rope_type": "longrope", **params}
        max_positions = 4 * original
        scaling = "longrope"
        parameters["original_max_position_embeddings"] = original
    params["original_max_position_embeddings"] = original
    config = _llama_config(head_dim, base, parameters, max_positions)
    ours = RotaryEmbedding(
        head_dim, base=base, scaling=scaling, scaling_params=params, max_length=16
    )
    # (offset, seq): past L0, longer, shorter but past L0, longer, decode, under L0.
    for offset, seq in [(0, 20), (0, 50), (0, 40), (0, 70), (70, 1), (71, 1), (30, 5), (0, 10)]:
        q, k = _randn(1, 2, seq, head_dim, seed=seq), _randn(1, 1, seq, head_dim, seed=offset)
        position_ids = torch.arange(offset, offset + seq)[None]
        q_hf, k_hf = _hf_rotate(LlamaRotaryEmbedding(config), q, k, position_ids)
        q_rot, k_rot = ours(q, k, offset=offset)
        for hf, mine, x in ((q_hf, q_rot, q), (k_hf, k_rot, k)):
            tolerance = _hf_tolerance(position_ids, x, base, 2.0, ours.attention_factor)
            assert torch.all((hf.double() - mine.double()).abs() <= tolerance)
    assert np.array_equal(ours.inv_freq, ours.spec.frequencies()[0])  # no state kept
    if rope_type == "dynamic":
        # explicit positions take the length from max(positions) + 1 = 100
        positions = torch.tensor([3, 4, 99, 6, 7])
        inv_freq, _ = rope_scaling(
            "dynamic_ntk",
            head_dim,
            base,
            factor=2.0,
            original_max_position_embeddings=original,
            seq_len=100,
        )
        cos, sin = rope_tables(positions.numpy(), inv_freq, dtype="float32")
        got = ours.cos_sin(positions)
        assert np.array_equal(got[0].numpy(), cos)
        assert np.array_equal(got[1].numpy(), sin)


# ---------------------------------------------------------------------------------------
# Layouts, GQA, partial rotary, positions


def _meta_apply_rotary_emb(xq, xk, inv_freq, positions):
    """Meta Llama's ``precompute_freqs_cis`` + ``apply_rotary_emb`` (bshd), in float64."""
    freqs = torch.outer(positions.double(), torch.from_numpy(inv_freq))  # (seq, d/2)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
    shape = (1, freqs_cis.shape[0], 1, freqs_cis.shape[1])
    out = []
    for x in (xq, xk):
        x_ = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        out.append(torch.view_as_real(x_ * freqs_cis.view(shape)).flatten(3))
    return out


def test_interleaved_layout_equals_meta_complex_multiplication():
    module = RotaryEmbedding(64, base=500000.0, layout="interleaved", qk_layout="bshd").double()
    q = _randn(2, 100, 4, 64, dtype=torch.float64, seed=1)
    k = _randn(2, 100, 2, 64, dtype=torch.float64, seed=2)
    expected = _meta_apply_rotary_emb(q, k, module.inv_freq, torch.arange(100))
    for mine, theirs in zip(module(q, k), expected, strict=True):
        assert_close(mine, theirs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_bshd_equals_bhsd_after_transposes(layout):
    bhsd = RotaryEmbedding(32, layout=layout, max_length=64)
    bshd = RotaryEmbedding(32, layout=layout, max_length=64, qk_layout="bshd")
    q, k = _randn(2, 6, 20, 32, seed=1), _randn(2, 3, 20, 32, seed=2)
    positions = torch.stack([torch.arange(20), torch.arange(20).flip(0)])
    for kwargs in ({}, {"offset": 9}, {"positions": positions}, {"positions": positions[0]}):
        expected = bhsd(q, k, **kwargs)
        got = bshd(q.transpose(1, 2), k.transpose(1, 2), **kwargs)
        for mine, theirs in zip(got, expected, strict=True):
            assert torch.equal(mine.transpose(1, 2), theirs)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_gqa_and_partial_rotary_equal_the_core(layout):
    module = RotaryEmbedding(40, rotary_dim=16, layout=layout, base=100.0).double()
    q = _randn(2, 8, 12, 40, dtype=torch.float64, seed=1)
    k = _randn(2, 2, 12, 40, dtype=torch.float64, seed=2)
    q_rot, k_rot = module(q, k, offset=3)
    assert_close(q_rot, _core_rotation(q, np.arange(3, 15), module), rtol=0, atol=1e-13)
    assert_close(k_rot, _core_rotation(k, np.arange(3, 15), module), rtol=0, atol=1e-13)
    assert torch.equal(q_rot[..., 16:], q[..., 16:])  # features past rotary_dim pass through
    assert not torch.equal(q_rot[..., 1:, :16], q[..., 1:, :16])


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_decoding_one_token_at_a_time_equals_the_full_call(layout):
    module = RotaryEmbedding(32, layout=layout, max_length=8)  # grows on the way
    q, k = _randn(2, 4, 24, 32, seed=1), _randn(2, 2, 24, 32, seed=2)
    q_full, k_full = module(q, k)
    for t in range(24):
        q_t, k_t = module(q[:, :, t : t + 1], k[:, :, t : t + 1], offset=t)
        assert torch.equal(q_t, q_full[:, :, t : t + 1])
        assert torch.equal(k_t, k_full[:, :, t : t + 1])
    assert torch.equal(module(q, k, positions=torch.arange(24))[0], q_full)


def test_packed_positions_equal_separate_sequences():
    module = RotaryEmbedding(16, rotary_dim=8, max_length=32)
    lengths = [5, 9, 2]
    q, k = _randn(1, 2, 16, 16, seed=1), _randn(1, 1, 16, 16, seed=2)
    positions = torch.cat([torch.arange(n) for n in lengths])  # (16,)
    q_packed, k_packed = module(q, k, positions=positions[None])
    start = 0
    for n in lengths:
        q_one, k_one = module(q[:, :, start : start + n], k[:, :, start : start + n])
        assert torch.equal(q_packed[:, :, start : start + n], q_one)
        assert torch.equal(k_packed[:, :, start : start + n], k_one)
        start += n


def test_tables_grow_in_eager_mode_and_are_exact():
    module = RotaryEmbedding(16, max_length=4)
    q, k = _randn(1, 1, 3, 16), _randn(1, 1, 3, 16)
    module(q, k, positions=torch.tensor([0, 1, 10]))  # 11 rows - 3 read <= 2 · 4: grows
    assert module.cos.shape == (11, 16)
    cos, sin = rope_tables(11, module.inv_freq, dtype="float32")
    assert np.array_equal(module.cos.numpy(), cos)
    assert np.array_equal(module.sin.numpy(), sin)
    far = torch.tensor([0, 1, 1000])  # 1001 rows for 3 read: the core's rows, no growth
    module(q, k, positions=far)
    got = module.cos_sin(far)
    assert module.cos.shape == (11, 16)
    want = rope_tables(far.numpy(), module.inv_freq, dtype="float32")
    assert np.array_equal(got[0].numpy(), want[0])
    assert np.array_equal(got[1].numpy(), want[1])


# ---------------------------------------------------------------------------------------
# Precision: tables stay float32 (float64 after .double()); low precision rotates in f32


@pytest.mark.parametrize(
    ("convert", "dtype"),
    [
        (lambda m: m.half(), torch.float16),
        (lambda m: m.bfloat16(), torch.bfloat16),
        (lambda m: m.to(torch.float16), torch.float16),
        (lambda m: m.double().bfloat16(), torch.bfloat16),
    ],
)
def test_module_casts_keep_float32_tables_and_rotate_in_float32(convert, dtype):
    def make():
        yarn = {"factor": 4.0, "original_max_position_embeddings": 16}  # attention factor 1.14
        return RotaryEmbedding(
            32, layout="interleaved", max_length=64, scaling="yarn", scaling_params=yarn
        )

    reference, module = make(), convert(make())
    assert module.cos.dtype == module.sin.dtype == torch.float32
    assert torch.equal(module.cos, reference.cos)
    assert torch.equal(module.sin, reference.sin)
    q, k = _randn(2, 4, 64, 32, dtype=dtype, seed=1), _randn(2, 2, 64, 32, dtype=dtype, seed=2)
    q_rot, k_rot = module(q, k, offset=0)
    q_ref, k_ref = reference(q.float(), k.float())
    assert q_rot.dtype == k_rot.dtype == dtype
    assert torch.equal(q_rot, q_ref.to(dtype))
    assert torch.equal(k_rot, k_ref.to(dtype))


def test_double_gives_float64_tables_equal_to_the_core():
    module = RotaryEmbedding(32, max_length=50).double()
    cos, sin = rope_tables(50, module.inv_freq, dtype="float64")
    assert module.cos.dtype == torch.float64
    assert np.array_equal(module.cos.numpy(), cos)
    assert np.array_equal(module.sin.numpy(), sin)
    module.float()
    assert np.array_equal(module.cos.numpy(), rope_tables(50, module.inv_freq)[0])


def test_autocast_keeps_float32_tables_and_results():
    module = RotaryEmbedding(32, max_length=64)
    q, k = _randn(2, 4, 64, 32, seed=1), _randn(2, 2, 64, 32, seed=2)
    eager = module(q, k)
    low = module(q.bfloat16(), k.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = module(q, k)
        under_low = module(q.bfloat16(), k.bfloat16())
    assert module.cos.dtype == torch.float32
    for mine, theirs in zip((*under, *under_low), (*eager, *low), strict=True):
        assert mine.dtype == theirs.dtype
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_positions_up_to_2_20_are_right_to_the_last_bit(dtype):
    """Low-precision q/k at positions near 2**20: the correctly rounded exact rotation,
    or its neighbour where the exact value lies within float32 error of a tie."""
    module = RotaryEmbedding(8, max_length=16)
    positions = torch.tensor([0, 1, 3, 2**20 - 2, 2**20 - 1, 2**20, 777_777, 123_457])
    q, k = _randn(3, 2, 8, 8, dtype=dtype, seed=1), _randn(3, 1, 8, 8, dtype=dtype, seed=2)
    fmt, bits = {torch.float16: ("float16", 11), torch.bfloat16: ("bfloat16", 8)}[dtype]
    for x, x_rot in zip((q, k), module(q, k, positions=positions), strict=True):
        exact = _core_rotation(x, positions.numpy(), module).numpy()  # float64
        rounded = torch.from_numpy(round_to_format(exact, fmt)).double()  # correctly rounded
        ulp = np.spacing(np.abs(exact).astype(np.float32)) * 2.0 ** (24 - bits)
        float32_error = 8 * F32_EPS * x.abs().max().item()  # tables + 2 products + a sum
        difference = (x_rot.double() - rounded).abs().numpy()
        assert np.all(difference <= np.maximum(ulp, float32_error))
        assert np.mean(difference == 0) > 0.95


def test_meta_device_then_to_empty_rebuilds_the_tables():
    with torch.device("meta"):
        module = RotaryEmbedding(32, max_length=100)
    module = module.to_empty(device="cpu")
    assert np.array_equal(module.cos.numpy(), rope_tables(100, module.inv_freq)[0])


# ---------------------------------------------------------------------------------------
# Compile and export


def test_torch_compile_fullgraph_eager_backend():
    module = RotaryEmbedding(32, rotary_dim=24, layout="interleaved", max_length=64)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    q, k = _randn(2, 4, 16, 32, seed=1), _randn(2, 2, 16, 32, seed=2)
    positions = torch.tensor([[0, 1, 2, 3] * 4, list(range(16))])
    for kwargs in ({}, {"offset": 7}, {"positions": positions}):
        for mine, theirs in zip(compiled(q, k, **kwargs), module(q, k, **kwargs), strict=True):
            assert torch.equal(mine, theirs)
    low = compiled(q.half(), k.half())
    assert torch.equal(low[0], module(q.half(), k.half())[0])


def test_torch_compile_batched_positions_once_the_batch_is_symbolic():
    # a second batch size makes Dynamo compile the batch as a symbolic size; positions of
    # batch 2 then met `2 in (1, s0)`, which Dynamo answers False: a refusal of good input
    torch._dynamo.reset()
    module = RotaryEmbedding(64, max_length=64)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    for batch in (3, 2):
        q, k = _randn(batch, 8, 16, 64, seed=batch), _randn(batch, 2, 16, 64, seed=9)
        assert torch.equal(compiled(q, k)[0], module(q, k)[0])
    positions = torch.stack([torch.arange(16), torch.arange(16) * 3])
    for row in (positions, positions[:1]):
        for mine, theirs in zip(
            compiled(q, k, positions=row), module(q, k, positions=row), strict=True
        ):
            assert torch.equal(mine, theirs)


def test_torch_compile_inductor():
    module = RotaryEmbedding(32, max_length=64, qk_layout="bshd")
    compiled = torch.compile(module, fullgraph=True)
    q, k = _randn(2, 16, 4, 32, seed=1), _randn(2, 16, 2, 32, seed=2)
    for mine, theirs in zip(compiled(q, k), module(q, k), strict=True):
        assert_close(mine, theirs, rtol=0, atol=1e-6)  # inductor may fuse into FMAs


def test_under_compile_tables_do_not_grow_and_dynamic_ntk_follows_each_length():
    torch._dynamo.reset()  # each module and call recompiles forward: keep under the limit
    q, k = _randn(1, 2, 20, 16), _randn(1, 1, 20, 16)
    module = RotaryEmbedding(16, max_length=8)
    with pytest.raises(Exception, match=r"call \.extend\(20\) before compiling"):
        torch.compile(module, fullgraph=True, backend="eager")(q, k)
    module.extend(20)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, k)[0], module(q, k)[0])
    params = {"factor": 2.0, "original_max_position_embeddings": 8}
    dynamic = RotaryEmbedding(16, scaling="dynamic_ntk", scaling_params=params, max_length=32)
    compiled = torch.compile(dynamic, fullgraph=True, backend="eager")
    few = q[:, :, :6], k[:, :, :6]  # L = 6 <= 8: the construction frequencies compile
    assert torch.equal(compiled(*few)[0], dynamic(*few)[0])
    with pytest.raises(Exception, match=r"call \.extend\(n\) for the longest length"):
        compiled(q, k)  # past 8: the frequencies of length 20, which extend() keeps
    dynamic.extend(32)
    # L = 20 > 8: the frequencies of length 20, kept per length, the core's bits
    assert torch.equal(compiled(q, k)[0], dynamic(q, k)[0])
    at = torch.arange(20)
    assert torch.equal(compiled(q, k, positions=at)[1], dynamic(q, k, positions=at)[1])
    past = torch.arange(20) + 20  # L = 40 past the 32 rows: NaN rows, as any traced read
    assert torch.isnan(compiled(q, k, positions=past)[0]).all()


def test_under_compile_longrope_selects_its_factors_by_a_traced_length():
    """The planner's rule for a traced length: LongRoPE's two tables, chosen in the graph
    by max(positions) + 1 > L0, the same rows as the eager call on each side."""
    rng = np.random.default_rng(5)
    params = {
        "short_factor": (1 + rng.random(8)).tolist(),
        "long_factor": (1 + 10 * rng.random(8)).tolist(),
        "original_max_position_embeddings": 8,
        "factor": 4.0,
    }
    module = RotaryEmbedding(16, scaling="longrope", scaling_params=params, max_length=32)
    assert module.cos_long.shape == module.cos.shape == (32, 16)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    q, k = _randn(1, 2, 6, 16), _randn(1, 1, 6, 16)
    for positions in (torch.arange(6), torch.arange(6) + 5, torch.tensor([0, 1, 2, 3, 4, 20])):
        for mine, theirs in zip(
            compiled(q, k, positions=positions), module(q, k, positions=positions), strict=True
        ):
            assert torch.equal(mine, theirs)
    long = module.spec.tables(np.arange(6) + 5, seq_len=11)  # L = 11 > 8: the long factors
    assert np.array_equal(module.cos_sin(torch.arange(6) + 5)[0].numpy(), long[0])


def test_torch_export_with_a_dynamic_sequence_length():
    module = RotaryEmbedding(16, rotary_dim=8, max_length=64).eval()
    q, k = _randn(2, 4, 10, 16, seed=1), _randn(2, 2, 10, 16, seed=2)
    seq = torch.export.Dim("seq", max=64)
    program = torch.export.export(module, (q, k), dynamic_shapes=({2: seq}, {2: seq}))
    q2, k2 = _randn(2, 4, 37, 16, seed=3), _randn(2, 2, 37, 16, seed=4)
    for mine, theirs in zip(program.module()(q2, k2), module(q2, k2), strict=True):
        assert torch.equal(mine, theirs)
    positions = torch.arange(10).flip(0)
    program = torch.export.export(
        module,
        (q, k),
        {"positions": positions},
        dynamic_shapes={"q": {2: seq}, "k": {2: seq}, "positions": {0: seq}},
    )
    positions2 = torch.arange(37) * 3 % 50
    expected = module(q2, k2, positions=positions2)
    for mine, theirs in zip(program.module()(q2, k2, positions=positions2), expected, strict=True):
        assert torch.equal(mine, theirs)


@pytest.mark.filterwarnings("ignore:# The axis name.*shares the same shape constraints")
def test_onnx_export_runs_in_onnxruntime(tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    module = RotaryEmbedding(16, layout="interleaved", max_length=64).eval()
    q, k = _randn(2, 4, 10, 16, seed=1), _randn(2, 2, 10, 16, seed=2)
    seq = torch.export.Dim("seq", max=64)
    program = torch.onnx.export(
        module, (q, k), dynamo=True, dynamic_shapes=({2: seq}, {2: seq}), verbose=False
    )
    path = tmp_path / "rope.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    q2, k2 = _randn(2, 4, 25, 16, seed=3), _randn(2, 2, 25, 16, seed=4)
    names = [i.name for i in session.get_inputs()]
    outputs = session.run(None, dict(zip(names, (q2.numpy(), k2.numpy()), strict=True)))
    for mine, theirs in zip(outputs, module(q2, k2), strict=True):
        np.testing.assert_allclose(mine, theirs.numpy(), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------
# State dicts


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(16, 16)
        self.rotary_emb = RotaryEmbedding(8, max_length=8)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_Attention(), _Attention()])
        self.rope = RotaryEmbedding(8, max_length=8)


def test_nothing_derived_in_state_dict():
    assert RotaryEmbedding(8).state_dict() == {}
    assert set(_Model().state_dict()) == {
        f"layers.{i}.q_proj.{p}" for i in (0, 1) for p in ("weight", "bias")
    }


def test_state_dicts_with_derived_rope_keys_from_other_libraries_load_strictly():
    model = _Model()
    state = _Model().state_dict()
    derived = {
        "layers.0.rotary_emb.inv_freq": torch.ones(4),  # Hugging Face (persistent, older)
        "layers.0.rotary_emb.original_inv_freq": torch.ones(4),
        "layers.1.rotary_emb.cos_cached": torch.ones(1, 1, 8, 8),  # GPT-NeoX style caches
        "layers.1.rotary_emb.sin_cached": torch.ones(1, 1, 8, 8),
        "layers.1.rotary_emb._float_tensor": torch.ones(1),  # fairseq
        "layers.1.rotary_emb.cos": torch.ones(8, 8),
        "layers.1.rotary_emb.sin": torch.ones(8, 8),
        "rope.freqs": torch.ones(4),  # Meta Llama checkpoints
    }
    with pytest.warns(
        UserWarning, match="the module keeps its own"
    ):  # the ones are not the module's values: named, then dropped
        model.load_state_dict({**state, **derived}, strict=True)
    assert torch.equal(model.layers[0].q_proj.weight, state["layers.0.q_proj.weight"])
    assert np.array_equal(model.rope.cos.numpy(), rope_tables(8, model.rope.inv_freq)[0])
    single = RotaryEmbedding(8)
    with pytest.warns(UserWarning, match="the module keeps its own"):
        single.load_state_dict({"inv_freq": torch.ones(4), "freqs": torch.ones(4)}, strict=True)
    with pytest.raises(RuntimeError, match="bogus"):  # only derived keys are dropped
        model.load_state_dict({**state, "rope.bogus": torch.ones(1)}, strict=True)


# ---------------------------------------------------------------------------------------
# convert_rope_weights


def _hf_llama_permute(w, n_heads, dim1, dim2):
    """``permute`` of transformers' ``convert_llama_weights_to_hf.py`` (Meta → HF)."""
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_converted_weights_give_the_same_attention_scores(dtype, atol, rotary_dim):
    d_model, heads, kv_heads, head_dim, seq = 48, 4, 2, 12, 30
    wq = _randn(heads * head_dim, d_model, dtype=dtype, seed=1) / math.sqrt(d_model)
    wk = _randn(kv_heads * head_dim, d_model, dtype=dtype, seed=2) / math.sqrt(d_model)
    bq = _randn(heads * head_dim, dtype=dtype, seed=3)
    x = _randn(2, seq, d_model, dtype=dtype, seed=4)

    def scores(wq, wk, bq, layout):
        rope = RotaryEmbedding(head_dim, rotary_dim=rotary_dim, layout=layout, qk_layout="bshd")
        rope = rope.to(dtype)
        q = (x @ wq.T + bq).view(2, seq, heads, head_dim)
        k = (x @ wk.T).view(2, seq, kv_heads, head_dim)
        q, k = rope(q, k)
        q, k = q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(heads // kv_heads, dim=1)
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_dim), dim=-1)

    def convert(w, n, source="interleaved", target="half"):
        return convert_rope_weights(
            w, num_heads=n, head_dim=head_dim, source=source, target=target, rotary_dim=rotary_dim
        )

    expected = scores(wq, wk, bq, "interleaved")
    got = scores(convert(wq, heads), convert(wk, kv_heads), convert(bq, heads), "half")
    assert_close(got, expected, rtol=0, atol=atol)
    assert torch.equal(convert(convert(wq, heads), heads, "half", "interleaved"), wq)


def test_interleaved_to_half_equals_hugging_face_llama_permute():
    heads, head_dim, d_model = 4, 16, 64
    w = _randn(heads * head_dim, d_model)
    converted = convert_rope_weights(
        w, num_heads=heads, head_dim=head_dim, source="interleaved", target="half"
    )
    assert torch.equal(converted, _hf_llama_permute(w, heads, heads * head_dim, d_model))
    same = convert_rope_weights(w, num_heads=heads, head_dim=head_dim, source="half", target="half")
    assert torch.equal(same, w)


# ---------------------------------------------------------------------------------------
# Bad input


def _rope(**kwargs):
    return RotaryEmbedding(16, **{"max_length": 8, **kwargs})


Q, K = _randn(2, 4, 5, 16), _randn(2, 2, 5, 16)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: _rope()(Q[0], K[0]), ValueError, r"q must have shape \(batch, heads, seq, head_dim\) \(qk_layout='bhsd'\), got shape \(4, 5, 16\)"),
        (lambda: _rope(qk_layout="bshd")(Q[None], K), ValueError, r"q must have shape \(batch, seq, heads, head_dim\)"),
        (lambda: _rope()(Q, K[..., :8]), ValueError, "built for head_dim=16, but k has last dimension 8"),
        (lambda: _rope()(Q, K[:, :, :4]), ValueError, "q and k must have the same batch and seq sizes"),
        (lambda: _rope()(Q, K[:1]), ValueError, "q and k must have the same batch and seq sizes"),
        (lambda: _rope()(Q.long(), K), TypeError, "q must be a floating-point tensor, got dtype torch.int64"),
        (lambda: _rope()(Q, K.int()), TypeError, "k must be a floating-point tensor"),
        (lambda: _rope()(Q.numpy(), K), TypeError, "q must be a torch.Tensor, got a ndarray"),
        (lambda: _rope()(Q, K, offset=-1), ValueError, "offset must be an int >= 0, got -1"),
        (lambda: _rope()(Q, K, offset=1.0), TypeError, "offset must be an int >= 0"),
        (lambda: _rope()(Q, K, positions=torch.arange(5.0)), TypeError, "positions must be an integer tensor, got dtype torch.float32"),
        (lambda: _rope()(Q, K, positions=torch.arange(4)), ValueError, r"positions must have shape \(seq,\) or \(batch, seq\) with seq=5"),
        (lambda: _rope()(Q, K, positions=torch.arange(5).repeat(3, 1)), ValueError, "positions has batch size 3 but q and k have 2"),
        (lambda: _rope()(Q, K, positions=torch.arange(5) - 1), ValueError, "positions must be >= 0, got -1"),
        (lambda: _rope()(Q, K, positions=[0, 1, 2, 3, 4]), TypeError, "positions must be an integer tensor"),
    ],
)  # fmt: skip
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# A (batch, seq, heads, head_dim) tensor given to a "bhsd" module is read with its seq
# axis as heads: where the shapes then disagree, the error says how the layout read them
# and, when the other layout fits, to pass it. One check (posenc.torch._arguments.check_qk)
# for every module that rotates queries and keys.

BSHD_Q, BSHD_K = _randn(2, 10, 8, 16), _randn(2, 10, 2, 16)  # 10 positions, 8 and 2 heads
BHSD_READ = (
    "qk_layout='bhsd' reads q (2, 10, 8, 16) as (batch=2, heads=10, seq=8, head_dim=16) and k "
    "(2, 10, 2, 16) as (batch=2, heads=10, seq=2, head_dim=16)"
)
FITS_BSHD = (
    "; with qk_layout='bshd' (batch, seq, heads, head_dim) they fit: pass qk_layout='bshd' if "
    "that is their layout"
)


def _layout_error(call) -> str:
    """The message of the ValueError that ``call()`` raises, which names the layout."""
    with pytest.raises(ValueError, match="qk_layout=") as caught:
        call()
    return str(caught.value)


def _rotating_modules():
    from posenc.torch import AxialRotaryEmbedding, LearnedRotaryEmbedding, XPosRotaryEmbedding

    return {
        "RotaryEmbedding": lambda layout: RotaryEmbedding(16, max_length=16, qk_layout=layout),
        "XPosRotaryEmbedding": lambda layout: XPosRotaryEmbedding(16, qk_layout=layout),
        "LearnedRotaryEmbedding": lambda layout: LearnedRotaryEmbedding(16, qk_layout=layout),
        "AxialRotaryEmbedding": lambda layout: AxialRotaryEmbedding(16, n_axes=1, qk_layout=layout),
    }


@pytest.mark.parametrize("name", list(_rotating_modules()))
def test_a_layout_mismatch_says_how_it_read_the_shapes_and_the_layout_that_fits(name):
    make = _rotating_modules()[name]
    message = _layout_error(lambda: make("bhsd")(BSHD_Q, BSHD_K))
    assert message == (
        f"{name}: q and k must have the same batch and seq sizes; {BHSD_READ}{FITS_BSHD}"
    )
    message = _layout_error(lambda: make("bhsd")(BSHD_Q, BSHD_K[..., :8]))
    assert message == (
        f"{name} was built for head_dim=16, but k has last dimension 8: qk_layout='bhsd' reads "
        "its shape (2, 10, 2, 8) as (batch=2, heads=10, seq=2, head_dim=8)"
    )
    # in the layout that fits, the call is the bhsd call on the transposed tensors
    at = {"coords": torch.arange(10)[:, None]} if name == "AxialRotaryEmbedding" else {}
    q_rot, k_rot = make("bshd")(BSHD_Q, BSHD_K, **at)
    expected = make("bhsd")(BSHD_Q.transpose(1, 2), BSHD_K.transpose(1, 2), **at)
    assert torch.equal(q_rot.transpose(1, 2), expected[0])
    assert torch.equal(k_rot.transpose(1, 2), expected[1])


@pytest.mark.parametrize(
    "name", ["RotaryEmbedding", "XPosRotaryEmbedding", "LearnedRotaryEmbedding"]
)
def test_positions_of_the_other_layout_s_length_say_so(name):
    rope = _rotating_modules()[name]("bhsd")
    q = BSHD_Q[:, :, :2]  # (2, 10, 2, 16): 10 positions, 2 heads; read as seq=2
    message = _layout_error(lambda: rope(q, q, positions=torch.arange(10)))
    assert message == (
        f"{name}: positions must have shape (seq,) or (batch, seq) with seq=2 (that of q and "
        "k), got shape (10,); qk_layout='bhsd' reads q (2, 10, 2, 16) as (batch=2, heads=10, "
        f"seq=2, head_dim=16){FITS_BSHD}"
    )
    message = _layout_error(
        lambda: rope(q, q, positions=torch.arange(7))
    )  # neither layout fits 7 positions: no advice
    assert message.endswith(
        "got shape (7,); qk_layout='bhsd' reads q (2, 10, 2, 16) as (batch=2, heads=10, "
        "seq=2, head_dim=16)"
    )


def test_axial_coordinates_of_the_other_layout_s_length_say_so():
    from posenc.torch import AxialRotaryEmbedding

    q = BSHD_Q[:, :, :2]
    message = _layout_error(
        lambda: AxialRotaryEmbedding(16, n_axes=1, qk_layout="bhsd")(
            q, q, coords=torch.arange(10)[:, None]
        )
    )
    assert message == (
        "AxialRotaryEmbedding: coords must cover seq=2 tokens (and batch 1 or 2), got leading "
        "shape (10,); qk_layout='bhsd' reads q (2, 10, 2, 16) as (batch=2, heads=10, seq=2, "
        f"head_dim=16){FITS_BSHD}"
    )


def test_shapes_neither_layout_fits_get_no_advice():
    q, k = _randn(2, 4, 5, 16), _randn(2, 3, 6, 16)
    message = _layout_error(lambda: _rope()(q, k))
    assert message == (
        "RotaryEmbedding: q and k must have the same batch and seq sizes; qk_layout='bhsd' reads "
        "q (2, 4, 5, 16) as (batch=2, heads=4, seq=5, head_dim=16) and k (2, 3, 6, 16) as "
        "(batch=2, heads=3, seq=6, head_dim=16)"
    )


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: _rope(qk_layout="bsdh"), ValueError, r"qk_layout must be one of \['bhsd', 'bshd'\], got 'bsdh'"),
        (lambda: _rope(layout="split"), ValueError, r"layout must be one of \['half', 'interleaved'\], got 'split'"),
        (lambda: _rope(rotary_dim=5), ValueError, "rotary width must be an even int >= 2: rotary_dim, got 5"),
        (lambda: RotaryEmbedding(7), ValueError, "even int >= 2: head_dim .*got 7"),
        (lambda: _rope(rotary_dim=18), ValueError, "rotary_dim must be at most head_dim=16"),
        (lambda: RotaryEmbedding("16"), TypeError, "head_dim must be an int >= 1"),
        (lambda: _rope(base=1.0), ValueError, "base must not be 1"),
        (lambda: _rope(max_length=0), ValueError, "max_length must be an int >= 1, got 0"),
        (lambda: _rope(scaling="nope"), ValueError, r"unknown RoPE scaling 'nope'; valid: \['default', 'linear', 'ntk', 'dynamic_ntk', 'yarn', 'llama3', 'longrope', 'proportional'\]"),
        (lambda: _rope(scaling=2), TypeError, r"scaling must be None or one of \['default', .*got 2 \(int\)"),
        (lambda: _rope(scaling="dynamic", scaling_params={"factor": 2.0}), ValueError, "'dynamic' is called 'dynamic_ntk' here"),
        (lambda: _rope(scaling="linear"), TypeError, r"RoPE scaling 'linear': missing \['factor'\]"),
        (lambda: _rope(scaling="linear", scaling_params={"factor": 2.0, "alpha": 1}), TypeError, r"unknown \['alpha'\]"),
        (lambda: _rope(scaling_params={"factor": 2.0}), ValueError, "given without a scaling method"),
        (lambda: _rope(scaling="linear", scaling_params=[2.0]), TypeError, "scaling_params must be a dict"),
        (lambda: _rope(scaling="dynamic_ntk", scaling_params={"factor": 2.0, "original_max_position_embeddings": 8, "seq_len": 9}), TypeError, "seq_len is not a parameter of the module"),
        (lambda: convert_rope_weights(torch.ones(10, 3), num_heads=2, head_dim=4, source="half", target="interleaved"), ValueError, r"weight must have shape \(num_heads \* head_dim, in_features\).*= \(8, \.\.\.\), got shape \(10, 3\)"),
        (lambda: convert_rope_weights(torch.ones(8, 3), num_heads=2, head_dim=4, source="meta", target="half"), ValueError, "source must be one of"),
        (lambda: convert_rope_weights(np.ones((8, 3)), num_heads=2, head_dim=4, source="half", target="half"), TypeError, "weight must be a torch.Tensor"),
    ],
)  # fmt: skip
def test_bad_construction(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_gradients_equal_those_of_the_written_out_rotation(layout):
    # The rotation works in place on its output; autograd must see x·cos + turn(x)·sin.
    module = RotaryEmbedding(16, rotary_dim=12, layout=layout, max_length=32)
    q = torch.randn(2, 3, 10, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 10, 16, dtype=torch.float64)
    weights = torch.randn(2, 3, 10, 16, dtype=torch.float64)
    (module.double()(q, k)[0] * weights).sum().backward()
    cos, sin = (t[:10] for t in (module.cos, module.sin))
    x = q.detach().clone().requires_grad_(True)
    xr = x[..., :12]
    if layout == "half":
        turned = torch.cat((-xr[..., 6:], xr[..., :6]), dim=-1)
    else:
        turned = torch.stack((-xr[..., 1::2], xr[..., 0::2]), dim=-1).flatten(-2)
    reference = torch.cat((xr * cos + turned * sin, x[..., 12:]), dim=-1)
    (reference * weights).sum().backward()
    assert_close(q.grad, x.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_cos_sin_gives_the_core_rows_rounded_once_in_any_dtype(dtype):
    rope = RotaryEmbedding(16, base=500000.0, scaling={"rope_type": "linear", "factor": 4.0})
    positions = torch.tensor([[0, 7, 100_000, 3], [5, 5, 2**20, 1]])
    cos, sin = rope.cos_sin(positions, dtype=dtype)
    fmt = str(dtype).removeprefix("torch.")
    expected = rope.spec.tables(positions.numpy(), fmt=fmt)
    assert cos.dtype == sin.dtype == dtype
    assert cos.shape == (2, 4, 16)
    for mine, theirs in zip((cos, sin), expected, strict=True):
        np.testing.assert_array_equal(mine.float().numpy(), theirs.astype(np.float32))
    near = torch.tensor([[3, 0, 4000]])  # within the tables: gathered from them
    for mine, theirs in zip(
        rope.cos_sin(near, dtype=dtype), rope.spec.tables(near.numpy(), fmt=fmt), strict=True
    ):
        assert mine.dtype == dtype
        np.testing.assert_array_equal(mine.float().numpy(), theirs.astype(np.float32))
    with pytest.raises(TypeError, match="dtype must be a floating torch dtype"):
        rope.cos_sin(positions, dtype=torch.int32)
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        rope.cos_sin(positions[None])


def test_cos_sin_follows_a_length_dependent_attention_factor():
    """PhiMoE's LongRoPE: short divisors and short_mscale up to L0, long ones past it."""
    scaling = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [4.0] * 4,
               "original_max_position_embeddings": 16, "short_mscale": 1.0,
               "long_mscale": 1.5}  # fmt: skip
    rope = RotaryEmbedding(8, base=100.0, scaling=scaling)
    cos, _ = rope.cos_sin(torch.tensor([[0, 15]]), dtype=torch.float64)
    assert cos[0, 0].tolist() == [1.0] * 8
    cos, _ = rope.cos_sin(torch.tensor([[0, 16]]), dtype=torch.float64)  # past L0
    assert cos[0, 0].tolist() == [1.5] * 8
    expected = rope.spec.tables(np.array([16]), fmt="float64", seq_len=17)[0][0]
    np.testing.assert_array_equal(cos[0, 1].numpy(), expected)


def test_the_module_keeps_its_spec_and_has_two_posenc_bases():
    # One place per option: the spec. The module's own options (max_length, qk_layout,
    # fused) stay; the spec's fields are read from it, head_dim (the QueryKeyRotation
    # role's attribute) as a read-only property.
    from posenc.torch._tables import PositionTables
    from posenc.torch.protocols import RotatesQueriesKeys

    assert RotaryEmbedding.__bases__ == (PositionTables, RotatesQueriesKeys)
    rope = RotaryEmbedding(
        64, base=5e5, rotary_dim=32, layout="interleaved", scaling="linear",
        scaling_params={"factor": 2.0}, max_length=16, qk_layout="bshd",
    )  # fmt: skip
    for copied in ("rotary_dim", "base", "layout", "scaling", "scaling_params"):
        assert not hasattr(rope, copied), copied
    assert (rope.head_dim, rope.max_length, rope.qk_layout) == (64, 16, "bshd")
    with pytest.raises(AttributeError):
        rope.head_dim = 32
    assert repr(rope) == (
        "RotaryEmbedding(head_dim=64, rotary_dim=32, base=500000, layout='interleaved', "
        "qk_layout='bshd', max_length=16, scaling='linear', scaling_params={'factor': 2.0})"
    )


def test_a_build_parses_the_scaling_options_once(monkeypatch):
    # by the module, which names itself (a seq_len parameter is refused); the spec takes
    # the parsed scaling as it is
    from posenc.core.rope import registry

    parsed = []
    parse = registry.as_rope_scaling
    monkeypatch.setattr(
        registry, "as_rope_scaling", lambda *args, **kw: parsed.append(args) or parse(*args, **kw)
    )
    rope = RotaryEmbedding(8, scaling="linear", scaling_params={"factor": 2.0}, max_length=4)
    assert parsed == [("linear", {"factor": 2.0})]
    assert rope.spec.scaling == registry.LinearScaling(factor=2.0)
