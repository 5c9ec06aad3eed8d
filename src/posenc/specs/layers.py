"""The position scheme of every attention layer of a Hugging Face model config.

Most models use one RoPE in every layer; Gemma 3 gives its sliding-window and global
layers different RoPE (``layer_types`` with ``rope_parameters`` per type); Llama 4 leaves
RoPE out of every fourth layer (``no_rope_layers``) and scales those layers' queries by
an attention temperature (``attn_temperature_tuning``, ``floor_scale``, ``attn_scale``).
:func:`layer_specs_from_hf_config` reads all three into one spec per layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._checks import check_bool
from .encodings import NopeSpec, NopeTemperatureSpec
from .hf import config_dict, config_head_dim
from .rotary import RopeSpec

__all__ = ["LayerSpec", "layer_specs_from_hf_config"]

LayerSpec = RopeSpec | NopeSpec | NopeTemperatureSpec
"""What :func:`layer_specs_from_hf_config` gives for one layer."""


def layer_specs_from_hf_config(config: Any) -> tuple[LayerSpec, ...]:
    """One spec per layer (``num_hidden_layers``) of a ``transformers`` config or its dict.

    - A layer with RoPE: :meth:`RopeSpec.from_hf_config` of the layer's type (Gemma 3's
      ``full_attention`` / ``sliding_attention``; Gemma 4's ``per_layer_config``).
    - A Llama 4 layer without RoPE (``no_rope_layers[i] == 0``; a dict without the list
      takes ``transformers``' default, every ``no_rope_layer_interval``-th layer):
      :class:`NopeTemperatureSpec` with the config's ``floor_scale`` and ``attn_scale``
      when ``attn_temperature_tuning`` (default True), else :class:`NopeSpec` of the
      head width.

    Example:
        >>> specs = layer_specs_from_hf_config({
        ...     "model_type": "llama4_text", "num_hidden_layers": 4, "head_dim": 64,
        ...     "rope_theta": 500000.0, "no_rope_layers": [1, 1, 1, 0]})
        >>> [type(spec).__name__ for spec in specs]
        ['RopeSpec', 'RopeSpec', 'RopeSpec', 'NopeTemperatureSpec']
        >>> specs[3].floor_scale, specs[3].attn_scale
        (8192.0, 0.1)
    """
    data = config_dict(config)
    layers = data.get("num_hidden_layers")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"num_hidden_layers must be an int >= 1, got {layers!r}")
    types = list(data.get("layer_types") or [])
    if types and len(types) < layers:
        raise ValueError(
            f"layer_types has {len(types)} entries for num_hidden_layers={layers}; it needs one "
            "per layer"
        )
    with_rope = _rope_layers(data, layers)
    specs: list[LayerSpec] = []
    for index in range(layers):
        if with_rope[index]:
            specs.append(RopeSpec.from_hf_config(data, layer_type=types[index] if types else None))
        else:
            specs.append(_nope(data))
    return tuple(specs)


def _rope_layers(data: Mapping[str, Any], layers: int) -> list[bool]:
    """Whether each layer has RoPE: Llama 4's ``no_rope_layers`` (1: RoPE, 0: none)."""
    if "no_rope_layers" not in data and "no_rope_layer_interval" not in data:
        return [True] * layers
    flags = data.get("no_rope_layers")
    if not flags:  # transformers' default: no RoPE in every interval-th layer
        interval = data.get("no_rope_layer_interval", 4)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"no_rope_layer_interval must be an int >= 1, got {interval!r}")
        return [(index + 1) % interval != 0 for index in range(layers)]
    if (
        not isinstance(flags, (list, tuple))
        or len(flags) < layers
        or any(flag not in (0, 1) or isinstance(flag, float) for flag in flags)
    ):
        raise ValueError(
            f"no_rope_layers must list 0 (no RoPE) or 1 (RoPE) for each of the {layers} "
            f"layers, got {flags!r}"
        )
    return [flag == 1 for flag in flags[:layers]]


def _nope(data: Mapping[str, Any]) -> NopeSpec | NopeTemperatureSpec:
    if not check_bool(data.get("attn_temperature_tuning", True), "attn_temperature_tuning"):
        return NopeSpec(d_model=config_head_dim(data))
    floor, scale = data.get("floor_scale"), data.get("attn_scale")
    return NopeTemperatureSpec(  # transformers' defaults where the config has none
        floor_scale=8192 if floor is None else floor, attn_scale=0.1 if scale is None else scale
    )
