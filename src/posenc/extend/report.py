"""Reports of a context-extension evaluation: tables, ``summary.json`` and two pictures.

From the records of ``results.jsonl`` (:func:`posenc.extend.measure.run_probe`'s):

* passkey accuracy per scaling and length (right / asked, with a 95% Wilson interval), and
  per depth: the familiar length × depth grid, one panel per scaling (``passkey.png``);
* perplexity per scaling and length (``exp`` of the mean NLL over the windows; a 95%
  Student's t interval over the windows where there are several), and the mean NLL by
  position at the longest length, which shows where in the window a scaling fails
  (``perplexity.png``).

matplotlib is imported when a picture is drawn; without it the pictures are left out.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._files import atomic_write
from ..bench.records import finite, load_records
from .probes import scaling_label

__all__ = ["markdown", "plot_passkey", "plot_perplexity", "summary", "wilson", "write_reports"]

_Z = 1.959963984540054  # the 97.5% quantile of the standard normal


def wilson(right: int, asked: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion ``right / asked``.

    Example:
        >>> [round(x, 3) for x in wilson(3, 3)]
        [0.439, 1.0]
        >>> wilson(0, 0)
        (0.0, 1.0)
    """
    if asked == 0:
        return 0.0, 1.0
    p = right / asked
    centre = (p + _Z**2 / (2 * asked)) / (1 + _Z**2 / asked)
    half = _Z * math.sqrt(p * (1 - p) / asked + _Z**2 / (4 * asked**2)) / (1 + _Z**2 / asked)
    return max(0.0, centre - half), min(1.0, centre + half)


def _order(records: list[dict[str, Any]]) -> list[str]:
    """Scalings in the order they first appear."""
    seen: dict[str, None] = {}
    for record in records:
        seen.setdefault(record["probe"]["scaling"], None)
    return list(seen)


