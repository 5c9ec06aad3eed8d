"""``posenc bench``: the command line of the experiment bench (:mod:`posenc.bench`).

The top parser of :mod:`posenc.cli` adds this command with :func:`add_parser`; its
:func:`run` expands a preset and the options given into run specs
(:func:`posenc.bench.runner.expand`) and runs them (:func:`posenc.bench.runner.execute`),
or prints them (``--dry-run``), runs exactly one (``--spec-json``) or remakes the reports
of a results folder (``--report-only``). Options parse to ``None`` when absent, so that
the ones given show. The runner and the reports are imported when the command runs, and
PyTorch only when a run trains.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from .._checks import check_choice
from .._extras import require
from ..bench import preflight
from ..bench.plugins import load_plugin, scheme_names, task_names
from ..bench.records import RESULTS_FILE, FolderInUseError, RunsFailedError, load_records
from ..bench.spec import SCHEMES, RunSpec, check_rope_eval_scaling
from .base import UsageError

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Add ``posenc bench`` to the top parser's sub-commands."""
    from ..bench.runner import FULL

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
    bench.set_defaults(handler=run)
    bench.add_argument(
        "--preset",
        choices=("quick", "full"),
        default="quick",
        help=f"quick: {len(SCHEMES)} schemes on copy, 1 seed; full: {len(FULL['tasks'])} tasks x "
        f"{len(SCHEMES)} schemes x 5 seeds (default quick)",
    )
    grid = bench.add_argument_group("the grid (default: the preset's)")
    grid.add_argument(
        "--tasks",
        nargs="+",
        metavar="TASK",
        help="copy reverse sort add lm, or a task a --plugin registers",
    )
    grid.add_argument(
        "--schemes",
        nargs="+",
        metavar="SCHEME",
        help=f"{' '.join(SCHEMES)}, or a scheme a --plugin registers",
    )
    grid.add_argument(
        "--plugin",
        action="append",
        type=Path,
        metavar="FILE.py",
        help="import this Python file first: it registers tasks or schemes "
        "(posenc.bench.register_task / register_scheme); repeatable",
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
        "dynamic_ntk, or another registered one whose only required parameters are "
        "factor and original_max_position_embeddings); none: only plain rope",
    )
    model.add_argument(
        "--extensions",
        nargs="+",
        metavar="NAME",
        help="rope only: one run per context-extension stage, each fine-tuning the same "
        "trained base at --extension-lengths with this scaling (none: a plain fine-tune; "
        "linear ntk yarn dynamic_ntk)",
    )
    model.add_argument(
        "--extension-lengths",
        type=int,
        nargs=2,
        metavar=("LO", "HI"),
        help="with --extensions: the fine-tune's problem lengths, HI past the training's",
    )
    model.add_argument(
        "--extension-steps", type=int, metavar="N", help="with --extensions: fine-tune steps"
    )
    model.add_argument(
        "--text",
        type=Path,
        metavar="FILE",
        help="lm task: train on this UTF-8 text (default a synthetic grammar)",
    )
    model.add_argument(
        "--lm-eval",
        choices=("tiled", "sliding"),
        help="lm: perplexity over the held-out text in non-overlapping windows of each "
        "length (tiled, default) or in windows sliding by a quarter length",
    )
    model.add_argument(
        "--device", metavar="DEVICE", help="auto, cpu, cuda, cuda:N or mps (default cpu)"
    )
    execution = bench.add_argument_group("execution")
    execution.add_argument(
        "--jobs",
        "-j",
        type=int,
        metavar="N",
        help="worker processes (default: the cores this process may use, at most one per run)",
    )
    execution.add_argument(
        "--threads",
        type=int,
        metavar="T",
        help="PyTorch threads of each job (default 1: the models are small, and the "
        "records are then the same whatever --jobs)",
    )
    execution.add_argument(
        "--executor",
        choices=("local", "ray"),
        help="local: this machine's worker processes (default); ray: each run a Ray task "
        "(pip install 'posenc[ray]'), --jobs then caps the tasks in flight",
    )
    execution.add_argument(
        "--address",
        metavar="ADDR",
        help="with --executor ray: the cluster to join (auto, ray://HEAD:10001, ...; "
        "default: start a local Ray instance)",
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
    "lm_eval": ("--lm-eval", "lm_eval"),
    "extensions": ("--extensions", "extensions"),
    "extension_lengths": ("--extension-lengths", "extension_lengths"),
    "extension_steps": ("--extension-steps", "extension_steps"),
}


