"""``posenc demo`` and ``posenc embed``: the tutorials' walk-through, reproduced and checked.

The demo prints the tutorials' worked tables (M. Saeed's "A Gentle Introduction to
Positional Encoding in Transformer Models", Machine Learning Mastery; H. Phillips'
"Positional Encoding", Medium), runs the token → embedding → encoding
pipeline on "I am a robot", prints a few numbers of the other schemes (ALiBi slopes, T5
buckets, RoPE scalings), writes every picture into the output folder and ends with a
report of the properties the paper and the tutorials claim (uniqueness, bounds, the relative map,
precision), each measured.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ._files import atomic_write, output_folder
from .analysis import min_pairwise_distance, offset_distances, relative_map
from .core.alibi import alibi_slopes
from .core.frequencies import frequencies
from .core.rope import rope_scaling
from .core.sinusoidal import sinusoidal
from .core.t5 import relative_position_bucket
from .vocab import Vocabulary, tokenize

#: Where ``posenc demo`` writes (in the current folder) unless ``--output`` says otherwise.
DEMO_FOLDER = "posenc-demo"


def _matrix(values: np.ndarray, decimals: int) -> str:
    return np.array2string(
        np.asarray(values, dtype=np.float64), precision=decimals, suppress_small=True
    )


def embed_sentence(
    text: str,
    *,
    d_model: int = 4,
    base: float = 100.0,
    seed: int = 0,
    scale: bool = False,
    backend: str = "numpy",
) -> str:
    """The tutorials' pipeline on one sentence, as printable text.

    tokens → vocabulary ids → embedding lookup (weights drawn from N(0, 1) with ``seed``,
    as ``nn.Embedding`` initialises them) → + positional encoding. ``backend="torch"``
    runs the same pipeline through :class:`posenc.torch.InputEmbedding`.
    """
    tokens = tokenize(text)
    if not tokens:
        raise ValueError(f"text has no words to embed: {text!r}")
    vocab = Vocabulary(tokens)
    ids = vocab.encode(tokens)
    if backend == "torch":
        try:
            import torch
        except ImportError as exc:
            raise ImportError(
                "the torch backend needs PyTorch: pip install 'posenc[torch]'"
            ) from exc

        from .torch import InputEmbedding, SinusoidalPositionalEncoding

        torch.manual_seed(seed)
        layer = InputEmbedding(len(vocab), d_model, dropout=0.0, max_length=len(ids), base=base,
                               scale=scale)  # fmt: skip
        with torch.no_grad():
            batch = torch.tensor([ids])
            embedding = layer.tokens(batch)[0].numpy()
            total = layer(batch)[0].numpy()
        positional = layer.positional
        assert isinstance(positional, SinusoidalPositionalEncoding)  # positional= default
        encoding = positional.pe[: len(ids)].numpy()
    elif backend == "numpy":
        weights = np.random.default_rng(seed).standard_normal((len(vocab), d_model))
        embedding = weights[ids].astype(np.float32) * np.float32(np.sqrt(d_model) if scale else 1)
        encoding = sinusoidal(len(ids), d_model, base=base)
        total = embedding + encoding
    else:
        raise ValueError(f"backend must be 'numpy' or 'torch', got {backend!r}")
    lines = [
        f"text:       {text!r}",
        f"tokens:     {tokens}",
        f"vocabulary: {vocab.itos}",
        f"ids:        {ids}",
        f"embedding lookup ({backend}, seed={seed}{', x sqrt(d_model)' if scale else ''}) "
        f"{embedding.shape}:",
        _matrix(embedding, 4),
        f"positional encoding (n={base:g}, d={d_model}) {encoding.shape}:",
        _matrix(encoding, 4),
        f"embedding + positional encoding {total.shape} (the input of the next layer):",
        _matrix(total, 4),
    ]
    return "\n".join(lines) + "\n"


def property_report(
    length: int = 2048, d_model: int = 512, base: float = 10000.0
) -> dict[str, Any]:
    """Measure the tutorials' claims on an ``length`` × ``d_model`` table."""
    table = sinusoidal(length, d_model, base=base, dtype=np.float64)
    closest = min_pairwise_distance(table)
    by_offset = offset_distances(np.arange(1, length), d_model, base)

    # PE(pos + k) = M_k PE(pos) for every pos and a spread of offsets k.
    worst = 0.0
    for k in (1, 7, 100, 1000):
        shifted = table[:-k] @ relative_map(k, d_model, base).T
        worst = max(worst, float(np.abs(shifted - table[k:]).max()))

    # Precision at a far position: posenc's float32 value vs a float32-angle value,
    # both against the float64 exact-reduction value (≈1e-16 from the true one).
    position = 10_000_000
    exact = sinusoidal(np.array([position]), d_model, base=base, dtype=np.float64)[0]
    ours32 = sinusoidal(np.array([position]), d_model, base=base, dtype=np.float32)[0]
    omega32 = frequencies(d_model, base).astype(np.float32)
    angle32 = np.float32(position) * omega32
    peer = np.empty(d_model)
    peer[0::2], peer[1::2] = np.sin(angle32), np.cos(angle32[: d_model // 2])
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    return {
        "table": [length, d_model],
        "base": base,
        "unique": bool(closest.distance > 0),
        "min_distance": closest.distance,
        "closest_pair": [closest.first, closest.second],
        "min_distance_closed_form": float(by_offset.min()),
        "min_value": float(table.min()),
        "max_value": float(table.max()),
        "relative_map_max_error": worst,
        "precision_position": position,
        "posenc_float32_max_ulp_error": float((np.abs(ours32 - exact) / ulp).max()),
        "float32_angle_max_abs_error": float(np.abs(peer - exact).max()),
    }


def other_schemes() -> str:
    """A few numbers of the relative schemes, as printable text (part of ``posenc demo``).

    ALiBi slopes for 8 and 12 heads; T5's buckets for relative positions -10 .. 10
    (bidirectional, 32 buckets, max_distance 128); RoPE's inverse frequencies for
    Llama 3.1's head (head_dim 128, base 500000) unscaled and with its ``llama3``
    scaling (factor 8, low/high frequency factors 1/4, L₀ = 8192), and YaRN's
    attention factor for the same extension.
    """
    lines = [
        "ALiBi slopes m_h = 2^(-8(h+1)/n) (Press et al.; for 12 heads: the 8 slopes of 8 "
        "heads, then 4 of the 16 heads' in between):"
    ]
    for heads in (8, 12):
        slopes = ", ".join(f"{m:.6g}" for m in alibi_slopes(heads))
        lines.append(f"  {heads:2d} heads: {slopes}")
    distances = np.arange(-10, 11)
    buckets = relative_position_bucket(distances, num_buckets=32, max_distance=128)
    lines.append("T5 buckets (bidirectional, 32 buckets, max_distance 128), d = key - query:")
    lines.append("  d:      " + " ".join(f"{d:3d}" for d in distances))
    lines.append("  bucket: " + " ".join(f"{b:3d}" for b in buckets))
    llama: dict[str, Any] = {"factor": 8.0, "original_max_position_embeddings": 8192}
    default, _ = rope_scaling("default", 128, 500000.0)
    scaled, _ = rope_scaling(
        "llama3", 128, 500000.0, low_freq_factor=1.0, high_freq_factor=4.0, **llama
    )
    _, yarn_attention = rope_scaling("yarn", 128, 500000.0, **llama)
    lines.append("RoPE, head_dim 128, base 500000 (Llama 3.1), inv_freq[0, 1, ..., 62, 63]:")
    for name, inv_freq in (("default", default), ("llama3 x8", scaled)):
        first = ", ".join(f"{v:.6g}" for v in inv_freq[:2])
        last = ", ".join(f"{v:.6g}" for v in inv_freq[-2:])
        lines.append(f"  {name:9s}  {first}, ..., {last}")
    lines.append(
        f"  llama3 keeps pairs with wavelength < 8192/4 and divides those > 8192 by 8; "
        f"yarn x8 attention factor: {yarn_attention:.6f} (0.1 ln 8 + 1)"
    )
    return "\n".join(lines) + "\n"


def run_demo(
    output: Path | str = DEMO_FOLDER, *, plots: bool = True, out: TextIO
) -> dict[str, Any]:
    """Reproduce the tutorials' walk-through into ``output``; returns the property report.

    ``output`` is created if missing, but not the folders above it
    (:func:`posenc._files.output_folder`). ``plots=True`` needs matplotlib, checked
    before anything is written.

    Raises:
        ImportError: ``plots`` and matplotlib is not installed (the message says to
            install ``posenc[plot]`` or pass ``--no-plots``).
        posenc._files.OutputPathError: ``output`` is a file, or its parent is missing.
    """
    start = time.perf_counter()
    if plots:
        try:
            from .plot._figure import figure_class

            figure_class()
        except ImportError:
            raise ImportError(
                "posenc demo draws its pictures with matplotlib, which is not installed: "
                "install posenc[plot] or pass --no-plots (plots=False)"
            ) from None
    output = output_folder(output)
    say = out.write

    say("posenc demo: the sinusoidal encoding of 'Attention Is All You Need' (§3.5)\n")
    say("P(k, 2i) = sin(k / n^(2i/d)),  P(k, 2i+1) = cos(k / n^(2i/d))\n\n")
    say("'I am a robot', n=100, d=4 (Saeed, Machine Learning Mastery):\n")
    say(_matrix(sinusoidal(4, 4, base=100, dtype=np.float64), 8) + "\n\n")
    say("max_length=10, d=4, n=100 (Phillips, from scratch):\n")
    say(_matrix(sinusoidal(10, 4, base=100, dtype=np.float64), 4) + "\n\n")
    say("max_length=10, d=4, n=10000 (Phillips, the module's buffer):\n")
    say(_matrix(sinusoidal(10, 4, dtype=np.float64), 2) + "\n\n")
    say("the pipeline on 'I am a robot':\n")
    say(embed_sentence("I am a robot", d_model=4, base=100.0) + "\n")
    say("the relative schemes:\n")
    say(other_schemes() + "\n")

    tables = {
        "table_i_am_a_robot.csv": sinusoidal(4, 4, base=100, dtype=np.float64),
        "table_100x512.csv": sinusoidal(100, 512, dtype=np.float64),
    }
    for name, values in tables.items():  # as posenc table --format csv writes them
        length, width = values.shape
        header = ",".join(["position", *(f"dim_{j}" for j in range(width))])
        rows = np.column_stack([np.arange(length), values])
        with atomic_write(output / name) as file:
            np.savetxt(file, rows, delimiter=",", fmt="%.17g", header=header, comments="")

    written = []
    if plots:
        from . import plot

        for kind, function in plot.PLOTS.items():
            written.append(plot.save(function(), output / f"{kind}.png"))
        say(f"pictures ({len(written)}):\n")
        for path in written:
            say(f"  {path}\n")
        say("\n")

    report = property_report()
    report["seconds"] = round(time.perf_counter() - start, 2)
    with atomic_write(output / "report.json") as file:
        file.write(json.dumps(report, indent=2) + "\n")
    length, d = report["table"]
    say(f"properties checked on a {length} x {d} table (n={report['base']:g}):\n")
    say(
        f"  unique vectors:      {'yes' if report['unique'] else 'NO'} - closest pair "
        f"{report['closest_pair']} at distance {report['min_distance']:.6f} "
        f"(closed form over offsets: {report['min_distance_closed_form']:.6f})\n"
    )
    say(
        f"  bounded:             values in [{report['min_value']:.6f}, {report['max_value']:.6f}]\n"
    )
    say(
        f"  relative positions:  max |PE(p+k) - M_k PE(p)| = "
        f"{report['relative_map_max_error']:.1e} for k in 1, 7, 100, 1000\n"
    )
    say(
        f"  precision at k={report['precision_position']:.0e}: posenc float32 within "
        f"{report['posenc_float32_max_ulp_error']:.3f} ulp of exact; float32 angles (every "
        f"peer) off by {report['float32_angle_max_abs_error']:.3f}\n"
    )
    files = [f"{len(tables)} tables", *([f"{len(written)} pictures"] if written else []),
             "report.json"]  # fmt: skip
    say(f"\nwrote {output}/ ({', '.join(files)}) in {report['seconds']:.1f} s\n")
    return report
