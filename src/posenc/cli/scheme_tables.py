"""The numbers of each scheme for ``posenc table``: one builder per scheme.

A builder takes the parsed, resolved options (:mod:`.table`; ``max_bytes`` from
``--max-bytes`` bounds every table it builds) and returns a
:class:`Table`: the JSON record, the CSV matrix with its header and index columns, the
``.npy`` payload and the text blocks of one scheme, each text block under a heading line
that says what it holds. The numbers come from the scheme's spec (:mod:`posenc.specs`) or
the core; RoPE's scaling options become a spec through the registry's one parser,
:func:`posenc.core.rope.as_rope_scaling`, so a scaling registered at run time works here
as the built-in ones do.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np

from .._checks import check_memory
from ..core.nope import nope
from ..core.rope import as_rope_scaling, rope_scaling_spec
from ..core.t5 import relative_position_bucket, relative_positions
from ..specs import AlibiSpec, NopeSpec, RopeSpec, SinusoidalSpec
from .base import UsageError

__all__ = ["SCHEME_TABLES", "Table"]

TextBlocks = list[tuple[str | None, np.ndarray | None]]


class Table:
    """One scheme's output: the JSON record, the CSV matrix, the npy payload, text blocks.

    The CSV file is a header row, ``columns``, then one row per row of ``csv``, after the
    integer ``index`` columns (``(rows, k)``: the position, or the head and the query)
    that the first ``k`` names of ``columns`` name.
    """

    def __init__(
        self,
        record: dict[str, Any],
        csv: np.ndarray,
        npy: np.ndarray | dict[str, np.ndarray],
        text: TextBlocks,
        *,
        columns: list[str],
        index: np.ndarray,
    ) -> None:
        self.record, self.csv, self.npy, self.text = record, csv, npy, text
        self.columns, self.index = columns, index


def _numbered(name: str, count: int) -> list[str]:
    """CSV column names ``name_0 .. name_{count-1}``."""
    return [f"{name}_{j}" for j in range(count)]


def _span(args: argparse.Namespace, width: int) -> str:
    """The rows and columns of a table by position, for its text heading."""
    if not args.length:
        return f"0 positions x {width}"
    return f"positions {args.start}..{args.start + args.length - 1} x {width}"


def _positions(args: argparse.Namespace) -> np.ndarray:
    """The position of each row, ``start .. start + length - 1``: the JSON record's
    ``"positions"`` lists them all (``[5, 6, 7]``), never a range that reads as two."""
    return np.arange(args.start, args.start + args.length, dtype=np.int64)


def sinusoidal_table(args: argparse.Namespace) -> Table:
    """The ``(length, d_model)`` sinusoidal table."""
    spec = SinusoidalSpec(
        d_model=args.d_model, base=args.base, layout=args.layout, formula=args.formula
    )
    values = spec.table(args.length, fmt=args.dtype, start=args.start, max_bytes=args.max_bytes)
    positions = _positions(args)
    record = {
        "scheme": "sinusoidal",
        "positions": positions,
        "d_model": args.d_model,
        "base": args.base,
        "layout": args.layout,
        "formula": args.formula,
        "dtype": args.dtype,
        "values": values,
    }
    heading = (
        f"sinusoidal: d_model={args.d_model}, base={args.base:g}, {args.layout} layout, "
        f"{args.formula} formula, {args.dtype} ({_span(args, args.d_model)})"
    )
    return Table(record, values, values, [(heading, values)],
                 columns=["position", *_numbered("dim", args.d_model)],
                 index=positions[:, None])  # fmt: skip


def rope_table(args: argparse.Namespace) -> Table:
    """RoPE's cos and sin tables (times the attention factor), inv_freq and the factor."""
    params = scaling_params(args)
    scaling, seq_len = as_rope_scaling(args.scaling, params)
    spec = RopeSpec(
        head_dim=args.head_dim,
        base=args.base,
        rotary_dim=args.rotary_dim,
        layout=args.rope_layout,
        scaling=scaling,
    )
    inv_freq, attention = spec.frequencies(seq_len)
    cos, sin = spec.tables(
        args.length, fmt=args.dtype, start=args.start, seq_len=seq_len, max_bytes=args.max_bytes
    )  # (L, rotary_dim) each
    rotary_dim = spec.rotary_dim
    record = {
        "scheme": "rope",
        "positions": _positions(args),
        "head_dim": args.head_dim,
        "rotary_dim": rotary_dim,
        "base": args.base,
        "layout": args.rope_layout,
        "scaling": args.scaling,
        "scaling_params": params,
        "dtype": args.dtype,
        "inv_freq": inv_freq,
        "attention_factor": attention,
        "cos": cos,
        "sin": sin,
    }
    npz = {
        "cos": cos,
        "sin": sin,
        "inv_freq": inv_freq,
        "attention_factor": np.float64(attention),
    }
    width = int(cos.shape[1])  # rotary_dim
    span = _span(args, width)
    scaled = "" if attention == 1.0 else ", times the attention factor"
    shown = "".join(f", {k}={v}" for k, v in params.items() if not isinstance(v, list))
    text: TextBlocks = [
        (
            f"RoPE: head_dim={args.head_dim}, rotary_dim={rotary_dim}, base={args.base:g}, "
            f"{args.rope_layout} layout, scaling {args.scaling}{shown}, {args.dtype}",
            None,
        ),
        ("inv_freq (radians per position):", inv_freq),
        (f"attention_factor: {attention:.17g}", None),
        (f"cos ({span}{scaled}):", cos),
        (f"sin ({span}{scaled}):", sin),
    ]
    columns = ["position", *_numbered("cos", width), *_numbered("sin", width)]
    return Table(record, np.hstack([cos, sin]), npz, text, columns=columns,
                 index=_positions(args)[:, None])  # fmt: skip


