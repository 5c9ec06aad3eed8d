"""Rotary position embedding (RoPE): frequencies, scaling registry, exact tables, rotation.

RoPE (Su et al., 2021) rotates each pair of query/key features by the angle
``position × θ_i`` with ``θ_i = base^(-2i/d)``, ``i = 0 .. d/2 - 1``, where ``d`` is the
rotary width (``rotary_dim``, the whole head or its first part). Scaled variants change
the ``θ_i`` (and sometimes multiply the tables by an ``attention_factor``). Each is a
frozen, validated spec (:mod:`.methods`: :class:`YarnScaling`, ...) registered by name
(:mod:`.registry`: :data:`ROPE_SCALING_SPECS`, :func:`register_rope_scaling`); a spec's
``frequencies(rotary_dim, base, seq_len=None)`` gives ``(inv_freq, attention_factor)``:
float64 of shape ``(rotary_dim // 2,)`` and the factor Hugging Face multiplies the
cos/sin tables by (1.0 where a method has none). :data:`ROPE_SCALINGS` offers the same
methods as functions of one signature::

    fn(head_dim, base=10000.0, *, rotary_dim=None, **params) -> (inv_freq, attention_factor)

Every method is tested against Hugging Face ``transformers`` (``ROPE_INIT_FUNCTIONS``,
and the models' ``compute_default_rope_parameters`` for ``"default"``) up to the float32
rounding those functions compute in; the values here are float64.

The package's modules: :mod:`.frequencies` (``base^(-2i/d)``), :mod:`.scaling` (the
spec interface), :mod:`.methods` (the built-in methods), :mod:`.registry` (names and
the option parser), :mod:`.functions` (the methods as functions), :mod:`.tables` (exact
cos/sin tables) and :mod:`.rotation` (applying them, converting layouts).

Two layouts of the feature pairs are in use, and :func:`rope_permutation` converts:

``"half"``
    Feature ``j`` pairs with ``j + d/2`` (``rotate_half``): GPT-NeoX, Hugging Face,
    keras-hub. Tables are ``[θ_0 .. θ_{d/2-1}, θ_0 .. θ_{d/2-1}]``.
``"interleaved"``
    Feature ``2i`` pairs with ``2i + 1`` (complex multiplication): Meta's Llama
    reference code, torchtune, GPT-J. Tables are ``[θ_0, θ_0, θ_1, θ_1, ...]``.

Same name, different maths (keras-hub: ``keras_hub/src/layers/modeling/rotary_embedding.py``
as of the version with ``rope_type``; vLLM: its API reference):

* ``"linear"`` here and in Hugging Face divides every ``θ_i`` by ``factor``, which is
  the same as dividing positions by ``factor``. That is what keras-hub's
  ``RotaryEmbedding(scaling_factor=...)`` does with its default ``rope_type="linear"``
  (documented as "the scaling factor used to scale positions of the tokens"); with its
  other ``rope_type`` values the same argument is those methods' factor.
* ``"dynamic_ntk"`` here is Hugging Face's ``"dynamic"``: the NTK base change
  ``base · (factor·L/L₀ - (factor - 1))^(d/(d-2))`` evaluated at the current sequence
  length ``L`` (no change while ``L <= L₀``). keras-hub's ``RotaryEmbedding`` also has a
  ``rope_type="dynamic"``, but it divides *every* inverse frequency by
  ``scaling_factor^(d/(d-2))``: a linear scaling by that number, independent of the
  sequence length and not a base change. vLLM's ``DynamicNTKScalingRotaryEmbedding``
  evaluates Hugging Face's formula once, at ``L = factor · L₀``, for every length; that
  is ``dynamic_ntk(..., seq_len=factor * L0)`` here.
* ``"ntk"`` (static NTK-aware scaling, base ``base · factor^(d/(d-2))``) is not in
  Hugging Face's registry; it equals Hugging Face's ``"dynamic"`` at the length where
  ``factor_hf · L/L₀ - (factor_hf - 1) = factor``.
* ``"yarn"``: keras-hub's ``rope_type="yarn"`` defaults to ``truncate=False`` (Hugging
  Face: ``True``), clamps the ramp's upper end at ``d/2 - 1`` (Hugging Face: ``d - 1``),
  always uses ``0.1 ln(factor) + 1`` as attention factor (no ``mscale`` options) and,
  with ``truncate=True``, clips the *positions* at ``original_max_position_embeddings``.
  The functions here follow Hugging Face.

Tables (:func:`rope_tables`) are exact at any position; see :mod:`.tables`. Keys already
rotated move to new frequencies or positions with :func:`rerotation_tables` (:mod:`.rerotation`).

References:
    Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
    kaiokendev, "Things I'm learning while training SuperHOT" (linear interpolation), 2023;
    bloc97, "NTK-Aware Scaled RoPE" (Reddit r/LocalLLaMA), 2023;
    Peng et al., "YaRN: Efficient Context Window Extension of Large Language Models", 2023;
    Meta, Llama 3.1 ``apply_scaling`` (``llama3``), 2024;
    Ding et al., "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens", 2024;
    Hugging Face ``transformers/modeling_rope_utils.py``.
"""

from .frequencies import check_rotary_dim, rope_frequencies
from .functions import ROPE_SCALINGS, rope_scaling
from .learned import learned_rope_frequencies
from .methods import (
    DefaultScaling,
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    YarnScaling,
)
from .proportional import ProportionalScaling
from .registry import (
    DEFAULT_BASE,
    ROPE_SCALING_SPECS,
    as_rope_scaling,
    register_rope_scaling,
    rope_options,
    rope_scaling_spec,
    unregister_rope_scaling,
)
from .rerotation import rerotation_table_values, rerotation_tables
from .rotation import QK_AXES, apply_rope, check_qk_shapes, check_rope_shapes, rope_permutation
from .scaling import RopeScaling
from .tables import (
    ROPE_LAYOUTS,
    RopeLayout,
    check_inv_freq,
    pair_layout,
    rope_table_values,
    rope_tables,
)

__all__ = [
    "DEFAULT_BASE",
    "QK_AXES",
    "ROPE_LAYOUTS",
    "ROPE_SCALINGS",
    "ROPE_SCALING_SPECS",
    "DefaultScaling",
    "DynamicNTKScaling",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "NTKScaling",
    "ProportionalScaling",
    "RopeLayout",
    "RopeScaling",
    "YarnScaling",
    "apply_rope",
    "as_rope_scaling",
    "check_inv_freq",
    "check_qk_shapes",
    "check_rope_shapes",
    "check_rotary_dim",
    "learned_rope_frequencies",
    "pair_layout",
    "register_rope_scaling",
    "rerotation_table_values",
    "rerotation_tables",
    "rope_frequencies",
    "rope_options",
    "rope_permutation",
    "rope_scaling",
    "rope_scaling_spec",
    "rope_table_values",
    "rope_tables",
    "unregister_rope_scaling",
]
