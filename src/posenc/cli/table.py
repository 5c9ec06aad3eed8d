"""``posenc table``: print or save a scheme's numbers (text, csv, json, npy).

The schemes offered are the registry's (:func:`posenc.schemes.scheme_names` with
``table=True``) and the RoPE scalings are the registered ones
(:data:`posenc.core.rope.ROPE_SCALING_SPECS`), both read when the parser is built, so a
scaling registered at run time is offered. Options of another scheme are an error that
names the option to use instead; the numbers are built in :mod:`.scheme_tables`.

Every number is printed, never NumPy's ``...`` summary. A terminal is not where a big
table is read, so more than :data:`TERMINAL_NUMBERS` numbers to a terminal need
``--full``; to a file, a pipe or ``-o -`` redirected, any size that the memory limit
(``--max-bytes``) allows is written. ``-o -`` is standard output (``--format npy``: the
binary ``.npy`` or ``.npz`` bytes).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .._checks import DEFAULT_MAX_BYTES, FORMULAS, LAYOUTS, MemoryLimitError, check_memory
from .._files import atomic_write, check_output_path, is_standard_output, write_stdout
from ..core.alibi import MODES as ALIBI_MODES
from ..core.precision import FORMATS
from ..core.rope import ROPE_LAYOUTS, ROPE_SCALING_SPECS
from ..core.t5 import COMPATS
from ..schemes import scheme_names
from .base import UsageError, add_max_bytes
from .scheme_tables import SCHEME_TABLES, Table

__all__ = ["SCHEMES", "TERMINAL_NUMBERS", "add_parser", "run"]

#: The most numbers printed to a terminal without ``--full`` (NumPy's summary threshold).
TERMINAL_NUMBERS = 1000
#: The most decimals ``--precision`` gives (float64 holds 17 significant digits).
MAX_PRECISION = 17

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
            "nope: zeros of the sinusoidal table's shape. Formats: text (a heading line with the "
            "scheme and its options above each block of numbers); json (one object: the "
            "options, the numbers and, for sinusoidal, rope and nope, positions: the position "
            "of each row, e.g. [5, 6, 7] for --start 5 --length 3); csv (a header row, then "
            "one row per position: position,dim_0,dim_1,...; rope: position,cos_0,...,sin_0,"
            "...; alibi: head,query,key_0,..., the heads' matrices one under the other; t5: "
            "query,key_0,..., integers); npy (one .npy array; rope: an .npz archive with "
            "cos, sin, inv_freq and attention_factor, at the path given)."
        ),
    )
    table.set_defaults(handler=run, memory_fix=_memory_fix)
    table.add_argument(
        "--scheme", choices=scheme_names(table=True), default="sinusoidal",
        help="whose numbers (default sinusoidal)",
    )  # fmt: skip
    table.add_argument("--length", "-L", type=int, default=4, help="number of positions (4)")
    table.add_argument("--start", type=int, help="first position (0); sinusoidal, rope, nope")
    table.add_argument("--dtype", choices=list(FORMATS), help="float64 (default) ...; not t5")
    table.add_argument(
        "--format", choices=("text", "csv", "json", "npy"), default="text",
        help="text (default), csv, json or npy: what each holds is said above",
    )  # fmt: skip
    table.add_argument("--output", "-o", type=Path, help="write to this file (- : standard output)")
    table.add_argument("--precision", type=int, default=8, help="decimals in text output (8)")
    table.add_argument(
        "--full",
        action="store_true",
        help=f"print to a terminal a table of more than {TERMINAL_NUMBERS} numbers",
    )
    add_max_bytes(table, DEFAULT_MAX_BYTES)
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
    to_stdout = args.output is None or str(args.output) == "-"
    if args.format == "npy" and args.output is None:
        raise UsageError("posenc table: --format npy needs --output FILE (- : standard output)")
    if args.format == "npy" and to_stdout and _is_terminal():
        raise UsageError(
            "posenc table: --format npy -o - writes binary; redirect the standard output "
            "to a file or a pipe, or give --output FILE"
        )
    if not 0 <= args.precision <= MAX_PRECISION:
        raise UsageError(
            f"posenc table: --precision must be 0 to {MAX_PRECISION} decimals, got {args.precision}"
        )
    if args.length < 0:
        raise ValueError(f"--length must be >= 0, got {args.length}")
    if not to_stdout:
        check_output_path(args.output)  # before the work, not after it
    table = SCHEME_TABLES[args.scheme](args)
    if args.format == "npy":
        _write_npy(None if to_stdout else args.output, table)
        return
    # text takes about 26 bytes a number, more than the table; a refusal from here on
    # also suggests --format npy (_memory_fix)
    args.writing_text = True
    check_memory(table.csv.size * 26, f"the {args.format} text of {table.csv.size} numbers",
                 args.max_bytes)  # fmt: skip
    if to_stdout and table.csv.size > TERMINAL_NUMBERS and not args.full and _is_terminal():
        raise UsageError(
            f"posenc table: the table has {table.csv.size} numbers, more than the "
            f"{TERMINAL_NUMBERS} printed to a terminal; pass --full to print them all, or "
            "--output FILE"
        )
    text = _text(table, args)
    if to_stdout:
        write_stdout(text)
    else:
        with atomic_write(args.output) as file:
            file.write(text)
        if not is_standard_output(args.output):
            print(f"wrote {args.output}")


def _text(table: Table, args: argparse.Namespace) -> str:
    """The table in ``args.format`` (text, csv or json), every number of it."""
    if args.format == "csv":
        return _format_csv(table, args)
    if args.format == "json":
        return json.dumps(_jsonable(table.record)) + "\n"
    return "".join(
        (f"{heading}\n" if heading else "")
        + ("" if values is None else _format_text(values, args, vector=values.ndim == 1))
        for heading, values in table.text
    )


def _is_terminal() -> bool:
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty and isatty())


# The options that size each scheme's table, said when it outgrows the memory limit.
_SIZE_OPTIONS = {"sinusoidal": "--length or --d-model", "nope": "--length or --d-model",
                 "rope": "--length or --rotary-dim", "alibi": "--length or --heads",
                 "t5": "--length"}  # fmt: skip


def _memory_fix(args: argparse.Namespace, exc: MemoryLimitError | None) -> str:
    """What to do on the command line when the table outgrows ``--max-bytes`` (``exc``)
    or the machine's memory (``None``)."""
    lower = _SIZE_OPTIONS.get(getattr(args, "scheme", ""), "--length")
    if exc is None:
        fix = f"lower {lower}"
    else:
        unit, name = (2**30, "GiB") if (exc.nbytes or 0) >= 2**30 else (2**20, "MiB")
        enough = f"{max(-(-(exc.nbytes or 0) // unit), 1)}{name}"  # rounded up
        fix = f"pass --max-bytes {enough} (none: no limit) if you have it, or lower {lower}"
    if getattr(args, "writing_text", False):
        fix += ", or write --format npy --output FILE"
    return fix


