"""RoPE application: posenc's ``RotaryEmbedding`` against Hugging Face, torchtune and Meta.

q and k of shape (8, 8, 2048, 64) float32 (batch, heads, seq, head_dim; base 10000),
under ``torch.no_grad()``. Every contender rotates both and returns ``(q_rot, k_rot)``.

Half layout (feature ``j`` pairs with ``j + 32``), q and k as (batch, heads, seq, head_dim):

* ``posenc half``: ``RotaryEmbedding(64, layout="half", max_length=2048)(q, k)``.
* ``posenc half fused``: the same with ``fused=True``: one kernel per tensor that
  ``torch.compile`` makes of the formula (the same bits as the eager rotation).
* ``HF apply (cos/sin precomputed)``: ``apply_rotary_pos_emb(q, k, cos, sin)`` from
  ``transformers.models.llama.modeling_llama``, with ``cos, sin`` computed once, before
  timing, by ``LlamaRotaryEmbedding``: the application alone, as each decoder layer pays
  it (a Hugging Face model computes cos/sin once per forward and passes them to every
  layer).
* ``HF cos/sin + apply``: ``LlamaRotaryEmbedding(q, position_ids)`` and then
  ``apply_rotary_pos_emb``, both in every call: cos/sin computed per call, as a model's
  forward does once (float32 angles ``position · inv_freq``, ``cat``, ``cos``/``sin``).

Interleaved layout (feature ``2i`` pairs with ``2i + 1``), q and k as (batch, seq, heads,
head_dim), torchtune's and Meta's layout (the transposed copies are made before timing):

* ``posenc interleaved (bshd)``: ``RotaryEmbedding(64, layout="interleaved",
  qk_layout="bshd", max_length=2048)``.
* ``posenc interleaved (bshd) fused``: the same with ``fused=True``.
* ``torchtune-style (bshd)``: torchtune's ``RotaryPositionalEmbeddings.forward``, written
  out below: a cache (max_seq_len, 32, 2) of cos/sin of float32 angles;
  ``x.float().reshape(*x.shape[:-1], -1, 2)``, the two-line rotation, ``torch.stack``,
  ``flatten(3)``, ``type_as(x)``; called once for q and once for k (the module takes one
  tensor).
* ``Meta complex (bshd)``: Meta Llama's ``apply_rotary_emb``: ``view_as_complex`` of
  ``x.float().reshape(..., -1, 2)`` times ``freqs_cis`` (complex64, ``torch.polar`` of
  float32 angles), ``view_as_real(...).flatten(3)``, ``type_as``.

Sketches (diagnostics, not posenc code): posenc's own tables applied with fewer
full-size temporaries, to test the suggestion the profile leads to:

* ``sketch: half, x·cos + 2 addcmul_``: ``out = x * cos``, then
  ``out[..., :32].addcmul_(x[..., 32:], sin, value=-1)`` and
  ``out[..., 32:].addcmul_(x[..., :32], sin)``: one new tensor instead of 4.5.
* ``sketch: interleaved, complex``: posenc's interleaved tables as one complex64 tensor,
  applied as Meta does.

The floor: ``copy``: ``copy_`` of q and k into two tensors of the same shape allocated
before timing: reads and writes as many bytes as a rotation of both, allocates nothing
(the bhsd and bshd tensors have the same size, so one row serves both layouts). Every
timing table has a ``/ copy`` column: the row's median over the copy's median (in the same
regime and thread count), how far the row is from the memory-bound limit.

Before timing, every rotation's output is checked against a float64 reference (float64
angles) to within the error of float32 angles, and against posenc's output; the fused
rows must equal posenc's eager output bit for bit.

The fused kernels are compiled by the untimed first call of each timing phase (seconds;
torch.compile guards on the thread count, so each thread count gets kernels of its own).
Only the first kernel compiled in a process (``posenc half fused`` at 1 thread) is
specialised to its shape; the later ones, for a second shape of the same function, get
symbolic sizes (torch.compile's automatic dynamic shapes), as in any program that
rotates both layouts.

Timed interleaved at ``torch.set_num_threads(1)``, then at ``(2)``, in fresh processes
whose samples are pooled, under two allocator regimes. Each q or k is 32 MiB, and glibc
serves blocks of 32 MiB and more with ``mmap`` and unmaps them when freed, so with the
default settings every new full-size temporary is fresh memory whose pages the kernel
has to fault in and zero (most of the cost of an elementwise op here): the number of
full-size temporaries decides the ranking. ``glibc default`` is that, what a plain
``python`` gets; ``memory kept`` runs with ``MALLOC_MMAP_MAX_=0`` and a huge
``MALLOC_TRIM_THRESHOLD_``, so freed memory is reused (as with a caching allocator such
as jemalloc) and only arithmetic and memory traffic remain.

A profile at 1 thread closes the report (a fresh process, default allocator): time per
call (and its ratio to the copy's), minor page faults per call, and the torch profiler's
self time and new memory per aten op.

Usage::

    python benchmarks/bench_rope.py [--output FILE] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import Contender, fmt_time, machine_info, markdown_table, round_robin
from posenc.torch import RotaryEmbedding

THREADS = (1, 2)
BATCH, HEADS, SEQ, HEAD_DIM = 8, 8, 2048, 64
BASE = 10000.0
# allocator regime -> (processes, min rounds, max rounds, time budget in s per process,
# shared by the two thread-count phases); the regimes are defined with the timing code
PLANS: dict[str, tuple[int, int, int, float]] = {
    "glibc default": (3, 8, 40, 19.0),
    "memory kept": (1, 12, 40, 10.0),
}

POSENC_HALF = "posenc half"
POSENC_HALF_FUSED = "posenc half fused"
HF_APPLY = "HF apply (cos/sin precomputed)"
HF_FULL = "HF cos/sin + apply"
POSENC_IL = "posenc interleaved (bshd)"
POSENC_IL_FUSED = "posenc interleaved (bshd) fused"
TORCHTUNE = "torchtune-style (bshd)"
META = "Meta complex (bshd)"
SKETCH_HALF = "sketch: half, x·cos + 2 addcmul_"
SKETCH_IL = "sketch: interleaved, complex"
COPY = "copy"  # the memory-bound floor, not a rotation
FUSED = {POSENC_HALF_FUSED: POSENC_HALF, POSENC_IL_FUSED: POSENC_IL}  # fused -> eager
# (posenc, peer) pairs judged against "posenc at least as fast" (ratio <= 1)
PAIRS = [(POSENC_HALF, HF_APPLY), (POSENC_HALF, HF_FULL), (POSENC_IL, TORCHTUNE), (POSENC_IL, META)]
LAYOUT = {
    POSENC_HALF: "half, bhsd",
    POSENC_HALF_FUSED: "half, bhsd",
    HF_APPLY: "half, bhsd",
    HF_FULL: "half, bhsd",
    SKETCH_HALF: "half, bhsd",
    POSENC_IL: "interleaved, bshd",
    POSENC_IL_FUSED: "interleaved, bshd",
    TORCHTUNE: "interleaved, bshd",
    META: "interleaved, bshd",
    SKETCH_IL: "interleaved, bshd",
    COPY: "either (same bytes)",
}
ANGLES = {
    POSENC_HALF: "exact (float64, reduced)",
    POSENC_HALF_FUSED: "exact (float64, reduced)",
    POSENC_IL: "exact (float64, reduced)",
    POSENC_IL_FUSED: "exact (float64, reduced)",
    SKETCH_HALF: "posenc's tables",
    SKETCH_IL: "posenc's tables",
    HF_APPLY: "float32",
    HF_FULL: "float32",
    TORCHTUNE: "float32",
    META: "float32",
}


# -- peers, written out as their libraries do it --------------------------------------------


def _float32_theta(dim: int, base: float) -> Tensor:
    """``1 / base^(2i/dim)`` in float32, as torchtune, Meta and Hugging Face compute it."""
    return 1.0 / (base ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))


def torchtune_cache(dim: int, max_seq_len: int, base: float = BASE) -> Tensor:
    """torchtune's ``build_rope_cache``: (max_seq_len, dim // 2, 2) of cos, sin."""
    theta = _float32_theta(dim, base)
    seq_idx = torch.arange(max_seq_len, dtype=theta.dtype)
    idx_theta = torch.einsum("i, j -> ij", seq_idx, theta).float()
    return torch.stack([torch.cos(idx_theta), torch.sin(idx_theta)], dim=-1)


