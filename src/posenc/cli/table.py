"""``posenc table``: print or save a scheme's numbers (text, csv, json, npy).

The schemes offered are the registry's (:func:`posenc.schemes.scheme_names` with
``table=True``) and the RoPE scalings are the registered ones
(:data:`posenc.core.rope.ROPE_SCALING_SPECS`), both read when the parser is built, so a
scaling registered at run time is offered. Options of another scheme are an error that
names the option to use instead; the numbers are built in :mod:`.scheme_tables`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .._checks import DEFAULT_MAX_BYTES, FORMULAS, LAYOUTS, check_memory
from .._files import atomic_write, check_output_path
from ..core.alibi import MODES as ALIBI_MODES
from ..core.precision import FORMATS
from ..core.rope import ROPE_LAYOUTS, ROPE_SCALING_SPECS
from ..core.t5 import COMPATS
from ..schemes import scheme_names
from .base import UsageError
from .scheme_tables import SCHEME_TABLES, Table

__all__ = ["SCHEMES", "add_parser", "run"]

#: The schemes ``posenc table --scheme`` offers (the registry's ``table=True`` ones).
SCHEMES: tuple[str, ...] = scheme_names(table=True)

# `posenc table` options that belong to some schemes only: dest -> (flag, schemes,
# default). They parse to None, so that an option given for another scheme is an error.
_SCHEME_OPTIONS: dict[str, tuple[str, tuple[str, ...], Any]] = {
    "d_model": ("--d-model", ("sinusoidal", "nope"), 4),
    "base": ("--base", ("sinusoidal", "rope"), 10000.0),
    "layout": ("--layout", ("sinusoidal",), "interleaved"),
    "formula": ("--formula", ("sinusoidal",), "paper"),
    "start": ("--start", ("sinusoidal", "rope", "nope"), 0),
    "dtype": ("--dtype", ("sinusoidal", "rope", "alibi", "nope"), "float64"),
    "head_dim": ("--head-dim", ("rope",), 8),
    "rotary_dim": ("--rotary-dim", ("rope",), None),
    "rope_layout": ("--rope-layout", ("rope",), "half"),
    "scaling": ("--scaling", ("rope",), "default"),
    "factor": ("--factor", ("rope",), None),
    "original_max_position_embeddings": ("--original-max-position-embeddings", ("rope",), None),
    "scaling_param": ("--scaling-param", ("rope",), []),
    "heads": ("--heads", ("alibi",), 8),
    "mode": ("--mode", ("alibi",), "causal"),
    "num_buckets": ("--num-buckets", ("t5",), 32),
    "max_distance": ("--max-distance", ("t5",), 128),
    "bidirectional": ("--bidirectional/--causal", ("t5",), True),
    "compat": ("--compat", ("t5",), "hf"),
}
# What to use instead, for options people carry over from another scheme.
_INSTEAD = {
    ("d_model", "rope"): "--head-dim",
    ("layout", "rope"): "--rope-layout",
    ("d_model", "alibi"): "--heads",
    ("mode", "t5"): "--bidirectional/--causal",
    ("bidirectional", "alibi"): "--mode",
    ("max_distance", "alibi"): "--length",
}


def add_parser(commands: Any) -> None:
    """Add ``posenc table`` to the top parser's sub-commands."""
    table = commands.add_parser(
        "table",
        help="print or save a scheme's numbers",
        description=(
            "Print or save the numbers of one scheme. Options of another scheme are an "
            "error. sinusoidal: the (length, d_model) table. rope: the cos and sin tables "
            "(length, rotary_dim), multiplied by the scaling's attention factor as in "
            "Hugging Face, with inv_freq and attention_factor. alibi: the slopes and the "
            "(heads, length, length) bias. t5: the (length, length) buckets of key - query. "
            "nope: zeros of the sinusoidal table's shape. Formats: text; json (one object); "
            "csv (rope: cos columns then sin columns; alibi: the heads' matrices stacked, "
            "row h*length + i; t5: integers); npy (one .npy array; rope: an .npz archive "
            "with cos, sin, inv_freq and attention_factor, at the path given)."
        ),
    )
    table.set_defaults(handler=run)
    table.add_argument("--scheme", choices=scheme_names(table=True), default="sinusoidal")
    table.add_argument("--length", "-L", type=int, default=4, help="number of positions (4)")
    table.add_argument("--start", type=int, help="first position (0); sinusoidal, rope, nope")
    table.add_argument("--dtype", choices=list(FORMATS), help="float64 (default) ...; not t5")
    table.add_argument("--format", choices=("text", "csv", "json", "npy"), default="text")
    table.add_argument("--output", "-o", type=Path, help="write to this file (npy needs one)")
    table.add_argument("--precision", type=int, default=8, help="decimals in text output")
    table.add_argument("--full", action="store_true", help="print every row in text output")
    sinusoidal = table.add_argument_group("sinusoidal (and nope: --d-model)")
    sinusoidal.add_argument("--d-model", "-d", type=int, help="encoding width (4)")
    sinusoidal.add_argument("--base", "-n", type=float, help="n of k/n^(2i/d); rope's base (1e4)")
    sinusoidal.add_argument("--layout", choices=LAYOUTS, help="interleaved (default) or split")
    sinusoidal.add_argument("--formula", choices=FORMULAS, help="paper (default) or tensor2tensor")
    rope = table.add_argument_group("rope (also --base, --start, --dtype)")
    rope.add_argument("--head-dim", type=int, help="features per head (8)")
    rope.add_argument("--rotary-dim", type=int, help="rotated features (head_dim)")
    rope.add_argument("--rope-layout", choices=ROPE_LAYOUTS, help="half (default) or interleaved")
    # Read now, at each main() call: a scaling registered at run time is offered.
    rope.add_argument(
        "--scaling", choices=list(ROPE_SCALING_SPECS), help="scaling method (default)"
    )
    rope.add_argument("--factor", type=float, help="the scaling's factor")
    rope.add_argument(
        "--original-max-position-embeddings", type=int, metavar="L0", help="the length trained on"
    )
    rope.add_argument(
        "--scaling-param",
        action="append",
        metavar="KEY=VALUE",
        help="another parameter of the scaling, repeatable: a number, true/false or a "
        "list (1,2,3 or [1,2,3]), e.g. low_freq_factor=1 high_freq_factor=4",
    )
    alibi = table.add_argument_group("alibi (also --dtype)")
    alibi.add_argument("--heads", type=int, help="number of heads (8)")
    alibi.add_argument("--mode", choices=ALIBI_MODES, help="causal (default) or symmetric")
    t5 = table.add_argument_group("t5")
    t5.add_argument("--num-buckets", type=int, help="number of buckets (32)")
    t5.add_argument("--max-distance", type=int, help="distance where buckets saturate (128)")
    direction = t5.add_mutually_exclusive_group()
    direction.add_argument(
        "--bidirectional", dest="bidirectional", action="store_const", const=True,
        help="encoder buckets: both directions (default)",
    )  # fmt: skip
    direction.add_argument(
        "--causal", dest="bidirectional", action="store_const", const=False,
        help="decoder buckets: every key at or after the query is bucket 0",
    )  # fmt: skip
    t5.add_argument("--compat", choices=COMPATS, help="hf (float32 edges, default) or exact")


