"""Score biases at long lengths: FlexAttention against the materialised bias, with plain
causal SDPA as the floor.

One causal ``MultiHeadAttention(512, 8)`` call (one batch, 8 heads, head_dim 64, float32,
forward under ``torch.no_grad()``) at L = 1,024, 4,096, 16,384 and 65,536 keys, with 1
and 2 threads, for ALiBi, T5 (decoder buckets) and KERPLE (log), three ways:

* ``flex``: ``attn_implementation="flex_attention"``: the bias as a ``score_mod``, the
  causal mask as a block mask planned by the core;
* ``materialised``: ``attn_implementation="sdpa"``: the bias ``(8, L, L)`` made whole,
  the causal mask folded into it, then SDPA (posenc's default path);
* ``floor``: the same attention with no position scheme, ``is_causal=True`` SDPA, no
  bias at all: what attention costs without one.

Every measurement runs in a process of its own, so that its peak memory is its own:
the peak resident set during the timed call (the counter reset just before it) and the
rise over the resident set before the call. The compile of FlexAttention is paid by a
warm-up call at L/2 + 1 (the same static table length, so the timed call compiles
nothing); the first call's cost, compile included, is measured separately at L = 1,024.

Run: ``python benchmarks/bench_attention.py [--lengths 1024 4096 ...] [--out FILE.md]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SCHEMES = ("alibi", "t5", "kerple")
PATHS = ("flex", "materialised", "floor")
LENGTHS = (1024, 4096, 16384, 65536)
REPEATS = {1024: 5, 4096: 3, 16384: 1, 65536: 1}


def _status(field: str) -> int:
    """A field of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _module(scheme: str, path: str) -> Any:
    import torch

    from posenc.torch import ALiBiBias, KERPLEBias, MultiHeadAttention, T5RelativeBias

    torch.manual_seed(0)
    position = None
    if path != "floor":
        position = {
            "alibi": lambda: ALiBiBias(8),
            "t5": lambda: T5RelativeBias(8, bidirectional=False),
            "kerple": lambda: KERPLEBias(8),
        }[scheme]()
    implementation = "flex_attention" if path == "flex" else "sdpa"
    return MultiHeadAttention(512, 8, position=position, attn_implementation=implementation)


def child(scheme: str, path: str, length: int, threads: int, first: bool) -> dict[str, Any]:
    """One measurement, in this process."""
    import torch

    from posenc._checks import MemoryLimitError

    torch.set_num_threads(threads)
    attention = _module(scheme, path).eval()
    x = torch.randn(1, length, 512, generator=torch.Generator().manual_seed(1))
    result: dict[str, Any] = {"scheme": scheme, "path": path, "L": length, "threads": threads}
    with torch.no_grad():
        if first:  # the first call of a process: compile included
            start = time.perf_counter()
            attention(x)
            result["first_call_s"] = time.perf_counter() - start
            start = time.perf_counter()
            attention(x)
            result["second_call_s"] = time.perf_counter() - start
            return result
        try:
            attention(x[:, : length // 2 + 1])  # warm-up: compiles (flex), same table size
        except MemoryLimitError:
            try:  # the refusal of the call at L itself (checked before any allocation)
                attention(x)
            except MemoryLimitError as error:
                result["refused"] = str(error).split(";")[0]
                return result
            raise
        times, peaks, rises = [], [], []
        for _ in range(REPEATS.get(length, 1)):
            Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set
            before = _status("VmRSS")
            start = time.perf_counter()
            out = attention(x)
            times.append(time.perf_counter() - start)
            peak = _status("VmHWM")
            peaks.append(peak)
            rises.append(peak - before)
            del out
    result.update(
        time_s=statistics.median(times),
        peak_rss_bytes=max(peaks),
        call_bytes=max(rises),
    )
    return result


def run(scheme: str, path: str, length: int, threads: int, first: bool = False) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", scheme, path, str(length), str(threads)]
    if first:
        command.append("--first")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"scheme": scheme, "path": path, "L": length, "threads": threads,
                "failed": f"exit {done.returncode}: {tail}"}  # fmt: skip
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB" if value >= 2**28 else f"{value / 2**20:.0f} MiB"


def report(results: list[dict[str, Any]], firsts: list[dict[str, Any]]) -> str:
    from _timing import fmt_time, machine_info, markdown_table

    index = {(r["scheme"], r["path"], r["L"], r["threads"]): r for r in results}
    rows = []
    for r in results:
        if r["path"] != "flex":
            continue
        key = (r["scheme"], "materialised", r["L"], r["threads"])
        floor = index.get(("alibi", "floor", r["L"], r["threads"]), {})
        mat = index.get(key, {})
        rows.append([
            r["scheme"], r["L"], r["threads"],
            _cell(r), _cell(mat), _cell(floor),
            _ratio(r, mat, "time_s"), _ratio(r, floor, "peak_rss_bytes"),
            _ratio(r, floor, "call_bytes"),
        ])  # fmt: skip
    table = markdown_table(
        ["scheme", "L", "threads", "flex", "materialised", "floor (no bias)",
         "flex / materialised time", "flex / floor peak RSS", "flex / floor call memory"],
        rows,
    )  # fmt: skip
    first_rows = [[f["scheme"], f["path"], f["L"], f["threads"],
                   fmt_time(f.get("first_call_s", float("nan"))),
                   fmt_time(f.get("second_call_s", float("nan")))] for f in firsts]  # fmt: skip
    first_table = markdown_table(
        ["scheme", "path", "L", "threads", "first call", "second call"], first_rows
    )
    return "\n\n".join([
        "## Score biases at long lengths: FlexAttention\n",
        machine_info(sorted({r["threads"] for r in results})),
        "Each cell: median time of the forward call, peak resident set during it, and its "
        "rise over the set before the call (the call's own memory).",
        table,
        "First call of a process (FlexAttention's compile included) and the second:",
        first_table,
    ])  # fmt: skip


def _cell(r: dict[str, Any]) -> str:
    from _timing import fmt_time

    if not r:
        return "not run"
    if "refused" in r:
        return "refused: " + r["refused"]
    if "failed" in r:
        return "failed: " + r["failed"]
    return f"{fmt_time(r['time_s'])}, {_gib(r['peak_rss_bytes'])} ({_gib(r['call_bytes'])})"


def _ratio(a: dict[str, Any], b: dict[str, Any], field: str) -> str:
    if field not in a or field not in b or not b[field]:
        return "-"
    return f"{a[field] / b[field]:.2f}"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        scheme, path, length, threads = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(child(scheme, path, length, threads, "--first" in sys.argv)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="raw results, one per line")
    args = parser.parse_args()
    results = []
    for length in args.lengths:
        for threads in args.threads:
            runs = [("alibi", "floor")] + [(s, p) for s in args.schemes for p in PATHS[:2]]
            for scheme, path in runs:
                result = run(scheme, path, length, threads)
                print(json.dumps(result), flush=True)
                results.append(result)
                if args.json:
                    with args.json.open("a") as handle:
                        handle.write(json.dumps(result) + "\n")
    firsts = [run(s, "flex", 1024, 2, first=True) for s in args.schemes]
    text = report(results, firsts)
    print(text)
    if args.out:
        temporary = args.out.with_suffix(".tmp")
        temporary.write_text(text + "\n")
        temporary.replace(args.out)


if __name__ == "__main__":
    main()
