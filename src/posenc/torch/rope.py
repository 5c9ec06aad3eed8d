"""Rotary position embedding (RoPE) for PyTorch, over the NumPy core.

:class:`RotaryEmbedding` rotates queries and keys; :func:`convert_rope_weights` moves a
query or key projection between the two RoPE layouts. Neither re-derives a formula: the
inverse frequencies come from :func:`posenc.core.rope.rope_scaling` and the cos/sin
tables from :func:`posenc.core.rope.rope_table_values` (float64, exact angle reduction,
rounded once), with the scaling's attention factor folded in before that rounding.

Conventions, shared with :mod:`posenc.torch.modules`:

* positions are keyword-only: ``offset=`` (an int, for KV-cache decoding) or
  ``positions=`` (an integer tensor ``(seq,)`` or ``(batch, seq)``, for packed
  sequences); both default to ``0 .. seq-1``;
* the tables are non-persistent buffers, so nothing derived goes into ``state_dict``,
  and state dicts from other libraries that carry derived RoPE state still load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from .._checks import check_choice, check_int, describe
from ..core.rope import (
    ROPE_LAYOUTS,
    ROPE_SCALINGS,
    rope_permutation,
    rope_scaling,
    rope_table_values,
)
from .modules import _check_offset, _check_position_tensor, _drop_keys, _grow, _positions_end

__all__ = ["QK_LAYOUTS", "RotaryEmbedding", "convert_rope_weights"]

QK_LAYOUTS: tuple[str, ...] = ("bhsd", "bshd")
"""``"bhsd"``: (batch, heads, seq, head_dim); ``"bshd"``: (batch, seq, heads, head_dim)."""

# Scalings whose frequencies depend on the current sequence length (Hugging Face
# recomputes them in ``forward`` through ``dynamic_rope_update``).
_LENGTH_DEPENDENT = ("dynamic_ntk", "longrope")

# Keys other libraries write for derived RoPE state: Hugging Face ``inv_freq`` (persistent
# in older versions) and ``original_inv_freq``, Meta Llama ``rope.freqs``, fairseq
# ``_float_tensor``, the ``cos_cached``/``sin_cached`` of GPT-NeoX-style caches, and
# ``cos``/``sin`` (this module's own tables, should a state dict carry them).
_DERIVED_KEYS = (
    "inv_freq",
    "original_inv_freq",
    "freqs",
    "_float_tensor",
    "cos_cached",
    "sin_cached",
    "cos",
    "sin",
)

_TABLE_FORMATS = {torch.float32: "float32", torch.float64: "float64"}


class RotaryEmbedding(nn.Module):
    """Rotary position embedding: rotates query and key feature pairs by position.

    ``forward(q, k) -> (q_rot, k_rot)``, each feature pair turned by the angle
    ``position × θ_i`` (Su et al.), with Hugging Face's ``apply_rotary_pos_emb`` maths in
    the ``"half"`` layout and Meta's complex multiplication in the ``"interleaved"`` one.

    * The cos/sin tables are computed by the core in float64 with exact angle reduction
      and rounded once, so they are correctly rounded at any position (peers form the
      angle ``position × θ`` in float32, which is off by about ``position · 2^-24``).
    * The tables stay float32 whatever the module's dtype: ``.half()``, ``.bfloat16()``
      and autocast leave them float32 (rebuilt, never cast), and float16/bfloat16 queries
      and keys are rotated in float32 and cast back, as Hugging Face and torchtune do.
      ``.double()`` rebuilds them in float64 (then float32 inputs rotate in float64).
    * Tables grow when positions exceed them (in eager mode; under ``torch.compile`` or
      ``torch.export`` call :meth:`extend` first).
    * Queries and keys may have different head counts (grouped-query attention); only
      the first ``rotary_dim`` features rotate (partial rotary), the rest pass through.

    Length-dependent scalings. ``"dynamic_ntk"`` (Hugging Face ``"dynamic"``) and
    ``"longrope"`` change the frequencies with the sequence length ``L`` of each call
    (``offset + seq``, or ``max(positions) + 1``), as Hugging Face's
    ``dynamic_rope_update`` does, state included: ``dynamic_ntk`` recomputes the
    frequencies from the core's ``dynamic_ntk_rope(..., seq_len=L)`` whenever ``L``
    exceeds the longest length seen so far, and returns to the original ones when ``L``
    falls below ``original_max_position_embeddings`` again; ``longrope`` uses
    ``long_factor`` while ``L > original_max_position_embeddings`` and ``short_factor``
    otherwise. While scaled frequencies are in use, the rows a call needs are computed by
    the core for that call (the ``cos``/``sin`` buffers keep the original frequencies).
    This is eager-only: under ``torch.compile``/``torch.export`` these scalings raise,
    because the length is only known at run time. Note that with ``dynamic_ntk``,
    decoding one token at a time does not equal the full-sequence call once ``L`` passes
    the original length (the cached keys were rotated with earlier frequencies): that is
    the method, in Hugging Face too.

    Args:
        head_dim: Features per attention head (int >= 1).
        base: The RoPE base (``rope_theta``): 10000 (RoFormer, Llama 2), 500000 (Llama 3).
        rotary_dim: The rotated width (even, ``2 <= rotary_dim <= head_dim``); defaults to
            ``head_dim``. Hugging Face: ``int(head_dim * partial_rotary_factor)``.
        layout: ``"half"`` (feature ``j`` pairs with ``j + rotary_dim/2``: Hugging Face,
            GPT-NeoX) or ``"interleaved"`` (``2i`` with ``2i + 1``: Meta Llama, GPT-J).
            :func:`convert_rope_weights` converts checkpoints between them.
        scaling: ``None`` (or ``"default"``) or a key of
            :data:`posenc.core.rope.ROPE_SCALINGS`: ``"linear"``, ``"ntk"``,
            ``"dynamic_ntk"``, ``"yarn"``, ``"llama3"``, ``"longrope"``.
        scaling_params: The method's parameters (see its function in
            :mod:`posenc.core.rope`), e.g. ``{"factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}`` for
            ``"llama3"``. ``seq_len`` is not accepted: the module sets it per call.
        max_length: Number of positions the tables hold initially.
        qk_layout: ``"bhsd"`` (batch, heads, seq, head_dim), as Hugging Face and
            ``scaled_dot_product_attention``, or ``"bshd"`` (batch, seq, heads, head_dim),
            as Meta's Llama and flash-attn.

    Call arguments:
        q: Queries, a floating 4-D tensor in ``qk_layout`` with last axis ``head_dim``.
        k: Keys, same batch, seq and head_dim as ``q``; any number of heads.
        positions: Optional integer tensor ``(seq,)`` or ``(batch, seq)``, each >= 0.
        offset: Optional int >= 0: positions ``offset .. offset+seq-1``.

    Returns:
        ``(q_rot, k_rot)`` with the shapes and dtypes of ``q`` and ``k``.

    Attributes:
        cos, sin: The tables, ``(rows, rotary_dim)``, float32 (float64 after ``.double()``),
            in ``layout``; row ``p`` holds ``attention_factor · cos(p θ)`` (and ``sin``).
        attention_factor: The scaling's factor on the tables (YaRN, LongRoPE; else 1).

    Example:
        >>> rope = RotaryEmbedding(64, max_length=128)
        >>> q, k = torch.randn(2, 8, 10, 64), torch.randn(2, 2, 10, 64)  # 8 query, 2 kv heads
        >>> q_rot, k_rot = rope(q, k)
        >>> q_rot.shape, k_rot.shape
        (torch.Size([2, 8, 10, 64]), torch.Size([2, 2, 10, 64]))
        >>> q_last, k_last = rope(q[:, :, 9:], k[:, :, 9:], offset=9)  # KV-cache decoding
        >>> torch.equal(q_last, q_rot[:, :, 9:]) and torch.equal(k_last, k_rot[:, :, 9:])
        True
        >>> rope.half().cos.dtype  # the tables stay float32
        torch.float32

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
        Hugging Face ``transformers``: ``LlamaRotaryEmbedding``, ``apply_rotary_pos_emb``,
        ``modeling_rope_utils.dynamic_rope_update``.
    """

    cos: Tensor
    sin: Tensor

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: Literal["half", "interleaved"] = "half",
        scaling: str | None = None,
        scaling_params: Mapping[str, Any] | None = None,
        max_length: int = 4096,
        qk_layout: Literal["bhsd", "bshd"] = "bhsd",
    ) -> None:
        super().__init__()
        self.layout = check_choice(layout, "layout", ROPE_LAYOUTS)
        self.qk_layout = check_choice(qk_layout, "qk_layout", QK_LAYOUTS)
        self.max_length = check_int(max_length, "max_length", minimum=1)
        if scaling_params is None:
            scaling_params = {}
        elif not isinstance(scaling_params, Mapping):
            raise TypeError(
                f"scaling_params must be a dict of the scaling method's parameters or None, "
                f"got {describe(scaling_params)}"
            )
        if scaling is not None and not isinstance(scaling, str):
            raise TypeError(
                f"scaling must be None or one of {list(ROPE_SCALINGS)}, got {describe(scaling)}"
            )
        name = "default" if scaling is None else scaling
        if scaling is None and scaling_params:
            raise ValueError(
                f"scaling_params {sorted(scaling_params)} given without a scaling method; "
                "pass scaling= as well"
            )
        self.scaling_params = dict(scaling_params)
        if name in _LENGTH_DEPENDENT and "seq_len" in scaling_params:
            raise TypeError(
                f"scaling {name!r}: seq_len is not a parameter of the module, which takes it "
                "from each call (offset + seq, or max(positions) + 1)"
            )
        # The core validates head_dim, base, rotary_dim, the name and the parameters.
        inv_freq, attention_factor = rope_scaling(
            name, head_dim, base, rotary_dim=rotary_dim, **self.scaling_params
        )
        self.scaling: str = name
        self.head_dim = int(head_dim)
        self.base = float(base)
        self.rotary_dim = 2 * inv_freq.size
        self.attention_factor = float(attention_factor)
        self._inv_freq = inv_freq  # float64, the frequencies at construction
        # Length-dependent scalings: the length the current frequencies belong to (as
        # Hugging Face's ``max_seq_len_cached``) and those frequencies when they differ
        # from the construction ones (None: use the buffers).
        self._original_length = int(self.scaling_params.get("original_max_position_embeddings", 0))
        self._scaled_length = self._original_length
        self._scaled_inv_freq: np.ndarray | None = None

        cos, sin = self._build(self.max_length, torch.float32)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_load_state_dict_pre_hook(_drop_keys(*_DERIVED_KEYS))

    # -- tables --------------------------------------------------------------------------

    @property
    def inv_freq(self) -> np.ndarray:
        """The inverse frequencies in use (float64, ``(rotary_dim // 2,)``), a copy."""
        current = self._scaled_inv_freq if self._scaled_inv_freq is not None else self._inv_freq
        return current.copy()

    @torch.compiler.disable  # NumPy: never traced (reached in eager code only)
    def _values(
        self, positions: Any, inv_freq: np.ndarray, dtype: torch.dtype, device: Any, start: int = 0
    ) -> tuple[Tensor, Tensor]:
        cos, sin = rope_table_values(
            positions,
            inv_freq,
            fmt=_TABLE_FORMATS[dtype],
            layout=self.layout,
            scale=self.attention_factor,
            start=start,
        )
        return (
            torch.from_numpy(cos).to(device=device, dtype=dtype),
            torch.from_numpy(sin).to(device=device, dtype=dtype),
        )

    def _build(self, length: int, dtype: torch.dtype, device: Any = None) -> tuple[Tensor, Tensor]:
        return self._values(length, self._inv_freq, dtype, device)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        # fn has converted the tables (e.g. to bfloat16, a rounding of rounded values);
        # rebuild them exactly: float64 if the module went to float64, else float32.
        if self.cos.device.type != "meta":
            dtype = torch.float64 if self.cos.dtype == torch.float64 else torch.float32
            self.cos, self.sin = self._build(self.cos.shape[0], dtype, self.cos.device)
        return self

    def extend(self, length: int) -> None:
        """Make the tables hold at least ``length`` positions (they never shrink)."""
        length = check_int(length, "length", minimum=1)
        if length > self.cos.shape[0]:
            self.cos, self.sin = self._build(length, self.cos.dtype, self.cos.device)

    def _tables(self, end: int) -> tuple[Tensor, Tensor]:
        """The tables, grown (eagerly) to hold at least rows ``0 .. end-1``."""
        cos, sin = self.cos, self.sin  # one nn.Module attribute lookup each
        if end > cos.shape[0]:
            if torch.compiler.is_compiling():
                raise ValueError(
                    f"positions up to {end - 1} need longer RoPE tables than the "
                    f"{cos.shape[0]} rows built; under torch.compile or torch.export call "
                    f".extend({end}) before compiling"
                )
            _grow(self, end, cos.shape[0])
            cos, sin = self.cos, self.sin
        return cos, sin

    @torch.compiler.disable
    def _update_frequencies(self, length: int) -> None:
        """Hugging Face's ``dynamic_rope_update`` for the length ``length`` of this call."""
        original, current = self._original_length, self._scaled_length
        if self.scaling == "dynamic_ntk":
            if length > current:  # growth (current >= original, so length > original)
                new = length
            elif length < original < current:  # back under the original length: reset
                new = original
            else:
                return
        else:  # longrope: long factors past the original length, short ones up to it
            new = original + 1 if length > original else original
        if new == current:
            return
        self._scaled_length = new
        if new <= original:
            self._scaled_inv_freq = None
        else:
            self._scaled_inv_freq, _ = rope_scaling(
                self.scaling,
                self.head_dim,
                self.base,
                rotary_dim=self.rotary_dim,
                seq_len=new,
                **self.scaling_params,
            )

    # -- forward -------------------------------------------------------------------------

    def forward(
        self, q: Tensor, k: Tensor, *, positions: Tensor | None = None, offset: int = 0
    ) -> tuple[Tensor, Tensor]:
        name = type(self).__name__
        seq_axis = 2 if self.qk_layout == "bhsd" else 1
        _check_qk(q, k, self.head_dim, self.qk_layout, name)
        batch, seq = q.shape[0], q.shape[seq_axis]
        if positions is None:
            offset = _check_offset(offset, name)
            end = offset + seq
        else:
            _check_rope_positions(positions, batch, seq, name)
            end = _positions_end(positions, seq, name)

        if self.scaling in _LENGTH_DEPENDENT:
            if torch.compiler.is_compiling():
                raise ValueError(
                    f"{name}: scaling={self.scaling!r} recomputes the frequencies from the "
                    "sequence length of each call, which torch.compile and torch.export "
                    "cannot trace; run it eagerly (or use a fixed scaling such as 'ntk')"
                )
            self._update_frequencies(end)
        scaled = self._scaled_inv_freq
        if scaled is not None:  # eager only: the rows of this call, from the core
            dtype, device = self.cos.dtype, self.cos.device
            if positions is None:
                cos, sin = self._values(seq, scaled, dtype, device, start=offset)
            else:
                cos, sin = self._values(positions.cpu().numpy(), scaled, dtype, device)
        elif positions is None:
            cos, sin = self._tables(end)
            cos, sin = cos[offset : offset + seq], sin[offset : offset + seq]  # (seq, r)
        else:
            cos, sin = self._tables(end)
            index = positions.to(cos.device)
            cos = nn.functional.embedding(index, cos)  # (seq, r) or (batch, seq, r)
            sin = nn.functional.embedding(index, sin)

        cos, sin = _broadcast((cos, sin), self.qk_layout, q.device)
        return (
            _rotate(q, cos, sin, self.layout, self.rotary_dim),
            _rotate(k, cos, sin, self.layout, self.rotary_dim),
        )

    def extra_repr(self) -> str:
        text = (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}, "
            f"layout={self.layout!r}, qk_layout={self.qk_layout!r}, "
            f"max_length={self.max_length}"
        )
        if self.scaling != "default":
            text += f", scaling={self.scaling!r}, scaling_params={self.scaling_params!r}"
        return text


def _broadcast(tables: tuple[Tensor, ...], qk_layout: str, device: Any) -> tuple[Tensor, ...]:
    """``(seq, r)`` or ``(batch, seq, r)`` tables → broadcastable over ``qk_layout`` heads.

    ``(seq, r)`` works for bhsd as is; ``(batch, seq, r)`` needs a heads axis at 1 (bhsd);
    for bshd the heads axis sits at -2 in both cases.
    """
    out = []
    for t in tables:
        if qk_layout == "bshd":
            t = t.unsqueeze(-2)  # (..., seq, 1, r)
        elif t.dim() == 3:
            t = t.unsqueeze(1)  # (batch, 1, seq, r)
        out.append(t.to(device))
    return tuple(out)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str, rotary_dim: int) -> Tensor:
    """``x·cos + turn(x)·sin`` on the first ``rotary_dim`` features, in the tables' precision.

    float16/bfloat16 inputs are rotated in float32 (the tables' dtype) and cast back;
    ``turn`` is ``rotate_half`` (``[-x₂, x₁]``) or, interleaved, each ``(a, b) → (-b, a)``.
    """
    compute = torch.promote_types(x.dtype, cos.dtype)
    xr = x[..., :rotary_dim].to(compute)
    # x·cos, then the partner feature times sin subtracted from / added to each half (or
    # each member of a pair) in place. The roundings are those of x·cos + turn(x)·sin
    # (negation is exact), with one full-size temporary instead of four.
    out = xr * cos
    if layout == "half":
        half = rotary_dim // 2  # the sin table repeats each frequency in both halves
        first, second = slice(None, half), slice(half, None)
    else:
        first, second = slice(0, None, 2), slice(1, None, 2)
    out[..., first].sub_(xr[..., second] * sin[..., first])
    out[..., second].add_(xr[..., first] * sin[..., second])
    out = out.to(x.dtype)
    if rotary_dim < x.shape[-1]:
        out = torch.cat((out, x[..., rotary_dim:]), dim=-1)
    return out


def _check_qk(q: Any, k: Any, head_dim: int, qk_layout: str, name: str) -> None:
    axes = "batch, heads, seq, head_dim" if qk_layout == "bhsd" else "batch, seq, heads, head_dim"
    for label, x in (("q", q), ("k", k)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: {label} must be a torch.Tensor, got {describe(x)}")
        if x.dim() != 4:
            raise ValueError(
                f"{name}: {label} must have shape ({axes}) (qk_layout={qk_layout!r}), "
                f"got shape {tuple(x.shape)}"
            )
        if x.shape[-1] != head_dim:
            raise ValueError(
                f"{name} was built for head_dim={head_dim}, but {label} has last dimension "
                f"{x.shape[-1]} (shape {tuple(x.shape)})"
            )
        if not x.is_floating_point():
            raise TypeError(f"{name}: {label} must be a floating-point tensor, got dtype {x.dtype}")
    seq_axis = 2 if qk_layout == "bhsd" else 1
    if q.shape[0] != k.shape[0] or q.shape[seq_axis] != k.shape[seq_axis]:
        raise ValueError(
            f"{name}: q and k must have the same batch and seq sizes (axes 0 and {seq_axis} "
            f"for qk_layout={qk_layout!r}), got shapes {tuple(q.shape)} and {tuple(k.shape)}"
        )


def _check_rope_positions(positions: Any, batch: int, seq: int, name: str) -> None:
    _check_position_tensor(
        positions, batch, seq, name, of="q and k", fractional="posenc.core.rope.rope_tables"
    )


def convert_rope_weights(
    weight: Tensor,
    *,
    num_heads: int,
    head_dim: int,
    source: Literal["half", "interleaved"],
    target: Literal["half", "interleaved"],
    rotary_dim: int | None = None,
) -> Tensor:
    """Permute a query or key projection's output features from one RoPE layout to another.

    RoPE in the ``source`` layout applied to ``W x`` equals, feature for feature after the
    same permutation, RoPE in the ``target`` layout applied to ``convert(W) x``; since the
    query and key of each head are permuted alike, attention scores are unchanged. The
    per-head permutation is :func:`posenc.core.rope.rope_permutation`;
    ``"interleaved" → "half"`` is what Hugging Face's Llama conversion (``permute``)
    applies to Meta's ``wq``/``wk``.

    Args:
        weight: A projection weight ``(num_heads * head_dim, in_features)`` (as
            ``nn.Linear.weight``) or its bias ``(num_heads * head_dim,)``.
        num_heads: Heads in this projection (the key/value heads for ``k`` under GQA).
        head_dim: Features per head.
        source, target: ``"half"`` or ``"interleaved"``.
        rotary_dim: The rotated width per head (even, <= head_dim); features past it
            stay in place. Defaults to ``head_dim``.

    Returns:
        A new tensor of ``weight``'s shape, dtype and device with the rows permuted.

    Example:
        >>> w = torch.arange(12.0).reshape(6, 2)  # 1 head of 6 features, 2 inputs
        >>> convert_rope_weights(w, num_heads=1, head_dim=6, source="interleaved",
        ...                      target="half")[:, 0].tolist()
        [0.0, 4.0, 8.0, 2.0, 6.0, 10.0]
    """
    if not isinstance(weight, Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {describe(weight)}")
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    perm = rope_permutation(head_dim, source, target, rotary_dim=rotary_dim)  # validates
    if weight.dim() not in (1, 2) or weight.shape[0] != num_heads * head_dim:
        raise ValueError(
            f"weight must have shape (num_heads * head_dim, in_features) or "
            f"(num_heads * head_dim,) = ({num_heads * head_dim}, ...), "
            f"got shape {tuple(weight.shape)}"
        )
    rows = (np.arange(num_heads)[:, None] * head_dim + perm).reshape(-1)
    return weight[torch.from_numpy(rows).to(weight.device)]
