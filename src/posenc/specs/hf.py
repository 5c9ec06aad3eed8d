"""Hugging Face model configs in and out: the RoPE of a ``transformers`` config as a spec.

:func:`rope_spec_from_hf_config` reads a ``transformers`` config object or its dict
(``config.json``) the way ``transformers.modeling_rope_utils`` does: the v5
``rope_parameters`` (flat, or nested per layer type as in Gemma 3), the v4
``rope_theta`` with ``rope_scaling`` (``type`` or ``rope_type``), ``partial_rotary_factor``,
``head_dim`` (or ``hidden_size // num_attention_heads``; DeepSeek's
``qk_rope_head_dim``), ``max_position_embeddings`` and
``original_max_position_embeddings`` (a top-level one first, as Phi-3 needs), and
DeepSeek's ``rope_interleave``. Nothing here imports ``transformers``: a config object
is read through its ``to_dict()`` (and ``get_text_config()`` for multimodal models).

:func:`rope_spec_to_hf_dict` is the reverse: the config keys that give a spec's RoPE.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._checks import MAX_WIDTH, describe, show_number
from ..core.rope import ROPE_SCALING_SPECS, RopeScaling, as_rope_scaling

__all__ = [
    "HF_ROPE_TYPES",
    "mrope_spec_from_hf_config",
    "rope_spec_from_hf_config",
    "rope_spec_to_hf_dict",
]

DEFAULT_THETA = 10000.0  # transformers' RotaryEmbeddingConfigMixin.default_theta

# transformers' rope_type -> posenc's scaling name (where they differ).
_HF_NAMES = {"default": "default", "dynamic": "dynamic_ntk"}
_POSENC_NAMES = {"dynamic_ntk": "dynamic"}
_NEEDS_ORIGINAL = ("yarn", "llama3", "longrope")  # take L0 from the config when absent
_SHARED_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")
# The keys of a layer's overrides (per_layer_config) that change its RoPE.
_LAYER_KEYS = (
    "head_dim", "hidden_size", "num_attention_heads", "rope_parameters", "rope_scaling",
    "rope_theta", "partial_rotary_factor", "max_position_embeddings",
    "original_max_position_embeddings", "rope_interleave", "qk_rope_head_dim",
)  # fmt: skip
# Keys of a config.json's RoPE parameters that transformers reads elsewhere, not for the
# frequencies (a config object names them itself: ignore_keys_at_rope_validation):
# Ministral 3's and Mistral 4's query scale by position, and their copy of the config's
# max_position_embeddings (a method that takes it, LongRoPE, reads it).
_FOR_THE_ATTENTION = ("llama_4_scaling_beta", "max_position_embeddings")
# What a config class calls head_dim in its config.json (its attribute_map), in this
# order: Zamba2's attention_head_dim (its kv_channels is another size), JetMoe's kv_channels.
_HEAD_DIM_ALIASES = ("attention_head_dim", "kv_channels")
# The sizes a model's code reads from its config object as attributes.
_ATTRIBUTES = ("head_dim", "hidden_size", "num_attention_heads", "max_position_embeddings")

HF_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional")
"""The ``rope_type`` values of ``transformers`` that posenc reads."""


def rope_spec_from_hf_config(config: Any, *, layer_type: str | None = None) -> dict[str, Any]:
    """The :class:`~posenc.specs.RopeSpec` fields of a ``transformers`` config.

    Args:
        config: A ``transformers`` config object (anything with ``to_dict()``) or a plain
            dict such as a ``config.json``; a multimodal one is read through its text
            config.
        layer_type: For RoPE given per layer type (Gemma 3: ``"full_attention"``,
            ``"sliding_attention"``), which one; required there, refused elsewhere
            unless the config's ``layer_types`` name it.

    Returns:
        ``{"head_dim", "base", "rotary_dim", "layout", "scaling"}``.

    Raises:
        TypeError: ``config`` is neither a mapping nor has ``to_dict()``.
        ValueError: a key posenc does not read, a missing or inconsistent value (each
            error names the key and what is valid).
    """
    data = _layer_config(config_dict(config), layer_type)
    head = _head_width(data)
    rope = _rope_parameters(data, layer_type)
    for key in _not_rope_keys(config):
        rope.pop(key, None)
    base = rope.get("rope_theta", data.get("rope_theta", DEFAULT_THETA))
    if base is None:
        base = DEFAULT_THETA
    partial = rope.get("partial_rotary_factor", data.get("partial_rotary_factor", 1.0))
    if partial is None:
        partial = 1.0
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ValueError(f"partial_rotary_factor must be a number in (0, 1], got {partial!r}")
    layout = "interleaved" if data.get("rope_interleave") else "half"
    # p-RoPE: the proportion is the method's own; every pair turns, those past it by 0
    proportional = posenc_name(_rope_type(rope)) == "proportional"
    if proportional:
        rope = {**rope, "partial_rotary_factor": partial}
    rotary_dim = _rotary_width(head, partial, proportional)
    return {
        "head_dim": head[0],
        "base": base,
        "rotary_dim": rotary_dim,
        "layout": layout,
        "scaling": _scaling(rope, data),
    }


def mrope_spec_from_hf_config(
    config: Any, *, interleaved: bool | None = None, sections: Any = None
) -> dict[str, Any]:
    """The :class:`~posenc.specs.AxialRopeSpec` fields of a multimodal (M-RoPE) config.

    Args:
        config: A ``transformers`` config (object or dict) whose RoPE parameters have
            ``mrope_section`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL); default frequencies only.
        interleaved: Qwen3-VL's interleaved sections (``mode="mrope-interleaved"``);
            ``None``: the config's ``mrope_interleaved`` (default False).
        sections: Used when the config has no ``mrope_section`` (a model's default).

    Returns:
        ``{"head_dim", "n_axes", "base", "sections", "mode", "layout"}``.
    """
    data = config_dict(config)
    head_dim = config_head_dim(data)
    rope = _rope_parameters(data, None)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(
            f"M-RoPE with rope_type {kind!r}: posenc reads M-RoPE with the default frequencies"
        )
    unknown = sorted(set(rope) - set(_SHARED_KEYS) - set(_MROPE_KEYS))
    if unknown:
        raise ValueError(f"M-RoPE has no parameter {unknown[0]!r}; posenc reads {_MROPE_KEYS}")
    partial = rope.get("partial_rotary_factor", data.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"M-RoPE with partial_rotary_factor={partial!r}: posenc reads 1 only")
    sections = rope.get("mrope_section", sections)
    if sections is None:
        raise ValueError("the config has no mrope_section (pairs per position axis)")
    if interleaved is None:
        interleaved = bool(rope.get("mrope_interleaved", False))
    base = rope.get("rope_theta", data.get("rope_theta", DEFAULT_THETA))
    return {
        "head_dim": head_dim,
        "n_axes": len(sections),
        "base": DEFAULT_THETA if base is None else base,
        "sections": tuple(sections),
        "mode": "mrope-interleaved" if interleaved else "mrope",
        "layout": "half",
    }


def rope_spec_to_hf_dict(
    head_dim: int, base: float, rotary_dim: int, layout: str, scaling: RopeScaling
) -> dict[str, Any]:
    """The ``transformers`` config keys of a RoPE spec's fields (v5 form).

    ``{"head_dim": ..., "rope_parameters": {"rope_type": ..., "rope_theta": ..., params,
    "partial_rotary_factor": ...}}``, plus ``"rope_interleave": True`` for the
    interleaved layout (DeepSeek-V3's key; other models apply the half layout). A method
    transformers does not have (``"ntk"``, a registered one) is written as
    ``"posenc_<name>"``, which transformers computes after
    :func:`posenc.integrations.transformers.register`.
    """
    params = scaling.to_dict()
    kind = params.pop("rope_type")
    hf_kind = _POSENC_NAMES.get(kind, kind)
    if hf_kind not in HF_ROPE_TYPES:
        hf_kind = POSENC_PREFIX + hf_kind
    parameters: dict[str, Any] = {"rope_type": hf_kind, "rope_theta": base}
    parameters.update(
        {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in params.items()
            if value is not None
        }
    )
    if rotary_dim != head_dim:
        parameters["partial_rotary_factor"] = rotary_dim / head_dim
    out: dict[str, Any] = {"head_dim": head_dim, "rope_parameters": parameters}
    if kind == "dynamic_ntk":  # transformers reads L0 from max_position_embeddings
        out["max_position_embeddings"] = parameters.pop("original_max_position_embeddings")
    if layout == "interleaved":
        out["rope_interleave"] = True
    return out


def config_dict(config: Any) -> dict[str, Any]:
    """The config as a dict, its text config for a multimodal one.

    A config object is read through ``to_dict()``, with the sizes the model's own code
    reads as attributes (:data:`_ATTRIBUTES`) taken from the object: a config class may
    alias them (JetMoe's ``head_dim`` is its ``kv_channels``, Zamba2's its
    ``attention_head_dim``) or derive them when it is built (DeepSeek-V3's ``head_dim`` is
    its ``qk_rope_head_dim``), and ``to_dict()`` writes neither.
    """
    if not isinstance(config, Mapping):
        text = getattr(config, "get_text_config", None)
        if callable(text):
            config = text()
        to_dict = getattr(config, "to_dict", None)
        if not callable(to_dict):
            raise TypeError(
                "config must be a transformers config (with to_dict()) or a dict such as a "
                f"config.json, got {describe(config)}"
            )
        data = dict(to_dict())
        for key in _ATTRIBUTES:  # as the model reads them: aliases, derived values
            try:
                value = getattr(config, key, None)
            except Exception:  # a value per layer (per_layer_config): read there
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                data[key] = value
        config = data
    data = dict(config)
    text_config = data.get("text_config")
    if isinstance(text_config, Mapping) and not _has_rope(data):
        data = dict(text_config)
    return data


def _layer_config(data: dict[str, Any], layer_type: str | None) -> dict[str, Any]:
    """The config as the layers of ``layer_type`` see it: with the overrides of
    ``per_layer_config`` (Gemma 4's full-attention layers have their own ``head_dim``)."""
    per_layer = data.get("per_layer_config")
    if not per_layer or layer_type is None:
        return data
    layer_types = list(data.get("layer_types") or [])
    by_index = {int(index): dict(values or {}) for index, values in per_layer.items()}
    overrides = [
        {key: value for key, value in by_index.get(index, {}).items() if key in _LAYER_KEYS}
        for index, kind in enumerate(layer_types)
        if kind == layer_type
    ]
    for index, override in zip(
        [i for i, kind in enumerate(layer_types) if kind == layer_type], overrides, strict=True
    ):
        if override != overrides[0]:
            raise ValueError(
                f"per_layer_config gives the {layer_type} layers different RoPE settings "
                f"(layer {index}: {override or 'none'}, the first: {overrides[0] or 'none'}); "
                "posenc reads one RoPE per layer type"
            )
    return {**data, **(overrides[0] if overrides else {})}


def _not_rope_keys(config: Any) -> set[str]:
    """The keys of a config object's RoPE parameters that its class says are for other
    parts of the model (``ignore_keys_at_rope_validation``: Ministral 3's
    ``llama_4_scaling_beta``, a query scale its attention applies), besides those posenc
    reads itself."""
    if isinstance(config, Mapping):
        return set()
    try:
        text = getattr(config, "get_text_config", None)
        ignored = (text() if callable(text) else config).ignore_keys_at_rope_validation
    except Exception:  # a config class without them
        return set()
    return {key for key in ignored or () if isinstance(key, str)} - set(_SHARED_KEYS)


def _has_rope(data: Mapping[str, Any]) -> bool:
    return any(key in data for key in ("rope_parameters", "rope_scaling", "rope_theta"))


def _positive_int(data: Mapping[str, Any], key: str) -> int:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be an int >= 1, got {describe(value)}")
    return value


def _width(width: int, key: str) -> int:
    """A head width the config gives by ``key``: at most 2**24, as every width posenc takes."""
    if width > MAX_WIDTH:
        raise ValueError(f"{key} must be at most 2**24 = {MAX_WIDTH}, got {show_number(width)}")
    return width


def config_head_dim(data: Mapping[str, Any]) -> int:
    """``head_dim`` (or the name a config class gives it, :data:`_HEAD_DIM_ALIASES`),
    ``qk_rope_head_dim`` (DeepSeek's ``config.json``, whose config class sets
    ``head_dim`` from it), or ``hidden_size // num_attention_heads``: the width
    transformers' RoPE functions read."""
    return _head_width(data)[0]


def _head_width(data: Mapping[str, Any]) -> tuple[int, str]:
    """The head width and the config keys that give it, as an error names them
    (``"head_dim=64"``, ``"hidden_size // num_attention_heads = 100 // 3 = 33"``)."""
    for key in ("head_dim", *_HEAD_DIM_ALIASES, "qk_rope_head_dim"):
        if data.get(key) is not None:
            width = _width(_positive_int(data, key), key)
            return width, f"{key}={width}"
    if data.get("hidden_size") is not None and data.get("num_attention_heads") is not None:
        hidden = _positive_int(data, "hidden_size")
        heads = _positive_int(data, "num_attention_heads")
        width = _width(hidden // heads, "hidden_size // num_attention_heads")
        return width, f"hidden_size // num_attention_heads = {hidden} // {heads} = {width}"
    raise ValueError(
        "the config gives no head width: it needs head_dim, or hidden_size and "
        f"num_attention_heads; it has {sorted(data)}"
    )


def _rotary_width(head: tuple[int, str], partial: float, proportional: bool) -> int:
    """The rotated width of a head ``(width, source)``: ``int(width * partial)`` as
    transformers truncates it (p-RoPE: the whole head, its proportion turning); an error
    naming the config keys where that is not an even width >= 2."""
    width, source = head
    rotary_dim = width if proportional else int(width * partial)
    if rotary_dim >= 2 and rotary_dim % 2 == 0:
        return rotary_dim
    if proportional or partial == 1:
        given = f"the head width {source}"
    else:
        given = (
            f"{source} x partial_rotary_factor={partial!r} gives a rotary width of "
            f"int({width} x {partial!r}) = {rotary_dim}"
        )
    problem = "odd" if rotary_dim % 2 else "below 2"
    raise ValueError(
        f"{given}, which is {problem}: RoPE rotates pairs of features, so the rotated width "
        "must be an even int >= 2; change these config keys"
    )


def _rope_parameters(data: Mapping[str, Any], layer_type: str | None) -> dict[str, Any]:
    """The RoPE parameter dict of the config (of ``layer_type`` where nested)."""
    given = {}
    for key in ("rope_parameters", "rope_scaling"):
        value = data.get(key)
        if value is None or (isinstance(value, Mapping) and not value):
            continue  # absent or empty: the defaults
        if not isinstance(value, Mapping):
            raise ValueError(f"{key} must be a dict, got {describe(value)}")
        given[key] = value
    if len(given) == 2 and given["rope_parameters"] != given["rope_scaling"]:
        raise ValueError(
            "the config has both rope_parameters and rope_scaling, and they differ; give one"
        )
    rope: Any = next(iter(given.values()), {})
    if not isinstance(rope, Mapping):
        raise ValueError(f"rope_parameters must be a dict, got {describe(rope)}")
    layer_types = list(data.get("layer_types") or [])
    # per layer type: a dict each, or None for a type without RoPE (Beam's full attention)
    nested = any(isinstance(value, Mapping) for value in rope.values()) and all(
        value is None or isinstance(value, Mapping) for value in rope.values()
    )
    if nested:
        kinds = sorted(kind for kind, value in rope.items() if value is not None)
        if layer_type is None:
            raise ValueError(
                f"this config gives RoPE per layer type {kinds}: pass layer_type= one of them"
            )
        if rope.get(layer_type) is None:
            without = " (rope_parameters gives it None: no RoPE)" if layer_type in rope else ""
            raise ValueError(f"layer_type must be one of {kinds}, got {layer_type!r}{without}")
        return dict(rope[layer_type])
    if layer_type is not None and layer_type not in layer_types:
        raise ValueError(
            f"layer_type={layer_type!r}: this config gives one RoPE for every layer"
            + (f" (its layer types are {sorted(set(layer_types))})" if layer_types else "")
        )
    return dict(rope)


def _scaling(rope: Mapping[str, Any], data: Mapping[str, Any]) -> RopeScaling:
    """The scaling spec of a RoPE parameter dict, filled from the config as transformers."""
    kind = _rope_type(rope)
    shared = _SHARED_KEYS[:-1] if posenc_name(kind) == "proportional" else _SHARED_KEYS
    name = posenc_name(kind)
    accepted = ROPE_SCALING_SPECS[name].parameters()
    params = {
        key: value
        for key, value in rope.items()
        if key not in shared and (key not in _FOR_THE_ATTENTION or key in accepted)
    }
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"rope_type {kind!r} has no parameter {unknown[0]!r}; posenc reads "
            f"{sorted(accepted) or 'none'} for it"
        )
    if name in _NEEDS_ORIGINAL:
        _original(kind, params, data)
    if name == "dynamic_ntk":
        _dynamic_original(params, data)
    if name == "yarn":
        if params.get("factor") is None and data.get("max_position_embeddings") is not None:
            original = params["original_max_position_embeddings"]
            params["factor"] = data["max_position_embeddings"] / original  # DeepSeek-V3's rule
        for key, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
            if key in params and not params[key]:
                params[key] = default  # transformers reads 0 and None as the default
    if name == "longrope" and params.get("factor") is None:
        params.pop("factor", None)
        if data.get("max_position_embeddings") is not None:
            params["max_position_embeddings"] = data["max_position_embeddings"]
    params = {key: value for key, value in params.items() if value is not None}
    return as_rope_scaling({"rope_type": name, **params})[0]


def _rope_type(rope: Mapping[str, Any]) -> str:
    """The ``rope_type`` (or ``type``) of a RoPE parameter dict, one posenc reads."""
    if "rope_type" in rope and "type" in rope and rope["rope_type"] != rope["type"]:
        raise ValueError(
            f"the RoPE parameters have rope_type={rope['rope_type']!r} and type="
            f"{rope['type']!r}; give one"
        )
    kind = rope.get("rope_type", rope.get("type", "default"))
    mrope = [key for key in _MROPE_KEYS if key in rope]
    if mrope:
        raise ValueError(
            f"{mrope[0]}: this config's RoPE is multimodal (M-RoPE, one section of the "
            "frequencies per position axis), which one RopeSpec does not describe"
        )
    if not isinstance(kind, str) or (
        kind not in HF_ROPE_TYPES and posenc_name(kind) not in ROPE_SCALING_SPECS
    ):
        raise ValueError(
            f"rope_type {kind!r} is not one posenc reads from a transformers config; it reads "
            f"{list(HF_ROPE_TYPES)} and {POSENC_PREFIX!r} + a posenc scaling name"
        )
    return kind


POSENC_PREFIX = "posenc_"
"""The prefix of the ``rope_type`` values posenc's own methods have in a transformers
config (``posenc_yarn``, ``posenc_ntk``; :func:`posenc.integrations.transformers.register`)."""


def posenc_name(kind: str) -> str:
    """posenc's scaling name of a transformers ``rope_type`` (``"dynamic"`` ->
    ``"dynamic_ntk"``, ``"posenc_ntk"`` -> ``"ntk"``); other values unchanged.

    Example:
        >>> posenc_name("posenc_dynamic"), posenc_name("yarn")
        ('dynamic_ntk', 'yarn')
    """
    if kind.startswith(POSENC_PREFIX):
        kind = kind[len(POSENC_PREFIX) :]
    return _HF_NAMES.get(kind, kind)


def _original(kind: str, params: dict[str, Any], data: Mapping[str, Any]) -> None:
    """``L0`` as transformers takes it: a top-level one first (Phi-3 keeps it there), then
    the RoPE parameters', then ``max_position_embeddings``."""
    for original in (
        data.get("original_max_position_embeddings"),
        params.get("original_max_position_embeddings"),
        data.get("max_position_embeddings"),
    ):
        if original is not None:
            params["original_max_position_embeddings"] = original
            return
    raise ValueError(
        f"rope_type {kind!r} needs original_max_position_embeddings (or "
        "max_position_embeddings) in the config"
    )


def _dynamic_original(params: dict[str, Any], data: Mapping[str, Any]) -> None:
    """transformers' dynamic NTK takes ``L0`` from ``max_position_embeddings``."""
    length = data.get("max_position_embeddings")
    if length is None:
        raise ValueError("rope_type 'dynamic' needs max_position_embeddings in the config")
    given = params.get("original_max_position_embeddings")
    if given is not None and given != length:
        raise ValueError(
            f"rope_type 'dynamic': original_max_position_embeddings={given} differs from "
            f"max_position_embeddings={length}, which transformers uses as the original "
            "length; give one value"
        )
    params["original_max_position_embeddings"] = length
