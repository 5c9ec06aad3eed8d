"""RopeSpec.from_hf_config and to_hf_dict against transformers' own configs and RoPE code.

Each config is built with transformers (nothing downloaded); the frequencies and the
attention factor posenc reads from it are compared with transformers' RoPE init function
for that config (``ROPE_INIT_FUNCTIONS`` or the model's ``compute_default_rope_parameters``),
which forms them in float32: they agree to float32's rounding of those formulas.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hf_models import SMALL
from posenc import RopeSpec
from posenc.specs.hf import rope_spec_from_hf_config

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

F32_RTOL = 6e-7  # transformers' float32 powers and products: a few float32 ulp


def configs() -> dict[str, tuple[object, str | None, str]]:
    """name -> (config, layer_type, module path of its rotary embedding)."""
    t = transformers
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}  # fmt: skip
    deepseek = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1}  # fmt: skip
    phi3_factors = {"short_factor": [1.0 + i / 32 for i in range(32)],
                    "long_factor": [2.0 + i for i in range(32)]}  # fmt: skip
    out: dict[str, tuple[object, str | None, str]] = {
        "llama3": (
            t.LlamaConfig(**SMALL, max_position_embeddings=131072, rope_parameters=llama3),
            None, "llama.modeling_llama.LlamaRotaryEmbedding",
        ),
        "llama linear (v4 rope_scaling with type)": (
            t.LlamaConfig(**SMALL, rope_theta=1e4, rope_scaling={"type": "linear", "factor": 4.0}),
            None, "llama.modeling_llama.LlamaRotaryEmbedding",
        ),
        "llama dynamic": (
            t.LlamaConfig(**SMALL, max_position_embeddings=4096,
                          rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
            None, "llama.modeling_llama.LlamaRotaryEmbedding",
        ),
        "mistral": (
            t.MistralConfig(**SMALL, num_key_value_heads=2, rope_theta=1e6),
            None, "mistral.modeling_mistral.MistralRotaryEmbedding",
        ),
        "qwen2 yarn": (
            t.Qwen2Config(**SMALL, num_key_value_heads=2, rope_theta=1e6,
                          rope_scaling={"type": "yarn", "factor": 4.0,
                                        "original_max_position_embeddings": 32768}),
            None, "qwen2.modeling_qwen2.Qwen2RotaryEmbedding",
        ),
        "phi3 longrope": (
            t.Phi3Config(**SMALL, max_position_embeddings=131072,
                         original_max_position_embeddings=4096,
                         rope_scaling={"type": "longrope", **phi3_factors}),
            None, "phi3.modeling_phi3.Phi3RotaryEmbedding",
        ),
        "gpt-neox partial": (
            t.GPTNeoXConfig(**SMALL, rotary_pct=0.25),
            None, "gpt_neox.modeling_gpt_neox.GPTNeoXRotaryEmbedding",
        ),
        "deepseek-v3 yarn mscale": (
            t.DeepseekV3Config(**SMALL, moe_intermediate_size=64, qk_rope_head_dim=16,
                               qk_nope_head_dim=32, v_head_dim=32, kv_lora_rank=32,
                               q_lora_rank=64, n_routed_experts=4, num_experts_per_tok=2,
                               max_position_embeddings=163840, rope_scaling=deepseek),
            None, "deepseek_v3.modeling_deepseek_v3.DeepseekV3RotaryEmbedding",
        ),
    }  # fmt: skip
    gemma = t.Gemma3TextConfig(**SMALL, num_key_value_heads=1, head_dim=64)
    for layer_type in ("sliding_attention", "full_attention"):
        out[f"gemma3 {layer_type}"] = (
            gemma,
            layer_type,
            "gemma3.modeling_gemma3.Gemma3RotaryEmbedding",
        )
    out["jetmoe (head_dim is kv_channels)"] = (
        t.JetMoeConfig(**SMALL, kv_channels=32, num_key_value_heads=2, num_local_experts=2,
                       num_experts_per_tok=2),
        None, "jetmoe.modeling_jetmoe.JetMoeRotaryEmbedding",
    )  # fmt: skip
    if hasattr(t, "Ministral3Config"):  # a RoPE parameter for the attention, not the RoPE
        out["ministral3 yarn (llama_4_scaling_beta)"] = (
            t.Ministral3Config(**SMALL, num_key_value_heads=2), None,
            "ministral3.modeling_ministral3.Ministral3RotaryEmbedding",
        )  # fmt: skip
    if hasattr(t, "DeepseekV4Config"):  # partial_rotary_factor of head_dim, per rope label
        v4 = t.DeepseekV4Config(**SMALL, num_key_value_heads=1, head_dim=64,
                                partial_rotary_factor=0.5, q_lora_rank=32, o_lora_rank=32,
                                o_groups=2, n_routed_experts=4, num_experts_per_tok=2)  # fmt: skip
        for label in ("main", "compress"):
            out[f"deepseek-v4 {label}"] = (
                v4,
                label,
                "deepseek_v4.modeling_deepseek_v4.DeepseekV4RotaryEmbedding",
            )
    out["llama proportional"] = (
        t.LlamaConfig(**SMALL, rope_parameters={"rope_type": "proportional", "rope_theta": 1e6,
                                                "partial_rotary_factor": 0.25}),
        None, "llama.modeling_llama.LlamaRotaryEmbedding",
    )  # fmt: skip
    if hasattr(t, "Gemma4TextConfig"):  # p-RoPE with its own head_dim on global layers
        gemma4 = t.Gemma4TextConfig(
            **SMALL, num_key_value_heads=1, head_dim=64, global_head_dim=128,
            layer_types=["sliding_attention", "full_attention"],
        )  # fmt: skip
        for layer_type in ("sliding_attention", "full_attention"):
            out[f"gemma4 {layer_type}"] = (
                gemma4,
                layer_type,
                "gemma4.modeling_gemma4.Gemma4TextRotaryEmbedding",
            )
    return out


CONFIGS = configs()


def reference(config: object, layer_type: str | None, path: str) -> tuple[np.ndarray, float]:
    """transformers' ``(inv_freq, attention_scaling)`` for ``config``."""
    import importlib

    params = config.rope_parameters[layer_type] if layer_type else config.rope_parameters
    kind = params["rope_type"]
    kwargs = {"layer_type": layer_type} if layer_type else {}
    if kind == "default":
        module, name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(f"transformers.models.{module}"), name)
        if layer_type and config.to_dict().get("per_layer_config"):
            config = config.per_layer_config[config.layer_types.index(layer_type)]  # Gemma 4
        inv_freq, attention = cls.compute_default_rope_parameters(config, **kwargs)
    else:
        inv_freq, attention = ROPE_INIT_FUNCTIONS[kind](config, None, **kwargs)
    return inv_freq.double().numpy(), float(attention)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_spec_of_a_config_gives_transformers_frequencies(name):
    config, layer_type, path = CONFIGS[name]
    spec = RopeSpec.from_hf_config(config, layer_type=layer_type)
    expected, attention = reference(config, layer_type, path)
    inv_freq, factor = spec.frequencies()
    np.testing.assert_allclose(inv_freq, expected, rtol=F32_RTOL, atol=0)
    assert factor == pytest.approx(attention, rel=1e-15)
    # the same from the config's dict, as a config.json holds it
    assert (
        RopeSpec.from_hf_config(json.loads(config.to_json_string()), layer_type=layer_type) == spec
    )


