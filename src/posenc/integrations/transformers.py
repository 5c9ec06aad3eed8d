"""Exact RoPE tables inside a loaded Hugging Face ``transformers`` model.

:func:`patch` replaces every rotary embedding module of a model (``LlamaRotaryEmbedding``,
``Qwen2RotaryEmbedding``, ``Gemma3RotaryEmbedding``, ...) with an
:class:`ExactRotaryEmbedding` that keeps its interface, ``forward(x, position_ids[,
layer_type]) -> (cos, sin)``, and returns posenc's tables: the angles reduced exactly in
float64 and each entry rounded once to the model's dtype, the attention factor folded in
as the model expects. Hugging Face forms the angles ``position × inv_freq`` in float32,
so its error grows with the position; posenc's stays at the dtype's rounding.
:func:`unpatch` puts the original modules back.

The RoPE of each module comes from its model config through
:meth:`posenc.RopeSpec.from_hf_config` (every ``rope_type`` posenc reads, per layer type
where the config has several); a rotary module posenc cannot describe (multimodal
M-RoPE, a class without a config) is an error naming its class, before anything is
replaced.

Example::

    model = AutoModelForCausalLM.from_pretrained(...)
    posenc.integrations.transformers.patch(model)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._extras import require

require("torch", "posenc.integrations.transformers", extra="posenc[transformers]")
require("transformers", "posenc.integrations.transformers", extra="posenc[transformers]")

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from .._checks import check_choice, describe  # noqa: E402
from ..core.plan import plan_rows  # noqa: E402
from ..core.rope import ROPE_SCALING_SPECS  # noqa: E402
from ..specs import AxialRopeSpec, RopeSpec  # noqa: E402
from ..specs.hf import POSENC_PREFIX  # noqa: E402
from ..torch import RotaryEmbedding  # noqa: E402
from ..torch._arguments import positions_range  # noqa: E402
from ..torch._backend import FORMATS, format_of, gather_rows, to_tensor  # noqa: E402
from ..torch._tables import table_dtype  # noqa: E402
from .transformers_cache import CACHE_MODES, CacheKeeper, SinkCache  # noqa: E402

__all__ = [
    "ExactRotaryEmbedding",
    "SinkCache",
    "patch",
    "register",
    "rotary_modules",
    "unpatch",
    "unregister",
]

_INITIAL_ROWS = 4096  # rows built at first; the tables grow to the positions a call needs
# The multimodal rotary modules posenc knows, by class: how they lay out the sections.
_MROPE_INTERLEAVED = {
    "Qwen2VLRotaryEmbedding": False,
    "Qwen2_5_VLRotaryEmbedding": False,
    "Qwen3VLTextRotaryEmbedding": True,
    "Qwen3VLMoeTextRotaryEmbedding": True,
}
# Rotary modules that return complex ``cos + i sin`` per pair (Llama 4's ``freqs_cis``).
_COMPLEX = {"Llama4TextRotaryEmbedding"}
# Position ids the decoding fast path gathers with (anything else: the full path's checks).
_INDEX_DTYPES = (torch.int64, torch.int32)


class ExactRotaryEmbedding(nn.Module):
    """A ``transformers`` rotary module's interface over posenc's exact tables.

    ``forward(x, position_ids, layer_type=None)`` returns ``(cos, sin)``, each
    ``(batch, seq, rotary_dim)`` in ``x``'s dtype (rounded once from the exact values),
    with the attention factor folded in, in Hugging Face's half layout (models that
    rotate interleaved pairs, such as DeepSeek-V3, permute their queries and keys
    themselves). Length-dependent scalings (dynamic NTK, LongRoPE) follow the largest
    position of each call, as Hugging Face's ``dynamic_rope_update`` does.

    Args:
        original: The rotary module replaced; its ``config`` gives the RoPE. It is kept
            (not as a submodule) for :func:`unpatch`.
    """

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        name = type(original).__name__
        config = getattr(original, "config", None)
        if config is None:
            raise ValueError(f"{name} has no config to read its RoPE from; posenc cannot patch it")
        rope_type = getattr(original, "rope_type", None)
        layer_types = list(rope_type) if isinstance(rope_type, dict) else [None]
        device = _device_of(original)
        self.ropes = nn.ModuleDict()
        self.mrope: AxialRopeSpec | None = None
        if hasattr(original, "mrope_section"):  # multimodal: (3, batch, seq) position ids
            if name not in _MROPE_INTERLEAVED:
                raise ValueError(
                    f"posenc cannot patch {name}: an M-RoPE module of a layout posenc does "
                    f"not know (it knows {sorted(_MROPE_INTERLEAVED)})"
                )
            try:
                self.mrope = AxialRopeSpec.from_hf_config(
                    config,
                    interleaved=_MROPE_INTERLEAVED[name],
                    sections=list(vars(original)["mrope_section"]),
                )
            except (TypeError, ValueError) as exc:
                raise ValueError(f"posenc cannot patch {name}: {exc}") from None
            layer_types = []
        for layer_type in layer_types:
            try:
                spec = RopeSpec.from_hf_config(config, layer_type=layer_type)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"posenc cannot patch {name}: {exc}") from None
            spec = dataclasses.replace(spec, layout="half")  # the model applies its layout
            self.ropes[_key(layer_type)] = RotaryEmbedding.from_spec(
                spec, max_length=_INITIAL_ROWS
            ).to(device)
        self.config = config
        # (layer_type, dtype, device) -> the (cos, sin) tables a call may gather from
        self._gather_from: dict[tuple[str | None, torch.dtype, torch.device], Any] = {}
        self.complex = name in _COMPLEX
        self.rope_type = rope_type
        self.original_class = name
        self.keeper: CacheKeeper | None = None  # set by patch()
        object.__setattr__(self, "_original", original)  # not a submodule: not in state_dict()

    @property
    def original(self) -> nn.Module:
        """The module this one replaced."""
        original: nn.Module = self.__dict__["_original"]
        return original

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None = None) -> Any:
        self._check_call(x, position_ids, layer_type)
        tables = self._gather_from.get((layer_type, x.dtype, x.device))
        if (
            tables is not None
            and position_ids.dim() == 2
            and position_ids.dtype in _INDEX_DTYPES
            and position_ids.device == tables[0].device
            and not torch.compiler.is_compiling()
        ):
            # The decoding case: the planner says whether the rows are in the tables
            # built, and then they are two row gathers (the tables need no autograd);
            # anything else (rows to grow or compute) takes the full path.
            span = positions_range(position_ids, self.original_class)
            if span is not None:
                plan = plan_rows(
                    int(tables[0].shape[0]),
                    low=span[0],
                    high=span[1],
                    count=position_ids.numel(),
                )
                if plan.action == "gather":
                    cos, sin = tables
                    return gather_rows(cos, position_ids), gather_rows(sin, position_ids)
        with torch.no_grad():
            return self._forward(x, position_ids, layer_type)

    def _check_call(self, x: Any, position_ids: Any, layer_type: Any) -> None:
        """``x`` a floating tensor, ``position_ids`` an integer tensor of a shape this
        module takes, ``layer_type`` None or a str (errors that name them, rather than
        PyTorch's from inside)."""
        name = self.original_class
        if layer_type is not None and not isinstance(layer_type, str):
            raise TypeError(f"{name}: layer_type must be None or a str, got {describe(layer_type)}")
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(
                f"{name}: x must be a floating-point tensor (the tables take its dtype and "
                f"device), got {describe(x)}"
            )
        if (
            not isinstance(position_ids, Tensor)
            or position_ids.is_floating_point()
            or position_ids.is_complex()
            or position_ids.dtype == torch.bool
        ):
            raise TypeError(
                f"{name}: position_ids must be an integer tensor, got {describe(position_ids)}"
            )
        if self.mrope is None:
            fits, shapes = position_ids.dim() in (1, 2), "(batch, seq) or (seq,)"
        else:
            axes = self.mrope.n_axes
            fits = position_ids.dim() == 2 or (
                position_ids.dim() == 3 and position_ids.shape[0] in (1, axes)
            )
            shapes = f"({axes}, batch, seq) or (batch, seq)"
        if not fits:
            raise ValueError(
                f"{name}: position_ids must have shape {shapes}, got {tuple(position_ids.shape)}"
            )

    def _forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None) -> Any:
        if self.mrope is not None:
            return self._mrope_forward(x, position_ids)
        rope = self.ropes._modules.get(_key(layer_type))
        if rope is None:
            raise ValueError(
                f"{self.original_class}: layer_type must be one of "
                f"{[k for k in self.ropes if k != _key(None)] or [None]}, got {layer_type!r}"
            )
        assert isinstance(rope, RotaryEmbedding)
        positions = position_ids if position_ids.dim() == 2 else position_ids[None]
        if self.complex:  # one complex number per pair: float32 parts, or float64
            wide = table_dtype(x.dtype, "rotation")
            cos, sin = rope.cos_sin(positions, dtype=wide)
            pairs = cos.shape[-1] // 2
            return torch.complex(cos[..., :pairs], sin[..., :pairs]).to(x.device)
        cos, sin = rope.cos_sin(positions, dtype=x.dtype)
        if cos.device != x.device:
            cos, sin = cos.to(x.device), sin.to(x.device)
        elif (
            x.device.type == "cpu"
            and position_ids.dim() == 2
            and not rope.spec.scaling.length_dependent
            and x.dtype in FORMATS
        ):  # the tables cos_sin gathered from, for the next call's fast path
            self._gather_from[(layer_type, x.dtype, x.device)] = rope._tables_in(x.dtype, x.device)
        return cos, sin

    def _apply(self, fn: Any, recurse: bool = True) -> ExactRotaryEmbedding:
        self._gather_from = {}  # .to(), .double(), ...: the tables move or change dtype
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        return self

    def _mrope_forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """M-RoPE: ``position_ids`` ``(3, batch, seq)`` (or ``(batch, seq)``, the same
        position on every axis); each pair turns with its section's axis."""
        assert self.mrope is not None
        positions = position_ids.expand(self.mrope.n_axes, *position_ids.shape[-2:])
        coords = positions.detach().cpu().numpy().transpose(1, 2, 0)  # (batch, seq, axes)
        fmt = format_of(x.dtype, "the input's dtype")
        cos, sin = self.mrope.tables(coords, fmt=fmt)
        return to_tensor(cos, fmt, x.device), to_tensor(sin, fmt, x.device)

    def _keep_caches(self, model: nn.Module, name: str, mode: str) -> None:
        """Hook the module that owns this one (its forward takes the cache) so that the
        model's caches stay exact (:class:`CacheKeeper`); M-RoPE is not hooked."""
        if self.keeper is not None:
            self.keeper.mode = mode
            return
        if self.mrope is not None:
            return
        parent = name.rpartition(".")[0]
        self.keeper = CacheKeeper(self.ropes, self.config, mode)
        self.keeper.attach(model.get_submodule(parent) if parent else model)

    def extra_repr(self) -> str:
        kind = f"M-RoPE {self.mrope.mode}" if self.mrope is not None else f"{list(self.ropes)}"
        return f"replaces {self.original_class}, {kind}"


