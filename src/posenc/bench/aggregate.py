"""The bench's records aggregated over seeds: per task, settings, variant and length.

Runs that differ only in their seed (and device) are the repetitions of one experiment.
:func:`aggregate` gives, for each (task, settings, variant, evaluation length), the mean,
the sample standard deviation and a 95% confidence interval of the mean (Student's t,
over the seeds) of exact match, token accuracy, loss and perplexity, and each seed's
value, from which :func:`resolved` tells whether two variants differ by more than the
seeds' spread (a paired t-interval of their difference).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from .._checks import describe
from .._extras import require
from .spec import ROPE_EVAL_SCALINGS, SCHEMES, TASKS

__all__ = ["CONFIDENCE", "METRICS", "aggregate", "headline_metric", "resolved", "t_quantile"]

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
# an extension stage's scaling is a variant: its runs share the table of their settings
_NOT_SETTINGS = ("task", "scheme", "seed", "device", "eval_lengths", "rope_eval_scalings",
                 "extension")  # fmt: skip


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


def _settings(spec: dict[str, Any]) -> dict[str, Any]:
    """What makes runs different experiments: the spec's fields but those of
    ``_NOT_SETTINGS``, and ``lm_eval`` only where set (records written before the field
    existed lack it, and they are the same experiment as runs that leave it unset)."""
    settings = {k: v for k, v in spec.items() if k not in _NOT_SETTINGS}
    if settings.get("lm_eval", "") is None:
        del settings["lm_eval"]
    return settings


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
        for each of :data:`METRICS`, ``{"mean", "sd", "ci", "n", "values"}``: the mean,
        the sample standard deviation (``n - 1`` in the denominator) and the 95%
        confidence interval of the mean ``[low, high]`` (Student's t with ``n - 1``
        degrees of freedom: mean ± t·sd/√n) of the ``n`` values that are not ``None``
        (sd and ci ``None`` for fewer than 2), and ``values``, each seed's value in the
        order of ``seeds`` (``None`` where a seed has none).

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
        >>> round(row["exact_match"]["sd"], 6), [round(v, 4) for v in row["exact_match"]["ci"]]
        (0.141421, [-0.6706, 1.8706])
        >>> row["perplexity"]
        {'mean': None, 'sd': None, 'ci': None, 'n': 0, 'values': [None, None]}
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
        settings = _settings(spec)
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
                per_seed = [by_seed[seed].get(metric) for seed in row["seeds"]]
                values = [float(v) for v in per_seed if v is not None]
                row[metric] = {**_stats(values), "values": per_seed}
            rows.append(row)
    return rows


#: The confidence level of the intervals and of :func:`resolved`.
CONFIDENCE = 0.95


def t_quantile(df: int) -> float:
    """The two-sided :data:`CONFIDENCE` quantile of Student's t with ``df`` degrees of
    freedom (``scipy.stats.t``): 12.706 for 1, 2.776 for 4, 1.960 in the limit.

    Example:
        >>> round(t_quantile(4), 3)
        2.776
    """
    stats = require("scipy.stats", "the bench's confidence intervals", extra="posenc[bench]")
    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, df))


def _stats(values: Sequence[float]) -> dict[str, Any]:
    """Mean, sample SD, the 95% t-interval of the mean (None for fewer than 2 values)."""
    if not values:
        return {"mean": None, "sd": None, "ci": None, "n": 0}
    mean, n = statistics.fmean(values), len(values)
    sd = statistics.stdev(values) if n > 1 else None
    half = None if sd is None else t_quantile(n - 1) * sd / math.sqrt(n)
    ci = None if half is None else [mean - half, mean + half]
    return {"mean": mean, "sd": sd, "ci": ci, "n": n}


def resolved(a: dict[str, Any], b: dict[str, Any], metric: str) -> bool | None:
    """Whether the seeds resolve the difference of ``metric`` between two rows of
    :func:`aggregate` (two variants at one length): the 95% t-interval of the mean of
    their per-seed differences (paired by seed: the same seed draws the same data for
    every scheme) excludes 0. ``None`` when fewer than 2 seeds measured both.

    Example:
        >>> def row(*values):
        ...     return {"seeds": [0, 1, 2], "exact_match": {"values": list(values)}}
        >>> resolved(row(0.9, 0.8, 0.85), row(0.5, 0.45, 0.55), "exact_match")
        True
        >>> resolved(row(0.9, 0.2, 0.5), row(0.5, 0.6, 0.4), "exact_match")
        False
    """
    mine = dict(zip(a["seeds"], a[metric]["values"], strict=True))
    theirs = dict(zip(b["seeds"], b[metric]["values"], strict=True))
    pairs = [(mine[s], theirs[s]) for s in mine
             if s in theirs and mine[s] is not None and theirs[s] is not None]  # fmt: skip
    if len(pairs) < 2:
        return None
    differences = [x - y for x, y in pairs]
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    return bool(abs(mean) > t_quantile(len(pairs) - 1) * sd / math.sqrt(len(pairs)))


def _variant_order(variant: str) -> tuple[int, int, bool, str]:
    """Schemes in the bench's order, each RoPE scaling after plain RoPE, each extension
    stage's fine-tuned model (``+ft``) after its base."""
    tuned = variant.endswith("+ft")
    scheme, _, scaling = variant.removesuffix("+ft").partition("+")
    first = SCHEMES.index(scheme) if scheme in SCHEMES else len(SCHEMES)
    if not scaling:
        second = 0
    elif scaling in ROPE_EVAL_SCALINGS:
        second = 1 + ROPE_EVAL_SCALINGS.index(scaling)
    else:
        second = 1 + len(ROPE_EVAL_SCALINGS)
    return first, second, tuned, variant


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
