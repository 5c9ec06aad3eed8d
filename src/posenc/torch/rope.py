"""Rotary position embedding (RoPE) for PyTorch, over the NumPy core.

:class:`RotaryEmbedding` rotates queries and keys; :func:`convert_rope_weights` moves a
query or key projection between the two RoPE layouts. Neither re-derives a formula: the
inverse frequencies come from :func:`posenc.core.rope.rope_scaling` and the cos/sin
tables from :func:`posenc.core.rope.rope_table_values` (float64, exact angle reduction,
rounded once), with the scaling's attention factor folded in before that rounding.

Conventions, shared with :mod:`posenc.torch.encodings`:

* positions are keyword-only: ``offset=`` (an int, for KV-cache decoding) or
  ``positions=`` (an integer tensor ``(seq,)`` or ``(batch, seq)``, for packed
  sequences); both default to ``0 .. seq-1``;
* the tables are non-persistent buffers, so nothing derived goes into ``state_dict``,
  and state dicts from other libraries that carry derived RoPE state still load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import check_bool, check_choice, check_max_length, describe
from ..core.plan import CallPlan, plan_call
from ..core.rope import RopeScaling, rope_options
from ..specs import RopeSpec
from ..specs.base import module_from_spec
from ._arguments import (
    QK_AXES,
    check_offset_or_positions,
    check_position_tensor,
    check_qk,
    positions_range,
)
from ._backend import DTYPES, format_of, gather_rows, is_traced, to_tensor
from ._tables import PositionTables, core_filled, eager_only, table_dtype
from .protocols import RotatesQueriesKeys
from .rerotation import frequency_state, rerotate_keys, rotate_keys
from .rope_lengths import (
    LengthFrequencies,
    keep_lengths,
    placed_lengths,
    rows_by_length,
    varies_by_length,
)
from .rope_weights import convert_rope_weights
from .rotation import SMALL, broadcast_tables, rotate, rotate_small_pair, signed_sin

__all__ = [
    "DERIVED_KEYS",
    "QK_LAYOUTS",
    "RotaryEmbedding",
    "broadcast_tables",
    "check_qk",
    "check_rope_positions",
    "convert_rope_weights",
]

QK_LAYOUTS: tuple[str, ...] = tuple(QK_AXES)
"""``"bhsd"``: (batch, heads, seq, head_dim); ``"bshd"``: (batch, seq, heads, head_dim)."""

# Keys other libraries write for derived RoPE state: Hugging Face ``inv_freq`` (persistent
# in older versions) and ``original_inv_freq``, Meta Llama ``rope.freqs``, fairseq
# ``_float_tensor``, the ``cos_cached``/``sin_cached`` of GPT-NeoX-style caches, and
# ``cos``/``sin`` (this module's own tables, should a state dict carry them).
DERIVED_KEYS = (
    "inv_freq",
    "original_inv_freq",
    "freqs",
    "_float_tensor",
    "cos_cached",
    "sin_cached",
    "cos",
    "sin",
)


class RotaryEmbedding(PositionTables, RotatesQueriesKeys):
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

    Length-dependent scalings follow the length ``L`` of each call (``offset + seq``, or
    ``max(positions) + 1``: Hugging Face's rule; with a KV cache, every key attended:
    ``length=``), in every front end (:func:`posenc.core.plan.plan_scaling`), with no
    state kept between calls: ``"longrope"`` uses ``long_factor`` while ``L >
    original_max_position_embeddings``, from a table of its own (``cos_long``,
    ``sin_long``); compiled code selects between the two in the graph. ``"dynamic_ntk"``
    and any registered method whose frequencies change with every length get, past the
    original length, the call's rows from the core at ``seq_len=L``; compiled code reads
    the frequencies of ``L`` from those :meth:`extend` keeps per length, the same bits
    (:mod:`posenc.torch.rope_lengths`). Keys cached while the length was shorter hold
    earlier frequencies: a :class:`KVCache` moves them to the new ones, so that decoding
    equals the full-sequence call, as Hugging Face's does not.

    Args:
        head_dim: Features per attention head (int >= 1).
        base: The RoPE base (``rope_theta``): 10000 (RoFormer, Llama 2), 500000 (Llama 3).
        rotary_dim: The rotated width (even, ``2 <= rotary_dim <= head_dim``); defaults to
            ``head_dim``. Hugging Face: ``int(head_dim * partial_rotary_factor)``.
        layout: ``"half"`` (feature ``j`` pairs with ``j + rotary_dim/2``: Hugging Face,
            GPT-NeoX) or ``"interleaved"`` (``2i`` with ``2i + 1``: Meta Llama, GPT-J).
            :func:`convert_rope_weights` converts checkpoints between them.
        scaling: ``None`` (or ``"default"``), a registered name
            (:data:`posenc.ROPE_SCALING_SPECS`: ``"linear"``, ``"ntk"``,
            ``"dynamic_ntk"``, ``"yarn"``, ``"llama3"``, ``"longrope"``, ``"proportional"``,
            or one added with :func:`posenc.register_rope_scaling`), a spec such as
            ``posenc.YarnScaling(...)`` or its dict form.
        scaling_params: With a name, the method's parameters (the fields of its spec),
            e.g. ``{"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}`` for ``"llama3"``. ``seq_len`` is
            not accepted: the module sets it per call.
        max_length: Number of positions the tables hold initially.
        qk_layout: ``"bhsd"`` (batch, heads, seq, head_dim), as Hugging Face and
            ``scaled_dot_product_attention``, or ``"bshd"`` (batch, seq, heads, head_dim),
            as Meta's Llama and flash-attn. Where q, k and positions disagree as read,
            the error says how and, if the other layout fits, to pass it.
        fused: Rotate with one kernel per tensor that ``torch.compile`` makes of the
            formula (a single pass over q and k, forward and backward: on one CPU thread
            about 6× faster than the eager operations, near a copy's speed), the same
            bits as the eager rotation. The first call compiles (seconds; on the CPU it
            needs a C++ compiler). Default False: eager PyTorch operations.

    Call arguments:
        q: Queries, a floating 4-D tensor in ``qk_layout`` with last axis ``head_dim``.
        k: Keys, same batch, seq and head_dim as ``q``; any number of heads.
        positions: Optional integer tensor ``(seq,)`` or ``(batch, seq)``, each >= 0.
        offset: Optional int >= 0: positions ``offset .. offset+seq-1``.
        length: Optional int, at least the call's own length (its largest position + 1,
            the default): the length whose frequencies a length-dependent scaling uses. A
            KV cache gives that of every key attended (:meth:`KVCache.scaling_length`).
            Eager calls only; a fixed scaling ignores it.
        inplace: Write the rotated values into ``q`` and ``k`` and return them (saves
            the outputs' memory, as fused kernels' ``inplace=True``); default False.

    Returns:
        ``(q_rot, k_rot)`` with the shapes and dtypes of ``q`` and ``k``. Their backward
        is the rotation by the opposite angles, from the same tables: nothing of ``q``
        or ``k`` is kept for it.

    Attributes:
        spec: The :class:`~posenc.RopeSpec` of the options (``head_dim``, ``rotary_dim``,
            ``base``, ``layout``, ``scaling``): the module reads them there.
        head_dim: ``spec.head_dim`` (the :class:`~posenc.torch.protocols.QueryKeyRotation`
            role's attribute).
        cos, sin: The tables, ``(rows, rotary_dim)``, float32 (float64 after ``.double()``),
            in ``layout``; row ``p`` holds ``attention_factor · cos(p θ)`` (and ``sin``).
        cos_long, sin_long: LongRoPE's tables with ``long_factor`` (only for a scaling
            with two sets of frequencies).
        attention_factor: The scaling's factor on the tables (YaRN, LongRoPE; else 1).

    Example:
        >>> rope = RotaryEmbedding(64, max_length=128, qk_layout="bhsd")
        >>> q, k = torch.randn(2, 8, 10, 64), torch.randn(2, 2, 10, 64)  # 8 query, 2 kv heads
        >>> q_rot, k_rot = rope(q, k)
        >>> q_rot.shape, k_rot.shape
        (torch.Size([2, 8, 10, 64]), torch.Size([2, 2, 10, 64]))
        >>> q_last, k_last = rope(q[:, :, 9:], k[:, :, 9:], offset=9)  # KV-cache decoding
        >>> torch.equal(q_last, q_rot[:, :, 9:]) and torch.equal(k_last, k_rot[:, :, 9:])
        True
        >>> bshd = RotaryEmbedding(64, max_length=128, qk_layout="bshd")  # (batch, seq, heads, d)
        >>> torch.equal(bshd(q.transpose(1, 2), k.transpose(1, 2))[0], q_rot.transpose(1, 2))
        True
        >>> rope.half().cos.dtype  # the tables stay float32
        torch.float32

    References:
        Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
        Hugging Face ``transformers``: ``LlamaRotaryEmbedding``, ``apply_rotary_pos_emb``,
        ``modeling_rope_utils.dynamic_rope_update``.
    """

    spec_class = RopeSpec

    cos: Tensor
    sin: Tensor

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: Literal["half", "interleaved"] = "half",
        scaling: str | RopeScaling | Mapping[str, Any] | None = None,
        scaling_params: Mapping[str, Any] | None = None,
        max_length: int = 4096,
        qk_layout: Literal["bhsd", "bshd"] = "bhsd",
        fused: bool = False,
    ) -> None:
        super().__init__()
        self.qk_layout = check_choice(qk_layout, "qk_layout", QK_LAYOUTS)
        self.fused = check_bool(fused, "fused")
        self.max_length = check_max_length(max_length)
        # The core parses the scaling (a dict's rope_theta is the base), the spec the rest.
        parsed, base, _ = rope_options(scaling, scaling_params, base, seq_len_owner="module")
        self.spec = RopeSpec(
            head_dim=head_dim, base=base, rotary_dim=rotary_dim, layout=layout, scaling=parsed
        )
        # A scaling with two sets of frequencies (LongRoPE) keeps a table for each.
        long = parsed.switch_length is not None
        names = ("cos", "sin", "cos_long", "sin_long") if long else ("cos", "sin")
        self._init_tables(names, self.max_length, torch.float32, drop=DERIVED_KEYS)
        # A scaling whose frequencies change with every length: those of each length, for
        # compiled and exported code, built by extend() (posenc.torch.rope_lengths).
        self._lengths: LengthFrequencies | None = None

    @classmethod
    def from_spec(cls, spec: RopeSpec, **options: Any) -> RotaryEmbedding:
        """The module of ``spec`` with options of its own (``max_length``, ``qk_layout``...)."""
        return module_from_spec(cls, spec, options)

    @classmethod
    def from_hf_config(
        cls, config: Any, *, layer_type: str | None = None, **options: Any
    ) -> RotaryEmbedding:
        """The module of a Hugging Face config's RoPE (:meth:`posenc.RopeSpec.from_hf_config`,
        ``layer_type`` as there) with ``options`` of its own (``max_length``, ...).

        Example:
            >>> config = {"head_dim": 64, "rope_theta": 1e6, "max_position_embeddings": 32768}
            >>> RotaryEmbedding.from_hf_config(config, max_length=128).spec.base
            1000000.0
        """
        return cls.from_spec(RopeSpec.from_hf_config(config, layer_type=layer_type), **options)

    @property
    def head_dim(self) -> int:
        """Features per head: ``spec.head_dim``."""
        return self.spec.head_dim

    @property
    def inv_freq(self) -> np.ndarray:
        """The construction-time inverse frequencies (float64, ``(rotary_dim // 2,)``), a
        copy; a length-dependent scaling's at a length ``L``: ``spec.frequencies(L)``."""
        return self.spec.frequencies()[0]

    @property
    def attention_factor(self) -> float:
        """The scaling's factor on the tables (YaRN, LongRoPE; else 1)."""
        return self.spec.frequencies()[1]

    # -- tables --------------------------------------------------------------------------

    @eager_only  # NumPy: never traced (reached in eager code only)
    def _derive(
        self, positions: int | np.ndarray, start: int, dtype: torch.dtype, device: Any
    ) -> tuple[Tensor, ...]:
        """Every table's rows from the core: ``(cos, sin)``, and LongRoPE's long ones."""
        tables: tuple[Tensor, ...] = self._at(positions, start, dtype, device, None)
        switch = self.spec.scaling.switch_length
        if switch is not None:  # the second set: that of the lengths past the switch
            tables += self._at(positions, start, dtype, device, switch + 1)
        return tables

    @eager_only
    def _at(
        self,
        positions: int | np.ndarray,
        start: int,
        dtype: torch.dtype,
        device: Any,
        seq_len: int | None,
    ) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` from the core: with the construction frequencies, or (``seq_len``)
        with the frequencies and attention factor a length-dependent scaling has there."""
        fmt, spec = format_of(dtype), self.spec
        if isinstance(positions, int):  # a run of rows: written into PyTorch's memory
            shape = (positions, cast(int, spec.rotary_dim))
            cos, sin = core_filled(
                (shape, shape),
                fmt,
                device,
                lambda out: spec.tables(
                    positions, fmt=fmt, start=start, seq_len=seq_len, out=(out[0], out[1])
                ),
                "these RoPE tables",
            )
            return cos, sin
        values = spec.tables(positions, fmt=fmt, start=start, seq_len=seq_len)
        return to_tensor(values[0], fmt, device), to_tensor(values[1], fmt, device)

    def _table_dtype(self, dtype: torch.dtype) -> torch.dtype:
        # The tables stay float32 whatever the module's dtype, float64 after .double().
        return table_dtype(dtype, "rotation")

    def extend(self, length: int) -> None:
        """Make the tables hold at least ``length`` positions (they never shrink), and,
        for a scaling whose frequencies change with every length (dynamic NTK), keep
        those of lengths up to ``length`` for compiled and exported code (about 1 ms
        per length past the original; shared by the modules of the spec).

        The tables are shared: every module of this kind and spec sees them grow. Call it
        before ``torch.compile``/``torch.export`` when compiled code will see positions
        past the current tables (traced positions outside them give NaN), and with
        dynamic NTK for the longest length compiled code will see.
        """
        super().extend(length)
        if varies_by_length(self.spec):
            self._lengths = keep_lengths(self.spec, self.table_length, self.cos.device)

    def _apply(self, fn: Any, recurse: bool = True) -> RotaryEmbedding:
        super()._apply(fn, recurse)
        # the frequencies kept per length, on the new device
        self._lengths = placed_lengths(self.spec, self._lengths, self.cos.device)
        return self

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_lengths"] = None  # derived: found again (or built by extend())
        return state

    # -- forward -------------------------------------------------------------------------

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        *,
        positions: Tensor | None = None,
        offset: int = 0,
        length: int | None = None,
        inplace: bool = False,
    ) -> tuple[Tensor, Tensor]:
        name = type(self).__name__
        inplace = check_bool(inplace, "inplace")
        compiling = is_traced()
        if length is not None and compiling:
            raise ValueError(f"{name}: length= (a KV cache's) is for eager calls only")
        batch, seq = check_qk(q, k, self.spec.head_dim, self.qk_layout, name, positions)
        offset = check_offset_or_positions(offset, positions, name, seq)
        if positions is not None:
            check_rope_positions(positions, batch, seq, name)
        fmt = format_of(self._table("cos").dtype)
        plan = self._plan(seq, offset, positions, fmt, "rotation", length, name, compiling)
        if not compiling and self._small_step(q, k, inplace) and plan.in_table:
            # a decoding step: the plan's slice or gather of the tables, q and k together
            assert plan.rows is not None  # a plan in the table has its rows
            if positions is None or positions.numel() == 1:  # one position: a slice
                return self._step(q, k, slice(plan.rows.start, plan.rows.end))
            return self._step(q, k, positions.long())  # int8, int32, ...: an index
        cos, sin = self._rows(plan, seq, offset, positions, name)
        cos, sin = broadcast_tables((cos, sin), self.qk_layout, q.device)
        layout, width = self.spec.layout, cast(int, self.spec.rotary_dim)
        return (
            rotate(q, cos, sin, layout, width, inplace=inplace, fused=self.fused),
            rotate(k, cos, sin, layout, width, inplace=inplace, fused=self.fused),
        )

    def _small_step(self, q: Tensor, k: Tensor, inplace: bool) -> bool:
        """Whether this call is a decoding step for :meth:`_step`: one batch row (and for
        bshd one position, so that q's and k's heads of the joint result are contiguous),
        few elements, the tables' dtype and device, no autograd, not in place or fused.
        (Buffers are read from ``_buffers``: ``nn.Module`` attribute lookup costs a
        microsecond or two per name, a noticeable part of a decoding step.)"""
        cos = self._table("cos")
        return (
            q.shape[0] == 1
            and (self.qk_layout == "bhsd" or q.shape[1] == 1)
            and q.numel() + k.numel() <= SMALL
            and q.dtype == k.dtype == cos.dtype
            and q.device == k.device == cos.device
            and not (inplace or self.fused)
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
        )

    def _table(self, name: str) -> Tensor:
        return cast(Tensor, self._buffers[name])  # as self.cos, without Module.__getattr__

    def _step(self, q: Tensor, k: Tensor, rows: slice | Tensor) -> tuple[Tensor, Tensor]:
        """q and k rotated together at ``rows`` (a slice of the tables, or positions to
        gather), the signed sin table kept from the last step. With one batch row (and
        for bshd one position) the rows broadcast over the heads as they are."""
        cos, layout, width = self._table("cos"), self.spec.layout, cast(int, self.spec.rotary_dim)
        signed = self._derived_once("sin", lambda t: signed_sin(t, layout, width))
        if isinstance(rows, slice):
            cos, signed = cos[rows], signed[rows]
        else:
            cos, signed = F.embedding(rows, cos), F.embedding(rows, signed)
        axis = 1 if self.qk_layout == "bhsd" else 2
        return rotate_small_pair(q, k, cos, signed, layout, width, axis)

    def cos_sin(
        self, positions: Tensor, dtype: torch.dtype | None = None, length: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` at integer ``positions`` ``(seq,)`` or ``(batch, seq)``: each
        ``(*positions.shape, rotary_dim)``, correctly rounded in ``dtype`` (default the
        tables' dtype: float32, float64 after ``.double()``), on the tables' device, the
        attention factor folded in, in this module's ``layout``. With ``layout="half"``
        this is what a Hugging Face rotary module returns (there cast from float32 to
        the input's dtype, which can round twice); a length-dependent scaling follows
        the largest position, or ``length``, as in :meth:`forward`.

        Example:
            >>> rope = RotaryEmbedding(4, base=100.0, qk_layout="bhsd")
            >>> cos, sin = rope.cos_sin(torch.tensor([[0, 1]]))  # frequencies 1 and 0.1
            >>> sin[0, 1].tolist() == [float(np.float32(np.sin(w))) for w in (1, 0.1, 1, 0.1)]
            True
        """
        name = f"{type(self).__name__}.cos_sin"
        if not isinstance(positions, Tensor) or positions.dim() not in (1, 2):
            raise TypeError(
                f"{name}: positions must be an integer tensor of shape (seq,) or (batch, "
                f"seq), got {describe(positions)}"
            )
        seq = positions.shape[-1]
        check_rope_positions(
            positions, positions.shape[0] if positions.dim() == 2 else 1, seq, name
        )
        if dtype is not None and dtype not in DTYPES.values():
            raise TypeError(f"{name}: dtype must be a floating torch dtype, got {describe(dtype)}")
        fmt = format_of(self.cos.dtype if dtype is None else dtype)
        plan = self._plan(seq, 0, positions, fmt, "input", length, name, is_traced())
        return self._rows(plan, seq, 0, positions, name)

    def _plan(
        self,
        seq: int,
        offset: int,
        positions: Tensor | None,
        fmt: str,
        kind: Any,
        length: int | None,
        name: str,
        compiling: bool,
    ) -> CallPlan:
        """The call's plan (:func:`posenc.core.plan.plan_call`): rows ``offset ..
        offset+seq-1`` or at ``positions`` (their values read unless traced: a symbolic
        ``seq`` or positions known only in the graph)."""
        span = None if positions is None else positions_range(positions, name)
        known = isinstance(seq, int) if positions is None else span is not None
        low, high = (None, None) if span is None else span
        return plan_call(
            self.table_length,
            start=offset if positions is None else None,
            count=seq,
            low=low,
            high=high,
            traced=not known,
            length=length,
            scaling=self.spec.scaling,
            by_length=True,  # the frequencies of every length, kept by extend()
            past="refuse" if compiling else "grow",
            fmt=fmt,
            kind=kind,
            name=f"{name}: ",
        )

    def _rows(
        self, plan: CallPlan, seq: int, offset: int, positions: Tensor | None, name: str
    ) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` of a call as its ``plan`` says: rows ``offset .. offset+seq-1``
        or at ``positions``, ``(seq|batch, seq, rotary_dim)`` each."""
        dtype, device = DTYPES[plan.fmt], self._table("cos").device
        if positions is None and (plan.source == "by_length" or plan.scaling.switch):
            # a length selected in the graph: the positions of the run, as a tensor
            positions, offset = torch.arange(offset, offset + seq, device=device), 0
        if plan.source == "by_length":
            assert positions is not None
            return rows_by_length(
                self._lengths, self.spec, self.table_length, positions, dtype, name
            )
        if plan.source == "core":  # frequencies of this call's own length: its rows
            where = seq if positions is None else positions.detach().cpu().numpy()
            return self._at(where, offset, dtype, device, plan.scaling.seq_len)
        tables = self._read(plan, seq, offset, positions, dtype, device, name)
        if plan.scaling.switch is not None:  # a traced length selects LongRoPE's tables
            assert positions is not None
            long = positions.max() + 1 > plan.scaling.switch
            return torch.where(long, tables[2], tables[0]), torch.where(long, tables[3], tables[1])
        if plan.scaling.seq_len is not None:  # past the switch: the long tables
            return tables[2], tables[3]
        return tables[0], tables[1]

    def _read(
        self,
        plan: CallPlan,
        seq: int,
        offset: int,
        positions: Tensor | None,
        dtype: torch.dtype,
        device: torch.device,
        name: str,
    ) -> tuple[Tensor, ...]:
        """Every table's rows at the plan's rows (grown first if it says so), or from the
        core where it says ``direct``; traced positions gathered, NaN outside."""
        if plan.rows is None:  # values known only in the graph (or a meta tensor's)
            return self._table_rows(
                dtype, device, offset=offset, count=seq, positions=positions, name=name
            )
        tables = self._planned_tables(plan.rows, dtype, device, name)
        if tables is None:  # only this call's rows, from the core
            where = seq if positions is None else positions.detach().cpu().numpy()
            return self._derive(where, offset, dtype, device)
        if positions is None:
            return tuple(t[offset : offset + seq] for t in tables)
        return tuple(gather_rows(t, positions) for t in tables)

    # -- what a KV cache asks (the CachedKeyRotation role: posenc.torch.rerotation) ------

    @property
    def frequencies_change(self) -> bool:
        """Whether the frequencies depend on the length of the call (dynamic NTK,
        LongRoPE): then cached keys can hold other frequencies than a new call's."""
        return bool(self.spec.scaling.length_dependent)

    def frequency_state(self, length: int) -> int | None:
        """The frequencies a call reaching ``length`` positions uses, named by the length
        whose frequencies they are (``None``: those of construction):
        :func:`posenc.torch.rerotation.frequency_state`."""
        return frequency_state(self.spec, length)

    def rotate_keys(
        self, keys: Tensor, *, positions: Tensor | None = None, frequencies: int | None = None
    ) -> Tensor:
        """Keys before rotation, rotated at ``positions`` with the frequencies of the state
        ``frequencies`` (:meth:`frequency_state`): what a call rotating them there gives."""
        name = f"{type(self).__name__}.rotate_keys"
        return rotate_keys(self.spec, self.qk_layout, keys, positions, frequencies, name)

    def rerotate_keys(
        self,
        keys: Tensor,
        *,
        positions: Tensor | None = None,
        new_positions: Tensor | None = None,
        frequencies: int | None = None,
        new_frequencies: int | None = None,
    ) -> Tensor:
        """Keys rotated at ``positions`` with the frequencies of the state ``frequencies``,
        turned to ``new_positions`` (default: the same) and the state ``new_frequencies``,
        the attention factor's change included: the same keys, within one rounding, as
        :meth:`rotate_keys` there would give from the keys before rotation.

        Example:
            >>> rope = RotaryEmbedding(8, base=100.0, qk_layout="bhsd")
            >>> k = torch.randn(1, 1, 3, 8, dtype=torch.float64)  # (batch, heads, seq, head_dim)
            >>> at_5 = rope.rotate_keys(k, positions=torch.tensor([5, 6, 7]))
            >>> moved = rope.rerotate_keys(at_5, positions=torch.tensor([5, 6, 7]),
            ...                            new_positions=torch.tensor([0, 1, 2]))
            >>> torch.allclose(moved, rope.rotate_keys(k), atol=1e-15)
            True
        """
        name = f"{type(self).__name__}.rerotate_keys"
        moves = positions, new_positions, frequencies, new_frequencies
        return rerotate_keys(self.spec, self.qk_layout, keys, *moves, name)

    def extra_repr(self) -> str:
        spec = self.spec
        text = (
            f"head_dim={spec.head_dim}, rotary_dim={spec.rotary_dim}, base={spec.base:g}, "
            f"layout={spec.layout!r}, qk_layout={self.qk_layout!r}, "
            f"max_length={self.max_length}"
        )
        if spec.scaling.name != "default":
            text += f", scaling={spec.scaling.name!r}, scaling_params={spec.scaling.params()!r}"
        return text + (", fused=True" if self.fused else "")


def check_rope_positions(positions: Any, batch: int, seq: int, name: str) -> None:
    check_position_tensor(
        positions, batch, seq, name, of="q and k", fractional="posenc.core.rope.rope_tables"
    )
