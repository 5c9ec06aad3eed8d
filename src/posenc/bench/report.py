"""Reports of a bench: each variant's scores by length, with 95% intervals over seeds.

Records are the dicts that :func:`posenc.bench.train.run` returns (one per run, one line
each of ``results.jsonl``). :func:`~posenc.bench.aggregate.aggregate` gives, per task,
settings, variant and evaluation length, the mean, the standard deviation and the 95%
confidence interval (Student's t) over the seeds of exact match, token accuracy, loss
and perplexity. :func:`markdown` writes one table per task, marking at each length the
variants the seeds do not tell apart from the best (:func:`~posenc.bench.aggregate.resolved`),
:func:`~posenc.bench.figure.plot` one panel per task, and :func:`write_reports` puts
``results.md``, ``summary.json`` and ``accuracy.png`` into an output folder.

The headline score is exact match (the fraction of sequences whose every target token is
right) for every task but lm, and perplexity for lm.

matplotlib is imported when a picture is drawn, scipy (the t quantiles) when an interval
is computed.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._checks import check_choice, describe
from .._files import atomic_write, output_folder
from .aggregate import _NAMES, METRICS, _tables, aggregate, headline_metric, resolved
from .figure import plot
from .records import RESULTS_FILE, finite, load_records

__all__ = [
    "METRICS",
    "aggregate",
    "headline_metric",
    "markdown",
    "plot",
    "summary",
    "write_reports",
]


def _format(value: float, metric: str) -> str:
    if metric in ("loss", "perplexity"):
        return f"{value:.2f}"
    return f"{value:.3f}"


def _settings_line(settings: dict[str, Any]) -> str:
    lo, hi = settings.get("train_lengths", (None, None))
    parts = [
        f"trained on lengths {lo}–{hi} (columns marked *)",
        f"steps {settings.get('steps')}",
        f"batch {settings.get('batch_size')}",
        f"lr {settings.get('lr'):g}" if settings.get("lr") is not None else "lr ?",
        f"d_model {settings.get('d_model')}",
        f"layers {settings.get('n_layers')}",
        f"heads {settings.get('n_heads')}",
        _samples(settings),
    ]
    if settings.get("text"):
        parts.append(f"text {settings['text']}")
    return ", ".join(parts)


def _samples(settings: dict[str, Any]) -> str:
    """What each length is evaluated on: drawn problems, or the lm held-out text's windows."""
    protocol = settings.get("lm_eval")
    if protocol == "tiled":
        return "perplexity over the held-out text in non-overlapping windows of each length"
    if protocol == "sliding":
        return "perplexity over the held-out text in windows sliding by a quarter length"
    return f"{settings.get('eval_samples')} samples per length"


def markdown(records: Iterable[dict[str, Any]], *, metric: str | None = None) -> str:
    """One Markdown table per task: rows are variants, columns evaluation lengths.

    A cell is ``mean ± h`` over the seeds, ``h`` the half-width of the 95% confidence
    interval of the mean (Student's t; only the mean for a single seed), three
    decimals for exact match and token accuracy, two for loss and perplexity; ``–`` where
    no run measured the cell (or its score is ``None``), and ``(n=k)`` where fewer seeds
    measured it than the table's largest number. Columns of lengths within the training
    range are marked ``*``. Each task's runs with other settings (steps, sizes, lengths)
    get a table of their own.

    Args:
        records: Run records (see :func:`aggregate`).
        metric: One of :data:`METRICS`; default the headline score of each task
            (:func:`headline_metric`).

    Returns:
        The Markdown text, ending with a newline.

    Example:
        >>> spec = {"task": "copy", "scheme": "rope", "train_lengths": [4, 16], "steps": 9,
        ...         "batch_size": 4, "lr": 0.003, "d_model": 16, "n_layers": 1,
        ...         "n_heads": 2, "eval_samples": 10, "text": None}
        >>> def result(length, em):
        ...     return {"variant": "rope", "length": length, "exact_match": em,
        ...             "token_accuracy": em, "loss": 1.0, "perplexity": None,
        ...             "in_distribution": length <= 16, "samples": 10}
        >>> records = [{"key": str(seed), "spec": {**spec, "seed": seed},
        ...             "results": [result(8, 0.9 + seed / 20), result(32, 0.0)]}
        ...            for seed in (0, 1)]
        >>> print(markdown(records))  # doctest: +NORMALIZE_WHITESPACE
        ## copy
        <BLANKLINE>
        exact match, mean ± 95% interval (Student's t) over 2 seeds;
        trained on lengths 4–16 (columns marked *), steps 9, batch 4, lr 0.003, d_model 16,
        layers 1, heads 2, 10 samples per length
        <BLANKLINE>
        | variant | 8* | 32 |
        |---|---|---|
        | rope | 0.925 ± 0.318 | 0.000 ± 0.000 |
        <BLANKLINE>
    """
    if metric is not None:
        check_choice(metric, "metric", METRICS)
    tables = _tables(aggregate(records))
    if not tables:
        return "No results yet.\n"
    tasks_with_several = {
        t["task"] for t in tables if sum(u["task"] == t["task"] for u in tables) > 1
    }
    parts = []
    for number, table in enumerate(tables, start=1):
        task = table["task"]
        shown = metric or headline_metric(task)
        most = max(row["n"] for row in table["rows"])
        seeds = f"mean ± 95% interval (Student's t) over {most} seeds" if most > 1 else "1 seed"
        title = f"## {task}" + (f" ({number})" if task in tasks_with_several else "")
        leaders = _leaders(table["rows"], shown)
        cells = {(row["variant"], row["length"]): text for row in table["rows"]
                 if (text := _cell(row, shown, most, leaders)) is not None}  # fmt: skip
        header = [f"{L}*" if L in table["in_distribution"] else str(L) for L in table["lengths"]]
        lines = [
            title,
            "",
            f"{_NAMES[shown]}, {seeds}; {_settings_line(table['settings'])}",
            "",
            "| variant | " + " | ".join(header) + " |",
            "|---" * (len(header) + 1) + "|",
        ]
        for variant in table["variants"]:
            row_cells = [cells.get((variant, L), "–") for L in table["lengths"]]
            lines.append(f"| {variant} | " + " | ".join(row_cells) + " |")
        if leaders:
            lines += ["", _LEADERS_NOTE]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