def run(args: argparse.Namespace) -> None:
    """Print or write the table that ``args`` asks for."""
    _resolve_scheme_options(args)
    if args.format == "npy" and args.output is None:
        raise UsageError("posenc table: --format npy needs --output FILE")
    if args.precision < 0:
        raise UsageError(f"posenc table: --precision must be >= 0, got {args.precision}")
    if args.length < 0:
        raise ValueError(f"--length must be >= 0, got {args.length}")
    if args.output is not None:
        check_output_path(args.output)  # before the work, not after it
    table = SCHEME_TABLES[args.scheme](args)
    if args.format == "npy":
        _write_npy(args.output, table)
        return
    # text takes about 26 bytes a number, more than the table
    check_memory(
        table.csv.size * 26,
        f"the {args.format} text of {table.csv.size} numbers",
        DEFAULT_MAX_BYTES,
        fix="write --format npy --output FILE, or ask for fewer positions",
    )
    if args.format == "csv":
        text = _format_csv(table.csv, args)
    elif args.format == "json":
        text = json.dumps(_jsonable(table.record)) + "\n"
    else:
        text = "".join(
            (f"{heading}\n" if heading else "")
            + ("" if values is None else _format_text(values, args, vector=values.ndim == 1))
            for heading, values in table.text
        )
    if args.output is None:
        sys.stdout.write(text)
    else:
        with atomic_write(args.output) as file:
            file.write(text)
        print(f"wrote {args.output}")


