"""Move a whole checkpoint's RoPE layout: Meta's interleaved pairs ↔ Hugging Face's halves.

The query and key projections of every layer are permuted per head
(:func:`posenc.torch.convert_rope_weights`; grouped-query attention: the key projection
has its own head count; partial rotary: the features past ``rotary_dim`` stay), so that
RoPE in the target layout on the converted weights gives the same attention scores as
RoPE in the source layout on the original ones. Everything else is copied unchanged.

Which tensors are projections, and the source layout, are read from the key names:
Hugging Face's ``q_proj``/``k_proj`` are in the half layout, Meta's ``wq``/``wk`` in
the interleaved one. A file written here records its layout in the safetensors
metadata (``posenc_rope_layout``), which takes precedence, so a converted file is never
converted twice by mistake.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._checks import check_bool, check_choice, check_int, describe
from .._extras import require
from .._files import atomic_write, check_output_path
from ..core.rope import RopeLayout

__all__ = ["LAYOUT_KEY", "convert_rope_checkpoint", "convert_rope_state_dict"]

LAYOUT_KEY = "posenc_rope_layout"
_LAYOUTS: tuple[RopeLayout, ...] = ("half", "interleaved")
# key suffix -> (naming, projection)
_PATTERNS = {
    re.compile(r"(^|\.)q_proj\.(weight|bias)$"): ("Hugging Face (q_proj/k_proj)", "q"),
    re.compile(r"(^|\.)k_proj\.(weight|bias)$"): ("Hugging Face (q_proj/k_proj)", "k"),
    re.compile(r"(^|\.)wq\.(weight|bias)$"): ("Meta (wq/wk)", "q"),
    re.compile(r"(^|\.)wk\.(weight|bias)$"): ("Meta (wq/wk)", "k"),
}
_NAMING_LAYOUT: dict[str, RopeLayout] = {
    "Hugging Face (q_proj/k_proj)": "half",
    "Meta (wq/wk)": "interleaved",
}


def _projections(keys: list[str]) -> tuple[dict[str, str], str]:
    """``{key: "q" or "k"}`` of the projection tensors, and the naming they use."""
    found: dict[str, str] = {}
    namings = set()
    for key in keys:
        for pattern, (naming, role) in _PATTERNS.items():
            if pattern.search(key):
                found[key] = role
                namings.add(naming)
    if not found:
        raise ValueError(
            "found no query/key projection among the tensors: posenc converts checkpoints "
            "whose keys end in q_proj/k_proj (Hugging Face) or wq/wk (Meta) .weight or .bias"
        )
    if len(namings) > 1:
        raise ValueError(
            f"the checkpoint mixes {sorted(namings)} key names: its layout is ambiguous"
        )
    return found, namings.pop()


def convert_rope_state_dict(
    tensors: dict[str, Any],
    metadata: dict[str, str] | None,
    *,
    to: str,
    heads: int,
    kv_heads: int,
    head_dim: int | None = None,
    rotary_dim: int | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """``(tensors, metadata)`` with every query/key projection moved to layout ``to``.

    Args:
        tensors: name -> ``torch.Tensor`` (a whole state dict).
        metadata: The safetensors metadata (``None``: none).
        to: ``"half"`` (Hugging Face, GPT-NeoX) or ``"interleaved"`` (Meta, GPT-J).
        heads, kv_heads: Attention heads of the query and of the key projections.
        head_dim: Features per head (default: the query projection's rows / ``heads``).
        rotary_dim: The rotated features per head (default all of them).

    Raises:
        ValueError: no projection found, mixed key names, a checkpoint already in ``to``,
            or sizes that do not match ``heads``/``kv_heads``/``head_dim``.
    """
    require("torch", "posenc convert-rope", extra="posenc[transformers]")
    import torch

    from .. import torch as torch_front

    to = check_choice(to, "--to", _LAYOUTS)
    heads = check_int(heads, "--heads", minimum=1)
    kv_heads = check_int(kv_heads, "--kv-heads", minimum=1)
    metadata = _check_metadata(metadata)
    roles, naming = _projections(_check_keys(tensors))
    for key in roles:
        tensor = tensors[key]
        if not isinstance(tensor, torch.Tensor) or tensor.dim() not in (1, 2):
            raise TypeError(
                f"tensors[{key!r}] must be a torch.Tensor of shape (rows, in_features) or "
                f"(rows,), got {describe(tensor)}"
            )
    recorded = metadata.get(LAYOUT_KEY, _NAMING_LAYOUT[naming])
    if recorded not in _LAYOUTS:
        raise ValueError(
            f"the checkpoint's {LAYOUT_KEY} metadata is {recorded!r}; valid: {list(_LAYOUTS)}"
        )
    source = check_choice(recorded, LAYOUT_KEY, _LAYOUTS)
    if source == to:
        why = "its metadata says so" if LAYOUT_KEY in metadata else f"its keys are {naming}"
        raise ValueError(f"the checkpoint is in the {to} layout already ({why}): nothing to do")
    if head_dim is None:
        q_rows = {tensors[k].shape[0] for k, role in roles.items() if role == "q"}
        if len(q_rows) != 1 or next(iter(q_rows)) % heads:
            raise ValueError(
                f"cannot derive --head-dim: query projections of {sorted(q_rows)} rows for "
                f"--heads {heads}; give --head-dim"
            )
        head_dim = next(iter(q_rows)) // heads
    head_dim = check_int(head_dim, "--head-dim", minimum=2)
    out = dict(tensors)
    for key, role in roles.items():
        count = heads if role == "q" else kv_heads
        tensor = tensors[key]
        if tensor.shape[0] != count * head_dim:
            flag = "--heads" if role == "q" else "--kv-heads"
            raise ValueError(
                f"{key} has {tensor.shape[0]} rows, not {flag} {count} x --head-dim {head_dim}"
            )
        out[key] = torch_front.convert_rope_weights(
            tensor, num_heads=count, head_dim=head_dim, source=source, target=to,
            rotary_dim=rotary_dim,
        )  # fmt: skip
    metadata[LAYOUT_KEY] = to
    return out, metadata


def _check_keys(tensors: Any) -> list[str]:
    """The names of a state dict (a mapping of str), sorted."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a dict of name -> tensor, got {describe(tensors)}")
    keys = list(tensors)
    bad = [key for key in keys if not isinstance(key, str)]
    if bad:
        raise TypeError(f"tensors must be keyed by str names, got the key {describe(bad[0])}")
    return sorted(keys)


