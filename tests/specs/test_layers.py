"""layer_specs_from_hf_config against transformers' own models: which layers rotate, the
RoPE of each layer type, and Llama 4's attention temperature of the layers without RoPE
(read from the query a ``Llama4TextAttention`` hands to its attention function)."""

from __future__ import annotations

import numpy as np
import pytest

from hf_models import SMALL
from posenc import NopeSpec, NopeTemperatureSpec, RopeSpec, SchemeSpec, layer_specs_from_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def llama4(**options):
    sizes = {**SMALL, "num_hidden_layers": 8}
    return transformers.Llama4TextConfig(
        **sizes, num_key_value_heads=2, head_dim=64, intermediate_size_mlp=256,
        num_local_experts=2, num_experts_per_tok=1, **options,
    )  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [{}, {"no_rope_layers": [1, 0, 0, 1, 1, 1, 0, 1], "floor_scale": 3, "attn_scale": 0.25},
     {"attn_temperature_tuning": False}, {"no_rope_layer_interval": 3}],
)  # fmt: skip
def test_llama4_layers_with_and_without_rope_are_the_models(options):
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    config = llama4(**options)
    specs = layer_specs_from_hf_config(config)
    assert len(specs) == 8
    for index, spec in enumerate(specs):
        attention = Llama4TextAttention(config, index)
        if attention.use_rope:
            assert spec == RopeSpec.from_hf_config(config)
        elif attention.attn_temperature_tuning:
            assert spec == NopeTemperatureSpec(floor_scale=config.floor_scale,
                                               attn_scale=config.attn_scale)  # fmt: skip
        else:
            assert spec == NopeSpec(d_model=64)
    # the config's dict (config.json) reads the same, the default list included
    data = config.to_dict()
    if "no_rope_layers" not in options:
        data.pop("no_rope_layers")
    assert layer_specs_from_hf_config(data) == specs


@pytest.mark.parametrize("floor_scale", [8, 3])
def test_the_temperature_is_the_one_llama4_attention_applies(floor_scale):
    """The query scale transformers applies (float32) at positions 0 .. 99, against the
    spec's correctly rounded float32 scales: within one float32 ulp, and equal where
    transformers' float32 log1p rounds correctly."""
    from transformers import AttentionInterface
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    captured = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        captured["query"] = query
        batch, heads, seq, width = query.shape
        return torch.zeros(batch, seq, heads, width, dtype=query.dtype), None

    AttentionInterface.register("posenc_capture_query", capture)
    config = llama4(no_rope_layers=[1, 0] * 4, floor_scale=floor_scale, attn_scale=0.1)
    config._attn_implementation = "posenc_capture_query"
    attention = Llama4TextAttention(config, 1).double()
    hidden = torch.randn(1, 100, SMALL["hidden_size"], dtype=torch.float64,
                         generator=torch.Generator().manual_seed(0))  # fmt: skip
    with torch.no_grad():
        attention(hidden, None, None)
        plain = attention.q_proj(hidden).view(1, 100, -1, 64).transpose(1, 2)
    theirs = (captured["query"] / plain)[0, 0, :, 0].float().numpy()  # their float32 scale
    spec = layer_specs_from_hf_config(config)[1]
    assert isinstance(spec, NopeTemperatureSpec)
    mine = spec.scales(100)
    assert mine.dtype == np.float32
    ulps = np.abs(mine.view(np.int32).astype(np.int64) - theirs.view(np.int32).astype(np.int64))
    assert ulps.max() <= 1, ulps
    assert np.mean(ulps == 0) > 0.5
    exact = 1 + 0.1 * np.log1p(np.floor((np.arange(100) + 1) / floor_scale))
    np.testing.assert_array_equal(mine, exact.astype(np.float32))


def test_gemma3_layers_take_their_types_rope():
    types = ["sliding_attention", "sliding_attention", "full_attention"]
    config = transformers.Gemma3TextConfig(**{**SMALL, "num_hidden_layers": 3},
                                           num_key_value_heads=1, head_dim=64,
                                           layer_types=types)  # fmt: skip
    specs = layer_specs_from_hf_config(config)
    assert specs == tuple(RopeSpec.from_hf_config(config, layer_type=t) for t in types)
    assert specs[0].base == 10000.0  # local
    assert specs[2].base == 1000000.0  # global
    assert specs[0] != specs[2]
    plain = transformers.LlamaConfig(**SMALL)
    assert layer_specs_from_hf_config(plain) == (RopeSpec.from_hf_config(plain),) * 2


def test_the_layer_specs_round_trip_and_bad_configs_are_named():
    spec = NopeTemperatureSpec(floor_scale=8192, attn_scale=0.1)
    assert SchemeSpec.from_dict(spec.to_dict()) == spec
    base = {"num_hidden_layers": 2, "head_dim": 64}
    with pytest.raises(ValueError, match="num_hidden_layers must be an int >= 1, got None"):
        layer_specs_from_hf_config({"head_dim": 64})
    with pytest.raises(ValueError, match="no_rope_layers must list 0 .* for each of the 2"):
        layer_specs_from_hf_config({**base, "no_rope_layers": [1]})
    with pytest.raises(ValueError, match="no_rope_layers must list 0 .* got \\[1, 2\\]"):
        layer_specs_from_hf_config({**base, "no_rope_layers": [1, 2]})
    with pytest.raises(ValueError, match="layer_types has 1 entries for num_hidden_layers=2"):
        layer_specs_from_hf_config({**base, "layer_types": ["full_attention"]})
    with pytest.raises(ValueError, match="floor_scale must be a finite real number > 0"):
        layer_specs_from_hf_config({**base, "no_rope_layers": [0, 1], "floor_scale": 0})
    with pytest.raises(TypeError, match="attn_temperature_tuning must be a bool"):
        layer_specs_from_hf_config({**base, "no_rope_layers": [0, 1],
                                    "attn_temperature_tuning": "yes"})  # fmt: skip