def test_what_each_config_says_is_read():
    def get(name: str) -> RopeSpec:
        config, layer_type, _ = CONFIGS[name]
        return RopeSpec.from_hf_config(config, layer_type=layer_type)

    assert get("gpt-neox partial").rotary_dim == 16  # 0.25 of 64
    assert get("deepseek-v3 yarn mscale").head_dim == 16  # qk_rope_head_dim
    assert get("deepseek-v3 yarn mscale").layout == "interleaved"  # rope_interleave
    assert get("llama3").layout == "half"
    assert get("phi3 longrope").scaling.original_max_position_embeddings == 4096  # top level
    assert get("gemma3 full_attention").base == 1e6
    assert get("gemma3 sliding_attention").base == 1e4
    assert get("llama dynamic").scaling.original_max_position_embeddings == 4096
    assert get("mistral").scaling.name == "default"
    proportional = get("llama proportional")
    assert (proportional.rotary_dim, proportional.scaling.name) == (64, "proportional")
    assert proportional.scaling.partial_rotary_factor == 0.25
    if "gemma4 full_attention" in CONFIGS:
        assert get("gemma4 full_attention").head_dim == 128  # per_layer_config
        assert get("gemma4 sliding_attention").head_dim == 64
    assert get("jetmoe (head_dim is kv_channels)").head_dim == 32  # not 256 // 4
    if "deepseek-v4 main" in CONFIGS:
        assert get("deepseek-v4 main").rotary_dim == 32  # head_dim 64 x 0.5
        assert get("deepseek-v4 compress").base == 160000.0


