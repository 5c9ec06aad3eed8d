"""The attention step of :class:`~posenc.torch.MultiHeadAttention`, three ways: the
scores made whole and passed to SDPA (``"sdpa"``) or to a softmax written out
(``"eager"``), or left to FlexAttention, which adds the bias and applies the mask as it
computes each score (``"flex_attention"``); and the rule by which ``"auto"`` chooses.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..core.masks import Mask
from . import masks
from .flex import CPU_DTYPES, flex_attention, needs_gradients

__all__ = [
    "IMPLEMENTATIONS",
    "attend_dense",
    "attend_flex",
    "choose",
    "combine_masks",
    "refuse",
]

#: The values of ``attn_implementation`` (Hugging Face's names, and ``"auto"``).
IMPLEMENTATIONS = ("sdpa", "flex_attention", "eager", "auto")

#: ``"auto"`` attends through FlexAttention from this many scores per call
#: (batch·heads·queries·keys): a materialised float32 bias of 256 MiB, where making the
#: ``T × S`` tensors costs more than the first call's compilation is worth.
AUTO_SCORES = 2**26

#: Why CoPE has no ``score_mod``.
COPE = (
    "CoPE has no FlexAttention score_mod: the position of key j for query i is "
    "Σ_{t=j..i} σ(q_i·k_t), a sum of gates over every key between them, a reduction along "
    "the keys that a score_mod (one query and one key at a time) cannot express"
)


def refuse(implementation: str, position: Any, dropout: float) -> None:
    """A ``ValueError`` for an implementation that cannot run ``position`` or dropout."""
    if implementation != "flex_attention":
        return
    if hasattr(position, "contextual_bias"):
        raise ValueError(
            f"attn_implementation='flex_attention' cannot take {type(position).__name__}: "
            f"{COPE}; use 'sdpa' or 'eager' (or 'auto', which does)"
        )
    if dropout:
        raise ValueError(
            f"attn_implementation='flex_attention' has no dropout on the attention weights, "
            f"got dropout={dropout}; use dropout=0.0, or 'sdpa' or 'eager'"
        )


def choose(
    position: Any, dropout: float, training: bool, scores: int, tensors: tuple[Tensor, ...]
) -> str:
    """What ``"auto"`` takes for one call: FlexAttention for calls of
    :data:`AUTO_SCORES` scores or more, where it can run them (no CoPE, no dropout in
    training, and on the CPU no gradients and a dtype its kernel takes), and SDPA
    otherwise."""
    cpu = tensors[0].device.type == "cpu"
    flex = (
        scores >= AUTO_SCORES
        and not hasattr(position, "contextual_bias")
        and not (dropout and training)
        and not (cpu and (tensors[0].dtype not in CPU_DTYPES or needs_gradients(*tensors)))
    )
    return "flex_attention" if flex else "sdpa"


def attend_dense(
    implementation: str, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *,
    is_causal: bool, dropout: float, scale: float,
) -> Tensor:  # fmt: skip
    """Attention over the whole scores: SDPA, or a softmax written out (``"eager"``:
    any backward on any device, the reference the others are held to)."""
    if implementation == "sdpa":
        y: Tensor = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal, scale=scale
        )
        return y  # (B, nh, T, hs)
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, S)
    if is_causal:
        T, S = scores.shape[-2:]
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else (
            scores + mask
        )  # fmt: skip
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # (B, nh, T, S)
    weights = nn.functional.dropout(weights, p=dropout) if dropout else weights
    return weights @ v  # (B, nh, T, hs)


def combine_masks(mask: Tensor | None, structured: Mask, q: Tensor, S: int) -> Tensor:
    """A structured mask made whole, ``(B, 1, T, S)``, and with a dense one if given
    (both must allow a key; a floating mask keeps its values where both do)."""
    whole = masks.dense_mask(structured, q.shape[-2], S, batch=q.shape[0], device=q.device)
    if mask is None:
        return whole
    if mask.dtype == torch.bool:
        return mask & whole
    return torch.where(whole, mask, float("-inf"))


def attend_flex(
    q: Tensor, k: Tensor, v: Tensor, *, position: Any, causal: bool,
    bias_arguments: dict[str, Any] | None, mask: Tensor | None, structured: Mask | None,
    scale: float,
) -> Tensor:  # fmt: skip
    """FlexAttention: the scheme's ``score_mod`` (or its bias, made whole, for a score
    bias that has none), the causal and structured masks as a block mask, a dense mask
    read score by score (with a structured one, both made whole together)."""
    B, nh, T, _ = q.shape
    S = k.shape[-2]
    dense = mask
    if dense is not None and structured is not None:
        dense, structured = combine_masks(dense, structured, q, S), None
    if causal and T > 1:  # one query after every key sees them all
        structured = masks.causal() if structured is None else masks.causal() & structured
    block = None
    if structured is not None:
        block = masks.block_mask(structured, T, S, batch=B, device=q.device)
    mods = []
    parameters: tuple[Tensor, ...] = ()
    if bias_arguments is not None:
        mods.append(_bias_mod(position, T, S, bias_arguments, q))
        if isinstance(position, nn.Module):
            parameters = tuple(position.parameters())
    if dense is not None:
        mods.append(_dense_mod(dense.expand(B, nh, T, S)))
    score_mod = None if not mods else mods[0] if len(mods) == 1 else _chain(mods)
    return flex_attention(
        q, k, v, score_mod=score_mod, block_mask=block, scale=scale, parameters=parameters
    )


def _bias_mod(position: Any, T: int, S: int, arguments: dict[str, Any], q: Tensor) -> Any:
    """The scheme's ``score_mod``; for a score bias without one, its bias read whole."""
    own = getattr(position, "score_mod", None)
    if own is not None:
        return own(T, S, **arguments, dtype=q.dtype, device=q.device)
    bias = position.score_bias(T, S, **arguments, dtype=q.dtype, device=q.device)
    return _dense_mod(bias.expand(q.shape[0], q.shape[1], T, S))  # (B, nh, T, S), a view


def _dense_mod(mask: Tensor) -> Any:
    """A dense mask or bias ``(B, nh, T, S)`` as a ``score_mod``: True keeps a score,
    False hides it; a floating one is added. Compiled for each shape on the CPU: the
    tensor is as large as the scores, so one program per length saves nothing, and a
    static size keeps the program clear of the CPU code generator's fault with symbolic
    sizes (:mod:`.flex`)."""
    if mask.dtype == torch.bool:

        def mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return torch.where(mask[b, h, i, j], score, -float("inf"))
    else:

        def mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return score + mask[b, h, i, j]

    mod.static_shapes = True  # type: ignore[attr-defined]
    return mod


def _chain(mods: list[Any]) -> Any:
    def chained(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        for mod in mods:
            score = mod(score, b, h, i, j)
        return score

    chained.static_shapes = any(getattr(mod, "static_shapes", False) for mod in mods)  # type: ignore[attr-defined]
    return chained
