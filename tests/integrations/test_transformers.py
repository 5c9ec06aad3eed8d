"""posenc.integrations.transformers.patch on real model code: tiny random models of each
family, built from configs (nothing downloaded), compared with the same model in float64
with posenc's exact tables, and with the unpatched model.

Measured here (llama3 model, last 64 positions before L, max |logit error| against the
float64 exact model): Hugging Face's float32 tables 2.0e-6 at 4,096, 2.9e-5 at 65,536,
6.1e-5 at 131,072; patched 9.2e-7, 8.9e-7, 8.6e-7 (float32's floor).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from hf_models import SMALL

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from posenc.integrations.transformers import (  # noqa: E402
    ExactRotaryEmbedding,
    patch,
    rotary_modules,
    unpatch,
)

EXACT_TOLERANCE = 1e-5  # patched float32 logits against the float64 exact model
TOKENS = 64


def families() -> dict[str, tuple[type, object, tuple[int, ...]]]:
    """name -> (model class, config, the lengths L to test at: positions L-64 .. L-1)."""
    t = transformers
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}  # fmt: skip
    deepseek = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}  # fmt: skip
    phi3 = {"rope_type": "longrope", "short_factor": [1.0 + i / 32 for i in range(32)],
            "long_factor": [1.0 + i / 4 for i in range(32)]}  # fmt: skip
    return {
        "llama (llama3)": (
            t.LlamaForCausalLM,
            t.LlamaConfig(**SMALL, max_position_embeddings=131072, rope_parameters=llama3),
            (4096, 131072),
        ),
        "mistral": (
            t.MistralForCausalLM,
            t.MistralConfig(**SMALL, num_key_value_heads=2, rope_theta=1e6,
                            max_position_embeddings=131072, sliding_window=None),
            (131072,),
        ),
        "qwen2 (yarn)": (
            t.Qwen2ForCausalLM,
            t.Qwen2Config(**SMALL, num_key_value_heads=2, rope_theta=1e6,
                          max_position_embeddings=131072,
                          rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                        "original_max_position_embeddings": 32768}),
            (131072,),
        ),
        "phi-3 (longrope)": (
            t.Phi3ForCausalLM,
            t.Phi3Config(**SMALL, max_position_embeddings=131072,
                         original_max_position_embeddings=4096, rope_scaling=phi3),
            (4096, 131072),  # both sides of the switch at 4096
        ),
        "gpt-neox (partial rotary)": (
            t.GPTNeoXForCausalLM,
            t.GPTNeoXConfig(**SMALL, rotary_pct=0.25, max_position_embeddings=131072),
            (131072,),
        ),
        "gemma3 (per layer type)": (
            t.Gemma3ForCausalLM,
            t.Gemma3TextConfig(**SMALL, num_key_value_heads=1, head_dim=64,
                               max_position_embeddings=131072,
                               layer_types=["sliding_attention", "full_attention"]),
            (131072,),
        ),
        "llama 4 (complex freqs_cis, NoPE layers)": (
            t.Llama4ForCausalLM,
            t.Llama4TextConfig(**{**SMALL, "num_hidden_layers": 4}, num_key_value_heads=2,
                               head_dim=64, intermediate_size_mlp=256, num_local_experts=2,
                               num_experts_per_tok=1, max_position_embeddings=131072,
                               rope_parameters=llama3, no_rope_layers=[1, 0, 1, 0],
                               attn_temperature_tuning=True, floor_scale=8, attn_scale=0.1),
            (131072,),
        ),
        "deepseek-v3 (yarn, mscale, interleaved)": (
            t.DeepseekV3ForCausalLM,
            t.DeepseekV3Config(**SMALL, moe_intermediate_size=64, qk_rope_head_dim=16,
                               qk_nope_head_dim=32, v_head_dim=32, kv_lora_rank=32,
                               q_lora_rank=64, n_routed_experts=4, num_experts_per_tok=2,
                               n_group=2, topk_group=1, first_k_dense_replace=2,
                               max_position_embeddings=163840,
                               rope_scaling=deepseek),
            (131072,),
        ),
    }  # fmt: skip


FAMILIES = families()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def models(request):
    """(name, float32 model, float64 model with exact tables), seeded."""
    cls, config, _ = FAMILIES[request.param]
    torch.manual_seed(0)
    model = cls(copy.deepcopy(config)).eval()
    exact = patch(copy.deepcopy(model).double())
    return request.param, model, exact


def logits(model, ids, positions):
    with torch.no_grad():
        return model(ids, position_ids=positions).logits.double()


def test_patched_logits_are_within_float32_of_the_exact_model(models):
    name, model, exact = models
    ids = torch.randint(2, 128, (1, TOKENS), generator=torch.Generator().manual_seed(1))
    for length in FAMILIES[name][2]:
        positions = torch.arange(length - TOKENS, length)[None]
        reference = logits(exact, ids, positions)
        unpatched = logits(model, ids, positions)
        patch(model)
        try:
            patched = logits(model, ids, positions)
        finally:
            unpatch(model)
        error = float((patched - reference).abs().max())
        theirs = float((unpatched - reference).abs().max())
        assert error < EXACT_TOLERANCE, (name, length, error, theirs)
        # the patched model differs from the unpatched one by the latter's own error
        assert float((patched - unpatched).abs().max()) <= theirs + EXACT_TOLERANCE
    assert not any(isinstance(m, ExactRotaryEmbedding) for _, m in rotary_modules(model))


def test_generation_gives_the_same_tokens_patched_and_unpatched(models):
    name, model, _ = models
    prompt = torch.tensor([[5, 17, 33, 9, 70, 2, 41]])
    settings = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        before = model.generate(prompt, **settings)
        patch(model)
        try:
            after = model.generate(prompt, **settings)
        finally:
            unpatch(model)
    assert torch.equal(before, after), name


def test_patch_and_unpatch_keep_the_modules():
    cls, config, _ = FAMILIES["llama (llama3)"]
    model = cls(copy.deepcopy(config))
    original = model.model.rotary_emb
    assert patch(model) is model
    replacement = model.model.rotary_emb
    assert isinstance(replacement, ExactRotaryEmbedding)
    assert replacement.original is original
    assert patch(model).model.rotary_emb is replacement  # patching twice: a no-op
    assert unpatch(model).model.rotary_emb is original
    assert "ropes" not in model.state_dict()  # no derived key enters the checkpoint
    patch(model)
    assert set(model.state_dict()) == set(unpatch(model).state_dict())


def mrope_models() -> dict[str, tuple[type, object]]:
    """Multimodal text models (M-RoPE) of the installed transformers: name -> (class, config)."""
    t = transformers
    out = {
        "qwen2-vl (mrope)": (t.Qwen2VLTextModel, t.Qwen2VLTextConfig(
            **SMALL, num_key_value_heads=2, max_position_embeddings=131072,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                             "mrope_section": [8, 12, 12]})),
    }  # fmt: skip
    if hasattr(t, "Qwen3VLTextModel"):
        out["qwen3-vl (interleaved mrope)"] = (t.Qwen3VLTextModel, t.Qwen3VLTextConfig(
            **SMALL, num_key_value_heads=2, head_dim=64, max_position_embeddings=131072,
            rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                             "mrope_section": [12, 10, 10]}))  # fmt: skip
    return out


@pytest.mark.parametrize("name", sorted(mrope_models()))
def test_multimodal_models_with_image_positions_are_within_float32_of_exact(name):
    """M-RoPE with (3, batch, seq) position ids (text tokens after an image grid, far
    along): the patched float32 model is within 1e-5 of the float64 exact one."""
    cls, config = mrope_models()[name]
    torch.manual_seed(0)
    model = cls(copy.deepcopy(config)).eval()
    exact = patch(copy.deepcopy(model).double())
    embeds = torch.randn(1, TOKENS, 256, generator=torch.Generator().manual_seed(4))
    start = 131072 - TOKENS
    grid = torch.arange(TOKENS)
    positions = torch.stack([start + grid // 16, start + (grid // 4) % 4, start + grid % 4])
    positions = positions[:, None]  # (3, batch, seq): an image of 4 frames of 4 x 4 patches

    def hidden(m, x):
        with torch.no_grad():
            return m(inputs_embeds=x, position_ids=positions).last_hidden_state.double()

    reference = hidden(exact, embeds.double())
    unpatched = hidden(model, embeds)
    patch(model)
    try:
        patched = hidden(model, embeds)
    finally:
        unpatch(model)
    error = float((patched - reference).abs().max())
    theirs = float((unpatched - reference).abs().max())
    assert error < EXACT_TOLERANCE, (name, error, theirs)
    assert float((patched - unpatched).abs().max()) <= theirs + EXACT_TOLERANCE


@pytest.mark.parametrize("name", sorted(mrope_models()))
def test_multimodal_tables_equal_the_transformers_module_to_float32_angles(name):
    """The patched module's (cos, sin) against the original module's at small positions,
    where Hugging Face's float32 angles are within 1e-5 (positions < 128)."""
    cls, config = mrope_models()[name]
    model = cls(copy.deepcopy(config))
    original = model.rotary_emb
    grid = torch.arange(40)
    positions = torch.stack([50 + grid // 8, 50 + (grid // 4) % 2, 50 + grid % 4])[:, None]
    x = torch.zeros(1, dtype=torch.float32)
    theirs = original(x, positions)
    mine = ExactRotaryEmbedding(original)(x, positions)
    for a, b in zip(mine, theirs, strict=True):
        assert a.shape == b.shape
        assert float((a - b).abs().max()) < 1e-5


def test_the_decoding_fast_path_gives_the_full_paths_tables():
    """After a first call the module gathers rows from the tables it built (no checks
    in Python): the same tensors as the full path, positions within twice the tables
    grow them, farther ones are computed for the call alone (the planner's rule for any
    call), and bad positions still get posenc's errors; .double() starts again in
    float64."""
    cls, config, _ = FAMILIES["llama (llama3)"]
    original = cls(copy.deepcopy(config)).model.rotary_emb
    module = ExactRotaryEmbedding(original)
    rope = module.ropes["all"]
    x = torch.zeros(1, dtype=torch.float32)

    def full(positions, dtype=torch.float32):
        return rope.cos_sin(positions, dtype=dtype)

    for positions in ([[0, 1, 2]], [[4095]], [[7, 3], [9, 1]], [[8000, 8001]], [[5]]):
        positions = torch.tensor(positions)
        for mine, theirs in zip(module(x, positions), full(positions), strict=True):
            assert mine.dtype == torch.float32
            assert torch.equal(mine, theirs)
    assert rope.table_length == 8192  # doubled for 8000, 8001, then gathered from
    far = torch.tensor([[20000, 20001]])  # past twice the tables: computed, not grown
    for mine, theirs in zip(module(x, far), full(far), strict=True):
        assert torch.equal(mine, theirs)
    assert rope.table_length == 8192
    assert module(x, torch.tensor([3]))[0].shape == (1, 1, 64)  # (seq,): batch of one
    assert torch.equal(
        module(x, torch.tensor([[3]], dtype=torch.int32))[1], full(torch.tensor([[3]]))[1]
    )
    with pytest.raises(ValueError, match="positions must be >= 0, got -1"):
        module(x, torch.tensor([[-1]]))
    with pytest.raises(
        TypeError, match=r"position_ids must be an integer tensor, got .* dtype torch.float32"
    ):
        module(x, torch.tensor([[1.0]]))
    module.double()
    cos, _ = module(x.double(), torch.tensor([[70000]]))
    assert cos.dtype == torch.float64
    assert torch.equal(cos, full(torch.tensor([[70000]]), torch.float64)[0])
    cos16, _ = module(x.half(), torch.tensor([[2, 3]]))
    assert torch.equal(cos16, full(torch.tensor([[2, 3]]), torch.float16)[0])
    assert torch.equal(module(x.half(), torch.tensor([[2, 3]]))[0], cos16)


def vision_language_models() -> dict[str, tuple[type, object, dict, dict]]:
    """Whole multimodal models of the installed transformers (tiny vision towers): name ->
    (class, config, a prompt with a video or image, mrope_positions' options for it).
    Token ids: 100 image, 101 video, 102/103 vision start/end."""
    t = transformers
    ids = {"image_token_id": 100, "video_token_id": 101, "vision_start_token_id": 102,
           "vision_end_token_id": 103}  # fmt: skip
    patches = {"patch_size": 2, "temporal_patch_size": 2, "spatial_merge_size": 2}
    text = {**SMALL, "num_key_value_heads": 2, "max_position_embeddings": 131072}
    mrope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]}
    pixels = torch.randn(64, 3 * 2 * 2 * 2, generator=torch.Generator().manual_seed(2))
    image = {  # 4 x 4 patches: 4 tokens
        "input_ids": torch.tensor([[5, 17, 102] + [100] * 4 + [103, 33, 9]]),
        "pixel_values": pixels[:16], "image_grid_thw": torch.tensor([[1, 4, 4]]),
    }  # fmt: skip
    video = {  # 4 frames of 4 x 4 patches, 2/3 s per temporal step: 16 tokens
        "input_ids": torch.tensor([[5, 17, 102] + [101] * 16 + [103, 33, 9]]),
        "pixel_values_videos": pixels, "video_grid_thw": torch.tensor([[4, 4, 4]]),
        "second_per_grid_ts": torch.tensor([2 / 3]),
    }  # fmt: skip
    frames = {  # 2 frames, a timestamp before each (Qwen3-VL)
        "input_ids": torch.tensor([[5, 7, 102] + [101] * 4 + [103, 8, 102] + [101] * 4 + [103, 9]]),
        "pixel_values_videos": pixels[:32], "video_grid_thw": torch.tensor([[2, 4, 4]]),
    }  # fmt: skip
    out = {
        "qwen2-vl (image)": (t.Qwen2VLForConditionalGeneration, t.Qwen2VLConfig(
            text_config={**text, "rope_parameters": mrope}, **ids, vision_config={
                **patches, "depth": 1, "embed_dim": 32, "hidden_size": 256, "num_heads": 2}),
            image, {"image_grids": [[1, 4, 4]]}),
        "qwen2.5-vl (video, time steps)": (t.Qwen2_5_VLForConditionalGeneration,
            t.Qwen2_5_VLConfig(text_config={**text, "rope_parameters": mrope}, **ids,
                vision_config={**patches, "depth": 1, "hidden_size": 32, "out_hidden_size": 256,
                               "intermediate_size": 64, "num_heads": 2, "window_size": 8,
                               "fullatt_block_indexes": [0], "tokens_per_second": 25}),
            video, {"video_grids": [[4, 4, 4]], "tokens_per_second": 25,
                    "second_per_grid_ts": np.array([2 / 3], np.float32)}),
    }  # fmt: skip
    if hasattr(t, "Qwen3VLForConditionalGeneration"):
        out["qwen3-vl (video frames, interleaved)"] = (t.Qwen3VLForConditionalGeneration,
            t.Qwen3VLConfig(text_config={**text, "head_dim": 64, "rope_parameters": {
                    **mrope, "mrope_section": [12, 10, 10], "mrope_interleaved": True}}, **ids,
                vision_config={**patches, "depth": 2, "hidden_size": 32, "out_hidden_size": 256,
                               "intermediate_size": 64, "num_heads": 2,
                               "num_position_embeddings": 16, "deepstack_visual_indexes": [1]}),
            frames, {"video_grids": [[2, 4, 4]], "split_video_frames": True})  # fmt: skip
    return out