@pytest.mark.parametrize("name", sorted(n for n in CONFIGS if CONFIGS[n][1] is None))
def test_to_hf_dict_round_trips_through_the_config_class(name):
    config, _, _ = CONFIGS[name]
    spec = RopeSpec.from_hf_config(config)
    keys = spec.to_hf_dict()
    rebuilt = type(config)(**{**SMALL, **extra_sizes(config), **keys})
    assert RopeSpec.from_hf_config(rebuilt) == spec


def extra_sizes(config: object) -> dict[str, object]:
    """What the config class needs besides the RoPE keys (DeepSeek's and Phi-3's sizes)."""
    names = ("moe_intermediate_size", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank",
             "q_lora_rank", "n_routed_experts", "num_experts_per_tok",
             "max_position_embeddings", "original_max_position_embeddings",
             "num_key_value_heads", "qk_rope_head_dim")  # fmt: skip
    return {key: getattr(config, key) for key in names if getattr(config, key, None) is not None}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "ramp": 2}}, "no parameter 'ramp'"),
        ({"rope_scaling": {"rope_type": "su", "factor": 4.0}}, "rope_type 'su' is not one"),
        ({"rope_scaling": {"rope_type": "linear", "type": "yarn", "factor": 2.0}},
         "rope_type='linear' and type='yarn'"),
        ({"rope_scaling": {"rope_type": "default", "mrope_section": [8, 12, 12]}},
         "mrope_section: this config's RoPE is multimodal"),
        ({"partial_rotary_factor": 1.5}, "partial_rotary_factor must be a number in"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0,
                           "original_max_position_embeddings": 100}},
         "differs from max_position_embeddings=2048"),
        ({"rope_scaling": {"rope_type": "linear"}}, "missing \\['factor'\\]"),
        ({"hidden_size": None}, "needs head_dim, or hidden_size and num_attention_heads"),
        ({"partial_rotary_factor": 0.01},
         r"hidden_size // num_attention_heads = 256 // 4 = 64 x partial_rotary_factor=0.01 "
         r"gives a rotary width of int\(64 x 0.01\) = 0, which is below 2"),
        ({"hidden_size": 100, "num_attention_heads": 3},
         r"the head width hidden_size // num_attention_heads = 100 // 3 = 33, which is odd"),
        ({"head_dim": 64, "partial_rotary_factor": 0.3},
         r"head_dim=64 x partial_rotary_factor=0.3 gives a rotary width of int\(64 x 0.3\) "
         r"= 19, which is odd"),
        ({"rope_parameters": {"sliding_attention": {"rope_type": "default"},
                              "full_attention": None},
          "layer_types": ["sliding_attention", "full_attention"]},
         r"layer_type must be one of \['sliding_attention'\], got 'full_attention' "
         r"\(rope_parameters gives it None: no RoPE\)"),
    ],
)  # fmt: skip
def test_unknown_or_inconsistent_keys_are_named(change, message):
    config = {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 2048,
              "rope_theta": 10000.0, **change}  # fmt: skip
    layer_type = "full_attention" if "layer_types" in change else None
    with pytest.raises((ValueError, TypeError), match=message):
        RopeSpec.from_hf_config(config, layer_type=layer_type)


def test_per_layer_settings_are_read_by_the_layer_index_they_name():
    """``per_layer_config`` as ``to_dict()`` writes it: zero-padded indices ("05") past
    nine layers; a layer's overrides of settings that do not change its RoPE (its MLP)
    do not make the layers of its type differ, those of its RoPE do."""
    layer_types = (["sliding_attention"] * 5 + ["full_attention"]) * 2
    config = {"head_dim": 64, "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        "full_attention": {"rope_type": "default", "rope_theta": 1e6}},
        "layer_types": layer_types, "per_layer_config": {
            "05": {"head_dim": 128}, "11": {"head_dim": 128, "intermediate_size": 64},
            "02": {"intermediate_size": 32}}}  # fmt: skip
    assert RopeSpec.from_hf_config(config, layer_type="full_attention").head_dim == 128
    assert RopeSpec.from_hf_config(config, layer_type="sliding_attention").head_dim == 64
    config["per_layer_config"]["11"] = {"head_dim": 256}
    with pytest.raises(
        ValueError,
        match=r"full_attention layers different RoPE settings "
        r"\(layer 11: \{'head_dim': 256\}, the first: \{'head_dim': 128\}\)",
    ):
        RopeSpec.from_hf_config(config, layer_type="full_attention")


