"""Score biases of the length-generalisation papers: KERPLE, FIRE and Sandwich.

Each plays the :class:`~posenc.torch.protocols.ScoreBias` role, as ALiBi and T5 do: a
bias ``(heads, query, key)`` (``(batch, heads, query, key)`` with batched positions) that
the attention adds to its scaled scores. Keys sit at ``0 .. k-1`` and queries at
``offset .. offset+q-1`` (no offset: the last ``q`` of the ``k`` positions), or both are
given (``positions=``, ``key_positions=``).

==========  ============================================================================
module      bias of query position ``m`` and key position ``n``
==========  ============================================================================
KERPLE      ``-p_h·log(1 + a_h·|m - n|)`` or ``-a_h·|m - n|^p_h``, ``p_h`` and ``a_h``
            learned per head (Chi et al., 2022)
FIRE        ``f_θ(ψ(m - n) / ψ(max(L, m)))``, ``ψ(x) = log(c·|x| + 1)``: a small MLP of the
            distance, normalised by the query's own position; ``f_θ``, ``c`` and ``L``
            learned (Li et al., 2023)
Sandwich    ``(Σ_i cos((m - n)·base^(-2i/d)) - d/2)·H/(8h)``, no weights: the numbers
            come from the core (:func:`posenc.sandwich_bias`; Chi et al., 2023)
==========  ============================================================================
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from .._checks import (
    DEFAULT_MAX_BYTES,
    MemoryLimitError,
    check_max_length,
    check_memory,
    check_weights,
    check_width,
)
from ..core.plan import plan_index, plan_rows
from ..core.positions import grow
from ..specs import FireSpec, KerpleSpec, SandwichSpec
from ..specs.base import module_from_spec
from ._arguments import check_device
from ._backend import dtype_name, format_of, gather_rows, is_traced, to_tensor, wide_index
from ._relative import call_positions, relative_positions
from ._tables import PositionTables
from .protocols import BiasesScores
from .score_mods import distance_score_mod, read_positions

__all__ = ["FIREBias", "KERPLEBias", "SandwichBias"]


def _positions(
    module: nn.Module,
    query_length: int,
    key_length: int | None,
    offset: int | None,
    positions: Tensor | None,
    key_positions: Tensor | None,
    device: torch.device,
    entry_bytes: int,
) -> tuple[Tensor, Any]:
    """``(key position - query position, offset)`` of a call: ``(q, k)`` or ``(batch, q,
    k)``, and the first query's position (0 with explicit positions)."""
    return relative_positions(
        query_length, key_length, offset, positions, key_positions, device,
        type(module).__name__, entry_bytes,
    )  # fmt: skip


def _check_cast(module: nn.Module, dtype: torch.dtype | None, device: Any) -> Any:
    """The call's ``dtype`` (a float one, or None) and ``device`` checked before any work;
    the device as a ``torch.device`` (or None)."""
    if dtype is not None:
        format_of(dtype)  # a float dtype: an integer one would truncate the bias
    return check_device(device, type(module).__name__)


def _cast(bias: Tensor, dtype: torch.dtype | None, device: Any) -> Tensor:
    """``bias`` in ``dtype`` (None: as it is) on ``device`` (None: where it is)."""
    return bias.to(device=device, dtype=dtype)


def _distances(length: int) -> np.ndarray:
    """The distances ``0 .. length-1`` of a table (a ``MemoryLimitError`` before they are
    made when the table would outgrow the limit; the core then weighs the table itself)."""
    check_memory(8 * length, f"a table of {length} distances", DEFAULT_MAX_BYTES)
    return np.arange(length)


