"""Process memory of a stack of RoPE modules: one module against a 32-layer stack.

A model with a RoPE module per layer holds, unless the modules share their tables, one
cos and one sin table per layer: 32 × 2 × L × 128 float32 values (4 GiB at L = 131072).
Cases, head_dim 128, base 10000, L = 4096 and 131072:

* ``torch``: ``posenc.torch.RotaryEmbedding(128, max_length=L)``.
* ``keras``: ``posenc.keras.RotaryEmbedding(max_length=L)`` built on an input of
  (batch, seq, heads, 128), on the backend ``KERAS_BACKEND`` selects (TensorFlow unless
  set); ``--no-keras`` leaves it out.
* ``hf`` (for context): Hugging Face's ``LlamaRotaryEmbedding`` for head_dim 128 and
  its ``rotary(x, position_ids)`` for positions ``0 .. L-1``, the cos/sin a Llama model
  computes once per forward and passes to every layer. A model has one such module, so
  its "32 modules" column is that one module (shared by construction).

Each case, and each stack size (1 module, 32 modules) within it, runs in a fresh Python
process, so that what one case allocated and freed cannot be reused, unseen, by
another. Each process imports its framework, builds one tiny module (16 positions,
another base: imports, lazy initialisation, thread pools) and drops it, then reads its
resident memory (``VmRSS`` of ``/proc/self/status``; psutil where there is no ``/proc``)
before and after building the stack (the modules held in a list). Both readings follow
``gc.collect()`` and glibc's ``malloc_trim(0)``, which returns freed heap memory to the
system: what remains is what the modules hold, not the temporaries of their build (the
reading before the trim is reported too). The stack's build time is split into the first
module and the others: a module whose tables are shared costs only itself.

The target: the 32-module stack's growth at most 1.5 × one module's.

Usage::

    python benchmarks/bench_memory.py [--output FILE] [--quick] [--no-keras]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import fmt_time, machine_info, markdown_table

HEAD_DIM = 128
BASE = 10000.0
LENGTHS = (4096, 131072)
QUICK_LENGTHS = (4096,)
STACK = 32
TARGET = 1.5  # growth of the 32-module stack / growth of one module
MIB = 1 << 20
FRAMEWORKS = ("torch", "keras", "hf")


# -- measuring, in the worker process ------------------------------------------------------


def rss_bytes() -> tuple[int, str]:
    """The process's resident memory now, and where the number comes from."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024, "VmRSS of /proc/self/status"
    except OSError:
        pass
    import psutil  # type: ignore[import-untyped]  # no /proc: the same number

    return int(psutil.Process().memory_info().rss), "psutil rss"


def _trim() -> bool:
    """``gc.collect()``, then glibc's ``malloc_trim(0)`` (False where there is none)."""
    gc.collect()
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


def _factories(framework: str) -> tuple[Callable[[int, float], Any], Any]:
    """``make(length, base)`` building one module of ``framework``, and the posenc module
    imported (``None`` for Hugging Face)."""
    if framework == "torch":
        import torch

        import posenc.torch as torch_front

        torch.set_num_threads(1)

        def make(rows: int, base: float) -> Any:
            return torch_front.RotaryEmbedding(HEAD_DIM, base=base, max_length=rows)

        return make, torch_front
    if framework == "keras":
        import posenc.keras as keras_front

        def make(rows: int, base: float) -> Any:
            layer = keras_front.RotaryEmbedding(base=base, max_length=rows)
            layer.build((None, None, 1, HEAD_DIM))  # (batch, seq, heads, head_dim)
            return layer

        return make, keras_front
    if framework == "hf":
        import torch
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        torch.set_num_threads(1)
        x = torch.empty(1, 1, HEAD_DIM)  # read for its dtype and device only

        def make(rows: int, base: float) -> Any:
            config = LlamaConfig(
                hidden_size=32 * HEAD_DIM,
                num_attention_heads=32,
                head_dim=HEAD_DIM,
                max_position_embeddings=rows,
                rope_parameters={"rope_type": "default", "rope_theta": base},
            )
            rotary = LlamaRotaryEmbedding(config)
            with torch.no_grad():
                cos, sin = rotary(x, torch.arange(rows).unsqueeze(0))
            return rotary, cos, sin

        return make, None
    raise ValueError(f"framework must be one of {list(FRAMEWORKS)}, got {framework!r}")


def _torch_table_bytes(modules: list[Any]) -> int:
    """Bytes of the distinct storages under every buffer of ``modules`` (torch)."""
    storages = {}
    for module in modules:
        for buffer in module.buffers():
            storage = buffer.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def worker(framework: str, length: int, count: int) -> dict[str, Any]:
    """One process's measurement: the memory of ``count`` modules; a JSON-able dict."""
    make, front = _factories(framework)
    warm = make(16, 500000.0)  # warm-up: another spec, so that nothing of it is shared
    del warm
    trimmed = _trim()
    before, source = rss_bytes()
    modules, times = [], []
    for _ in range(count):
        start = time.perf_counter()
        modules.append(make(length, BASE))
        times.append(time.perf_counter() - start)
    gc.collect()
    untrimmed, _ = rss_bytes()
    _trim()
    after, _ = rss_bytes()
    result: dict[str, Any] = {
        "before": before,
        "after": after,
        "untrimmed": untrimmed,
        "times": times,
        "source": source + (", after malloc_trim(0)" if trimmed else ""),
        "posenc": None if front is None else str(Path(front.__file__).parent.parent),
        "tables": None,
    }
    if framework == "torch":
        result["tables"] = _torch_table_bytes(modules)
        result["shared"] = len({m.cos.data_ptr() for m in modules})
    elif framework == "hf":
        result["tables"] = sum(t.untyped_storage().nbytes() for _, *ts in modules for t in ts)
    if framework == "keras":
        import keras

        result["backend"] = keras.backend.backend()
    return result