def torchtune_rope(x: Tensor, cache: Tensor) -> Tensor:
    """torchtune's ``RotaryPositionalEmbeddings.forward`` (x: [b, s, n_h, h_d])."""
    seq_len = x.size(1)
    rope_cache = cache[:seq_len]
    xshaped = x.float().reshape(*x.shape[:-1], -1, 2)
    rope_cache = rope_cache.view(-1, xshaped.size(1), 1, xshaped.size(3), 2)
    x_out = torch.stack(
        [
            xshaped[..., 0] * rope_cache[..., 0] - xshaped[..., 1] * rope_cache[..., 1],
            xshaped[..., 1] * rope_cache[..., 0] + xshaped[..., 0] * rope_cache[..., 1],
        ],
        -1,
    )
    x_out = x_out.flatten(3)
    return x_out.type_as(x)


def meta_freqs_cis(dim: int, end: int, theta: float = BASE) -> Tensor:
    """Meta Llama's ``precompute_freqs_cis``: (end, dim // 2) complex64."""
    freqs = _float32_theta(dim, theta)
    t = torch.arange(end, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)


def meta_rope(xq: Tensor, xk: Tensor, freqs_cis: Tensor) -> tuple[Tensor, Tensor]:
    """Meta Llama's ``apply_rotary_emb`` (x: [b, s, n_h, h_d]), ``reshape_for_broadcast``
    inlined."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    shape = [d if i == 1 or i == xq_.ndim - 1 else 1 for i, d in enumerate(xq_.shape)]
    freqs_cis = freqs_cis[: xq_.shape[1]].view(*shape)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def hf_rotary():
    """Hugging Face's ``LlamaRotaryEmbedding`` for head_dim 64, base 10000, and its
    ``apply_rotary_pos_emb``."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    config = LlamaConfig(
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=SEQ,
        rope_parameters={"rope_type": "default", "rope_theta": BASE},
    )
    return LlamaRotaryEmbedding(config).eval(), apply_rotary_pos_emb


