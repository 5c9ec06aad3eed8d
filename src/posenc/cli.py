"""The ``posenc`` command.

``posenc table``   print or save a scheme's numbers (text, csv, json, npy): the sinusoidal
                  table, RoPE cos/sin tables, ALiBi biases, T5 buckets or NoPE zeros
``posenc plot``    draw one of the pictures to a file
``posenc embed``   run tokens → ids → embedding → + positional encoding on a sentence
``posenc demo``    the seed walk-through: tables, every picture, a property report
``posenc bench``   train tiny transformers per task, scheme and seed; accuracy by length

Frameworks and matplotlib are imported only by the sub-commands that need them. Bad
arguments exit with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from . import __version__
from ._checks import (
    DEFAULT_MAX_BYTES,
    FORMULAS,
    LAYOUTS,
    check_base,
    check_choice,
    check_d_model,
    check_memory,
)
from .core.alibi import MODES as ALIBI_MODES
from .core.alibi import alibi_bias_values, alibi_slopes
from .core.nope import nope
from .core.precision import FORMATS
from .core.rope import ROPE_LAYOUTS, ROPE_SCALINGS, rope_scaling, rope_table_values
from .core.sinusoidal import table_values
from .core.t5 import COMPATS, relative_position_bucket, relative_positions

PLOT_KINDS = (
    "heatmap",
    "sinusoids",
    "dimensions",
    "first-positions",
    "long-range",
    "wavelengths",
    "similarity",
    "grid",
    "rope-spectrum",
    "rope-score",
    "alibi",
    "t5",
)

SCHEMES = ("sinusoidal", "rope", "alibi", "t5", "nope")

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


class UsageError(Exception):
    """A bad command line: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="posenc",
        description="Positional encodings for transformers, exact in every dtype.",
    )
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    def encoding_options(p: argparse.ArgumentParser, *, length: int, d_model: int, base: float):
        p.add_argument("--length", "-L", type=int, default=length, help="number of positions")
        p.add_argument("--d-model", "-d", type=int, default=d_model, help="encoding width")
        p.add_argument("--base", "-n", type=float, default=base, help="the n of k / n^(2i/d)")
        p.add_argument("--layout", choices=LAYOUTS, default="interleaved")
        p.add_argument("--formula", choices=FORMULAS, default="paper")

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
    table.add_argument("--scheme", choices=SCHEMES, default="sinusoidal")
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
    rope.add_argument("--scaling", choices=list(ROPE_SCALINGS), help="scaling method (default)")
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

    plot = commands.add_parser("plot", help="draw a picture to a file")
    plot.add_argument("kind", choices=PLOT_KINDS)
    plot.add_argument("--output", "-o", type=Path, required=True, help="FILE.png|svg|pdf")
    plot.add_argument("--length", "-L", type=int, help="number of positions")
    plot.add_argument("--d-model", "-d", type=int, help="encoding width")
    plot.add_argument("--base", "-n", type=float, help="the n of k / n^(2i/d); RoPE's base")
    plot.add_argument("--head-dim", type=int, help="RoPE: features per head")
    plot.add_argument("--factor", type=float, help="RoPE: the context extension")
    plot.add_argument(
        "--original-max-position-embeddings", type=int, metavar="L0", help="RoPE: trained length"
    )
    plot.add_argument("--heads", type=int, help="ALiBi: number of heads")
    plot.add_argument("--num-buckets", type=int, help="T5: number of buckets")
    plot.add_argument("--max-distance", type=int, help="T5: where buckets saturate")
    plot.add_argument("--dpi", type=int, default=100)

    embed = commands.add_parser("embed", help="run the seed pipeline on a sentence")
    embed.add_argument("text", help='a sentence, e.g. "I am a robot"')
    embed.add_argument("--d-model", "-d", type=int, default=4)
    embed.add_argument("--base", "-n", type=float, default=100.0)
    embed.add_argument("--seed", type=int, default=0, help="seed of the embedding weights")
    embed.add_argument("--scale", action="store_true", help="scale embeddings by sqrt(d_model)")
    embed.add_argument("--backend", choices=("numpy", "torch"), default="numpy")

    demo = commands.add_parser("demo", help="the seed walk-through, pictures and a report")
    demo.add_argument("--output", "-o", type=Path, default=Path("posenc-demo"))
    demo.add_argument("--no-plots", action="store_true", help="skip the pictures")
    _bench_parser(commands)
    return parser


