"""The probes of a context-extension evaluation, and the grid that makes them.

A :class:`Probe` is one measurement: one model, one RoPE scaling, one task (``"passkey"``
or ``"perplexity"``) at one length (and, for a passkey, one depth and one trial). It is a
:class:`posenc.bench.workers.Job`, so the bench's executors run probes as they run bench
runs (in this process, or as Ray tasks) and the bench's results files keep them: one JSON
line per finished probe, keyed by :meth:`Probe.key`, so that an interrupted evaluation
resumes where it stopped.

:func:`parse_scaling` reads the scalings as a user names them (``"yarn"``,
``"yarn:factor=8"``, ``"none"``, ``"model"``) into posenc's RoPE scaling of the model's
context, and :func:`parse_length` the lengths (``"2x"``: twice the model's context, or a
number of tokens). Nothing here imports PyTorch or ``transformers``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .._checks import check_choice, check_int, describe
from ..core.rope import ROPE_SCALING_SPECS, RopeScaling, as_rope_scaling

__all__ = [
    "DEFAULT_SCALINGS",
    "TASKS",
    "Probe",
    "parse_length",
    "parse_scaling",
    "scaling_label",
]

#: What a probe measures: passkey retrieval (a key hidden in filler text at a depth,
#: asked for at the end, greedy decoding) or perplexity on a window of long text.
TASKS = ("passkey", "perplexity")

#: The scalings evaluated when none are named: the model unscaled, then each method that
#: needs only a factor and the model's context (LongRoPE needs factors the model was
#: fine-tuned with, and is offered only for a model that has them: ``"model"``).
DEFAULT_SCALINGS = ("none", "linear", "ntk", "dynamic_ntk", "yarn", "llama3")

# The names a user may give beside the registered scalings: the model's RoPE without any
# scaling, and the model's RoPE as its config gives it.
_NONE, _MODEL = "none", "model"
_DTYPES = ("float32", "bfloat16", "float16")
# Parameters a method requires beyond a factor and the context, where one value is the
# norm: Llama 3.1's (Meta's config.json: low_freq_factor 1, high_freq_factor 4).
_DEFAULTS = {"llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0}}
_LENGTH = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*[x×]\s*", re.IGNORECASE)
MAX_LENGTH = 1 << 24  # tokens in one probe: far past what a model's attention can hold


def scaling_label(name: str, rope: Mapping[str, Any]) -> str:
    """A scaling in a few characters: ``"yarn ×4"``, ``"none"``, ``"model (longrope)"``.

    Example:
        >>> scaling_label("yarn", {"rope_type": "yarn", "factor": 4.0})
        'yarn ×4'
        >>> scaling_label("yarn:beta_fast=16", {"rope_type": "yarn", "factor": 2.0})
        'yarn:beta_fast=16 ×2'
    """
    factor = rope.get("factor")
    if name == _MODEL:
        return f"model ({rope.get('rope_type', 'default')})"
    return f"{name} ×{factor:g}" if isinstance(factor, (int, float)) else name


def parse_scaling(
    text: Any, *, context: int, factor: float, own: Mapping[str, Any]
) -> tuple[str, dict[str, Any]]:
    """A scaling as a user names it, as ``(name, posenc scaling dict)``.

    Args:
        text: ``"none"`` (the model's RoPE with no scaling), ``"model"`` (its RoPE as its
            config gives it), or a registered scaling's name (:data:`ROPE_SCALING_SPECS`:
            ``"linear"``, ``"ntk"``, ``"dynamic_ntk"`` or ``"dynamic"``, ``"yarn"``,
            ``"llama3"``, ``"longrope"``, ``"proportional"``, any registered one)
            optionally followed by ``:key=value,...`` parameters (``"yarn:factor=8"``,
            ``"llama3:low_freq_factor=2,high_freq_factor=8"``).
        context: The model's context (``original_max_position_embeddings``): a method
            that takes it gets it.
        factor: The factor of a method that takes one and is given none. Llama 3's
            frequency bands, when not given, are Llama 3.1's (``low_freq_factor=1``,
            ``high_freq_factor=4``).
        own: The model's own scaling (its config's, as posenc's dict): ``"longrope"``
            takes its factors, and only a model that has them may be asked for it.

    Returns:
        ``(name, scaling)``: ``name`` is ``text`` with ``dynamic`` read as
        ``dynamic_ntk``; ``scaling`` is the validated ``RopeScaling.to_dict()``.

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: An unknown scaling or parameter, a value that is not a number, or
            an invalid scaling (the method's own error).

    Example:
        >>> parse_scaling("yarn", context=8192, factor=4.0, own={"rope_type": "default"})
        ('yarn', {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 8192})
        >>> parse_scaling("linear:factor=2", context=8192, factor=4.0, own={})
        ('linear:factor=2', {'rope_type': 'linear', 'factor': 2.0})
    """
    if not isinstance(text, str):
        raise TypeError(f"a scaling must be a str such as 'yarn' or 'yarn:factor=8', got "
                        f"{describe(text)}")  # fmt: skip
    method, _, rest = text.strip().partition(":")
    method = "dynamic_ntk" if method == "dynamic" else method
    name = method + (f":{rest}" if rest else "")
    choices = [_NONE, _MODEL, *ROPE_SCALING_SPECS]
    check_choice(method, "scaling", choices)
    params = _parameters(rest, text)
    if method in (_NONE, _MODEL):
        if params:
            raise ValueError(f"scaling {text!r}: {method!r} takes no parameters")
        return name, {"rope_type": "default"} if method == _NONE else dict(own)
    if method == "longrope":
        if own.get("rope_type") != "longrope":
            raise ValueError(
                "scaling 'longrope' needs the short and long factors a model was fine-tuned "
                f"with, and this model's RoPE has none ({own.get('rope_type', 'default')}); "
                "name a model whose config has them, or another scaling"
            )
        params = {**own, **params}
    fields = {f.name for f in dataclasses.fields(ROPE_SCALING_SPECS[method])}
    if "factor" in fields:
        params.setdefault("factor", factor)
    if "original_max_position_embeddings" in fields:
        params.setdefault("original_max_position_embeddings", context)
    params = {**_DEFAULTS.get(method, {}), **params}
    params.pop("rope_type", None)
    try:
        scaling, _ = as_rope_scaling(method, params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"scaling {text!r}: {exc}") from None
    return name, _plain(scaling)


def _parameters(rest: str, text: str) -> dict[str, Any]:
    """``"factor=8,beta_fast=16"`` as ``{"factor": 8.0, "beta_fast": 16.0}``."""
    params: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise ValueError(f"scaling {text!r}: parameters are key=value, got {item!r}")
        params[key.strip()] = _number(value.strip(), text)
    return params


def _number(value: str, text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"scaling {text!r}: {value!r} is not a number or true/false")


def _plain(scaling: RopeScaling) -> dict[str, Any]:
    """The scaling's dict with tuples as lists (JSON's form, so that keys are stable)."""
    return {
        key: list(value) if isinstance(value, tuple) else value
        for key, value in scaling.to_dict().items()
        if value is not None
    }


def parse_length(text: Any, context: int) -> int:
    """A length in tokens: an int, or ``"2x"`` for twice the model's ``context``.

    Example:
        >>> parse_length("2x", 8192), parse_length("0.5x", 8192), parse_length(3000, 8192)
        (16384, 4096, 3000)
    """
    if isinstance(text, str):
        match = _LENGTH.fullmatch(text)
        if match:
            value = float(match[1]) * context
            if not math.isfinite(value) or value < 1:
                raise ValueError(f"length {text!r} is under one token of context {context}")
            return check_int(round(value), f"length {text!r}", minimum=1, maximum=MAX_LENGTH)
        if text.strip().isdigit():
            text = int(text)
        else:
            raise ValueError(
                f"a length is a number of tokens or a multiple of the model's context such "
                f"as 2x, got {text!r}"
            )
    return check_int(text, "length", minimum=1, maximum=MAX_LENGTH)


@dataclass(frozen=True)
class Probe:
    """One measurement of a context-extension evaluation.

    Args:
        model: The model's folder (a ``transformers`` folder: ``config.json``, weights,
            tokenizer). Not part of :meth:`key`: ``fingerprint`` is.
        fingerprint: The model's identity (:func:`posenc.extend.models.fingerprint`).
        scaling: The scaling's name as the user gave it (:func:`parse_scaling`).
        rope: posenc's RoPE scaling (``RopeScaling.to_dict()``) the model runs with.
        task: ``"passkey"`` or ``"perplexity"``.
        length: Tokens of the prompt (passkey) or the window scored (perplexity).
        depth: Passkey only: where the key sits, as the fraction of the filler before it.
        trial: Passkey: which key (each trial draws another); perplexity: which window of
            the text (window ``trial`` starts at token ``trial * length``).
        text: Perplexity only: the text file's path, ``None`` for the default text. Not
            part of :meth:`key`: ``text_digest`` is.
        text_digest: Perplexity only: the SHA-256 of the text (its first 16 hex digits).
        dtype: The model's dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        device: Where it runs (``"cpu"``, ``"cuda"``, ``"cuda:<n>"``). Not part of :meth:`key`.

    Example:
        >>> probe = Probe("m", "f00d", "yarn", {"rope_type": "yarn", "factor": 4.0},
        ...               "passkey", 16384, depth=0.5)
        >>> probe.label()
        'yarn ×4 passkey 16384 depth 0.5 #0'
        >>> Probe.from_dict(probe.to_dict()) == probe, len(probe.key())
        (True, 40)
    """

    model: str
    fingerprint: str
    scaling: str
    rope: dict[str, Any]
    task: str
    length: int
    depth: float | None = None
    trial: int = 0
    text: str | None = None
    text_digest: str | None = None
    dtype: str = "float32"
    device: str = "cpu"

    #: The title of the progress bar over probes, and the command that runs them.
    title: ClassVar[str] = "extend"
    #: Progress units reported by a probe: its model's decoder layers, as each finishes
    #: the long forward pass (the first report sets the total).
    steps: ClassVar[int] = 1
    unit: ClassVar[str] = "layer"

    def __post_init__(self) -> None:
        check_choice(self.task, "task", TASKS)
        check_int(self.length, "length", minimum=1, maximum=MAX_LENGTH)
        check_int(self.trial, "trial", minimum=0)
        check_choice(self.dtype, "dtype", _DTYPES)
        if not isinstance(self.rope, Mapping) or "rope_type" not in self.rope:
            raise TypeError(f"rope must be a scaling's dict with a rope_type, got {self.rope!r}")
        if self.task == "passkey":
            if isinstance(self.depth, bool) or not isinstance(self.depth, (int, float)):
                raise TypeError(f"a passkey probe's depth must be a number, got "
                                f"{describe(self.depth)}")  # fmt: skip
            if not 0.0 <= self.depth <= 1.0:
                raise ValueError(f"depth must be in [0, 1], got {self.depth!r}")
            object.__setattr__(self, "depth", float(self.depth))
        elif self.depth is not None:
            raise ValueError(f"depth applies to passkey probes only, got depth={self.depth!r}")

    def label(self) -> str:
        """The probe in a few words, for progress bars and messages."""
        where = f" depth {self.depth:g}" if self.depth is not None else ""
        return (f"{scaling_label(self.scaling, self.rope)} {self.task} {self.length}{where} "
                f"#{self.trial}")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, JSON-ready."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Probe:
        """The probe of :meth:`to_dict`'s dict."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"unknown Probe fields {unknown}; valid fields are {names}")
        return cls(**{**data, "rope": dict(data["rope"])})

    def key(self) -> str:
        """SHA-1 (hex) of the canonical JSON of the fields that decide the result: all but
        the model's folder, the text's path and the device."""
        fields = self.to_dict()
        for name in ("model", "text", "device"):
            del fields[name]
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha1(canonical.encode("utf-8")).hexdigest()


def digest(data: bytes) -> str:
    """The first 16 hex digits of the SHA-256 of ``data``: an identity in keys."""
    return hashlib.sha256(data).hexdigest()[:16]