@pytest.mark.parametrize("name", sorted(vision_language_models()))
def test_vision_language_generation_gives_the_same_tokens_patched_and_unpatched(name):
    """A whole multimodal model, vision tower included: patch replaces the language
    model's M-RoPE module only; greedy generation from a prompt with an image or a video
    gives the same tokens; the model's own position ids are mrope_positions'."""
    from posenc.core.packing import mrope_positions

    cls, config, inputs, options = vision_language_models()[name]
    torch.manual_seed(0)
    model = cls(copy.deepcopy(config)).eval()
    kinds = {100: 1, 101: 2}  # image and video tokens; text 0
    types = torch.tensor([[kinds.get(int(i), 0) for i in inputs["input_ids"][0]]])
    settings = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        before = model.generate(**inputs, mm_token_type_ids=types, **settings)
        patch(model)
        try:
            exact = [n for n, m in model.named_modules() if isinstance(m, ExactRotaryEmbedding)]
            assert exact == ["model.language_model.rotary_emb"]  # the vision tower's stays
            after = model.generate(**inputs, mm_token_type_ids=types, **settings)
        finally:
            unpatch(model)
    assert torch.equal(before, after), name
    grids = {k: inputs[k] for k in ("image_grid_thw", "video_grid_thw") if k in inputs}
    extra = {k: inputs[k] for k in ("second_per_grid_ts",) if k in inputs}
    theirs = model.model.get_rope_index(inputs["input_ids"], types, **grids, **extra)
    mine = mrope_positions(types.numpy(), spatial_merge_size=2, **options)
    for a, b in zip(mine, theirs, strict=True):
        np.testing.assert_array_equal(a, b.numpy())