def _bench_parser(commands: Any) -> None:
    """``posenc bench``: its options parse to None when absent, so that given ones show."""
    bench = commands.add_parser(
        "bench",
        help="train tiny transformers per scheme; accuracy by length",
        description=(
            "Train tiny decoder-only transformers, one per (task, scheme, seed), and report "
            "exact match, token accuracy and perplexity by evaluation length, within and "
            "beyond the training lengths. A preset gives the tasks, schemes, seeds and "
            "settings; the other options change them. Results go to DIR/results.jsonl (one "
            "line per finished run), DIR/results.md, DIR/summary.json and DIR/accuracy.png. "
            "See docs/bench.md."
        ),
    )
    bench.add_argument(
        "--preset",
        choices=("quick", "full"),
        default="quick",
        help="quick: 6 schemes on copy, 1 seed; full: 5 tasks x 6 schemes x "
        "3 seeds (default quick)",
    )
    grid = bench.add_argument_group("the grid (default: the preset's)")
    grid.add_argument("--tasks", nargs="+", metavar="TASK", help="copy reverse sort add lm")
    grid.add_argument(
        "--schemes", nargs="+", metavar="SCHEME", help="nope learned sinusoidal rope alibi t5"
    )
    grid.add_argument(
        "--seeds",
        nargs="+",
        metavar="SEED",
        help="N: the seeds 0..N-1; several numbers (or 3,7): those seeds",
    )
    model = bench.add_argument_group("every run's settings (default: the preset's)")
    model.add_argument("--steps", type=int, metavar="N", help="optimizer steps")
    model.add_argument(
        "--train-lengths",
        type=int,
        nargs=2,
        metavar=("LO", "HI"),
        help="inclusive range of problem lengths in training",
    )
    model.add_argument(
        "--eval-lengths", type=int, nargs="+", metavar="L", help="problem lengths to evaluate at"
    )
    model.add_argument("--d-model", type=int, metavar="N", help="model width")
    model.add_argument("--layers", type=int, metavar="N", help="transformer blocks")
    model.add_argument("--heads", type=int, metavar="N", help="attention heads")
    model.add_argument("--batch-size", type=int, metavar="N", help="sequences per training batch")
    model.add_argument("--lr", type=float, metavar="LR", help="peak learning rate")
    model.add_argument(
        "--eval-samples", type=int, metavar="N", help="sequences per evaluation length"
    )
    model.add_argument(
        "--rope-eval-scalings",
        nargs="*",
        metavar="NAME",
        help="rope runs: also evaluate with these scalings (linear ntk yarn "
        "dynamic_ntk); none: only plain rope",
    )
    model.add_argument(
        "--text",
        type=Path,
        metavar="FILE",
        help="lm task: train on this UTF-8 text (default a synthetic grammar)",
    )
    model.add_argument(
        "--device", metavar="DEVICE", help="auto, cpu, cuda, cuda:N or mps (default cpu)"
    )
    execution = bench.add_argument_group("execution")
    execution.add_argument(
        "--jobs", "-j", type=int, default=1, metavar="N", help="worker processes (default 1)"
    )
    execution.add_argument(
        "--out", "-o", type=Path, metavar="DIR", help="output folder (default ./posenc-bench)"
    )
    execution.add_argument(
        "--resume", action="store_true", help="skip the runs that DIR/results.jsonl already holds"
    )
    execution.add_argument(
        "--dry-run",
        action="store_true",
        help="print the run specs as JSON lines (with --resume: the missing ones) and run nothing",
    )
    execution.add_argument("--no-progress", action="store_true", help="no progress bars")
    execution.add_argument(
        "--spec-json",
        metavar="JSON",
        help="run exactly this one spec (a line of --dry-run) and print "
        "its record as one JSON line; writes no files",
    )
    execution.add_argument(
        "--report-only",
        type=Path,
        metavar="DIR",
        help="remake DIR's results.md, summary.json and accuracy.png "
        "from DIR/results.jsonl, and run nothing",
    )


