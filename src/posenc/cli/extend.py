"""``posenc extend``: which RoPE scaling for my model? (:mod:`posenc.extend`).

Evaluates RoPE scalings on a Hugging Face causal LM past its context: passkey retrieval
on a grid of length × depth and perplexity on long text, with posenc's exact tables
patched in; records in ``DIR/results.jsonl`` (one line per probe, ``--resume`` goes on
where an interrupted evaluation stopped), tables in ``DIR/results.md`` and pictures in
``DIR/passkey.png`` and ``DIR/perplexity.png``. PyTorch and ``transformers`` are
imported when probes run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .._extras import require
from ..bench.plugins import load_plugin
from ..bench.records import RESULTS_FILE, FolderInUseError, RunsFailedError
from .base import UsageError

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Add ``posenc extend`` to the top parser's sub-commands."""
    from ..extend.probes import DEFAULT_SCALINGS
    from ..extend.runner import DEPTHS, LENGTHS

    parser = commands.add_parser(
        "extend",
        help="which RoPE scaling for my model? passkey and perplexity past its context",
        description=(
            "Evaluate RoPE scalings on a Hugging Face causal LM past the context it was "
            "trained to: passkey retrieval on a grid of length x depth and perplexity on "
            "long text, with posenc's exact RoPE tables. Results go to DIR/results.jsonl "
            "(one line per probe), DIR/results.md, DIR/summary.json, DIR/passkey.png and "
            "DIR/perplexity.png. See docs/choosing-a-rope-scaling.md."
        ),
    )
    parser.set_defaults(handler=run)
    parser.add_argument(
        "model",
        type=Path,
        metavar="MODEL",
        help="a transformers folder (config.json, weights, tokenizer) or a .gguf file",
    )
    parser.add_argument(
        "--gguf", metavar="NAME", help="the GGUF file in the MODEL folder (converted once, cached)"
    )
    grid = parser.add_argument_group("the grid")
    grid.add_argument(
        "--scalings",
        nargs="+",
        metavar="NAME",
        help=f"none, model (the config's own), or a RoPE scaling with optional parameters, "
        f"e.g. yarn:factor=8 (default: {' '.join(DEFAULT_SCALINGS)}, and model where the "
        "config has a scaling)",
    )
    grid.add_argument(
        "--lengths",
        nargs="+",
        metavar="L",
        default=list(LENGTHS),
        help=f"tokens, or multiples of the model's context such as 2x (default "
        f"{' '.join(LENGTHS)})",
    )
    grid.add_argument(
        "--factor",
        type=float,
        metavar="F",
        help="the factor of each scaling not given one (default: the longest length over "
        "the context)",
    )
    grid.add_argument(
        "--tasks",
        nargs="+",
        choices=("passkey", "perplexity"),
        default=["passkey", "perplexity"],
        help="what to measure (default both)",
    )
    grid.add_argument(
        "--depths",
        nargs="+",
        type=float,
        metavar="D",
        default=list(DEPTHS),
        help=f"passkey: where the key is, in [0, 1] (default {' '.join(map(str, DEPTHS))})",
    )
    grid.add_argument(
        "--trials", type=int, default=1, metavar="N", help="passkey: keys per length and depth"
    )
    grid.add_argument(
        "--windows", type=int, default=1, metavar="N", help="perplexity: windows per length"
    )
    grid.add_argument(
        "--text",
        type=Path,
        metavar="FILE",
        help="perplexity on this UTF-8 text (default: the Python documentation)",
    )
    grid.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="the model's dtype (default float32)",
    )
    grid.add_argument(
        "--device", default="cpu", metavar="DEVICE", help="cpu, cuda, cuda:N, mps or auto"
    )
    grid.add_argument(
        "--plugin",
        action="append",
        type=Path,
        metavar="FILE.py",
        help="import this Python file first (it may register RoPE scalings); repeatable",
    )
    execution = parser.add_argument_group("execution")
    execution.add_argument(
        "--out", "-o", type=Path, default=Path("posenc-extend"), metavar="DIR",
        help="output folder (default ./posenc-extend)",
    )  # fmt: skip
    execution.add_argument(
        "--resume", action="store_true", help="skip the probes DIR/results.jsonl already holds"
    )
    execution.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="local: this process (default); ray: each probe a Ray task, each Ray worker "
        "loading the model once",
    )
    execution.add_argument(
        "--address", metavar="ADDR", help="with --executor ray: the cluster to join"
    )
    execution.add_argument(
        "--jobs", "-j", type=int, metavar="N", help="probes at once (default 1 locally)"
    )
    execution.add_argument(
        "--threads", type=int, metavar="T", help="PyTorch threads per probe (default: the cores)"
    )
    execution.add_argument(
        "--cache", type=Path, metavar="DIR", help="where converted GGUF models are kept"
    )
    execution.add_argument(
        "--dry-run", action="store_true", help="print the probes as JSON lines and run nothing"
    )
    execution.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    """Run ``posenc extend`` as ``args`` asks; the exit status."""
    from ..extend import models, runner

    _check(args)
    grid = {
        "scalings": args.scalings,
        "lengths": args.lengths,
        "depths": args.depths,
        "trials": args.trials,
        "windows": args.windows,
        "tasks": args.tasks,
        "text": args.text,
        "factor": args.factor,
        "dtype": args.dtype,
        "device": args.device,
    }
    if args.dry_run:
        folder = models.resolve(args.model, args.gguf, cache=args.cache)
        for probe in runner.plan(folder, **grid):
            print(json.dumps(probe.to_dict(), ensure_ascii=False))
        return 0
    return _evaluate(args, grid, runner)


