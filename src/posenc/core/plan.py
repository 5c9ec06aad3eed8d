"""What one call needs: the planner that every front end follows.

A front end knows what a call gives (a first position or explicit positions, query and
key lengths, whether the values are known or only traced, the index dtype) and what its
table holds. Everything that follows from that is decided here, once, for every front
end; the front end carries the plan out with its primitives (``_backend.py``: the same
names in every front end) and decides nothing itself:

* :func:`align_queries`: where the queries sit among the keys when no offset is given
  (the last ``Q`` of the ``K`` positions);
* :func:`scaling_length` and :func:`plan_scaling`: the length whose frequencies a
  length-dependent RoPE scaling uses for a call (the largest position of everything it
  attends to, + 1), or how a traced length selects them;
* :func:`table_format`: the format a table is kept in for an input's format;
* :func:`plan_rows`: which rows of a table a call with known positions reads: a slice,
  a gather, a table grown first, rows the core computes directly, or a refusal (the
  out-of-range policy of :mod:`posenc.core.positions`);
* :func:`plan_index`: how traced integer positions of any dtype (``int8`` to
  ``uint64``) are widened and bounded, so that a position outside the table is a NaN
  row and never another row;
* :func:`plan_call`: all of these that one call of a table-backed module needs, together
  (the length a scaling sees, its frequencies, the rows, the tables' format), as one
  :class:`CallPlan` on which the front end branches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .._checks import MAX_POSITION, check_int, position_error

__all__ = [
    "INDEX_RANGES",
    "CallPlan",
    "IndexPlan",
    "Past",
    "RowsPlan",
    "ScalingPlan",
    "align_queries",
    "check_scaling_length",
    "plan_call",
    "plan_index",
    "plan_rows",
    "plan_scaling",
    "scaling_length",
    "table_format",
    "traced_offset",
]


# ---------------------------------------------------------------------------------------
# Queries and keys


def align_queries(
    query_length: Any,
    key_length: Any = None,
    offset: Any = None,
    *,
    name: str = "",
    offset_name: str = "offset",
) -> tuple[int, int, int]:
    """``(query_length, key_length, offset)`` of a score bias, with the one convention.

    Keys sit at positions ``0 .. K-1`` and query ``i`` at ``offset + i``. Without an
    offset the queries are the **last** ``Q`` of the ``K`` positions, ``offset = K - Q``:
    with a KV cache (the only common call with fewer queries than keys) the queries are
    the newest tokens, and a bias for them must see every cached key before them. This
    is FlashAttention's bottom-right alignment of a causal mask with ``Q != K``; with
    ``Q == K`` it is offset 0. More queries than keys without an offset is an error
    (some queries would sit at negative positions), unless there are no keys.
    ``key_length=None`` means ``offset + Q`` (every cached token and the queries
    themselves; ``Q`` without an offset).

    Args:
        query_length: ``Q``, an int >= 0.
        key_length: ``K``, an int >= 0, or ``None``.
        offset: The position of the first query, an int >= 0, or ``None``.
        name: Who asks, for the error messages (``"ALiBiBias: "``).
        offset_name: What the caller calls the offset (Keras: ``"start_index"``).

    Example:
        >>> align_queries(2, 5), align_queries(2, 5, 0), align_queries(3), align_queries(1, None, 7)
        ((2, 5, 3), (2, 5, 0), (3, 3, 0), (1, 8, 7))
    """
    query_length = check_int(query_length, f"{name}query_length", minimum=0)
    if offset is None:
        if key_length is None:
            return query_length, query_length, 0
        key_length = check_int(key_length, f"{name}key_length", minimum=0)
        if query_length > key_length > 0:  # (no keys: an empty result, nothing to place)
            raise ValueError(
                f"{name}query_length={query_length} > key_length={key_length} with no "
                f"{offset_name}: without one the queries are the last query_length of the "
                f"key_length positions ({offset_name} = key_length - query_length, as with a "
                f"KV cache), which needs query_length <= key_length; pass {offset_name}= (the "
                "first query's position)"
            )
        offset = max(key_length - query_length, 0)
    else:
        offset = check_int(offset, f"{name}{offset_name}", minimum=0)
        if key_length is None:
            key_length = offset + query_length
        key_length = check_int(key_length, f"{name}key_length", minimum=0)
    largest = max(offset + query_length, key_length) - 1  # queries' and keys' positions
    if largest > MAX_POSITION:
        raise position_error(
            f"{name}positions",
            largest,
            f" (the last of {offset_name}={offset}, query_length={query_length}, "
            f"key_length={key_length})",
        )
    return query_length, key_length, offset


def traced_offset(query_length: Any, key_length: Any) -> Any:
    """:func:`align_queries`' offset ``key_length - query_length`` for lengths known only
    symbolically (a ``torch.SymInt``, a graph tensor): the same convention, unchecked.
    A front end whose lengths are only traced marks query rows at negative positions
    (``query_length > key_length``) as NaN where it can, since it cannot refuse them."""
    return key_length - query_length


# ---------------------------------------------------------------------------------------
# Length-dependent scalings


@dataclass(frozen=True)
class ScalingPlan:
    """The frequencies a call of a RoPE scaling uses.

    Attributes:
        seq_len: The length whose frequencies the call uses, for the core's
            ``spec.tables(..., seq_len=...)``; ``None``: the construction frequencies
            (every fixed scaling, and a length-dependent one up to its original length).
        switch: For a call whose length is only traced, of a scaling with two sets of
            frequencies (LongRoPE): the length past which the second set applies
            (``seq_len = switch + 1``); the front end gathers both and selects in the
            graph. ``None`` otherwise.
        by_length: For a call whose length is only traced, of a scaling whose
            frequencies change with every length (dynamic NTK), in a front end that keeps
            them per length (:func:`posenc.core.rope.lengths.length_turns`): select the
            traced length's in the graph.
    """

    seq_len: int | None = None
    switch: int | None = None
    by_length: bool = False


_FIXED = ScalingPlan()


def scaling_length(own: int | None, cached: int | None = None) -> int | None:
    """The length ``L`` whose frequencies a length-dependent RoPE scaling uses for a call.

    ``L`` is the largest position of everything the call attends to, + 1: its own
    positions' (``own``: ``offset + seq``, or ``max(positions) + 1``; ``None`` where they
    are only traced) and those of the keys a KV cache holds for it (``cached``: their
    largest position + 1; ``None``: no cache). Without a cache that is the call's own
    length, Hugging Face's rule. With one, a step whose position goes back (positions
    ``0, 1, 30, 31, 2``) still sees ``L = 32``, as the full call over every token does,
    so decoding equals the full call.

    Example:
        >>> scaling_length(3), scaling_length(3, 32), scaling_length(40, 32)
        (3, 32, 40)
    """
    if own is None or cached is None:
        return own
    return max(own, cached)


def check_scaling_length(own: int | None, length: Any, *, name: str = "") -> int | None:
    """A length given for a call (``length=``, a KV cache's :func:`scaling_length`),
    checked against the call's own (``own``; ``None``: traced, where none is taken):
    ``None`` means the call's own, and a given one must count the call's own positions.

    Example:
        >>> check_scaling_length(3, None), check_scaling_length(3, 32)
        (3, 32)
        >>> check_scaling_length(41, 3)
        Traceback (most recent call last):
        ...
        ValueError: length=3 is shorter than the call's own positions need (41: its largest \
position + 1); length is the largest position of every key attended + 1, the call's own \
included (a KVCache's scaling_length(...))
    """
    if length is None:
        return own
    given: int = check_int(length, f"{name}length", minimum=1)
    if own is None:
        raise ValueError(
            f"{name}length={given} is for calls whose positions are known (eager calls); "
            "compiled code takes the length of its positions"
        )
    if given < own:
        raise ValueError(
            f"{name}length={given} is shorter than the call's own positions need ({own}: "
            "its largest position + 1); length is the largest position of every key attended "
            "+ 1, the call's own included (a KVCache's scaling_length(...))"
        )
    return given


def plan_scaling(
    scaling: Any, length: int | None, *, name: str = "", by_length: bool = False
) -> ScalingPlan:
    """The frequencies of ``scaling`` for a call of ``length`` positions.

    The length is :func:`scaling_length`'s: the call's own largest position + 1
    (``offset + seq``, or ``max(positions) + 1``), as Hugging Face's
    ``dynamic_rope_update`` computes it, or with a KV cache the largest position of every
    key attended + 1; in every front end and with no state kept between calls (Hugging
    Face's module also keeps the longest length seen until a call falls back under the
    original length; the two agree whenever the length does not decrease above it: a
    prompt, then decoding). ``None``: the length is known only inside a trace. Then a scaling with
    two sets of frequencies (:attr:`~posenc.RopeScaling.switch_length`, LongRoPE)
    selects one in the graph, and any other length-dependent scaling (dynamic NTK), whose
    frequencies differ for every length, selects the traced length's from a table of
    every length where the front end keeps one (``by_length=True``: PyTorch), and is a
    ``ValueError`` elsewhere.

    Example:
        >>> from posenc.core.rope import DynamicNTKScaling
        >>> dynamic = DynamicNTKScaling(factor=2.0, original_max_position_embeddings=8)
        >>> plan_scaling(dynamic, 6).seq_len, plan_scaling(dynamic, 20).seq_len
        (None, 20)
        >>> plan_scaling(dynamic, None, by_length=True).by_length  # traced: per length
        True
    """
    if not scaling.length_dependent:
        return _FIXED
    original = scaling.original_length or 0
    if length is None:
        if scaling.switch_length is None and by_length:
            return ScalingPlan(by_length=True)
        if scaling.switch_length is None:
            raise ValueError(
                f"{name}scaling={scaling.name!r} recomputes the frequencies from the length L "
                "of each call (its largest position + 1), but here L is known only inside a "
                "trace (a traced or symbolic start, or traced positions); give positions "
                "known when the call runs (an int start and a static length), or use a "
                "fixed scaling such as 'ntk' or 'yarn'"
            )
        return ScalingPlan(switch=scaling.switch_length)
    scaled = scaling.scaled_length(length)
    return _FIXED if scaled <= original else ScalingPlan(seq_len=scaled)


# ---------------------------------------------------------------------------------------
# Table formats

TableKind = Literal["input", "rotation"]


def table_format(fmt: str, kind: TableKind) -> str:
    """The format a table is kept in for an input of format ``fmt``.

    ``"input"``: tables added to the input (sinusoidal) are rounded once to the input's
    own format. ``"rotation"``: rotation tables (RoPE, xPos, axial RoPE) stay float32
    unless the input is float64, and float16/bfloat16 queries and keys are rotated in
    float32 and cast back, as Hugging Face and torchtune do.

    Example:
        >>> table_format("bfloat16", "rotation"), table_format("bfloat16", "input")
        ('float32', 'bfloat16')
    """
    if kind == "input":
        return fmt
    return "float64" if fmt == "float64" else "float32"


# ---------------------------------------------------------------------------------------
# Rows of a call whose positions are known

Action = Literal["slice", "gather", "grow", "direct", "refuse"]
Past = Literal["grow", "compute", "refuse"]


@dataclass(frozen=True)
class RowsPlan:
    """Which rows of a table a call with known positions reads.

    Attributes:
        action: ``"slice"``: rows ``start .. end-1`` of the table; ``"gather"``: the
            rows at the call's positions, all inside the table; ``"grow"``: grow the
            table to hold rows ``0 .. end-1`` first (:func:`posenc.core.positions.grow`:
            at least doubling, or just ``end`` rows when the memory limit refuses the
            doubling; when it refuses ``end`` too, ``"direct"``), then slice or gather;
            ``"direct"``: the core computes the call's rows, the table stays as it is;
            ``"refuse"``: the table cannot give these rows (a learned embedding has no
            rows past it; compiled code cannot run the core): the front end raises.
        start: The first (contiguous call) or lowest (gathered call) position.
        end: One past the largest position.
    """

    action: Action
    start: int
    end: int


def plan_rows(
    rows: int,
    *,
    start: int | None = None,
    count: int | None = None,
    low: int | None = None,
    high: int | None = None,
    past: Past = "grow",
) -> RowsPlan:
    """The rows a call reads from a ``rows``-row table (positions ``0 .. rows-1``).

    A contiguous call gives ``start`` and ``count`` (positions ``start .. start +
    count - 1``); a gathered one gives the ``low``-est and ``high``-est of its positions
    (``None`` for no positions) and ``count``, its length: the positions of one sequence
    (a ``(batch, seq)`` tensor's ``seq``), so that the plan is the same for any batch.
    ``past`` is what the table can do about rows past it: ``"grow"`` (a module's table),
    ``"compute"`` (a table that never grows: the core computes the call's rows),
    ``"refuse"`` (a learned embedding; a table under ``torch.compile``).
    A negative position is computed by the core directly (only the NumPy and JAX
    functions accept one; the modules refuse it before planning).

    **The growth rule**, one for every way positions arrive: a table grows for a call
    whose rows end within twice the table plus the call's length (``end - count <= 2 *
    rows``). For a contiguous call that is one that starts within twice the table (a
    longer prompt, decoding one token after another); for gathered positions it bounds
    the growth by the call's own size: ``[0, 3_000_000]`` on a 256-row table, one far
    position or a far offset get only their own rows from the core (``"direct"``), and
    the table stays as it was.

    Example:
        >>> plan_rows(8, start=2, count=4), plan_rows(8, start=6, count=4)
        (RowsPlan(action='slice', start=2, end=6), RowsPlan(action='grow', start=6, end=10))
        >>> plan_rows(8, start=1000, count=1).action, plan_rows(8, low=3, high=7, count=2).action
        ('direct', 'gather')
        >>> plan_rows(8, low=0, high=20, count=5).action  # 21 rows for 5 positions: grow
        'grow'
        >>> plan_rows(8, low=0, high=3_000_000, count=2).action  # two far-apart positions
        'direct'
        >>> plan_rows(8, start=6, count=4, past="refuse").action
        'refuse'
    """
    action: Action
    if (start is not None or low is not None) and count is None:
        raise TypeError("plan_rows: a call with positions gives count, its length")
    count = count or 0
    if start is not None:
        first, end, action = start, start + count, "slice"
    elif low is None or high is None:
        return RowsPlan("gather", 0, 0)  # no positions: nothing to read
    else:
        first, end, action = low, high + 1, "gather"
    if first >= 0 and end <= rows:
        return RowsPlan(action, first, end)
    if past == "refuse":
        return RowsPlan("refuse", first, end)
    if past == "compute" or first < 0 or end - count > 2 * rows:
        return RowsPlan("direct", first, end)
    return RowsPlan("grow", first, end)


# ---------------------------------------------------------------------------------------
# One call

Source = Literal["tables", "core", "by_length"]


@dataclass(frozen=True)
class CallPlan:
    """Everything one call of a module with position tables needs (:func:`plan_call`).

    Attributes:
        fmt: The format of the call's rows (:func:`table_format` of the input's).
        length: The length ``L`` a length-dependent scaling sees: the call's own (its
            largest position + 1) or the ``length=`` given (a KV cache's), checked;
            ``None`` where the positions are known only inside a trace.
        scaling: The frequencies the call uses (:func:`plan_scaling`).
        source: Where the rows come from. ``"tables"``: the tables, at :attr:`rows`
            (with a scaling of two sets of frequencies: the second set's table past its
            switch, ``scaling.seq_len``; both, selected in the graph, for a traced length,
            ``scaling.switch``). ``"core"``: the core computes the call's rows with the
            frequencies of ``scaling.seq_len`` (a scaling whose frequencies change with
            every length, past its original length); no table is read. ``"by_length"``:
            the frequencies of the call's length, selected in the graph from those the
            front end keeps per length (``by_length=True``: PyTorch).
        rows: With ``source="tables"`` and known positions, the rows to read
            (:func:`plan_rows`: slice, gather, grow, direct or refuse). ``None``
            otherwise: traced positions are gathered as :func:`plan_index` says, a
            position outside the table giving a NaN row.
    """

    fmt: str
    length: int | None
    scaling: ScalingPlan
    source: Source
    rows: RowsPlan | None

    @property
    def in_table(self) -> bool:
        """Whether the rows are in the (first) table as it is: a slice or a gather with
        the construction frequencies, nothing to grow, compute or select; a decoding
        step's fast path needs nothing else."""
        return (
            self.source == "tables"
            and self.scaling == _FIXED
            and self.rows is not None
            and self.rows.action in ("slice", "gather")
        )


def plan_call(
    rows: int,
    *,
    start: int | None = None,
    count: int | None = None,
    low: int | None = None,
    high: int | None = None,
    traced: bool = False,
    length: Any = None,
    scaling: Any = None,
    by_length: bool = False,
    past: Past = "grow",
    fmt: str = "float32",
    kind: TableKind = "rotation",
    name: str = "",
) -> CallPlan:
    """Everything one call needs, decided once: the front end branches on the answer.

    The call's positions are a run (``start``, ``count``: :func:`plan_rows`), known
    gathered positions (their ``low``-est and ``high``-est, ``None`` for none, and
    ``count``, one sequence's length), or values known only inside a trace
    (``traced=True``: a traced start or traced positions, a symbolic length). From them
    and the table's ``rows``, this function decides:

    * the length a length-dependent ``scaling`` sees: the call's own largest position
      + 1, or ``length`` (a KV cache's: :func:`check_scaling_length` checks it);
    * the frequencies (:func:`plan_scaling`): those of construction; a second set past a
      switch (LongRoPE), both for a traced length, selected in the graph; or, for a
      scaling whose frequencies change with every length (dynamic NTK) past its
      original length, the call's rows from the core (``source="core"``);
    * for a traced length of such a scaling, what the front end can do:
      ``by_length=True`` says it keeps the frequencies of every length and selects the
      traced length's in the graph (PyTorch, :mod:`posenc.core.rope.lengths`); with
      ``by_length=False`` (Keras, JAX: their graphs hold only tables) it is a
      ``ValueError`` that names the scaling and what to use instead. This parameter is
      the only difference between the front ends' plans;
    * the rows of the tables (:func:`plan_rows`, the out-of-range policy) for known
      positions, with ``past`` what the table can do past its end: ``"grow"`` (a
      module's table), ``"compute"`` (a table that never grows: the core computes the
      call's rows), ``"refuse"`` (compiled PyTorch code, which cannot run the core: then
      a length's own frequencies come from those kept per length, ``by_length``);
    * the format of the rows: :func:`table_format` of the input's ``fmt`` for a table of
      ``kind``.

    Args:
        rows: The rows the table holds now (positions ``0 .. rows-1``).
        start, count, low, high: The call's positions, as :func:`plan_rows` takes them.
        traced: Whether the positions are known only inside a trace.
        length: ``None`` (the call's own) or the length given for the call (``length=``).
        scaling: The spec's :class:`~posenc.core.rope.RopeScaling`; ``None`` for a
            table without one (sinusoidal).
        by_length: Whether the front end keeps the frequencies of every length (above).
        past: What the table can do about rows past it (above).
        fmt: The input's format (``"bfloat16"``, ...).
        kind: ``"rotation"`` or ``"input"`` (:func:`table_format`).
        name: Who asks, for the error messages (``"RotaryEmbedding: "``).

    Example:
        >>> from posenc.core.rope import DynamicNTKScaling, LongRopeScaling
        >>> plan = plan_call(8, start=6, count=4, fmt="bfloat16")  # past the table: grow
        >>> plan.fmt, plan.length, plan.source, plan.rows
        ('float32', 10, 'tables', RowsPlan(action='grow', start=6, end=10))
        >>> plan_call(8, start=7, count=1).in_table  # a decoding step inside the table
        True
        >>> dynamic = DynamicNTKScaling(factor=2.0, original_max_position_embeddings=8)
        >>> plan = plan_call(64, low=0, high=19, count=20, scaling=dynamic)
        >>> plan.source, plan.scaling.seq_len, plan.rows  # L = 20: its own frequencies
        ('core', 20, None)
        >>> plan_call(64, start=0, count=4, length=32, scaling=dynamic).scaling.seq_len
        32
        >>> plan_call(64, traced=True, scaling=dynamic, by_length=True).source
        'by_length'
        >>> long = LongRopeScaling(short_factor=[1.0], long_factor=[4.0],
        ...                        original_max_position_embeddings=8, attention_factor=1.0)
        >>> plan_call(64, traced=True, scaling=long).scaling.switch  # selected in the graph
        8
    """
    if traced:
        own = None
    else:
        if (start is not None or low is not None) and count is None:
            raise TypeError("plan_call: a call with positions gives count, its length")
        own = start + (count or 0) if start is not None else (0 if high is None else high + 1)
    # (the common calls, a decoding step included, skip the two checks they do not need)
    seen = own if length is None else check_scaling_length(own, length, name=name)
    plan = _FIXED
    if scaling is not None and scaling.length_dependent:
        plan = plan_scaling(scaling, seen, name=name, by_length=by_length)
    table = table_format(fmt, kind)
    if plan.by_length:
        return CallPlan(table, seen, plan, "by_length", None)
    if plan.seq_len is not None and scaling.switch_length is None:  # this length's own
        if past != "refuse":
            return CallPlan(table, seen, plan, "core", None)
        if not by_length:
            raise ValueError(
                f"{name}scaling={scaling.name!r} needs the frequencies of length "
                f"{plan.seq_len} for this call, which the core cannot compute here; give a "
                "fixed scaling, or call outside compiled code"
            )
        return CallPlan(table, seen, plan, "by_length", None)
    if traced:
        return CallPlan(table, seen, plan, "tables", None)
    rows_plan = plan_rows(rows, start=start, count=count, low=low, high=high, past=past)
    return CallPlan(table, seen, plan, "tables", rows_plan)


# ---------------------------------------------------------------------------------------
# Traced indices

# The integer dtypes positions may have, by name: (lowest, highest) value.
INDEX_RANGES: dict[str, tuple[int, int]] = {
    **{f"int{bits}": (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) for bits in (8, 16, 32, 64)},
    **{f"uint{bits}": (0, 2**bits - 1) for bits in (8, 16, 32, 64)},
}


@dataclass(frozen=True)
class IndexPlan:
    """How a front end reads a table at traced integer positions of one dtype.

    The positions are converted to ``dtype`` (the widest index type the front end uses)
    after saturating them to ``clip`` in their own dtype, where the cast could otherwise
    wrap (``uint64`` → ``int64``, ``int64`` → ``int32``): a saturated position stays
    outside the table, never another row. In ``dtype`` the bounds ``0 <= p < rows`` are
    then exact (``rows`` fits in it, and so does every converted position), so a
    position outside the table gives a NaN row. A run ``start + i`` (``i < count``, the
    front ends' ``index_range``) is formed in ``dtype`` after the saturation: where the
    sum overflows it wraps a position past the table to a negative one, still outside.

    Attributes:
        rows: The table's rows: valid positions are ``0 .. rows-1``.
        dtype: The integer dtype the index arithmetic runs in.
        clip: ``(low, high)`` to saturate to in the positions' own dtype before the cast;
            ``None`` where the cast is exact.
    """

    rows: int
    dtype: str
    clip: tuple[int, int] | None


def plan_index(dtype: Any, rows: int = 0, *, wide: str) -> IndexPlan:
    """The :class:`IndexPlan` for traced positions of ``dtype`` (a name, ``"int8"``).

    ``wide`` is the front end's index dtype (``"int64"`` in PyTorch and in JAX's 64-bit
    mode, ``"int32"`` in Keras and JAX otherwise). ``rows`` is the table's (0 where a
    front end only widens a traced offset, before it knows the table).

    Example:
        >>> plan_index("int8", 300, wide="int32")
        IndexPlan(rows=300, dtype='int32', clip=None)
        >>> plan_index("uint64", 300, wide="int64")
        IndexPlan(rows=300, dtype='int64', clip=(0, 9223372036854775807))
    """
    name = str(dtype)
    if name not in INDEX_RANGES:
        raise TypeError(
            f"traced positions must have an integer dtype ({', '.join(INDEX_RANGES)}), got {name}"
        )
    low, high = INDEX_RANGES[name]
    wide_low, wide_high = INDEX_RANGES[wide]
    if rows > wide_high:
        raise ValueError(
            f"a table of {rows} rows cannot be indexed with {wide} positions (at most "
            f"{wide_high} rows)"
        )
    exact = low >= wide_low and high <= wide_high
    return IndexPlan(rows, wide, None if exact else (max(low, wide_low), min(high, wide_high)))