def _write_npy(output: Path | None, table: Table) -> None:
    """The table as ``.npy`` (or an ``.npz`` archive of several arrays) at ``output``
    (``None``: standard output's binary buffer)."""
    buffer = io.BytesIO() if output is None else None
    target: contextlib.AbstractContextManager[Any] = (
        contextlib.nullcontext(buffer) if output is None else atomic_write(output, "wb")
    )
    with target as file:
        if isinstance(table.npy, dict):  # several arrays: an .npz archive at the given path
            arrays: dict[str, Any] = table.npy  # Any: or mypy fits **arrays to allow_pickle
            np.savez(file, **arrays)
            what = f"npz: {', '.join(table.npy)}"
        else:  # bfloat16 is stored as float32 holding exact bfloat16 values (portable .npy)
            np.save(file, table.npy)
            what = f"{'x'.join(str(n) for n in table.npy.shape)} {table.npy.dtype}"
    if buffer is not None:
        write_stdout(buffer.getvalue())
    elif output is not None and not is_standard_output(output):
        print(f"wrote {output} ({what})")


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


def _format_csv(table: Table, args: argparse.Namespace) -> str:
    """A header row naming the columns, then each row: its index columns (integers: the
    position, or the head and the query), then its numbers."""
    values = table.csv
    if values.dtype.kind in "iu":
        cells = [[str(v) for v in row] for row in values.tolist()]
    else:
        digits = _digits(args)
        cells = [[f"{v:.{digits}g}" for v in row] for row in values.astype(np.float64)]
    index = [[str(v) for v in row] for row in table.index.tolist()]
    rows = [",".join(table.columns)]
    rows += [",".join(first + rest) for first, rest in zip(index, cells, strict=True)]
    return "\n".join(rows) + "\n"


def _format_text(values: np.ndarray, args: argparse.Namespace, *, vector: bool = False) -> str:
    """A table as text; ``vector`` (frequencies, slopes) keeps significant digits instead."""
    threshold = sys.maxsize  # every number, never NumPy's "..." summary
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