def summary(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The evaluation in one JSON-ready dict: ``passkey`` rows (per scaling, length and
    depth), ``passkey_by_length`` (per scaling and length, over the depths and trials),
    ``perplexity`` rows (per scaling and length), the seconds per probe, and what the
    records share (model, context, text, versions). A row's ``scaling`` is the label that
    tells its measurement apart in the file (:func:`_named`: ``"yarn ×4"``)."""
    records = _named([r for r in records if "probe" in r and "result" in r])
    labels = {r["probe"]["scaling"]: r["probe"]["scaling"] for r in records}
    passkey = _passkey_rows(records, labels)
    first = records[0] if records else {}
    perplexity = [r for r in records if r["probe"]["task"] == "perplexity"]
    data = {
        "model": first.get("probe", {}).get("model"),
        "fingerprint": first.get("probe", {}).get("fingerprint"),
        "context": first.get("context"),
        "text": perplexity[0]["result"].get("text") if perplexity else None,
        "versions": first.get("versions"),
        "scalings": [
            {"scaling": s, "label": labels[s],
             "rope": next(r["probe"]["rope"] for r in records if r["probe"]["scaling"] == s)}
            for s in _order(records)
        ],
        "passkey": passkey,
        "passkey_by_length": _by_length(passkey),
        "perplexity": _perplexity_rows(perplexity, labels),
        "seconds": _seconds(records),
    }  # fmt: skip
    written: dict[str, Any] = finite(data)
    return written


def _named(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with each probe's ``scaling`` replaced by what tells its measurement
    apart in this results file: the scaling's label with its factor (``"yarn ×4"``), and
    the model, dtype or text where the file holds several (an evaluation resumed with
    other settings), so that no row mixes two measurements."""
    probes = [r["probe"] for r in records]
    several = {
        field: len({p.get(field) for p in probes if field != "text_digest"
                    or p["task"] == "perplexity"}) > 1
        for field in ("fingerprint", "dtype", "text_digest")
    }  # fmt: skip
    named = []
    for record in records:
        probe = record["probe"]
        name = scaling_label(probe["scaling"], probe["rope"])
        if several["fingerprint"]:
            name += f" [model {str(probe.get('fingerprint'))[:8]}]"
        if several["dtype"]:
            name += f" {probe.get('dtype')}"
        if several["text_digest"] and probe["task"] == "perplexity":
            name += f" [text {str(probe.get('text_digest'))[:8]}]"
        named.append({**record, "probe": {**probe, "scaling": name}})
    return named


def _passkey_rows(records: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    """Passkey rows per scaling, length and depth."""
    cells: dict[tuple[str, int, float], list[bool]] = defaultdict(list)
    for record in records:
        probe = record["probe"]
        if probe["task"] == "passkey":
            right = bool(record["result"]["right"])
            cells[probe["scaling"], probe["length"], probe["depth"]].append(right)
    return [
        {"scaling": s, "label": labels[s], "length": n, "depth": d, "right": sum(v),
         "asked": len(v)}
        for (s, n, d), v in sorted(cells.items(), key=lambda item: (item[0][1], item[0][2]))
    ]  # fmt: skip


def _by_length(passkey: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Passkey rows per scaling and length, over the depths and trials."""
    totals: dict[tuple[str, str, int], list[int]] = defaultdict(lambda: [0, 0])
    for row in passkey:
        total = totals[row["scaling"], row["label"], row["length"]]
        total[0] += int(row["right"])
        total[1] += int(row["asked"])
    return [
        {"scaling": s, "label": label, "length": n, "right": k, "asked": m,
         "interval": list(wilson(k, m))}
        for (s, label, n), (k, m) in sorted(totals.items(), key=lambda item: item[0][2])
    ]  # fmt: skip


def _perplexity_rows(records: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    """Perplexity rows per scaling and length, over the windows."""
    windows: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        windows[record["probe"]["scaling"], record["probe"]["length"]].append(record["result"])
    return [_perplexity_row(s, labels[s], n, rows)
            for (s, n), rows in sorted(windows.items(), key=lambda item: item[0][1])]  # fmt: skip


def _seconds(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The mean seconds of a probe, per task and length."""
    seconds: dict[tuple[str, int], list[float]] = defaultdict(list)
    for record in records:
        probe = record["probe"]
        seconds[probe["task"], probe["length"]].append(float(record.get("seconds") or 0.0))
    return [{"task": t, "length": n, "mean": sum(v) / len(v), "probes": len(v)}
            for (t, n), v in sorted(seconds.items())]  # fmt: skip


def _exp(x: float) -> float:
    """``exp(x)``, ``inf`` past float64's range (a model whose loss overflowed)."""
    return math.exp(x) if x < 700 else math.inf


def _perplexity_row(
    scaling: str, label: str, length: int, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    nll = [float(r["nll"]) for r in rows if r.get("nll") is not None]
    mean = sum(nll) / len(nll) if nll else math.nan
    interval = [math.nan, math.nan]
    if len(nll) > 1:
        from ..bench.aggregate import t_quantile

        sd = math.sqrt(sum((x - mean) ** 2 for x in nll) / (len(nll) - 1))
        half = t_quantile(len(nll) - 1) * sd / math.sqrt(len(nll))
        interval = [_exp(mean - half), _exp(mean + half)]
    blocks = [r["nll_by_block"] for r in rows if r.get("nll_by_block")]
    width = min((len(b) for b in blocks), default=0)
    by_block: list[float | None] = []
    for i in range(width):  # a block that overflowed (null in the record) is left out
        finite = [b[i] for b in blocks if b[i] is not None]
        by_block.append(sum(finite) / len(finite) if finite else None)
    return {"scaling": scaling, "label": label, "length": length, "windows": len(nll),
            "perplexity": _exp(mean) if nll else math.nan, "interval": interval,
            "block": rows[0].get("block"), "nll_by_block": by_block}  # fmt: skip


def markdown(records: Iterable[dict[str, Any]]) -> str:
    """The evaluation as Markdown: passkey accuracy and perplexity per scaling and length."""
    data = summary(records)
    lines = ["# Context extension: RoPE scalings compared", ""]
    if data["model"] is not None:
        lines += [f"Model `{data['model']}` (fingerprint {data['fingerprint']}), trained to "
                  f"{data['context']} positions.", ""]  # fmt: skip
    for title, rows, cell in (
        ("Passkey retrieval (right / asked, over depths and trials)", data["passkey_by_length"],
         lambda r: f"{r['right']}/{r['asked']}"),
        ("Perplexity", data["perplexity"], _ppl_cell),
    ):  # fmt: skip
        if not rows:
            continue
        lengths = sorted({r["length"] for r in rows})
        table = {(r["label"], r["length"]): cell(r) for r in rows}
        labels = list(dict.fromkeys(r["label"] for r in rows))
        lines += [f"## {title}", "", "| scaling | " + " | ".join(map(str, lengths)) + " |",
                  "|---|" + "---:|" * len(lengths)]  # fmt: skip
        lines += ["| " + label + " | " + " | ".join(table.get((label, n), "") for n in lengths)
                  + " |" for label in labels]  # fmt: skip
        lines.append("")
    if data["text"]:
        lines += [f"Perplexity is measured on {data['text']}.", ""]
    if data["seconds"]:
        lines += ["Seconds per probe: " + "; ".join(
            f"{s['task']} {s['length']}: {s['mean']:.1f} ({s['probes']})" for s in data["seconds"]
        ) + ".", ""]  # fmt: skip
    return "\n".join(lines)


def _ppl_cell(row: dict[str, Any]) -> str:
    value = row["perplexity"]
    if value is None or not math.isfinite(value):
        return "–"
    low, high = row["interval"]
    if low is not None and math.isfinite(low):
        return f"{value:.2f} [{low:.2f}, {high:.2f}]"
    return f"{value:.2f}"


def plot_passkey(records: Iterable[dict[str, Any]]) -> Any:
    """One panel per scaling: passkey accuracy on the length × depth grid."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    data = summary(records)
    rows = data["passkey"]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    lengths = sorted({r["length"] for r in rows})
    depths = sorted({r["depth"] for r in rows})
    columns = min(3, max(1, len(labels)))
    panels = max(1, math.ceil(len(labels) / columns))
    fig = Figure(figsize=(3.6 * columns, 2.8 * panels + 0.4), layout="constrained")
    axes = fig.subplots(panels, columns, squeeze=False)
    image = None
    for ax, label in zip(axes.flat, labels, strict=False):
        grid = [[math.nan] * len(lengths) for _ in depths]
        text = {}
        for r in rows:
            if r["label"] == label:
                i, j = depths.index(r["depth"]), lengths.index(r["length"])
                grid[i][j] = r["right"] / r["asked"]
                text[i, j] = f"{r['right']}/{r['asked']}"
        image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto", origin="upper")
        for (i, j), value in text.items():
            ax.text(j, i, value, ha="center", va="center", fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.set_xticks(range(len(lengths)), [f"{n:,}" for n in lengths], fontsize=8)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=8)
        ax.set_xlabel("prompt length (tokens)", fontsize=8)
        ax.set_ylabel("depth of the key", fontsize=8)
    for ax in list(axes.flat)[len(labels) :]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes, label="passkey accuracy", shrink=0.8)
    fig.suptitle("Passkey retrieval by length and depth")
    return fig


def plot_perplexity(records: Iterable[dict[str, Any]]) -> Any:
    """Perplexity against length per scaling, and NLL by position at the longest length."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    data = summary(records)
    rows = data["perplexity"]
    fig = Figure(figsize=(11, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    longest = max((r["length"] for r in rows), default=0)
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = sorted((r for r in rows if r["label"] == label), key=lambda r: r["length"])
        (line,) = left.plot([r["length"] for r in mine], [r["perplexity"] for r in mine],
                            marker="o", label=label)  # fmt: skip
        last = next((r for r in mine if r["length"] == longest), None)
        if last is not None and last["nll_by_block"]:
            block = last["block"]
            centres = [block * (i + 0.5) for i in range(len(last["nll_by_block"]))]
            values = [math.nan if v is None else v for v in last["nll_by_block"]]
            right.plot(centres, values, color=line.get_color(), lw=1)
    left.set(xscale="log", yscale="log", xlabel="window (tokens)", ylabel="perplexity",
             title="Perplexity by window length")  # fmt: skip
    lengths = sorted({r["length"] for r in rows})
    left.set_xticks(lengths, [f"{n:,}" for n in lengths])
    left.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    right.set(xlabel="position in the window", ylabel="mean NLL (nats)",
              title=f"NLL by position, windows of {longest:,} tokens")  # fmt: skip
    if data["context"]:
        right.axvline(data["context"], color="grey", ls="--", lw=1)
        right.text(data["context"], right.get_ylim()[1], " trained context", va="top",
                   fontsize=8, color="grey")  # fmt: skip
    left.legend(fontsize=8)
    return fig


def write_reports(out: str | os.PathLike[str]) -> dict[str, Path]:
    """Write ``results.md``, ``summary.json``, ``passkey.png`` and ``perplexity.png``
    into ``out`` from its ``results.jsonl``; returns them by name (no pictures without
    matplotlib, none of a task with no records).

    Example:
        >>> import tempfile
        >>> from posenc.bench.records import append_line, json_line
        >>> def record(scaling, length, right):
        ...     probe = {"scaling": scaling, "rope": {"rope_type": "linear", "factor": 2.0},
        ...              "task": "passkey", "length": length, "depth": 0.5, "trial": 0}
        ...     return {"key": f"{scaling}{length}", "probe": probe, "result": {"right": right}}
        >>> with tempfile.TemporaryDirectory() as out:
        ...     for length, right in ((4096, True), (8192, False)):
        ...         line = json_line(record("linear", length, right))
        ...         append_line(Path(out, "results.jsonl"), line)
        ...     written = write_reports(out)
        ...     print(Path(out, "results.md").read_text().splitlines()[4:7])
        ...     sorted(written)
        ['| scaling | 4096 | 8192 |', '|---|---:|---:|', '| linear ×2 | 1/1 | 0/1 |']
        ['markdown', 'passkey', 'summary']
    """
    folder = Path(out)
    records = load_records(folder)
    written = {"markdown": folder / "results.md", "summary": folder / "summary.json"}
    with atomic_write(written["markdown"]) as file:
        file.write(markdown(records))
    with atomic_write(written["summary"]) as file:
        file.write(json.dumps(summary(records), indent=2, allow_nan=False) + "\n")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return written
    tasks = {r.get("probe", {}).get("task") for r in records}
    for name, task, draw in (("passkey", "passkey", plot_passkey),
                             ("perplexity", "perplexity", plot_perplexity)):  # fmt: skip
        if task in tasks:
            path = folder / f"{name}.png"
            fig = draw(records)
            with atomic_write(path, "wb") as file:
                fig.savefig(file, format="png", dpi=120)
            written[name] = path
    return written
