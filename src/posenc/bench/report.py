"""Reports of a bench: the mean and spread over seeds of each variant's scores by length.

Records are the dicts that :func:`posenc.bench.train.run` returns (one per run, one line
each of ``results.jsonl``). Runs that differ only in their seed (and device) are the
repetitions of one experiment: :func:`aggregate` gives, per task, settings, variant and
evaluation length, the mean and the sample standard deviation over the seeds of exact
match, token accuracy, loss and perplexity. :func:`markdown` writes one table per task,
:func:`plot` one panel per task, and :func:`write_reports` puts ``results.md``,
``summary.json`` and ``accuracy.png`` into an output folder.

The headline score is exact match (the fraction of sequences whose every target token is
right) for copy, reverse, sort and add, and perplexity for lm.

matplotlib is imported by :func:`plot` only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._checks import check_choice, describe
from .._files import atomic_write
from .records import RESULTS_FILE, finite, load_records
from .spec import ROPE_EVAL_SCALINGS, SCHEMES, TASKS

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "METRICS",
    "aggregate",
    "headline_metric",
    "markdown",
    "plot",
    "summary",
    "write_reports",
]

#: The scores of a record's results that are aggregated over seeds.
METRICS = ("exact_match", "token_accuracy", "loss", "perplexity")

_NAMES = {
    "exact_match": "exact match",
    "token_accuracy": "token accuracy",
    "loss": "loss (mean NLL per target token)",
    "perplexity": "perplexity",
}

# Spec fields that do not make runs different experiments: the seed only repeats one, the
# device does not change it, task and scheme are the table and the row, the evaluation
# lengths are the columns and RoPE's evaluation scalings only add rows.
_NOT_SETTINGS = ("task", "scheme", "seed", "device", "eval_lengths", "rope_eval_scalings")


def headline_metric(task: str) -> str:
    """The score the tables and the plot show for ``task``: perplexity for lm, else exact
    match (also for a registered task).

    Example:
        >>> headline_metric("copy"), headline_metric("lm")
        ('exact_match', 'perplexity')
    """
    if not isinstance(task, str):
        raise TypeError(f"task must be a task's name, got {describe(task)}")
    return "perplexity" if task == "lm" else "exact_match"


def aggregate(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard deviation over seeds, per task, settings, variant and length.

    Args:
        records: Run records (see :func:`posenc.bench.train.run`). A later record of the
            same run (key) replaces an earlier one, and so does a later evaluation of the
            same variant, seed and length (e.g. a ``"rope"`` run repeated with other
            ``rope_eval_scalings``).

    Returns:
        One dict per (task, settings, variant, length), ordered by task, settings (first
        seen first), variant (the order of the schemes, each RoPE scaling after
        ``"rope"``) and length, with the keys ``task``, ``settings`` (the spec's fields
        but task, scheme, seed, device, eval_lengths and rope_eval_scalings), ``variant``,
        ``length``, ``in_distribution``, ``seeds`` (sorted), ``n`` (number of seeds) and,
        for each of :data:`METRICS`, ``{"mean": float | None, "sd": float | None, "n":
        int}``: the mean and the sample standard deviation (``n - 1`` in the
        denominator; ``None`` for fewer than 2 values) of the values that are not
        ``None``.

    Raises:
        TypeError: A record is not a dict.
        ValueError: A record lacks ``"key"``, ``"spec"`` or ``"results"``, or a result
            lacks its variant or length.

    Example:
        >>> spec = {"task": "copy", "scheme": "rope", "train_lengths": [4, 16]}
        >>> def record(seed, em):
        ...     result = {"variant": "rope", "length": 8, "exact_match": em,
        ...               "token_accuracy": 1.0, "loss": 0.1, "perplexity": None,
        ...               "in_distribution": True, "samples": 10}
        ...     return {"key": str(seed), "spec": {**spec, "seed": seed}, "results": [result]}
        >>> [row] = aggregate([record(0, 0.5), record(1, 0.7)])
        >>> row["variant"], row["length"], row["seeds"], row["exact_match"]["mean"]
        ('rope', 8, [0, 1], 0.6)
        >>> round(row["exact_match"]["sd"], 6), row["perplexity"]
        (0.141421, {'mean': None, 'sd': None, 'n': 0})
    """
    latest: dict[str, dict[str, Any]] = {}
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise TypeError(f"records[{i}] must be a dict record, got {describe(record)}")
        missing = [k for k in ("key", "spec", "results") if k not in record]
        if missing:
            raise ValueError(f"records[{i}] is not a run record: it lacks {missing}")
        latest.pop(record["key"], None)  # a repeated run counts where it was last written
        latest[record["key"]] = record

    groups: dict[tuple[str, str], dict[str, Any]] = {}  # (task, settings JSON) -> cells
    for record in latest.values():
        spec = record["spec"]
        task = spec["task"]
        settings = {k: v for k, v in spec.items() if k not in _NOT_SETTINGS}
        group = groups.setdefault(
            (task, json.dumps(settings, sort_keys=True)), {"settings": settings, "cells": {}}
        )
        for j, result in enumerate(record["results"]):
            if "variant" not in result or "length" not in result:
                raise ValueError(
                    f"record {record['key']}: results[{j}] lacks its variant or length"
                )
            cell = group["cells"].setdefault((result["variant"], result["length"]), {})
            cell[spec.get("seed", 0)] = result

    rows = []
    task_order = {task: i for i, task in enumerate(TASKS)}
    ordered = sorted(
        enumerate(groups.items()), key=lambda item: (task_order.get(item[1][0][0], 99), item[0])
    )
    for _, ((task, _), group) in ordered:
        for (variant, length), by_seed in sorted(
            group["cells"].items(), key=lambda item: (_variant_order(item[0][0]), item[0][1])
        ):
            row: dict[str, Any] = {
                "task": task,
                "settings": group["settings"],
                "variant": variant,
                "length": length,
                "in_distribution": any(r.get("in_distribution") for r in by_seed.values()),
                "seeds": sorted(by_seed),
                "n": len(by_seed),
            }
            for metric in METRICS:
                values = [float(r[metric]) for r in by_seed.values() if r.get(metric) is not None]
                row[metric] = _stats(values)
            rows.append(row)
    return rows


