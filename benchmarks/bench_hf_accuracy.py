"""Logit accuracy of Hugging Face models with their own RoPE and patched with posenc.

For each model family, a tiny random model (2 layers, hidden size 256, seeded, built
from a config: nothing downloaded) runs 64 tokens at positions L-64 .. L-1, in float32
as Hugging Face ships it, in float32 patched with ``posenc.integrations.transformers``,
and in float64 patched (the reference: exact tables, float64 arithmetic). Printed: the
largest absolute logit error of each float32 model against the reference.

Run: ``python benchmarks/bench_hf_accuracy.py [--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # their helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integrations"))

from test_transformers import FAMILIES

from posenc import __version__
from posenc.integrations.transformers import patch, unpatch

LENGTHS = (4096, 65536, 131072)
TOKENS = 64


def logits(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(ids, position_ids=positions).logits.double()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    rows = []
    for name, (cls, config, _) in FAMILIES.items():
        torch.manual_seed(0)
        model = cls(copy.deepcopy(config)).eval()
        exact = patch(copy.deepcopy(model).double())
        ids = torch.randint(2, 128, (1, TOKENS), generator=torch.Generator().manual_seed(1))
        for length in LENGTHS:
            positions = torch.arange(length - TOKENS, length)[None]
            reference = logits(exact, ids, positions)
            theirs = float((logits(model, ids, positions) - reference).abs().max())
            patch(model)
            mine = float((logits(model, ids, positions) - reference).abs().max())
            unpatch(model)
            rows.append({"family": name, "L": length, "hf_float32": theirs, "posenc": mine})
            print(f"{name:42s} L={length:7d}  HF float32 {theirs:.1e}  posenc {mine:.1e}")
    if args.out is not None:
        meta = {
            "posenc": __version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(),
        }
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