# -- the driver ----------------------------------------------------------------------------


def _spawn(framework: str, length: int, count: int) -> dict[str, Any]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        framework,
        str(length),
        str(count),
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(
            f"the {framework} worker (L={length}, {count} modules) failed:\n{done.stderr}"
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _mib(n: float) -> str:
    return f"{n / MIB:.1f}"


def run(frameworks: tuple[str, ...], lengths: tuple[int, ...]) -> tuple[str, str, list[str]]:
    """Returns (the summary table, the details table, notes) as Markdown."""
    rows, details, notes = [], [], set()
    for framework in frameworks:
        for length in lengths:
            one = _spawn(framework, length, 1)
            stack = one if framework == "hf" else _spawn(framework, length, STACK)
            grow_one = one["after"] - one["before"]
            grow_stack = stack["after"] - stack["before"]
            ratio = grow_stack / grow_one if grow_one > 0 else float("nan")
            name = framework
            if framework == "keras":
                name = f"keras ({one['backend']})"
            elif framework == "hf":
                name = "HF LlamaRotaryEmbedding"
            verdict = "met" if ratio <= TARGET else f"missed by {ratio / TARGET:.1f}×"
            first, others = stack["times"][0], stack["times"][1:]
            rows.append(
                [
                    name,
                    length,
                    _mib(grow_one),
                    _mib(grow_stack) + (" (one per model)" if framework == "hf" else ""),
                    f"{ratio:.2f}",
                    verdict if framework != "hf" else "–",
                    fmt_time(first),
                    fmt_time(sum(others) / len(others)) if others else "–",
                ]
            )
            details.append(
                [
                    name,
                    length,
                    _mib(one["untrimmed"] - one["before"]),
                    _mib(stack["untrimmed"] - stack["before"]),
                    _mib(stack["before"]),
                    "–" if stack["tables"] is None else _mib(stack["tables"]),
                    stack.get("shared", "–"),
                ]
            )
            notes.add(f"memory: {one['source']}")
            if one["posenc"]:
                notes.add(f"posenc imported from {one['posenc']}")
            print(f"{name} L={length}: {rows[-1][2]} / {rows[-1][3]} MiB", flush=True)
    summary = markdown_table(
        [
            "framework",
            "L",
            "1 module MiB",
            f"{STACK} modules MiB",
            f"ratio {STACK}/1",
            f"target ≤ {TARGET}",
            "build: 1st module",
            f"build: each of the other {STACK - 1}",
        ],
        rows,
    )
    detail = markdown_table(
        [
            "framework",
            "L",
            "1 module MiB before trim",
            f"{STACK} modules MiB before trim",
            "process before the stack MiB",
            f"tables held by the {STACK} (distinct storages) MiB",
            "distinct cos tables",
        ],
        details,
    )
    return summary, detail, sorted(notes)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it and a rename, so that
    ``path`` holds either the old report or the whole new one."""
    path = Path(path)
    fd, temporary = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, help="also write the Markdown report here")
    parser.add_argument("--quick", action="store_true", help=f"L = {QUICK_LENGTHS} only")
    parser.add_argument("--no-keras", action="store_true", help="leave the Keras layer out")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:  # one process's measurement, run by run(); prints one line of JSON
        framework, length, count = args.worker
        print(json.dumps(worker(framework, int(length), int(count))))
        return 0
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    frameworks = tuple(f for f in FRAMEWORKS if not (f == "keras" and args.no_keras))
    command = "python benchmarks/bench_memory.py" + " --quick" * args.quick
    command += " --no-keras" * args.no_keras

    start = time.perf_counter()
    summary, detail, notes = run(frameworks, lengths)
    total = time.perf_counter() - start
    text = "\n\n".join(
        [
            "### Memory of a stack of RoPE modules",
            summary,
            "### Details",
            detail,
            "\n".join(f"- {note}" for note in notes),
        ]
    )
    print("\n" + text + f"\n\ntotal {total:.0f} s")
    if args.output:
        report = "\n".join(
            [
                "## Memory of a stack of RoPE modules (`bench_memory.py`)",
                "",
                f"Command: `{command}` (total {total:.0f} s).",
                "",
                machine_info((1,)),
                "",
                f"Growth of the resident memory of a fresh process per case and stack size "
                f"(after imports and a warm-up module), for 1 module and a list of {STACK}, "
                f"head_dim {HEAD_DIM}, base {BASE:g}, float32 tables; MiB = 2^20 bytes. "
                "Readings after `gc.collect()` and `malloc_trim(0)`; the details give them "
                "before the trim.",
                "",
                text,
                "",
            ]
        )
        write_atomically(args.output, report)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