def _stats(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"mean": None, "sd": None, "n": 0}
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else None,
        "n": len(values),
    }


def _variant_order(variant: str) -> tuple[int, int, str]:
    scheme, _, scaling = variant.partition("+")
    first = SCHEMES.index(scheme) if scheme in SCHEMES else len(SCHEMES)
    if not scaling:
        second = 0
    elif scaling in ROPE_EVAL_SCALINGS:
        second = 1 + ROPE_EVAL_SCALINGS.index(scaling)
    else:
        second = 1 + len(ROPE_EVAL_SCALINGS)
    return first, second, variant


def _tables(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows grouped by (task, settings), in order: one table or panel each."""
    tables: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["task"], json.dumps(row["settings"], sort_keys=True))
        table = tables.setdefault(
            key, {"task": row["task"], "settings": row["settings"], "rows": []}
        )
        table["rows"].append(row)
    for table in tables.values():
        table["lengths"] = sorted({row["length"] for row in table["rows"]})
        table["in_distribution"] = {r["length"] for r in table["rows"] if r["in_distribution"]}
        table["variants"] = list(dict.fromkeys(row["variant"] for row in table["rows"]))
    return list(tables.values())


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
        f"{settings.get('eval_samples')} samples per length",
    ]
    if settings.get("text"):
        parts.append(f"text {settings['text']}")
    return ", ".join(parts)


def markdown(records: Iterable[dict[str, Any]], *, metric: str | None = None) -> str:
    """One Markdown table per task: rows are variants, columns evaluation lengths.

    A cell is ``mean ± sd`` over the seeds (only the mean for a single seed), three
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
        exact match, mean ± sd over 2 seeds;
        trained on lengths 4–16 (columns marked *), steps 9, batch 4, lr 0.003, d_model 16,
        layers 1, heads 2, 10 samples per length
        <BLANKLINE>
        | variant | 8* | 32 |
        |---|---|---|
        | rope | 0.925 ± 0.035 | 0.000 ± 0.000 |
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
        seeds = f"mean ± sd over {most} seeds" if most > 1 else "1 seed"
        title = f"## {task}" + (f" ({number})" if task in tasks_with_several else "")
        cells: dict[tuple[str, int], str] = {}
        for row in table["rows"]:
            stats = row[shown]
            if stats["mean"] is None:
                continue
            text = _format(stats["mean"], shown)
            if most > 1 and stats["sd"] is not None:
                text += f" ± {_format(stats['sd'], shown)}"
            if stats["n"] < most:
                text += f" (n={stats['n']})"
            cells[row["variant"], row["length"]] = text
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
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


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


def plot(
    records: Iterable[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    metric: str | None = None,
    dpi: float = 100,
) -> Path:
    """Draw each task's score against evaluation length and write the picture to ``path``.

    One panel per task (and per settings, as in :func:`markdown`), one line per variant
    (the same colour in every panel) with a shaded band of ± one standard deviation over
    the seeds, and the training range of lengths shaded in grey. Exact match and token
    accuracy are drawn on ``[0, 1]``; perplexity and loss (lm) on a log scale.

    Args:
        records: Run records (see :func:`aggregate`).
        path: The image file; its extension picks the format (png, svg, pdf, ...).
        metric: One of :data:`METRICS`; default each task's headline score.
        dpi: Resolution of raster formats.

    Returns:
        ``path`` as a :class:`pathlib.Path`.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: There are no records to draw.

    Example:
        >>> import tempfile
        >>> spec = {"task": "add", "scheme": "alibi", "train_lengths": [2, 4]}
        >>> results = [{"variant": "alibi", "length": n, "exact_match": 1 / n,
        ...             "in_distribution": n <= 4} for n in (2, 4, 8)]
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     out = plot([{"key": "k", "spec": spec, "results": results}], Path(tmp, "a.png"))
        ...     out.read_bytes()[:4]
        b'\\x89PNG'
    """
    if metric is not None:
        check_choice(metric, "metric", METRICS)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {describe(path)}")
    tables = _tables(aggregate(records))
    if not tables:
        raise ValueError("there are no records to plot")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter
    except ImportError as exc:
        raise ImportError(
            "the bench's plot needs matplotlib, which is not installed: pip install 'posenc[bench]'"
        ) from exc

    columns = min(3, len(tables))
    rows = math.ceil(len(tables) / columns)
    fig = Figure(figsize=(5.0 * columns, 3.8 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    variants = sorted({r["variant"] for t in tables for r in t["rows"]}, key=_variant_order)
    colours = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    several = {t["task"] for t in tables if sum(u["task"] == t["task"] for u in tables) > 1}
    for number, (ax, table) in enumerate(zip(axes, tables, strict=False), start=1):
        task = table["task"]
        shown = metric or headline_metric(task)
        lo, hi = table["settings"].get("train_lengths", (None, None))
        if lo is not None:
            ax.axvspan(lo, hi, color="0.88", zorder=0, label="training lengths")
        for variant in table["variants"]:
            _plot_variant(ax, table, variant, shown, colours[variant])
        if shown in ("perplexity", "loss"):
            ax.set_yscale("log")
            plain = FuncFormatter(lambda value, _: f"{value:g}")  # 2, 3, 10 rather than 2×10⁰
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
        else:
            ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("evaluation length")
        ax.set_ylabel(_NAMES[shown].split(" (")[0])
        ax.set_title(task + (f" ({number})" if task in several else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes[len(tables) :]:
        ax.set_visible(False)
    path = Path(path)
    with atomic_write(path, "wb") as file:  # never half a picture
        fig.savefig(file, dpi=dpi, format=path.suffix[1:] or "png")
    return path


def _plot_variant(ax: Axes, table: dict[str, Any], variant: str, shown: str, colour: str) -> None:
    """One variant's line of ``shown`` in a panel of :func:`plot`, ± one SD shaded."""
    points = [
        (r["length"], r[shown]["mean"], r[shown]["sd"])
        for r in table["rows"]
        if r["variant"] == variant and r[shown]["mean"] is not None
    ]
    if not points:
        return
    x = [p[0] for p in points]
    mean = [p[1] for p in points]
    sd = [p[2] or 0.0 for p in points]
    style = "--" if "+" in variant else "-"
    ax.plot(x, mean, style, marker="o", markersize=3, color=colour, label=variant)
    if any(sd):
        low = [m - s for m, s in zip(mean, sd, strict=True)]
        high = [m + s for m, s in zip(mean, sd, strict=True)]
        if shown in ("perplexity", "loss"):
            low = [max(v, m * 1e-3) for v, m in zip(low, mean, strict=True)]  # log scale: > 0
        ax.fill_between(x, low, high, color=colour, alpha=0.18, linewidth=0)


def write_reports(
    out_dir: str | os.PathLike[str], records: Iterable[dict[str, Any]] | None = None
) -> dict[str, Path]:
    """Write ``results.md``, ``summary.json`` and ``accuracy.png`` into ``out_dir``.

    ``results.md`` holds the headline tables (:func:`markdown`) and then the token
    accuracy tables. Without matplotlib, or without any record, no picture is written
    (and an old one is removed, so that it never shows other results than the tables).

    Args:
        out_dir: The output folder (created if needed).
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
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
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
