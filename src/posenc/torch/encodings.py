"""PyTorch modules over the NumPy core.

The modules never re-derive a formula: tables come from :mod:`posenc.core`, computed in
float64 with exact angle reduction and rounded once to the module's dtype. Conventions
shared by every module here:

* input ``x`` is ``(batch, seq, d_model)`` or ``(seq, d_model)`` and floating point;
  ``batch_first=False`` (as PyTorch's ``nn.TransformerEncoderLayer`` and its tutorial
  take) reads ``(seq, batch, d_model)`` instead, with positions ``(seq,)`` or ``(seq,
  batch)``: a default module given a seq-first input would read the positions along the
  batch axis, which no shape check can catch;
* positions are keyword-only: ``offset=`` (an int, for KV-cache decoding) or
  ``positions=`` (an integer tensor ``(seq,)`` or ``(batch, seq)``, for packed
  sequences); both default to ``0 .. seq-1``;
* derived tables are non-persistent buffers: nothing derived goes into ``state_dict``,
  and state dicts from other code that carry such a table (the ``pe`` buffer of the
  PyTorch tutorials' ``PositionalEncoding``) still load.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .._checks import (
    check_bool,
    check_d_model,
    check_int,
    check_max_length,
    check_position,
    check_probability,
    check_weights,
    describe,
)
from ..core.plan import plan_index
from ..specs import LearnedSpec, NopeSpec, SinusoidalSpec
from ..specs.base import module_from_spec
from ._arguments import (
    apply_dropout,
    check_offset_or_positions,
    check_position_tensor,
    fits_batch,
    positions_range,
)
from ._backend import dtype_name, format_of, gather_rows, to_tensor, wide_index
from ._tables import PositionTables, core_filled, eager_only
from .protocols import EncodesInput


def exact_table(
    length: int,
    d_model: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    formula: str = "paper",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    start: int = 0,
) -> Tensor:
    """The sinusoidal table for positions ``start .. start+length-1`` as a tensor.

    Values are the correctly rounded exact encoding in ``dtype`` (float64, float32,
    float16 or bfloat16), never a cast of a table computed in another precision.

    Example:
        >>> exact_table(2, 4, base=100)[1].tolist()  # float32 values of sin 1, cos 1, ...
        [0.8414709568023682, 0.5403022766113281, 0.0998334139585495, 0.9950041770935059]
    """
    length = check_int(length, "length", minimum=0)
    spec = SinusoidalSpec(d_model=d_model, base=base, layout=layout, formula=formula)
    start = check_position(start, "start")
    fmt = format_of(dtype)
    return to_tensor(spec.table(length, fmt=fmt, start=start), fmt, device)


def _check_input(x: Any, d_model: int, name: str, batch_first: bool = True) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} expects a torch.Tensor, got {describe(x)}")
    if x.dim() not in (2, 3):
        shape = "(batch, seq, d_model)" if batch_first else "(seq, batch, d_model)"
        raise ValueError(
            f"{name} expects x of shape {shape} or (seq, d_model) (batch_first="
            f"{batch_first}), got shape {tuple(x.shape)}"
        )
    if x.shape[-1] != d_model:
        raise ValueError(
            f"{name} was built for d_model={d_model}, but x has last dimension "
            f"{x.shape[-1]} (shape {tuple(x.shape)})"
        )
    if not x.is_floating_point():
        raise TypeError(
            f"{name} expects floating-point embeddings, got dtype {x.dtype}; "
            "token ids go through TokenEmbedding first"
        )


def _batch_first(x: Any, positions: Any, batch_first: bool, name: str) -> tuple[Any, Any, bool]:
    """A call's ``x`` and ``positions`` as the batch-first call takes them, and whether
    its output goes back to seq-first: a ``batch_first=False`` module's ``(seq, batch,
    d)`` input and ``(seq, batch)`` positions are read through transposed views."""
    if batch_first or not isinstance(x, Tensor) or x.dim() != 3:
        return x, positions, False
    if isinstance(positions, Tensor) and positions.dim() == 2:
        seq, batch = x.shape[0], x.shape[1]
        if positions.shape[0] != seq or not fits_batch(positions.shape[1], batch):
            raise ValueError(
                f"{name}: with batch_first=False, x {tuple(x.shape)} is (seq, batch, "
                f"d_model) and positions must have shape (seq,) or (seq, batch) = ({seq},) or "
                f"({seq}, {batch}), got {tuple(positions.shape)}"
            )
        positions = positions.transpose(0, 1)  # (batch, seq)
    return x.transpose(0, 1), positions, True  # (batch, seq, d)


def _check_positions(positions: Any, x: Tensor, name: str) -> None:
    """Positions for an input ``x`` of shape ``(batch, seq, d)`` or ``(seq, d)``."""
    batch = x.shape[0] if x.dim() == 3 else None
    check_position_tensor(positions, batch, x.shape[-2], name, of="x")


class SinusoidalPositionalEncoding(PositionTables, EncodesInput):
    """Adds the sinusoidal encoding of "Attention Is All You Need" §3.5, then dropout.

    ``forward(x) = dropout(x + PE[positions])``: the ``PositionalEncoding`` module of the
    PyTorch tutorials (H. Phillips, "Positional Encoding", 2023; PyTorch's own), without
    its traps:

    * the table is a non-persistent buffer (no ``pe`` in ``state_dict``; a state dict
      that has one, as the tutorials' module writes, still loads);
    * it is built in float64 with exact angles and rounded once to the module's dtype:
      ``.half()``, ``.bfloat16()``, ``.to(dtype)`` rebuild it correctly rounded instead of
      casting, and an input of another dtype gets its own correctly rounded table;
    * a sequence longer than ``max_length`` grows the table instead of failing (in
      eager mode; under ``torch.compile`` call :meth:`extend` first);
    * positions are keyword-only: ``offset=`` for KV-cache decoding, ``positions=`` for
      packed sequences.

    Args:
        d_model: Width of the embeddings (any int >= 1).
        dropout: Dropout probability applied after the addition.
        max_length: Number of positions the table holds initially.
        base: The ``n`` of ``sin(k / n^(2i/d))``.
        layout: ``"interleaved"`` (paper) or ``"split"`` (tensor2tensor / fairseq).
        formula: ``"paper"`` or ``"tensor2tensor"`` frequency spacing.
        batch_first: ``True`` (default): ``x`` is ``(batch, seq, d_model)``; ``False``:
            ``(seq, batch, d_model)``, as PyTorch's ``nn.Transformer`` layers and
            tutorial take by default (a batch-first module reads such an input's batch
            axis as its positions, silently).

    Call arguments:
        x: ``(batch, seq, d_model)`` (``(seq, batch, d_model)`` with
            ``batch_first=False``) or ``(seq, d_model)`` floating-point embeddings.
        positions: Optional integer tensor ``(seq,)`` or ``(batch, seq)`` (``(seq,
            batch)`` with ``batch_first=False``), each >= 0.
        offset: Optional int: positions ``offset .. offset+seq-1``.

    Shapes:
        output: same shape and dtype as ``x``.

    Example:
        >>> pe = SinusoidalPositionalEncoding(4, dropout=0.0, max_length=10, base=100)
        >>> out = pe(torch.zeros(1, 3, 4))
        >>> out[0, 1].tolist() == exact_table(2, 4, base=100)[1].tolist()
        True

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, §3.5.
    """

    spec_class = SinusoidalSpec

    pe: Tensor

    def __init__(
        self,
        d_model: int,
        dropout: float = 0.1,
        max_length: int = 5000,
        base: float = 10000.0,
        *,
        layout: str = "interleaved",
        formula: str = "paper",
        batch_first: bool = True,
    ) -> None:
        super().__init__()
        self.spec = SinusoidalSpec(d_model=d_model, base=base, layout=layout, formula=formula)
        self.batch_first = check_bool(batch_first, "batch_first")
        self.max_length = check_max_length(max_length)
        self.dropout = nn.Dropout(check_probability(dropout))
        # The buffer "pe"; a state dict that has one (the tutorials' module's) still loads.
        self._init_tables(("pe",), self.max_length, torch.float32)

    @classmethod
    def from_spec(cls, spec: SinusoidalSpec, **options: Any) -> SinusoidalPositionalEncoding:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @eager_only  # NumPy: never traced (reached in eager code only)
    def _derive(
        self, positions: int | np.ndarray, start: int, dtype: torch.dtype, device: Any
    ) -> tuple[Tensor, ...]:
        fmt = format_of(dtype)
        if isinstance(positions, int):  # a run of rows: written into PyTorch's memory
            return core_filled(
                ((positions, self.spec.d_model),),
                fmt,
                device,
                lambda out: self.spec.table(positions, fmt=fmt, start=start, out=out[0]),
                "this sinusoidal table",
            )
        return (to_tensor(self.spec.table(positions, fmt=fmt, start=start), fmt, device),)

    def table(self, end: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """Rows ``0 .. end-1`` (at least) of the table in ``dtype`` on ``device``."""
        tables = self._covering(end, dtype, device, type(self).__name__)
        if tables is None:
            raise ValueError(
                f"a table of {end} rows of {self.spec.d_model} in {dtype} would exceed the memory "
                "limit of 4 GiB; ask for fewer positions"
            )
        return tables[0]

    def forward(self, x: Tensor, *, positions: Tensor | None = None, offset: int = 0) -> Tensor:
        name = type(self).__name__
        _check_input(x, self.spec.d_model, name, self.batch_first)
        x, positions, back = _batch_first(x, positions, self.batch_first, name)
        offset = check_offset_or_positions(offset, positions, name, x.shape[-2])
        if positions is not None:
            _check_positions(positions, x, name)
        (pe,) = self._table_rows(
            x.dtype, x.device, offset=offset, count=x.shape[-2], positions=positions, name=name
        )  # (seq, d) or (B, seq, d)
        out = apply_dropout(self.dropout, x + pe)  # (B, seq, d) or (seq, d)
        return out.transpose(0, 1) if back else out  # (seq, B, d) for batch_first=False

    def extra_repr(self) -> str:
        spec = self.spec
        return (
            f"d_model={spec.d_model}, max_length={self.max_length}, base={spec.base:g}, "
            f"layout={spec.layout!r}, formula={spec.formula!r}"
        ) + ("" if self.batch_first else ", batch_first=False")


class LearnedPositionalEmbedding(EncodesInput):
    """Adds a trained embedding per position (``max_length`` of them), then dropout.

    Learned embeddings cannot represent a position they were not trained with: a
    position ``>= max_length`` is an error, never a silent wrap-around.

    Args:
        max_length: Number of positions (0 .. max_length-1).
        d_model: Width of the embeddings.
        dropout: Dropout probability applied after the addition.
        init_std: Standard deviation of the normal initialisation (GPT-2 uses 0.02).
        batch_first: As for :class:`SinusoidalPositionalEncoding`: ``False`` reads ``x``
            as ``(seq, batch, d_model)``.

    Call arguments:
        x, positions, offset: As for :class:`SinusoidalPositionalEncoding`.

    Example:
        >>> emb = LearnedPositionalEmbedding(16, 8)
        >>> emb(torch.zeros(2, 5, 8)).shape
        torch.Size([2, 5, 8])
    """

    spec_class = LearnedSpec

    def __init__(
        self,
        max_length: int,
        d_model: int,
        dropout: float = 0.0,
        *,
        init_std: float = 0.02,
        batch_first: bool = True,
    ) -> None:
        super().__init__()
        self.spec = LearnedSpec(max_length=max_length, d_model=d_model, init_std=init_std)
        self.batch_first = check_bool(batch_first, "batch_first")
        self.weight = nn.Parameter(torch.empty(self.spec.max_length, self.spec.d_model))
        self.dropout = nn.Dropout(check_probability(dropout))
        self.reset_parameters()

    @classmethod
    def from_spec(cls, spec: LearnedSpec, **options: Any) -> LearnedPositionalEmbedding:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=self.spec.init_std)

    def _too_long(self, last: int, given: str) -> ValueError:
        length = self.spec.max_length
        return ValueError(
            f"position {last} is beyond this learned embedding's max_length="
            f"{length} (positions 0..{length - 1}; {given}); learned "
            "embeddings cannot extrapolate: build it with a larger max_length"
        )

    def forward(self, x: Tensor, *, positions: Tensor | None = None, offset: int = 0) -> Tensor:
        name = type(self).__name__
        _check_input(x, self.spec.d_model, name, self.batch_first)
        x, positions, back = _batch_first(x, positions, self.batch_first, name)
        out = self._add(x, positions, offset)  # (B, seq, d) or (seq, d)
        return out.transpose(0, 1) if back else out  # (seq, B, d) for batch_first=False

    def _add(self, x: Tensor, positions: Tensor | None, offset: int) -> Tensor:
        seq, length = x.shape[-2], self.spec.max_length
        offset = check_offset_or_positions(offset, positions, type(self).__name__, seq)
        if positions is None:
            if offset + seq > length:
                raise self._too_long(offset + seq - 1, f"asked by offset={offset} for {seq} rows")
            pe = self.weight[offset : offset + seq]  # (seq, d)
        else:
            _check_positions(positions, x, type(self).__name__)
            span = positions_range(positions, type(self).__name__)
            if span is not None and span[1] >= length:
                raise self._too_long(span[1], "the largest of positions=")
            plan = None  # known positions were checked above: a plain gather
            if span is None:  # traced: NaN rows past the table, in any integer dtype
                plan = plan_index(dtype_name(positions), length, wide=wide_index())
            pe = gather_rows(self.weight, positions, plan)
        return apply_dropout(self.dropout, x + pe.to(x.dtype))

    def extra_repr(self) -> str:
        text = f"max_length={self.spec.max_length}, d_model={self.spec.d_model}"
        return text + ("" if self.batch_first else ", batch_first=False")


class NoPositionalEncoding(EncodesInput):
    """NoPE: the explicit choice of no positional information (``dropout(x)``).

    Causal attention can infer positions on its own (Kazemnejad et al., 2023, "The
    Impact of Positional Encoding on Length Generalization in Transformers"); naming
    the choice lets experiments and models swap it in wherever an encoding module goes.
    It takes the same arguments as the other modules (``batch_first`` included) and
    checks its input the same way.

    Example:
        >>> x = torch.randn(2, 5, 8)
        >>> torch.equal(NoPositionalEncoding(8)(x, offset=3), x)
        True
    """

    spec_class = NopeSpec

    def __init__(self, d_model: int, dropout: float = 0.0, *, batch_first: bool = True) -> None:
        super().__init__()
        self.spec = NopeSpec(d_model=d_model)
        self.batch_first = check_bool(batch_first, "batch_first")
        self.dropout = nn.Dropout(check_probability(dropout))

    @classmethod
    def from_spec(cls, spec: NopeSpec, **options: Any) -> NoPositionalEncoding:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    def forward(self, x: Tensor, *, positions: Tensor | None = None, offset: int = 0) -> Tensor:
        name = type(self).__name__
        _check_input(x, self.spec.d_model, name, self.batch_first)
        at, positions, _ = _batch_first(x, positions, self.batch_first, name)
        check_offset_or_positions(offset, positions, name)
        if positions is not None:
            _check_positions(positions, at, name)
        return apply_dropout(self.dropout, x)

    def extra_repr(self) -> str:
        return f"d_model={self.spec.d_model}" + ("" if self.batch_first else ", batch_first=False")


class TokenEmbedding(nn.Module):
    """Token ids → vectors, scaled by ``√d_model`` as in the paper (§3.4).

    Args:
        vocab_size: Number of token ids (0 .. vocab_size-1).
        d_model: Width of the embeddings.
        scale: Multiply by ``√d_model`` (paper); ``False`` for a plain lookup.
        padding_idx: Optional id whose vector stays zero and gets no gradient.

    Example:
        >>> emb = TokenEmbedding(10, 4)
        >>> emb(torch.tensor([[1, 2, 3]])).shape
        torch.Size([1, 3, 4])
    """

    def __init__(
        self, vocab_size: int, d_model: int, *, scale: bool = True, padding_idx: int | None = None
    ) -> None:
        super().__init__()
        self.vocab_size = check_int(vocab_size, "vocab_size", minimum=1)
        self.d_model = check_d_model(d_model)
        check_weights({"vocab_size": self.vocab_size, "d_model": self.d_model}, "TokenEmbedding")
        scale = check_bool(scale, "scale")
        if padding_idx is not None:
            padding_idx = check_int(padding_idx, "padding_idx", minimum=0)
            if padding_idx >= self.vocab_size:
                raise ValueError(
                    f"padding_idx must be in 0..{self.vocab_size - 1}, got {padding_idx}"
                )
        self.scale = scale
        self.embedding = nn.Embedding(self.vocab_size, self.d_model, padding_idx=padding_idx)

    def forward(self, ids: Tensor) -> Tensor:
        if not isinstance(ids, Tensor):
            raise TypeError(f"TokenEmbedding expects an integer tensor, got {describe(ids)}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"TokenEmbedding expects integer token ids, got dtype {ids.dtype}")
        if not torch.compiler.is_compiling() and ids.numel():
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= self.vocab_size:
                bad = low if low < 0 else high
                raise ValueError(
                    f"token id {bad} is outside the vocabulary 0..{self.vocab_size - 1}"
                )
        out: Tensor = self.embedding(ids)
        return out * math.sqrt(self.d_model) if self.scale else out

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, d_model={self.d_model}, scale={self.scale}"


class InputEmbedding(nn.Module):
    """The tutorials' input path: token ids → embedding → + positional encoding → dropout.

    Args:
        vocab_size: Number of token ids.
        d_model: Width of the embeddings.
        positional: ``"sinusoidal"``, ``"learned"``, ``"none"`` or ``"nope"`` (NoPE), or a
            module: an :class:`~posenc.torch.protocols.InputEncoding` (its ``encode`` is
            used) or one whose call is ``(x, *, positions=None, offset=0)``. A module,
            so that its parameters train, save and move with this one.
        dropout: Dropout after the addition.
        max_length: Initial table size (sinusoidal) or number of positions (learned).
        base: Sinusoid base ``n``.
        scale: Scale token vectors by ``√d_model``.
        padding_idx: Optional padding id for the token embedding.
        batch_first: ``True`` (default): ids are ``(batch, seq)``; ``False``: ``(seq,
            batch)``, for a named ``positional`` (a module given keeps its own, which
            must agree).

    Example:
        >>> layer = InputEmbedding(100, 16, dropout=0.0)
        >>> layer(torch.tensor([[5, 6, 7]])).shape
        torch.Size([1, 3, 16])
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        *,
        positional: str | nn.Module = "sinusoidal",
        dropout: float = 0.1,
        max_length: int = 5000,
        base: float = 10000.0,
        scale: bool = True,
        padding_idx: int | None = None,
        batch_first: bool = True,
    ) -> None:
        super().__init__()
        self.tokens = TokenEmbedding(vocab_size, d_model, scale=scale, padding_idx=padding_idx)
        batch_first = check_bool(batch_first, "batch_first")
        if isinstance(positional, str):
            positional = self._named(positional, d_model, dropout, max_length, base, batch_first)
        elif not isinstance(positional, nn.Module):
            raise TypeError(
                "positional must be a name or an nn.Module (an input encoding such as "
                f"SinusoidalPositionalEncoding), got {describe(positional)}"
            )
        elif getattr(positional, "batch_first", batch_first) != batch_first:
            raise ValueError(
                f"InputEmbedding(batch_first={batch_first}) was given a "
                f"{type(positional).__name__} with batch_first={not batch_first}: the two "
                "must read one layout"
            )
        self.positional = positional
        self.batch_first = batch_first

    @staticmethod
    def _named(
        positional: str,
        d_model: int,
        dropout: float,
        max_length: int,
        base: float,
        batch_first: bool,
    ) -> nn.Module:
        if positional == "sinusoidal":
            return SinusoidalPositionalEncoding(
                d_model, dropout, max_length, base, batch_first=batch_first
            )
        if positional == "learned":
            return LearnedPositionalEmbedding(max_length, d_model, dropout, batch_first=batch_first)
        if positional in ("none", "nope"):
            return NoPositionalEncoding(d_model, dropout, batch_first=batch_first)
        raise ValueError(
            "positional must be 'sinusoidal', 'learned', 'none', 'nope' or an "
            f"nn.Module, got {describe(positional)}"
        )

    def forward(self, ids: Tensor, *, positions: Tensor | None = None, offset: int = 0) -> Tensor:
        # An InputEncoding's role is its encode (looked up by name: cheaper than a
        # runtime-protocol isinstance); any other module is called.
        encode = getattr(self.positional, "encode", self.positional)
        encoded: Tensor = encode(self.tokens(ids), positions=positions, offset=offset)
        return encoded
