"""Typed specs of the schemes: one frozen, validated dataclass per scheme.

A spec holds every option of one positional scheme, checks them once when it is made
(``TypeError``/``ValueError`` naming the value and what is valid), and asks the core for
the scheme's numbers: :meth:`SinusoidalSpec.table`, :meth:`RopeSpec.tables`,
:meth:`AlibiSpec.bias`, :meth:`T5Spec.buckets`, ... Every front end builds its modules and
layers on these specs, so the options are parsed and validated in one place and a
module only moves the numbers onto its framework's device and dtype.

A spec converts to and from a plain dict (``{"scheme": "rope", "head_dim": 64, ...,
"scaling": {"rope_type": "yarn", ...}}``), so it round-trips through JSON, a Keras
``get_config`` and a model config::

    >>> from posenc import YarnScaling
    >>> spec = RopeSpec(head_dim=64, base=500000.0, scaling=YarnScaling(
    ...     factor=4.0, original_max_position_embeddings=2048))
    >>> SchemeSpec.from_dict(spec.to_dict()) == spec
    True

The specs live in :mod:`.base` (the interface), :mod:`.encodings`, :mod:`.rotary`,
:mod:`.biases` and :mod:`.research`; :mod:`.hf` and :mod:`.layers` read Hugging Face
configs. The numbers are in the NumPy container of the format asked for (bfloat16 values
as exact float32; see :data:`posenc.core.precision.CONTAINERS`).
"""

from __future__ import annotations

from .base import SchemeSpec
from .biases import AlibiSpec, T5Spec
from .encodings import LearnedSpec, NopeSpec, NopeTemperatureSpec, SinusoidalNDSpec, SinusoidalSpec
from .layers import LayerSpec, layer_specs_from_hf_config
from .research import CopeSpec, FireSpec, KerpleSpec, SandwichSpec
from .rotary import AxialRopeSpec, RopeSpec, XPosSpec

__all__ = [
    "AlibiSpec",
    "AxialRopeSpec",
    "CopeSpec",
    "FireSpec",
    "KerpleSpec",
    "LayerSpec",
    "LearnedSpec",
    "NopeSpec",
    "NopeTemperatureSpec",
    "RopeSpec",
    "SandwichSpec",
    "SchemeSpec",
    "SinusoidalNDSpec",
    "SinusoidalSpec",
    "T5Spec",
    "XPosSpec",
    "layer_specs_from_hf_config",
]