def _check(args: argparse.Namespace) -> None:
    """Load the plugins; refuse options that do not go together."""
    for path in args.plugin or []:
        try:
            load_plugin(path)
        except (FileNotFoundError, ValueError, ImportError) as exc:
            raise UsageError(f"posenc extend: --plugin {path}: {exc}") from None
    if args.address is not None and args.executor != "ray":
        raise UsageError("posenc extend: --address applies with --executor ray only")
    for flag, value in (("--jobs", args.jobs), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise UsageError(f"posenc extend: {flag} must be >= 1, got {value}")


def _evaluate(args: argparse.Namespace, grid: dict[str, Any], runner: Any) -> int:
    """Run the evaluation, print what it did and its tables; the exit status."""
    require("torch", "posenc extend", extra="posenc[extend]")
    require("transformers", "posenc extend", extra="posenc[extend]")
    try:
        outcome = runner.evaluate(
            args.model,
            args.out,
            gguf=args.gguf,
            cache=args.cache,
            resume=args.resume,
            progress=not args.no_progress,
            executor=args.executor,
            address=args.address,
            jobs=args.jobs if args.jobs is not None else 1 if args.executor == "local" else None,
            threads=args.threads,
            **grid,
        )
    except (FileExistsError, FolderInUseError) as exc:
        raise UsageError(f"posenc extend: {exc}") from None
    except RunsFailedError as exc:
        print(f"posenc extend: error: {exc}; --resume runs them again", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        results = args.out / RESULTS_FILE
        kept = f"the finished probes are in {results}" if results.exists() else "none finished"
        print(f"\ninterrupted: {kept}; run the same command with --resume to go on",
              file=sys.stderr)  # fmt: skip
        return 130
    print(
        f"{outcome.ran} probes done, {outcome.skipped} already in the results, "
        f"{len(outcome.failures)} failed"
    )
    files = [args.out / RESULTS_FILE, *outcome.reports.values()]
    print("results: " + ", ".join(str(path) for path in files))
    print()
    sys.stdout.write((args.out / "results.md").read_text(encoding="utf-8"))
    if outcome.failures:
        print(f"{len(outcome.failures)} probes failed (errors in {args.out / 'failures.jsonl'});"
              " --resume runs them again", file=sys.stderr)  # fmt: skip
        return 1
    return 0