def _check_metadata(metadata: Any) -> dict[str, str]:
    """The safetensors metadata (str -> str), ``None`` read as none."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()
    ):
        raise TypeError(
            f"metadata must be None or a dict of str -> str (safetensors metadata), got "
            f"{describe(metadata)}"
        )
    return dict(metadata)


def _check_path(value: Any, name: str) -> None:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {describe(value)}")


def convert_rope_checkpoint(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    force: bool = False,
    **options: Any,
) -> Path:
    """Read the safetensors file ``source``, convert it (:func:`convert_rope_state_dict`
    with ``options``) and write ``target`` atomically; ``source`` is never written.

    Raises:
        ValueError: ``target`` is ``source``, or exists and ``force`` is False; and the
            conversion's errors.
    """
    require("safetensors", "posenc convert-rope", extra="posenc[transformers]")
    require("torch", "posenc convert-rope", extra="posenc[transformers]")
    import safetensors
    import safetensors.torch

    _check_path(source, "source")
    _check_path(target, "target")
    force = check_bool(force, "force")
    source, target = Path(source), check_output_path(target)
    if not source.is_file():
        raise ValueError(f"{source}: no such file")
    if target.exists() and (target.resolve() == source.resolve()):
        raise ValueError(f"the output {target} is the input: posenc never overwrites its input")
    if target.exists() and not force:
        raise ValueError(f"{target} exists: choose another output or pass --force to replace it")
    try:
        with safetensors.safe_open(str(source), framework="pt") as handle:
            metadata = handle.metadata()
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    except Exception as exc:  # the library raises its own error types for a bad file
        raise ValueError(f"{source} is not a readable safetensors file ({exc})") from None
    tensors, metadata = convert_rope_state_dict(tensors, metadata, **options)
    data = safetensors.torch.save(tensors, metadata=metadata)
    # A new output is as private as its input (an existing one keeps its own mode).
    with atomic_write(target, "wb", permissions=source.stat().st_mode & 0o777) as handle:
        handle.write(data)
    return target
