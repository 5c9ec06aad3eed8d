"""Exact RoPE tables inside a loaded Hugging Face ``transformers`` model.

:func:`patch` replaces every rotary embedding module of a model (``LlamaRotaryEmbedding``,
``Qwen2RotaryEmbedding``, ``Gemma3RotaryEmbedding``, ...) with an
:class:`ExactRotaryEmbedding` that keeps its interface, ``forward(x, position_ids[,
layer_type]) -> (cos, sin)``, and what it returns (Cohere's interleaved pairs, GPT-OSS's
one column per pair, Llama 4's complex numbers, read from the module's own output:
:mod:`posenc.integrations.transformers_forms`), with posenc's tables: the angles reduced
exactly in float64 and each entry rounded once to the model's dtype, the attention
factor folded in as the model expects. Hugging Face forms the angles ``position ×
inv_freq`` in float32, so its error grows with the position; posenc's stays at the
dtype's rounding. :func:`unpatch` puts the original modules back.

The RoPE of each module comes from its model config through
:meth:`posenc.RopeSpec.from_hf_config` (every ``rope_type`` posenc reads, per layer type
where the config has several), and the replacement is compared with the module at
positions 0..15 before anything is replaced: a rotary module posenc cannot reproduce
(an M-RoPE layout it does not know, a class without a config or with learned state, a
forward of another kind, a config read otherwise) is an error naming its class.

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

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from .._checks import check_choice, describe  # noqa: E402
from ..core.plan import plan_call  # noqa: E402
from ..core.precision import CONTAINERS  # noqa: E402
from ..core.rope import ROPE_SCALING_SPECS  # noqa: E402
from ..specs import AxialRopeSpec, RopeSpec  # noqa: E402
from ..specs.hf import POSENC_PREFIX  # noqa: E402
from ..torch import RotaryEmbedding  # noqa: E402
from ..torch._arguments import positions_range  # noqa: E402
from ..torch._backend import FORMATS, format_of, gather_rows, to_tensor  # noqa: E402
from ..torch._tables import table_dtype  # noqa: E402
from .transformers_cache import (  # noqa: E402
    CACHE_MODES,
    CacheKeeper,
    SinkCache,
    cache_owner,
    keep_caches,
)
from .transformers_forms import Form, RotaryProbe  # noqa: E402

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
# Position ids the decoding fast path gathers with (anything else: the full path's checks).
_INDEX_DTYPES = (torch.int64, torch.int32)


class ExactRotaryEmbedding(nn.Module):
    """A ``transformers`` rotary module's interface over posenc's exact tables.

    ``forward(x, position_ids, layer_type=None)`` returns what the module it replaces
    returns, in the same form (:mod:`~posenc.integrations.transformers_forms`, read from
    the module's own output): ``(cos, sin)``, each ``(batch, seq, rotary_dim)`` with the
    pairs in halves (Llama and most) or interleaved (Cohere), or ``(batch, seq,
    rotary_dim / 2)`` one per pair (GPT-OSS), or complex ``cos + i sin`` (Llama 4); in
    ``x``'s dtype (or float32 for a 16-bit ``x`` where the module returns float32),
    rounded once from the exact values, with the attention factor folded in.
    Length-dependent scalings (dynamic NTK, LongRoPE) follow the largest position of each
    call, as Hugging Face's ``dynamic_rope_update`` does.

    Before it is used, its output at positions 0..15 is compared with the module's,
    element by element: a module posenc cannot reproduce is a ``ValueError`` naming it.

    Args:
        original: The rotary module replaced; its ``config`` gives the RoPE. It is kept
            (not as a submodule) for :func:`unpatch`, and its other plain attributes
            (``layer_types``, ...) read through this module, as a model's code reads them.
    """

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        name = type(original).__name__
        config = getattr(original, "config", None)
        if config is None:
            raise ValueError(f"{name} has no config to read its RoPE from; posenc cannot patch it")
        rope_type = getattr(original, "rope_type", None)
        layer_types = list(rope_type) if isinstance(rope_type, dict) else [None]
        self.mrope = _mrope_spec(original, name, config)
        probe = RotaryProbe(
            original, layer_types, None if self.mrope is None else self.mrope.n_axes
        )
        specs = {} if self.mrope is not None else _specs(config, layer_types, name)
        widths = {t: int(spec.rotary_dim or 0) for t, spec in specs.items()}
        self.form: Form = probe.form(widths or {None: getattr(self.mrope, "head_dim", 0)})
        if self.mrope is not None and self.form != "half":
            raise ValueError(f"posenc cannot patch {name}: an M-RoPE module of form {self.form}")
        self.widen = probe.widen  # float32 for a 16-bit input, as the module returns
        layout = "interleaved" if self.form == "interleaved" else "half"
        self.ropes = nn.ModuleDict(
            {
                _key(layer_type): RotaryEmbedding.from_spec(
                    dataclasses.replace(spec, layout=layout), max_length=_INITIAL_ROWS
                )
                for layer_type, spec in specs.items()
            }
        )
        self.config = config
        # (layer_type, dtype, device) -> the (cos, sin) tables a call may gather from
        self._gather_from: dict[tuple[str | None, torch.dtype, torch.device], Any] = {}
        self.rope_type = rope_type
        self.original_class = name
        self.keeper: CacheKeeper | None = None  # set by patch()
        object.__setattr__(self, "_original", original)  # not a submodule: not in state_dict()
        probe.check(self, lambda layer_type: self._describe(specs.get(layer_type)))
        self.to(_device_of(original))

    def __getattr__(self, name: str) -> Any:
        """The original module's plain attributes (``layer_types``, ``mrope_section``):
        a model's code reads them from its rotary module."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            value = vars(self.__dict__.get("_original", self)).get(name)
            if name.startswith("_") or value is None or isinstance(value, (Tensor, nn.Module)):
                raise
            return value

    def _describe(self, spec: RopeSpec | None) -> str:
        if spec is None:
            assert self.mrope is not None
            return f"M-RoPE {self.mrope.to_dict()}"
        scaling = spec.scaling.to_dict()
        return (
            f"head_dim={spec.head_dim}, rotary_dim={spec.rotary_dim}, base={spec.base:g}, "
            f"scaling {scaling}"
        )

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
            # The decoding case: the call's plan says whether the rows are in the tables
            # built (of a fixed scaling), and then they are two row gathers (the tables
            # need no autograd); anything else (rows to grow or compute) takes the full path.
            span = positions_range(position_ids, self.original_class)
            if span is not None:
                plan = plan_call(
                    int(tables[0].shape[0]),
                    low=span[0],
                    high=span[1],
                    count=position_ids.shape[-1],
                )
                if plan.in_table:
                    cos, sin = tables
                    rows = gather_rows(cos, position_ids), gather_rows(sin, position_ids)
                    return self._shaped(*rows)
        with torch.no_grad():
            return self._forward(x, position_ids, layer_type)

    def _shaped(self, cos: Tensor, sin: Tensor) -> Any:
        """``(cos, sin)`` in this module's form (the tables are in its layout already)."""
        if self.form == "pairs":
            return cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]
        if self.form == "complex":
            pairs = cos.shape[-1] // 2
            return torch.complex(cos[..., :pairs], sin[..., :pairs])
        return cos, sin

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
        # complex: float32 parts, or float64; widened: float32 for a 16-bit input
        wide = self.form == "complex" or self.widen
        dtype = table_dtype(x.dtype, "rotation") if wide else x.dtype
        # with a cache, a length-dependent scaling sees every key attended (the keeper's)
        length = None
        if self.keeper is not None and rope.spec.scaling.length_dependent:
            length = self.keeper.attended
        cos, sin = rope.cos_sin(positions, dtype=dtype, length=length)
        if cos.device != x.device:
            cos, sin = cos.to(x.device), sin.to(x.device)
        elif (
            x.device.type == "cpu"
            and position_ids.dim() == 2
            and not rope.spec.scaling.length_dependent
            and dtype in FORMATS
            and self.form != "complex"
        ):  # the tables cos_sin gathered from, for the next call's fast path
            self._gather_from[(layer_type, x.dtype, x.device)] = rope._tables_in(dtype, x.device)
        return self._shaped(cos, sin)

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
        tables = self.mrope.tables(coords, fmt=fmt)  # bfloat16: NumPy's, held exactly in float32
        cos, sin = (to_tensor(np.asarray(t, CONTAINERS[fmt]), fmt, x.device) for t in tables)
        return cos, sin

    def extra_repr(self) -> str:
        kind = f"M-RoPE {self.mrope.mode}" if self.mrope is not None else f"{list(self.ropes)}"
        return f"replaces {self.original_class}, {kind}"