# ---------------------------------------------------------------------------------------


def _cmd_table(args: argparse.Namespace) -> None:
    _resolve_scheme_options(args)
    if args.format == "npy" and args.output is None:
        raise UsageError("posenc table: --format npy needs --output FILE")
    if args.precision < 0:
        raise UsageError(f"posenc table: --precision must be >= 0, got {args.precision}")
    if args.length < 0:
        raise ValueError(f"--length must be >= 0, got {args.length}")
    table = _SCHEME_TABLES[args.scheme](args)
    if args.format == "npy":
        if isinstance(table.npy, dict):  # several arrays: an .npz archive at the given path
            with open(args.output, "wb") as file:
                np.savez(file, **table.npy)
            print(f"wrote {args.output} (npz: {', '.join(table.npy)})")
            return
        # bfloat16 is stored as float32 holding exact bfloat16 values (portable .npy).
        np.save(args.output, table.npy)
        shape = "x".join(str(n) for n in table.npy.shape)
        print(f"wrote {args.output} ({shape} {table.npy.dtype})")
        return
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
        args.output.write_text(text)
        print(f"wrote {args.output}")


class _Table:
    """One scheme's output: the JSON record, the CSV matrix, the npy payload, text blocks."""

    def __init__(
        self,
        record: dict[str, Any],
        csv: np.ndarray,
        npy: np.ndarray | dict[str, np.ndarray],
        text: list[tuple[str | None, np.ndarray | None]],
    ) -> None:
        self.record, self.csv, self.npy, self.text = record, csv, npy, text


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


def _positions(args: argparse.Namespace) -> list[int]:
    return [args.start, args.start + args.length]


def _sinusoidal_table(args: argparse.Namespace) -> _Table:
    values = table_values(
        args.length,
        check_d_model(args.d_model),
        base=check_base(args.base),
        layout=args.layout,
        formula=args.formula,
        fmt=args.dtype,
        start=args.start,
    )
    record = {
        "scheme": "sinusoidal",
        "positions": _positions(args),
        "d_model": args.d_model,
        "base": args.base,
        "layout": args.layout,
        "formula": args.formula,
        "dtype": args.dtype,
        "values": values,
    }
    return _Table(record, values, values, [(None, values)])