def scaling_params(args: argparse.Namespace) -> dict[str, Any]:
    """The RoPE scaling's parameters from --factor, --original-... and --scaling-param.

    Checked against the spec class's parameters (and ``seq_len`` for a method that
    depends on the sequence length), so that a wrong or missing one is named by its flag.
    """
    params: dict[str, Any] = {}
    for key in ("factor", "original_max_position_embeddings"):
        if getattr(args, key) is not None:
            params[key] = getattr(args, key)
    for item in args.scaling_param:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise UsageError(f"posenc table: --scaling-param needs KEY=VALUE, got {item!r}")
        if key in params:
            raise UsageError(f"posenc table: the scaling parameter {key} is given twice")
        params[key] = _parse_value(text, item)
    spec_class = rope_scaling_spec(args.scaling)
    accepted = dict(spec_class.parameters())  # name -> required
    if spec_class.length_dependent:
        accepted["seq_len"] = False  # the length whose frequencies the table uses
    takes = ", ".join(accepted) or "no parameters"
    for key in params:
        if key not in accepted:
            raise UsageError(
                f"posenc table: {_param_flag(key)} does not apply to --scaling {args.scaling} "
                f"(it takes {takes})"
            )
    missing = [name for name, required in accepted.items() if required and name not in params]
    if missing:
        needs = ", ".join(_param_flag(name) for name in missing)
        raise UsageError(f"posenc table: --scaling {args.scaling} needs {needs}")
    return params


def _param_flag(key: str) -> str:
    if key in ("factor", "original_max_position_embeddings"):
        return "--" + key.replace("_", "-")
    return f"--scaling-param {key}=..."


def _parse_value(text: str, item: str) -> Any:
    """A --scaling-param value: an int, a float, true/false or a list of floats."""
    text = text.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    body = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if "," in body or body != text:
        try:
            return [float(part) for part in body.split(",") if part.strip()]
        except ValueError:
            pass
    raise UsageError(
        f"posenc table: --scaling-param {item!r}: the value must be a number, true/false or "
        "a list such as 1,2,3"
    )