def _write_npy(output: Path, table: Table) -> None:
    """The table as ``.npy`` (or an ``.npz`` archive of several arrays) at ``output``."""
    if isinstance(table.npy, dict):  # several arrays: an .npz archive at the given path
        arrays: dict[str, Any] = table.npy  # Any: or mypy fits **arrays to allow_pickle: bool
        with atomic_write(output, "wb") as file:
            np.savez(file, **arrays)
        print(f"wrote {output} (npz: {', '.join(table.npy)})")
        return
    # bfloat16 is stored as float32 holding exact bfloat16 values (portable .npy).
    with atomic_write(output, "wb") as file:
        np.save(file, table.npy)
    shape = "x".join(str(n) for n in table.npy.shape)
    print(f"wrote {output} ({shape} {table.npy.dtype})")


def _resolve_scheme_options(args: argparse.Namespace) -> None:
    """Refuse options of other schemes; fill in the defaults of the chosen one."""
    for dest, (flag, schemes, default) in _SCHEME_OPTIONS.items():
        value = getattr(args, dest)
        if value is None:
            setattr(args, dest, list(default) if isinstance(default, list) else default)
            continue
        if args.scheme in schemes:
            continue
        if dest == "bidirectional":
            flag = "--bidirectional" if value else "--causal"
        instead = _INSTEAD.get((dest, args.scheme))
        hint = f"use {instead}" if instead else f"it is an option of --scheme {'/'.join(schemes)}"
        raise UsageError(f"posenc table: {flag} does not apply to --scheme {args.scheme} ({hint})")


def _jsonable(value: Any) -> Any:
    """Arrays as (nested) lists of Python floats or ints, recursively."""
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return (value if value.dtype.kind in "iu" else value.astype(np.float64)).tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _digits(args: argparse.Namespace) -> int:
    return 17 if args.dtype == "float64" else 9  # enough to round-trip the dtype


def _format_csv(values: np.ndarray, args: argparse.Namespace) -> str:
    if values.dtype.kind in "iu":
        rows = [",".join(str(v) for v in row) for row in values.tolist()]
    else:
        digits = _digits(args)
        rows = [",".join(f"{v:.{digits}g}" for v in row) for row in values.astype(np.float64)]
    return "\n".join(rows) + ("\n" if rows else "")


def _format_text(values: np.ndarray, args: argparse.Namespace, *, vector: bool = False) -> str:
    """A table as text; ``vector`` (frequencies, slopes) keeps significant digits instead."""
    threshold = sys.maxsize if args.full else 1000
    digits: int | None = None  # significant digits, for a float vector
    if values.dtype.kind not in "iu":
        values = values.astype(np.float64)
        if vector:  # inv_freq spans 1 .. 1e-7: fixed decimals would drop the small ones
            digits = max(args.precision, 1)
    return (
        np.array2string(
            values,
            precision=args.precision,
            suppress_small=True,
            threshold=threshold,
            max_line_width=120,
            formatter=None if digits is None else {"float_kind": lambda v: f"{v:.{digits}g}"},
        )
        + "\n"
    )