def run(args: argparse.Namespace) -> int:
    """Run ``posenc bench`` as ``args`` asks; the exit status."""
    from ..bench import report, runner

    given = _given_flags(args)
    _load_plugins(args.plugin or [])
    if args.report_only is not None:
        _check_report_only(args, given)
        return _report_only(args.report_only, report)
    if args.spec_json is not None:
        return _run_spec_json(args, given, runner)

    if args.address is not None and args.executor != "ray":
        raise UsageError("posenc bench: --address applies with --executor ray only")
    config = _config(args, runner.PRESETS[args.preset])
    for flag, value in (("--jobs", args.jobs), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise UsageError(f"posenc bench: {flag} must be >= 1, got {value}")
    specs = runner.expand(config)
    if args.text is not None:  # before any run: every lm run would fail on it
        preflight.check_text(args.text, specs, "--text")
    out = Path("posenc-bench") if args.out is None else args.out
    if args.dry_run:
        todo = runner.pending(specs, out) if args.resume else specs
        for spec in todo:
            print(json.dumps(spec.to_dict(), ensure_ascii=False))
        return 0
    return _execute(args, specs, out, runner, report)


def _load_plugins(paths: list[Path]) -> None:
    """Import each ``--plugin`` file; a missing or failing one is a usage error."""
    for path in paths:
        try:
            load_plugin(path)
        except (FileNotFoundError, ValueError) as exc:
            raise UsageError(f"posenc bench: --plugin {path}: {exc}") from None
        except ImportError as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            raise UsageError(
                f"posenc bench: --plugin {path} failed: {type(cause).__name__}: {cause}"
            ) from None


def _given_flags(args: argparse.Namespace) -> list[str]:
    """The flags given of the grid, the run settings, ``--dry-run`` and ``--resume``."""
    grid = {"tasks": "--tasks", "schemes": "--schemes", "seeds": "--seeds"}
    given = [flag for dest, (flag, _) in _BENCH_SETTINGS.items() if getattr(args, dest) is not None]
    given += [flag for dest, flag in grid.items() if getattr(args, dest) is not None]
    for flag, value in (("--dry-run", args.dry_run), ("--resume", args.resume)):
        if value:
            given.append(flag)
    return given


def _check_report_only(args: argparse.Namespace, given: list[str]) -> None:
    """``--report-only`` takes no other option (but ``--no-progress``)."""
    extra = [
        *given,
        *(["--spec-json"] if args.spec_json is not None else []),
        *(["--device"] if args.device is not None else []),
        *(["--out"] if args.out is not None else []),
    ]
    extra += _execution_flags(args)
    if extra:
        raise UsageError(f"posenc bench: {extra[0]} does not apply with --report-only")


def _execution_flags(args: argparse.Namespace) -> list[str]:
    """``--jobs``, ``--threads``, ``--executor`` and ``--address`` where given."""
    flags = (("--jobs", args.jobs), ("--threads", args.threads), ("--executor", args.executor),
             ("--address", args.address))  # fmt: skip
    return [flag for flag, value in flags if value is not None]


def _run_spec_json(args: argparse.Namespace, given: list[str], runner: ModuleType) -> int:
    """``--spec-json``: run that one spec and print its record as one JSON line."""
    require("torch", "posenc bench", extra="posenc[bench]")
    extra = given + (["--out"] if args.out is not None else [])
    extra += [flag for flag in _execution_flags(args) if flag != "--threads"]
    if extra:
        raise UsageError(
            f"posenc bench: {extra[0]} does not apply with --spec-json (the spec gives "
            "every setting; only --device, --threads and --no-progress do)"
        )
    try:
        fields = json.loads(args.spec_json)
    except json.JSONDecodeError as exc:
        raise UsageError(f"posenc bench: --spec-json is not JSON ({exc})") from None
    if args.device is not None:
        preflight.check_device(args.device, "--device")
    spec = RunSpec.from_dict(fields)
    if args.device is not None:
        spec = RunSpec.from_dict({**spec.to_dict(), "device": args.device})
    preflight.check_device(spec.device, "--device" if args.device is not None else "device")
    if spec.text is not None:
        preflight.check_text(spec.text, [spec])
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1 if args.threads is None else args.threads)  # as the bench runs it
    try:
        record = runner.run_one(spec, progress=not args.no_progress)
    finally:
        torch.set_num_threads(before)
    print(json.dumps(record, ensure_ascii=False))
    return 0