# -- sketches: posenc's tables, fewer temporaries (not posenc code) --------------------------


def sketch_half(x: Tensor, cos: Tensor, sin_half: Tensor) -> Tensor:
    """Half layout with one new tensor: ``x·cos``, then each half gets its ``∓x·sin``
    in place (``addcmul_``); cos (seq, 64), sin_half (seq, 32). Autograd-safe."""
    h = x.shape[-1] // 2
    out = x * cos
    out[..., :h].addcmul_(x[..., h:], sin_half, value=-1)
    out[..., h:].addcmul_(x[..., :h], sin_half)
    return out


def sketch_interleaved(x: Tensor, table: Tensor) -> Tensor:
    """Interleaved layout as one complex multiply; table (seq, 1, 32) complex64."""
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(z * table).flatten(-2)


# -- inputs, contenders, accuracy ------------------------------------------------------------


def build() -> tuple[dict[str, Callable[[], tuple[Tensor, Tensor]]], dict[str, Tensor]]:
    """The contenders (name -> no-argument callable) and the inputs.

    The fused contenders compile on their first call (not made here: torch.compile
    compiles for the thread count of that call)."""
    torch.manual_seed(0)
    q = torch.randn(BATCH, HEADS, SEQ, HEAD_DIM)
    k = torch.randn(BATCH, HEADS, SEQ, HEAD_DIM)
    qs, ks = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()  # untimed

    rope_half = RotaryEmbedding(HEAD_DIM, base=BASE, layout="half", max_length=SEQ)
    rope_il = RotaryEmbedding(
        HEAD_DIM, base=BASE, layout="interleaved", qk_layout="bshd", max_length=SEQ
    )
    fused_half = RotaryEmbedding(HEAD_DIM, base=BASE, layout="half", max_length=SEQ, fused=True)
    fused_il = RotaryEmbedding(
        HEAD_DIM, base=BASE, layout="interleaved", qk_layout="bshd", max_length=SEQ, fused=True
    )
    hf, apply_rotary_pos_emb = hf_rotary()
    position_ids = torch.arange(SEQ).unsqueeze(0)
    cos, sin = hf(q, position_ids)  # (1, seq, 64): computed once, outside the timing
    cache = torchtune_cache(HEAD_DIM, SEQ)
    freqs_cis = meta_freqs_cis(HEAD_DIM, SEQ)
    half_sin = rope_half.sin[:, : HEAD_DIM // 2]
    il_table = torch.complex(rope_il.cos[:, 0::2], rope_il.sin[:, 0::2]).unsqueeze(1)
    q_copy, k_copy = torch.empty_like(q), torch.empty_like(k)

    def copy() -> tuple[Tensor, Tensor]:
        return q_copy.copy_(q), k_copy.copy_(k)

    fns = {
        POSENC_HALF: lambda: rope_half(q, k),
        POSENC_HALF_FUSED: lambda: fused_half(q, k),
        HF_APPLY: lambda: apply_rotary_pos_emb(q, k, cos, sin),
        HF_FULL: lambda: apply_rotary_pos_emb(q, k, *hf(q, position_ids)),
        POSENC_IL: lambda: rope_il(qs, ks),
        POSENC_IL_FUSED: lambda: fused_il(qs, ks),
        TORCHTUNE: lambda: (torchtune_rope(qs, cache), torchtune_rope(ks, cache)),
        META: lambda: meta_rope(qs, ks, freqs_cis),
        SKETCH_HALF: lambda: (
            sketch_half(q, rope_half.cos, half_sin),
            sketch_half(k, rope_half.cos, half_sin),
        ),
        SKETCH_IL: lambda: (sketch_interleaved(qs, il_table), sketch_interleaved(ks, il_table)),
        COPY: copy,
    }
    return fns, {"q": q, "k": k}


def _reference(x: Tensor, layout: str, seq_axis: int) -> Tensor:
    """RoPE of ``x`` in float64 with float64 angles (the exact rotation, to ~1e-13)."""
    x = x.double()
    theta = BASE ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    angles = torch.arange(SEQ, dtype=torch.float64)[:, None] * theta  # (seq, 32)
    cos, sin = angles.cos(), angles.sin()
    if layout == "half":
        cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        x1, x2 = x.chunk(2, dim=-1)
        turned = torch.cat((-x2, x1), dim=-1)
    else:
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        turned = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    if seq_axis == 1:  # (b, s, h, d): broadcast over heads at -2
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return x * cos + turned * sin


def accuracy(fns: dict[str, Callable[[], tuple[Tensor, Tensor]]], q: Tensor, k: Tensor):
    """Checks every rotation's output against the float64 reference and posenc (the fused
    rows: equal to posenc's eager output); a Markdown table. The copy is not checked.

    The peers' angles are float32 products ``p · θ₃₂`` (the same in all three); a pair of
    norm ``r`` rotated by an angle off by ``δ`` moves by at most ``r·δ``. So a peer must be
    within ``R·(δ_max + 2⁻²⁰)`` of the reference (``R`` the largest pair norm, ``2⁻²⁰``
    for float32 rounding of tables and arithmetic) and posenc (correctly rounded tables)
    within ``R·2⁻²⁰``.
    """
    theta64 = BASE ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    exact = torch.arange(SEQ, dtype=torch.float64)[:, None] * theta64
    angles32 = torch.arange(SEQ, dtype=torch.float32)[:, None] * _float32_theta(HEAD_DIM, BASE)
    delta = float((angles32.double() - exact).abs().max())
    pair_norm = 0.0
    for x in (q, k):
        x1, x2 = x.chunk(2, dim=-1)
        pair_norm = max(pair_norm, float(torch.hypot(x1, x2).max()))
        pair_norm = max(pair_norm, float(torch.hypot(x[..., 0::2], x[..., 1::2]).max()))
    slack = pair_norm * 2.0**-20
    refs = {
        (layout, axis): (_reference(q_, layout, axis), _reference(k_, layout, axis))
        for layout, axis, q_, k_ in (
            ("half", 2, q, k),
            ("interleaved", 1, q.transpose(1, 2), k.transpose(1, 2)),
        )
    }
    rows = []
    with torch.no_grad():
        outputs = {name: fn() for name, fn in fns.items() if name != COPY}
    for name, (q_rot, k_rot) in outputs.items():
        layout, qk = LAYOUT[name].split(", ")
        axis = 2 if qk == "bhsd" else 1
        ref_q, ref_k = refs[(layout, axis)]
        if axis == 1:
            ref_q, ref_k = ref_q.contiguous(), ref_k.contiguous()
        posenc_name = POSENC_HALF if layout == "half" else POSENC_IL
        err = max(float((q_rot - ref_q).abs().max()), float((k_rot - ref_k).abs().max()))
        float32_angles = ANGLES[name] == "float32"
        bound = pair_norm * delta + slack if float32_angles else slack
        assert q_rot.shape == ref_q.shape, name
        assert q_rot.dtype == torch.float32, name
        assert err <= bound, f"{name}: max error {err:.3e} > bound {bound:.3e}"
        vs_posenc = "–"
        if name != posenc_name:
            pq, pk = outputs[posenc_name]
            diff = max(float((q_rot - pq).abs().max()), float((k_rot - pk).abs().max()))
            assert diff <= bound + slack, f"{name} vs posenc: {diff:.3e} > {bound + slack:.3e}"
            vs_posenc = f"{diff:.3e}"
        if name in FUSED:
            eager_q, eager_k = outputs[FUSED[name]]
            assert torch.equal(q_rot, eager_q), f"{name}: q differs from eager posenc"
            assert torch.equal(k_rot, eager_k), f"{name}: k differs from eager posenc"
            vs_posenc += " (bit-identical)"
        rows.append([name, LAYOUT[name], ANGLES[name], f"{err:.3e}", f"{bound:.3e}", vs_posenc])
    assert torch.equal(outputs[HF_APPLY][0], outputs[HF_FULL][0])
    note = (
        f"Largest pair norm R = {pair_norm:.3f}; float32 angles p·θ₃₂ (p ≤ {SEQ - 1}) are off "
        f"by up to δ = {delta:.3e} rad, so a float32-angle peer may be R·δ = "
        f"{pair_norm * delta:.3e} off; rounding slack R·2⁻²⁰ = {slack:.3e}."
    )
    table = markdown_table(
        [
            "contender",
            "layout",
            "angles",
            "max abs error vs float64 reference",
            "bound checked",
            "max abs diff vs posenc (same layout)",
        ],
        rows,
    )
    return note, table


# -- timing ---------------------------------------------------------------------------------

# glibc malloc settings of the "memory kept" regime: no mmap, never trim the heap, so a
# freed tensor's pages are reused by the next one instead of going back to the kernel
# (what a caching allocator such as jemalloc or tcmalloc does)
KEPT_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**40)}
DEFAULT = "glibc default"
KEPT = "memory kept"
REGIMES = {DEFAULT: {}, KEPT: KEPT_ENV}