def test_a_config_objects_aliases_and_derived_sizes_are_read_as_the_model_reads_them():
    """A config class may call head_dim otherwise in its config.json (JetMoe's kv_channels,
    Zamba2's attention_head_dim, by its attribute_map) and derive it (Zamba2: twice
    hidden_size // heads): the object and its dict give transformers' own width."""
    t = transformers
    zamba = t.Zamba2Config(
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        layers_block_type=["mamba", "hybrid"],
    )
    jetmoe = t.JetMoeConfig(hidden_size=64, kv_channels=48, num_key_value_heads=2)
    for config, width in ((zamba, 32), (jetmoe, 48)):
        assert config.head_dim == width  # transformers' own attribute
        assert RopeSpec.from_hf_config(config).head_dim == width
        assert RopeSpec.from_hf_config(config.to_dict()).head_dim == width


def test_layer_types_are_asked_for_where_the_config_has_them():
    gemma = CONFIGS["gemma3 full_attention"][0]
    with pytest.raises(ValueError, match="pass layer_type= one of them"):
        RopeSpec.from_hf_config(gemma)
    with pytest.raises(ValueError, match="layer_type must be one of"):
        RopeSpec.from_hf_config(gemma, layer_type="chunked_attention")
    llama = CONFIGS["llama3"][0]
    with pytest.raises(ValueError, match="gives one RoPE for every layer"):
        RopeSpec.from_hf_config(llama, layer_type="full_attention")
    qwen = CONFIGS["qwen2 yarn"][0]  # layer_types all "full_attention": the one RoPE
    assert RopeSpec.from_hf_config(qwen, layer_type="full_attention") == RopeSpec.from_hf_config(
        qwen
    )


def test_a_multimodal_config_is_read_through_its_text_config():
    config = {"model_type": "x", "text_config": {"head_dim": 32, "rope_theta": 5e5}}
    assert rope_spec_from_hf_config(config)["base"] == 5e5
    with pytest.raises(TypeError, match="config must be a transformers config"):
        RopeSpec.from_hf_config(42)


@pytest.mark.parametrize("name", ["deepseek-v3 yarn mscale", "gemma3 full_attention", "llama3"])
def test_every_front_end_builds_the_same_rotation_from_a_config(name):
    """PyTorch, Keras and Flax ``RotaryEmbedding.from_hf_config`` rotate queries to the
    same bits as the PyTorch module made from the spec."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("keras")
    pytest.importorskip("flax")
    from posenc import keras as pk
    from posenc import torch as pt
    from posenc.jax import linen as pl

    config, layer_type, _ = CONFIGS[name]
    spec = RopeSpec.from_hf_config(config, layer_type=layer_type)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 5, 2, spec.head_dim)).astype(np.float32)  # (b, s, h, d)
    expected, _ = pt.RotaryEmbedding.from_spec(spec, max_length=64, qk_layout="bshd")(
        torch.from_numpy(q), torch.from_numpy(q), offset=3
    )
    module = pt.RotaryEmbedding.from_hf_config(
        config, layer_type=layer_type, max_length=64, qk_layout="bshd"
    )
    assert module.spec == spec
    mine, _ = module(torch.from_numpy(q), torch.from_numpy(q), offset=3)
    assert torch.equal(mine, expected)
    layer = pk.RotaryEmbedding.from_hf_config(config, layer_type=layer_type, max_length=64)
    np.testing.assert_array_equal(np.asarray(layer(q, start_index=3)), expected.numpy())
    flax = pl.RotaryEmbedding.from_hf_config(config, layer_type=layer_type, max_length=64)
    np.testing.assert_array_equal(np.asarray(flax.apply({}, q, start_index=3)), expected.numpy())
    with pytest.raises(ValueError, match=f"was made for head_dim={spec.head_dim}"):
        flax.apply({}, q[..., :2])
    with pytest.raises(TypeError, match="given by the spec already"):
        pt.RotaryEmbedding.from_hf_config(config, layer_type=layer_type, base=1.5)


def test_phimoe_longrope_switches_factors_and_mscale_at_the_original_length():
    """PhiMoE's LongRoPE: short factors and ``short_mscale`` up to L0, long ones and
    ``long_mscale`` past it; the frequencies equal transformers' longrope function at
    each length. (transformers' ``PhimoeRotaryEmbedding.forward`` recomputes the
    frequencies without the length, so it keeps the short factors past L0 too; the
    switch of both follows Microsoft's ``PhiMoELongRoPEScaledRotaryEmbedding``.)"""
    factors = {"short_factor": [1.0 + i / 32 for i in range(32)],
               "long_factor": [2.0 + i for i in range(32)]}  # fmt: skip
    config = transformers.PhimoeConfig(
        **SMALL, num_local_experts=4, max_position_embeddings=16384,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e6, **factors,
                         "short_mscale": 1.1, "long_mscale": 1.25,
                         "original_max_position_embeddings": 4096},
    )  # fmt: skip
    spec = RopeSpec.from_hf_config(config)
    assert spec.scaling.original_max_position_embeddings == 4096
    for seq_len, mscale in ((4096, 1.1), (4097, 1.25), (16384, 1.25)):
        inv_freq, attention = spec.frequencies(seq_len)
        expected, _ = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=seq_len)
        np.testing.assert_allclose(inv_freq, expected.double().numpy(), rtol=F32_RTOL, atol=0)
        assert attention == mscale
    with pytest.raises(TypeError, match="short_mscale and long_mscale together"):
        RopeSpec.from_hf_config({**config.to_dict(), "rope_parameters": {
            "rope_type": "longrope", **factors, "short_mscale": 1.1}})  # fmt: skip