class KERPLEBias(BiasesScores):
    """KERPLE (Chi et al., 2022): a learned kernel of the distance per head.

    Two parameters per head, named and drawn as in the authors' GPT-NeoX code
    (``bias_p = 2·U(0, 1)``, then ``bias_a = U(0, 1)``), in the roles that code gives them:

    * ``"log"``: ``-bias_p·log(1 + bias_a·|m - n|)`` (``ParallelKerpleLog``);
    * ``"power"``: ``-bias_a·|m - n|^bias_p``, the exponent ``bias_p`` at most 2
      (``ParallelKerplePower``).

    Both stay at ``eps`` or more: as in the authors' code, a call first projects them
    back into range, in place, when an optimizer step has moved them out (so never
    between a forward and its backward, whose graph stays valid; on a GPU the check
    reads two small tensors back). Traced code (``torch.compile``, ``torch.export``)
    cannot update in place: it uses the projected values and passes their gradient to the
    parameters unchanged (straight through), so a parameter out of range keeps a
    gradient, but stays out of range (and the value used at the bound) until that
    gradient brings it back: compiled training can differ from eager training there.

    Args:
        num_heads: Number of heads.
        kernel: ``"log"`` or ``"power"``.
        eps: The least value of both parameters (0.01).

    Call arguments:
        As for :class:`ALiBiBias`; ``dtype=None`` keeps the parameters' dtype.

    The parameters are ``(heads, 1, 1)``, as the authors', so their weights load directly.

    Example:
        >>> bias = KERPLEBias(2)
        >>> with torch.no_grad():
        ...     _ = bias.bias_p.fill_(1.0), bias.bias_a.fill_(1.0)
        >>> bias(3)[0]  # -log(1 + |m - n|)
        tensor([[-0.0000, -0.6931, -1.0986],
                [-0.6931, -0.0000, -0.6931],
                [-1.0986, -0.6931, -0.0000]], grad_fn=<SelectBackward0>)

    References:
        Chi, Fan, Ramadge and Rudnicky, "KERPLE: Kernelized Relative Positional Embedding
        for Length Extrapolation", NeurIPS 2022; https://github.com/chijames/KERPLE
        (``megatron/mpu/layers.py``).
    """

    spec_class = KerpleSpec
    # the bias as a FlexAttention score_mod: a function of the head and the distance
    score_mod = distance_score_mod

    def __init__(self, num_heads: int, *, kernel: str = "log", eps: float = 0.01) -> None:
        super().__init__()
        self.spec = KerpleSpec(num_heads=num_heads, kernel=kernel, eps=eps)
        heads = check_width(self.spec.num_heads, "num_heads")  # two parameters per head
        eps = self.spec.eps
        self._top = 2.0 if self.spec.kernel == "power" else None  # the exponent's largest value
        # a draw below eps starts at eps (the authors' code clamps it at the first call)
        p = (torch.rand(heads) * 2).clamp(min=eps, max=self._top)
        a = torch.rand(heads).clamp(min=eps)
        self.bias_p = nn.Parameter(p[:, None, None])
        self.bias_a = nn.Parameter(a[:, None, None])

    @classmethod
    def from_spec(cls, spec: KerpleSpec, **options: Any) -> KERPLEBias:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @property
    def num_heads(self) -> int:
        """Heads: ``spec.num_heads`` (the :class:`~posenc.torch.protocols.ScoreBias`
        role's attribute)."""
        return self.spec.num_heads

    @torch.no_grad()
    def _project(self) -> None:
        """Both parameters ``>= eps`` (the power kernel's exponent ``<= 2``), in place."""
        eps = self.spec.eps
        for parameter, top in ((self.bias_p, self._top), (self.bias_a, None)):
            outside = parameter < eps
            if top is not None:
                outside = outside | (parameter > top)
            if bool(outside.any()):
                parameter.clamp_(min=eps, max=top)

    def _projected(self) -> tuple[Tensor, Tensor]:
        """``(bias_p, bias_a)`` in range: projected in place eagerly; while tracing, the
        clamped values with the parameters' own gradient (straight through)."""
        p: Tensor = self.bias_p
        a: Tensor = self.bias_a
        if not (is_traced() or p.is_meta):  # (meta parameters: no values to project)
            self._project()
            return p, a
        eps = self.spec.eps
        p = p + (p.clamp(min=eps, max=self._top) - p).detach()
        a = a + (a.clamp(min=eps) - a).detach()
        return p, a

    def forward(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: int | None = None,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> Tensor:
        device = _check_cast(self, dtype, device)
        p, a = self._projected()  # (H, 1, 1) each
        own, spec = p.device, self.spec
        per_entry = 8 + 3 * spec.num_heads * p.element_size()
        rel, offset = _positions(
            self, query_length, key_length, offset, positions, key_positions, own, per_entry
        )  # (..., q, k)
        distance = rel.abs().to(p.dtype).unsqueeze(-3)  # (..., 1, q, k)
        # log: -p·log(1 + a·d); power: -a·d^p (the authors' roles of the two)
        bias = -p * torch.log1p(a * distance) if spec.kernel == "log" else -a * distance.pow(p)
        return _cast(bias, dtype, device)  # (..., H, q, k)

    def extra_repr(self) -> str:
        spec = self.spec
        return f"num_heads={spec.num_heads}, kernel={spec.kernel!r}, eps={spec.eps:g}"


class FIREBias(BiasesScores):
    """FIRE (Li et al., 2023): a learned function of the progressively normalised distance.

    ``bias[h, m, n] = f_θ(ψ(m - n) / (ψ(max(L, m)) + eps))[h]`` with ``ψ(x) = log(|c·x| +
    1)``: the distance on a log scale, divided by that of the query's own position (but
    at least ``L``), so every query sees distances in ``[0, 1]`` however long the
    sequence. ``f_θ`` is an MLP ``1 → mlp_width → heads`` with a ReLU; ``c`` and ``L``
    (as a multiplier of ``init_L``) are learned too, as in the paper's code.

    Args:
        num_heads: Number of heads (the MLP's outputs).
        mlp_width: Hidden units of the MLP (32).
        init_c: Initial ``c`` (0.1).
        init_L: Initial ``L`` (512, for the paper's 2,048 training positions); the learned
            ``L`` is ``|L_multiplier · init_L|``, ``L_multiplier`` starting at 1.
        eps: Added to the normaliser (1e-6).

    Call arguments:
        As for :class:`ALiBiBias`; ``dtype=None`` keeps the parameters' dtype.

    Example:
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> FIREBias(4)(5, offset=3).shape  # 5 queries after 3 cached tokens, 8 keys
        torch.Size([4, 5, 8])

    References:
        Li, You, Guruganesh, Ainslie, Ontañón, Zaheer, Sanghai, Yang, Kumar and
        Bhojanapalli,
        "Functional Interpolation for Relative Positions Improves Long Context
        Transformers", ICLR 2024 (arXiv:2310.04418).
    """

    spec_class = FireSpec

    init_L: Tensor

    def __init__(
        self,
        num_heads: int,
        *,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_L: float = 512.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.spec = FireSpec(
            num_heads=num_heads, mlp_width=mlp_width, init_c=init_c, init_L=init_L, eps=eps
        )
        # c and L become parameters of the default dtype
        self.spec.check_parameter_format(format_of(torch.get_default_dtype()), "FIREBias")
        width, heads = self.spec.mlp_width, self.spec.num_heads
        check_width(width, "mlp_width")
        check_width(heads, "num_heads")
        check_weights({"mlp_width": width, "num_heads": heads}, "FIREBias's MLP")
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, heads))
        self.c = nn.Parameter(torch.tensor(self.spec.init_c))
        self.register_buffer("init_L", torch.tensor(self.spec.init_L))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))

    @classmethod
    def from_spec(cls, spec: FireSpec, **options: Any) -> FIREBias:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @property
    def num_heads(self) -> int:
        """Heads: ``spec.num_heads`` (the :class:`~posenc.torch.protocols.ScoreBias`
        role's attribute)."""
        return self.spec.num_heads

    def forward(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: int | None = None,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> Tensor:
        device = _check_cast(self, dtype, device)
        c = self.c
        own, spec = c.device, self.spec
        # per entry: the distance, its transform, the hidden layer and the output
        per_entry = 8 + (3 + spec.mlp_width + spec.num_heads) * c.element_size()
        rel, offset = _positions(
            self, query_length, key_length, offset, positions, key_positions, own, per_entry
        )  # (..., q, k), key - query
        if positions is None:
            query = torch.arange(offset, offset + rel.shape[-2], device=own)  # (q,)
        else:
            query = positions.to(own)  # (q,) or (batch, q)
        distance = (-rel).to(c.dtype)  # m - n: >= 0 for the keys a causal query sees
        threshold = (self.L_multiplier * self.init_L.to(c.dtype)).abs()
        normaliser = torch.maximum(query.to(c.dtype), threshold).unsqueeze(-1)  # (..., q, 1)
        normaliser = torch.log(torch.abs(c * normaliser) + 1) + spec.eps
        interpolated = torch.log(torch.abs(c * distance) + 1) / normaliser  # (..., q, k)
        bias = self.mlp(interpolated.unsqueeze(-1)).movedim(-1, -3)  # (..., H, q, k)
        return _cast(bias, dtype, device)

    def score_mod(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: int | None = None,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> Any:
        """The bias as a FlexAttention ``score_mod`` (arguments as for the call).

        FIRE's bias reads the query's own position as well as the distance, so no table
        of distances holds it: the ``score_mod`` evaluates the same function score by
        score, the MLP written out unit by unit (``mlp_width`` products per score). It
        equals the call's bias to float32 rounding (the sums run in another order)."""
        _check_cast(self, dtype, device)  # the bias is computed where FlexAttention runs
        c = self.c
        own = c.device
        queries, keys, first, _ = call_positions(
            query_length, key_length, offset, positions, key_positions, own, "FIREBias"
        )
        query = read_positions(positions, first, queries, own)
        key = read_positions(key_positions, 0, keys, own)
        threshold = (self.L_multiplier * self.init_L.to(c.dtype)).abs()
        hidden, output = cast(nn.Linear, self.mlp[0]), cast(nn.Linear, self.mlp[2])
        w1, b1 = hidden.weight[:, 0], hidden.bias  # (W,), (W,)
        w2, b2 = output.weight, output.bias  # (H, W), (H,)
        eps, width, precision = self.spec.eps, self.spec.mlp_width, c.dtype

        def mod(score: Tensor, b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
            m = query(b, q)  # the query's position
            distance = (m - key(b, k)).to(precision)
            normaliser = torch.log(torch.abs(c * torch.maximum(m.to(precision), threshold)) + 1)
            x = torch.log(torch.abs(c * distance) + 1) / (normaliser + eps)
            bias = b2[h]
            for unit in range(width):  # the MLP: Linear(1, W), ReLU, Linear(W, H)
                bias = bias + w2[h, unit] * torch.relu(w1[unit] * x + b1[unit])
            return score + (bias if dtype is None else bias.to(dtype))

        # PyTorch 2.13's CPU code generator cannot lower this program with symbolic
        # lengths: flex_attention compiles it for each call's shapes there
        mod.static_shapes = True  # type: ignore[attr-defined]
        return mod

    def extra_repr(self) -> str:
        return f"num_heads={self.spec.num_heads}, mlp_width={self.spec.mlp_width}"


class SandwichBias(PositionTables, BiasesScores):
    """Sandwich (Chi et al., 2023): the dot product of sinusoidal position vectors.

    No weights: the bias of every distance ``0 .. n-1`` comes from the core
    (:meth:`posenc.SandwichSpec.distance_bias`, float64), kept as the buffer ``table``
    ``(n, heads)``; a call gathers its distances and rounds once to ``dtype``. Past the
    table, as every posenc table (:mod:`posenc.core.positions`): it grows, at least
    doubling; when the memory limit refuses that, the call gets its own values from the
    core and the table stays; while tracing (``torch.compile``, ``torch.export``) a
    distance past the table gives NaN.

    Args:
        num_heads: Number of heads; head ``h`` (1-based) takes ``H / (8h)`` of the bias.
        dim: Width ``d`` of the sinusoidal vectors (even); the bench uses the model width.
        base: Their base (10000).
        mode: ``"causal"`` (0 for future keys) or ``"symmetric"``.
        max_length: Distances the first table covers (it grows as needed), an int >= 1.

    Call arguments:
        As for :class:`ALiBiBias`.

    Example:
        >>> SandwichBias(2, dim=4, base=2.0)(3, dtype=torch.float64)[1].round(decimals=4)
        tensor([[ 0.0000,  0.0000,  0.0000],
                [-0.0453,  0.0000,  0.0000],
                [-0.1630, -0.0453,  0.0000]], dtype=torch.float64)

    References:
        Chi, Fan, Rudnicky and Ramadge, "Dissecting Transformer Length Extrapolation via
        the Lens of Receptive Field Analysis", ACL 2023.
    """

    spec_class = SandwichSpec
    # the bias as a FlexAttention score_mod: a function of the head and the distance
    score_mod = distance_score_mod

    table: Tensor

    def __init__(
        self,
        num_heads: int,
        *,
        dim: int,
        base: float = 10000.0,
        mode: str = "causal",
        max_length: int = 1024,
    ) -> None:
        super().__init__()
        self.spec = SandwichSpec(num_heads=num_heads, dim=dim, base=base, mode=mode)
        check_width(self.spec.dim, "dim")  # its frequencies: one per pair of the width
        self._length = check_max_length(max_length)
        self._register_derived(("table",), torch.float64)

    @classmethod
    def from_spec(cls, spec: SandwichSpec, **options: Any) -> SandwichBias:
        """The module of ``spec`` with options of its own."""
        return module_from_spec(cls, spec, options)

    @property
    def num_heads(self) -> int:
        """Heads: ``spec.num_heads`` (the :class:`~posenc.torch.protocols.ScoreBias`
        role's attribute)."""
        return self.spec.num_heads

    def _share_key(self) -> None:
        return None  # not shared: the table grows by itself (_install), a module's own state

    def _derive_buffers(
        self, dtype: torch.dtype, device: torch.device, rows: int | None = None
    ) -> dict[str, Tensor]:
        try:
            return {"table": self._rows(_distances(self._length), device)}
        except MemoryLimitError as error:
            raise error.naming(
                f"SandwichBias (a table of {self._length} distances, max_length or grown)",
                "use a smaller max_length (the table grows as calls need it)",
            ) from None

    def _table_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float64  # the table stays float64; each call rounds once

    def forward(
        self,
        query_length: int,
        key_length: int | None = None,
        *,
        offset: int | None = None,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | None = None,
    ) -> Tensor:
        format_of(dtype)  # required here: the table is float64, each call rounds once
        device = _check_cast(self, dtype, device)
        own, mode = self.table.device, self.spec.mode
        per_entry = 8 + self.spec.num_heads * (8 + torch.empty((), dtype=dtype).element_size())
        rel, offset = _positions(
            self, query_length, key_length, offset, positions, key_positions, own, per_entry
        )  # (..., q, k), key - query
        distance = (-rel).clamp(min=0) if mode == "causal" else rel.abs()
        table, index = self.table, None
        if is_traced() or distance.is_meta:  # distances unknown: NaN past the table
            index = plan_index(dtype_name(distance), self._length, wide=wide_index())
        elif distance.numel():
            longest = self._longest(distance, offset, positions is None and key_positions is None)
            plan = plan_rows(self._length, low=0, high=longest - 1, count=distance.shape[-1])
            grown = None  # the one out-of-range policy (posenc.core.positions)
            if plan.action == "grow":
                grown = grow(lambda length: self._install(length, own), plan.end, self._length)
                table = table if grown is None else grown
            if plan.action == "direct" or (plan.action == "grow" and grown is None):
                # far apart, or a table the memory limit refused: this call's distances only
                distinct, where = np.unique(distance.cpu().numpy(), return_inverse=True)
                table = self._rows(distinct, own)
                distance = torch.from_numpy(where).to(own).view(distance.shape)
        bias = gather_rows(table, distance, index)  # (..., q, k, H), float64
        return bias.movedim(-1, -3).to(device=device, dtype=dtype)  # (..., H, q, k), rounded once

    def _install(self, length: int, device: Any) -> Tensor:
        """The table of ``length`` distances, made this module's (a ``MemoryLimitError``,
        and the table kept, when the limit refuses it)."""
        table = self._rows(_distances(length), device)  # may be refused
        holder, fmt = self._holder, self._fmt
        assert holder is not None  # registered in __init__, in a format
        assert fmt is not None
        holder.entry.replace({fmt: (table,)}, length)  # the module's own entry
        self._length = length
        return table

    def _longest(self, distance: Tensor, offset: int, plain: bool) -> int:
        """One past the longest distance of a call; for queries at ``offset ..`` and keys at
        ``0 ..`` from the sizes alone (no read of a device tensor)."""
        if not plain:
            return int(distance.max()) + 1
        queries, keys = distance.shape[-2], distance.shape[-1]
        back = max(offset + queries - 1, 0)  # the last query to the first key
        ahead = max(keys - 1 - offset, 0)  # the first query to the last key
        return (back if self.spec.mode == "causal" else max(back, ahead)) + 1

    def _rows(self, distances: np.ndarray, device: Any) -> Tensor:
        """The bias at each of ``distances`` (flattened), ``(n, H)`` float64, from the core
        (a ``MemoryLimitError`` when the limit refuses it)."""
        values = self.spec.distance_bias(distances.ravel())  # (H, n)
        if not np.all(np.isfinite(values)):  # a base so far below 1 that frequencies overflow
            raise ValueError(
                f"SandwichBias: base={self.spec.base!r} with dim={self.spec.dim} gives non-finite "
                "biases (its frequencies overflow float64); use a base > 1"
            )
        return to_tensor(np.ascontiguousarray(values.T), "float64", device)

    def extra_repr(self) -> str:
        spec = self.spec
        return f"num_heads={spec.num_heads}, dim={spec.dim}, mode={spec.mode!r}"
