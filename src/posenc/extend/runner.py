"""Evaluate RoPE scalings on a model: the grid of probes, run and kept like the bench's.

:func:`plan` makes the probes of an evaluation (scalings × lengths × depths × trials for
passkey retrieval, scalings × lengths × windows for perplexity), shortest lengths first,
so that an interrupted evaluation already holds whole comparisons at its first lengths.
:func:`evaluate` runs them through the bench's executor (this process, or one Ray task
per probe) and appends one record per finished probe to ``results.jsonl``; with
``resume=True`` it skips the probes already there. The reports
(:mod:`posenc.extend.report`) are rewritten from the whole results file at the end, and
when the evaluation is interrupted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._checks import check_choice, check_int, describe
from ..bench.records import Outcome, lock_folder
from .models import context_length, fingerprint, own_scaling, resolve
from .probes import DEFAULT_SCALINGS, TASKS, Probe, parse_length, parse_scaling
from .texts import load_text

__all__ = ["DEPTHS", "LENGTHS", "evaluate", "plan"]

#: Where the key is hidden when no depths are named: near the start, the middle, the end.
DEPTHS = (0.1, 0.5, 0.9)
#: The lengths evaluated when none are named: the model's context, twice and four times.
LENGTHS = ("1x", "2x", "4x")


def plan(
    folder: str | os.PathLike[str],
    *,
    scalings: Sequence[str] | None = None,
    lengths: Sequence[int | str] = LENGTHS,
    depths: Sequence[float] = DEPTHS,
    trials: int = 1,
    windows: int = 1,
    tasks: Sequence[str] = TASKS,
    text: str | os.PathLike[str] | None = None,
    factor: float | None = None,
    dtype: str = "float32",
    device: str = "cpu",
) -> list[Probe]:
    """The probes of an evaluation of the model in ``folder`` (a ``transformers`` folder:
    :func:`posenc.extend.models.resolve` gives one for a GGUF file).

    Args:
        folder: The model's folder.
        scalings: As :func:`~posenc.extend.probes.parse_scaling` reads them (default
            :data:`~posenc.extend.probes.DEFAULT_SCALINGS`, and ``"model"`` too for a
            model whose config has a scaling of its own).
        lengths: Tokens, or multiples of the model's context (``"2x"``).
        depths: Passkey depths in [0, 1].
        trials: Passkey keys per length and depth.
        windows: Perplexity windows per length (window ``i`` is the text's tokens
            ``i * length .. (i + 1) * length``).
        tasks: ``"passkey"``, ``"perplexity"`` or both.
        text: The perplexity text (a UTF-8 file; default: the Python documentation,
            :mod:`posenc.extend.texts`).
        factor: The factor of each scaling not given one (default: the longest length
            over the model's context, at least 1).
        dtype: The model's dtype.
        device: Where the probes run.

    Raises:
        TypeError, ValueError: A bad argument (the message names it).
        FileNotFoundError: No ``config.json`` in ``folder``, or no text file.

    Example:
        >>> import json, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> config = {"model_type": "llama", "head_dim": 64, "max_position_embeddings": 8192,
        ...           "rope_parameters": {"rope_type": "default", "rope_theta": 1e5}}
        >>> _ = Path(folder, "config.json").write_text(json.dumps(config))
        >>> probes = plan(folder, scalings=["none", "yarn"], lengths=["1x", "2x"],
        ...               depths=[0.5], tasks=["passkey"])
        >>> [probe.label() for probe in probes]  # doctest: +NORMALIZE_WHITESPACE
        ['none passkey 8192 depth 0.5 #0', 'yarn ×2 passkey 8192 depth 0.5 #0',
         'none passkey 16384 depth 0.5 #0', 'yarn ×2 passkey 16384 depth 0.5 #0']
    """
    path = Path(folder)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    context = context_length(config)
    own = own_scaling(config)
    tasks = _distinct(tasks, "tasks", TASKS)
    sizes = sorted({parse_length(length, context) for length in _sequence(lengths, "lengths")})
    if not sizes:
        raise ValueError("lengths must name at least one length")
    if factor is None:
        factor = max(1.0, sizes[-1] / context)
    chosen = _scalings(scalings, context, factor, own)
    where = _depths(depths, tasks)
    trials = check_int(trials, "trials", minimum=1)
    windows = check_int(windows, "windows", minimum=1)
    base: dict[str, Any] = {"model": str(path), "fingerprint": fingerprint(path), "dtype": dtype,
            "device": device}  # fmt: skip
    text_fields: dict[str, Any] = {}
    if "perplexity" in tasks:
        _, _, digest = load_text(None if text is None else os.fspath(text))
        text_fields = {"text": None if text is None else os.fspath(text), "text_digest": digest}
    probes = []
    for length in sizes:
        for name, rope in chosen:
            if "passkey" in tasks:
                probes += [
                    Probe(
                        **base,
                        scaling=name,
                        rope=rope,
                        task="passkey",
                        length=length,
                        depth=depth,
                        trial=trial,
                    )
                    for depth in where
                    for trial in range(trials)
                ]
            if "perplexity" in tasks:
                probes += [
                    Probe(
                        **base,
                        scaling=name,
                        rope=rope,
                        task="perplexity",
                        length=length,
                        trial=window,
                        **text_fields,
                    )
                    for window in range(windows)
                ]
    return probes


def _scalings(
    scalings: Sequence[str] | None, context: int, factor: float, own: dict[str, Any]
) -> list[tuple[str, dict[str, Any]]]:
    """``(name, scaling)`` of each scaling named (default: :data:`DEFAULT_SCALINGS`, and
    ``"model"`` for a model with a scaling of its own), distinct."""
    if scalings is None:
        scalings = [*DEFAULT_SCALINGS, *(["model"] if own["rope_type"] != "default" else [])]
    chosen = [
        parse_scaling(name, context=context, factor=factor, own=own)
        for name in _sequence(scalings, "scalings")
    ]
    names = [name for name, _ in chosen]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"scalings must be distinct and at least one, got {names}")
    return chosen


def _depths(depths: Sequence[float], tasks: Sequence[str]) -> list[float]:
    """The passkey depths, each in [0, 1], distinct, at least one where passkey is asked."""
    where = [_depth(d, i) for i, d in enumerate(_sequence(depths, "depths"))]
    if "passkey" in tasks and (not where or len(set(where)) != len(where)):
        raise ValueError(f"depths must be distinct and at least one for passkey, got {where}")
    return where


def _sequence(value: Any, name: str) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence, got {describe(value)}")
    return list(value)


def _distinct(value: Any, name: str, valid: Sequence[str]) -> tuple[str, ...]:
    items = _sequence(value, name)
    for i, item in enumerate(items):
        check_choice(item, f"{name}[{i}]", valid)
    if not items or len(set(items)) != len(items):
        raise ValueError(f"{name} must be distinct names from {list(valid)}, got {items}")
    return tuple(items)


def _depth(value: Any, index: int) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"depths[{index}] must be a number in [0, 1], got {describe(value)}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"depths[{index}] must be in [0, 1], got {value!r}")
    return float(value)


def evaluate(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str] = "posenc-extend",
    *,
    gguf: str | None = None,
    cache: str | os.PathLike[str] | None = None,
    resume: bool = False,
    progress: bool = True,
    executor: str = "local",
    address: str | None = None,
    jobs: int | None = 1,
    threads: int | None = None,
    **grid: Any,
) -> Outcome:
    """Evaluate RoPE scalings on a model; one record per probe in ``out/results.jsonl``.

    Args:
        model: A ``transformers`` folder, or a GGUF file (or its folder with ``gguf``),
            converted once and kept (:func:`posenc.extend.models.resolve`).
        out: The output folder (created; its parent must exist).
        gguf: The GGUF file's name in ``model``.
        cache: Where converted models are kept.
        resume: Skip the probes the results file holds; without it a non-empty results
            file is an error.
        progress: A bar over the probes (and over the current probe's layers) on stderr.
        executor: ``"local"`` (this process; ``jobs`` worker processes if more than 1,
            each loading the model) or ``"ray"`` (one Ray task per probe, each Ray worker
            loading the model once; ``address`` the cluster).
        jobs: Probes at once (``None``: Ray's choice, or one per usable core locally).
        threads: PyTorch threads of each probe (default: the usable cores over ``jobs``).
        **grid: :func:`plan`'s arguments (``scalings``, ``lengths``, ``depths``,
            ``trials``, ``windows``, ``tasks``, ``text``, ``factor``, ``dtype``,
            ``device``).

    Returns:
        The bench's :class:`~posenc.bench.records.Outcome`: the records, how many ran
        and were skipped, the failures, and the reports written.

    Example:
        A model of one layer with random weights and a tokenizer trained on the spot,
        its perplexity at twice its context, unscaled and with YaRN:

        >>> import tempfile, transformers
        >>> from tokenizers import Tokenizer, models, pre_tokenizers, trainers
        >>> bpe = Tokenizer(models.BPE())
        >>> bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
        >>> alphabet = pre_tokenizers.ByteLevel.alphabet()
        >>> bpe.train_from_iterator(["The pass key is 12345."],
        ...                         trainers.BpeTrainer(initial_alphabet=alphabet))
        >>> config = transformers.LlamaConfig(
        ...     vocab_size=bpe.get_vocab_size(), hidden_size=64, intermediate_size=64,
        ...     num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=128)
        >>> folder = tempfile.mkdtemp()
        >>> transformers.LlamaForCausalLM(config).save_pretrained(folder)
        >>> _ = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe).save_pretrained(folder)
        >>> outcome = evaluate(folder, f"{folder}/out", scalings=["none", "yarn"],
        ...                    lengths=["2x"], tasks=["perplexity"], progress=False)
        >>> [(r["probe"]["scaling"], r["probe"]["length"]) for r in outcome.records]
        [('none', 256), ('yarn', 256)]
        >>> sorted(outcome.reports)
        ['markdown', 'perplexity', 'summary']
    """
    from ..bench.runner import _execute_locked
    from ..bench.workers import check_not_bootstrapping, usable_cores
    from .measure import run_probe
    from .report import write_reports

    check_not_bootstrapping()
    check_choice(executor, "executor", ("local", "ray"))
    if executor == "local":
        grid["device"] = _local_device(grid.get("device", "cpu"))
    folder = resolve(model, gguf, cache=cache)
    probes = plan(folder, **grid)
    jobs = None if jobs is None else check_int(jobs, "jobs", minimum=1)
    if jobs is None and executor == "local":  # the bench's rule: one job per core
        jobs = max(1, min(usable_cores(), len(probes)))
    if threads is None:
        threads = max(1, usable_cores() // (jobs or 1))
    threads = check_int(threads, "threads", minimum=1, maximum=4096)
    if address is not None and executor != "ray":
        raise ValueError(f"address={address!r} applies to executor='ray' only")
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out must be a str or os.PathLike, got {describe(out)}")
    where = (executor, address)
    with lock_folder(Path(out)):
        return _execute_locked(
            probes, Path(out), jobs, threads, resume, progress, run_probe, where, write_reports
        )


def _local_device(device: str) -> str:
    """The device probes run on here: the bench's check (a device this machine lacks
    would fail every probe) and its choice for ``"auto"``."""
    from ..bench.preflight import check_device
    from ..bench.train import resolve_device

    check_device(device, "device")
    return str(resolve_device(device))