def test_what_posenc_cannot_patch_is_named():
    t = transformers
    gpt2 = t.GPT2LMHeadModel(t.GPT2Config(n_embd=64, n_layer=1, n_head=2, vocab_size=32))
    with pytest.raises(ValueError, match="GPT2LMHeadModel has no rotary embedding module"):
        patch(gpt2)
    text = t.Qwen2VLTextConfig(**SMALL, num_key_value_heads=2,
                               rope_scaling={"rope_type": "linear", "factor": 2.0,
                                             "mrope_section": [8, 12, 12]})  # fmt: skip
    model = t.Qwen2VLTextModel(text)
    before = dict(rotary_modules(model))
    with pytest.raises(ValueError, match="cannot patch Qwen2VLRotaryEmbedding: M-RoPE with"):
        patch(model)
    assert dict(rotary_modules(model)) == before  # nothing replaced
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        patch("llama")


def test_deepseek_interleaved_application_is_posenc_interleaved_rope_in_half_order():
    """DeepSeek-V3's ``apply_rotary_pos_emb_interleave`` rotates pairs (x0, x1), (x2, x3)
    and returns them in half order: posenc's interleaved rotation with the same tables,
    then the interleaved -> half permutation (scores unchanged: q and k move alike)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        apply_rotary_pos_emb_interleave,
    )

    import posenc

    d, positions = 16, np.arange(5) + 70_000
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, 1, 2, 5, d))  # (batch, heads, seq, d)
    inv_freq = posenc.rope_frequencies(d, 10000.0)
    cos_h, sin_h = posenc.rope_tables(positions, inv_freq, layout="half", dtype="float64")
    cos_i, sin_i = posenc.rope_tables(positions, inv_freq, layout="interleaved", dtype="float64")
    theirs = apply_rotary_pos_emb_interleave(
        torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(cos_h)[None],
        torch.from_numpy(sin_h)[None],
    )  # fmt: skip
    to_half = posenc.rope_permutation(d, "interleaved", "half")
    for x, out in zip((q, k), theirs, strict=True):
        mine = posenc.apply_rope(x, cos_i, sin_i, layout="interleaved")[..., to_half]
        np.testing.assert_allclose(out.numpy(), mine, rtol=0, atol=1e-15)


def test_register_adds_posenc_methods_to_transformers_registry():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    import posenc
    from posenc.integrations.transformers import register, unregister

    added = register()
    try:
        assert {"posenc_ntk", "posenc_yarn", "posenc_dynamic", "posenc_llama3"} <= set(added)
        assert "posenc_longrope" in added
        yarn = {"rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 1024}
        config = transformers.LlamaConfig(
            **SMALL,
            max_position_embeddings=4096,
            rope_parameters={"rope_type": "posenc_yarn", **yarn},
        )
        module = LlamaRotaryEmbedding(config)
        spec = posenc.RopeSpec.from_hf_config(config)
        inv_freq, attention = spec.frequencies()
        assert torch.equal(module.inv_freq, torch.tensor(inv_freq, dtype=torch.float32))
        assert module.attention_scaling == attention
        theirs = transformers.LlamaConfig(
            **SMALL, max_position_embeddings=4096, rope_parameters={"rope_type": "yarn", **yarn}
        )
        hf_inv_freq, hf_attention = ROPE_INIT_FUNCTIONS["yarn"](theirs, None)
        torch.testing.assert_close(module.inv_freq, hf_inv_freq, rtol=6e-7, atol=0)
        assert hf_attention == pytest.approx(attention, rel=1e-15)
        # a method transformers lacks, in a whole model, and the dynamic update per length
        ntk = transformers.LlamaConfig(**SMALL, rope_parameters={
            "rope_type": "posenc_ntk", "rope_theta": 1e4, "factor": 4.0})  # fmt: skip
        assert posenc.RopeSpec.from_hf_config(ntk).to_hf_dict()["rope_parameters"][
            "rope_type"] == "posenc_ntk"  # fmt: skip
        model = transformers.LlamaForCausalLM(ntk)
        expected = posenc.rope_scaling("ntk", 64, 1e4, factor=4.0)[0]
        assert torch.equal(model.model.rotary_emb.inv_freq, torch.tensor(expected).float())
        dynamic = transformers.LlamaConfig(**SMALL, max_position_embeddings=1024,
                                           rope_parameters={"rope_type": "posenc_dynamic",
                                                            "rope_theta": 1e4, "factor": 2.0})  # fmt: skip
        module = LlamaRotaryEmbedding(dynamic)
        module(torch.zeros(1), torch.arange(3000)[None])  # past 1024: the frequencies follow
        longer = posenc.RopeSpec.from_hf_config(dynamic).frequencies(3000)[0]
        assert torch.equal(module.inv_freq, torch.tensor(longer, dtype=torch.float32))
    finally:
        assert set(unregister()) == set(added)
    assert "posenc_yarn" not in ROPE_INIT_FUNCTIONS