def worker(min_rounds: int, max_rounds: int, budget: float, seed: int) -> dict:
    """One process's share: both thread-count phases; returns a JSON-able dict."""
    with torch.no_grad():
        fns, _ = build()
        phases = {
            t: [Contender(name, fn, threads=t, warm=t > 1) for name, fn in fns.items()]
            for t in THREADS
        }
        for cs in phases.values():
            round_robin(
                cs, min_rounds=min_rounds, max_rounds=max_rounds, budget_s=budget / 2, seed=seed
            )
    return {
        str(t): {c.name: {"samples": c.samples, "number": c.number} for c in cs}
        for t, cs in phases.items()
    }


def _spawn(args: list[str], env: dict[str, str]) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), *args]
    done = subprocess.run(
        command, capture_output=True, text=True, check=True, env={**os.environ, **env}
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(result: dict, threads: int, name: str) -> float:
    return statistics.median(result[str(threads)][name]["samples"])


def _pool(results: list[dict]) -> dict[int, dict[str, Contender]]:
    pooled: dict[int, dict[str, Contender]] = {}
    for t in THREADS:
        pooled[t] = {}
        for result in results:
            for name, data in result[str(t)].items():
                c = pooled[t].setdefault(name, Contender(name, lambda: None, threads=t))
                c.samples += data["samples"]
    return pooled


def timing(plans: dict[str, tuple[int, int, int, float]]) -> tuple[str, str, dict]:
    """Returns (summary table, per-regime and per-thread tables, verdicts) as Markdown.

    ``plans``: allocator regime -> (processes, min rounds, max rounds, budget per process).
    Every table has a ``/ copy`` column: the median over the median of the copy timed in
    the same rounds.
    """
    summary = []
    parts = []
    verdicts: dict[tuple[str, str, int], float] = {}
    for regime, (processes, min_rounds, max_rounds, budget) in plans.items():
        start = time.perf_counter()
        args = ["--worker", str(min_rounds), str(max_rounds), str(budget)]
        results = [_spawn([*args, str(seed)], REGIMES[regime]) for seed in range(processes)]
        wall = time.perf_counter() - start
        pooled = _pool(results)
        for posenc_name, peer in PAIRS:
            for t in THREADS:
                ours, theirs = pooled[t][posenc_name], pooled[t][peer]
                floor = pooled[t][COPY].median
                ratio = ours.median / theirs.median
                verdicts[(regime, peer, t)] = ratio
                per_process = [_median(r, t, posenc_name) / _median(r, t, peer) for r in results]
                summary.append(
                    [
                        regime,
                        f"{posenc_name} / {peer}",
                        t,
                        fmt_time(ours.median),
                        fmt_time(theirs.median),
                        f"{ratio:.3f}",
                        f"{ours.min / theirs.min:.3f}",
                        f"{ours.median / floor:.2f}",
                        f"{theirs.median / floor:.2f}",
                        ", ".join(f"{x:.3f}" for x in per_process),
                        ("met" if ratio <= 1.0 else "NOT met")
                        + f" ({sum(x <= 1.0 for x in per_process)}/{len(per_process)})",
                    ]
                )
        for t in THREADS:
            group = pooled[t]
            base = {"half": group[POSENC_HALF].median, "interleaved": group[POSENC_IL].median}
            floor = group[COPY].median
            rows = []
            for c in group.values():
                layout = LAYOUT[c.name].split(",")[0]
                rows.append(
                    [
                        c.name,
                        LAYOUT[c.name],
                        fmt_time(c.median),
                        fmt_time(c.min),
                        f"{fmt_time(c.quartiles[0])} – {fmt_time(c.quartiles[1])}",
                        f"{c.median / base[layout]:.3f}" if layout in base else "–",
                        f"{c.median / floor:.2f}",
                    ]
                )
            rounds = len(group[POSENC_HALF].samples) // len(results)
            parts.append(
                f"### {regime}, torch threads = {t}\n\n"
                f"{len(results)} process{'es' if len(results) > 1 else ''} × {rounds} "
                f"interleaved rounds (pooled; {wall:.0f} s for both thread counts); calls "
                "per sample (first process): "
                + ", ".join(sorted({str(d["number"]) for d in results[0][str(t)].values()}))
                + ".\n\n"
                + markdown_table(
                    [
                        "contender",
                        "layout",
                        "median",
                        "min",
                        "IQR",
                        "median / posenc of that layout",
                        "/ copy",
                    ],
                    rows,
                )
                + "\n"
            )
        print(parts[-2] + "\n" + parts[-1], flush=True)
    summary_table = markdown_table(
        [
            "allocator",
            "posenc / peer",
            "torch threads",
            "posenc median",
            "peer median",
            "ratio of medians",
            "ratio of mins",
            "posenc / copy",
            "peer / copy",
            "ratio in each process",
            "at least as fast (processes)",
        ],
        summary,
    )
    return summary_table, "\n".join(parts), verdicts


# -- profile --------------------------------------------------------------------------------

PROFILED = (
    POSENC_HALF,
    POSENC_HALF_FUSED,
    HF_APPLY,
    POSENC_IL,
    POSENC_IL_FUSED,
    TORCHTUNE,
    META,
    SKETCH_HALF,
    SKETCH_IL,
    COPY,
)


def _malloc_trim() -> None:
    """Give the heap memory freed so far back to the kernel (glibc), if possible."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def _op_name(key: str) -> str:
    """A profiler event's name, short: ``aten::`` dropped, a compiled graph's call (a fused
    kernel) without its hash."""
    if key.startswith("## Call CompiledFxGraph"):
        return "compiled graph"
    return key.removeprefix("aten::")


def profile_worker() -> dict:
    """Where the time goes at 1 thread, in a fresh process with the default allocator.

    First the cost of one new 32 MiB output: ``q + q`` against ``torch.add(q, q,
    out=buf)``. Then per contender, after ``malloc_trim(0)`` (so that it does not live off
    heap memory a previous contender freed) and 2 warm-up calls of its own (the first
    compiles the fused contenders): wall time and minor page faults per call
    (``getrusage``), then the torch profiler's self CPU time and new memory per aten op.
    """
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.set_num_threads(1)
    calls = 2
    rows = []
    with torch.no_grad():
        fns, inputs = build()
        q = inputs["q"]
        buf = torch.empty_like(q)
        alloc = [
            Contender("new", lambda: q + q, threads=1),
            Contender("out", lambda: torch.add(q, q, out=buf), threads=1),
        ]
        round_robin(alloc, min_rounds=15, max_rounds=15, budget_s=0.0)
        for name in PROFILED:
            fn = fns[name]
            _malloc_trim()
            fn()
            fn()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            wall = (time.perf_counter() - start) / calls
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / calls
            with torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                for _ in range(calls):
                    fn()
            events = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in events)
            ops = sorted(
                (e for e in events if e.self_cpu_time_total >= 0.02 * total),
                key=lambda e: -e.self_cpu_time_total,
            )
            rows.append(
                {
                    "name": name,
                    "wall": wall,
                    "faults": faults,
                    "new": sum(max(e.self_cpu_memory_usage, 0) for e in events) / calls,
                    "ops": [
                        (
                            _op_name(e.key),
                            e.count // calls,
                            e.self_cpu_time_total / 1e6 / calls,
                            max(e.self_cpu_memory_usage, 0) / calls,
                        )
                        for e in ops
                    ],
                }
            )
    return {"rows": rows, "new": alloc[0].median, "out": alloc[1].median}


def profile() -> str:
    data = _spawn(["--profile-worker"], {})
    floor = next(r["wall"] for r in data["rows"] if r["name"] == COPY)
    rows = [
        [
            r["name"],
            fmt_time(r["wall"]),
            f"{r['wall'] / floor:.2f}",
            f"{r['faults']:,.0f}",
            f"{r['new'] / 2**20:.0f} MiB",
            "; ".join(
                f"{op} ×{count} {fmt_time(seconds)} ({memory / 2**20:.0f} MiB)"
                for op, count, seconds, memory in r["ops"]
            ),
        ]
        for r in data["rows"]
    ]
    table = markdown_table(
        [
            "contender",
            "time per call",
            "/ copy",
            "minor page faults per call",
            "new memory per call",
            "aten ops ≥ 2 % of self time (calls, self time, new memory; per call)",
        ],
        rows,
    )
    fresh = data["new"] - data["out"]
    return (
        f"{table}\n\nOne new (8, 8, 2048, 64) float32 tensor (32 MiB, 8192 pages of 4 KiB): "
        f"`q + q` takes {fmt_time(data['new'])}, `torch.add(q, q, out=buf)` into an existing "
        f"tensor {fmt_time(data['out'])} (medians of 15): {fmt_time(fresh)} "
        f"({fresh / data['new']:.0%} of the add) goes to getting fresh pages from the kernel. "
        "glibc serves allocations of 32 MiB and more with `mmap` and unmaps them when freed, "
        "so every new tensor of this size faults in all its pages again.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, help="also write the Markdown report here")
    parser.add_argument(
        "--quick", action="store_true", help="a short smoke run (few rounds, small budgets)"
    )
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--profile-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:  # one process's share, run by timing(); prints one line of JSON
        min_rounds, max_rounds, budget, seed = args.worker
        result = worker(int(min_rounds), int(max_rounds), float(budget), int(seed))
        print(json.dumps(result))
        return 0
    if args.profile_worker:  # run by profile(); prints one line of JSON
        print(json.dumps(profile_worker()))
        return 0
    plans = dict.fromkeys(PLANS, (1, 2, 2, 1.0)) if args.quick else PLANS
    command = "python benchmarks/bench_rope.py" + (" --quick" if args.quick else "")

    start = time.perf_counter()
    with torch.no_grad():
        fns, inputs = build()
        accuracy_note, accuracy_table = accuracy(fns, inputs["q"], inputs["k"])
    del fns, inputs
    print("### Accuracy\n\n" + accuracy_note + "\n\n" + accuracy_table + "\n", flush=True)
    summary, per_regime, _ = timing(plans)
    print("### Summary\n\n" + summary + "\n", flush=True)
    profiled = profile()
    print("### Where the time goes (1 thread, glibc default)\n\n" + profiled, flush=True)
    total = time.perf_counter() - start
    print(f"total {total:.0f} s")

    if args.output:
        report = "\n".join(
            [
                "## RoPE application, q and k (8, 8, 2048, 64) float32 (`bench_rope.py`)",
                "",
                f"Command: `{command}` (total {total:.0f} s).",
                "",
                machine_info(THREADS),
                "",
                "Every contender rotates q and k under `torch.no_grad()` and returns both. "
                "Half layout on (batch, heads, seq, head_dim): `posenc half` is "
                '`RotaryEmbedding(64, layout="half", max_length=2048)`; '
                "`HF apply (cos/sin precomputed)` is `apply_rotary_pos_emb(q, k, cos, sin)` "
                "with cos/sin computed once by `LlamaRotaryEmbedding` before timing (the "
                "application only, what each decoder layer pays); `HF cos/sin + apply` "
                "also runs `LlamaRotaryEmbedding(q, position_ids)` in every call (what a "
                "model's forward does once). Interleaved layout on (batch, seq, heads, "
                "head_dim), torchtune's and Meta's layout (transposed copies made before "
                "timing): `posenc interleaved (bshd)` is `RotaryEmbedding(64, layout="
                '"interleaved", qk_layout="bshd", max_length=2048)`; `torchtune-style` is '
                "torchtune's `RotaryPositionalEmbeddings.forward` written out (cache "
                "(2048, 32, 2), reshape to pairs, two-line rotation, `stack`, `flatten(3)`, "
                "`type_as`), once for q and once for k; `Meta complex` is Meta Llama's "
                "`apply_rotary_emb` (`view_as_complex` × `freqs_cis`, `view_as_real`). "
                "The `fused` rows are the two posenc modules with `fused=True` (one kernel "
                "per tensor made by `torch.compile`, compiled before timing; the same bits "
                "as eager). `copy` is `copy_` of q and k into two tensors allocated before "
                "timing: the same bytes read and written as by a rotation, nothing "
                "allocated, the memory-bound floor; every timing table's `/ copy` column is "
                "a median over the copy's median from the same rounds. "
                "The two `sketch:` rows are not posenc code but posenc's own tables "
                "applied with fewer temporaries (see the script's docstring). Timed "
                "interleaved, one phase per torch thread count, in fresh processes whose "
                "samples are pooled, under two "
                f"allocator regimes: `{DEFAULT}` (what a plain `python` gets: each new "
                f"32 MiB tensor is fresh memory from the kernel) and `{KEPT}` (glibc told "
                "to keep freed memory: `"
                + " ".join(f"{k}={v}" for k, v in KEPT_ENV.items())
                + "`, as a caching allocator such as jemalloc would; only arithmetic and "
                "memory traffic left).",
                "",
                "### Summary: posenc / peer (< 1: posenc faster; target ≤ 1)",
                "",
                summary,
                "",
                per_regime,
                "### Accuracy",
                "",
                "Checked before timing: each rotation's output against RoPE in float64 "
                "with float64 angles, and against posenc's output in the same layout (the "
                "fused rows: bit for bit). " + accuracy_note,
                "",
                accuracy_table,
                "",
                "### Where the time goes (1 thread, glibc default)",
                "",
                "In a fresh process, each contender after `malloc_trim(0)` and 2 warm-up "
                "calls of its own: wall time and minor page faults (`getrusage`) per call, "
                "then the torch profiler's self CPU time and new memory of each aten op "
                "over 2 calls (the profiler's times include its own overhead).",
                "",
                profiled,
            ]
        )
        args.output.write_text(report, encoding="utf-8")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