def _config(args: argparse.Namespace, preset: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration of :func:`posenc.bench.runner.expand`: the preset, then the options."""
    config = dict(preset)
    for dest, (_, key) in _BENCH_SETTINGS.items():
        value = getattr(args, dest)
        if value is not None:
            config[key] = str(value) if dest == "text" else value
    if args.tasks is not None:
        config["tasks"] = [check_choice(t, "--tasks", task_names()) for t in args.tasks]
    if args.schemes is not None:
        config["schemes"] = [check_choice(s, "--schemes", scheme_names()) for s in args.schemes]
    if args.seeds is not None:
        config["seeds"] = _seeds(args.seeds)
    _check_task_options(args, config)
    if args.device is not None:
        config["device"] = args.device
        preflight.check_device(args.device, "--device", here=False)  # its name only
    return config


def _check_task_options(args: argparse.Namespace, config: dict[str, Any]) -> None:
    """``--rope-eval-scalings`` needs the rope scheme, ``--text`` the lm task and a file."""
    if args.rope_eval_scalings is not None:
        for name in args.rope_eval_scalings:
            check_rope_eval_scaling(name, "--rope-eval-scalings")
        if args.rope_eval_scalings and "rope" not in config["schemes"]:
            raise UsageError("posenc bench: --rope-eval-scalings needs the rope scheme")
    if args.lm_eval is not None and "lm" not in config["tasks"]:
        raise UsageError("posenc bench: --lm-eval applies to the lm task only")
    if args.text is not None:
        if "lm" not in config["tasks"]:
            raise UsageError("posenc bench: --text applies to the lm task only")
        if not args.text.is_file():
            raise UsageError(f"posenc bench: --text {args.text}: no such file")


def _execute(
    args: argparse.Namespace,
    specs: list[RunSpec],
    out: Path,
    runner: ModuleType,
    report: ModuleType,
) -> int:
    """Run ``specs`` into ``out``, print the summary and the reports; the exit status."""
    require("torch", "posenc bench", extra="posenc[bench]")  # before any worker starts
    if (args.executor or "local") == "local":  # Ray's nodes have devices of their own
        for device in sorted({spec.device for spec in specs}):
            preflight.check_device(device, "--device")
    try:
        outcome = runner.execute(
            specs,
            out,
            jobs=args.jobs,
            threads=args.threads,
            resume=args.resume,
            progress=not args.no_progress,
            executor=args.executor or "local",
            address=args.address,
        )
    except (FileExistsError, FolderInUseError) as exc:
        raise UsageError(f"posenc bench: {exc}") from None
    except RunsFailedError as exc:  # nothing ran: no summary, no tables, one line
        print(f"posenc bench: error: {exc}; --resume runs them again", file=sys.stderr)
        return 1
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
    _print_reports(out, outcome.reports, report)
    if outcome.failures:
        print(
            f"{len(outcome.failures)} runs failed (errors in {out / runner.FAILURES_FILE}); "
            "--resume runs them again",
            file=sys.stderr,
        )
        return 1
    return 0


def _seeds(words: list[str]) -> int | list[int]:
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


def _report_only(folder: Path, report: ModuleType) -> int:
    if not (folder / RESULTS_FILE).is_file():
        raise UsageError(f"posenc bench: --report-only {folder}: there is no {RESULTS_FILE}")
    reports = report.write_reports(folder, load_records(folder))
    _print_reports(folder, reports, report)
    return 0


def _print_reports(out: Path, reports: dict[str, Path], report: ModuleType) -> None:
    files = [out / RESULTS_FILE, *reports.values()]
    print("results: " + ", ".join(str(path) for path in files))
    if "plot" not in reports:
        print("(no accuracy.png: matplotlib is not installed or there are no results)")
    print()
    sys.stdout.write(report.markdown(load_records(out)))