def _mrope_spec(original: nn.Module, name: str, config: Any) -> AxialRopeSpec | None:
    """The M-RoPE of a multimodal rotary module (``(3, batch, seq)`` position ids), or
    ``None`` for a module of one position axis."""
    if not hasattr(original, "mrope_section"):
        return None
    if name not in _MROPE_INTERLEAVED:
        raise ValueError(
            f"posenc cannot patch {name}: an M-RoPE module of a layout posenc does "
            f"not know (it knows {sorted(_MROPE_INTERLEAVED)})"
        )
    try:
        return AxialRopeSpec.from_hf_config(
            config,
            interleaved=_MROPE_INTERLEAVED[name],
            sections=list(vars(original)["mrope_section"]),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"posenc cannot patch {name}: {exc}") from None


def _specs(config: Any, layer_types: list[str | None], name: str) -> dict[str | None, RopeSpec]:
    """The RoPE of each layer type the module takes, from the config."""
    specs = {}
    for layer_type in layer_types:
        try:
            specs[layer_type] = RopeSpec.from_hf_config(config, layer_type=layer_type)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"posenc cannot patch {name}: {exc}") from None
    return specs


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

    Every module is checked before any is replaced (its replacement's output at
    positions 0..15 against its own, element by element): a rotary module posenc cannot
    reproduce is a ``ValueError`` naming its class and why, and the model is left as it
    was. A model with no rotary module is a ``ValueError`` naming the model's class.
    Patching again keeps the modules already patched (and sets ``on_frequency_change``).

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
    owners = _cache_owners(model, replacements)
    for name, replacement in replacements.items():
        _set_submodule(model, name, replacement)
    for owner, modules in owners.items():
        keep_caches(model.get_submodule(owner), modules, on_frequency_change)
    return model