def alibi_table(args: argparse.Namespace) -> Table:
    """ALiBi's slopes and its ``(heads, length, length)`` bias."""
    spec = AlibiSpec(num_heads=args.heads, mode=args.mode)
    bias = spec.bias(args.length, fmt=args.dtype, max_bytes=args.max_bytes)  # (H, L, L)
    slopes = spec.slopes()
    record = {
        "scheme": "alibi",
        "length": args.length,
        "heads": args.heads,
        "mode": args.mode,
        "dtype": args.dtype,
        "slopes": slopes,
        "values": bias,
    }
    text: TextBlocks = [
        (
            f"ALiBi: {args.heads} heads, {args.mode}, {args.length} x {args.length}, "
            f"{args.dtype} (bias[h, i, j]: query i, key j)",
            None,
        ),
        ("slopes:", slopes),
    ]
    text += [(f"head {h} (slope {m:.17g}):", bias[h]) for h, m in enumerate(slopes)]
    csv = bias.reshape(args.heads * args.length, args.length)  # row h*L + i
    heads, queries = np.divmod(np.arange(csv.shape[0], dtype=np.int64), args.length or 1)
    return Table(record, csv, bias, text, columns=["head", "query", *_numbered("key", args.length)],
                 index=np.stack([heads, queries], axis=1))  # fmt: skip


def t5_table(args: argparse.Namespace) -> Table:
    """T5's ``(length, length)`` buckets of key - query (no heads: no spec needed)."""
    check_memory(16 * args.length**2, "this T5 bucket matrix", args.max_bytes)
    buckets = relative_position_bucket(
        relative_positions(args.length),
        bidirectional=args.bidirectional,
        num_buckets=args.num_buckets,
        max_distance=args.max_distance,
        compat=args.compat,
    )  # (L, L) int64
    record = {
        "scheme": "t5",
        "length": args.length,
        "bidirectional": args.bidirectional,
        "num_buckets": args.num_buckets,
        "max_distance": args.max_distance,
        "compat": args.compat,
        "values": buckets,
    }
    direction = "bidirectional" if args.bidirectional else "causal"
    heading = (
        f"T5 buckets: {direction}, num_buckets={args.num_buckets}, "
        f"max_distance={args.max_distance}, compat {args.compat} (bucket of key j - query i)"
    )
    return Table(record, buckets, buckets, [(heading, buckets)],
                 columns=["query", *_numbered("key", args.length)],
                 index=np.arange(args.length, dtype=np.int64)[:, None])  # fmt: skip


def nope_table(args: argparse.Namespace) -> Table:
    """NoPE's zeros, of the sinusoidal table's shape."""
    # Zeros are exact in every format; bfloat16 travels as float32, as the other tables.
    container = "float32" if args.dtype == "bfloat16" else args.dtype
    width = NopeSpec(d_model=args.d_model).d_model
    values = nope(args.length, width, dtype=container, max_bytes=args.max_bytes)
    record = {
        "scheme": "nope",
        "positions": _positions(args),
        "d_model": args.d_model,
        "dtype": args.dtype,
        "values": values,
    }
    heading = f"NoPE: zeros, d_model={width}, {args.dtype} ({_span(args, width)})"
    return Table(record, values, values, [(heading, values)],
                 columns=["position", *_numbered("dim", width)],
                 index=_positions(args)[:, None])  # fmt: skip


#: The builder of each scheme that ``posenc table`` prints (``scheme_names(table=True)``).
SCHEME_TABLES: dict[str, Callable[[argparse.Namespace], Table]] = {
    "sinusoidal": sinusoidal_table,
    "rope": rope_table,
    "alibi": alibi_table,
    "t5": t5_table,
    "nope": nope_table,
}