def _key(layer_type: str | None) -> str:
    return "all" if layer_type is None else layer_type


def _device_of(module: nn.Module) -> torch.device:
    for tensor in (*module.buffers(), *module.parameters()):
        return tensor.device
    return torch.device("cpu")


def rotary_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The rotary embedding modules of ``model``'s language model (by qualified name):
    those whose class name ends in ``RotaryEmbedding`` (posenc's own replacements
    included). A vision encoder's rotary module (``Qwen2VLVisionRotaryEmbedding``,
    ``Llama4VisionRotaryEmbedding``, ...: a class name with ``Vision``) is not one of
    them: its positions are patch coordinates within one image, where float32 angles are
    already exact to float32's rounding, and it stays as it is."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {describe(model)}")
    return [
        (name, module)
        for name, module in model.named_modules()
        if type(module).__name__.endswith("RotaryEmbedding")
        and "Vision" not in type(module).__name__
        and not isinstance(module, RotaryEmbedding)
    ]


def patch(model: nn.Module, *, on_frequency_change: str = "rerotate") -> nn.Module:
    """Replace every rotary embedding module of ``model`` with an
    :class:`ExactRotaryEmbedding`; returns ``model`` (changed in place).

    Every module is checked before any is replaced: a rotary module posenc cannot
    describe is a ``ValueError`` naming its class, and the model is left as it was. A
    model with no rotary module is a ``ValueError`` naming the model's class. Patching
    again keeps the modules already patched (and sets ``on_frequency_change``).

    The model's caches are kept exact (:mod:`posenc.integrations.transformers_cache`):
    with ``on_frequency_change="rerotate"`` (default) the cached keys are re-rotated when
    a length-dependent scaling's frequencies change (dynamic NTK, LongRoPE), so that
    decoding with the model's own cache, ``generate()`` included, equals the
    full-sequence call; ``"keep"`` leaves them, as transformers does. A
    :class:`SinkCache` evicts tokens and moves the keys kept.
    """
    check_choice(on_frequency_change, "on_frequency_change", CACHE_MODES)
    found = rotary_modules(model)
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no rotary embedding module (a class named "
            "...RotaryEmbedding) to patch"
        )
    replacements = {
        name: module if isinstance(module, ExactRotaryEmbedding) else ExactRotaryEmbedding(module)
        for name, module in found
    }
    for name, replacement in replacements.items():
        _set_submodule(model, name, replacement)
        replacement._keep_caches(model, name, on_frequency_change)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Put back the modules :func:`patch` replaced (on the device of their replacement);
    returns ``model``."""
    for name, module in rotary_modules(model):
        if isinstance(module, ExactRotaryEmbedding):
            if module.keeper is not None:
                module.keeper.detach()
                module.keeper = None
            original = module.original.to(_device_of(module))
            _set_submodule(model, name, original)
    return model


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def register() -> list[str]:
    """Add posenc's RoPE methods to ``transformers``' ``ROPE_INIT_FUNCTIONS``.

    Each registered posenc scaling (built-in or added with
    :func:`posenc.register_rope_scaling`) becomes the rope type ``"posenc_<name>"``
    (``"posenc_dynamic"`` for dynamic NTK, so that transformers' ``dynamic_rope_update``
    recomputes it per length): a config with that ``rope_type`` gets its inverse
    frequencies from posenc (exact in float64, rounded once to float32) and its attention
    factor, for the methods transformers lacks (``posenc_ntk``) and as an exact
    alternative to the ones it has. The angles are still formed by the model in float32;
    :func:`patch` is what makes them exact. Returns the rope types added.

    Asked at a ``seq_len``, each length-dependent method follows its own rule, as its
    transformers function does: dynamic NTK never goes below its original length
    (``max_position_embeddings``), LongRoPE takes the long factors only past
    ``original_max_position_embeddings``, and a method a user registers gets the length
    as it is. transformers' rotary modules switch LongRoPE's factors only for their own
    ``"longrope"``: a model configured with ``"posenc_longrope"`` switches once patched
    (:func:`patch`).

    Example::

        register()
        config = LlamaConfig(..., rope_parameters={"rope_type": "posenc_ntk", "factor": 4.0})
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    added = []
    for name in ROPE_SCALING_SPECS:
        kind = POSENC_PREFIX + ("dynamic" if name == "dynamic_ntk" else name)
        ROPE_INIT_FUNCTIONS[kind] = _init_function
        added.append(kind)
    return added


def unregister() -> list[str]:
    """Remove the rope types :func:`register` added; returns them."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    removed = [kind for kind, fn in ROPE_INIT_FUNCTIONS.items() if fn is _init_function]
    for kind in removed:
        del ROPE_INIT_FUNCTIONS[kind]
    return removed


def _init_function(
    config: Any,
    device: Any = None,
    seq_len: int | None = None,
    layer_type: str | None = None,
    **_: Any,
) -> tuple[Tensor, float]:
    """A ``ROPE_INIT_FUNCTIONS`` entry: ``(inv_freq, attention_factor)`` of the config."""
    spec = RopeSpec.from_hf_config(config, layer_type=layer_type)
    # each method's own length rule (its frequencies(seq_len)); a fixed method takes none.
    # A length of 0 is no length, as for Hugging Face (`if seq_len and ...`): the
    # frequencies of the original context.
    length = int(seq_len) if seq_len and spec.scaling.length_dependent else None
    inv_freq, attention = spec.frequencies(length)
    return torch.tensor(inv_freq, dtype=torch.float32, device=device), float(attention)