def _cache_owners(
    model: nn.Module, replacements: dict[str, ExactRotaryEmbedding]
) -> dict[str, list[ExactRotaryEmbedding]]:
    """The rotary modules (M-RoPE aside) by the module that takes the cache and the tokens
    above them: the nearest whose forward takes ``input_ids`` or ``inputs_embeds``
    (``model.model`` in most models; Moshi's rotary modules sit in every attention
    layer), else the parent. One owner's modules must rotate alike: its hooks turn every
    layer's cached keys (a ``ValueError`` before anything is replaced otherwise)."""
    owners: dict[str, list[ExactRotaryEmbedding]] = {}
    for name, module in replacements.items():
        if module.mrope is None:
            owners.setdefault(cache_owner(model, name), []).append(module)
    names = {id(module): name for name, module in replacements.items()}
    for owner, modules in owners.items():
        specs = [{key: rope.spec for key, rope in m.ropes.items()} for m in modules]
        other = next((i for i, spec in enumerate(specs) if spec != specs[0]), None)
        if other is not None:
            raise ValueError(
                f"posenc cannot patch {type(model).__name__}: the rotary modules under "
                f"{owner or 'the model'} rotate differently ({names[id(modules[0])]!r}: "
                f"{specs[0]}; {names[id(modules[other])]!r}: {specs[other]}), and posenc "
                "keeps one rotation per model's cache"
            )
    return owners


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