_LEADERS_NOTE = (
    "**Bold**: the best mean at that length and each variant whose difference from it "
    "the seeds do not resolve (95% t-interval of the per-seed differences)."
)


def _cell(row: dict[str, Any], shown: str, most: int, leaders: set[tuple[str, int]]) -> str | None:
    """A table cell: ``mean ± h`` (the 95% interval's half-width), bold for a leader."""
    stats = row[shown]
    if stats["mean"] is None:
        return None
    text = _format(stats["mean"], shown)
    if most > 1 and stats["ci"] is not None:
        text += f" ± {_format((stats['ci'][1] - stats['ci'][0]) / 2, shown)}"
    if stats["n"] < most:
        text += f" (n={stats['n']})"
    return f"**{text}**" if (row["variant"], row["length"]) in leaders else text


def _leaders(rows: list[dict[str, Any]], metric: str) -> set[tuple[str, int]]:
    """(variant, length) of the best mean at each length and of every variant the seeds
    do not resolve from it (:func:`resolved`); a variant with fewer than two seeds in
    common with the best is left unmarked, and so is a length with one variant."""
    lower_is_better = metric in ("loss", "perplexity")
    leaders = set()
    for length in {row["length"] for row in rows}:
        here = [r for r in rows if r["length"] == length and r[metric]["mean"] is not None]
        if len(here) < 2:
            continue
        best = (min if lower_is_better else max)(here, key=lambda r: r[metric]["mean"])
        verdicts = {id(r): resolved(best, r, metric) for r in here if r is not best}
        if any(v is not None for v in verdicts.values()):  # a variant not paired: unmarked
            ties = [r for r in here if r is best or verdicts[id(r)] is False]
            leaders |= {(r["variant"], length) for r in ties}
    return leaders


def summary(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The aggregate as a JSON-ready dict: ``{"runs": int, "rows": aggregate(records)}``.

    Example:
        >>> summary([])
        {'runs': 0, 'rows': []}
    """
    records = list(records)
    report: dict[str, Any] = finite(
        {"runs": len({r.get("key") for r in records}), "rows": aggregate(records)}
    )
    return report


def write_reports(
    out_dir: str | os.PathLike[str], records: Iterable[dict[str, Any]] | None = None
) -> dict[str, Path]:
    """Write ``results.md``, ``summary.json`` and ``accuracy.png`` into ``out_dir``.

    ``results.md`` holds the headline tables (:func:`markdown`) and then the token
    accuracy tables. Without matplotlib, or without any record, no picture is written
    (and an old one is removed, so that it never shows other results than the tables).

    Args:
        out_dir: The output folder (created if missing; its parent must exist).
        records: The records; default those of ``out_dir/results.jsonl``.

    Returns:
        The files written: ``{"markdown": ..., "summary": ..., "plot": ...}`` (``"plot"``
        only when a picture was written).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     sorted(write_reports(tmp))
        ['markdown', 'summary']
    """
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir must be a str or os.PathLike, got {describe(out_dir)}")
    out = output_folder(out_dir)
    records = load_records(out / RESULTS_FILE) if records is None else list(records)
    text = "# Bench results\n\n" + markdown(records)
    if records:
        text += "\n# Token accuracy\n\n" + markdown(records, metric="token_accuracy")
    text += _unknown_note(records)
    written = {
        "markdown": _write_text(out / "results.md", text),
        "summary": _write_text(
            out / "summary.json", json.dumps(summary(records), indent=1, allow_nan=False) + "\n"
        ),
    }
    picture = out / "accuracy.png"
    picture.unlink(missing_ok=True)
    if aggregate(records):
        with contextlib.suppress(ImportError):  # no matplotlib: tables only
            written["plot"] = plot(records, picture)
    return written


def _unknown_note(records: list[dict[str, Any]]) -> str:
    """lm: how many scored evaluation characters were never seen in training, per length."""
    counts: dict[tuple[str, int], list[int]] = {}
    for spec, result in ((r.get("spec", {}), x) for r in records for x in r.get("results", [])):
        # once per run and length: the scheme's own variant
        if spec.get("task") == "lm" and result.get("variant") == spec.get("scheme"):
            total = counts.setdefault((spec.get("text") or "synthetic", result["length"]), [0, 0])
            total[0] += result.get("unknown_tokens", 0)
            total[1] += result.get("scored_tokens", 0)
    rows = [f"| {text} | {n} | {u} | {s} ({u / max(s, 1):.3%}) |"
            for (text, n), (u, s) in sorted(counts.items()) if s]  # fmt: skip
    head = ("\n# lm: evaluation characters never seen in training\n\nThey are `<unk>`: scored,"
            " never trained on, so predicted wrong (and in the perplexity). All runs' windows:"
            "\n\n| text | length | `<unk>` | scored |\n|---|---:|---:|---:|\n")  # fmt: skip
    return head + "\n".join(rows) + "\n" if rows else ""


def _write_text(path: Path, text: str) -> Path:
    """Write through a temporary file, so that a reader never sees half a report."""
    with atomic_write(path) as file:
        file.write(text)
    return path