def _rope_table(args: argparse.Namespace) -> _Table:
    params = _scaling_params(args)
    inv_freq, attention = rope_scaling(
        args.scaling, args.head_dim, args.base, rotary_dim=args.rotary_dim, **params
    )
    cos, sin = rope_table_values(
        args.length,
        inv_freq,
        fmt=args.dtype,
        layout=args.rope_layout,
        scale=attention,
        start=args.start,
    )  # (L, rotary_dim) each
    rotary_dim = 2 * inv_freq.size
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
    span = f"positions {args.start}..{args.start + args.length - 1} x {rotary_dim}"
    scaled = "" if attention == 1.0 else ", times the attention factor"
    shown = "".join(f", {k}={v}" for k, v in params.items() if not isinstance(v, list))
    text: list[tuple[str | None, np.ndarray | None]] = [
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
    return _Table(record, np.hstack([cos, sin]), npz, text)


def _scaling_params(args: argparse.Namespace) -> dict[str, Any]:
    """The RoPE scaling's parameters from --factor, --original-... and --scaling-param."""
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
    function = ROPE_SCALINGS[args.scaling]
    accepted = {
        p.name: p
        for p in inspect.signature(function).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.name != "rotary_dim"
    }
    takes = ", ".join(accepted) or "no parameters"
    for key in params:
        if key not in accepted:
            raise UsageError(
                f"posenc table: {_param_flag(key)} does not apply to --scaling {args.scaling} "
                f"(it takes {takes})"
            )
    missing = [name for name, p in accepted.items() if p.default is p.empty and name not in params]
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


def _alibi_table(args: argparse.Namespace) -> _Table:
    bias = alibi_bias_values(
        args.length, num_heads=args.heads, mode=args.mode, fmt=args.dtype
    )  # (H, L, L)
    slopes = alibi_slopes(args.heads)
    record = {
        "scheme": "alibi",
        "length": args.length,
        "heads": args.heads,
        "mode": args.mode,
        "dtype": args.dtype,
        "slopes": slopes,
        "values": bias,
    }
    text: list[tuple[str | None, np.ndarray | None]] = [
        (
            f"ALiBi: {args.heads} heads, {args.mode}, {args.length} x {args.length}, "
            f"{args.dtype} (bias[h, i, j]: query i, key j)",
            None,
        ),
        ("slopes:", slopes),
    ]
    text += [(f"head {h} (slope {m:.17g}):", bias[h]) for h, m in enumerate(slopes)]
    csv = bias.reshape(args.heads * args.length, args.length)  # row h*L + i
    return _Table(record, csv, bias, text)


def _t5_table(args: argparse.Namespace) -> _Table:
    check_memory(16 * args.length**2, "this T5 bucket matrix", DEFAULT_MAX_BYTES)
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
    return _Table(record, buckets, buckets, [(heading, buckets)])


def _nope_table(args: argparse.Namespace) -> _Table:
    # Zeros are exact in every format; bfloat16 travels as float32, as the other tables.
    container = "float32" if args.dtype == "bfloat16" else args.dtype
    values = nope(args.length, check_d_model(args.d_model), dtype=container)
    record = {
        "scheme": "nope",
        "positions": _positions(args),
        "d_model": args.d_model,
        "dtype": args.dtype,
        "values": values,
    }
    return _Table(record, values, values, [(None, values)])


_SCHEME_TABLES = {
    "sinusoidal": _sinusoidal_table,
    "rope": _rope_table,
    "alibi": _alibi_table,
    "t5": _t5_table,
    "nope": _nope_table,
}


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
    formatter = None
    if values.dtype.kind not in "iu":
        values = values.astype(np.float64)
        if vector:  # inv_freq spans 1 .. 1e-7: fixed decimals would drop the small ones
            formatter = {"float_kind": lambda v: f"{v:.{max(args.precision, 1)}g}"}
    return (
        np.array2string(
            values,
            precision=args.precision,
            suppress_small=True,
            threshold=threshold,
            max_line_width=120,
            formatter=formatter,
        )
        + "\n"
    )


# `posenc plot` options -> the keyword of the picture's function that they set.
_PLOT_OPTIONS = {
    "length": "length",
    "d_model": "d_model",
    "base": "base",
    "head_dim": "head_dim",
    "factor": "factor",
    "original_max_position_embeddings": "original_max_position_embeddings",
    "heads": "num_heads",
    "num_buckets": "num_buckets",
    "max_distance": "max_distance",
}


def _cmd_plot(args: argparse.Namespace) -> None:
    from . import plot

    function = plot.PLOTS[args.kind]
    accepted = inspect.signature(function).parameters
    kwargs: dict[str, Any] = {}
    for option, parameter in _PLOT_OPTIONS.items():
        value = getattr(args, option)
        if value is None:
            continue
        if parameter not in accepted:
            flag = "--" + option.replace("_", "-")
            raise UsageError(f"posenc plot {args.kind}: {flag} does not apply to this picture")
        kwargs[parameter] = value
    if args.dpi <= 0:
        raise UsageError(f"posenc plot: --dpi must be > 0, got {args.dpi}")
    path = plot.save(function(**kwargs), args.output, dpi=args.dpi)
    print(f"wrote {path}")


def _cmd_embed(args: argparse.Namespace) -> None:
    from .demo import embed_sentence

    sys.stdout.write(
        embed_sentence(
            args.text,
            d_model=args.d_model,
            base=args.base,
            seed=args.seed,
            scale=args.scale,
            backend=args.backend,
        )
    )


def _cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo

    run_demo(args.output, plots=not args.no_plots, out=sys.stdout)


# `posenc bench` options of the run settings: dest -> (flag, configuration key).
_BENCH_SETTINGS = {
    "steps": ("--steps", "steps"),
    "train_lengths": ("--train-lengths", "train_lengths"),
    "eval_lengths": ("--eval-lengths", "eval_lengths"),
    "d_model": ("--d-model", "d_model"),
    "layers": ("--layers", "n_layers"),
    "heads": ("--heads", "n_heads"),
    "batch_size": ("--batch-size", "batch_size"),
    "lr": ("--lr", "lr"),
    "eval_samples": ("--eval-samples", "eval_samples"),
    "rope_eval_scalings": ("--rope-eval-scalings", "rope_eval_scalings"),
    "text": ("--text", "text"),
}


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import report, runner
    from .bench.spec import ROPE_EVAL_SCALINGS, SCHEMES, TASKS, RunSpec

    grid = {"tasks": "--tasks", "schemes": "--schemes", "seeds": "--seeds"}
    given = [flag for dest, (flag, _) in _BENCH_SETTINGS.items() if getattr(args, dest) is not None]
    given += [flag for dest, flag in grid.items() if getattr(args, dest) is not None]
    for flag, value in (("--dry-run", args.dry_run), ("--resume", args.resume)):
        if value:
            given.append(flag)
    if args.report_only is not None:
        extra = [
            *given,
            *(["--spec-json"] if args.spec_json is not None else []),
            *(["--device"] if args.device is not None else []),
            *(["--out"] if args.out is not None else []),
        ]
        if extra or args.jobs != 1:
            extra = extra or ["--jobs"]
            raise UsageError(f"posenc bench: {extra[0]} does not apply with --report-only")
        return _bench_report(args.report_only, report)
    if args.spec_json is not None:
        extra = given + (["--out"] if args.out is not None else [])
        if extra or args.jobs != 1:
            extra = extra or ["--jobs"]
            raise UsageError(
                f"posenc bench: {extra[0]} does not apply with --spec-json (the spec gives "
                "every setting; only --device and --no-progress do)"
            )
        try:
            fields = json.loads(args.spec_json)
        except json.JSONDecodeError as exc:
            raise UsageError(f"posenc bench: --spec-json is not JSON ({exc})") from None
        spec = RunSpec.from_dict(fields)
        if args.device is not None:
            spec = RunSpec.from_dict({**spec.to_dict(), "device": args.device})
        record = runner.run_one(spec, progress=not args.no_progress)
        print(json.dumps(record, ensure_ascii=False))
        return 0

    config = dict(runner.PRESETS[args.preset])
    for dest, (_, key) in _BENCH_SETTINGS.items():
        value = getattr(args, dest)
        if value is not None:
            config[key] = str(value) if dest == "text" else value
    if args.tasks is not None:
        config["tasks"] = [check_choice(t, "--tasks", TASKS) for t in args.tasks]
    if args.schemes is not None:
        config["schemes"] = [check_choice(s, "--schemes", SCHEMES) for s in args.schemes]
    if args.seeds is not None:
        config["seeds"] = _bench_seeds(args.seeds)
    if args.rope_eval_scalings is not None:
        for name in args.rope_eval_scalings:
            check_choice(name, "--rope-eval-scalings", ROPE_EVAL_SCALINGS)
        if args.rope_eval_scalings and "rope" not in config["schemes"]:
            raise UsageError("posenc bench: --rope-eval-scalings needs the rope scheme")
    if args.text is not None:
        if "lm" not in config["tasks"]:
            raise UsageError("posenc bench: --text applies to the lm task only")
        if not args.text.is_file():
            raise UsageError(f"posenc bench: --text {args.text}: no such file")
    if args.device is not None:
        config["device"] = args.device
    if args.jobs < 1:
        raise UsageError(f"posenc bench: --jobs must be >= 1, got {args.jobs}")
    specs = runner.expand(config)
    out = Path("posenc-bench") if args.out is None else args.out
    if args.dry_run:
        todo = runner.pending(specs, out) if args.resume else specs
        for spec in todo:
            print(json.dumps(spec.to_dict(), ensure_ascii=False))
        return 0
    try:
        outcome = runner.execute(
            specs, out, jobs=args.jobs, resume=args.resume, progress=not args.no_progress
        )
    except FileExistsError as exc:
        raise UsageError(f"posenc bench: {exc}") from None
    except KeyboardInterrupt:
        results = out / runner.RESULTS_FILE
        kept = f"the finished runs are in {results}" if results.exists() else "no run finished"
        print(
            f"\ninterrupted: {kept}; run the same command with --resume to go on",
            file=sys.stderr,
        )
        return 130
    print(
        f"{outcome.ran} runs done, {outcome.skipped} already in the results, "
        f"{len(outcome.failures)} failed"
    )
    _bench_print(out, outcome.reports, report)
    if outcome.failures:
        print(
            f"{len(outcome.failures)} runs failed (errors in {out / runner.FAILURES_FILE}); "
            "--resume runs them again",
            file=sys.stderr,
        )
        return 1
    return 0


def _bench_seeds(words: list[str]) -> int | list[int]:
    """``--seeds 3`` means the seeds 0, 1, 2; ``--seeds 0 5`` or ``--seeds 7,`` list seeds."""
    if len(words) == 1 and "," not in words[0]:
        try:
            return int(words[0])
        except ValueError:
            raise UsageError(f"posenc bench: --seeds needs integers, got {words[0]!r}") from None
    parts = [part for word in words for part in word.split(",") if part.strip()]
    try:
        return [int(part) for part in parts]
    except ValueError:
        raise UsageError(f"posenc bench: --seeds needs integers, got {' '.join(words)!r}") from None


def _bench_report(folder: Path, report: Any) -> int:
    from .bench.runner import RESULTS_FILE, load_records

    if not (folder / RESULTS_FILE).is_file():
        raise UsageError(f"posenc bench: --report-only {folder}: there is no {RESULTS_FILE}")
    reports = report.write_reports(folder, load_records(folder))
    _bench_print(folder, reports, report)
    return 0


def _bench_print(out: Path, reports: dict[str, Path], report: Any) -> None:
    from .bench.runner import RESULTS_FILE, load_records

    files = [out / RESULTS_FILE, *reports.values()]
    print("results: " + ", ".join(str(path) for path in files))
    if "plot" not in reports:
        print("(no accuracy.png: matplotlib is not installed or there are no results)")
    print()
    sys.stdout.write(report.markdown(load_records(out)))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``posenc`` console script; returns the exit status."""
    try:
        args = _parser().parse_args(argv)
        check_choice(args.command, "command", ("table", "plot", "embed", "demo", "bench"))
        handler = {
            "table": _cmd_table,
            "plot": _cmd_plot,
            "embed": _cmd_embed,
            "demo": _cmd_demo,
            "bench": _cmd_bench,
        }[args.command]
        status = handler(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as exc:
        print(f"posenc {_command_of(argv)}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"posenc: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `posenc table ... | head`
        return 0
    return status or 0


def _command_of(argv: Sequence[str] | None) -> str:
    words = list(sys.argv[1:] if argv is None else argv)
    return next((w for w in words if not w.startswith("-")), "")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