def test_a_configs_rope_parameters_are_a_scaling_in_every_front_end():
    """transformers 5's ``config.rope_parameters`` (``{"rope_type", "rope_theta",
    params}``) given as ``scaling=``: its ``rope_theta`` is the base where ``base=`` is
    left at 10000, in the spec and every front end (it was refused); another ``base`` is
    an error naming both; a key only the whole config explains (GPT-NeoX's
    ``partial_rotary_factor``) says to build from the config."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("keras")
    pytest.importorskip("flax")
    from posenc import keras as pk
    from posenc import torch as pt
    from posenc.core.rope import as_rope_scaling
    from posenc.jax import linen as pl
    from posenc.jax import rope_tables

    config, _, _ = CONFIGS["llama3"]
    parameters = dict(config.rope_parameters)
    expected = RopeSpec.from_hf_config(config)
    assert RopeSpec(head_dim=64, scaling=parameters) == expected
    assert RopeSpec(head_dim=64, base=500000.0, scaling=parameters) == expected
    assert pt.RotaryEmbedding(64, scaling=parameters).spec == expected
    assert pt.LearnedRotaryEmbedding(64, scaling=parameters).spec == expected
    q = np.random.default_rng(0).standard_normal((1, 5, 2, 64)).astype(np.float32)
    layer = pk.RotaryEmbedding(scaling=parameters, max_length=64)
    layer(q)
    assert layer.spec == expected
    module = pl.RotaryEmbedding(scaling=parameters, max_length=64)
    rows = np.asarray(rope_tables(np.arange(5), 64, scaling=parameters)[0])
    torch_rows = pt.RotaryEmbedding.from_spec(expected).cos_sin(torch.arange(5))[0]
    np.testing.assert_array_equal(rows, torch_rows.numpy())
    np.testing.assert_array_equal(
        np.asarray(module.apply({}, q)), np.asarray(layer(q)), err_msg="flax and keras"
    )
    with pytest.raises(ValueError, match=r"base=1000000.0 and the scaling dict's "
                       r"rope_theta=500000.0 are two bases"):  # fmt: skip
        pt.RotaryEmbedding(64, base=1e6, scaling=parameters)
    with pytest.raises(ValueError, match="rope_theta is the RoPE base, not a scaling parameter"):
        as_rope_scaling(parameters)
    neox = CONFIGS["gpt-neox partial"][0]
    with pytest.raises(ValueError, match=r"partial_rotary_factor is a key of a model config.*"
                       r"RotaryEmbedding.from_spec\(RopeSpec.from_hf_config\(config\)\)"):  # fmt: skip
        pt.RotaryEmbedding(64, scaling=neox.rope_parameters)
