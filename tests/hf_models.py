"""What the tests of Hugging Face configs and models share: the sizes of a tiny model, and
tiny models of the families whose rotary modules differ.

``SMALL``: two layers and hidden size 256 (4 heads of 64) keep every model built from a
config fast on a CPU; token ids 0 and 1 are padding and start/end, as the configs'
defaults would put them outside the 128-token vocabulary.

``FAMILIES``: one tiny causal language model per way a ``transformers`` rotary module
differs from Llama's (what it returns, where it sits, how its config gives the width):
two layers, hidden size 64, heads of 32 with grouped keys where the family has them.
"""

from __future__ import annotations

from typing import Any

SMALL = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "vocab_size": 128,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 1,
}

TINY = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "vocab_size": 128,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 1,
}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
_TWO_TYPES = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}

# name -> (model class, config class, the config's arguments besides TINY, what differs)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "cohere": (
        "CohereForCausalLM", "CohereConfig", {},
        "cos/sin interleaved (each value twice in a row)",
    ),
    "cohere2": (
        "Cohere2ForCausalLM", "Cohere2Config", _TWO_TYPES,
        "interleaved, sliding and full layers",
    ),
    "cohere2-moe": (
        "Cohere2MoeForCausalLM", "Cohere2MoeConfig", {**_MOE, **_TWO_TYPES},
        "interleaved, mixture of experts",
    ),
    "gpt-oss": (
        "GptOssForCausalLM", "GptOssConfig",
        {"num_local_experts": 4, "num_experts_per_tok": 2, **_TWO_TYPES},
        "one cos/sin column per pair (rotary_dim / 2)",
    ),
    "jetmoe": (
        "JetMoeForCausalLM", "JetMoeConfig",
        {"kv_channels": 32, "num_local_experts": 4, "num_experts_per_tok": 2},
        "head_dim is kv_channels (attribute_map), not hidden_size // heads",
    ),
    "lfm3": (
        "Lfm3ForCausalLM", "Lfm3Config",
        {"layer_types": ["conv", "full_attention"], "sliding_window": 8},
        "float32 cos/sin for any input, layer_types read from the rotary module",
    ),
    "moshi": (
        "MoshiForCausalLM", "MoshiConfig", {"sliding_window": 64},
        "a rotary module in every attention layer",
    ),
    "deepseek-v2": (
        "DeepseekV2ForCausalLM", "DeepseekV2Config",
        {"qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16, "kv_lora_rank": 32,
         "q_lora_rank": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
         "moe_intermediate_size": 32, "head_dim": None, "num_key_value_heads": 4},
        "complex cos + i sin per pair",
    ),
    "deepseek-v4": (
        "DeepseekV4ForCausalLM", "DeepseekV4Config",
        {"num_key_value_heads": 1, "head_dim": 64, "partial_rotary_factor": 0.5,
         "q_lora_rank": 32, "o_lora_rank": 32, "o_groups": 2, "n_routed_experts": 4,
         "num_experts_per_tok": 2, "moe_intermediate_size": 32, "index_n_heads": 2,
         "index_head_dim": 32, "index_topk": 8, "sliding_window": 8,
         "num_nextn_predict_layers": 0},
        "one column per pair; rope labels (main, compress) that are not its layer types",
    ),
    "gemma4": (
        "Gemma4ForCausalLM", "Gemma4TextConfig",
        {"global_head_dim": 64, **_TWO_TYPES, "hidden_size_per_layer_input": 16,
         "vocab_size_per_layer_input": 128},
        "per_layer_config (its own head_dim on full layers), p-RoPE",
    ),
    "ministral3": (
        "Ministral3ForCausalLM", "Ministral3Config", {},
        "RoPE parameters for the attention (llama_4_scaling_beta)",
    ),
    "beam": (
        "BeamForCausalLM", "BeamConfig", {**_MOE, **_TWO_TYPES, "n_group": 1, "topk_group": 1},
        "no RoPE on its full-attention layers (rope_parameters None)",
    ),
}  # fmt: skip
