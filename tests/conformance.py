"""Cases and front-end adapters of the conformance suite (see ``test_conformance.py``).

Every case is one scheme with one set of options and inputs. The *reference* comes from the
NumPy core's internal float64 routines, rounded once to the case's format; each *front end*
(the public NumPy functions, the PyTorch modules, the Keras layers on each backend, the JAX
functions eagerly and under ``jax.jit``) computes the same output its own way. The suite
asserts that they agree: exactly for tables and biases (the front ends only move the core's
correctly rounded values), and to float32 rounding where a front end does float32
arithmetic of its own (the RoPE rotation, ``x + table``).

Out of range. Each scheme with positions also has cases past the table a front end
builds (``"table"`` rows; posenc's one policy, :mod:`posenc.core.positions`): called with
positions known when the call runs, every front end gives the exact values (the learned
embedding, which has no rows there, raises ``ValueError`` in every front end); called
with traced positions (``traced=True``: ``torch.compile``, ``tf.function``/``jax.jit``
around the Keras layer, ``jax.jit``), every front end gives NaN rows at the positions
outside its table and the exact values inside it. A front end that needs no table for a
scheme is exact everywhere, traced or not: PyTorch's ALiBi (slope × distance in float64
on the device), T5 (its buckets saturate) and NoPE.

Decoding token by token (``decode=True``). Each scheme a KV-cache decode uses
(:data:`DECODED`) has cases that every front end runs as a loop of calls on one module or
layer built once (the functions front ends call their function per step; ``jax-jit``
traces the step's positions or offset): an optional prompt, then one token per call at
position ``start + t`` (``offset=``; Keras' ``start_index=``, and Flax's for the
encodings). The steps' outputs, concatenated, must equal the full call's reference. A
bias step is its queries against the keys up to its last query (one key more each step),
its first query's position given, or left to the front end's default alignment (the
queries are the last of the keys); each step's ``(heads, count, keys)`` bias must equal
those rows and keys of the full call's (:func:`decode`). Some decodes run past the
initial table, which grows during the decode (exact values: the positions are known).

Keras picks its backend once per process, so for the backends other than the test
process's own, ``test_conformance.py`` runs this file as a script::

    KERAS_BACKEND=jax python tests/conformance.py --keras OUT.npz

which computes every Keras case and saves the outputs (and any errors) to ``OUT.npz``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# xPos and axial RoPE / M-RoPE (block "rope-nd": their cases, inputs, reference and runners)
ROPE_ND = ("xpos", "axial")
# The score biases of posenc.*.kernel_bias (KERPLE, FIRE, Sandwich): their block is below.
KERNEL_SCHEMES = ("kerple", "fire", "sandwich")
SCHEMES = (
    *("sinusoidal", "nd", "learned", "rope", "alibi", "t5", *KERNEL_SCHEMES, "nope"),
    *ROPE_ND,
)
KERAS_SCHEMES = tuple(scheme for scheme in SCHEMES if scheme != "nope")

# The packages each front end needs, and the schemes it has an implementation of.
FRONTENDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "numpy": ((), SCHEMES),
    "torch": (("torch",), SCHEMES),
    "keras-tensorflow": (("keras", "tensorflow"), KERAS_SCHEMES),
    "keras-jax": (("keras", "jax"), KERAS_SCHEMES),
    "keras-torch": (("keras", "torch"), KERAS_SCHEMES),
    "jax": (("jax",), ("sinusoidal", "nd", "rope", "alibi", "t5", *KERNEL_SCHEMES, *ROPE_ND)),
    "jax-jit": (("jax",), ("sinusoidal", "rope", "alibi", "t5", *KERNEL_SCHEMES, *ROPE_ND)),
    "flax": (
        ("jax", "flax"),
        ("sinusoidal", "learned", "rope", "alibi", "t5", *KERNEL_SCHEMES, *ROPE_ND),
    ),
}
# Keras has no NoPE layer (a Keras model without position information simply has no
# such layer); "nd" under jit is the same constant as eagerly (static shapes only).

# The front ends that run the traced cases (positions unknown while the code is traced);
# "jax" runs them under "jax-jit", NumPy has no tracing.
TRACING = ("torch", "keras-tensorflow", "keras-jax", "keras-torch", "jax-jit", "flax")

# Index dtypes a front end's framework cannot trace at all (refused before posenc sees
# them): Keras on torch has no uint64 ("Unsupported dtype for PyTorch"), and Keras on JAX
# no 64-bit integers (JAX stores them as 32-bit ones unless its 64-bit mode is on, which
# Keras leaves as it is; posenc.jax's own cases run in that mode).
NO_INDEX_DTYPE = {("keras-torch", "uint64"), ("keras-jax", "int64"), ("keras-jax", "uint64")}

# (front end, scheme) pairs computed without a table: exact at every position, traced too.
TABLELESS = {("torch", "alibi")} | {
    (f, s) for f in FRONTENDS for s in ("t5", "nope", "kerple", "fire")
}  # KERPLE and FIRE: arithmetic of their weights, no table
# PyTorch's axial RoPE computes its tables from coordinates eagerly (compiled code takes
# them as cos=/sin=): exact at any coordinate.
TABLELESS |= {("torch", "axial")}

# The schemes a KV-cache decode calls token by token, which have decode cases; the
# attention-score biases among them (a step is its queries against the keys so far).
DECODED = ("sinusoidal", "learned", "rope", "alibi", "t5", *KERNEL_SCHEMES, "nope", *ROPE_ND)
BIASES = ("alibi", "t5", *KERNEL_SCHEMES)

# --- CoPE (contextual position encoding): in every front end, computed from the queries
# and keys (no table, no positions: exact traced too); rows are queries as for a bias, a
# decode step its queries against the keys so far. Its functions: the "CoPE" blocks below.
CONTEXTUAL = ("cope",)
SCHEMES = (*SCHEMES, *CONTEXTUAL)
FRONTENDS = {name: (needs, (*has, *CONTEXTUAL)) for name, (needs, has) in FRONTENDS.items()}
TABLELESS |= {(frontend, "cope") for frontend in FRONTENDS}
DECODED = (*DECODED, *CONTEXTUAL)

# Learned RoPE (rope_learned, RoPE whose frequencies are trained): in every front end,
# decoded step by step; none keeps a table (each call forms its angles from the trained
# frequencies), so it is exact at every position, traced too.
SCHEMES = (*SCHEMES, "rope_learned")
FRONTENDS = {f: (need, (*schemes, "rope_learned")) for f, (need, schemes) in FRONTENDS.items()}
TABLELESS |= {(frontend, "rope_learned") for frontend in FRONTENDS}
DECODED = (*DECODED, "rope_learned")


def by_queries(case: Case) -> bool:
    """Whether the output's rows are queries against keys (a bias, CoPE)."""
    return case.scheme in BIASES or case.scheme in CONTEXTUAL


def missing_packages(frontend: str) -> list[str]:
    """The packages ``frontend`` needs that cannot be imported here."""
    return [name for name in FRONTENDS[frontend][0] if importlib.util.find_spec(name) is None]


@dataclass(frozen=True)
class Case:
    scheme: str
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    fmt: str = "float32"
    traced: bool = False  # positions unknown while traced: run by TRACING front ends
    raises: str | None = None  # the exception every front end raises instead
    computed_by: tuple[str, ...] = ()  # front ends that compute what the others refuse
    decode: bool = False  # run token by token on one module (see decode_steps)

    @property
    def id(self) -> str:
        return f"{self.scheme}-{self.name}"

    @property
    def table(self) -> int:
        """Rows of the table a front end builds for this case (its max_length)."""
        return int(self.params.get("table", 64))

    def rng(self) -> np.random.Generator:
        seed = int.from_bytes(hashlib.sha256(self.id.encode()).digest()[:4], "little")
        return np.random.default_rng(seed)


def _rope(name: str, **params: Any) -> Case:
    base = {"head_dim": 16, "seq": 6, "heads": 2, "start": 0, "layout": "half", "base": 10000.0}
    base.update(params)
    return Case("rope", name, base)


LONGROPE = {
    "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
    "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
    "original_max_position_embeddings": 16,
    "factor": 4.0,
}
# index dtype → (first position, table rows) of its traced case
INDEX_CASES = {
    "int8": (-2, 300),
    "int16": (-2, 40_000),
    "int32": (-2, 64),
    "int64": (2**32 + 1, 64),
    "uint8": (250, 252),
    "uint16": (65_530, 65_532),
    "uint32": (2**32 - 6, 64),
    "uint64": (2**32 + 1, 64),
}

CASES: list[Case] = [
    # The seed text's TensorFlow example: 60 positions, 256 features, n = 10000.
    Case("sinusoidal", "seed-60x256", {"length": 60, "d": 256}),
    # The worked examples' n = 100, with the split layout of tensor2tensor/fairseq.
    Case("sinusoidal", "n100-split", {"length": 7, "d": 10, "base": 100.0, "layout": "split"}),
    Case(
        "sinusoidal",
        "t2t-offset",
        {"length": 5, "d": 16, "formula": "tensor2tensor", "layout": "split", "start": 1000},
    ),
    Case("sinusoidal", "odd-width", {"length": 9, "d": 7, "start": 3}),
    Case("sinusoidal", "bf16-far", {"length": 16, "d": 32, "start": 4000}, "bfloat16"),
    Case("sinusoidal", "f16", {"length": 16, "d": 32, "start": 100}, "float16"),
    Case("nd", "2d", {"shape": (4, 5), "channels": 6}),
    Case("nd", "3d", {"shape": (3, 4, 5), "channels": 9}),
    Case("nd", "1d", {"shape": (6,), "channels": 4}),
    Case("nd", "mae-2d", {"shape": (4, 4), "channels": 8, "layout": "mae"}),
    Case("nd", "2d-bf16", {"shape": (5, 3), "channels": 8}, "bfloat16"),
    Case("learned", "offset", {"max_length": 12, "d": 8, "length": 5, "start": 4}),
    Case("learned", "full", {"max_length": 6, "d": 3, "length": 6, "start": 0}),
    _rope("default-half"),
    _rope("default-interleaved", layout="interleaved", start=3),
    _rope("partial", rotary_dim=8, start=2),
    _rope("far-positions", base=500000.0, start=100_000),
    _rope("linear", scaling="linear", scaling_params={"factor": 4.0}, start=30),
    _rope("ntk", scaling="ntk", scaling_params={"factor": 4.0}, start=30),
    _rope(
        "yarn",
        scaling="yarn",
        scaling_params={"factor": 4.0, "original_max_position_embeddings": 16},
        start=40,
    ),
    _rope(
        "llama3",
        base=500000.0,
        scaling="llama3",
        scaling_params={
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        start=100,
    ),
    _rope(
        "longrope-short",
        scaling="longrope",
        scaling_params={
            "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
            "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
            "original_max_position_embeddings": 16,
            "factor": 4.0,
        },
        start=4,
    ),
    _rope(
        "longrope-long",
        scaling="longrope",
        scaling_params={
            "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
            "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
            "original_max_position_embeddings": 16,
            "factor": 4.0,
        },
        start=20,
    ),
    _rope(
        "dynamic-ntk",
        scaling="dynamic_ntk",
        scaling_params={"factor": 2.0, "original_max_position_embeddings": 8},
        start=10,
    ),
    _rope(  # Gemma-style: half the pairs turn, at a scaled base
        "proportional",
        scaling="proportional",
        scaling_params={"partial_rotary_factor": 0.5, "factor": 2.0},
        start=20,
    ),
    Case("alibi", "causal-8", {"heads": 8, "q": 6, "k": 6}),
    Case("alibi", "decode-6-heads", {"heads": 6, "q": 1, "k": 9, "offset": 8}),
    Case("alibi", "symmetric-12", {"heads": 12, "q": 5, "k": 5, "mode": "symmetric"}),
    Case("alibi", "bf16-5-heads", {"heads": 5, "q": 7, "k": 7}, "bfloat16"),
    Case("alibi", "f16-decode", {"heads": 3, "q": 2, "k": 40, "offset": 38}, "float16"),
    # No offset with fewer queries than keys: the queries are the last q of the k
    # positions in every front end (posenc.core.plan.align_queries); symmetric too.
    Case("alibi", "default-q<k", {"heads": 4, "q": 2, "k": 5}),
    Case("alibi", "default-q<k-symmetric", {"heads": 3, "q": 3, "k": 7, "mode": "symmetric"}),
    Case("t5", "encoder", {"heads": 4, "buckets": 32, "max_distance": 128, "q": 20, "k": 20}),
    Case(
        "t5",
        "decoder-exact-far",
        {
            "heads": 3,
            "buckets": 16,
            "max_distance": 20,
            "bidirectional": False,
            "compat": "exact",
            "q": 1,
            "k": 40,
            "offset": 39,
        },
    ),
    Case("t5", "beyond-max", {"heads": 2, "buckets": 8, "max_distance": 12, "q": 30, "k": 30}),
    Case("t5", "default-q<k", {"heads": 2, "buckets": 8, "max_distance": 12, "q": 3, "k": 9}),
    _rope(
        "dynamic-ntk-short",  # L = 10 <= 16: the construction frequencies
        scaling="dynamic_ntk",
        scaling_params={"factor": 2.0, "original_max_position_embeddings": 16},
        start=4,
    ),
    # Traced lengths (posenc.core.plan.plan_scaling): LongRoPE selects its factors in the
    # graph on each side of its original length; dynamic NTK selects the traced length's
    # frequencies in PyTorch (kept per length) and refuses in the other front ends.
    *[
        Case("rope", f"{name}-traced", _rope(name, **params).params, traced=True,
             raises="ValueError" if name == "dynamic-ntk" else None,
             computed_by=("torch",) if name == "dynamic-ntk" else ())
        for name, params in (
            ("longrope-short", {"scaling": "longrope", "scaling_params": LONGROPE, "start": 4}),
            ("longrope-long", {"scaling": "longrope", "scaling_params": LONGROPE, "start": 20}),
            ("dynamic-ntk", {"scaling": "dynamic_ntk", "start": 10, "scaling_params": {
                "factor": 2.0, "original_max_position_embeddings": 8}}),
        )
    ],
    Case("nope", "plain", {"length": 5, "d": 8}),
    # Traced positions of every integer dtype: NaN rows outside the table whatever the
    # dtype (tables longer than int8's and int16's range, negative positions, unsigned
    # ones past the table, 64-bit ones past 2**32 that a cast to int32 would wrap into
    # the table), the exact rows inside it.
    *[
        Case("sinusoidal", f"traced-{dtype}", {"length": 4, "d": 8, "start": start,
             "table": table, "index_dtype": dtype}, traced=True)
        for dtype, (start, table) in INDEX_CASES.items()
    ],
    # Out of range: positions 2 .. 5 of a 4-row table (ALiBi: queries 3, 4 of 4 keys).
    *[
        case
        for traced in (False, True)
        for suffix in (["past-table-traced"] if traced else ["past-table"])
        for case in (
            Case("sinusoidal", suffix, {"length": 4, "d": 8, "start": 2, "table": 4},
                 traced=traced),
            Case("learned", suffix, {"max_length": 4, "d": 3, "length": 4, "start": 2,
                                     "table": 4}, traced=traced,
                 raises=None if traced else "ValueError"),
            Case("rope", suffix, _rope(suffix, seq=4, start=2, table=4).params, traced=traced),
            Case("alibi", suffix, {"heads": 4, "q": 2, "k": 4, "offset": 3, "table": 4},
                 traced=traced),
            Case("t5", suffix, {"heads": 2, "buckets": 8, "max_distance": 12, "q": 2, "k": 3,
                                "offset": 1000, "table": 4}, traced=traced),
            Case("nope", suffix, {"length": 3, "d": 4, "start": 10**6, "table": 4},
                 traced=traced),
        )
    ],
    # Decoding token by token (decode_steps): one module, a call per step, equal to the
    # full call. "table": positions past the initial table, which grows during the decode
    # (the learned embedding cannot: its decode stays within its rows); "prompt": a first
    # call of that many tokens, as a prefill.
    Case("sinusoidal", "decode", {"length": 6, "d": 16, "start": 0}, decode=True),
    Case("sinusoidal", "decode-past-table", {"length": 7, "d": 8, "start": 0, "table": 4},
         decode=True),
    Case("sinusoidal", "decode-prompt-bf16-far", {"length": 6, "d": 32, "start": 4000,
         "prompt": 3}, "bfloat16", decode=True),
    Case("learned", "decode", {"max_length": 8, "d": 4, "length": 6, "start": 2}, decode=True),
    Case("rope", "decode", _rope("decode").params, decode=True),
    Case("rope", "decode-past-table", _rope("decode-past-table", seq=7, layout="interleaved",
         table=4).params, decode=True),
    Case("rope", "decode-prompt-yarn", _rope("decode-prompt-yarn", rotary_dim=8, start=40,
         prompt=2, scaling="yarn", scaling_params={"factor": 4.0,
         "original_max_position_embeddings": 16}).params, decode=True),
    # A bias step: its queries against every key up to its last query (key_length grows
    # by one a step), the first query's position given as the offset, or left to the
    # default alignment (no "offset": the queries are the last of the keys).
    Case("alibi", "decode-offset", {"heads": 8, "q": 6, "k": 9, "offset": 3}, decode=True),
    Case("alibi", "decode-default", {"heads": 5, "q": 5, "k": 8, "prompt": 2, "table": 4},
         decode=True),
    Case("alibi", "decode-f16-far", {"heads": 3, "q": 4, "k": 60, "offset": 56}, "float16",
         decode=True),
    Case("t5", "decode-offset", {"heads": 3, "buckets": 16, "max_distance": 20,
         "bidirectional": False, "compat": "exact", "q": 5, "k": 29, "offset": 24},
         decode=True),
    Case("t5", "decode-default", {"heads": 2, "buckets": 8, "max_distance": 12, "q": 5,
         "k": 16, "prompt": 2}, decode=True),
    Case("nope", "decode", {"length": 5, "d": 8, "start": 7}, decode=True),
    # CoPE: real heads and width (counts past 8 share the last vector), a padding mask per
    # batch row with queries after cached keys, no mask; compiled; decoded step by step.
    *[
        Case("cope", name + suffix, {"batch": batch, "heads": heads, "head_dim": dim, "q": q,
             "k": k, "max_positions": npos, "mask": mask, "scale": dim**-0.5},
             traced=suffix == "-traced")
        for name, (batch, heads, dim, q, k, npos, mask) in {
            "causal-8x64": (2, 8, 64, 12, 12, 9, "causal"),
            "padded-q<k": (2, 4, 8, 3, 7, 16, "padded"),
            "bidirectional": (1, 2, 16, 5, 5, 4, "none"),
        }.items()
        for suffix in ("", "-traced")
    ],
    Case("cope", "decode", {"batch": 2, "heads": 2, "head_dim": 16, "q": 6, "k": 6,
         "max_positions": 8, "mask": "causal", "scale": 0.25, "prompt": 2}, decode=True),
    Case("cope", "decode-cached", {"batch": 2, "heads": 8, "head_dim": 64, "q": 5, "k": 9,
         "max_positions": 6, "mask": "padded", "scale": 0.125}, decode=True),
]  # fmt: skip


# --- rope-nd: xPos and axial RoPE / M-RoPE --------------------------------------------------


def _xpos(name: str, **params: Any) -> Case:
    base = {"head_dim": 16, "seq": 6, "heads": 2, "start": 0, "layout": "interleaved"}
    base.update(params)
    traced, decode = base.pop("traced", False), base.pop("decode", False)
    return Case("xpos", name, base, traced=traced, decode=decode)


def _axial(name: str, coords: Any, **params: Any) -> Case:
    """An axial / M-RoPE case; ``coords`` ``(seq, n_axes)`` (or ``(3, 1, seq)`` M-RoPE
    position ids, as ``mrope_positions`` gives them)."""
    coords = np.asarray(coords)
    if coords.ndim == 3:
        coords = np.moveaxis(coords, 0, -1)[0]  # (3, 1, seq) -> (seq, 3)
    base = {"head_dim": 16, "heads": 2, "base": 10000.0, "mode": "axial", "layout": "half"}
    base.update(params, coords=coords.tolist(), seq=len(coords))
    traced, decode = base.pop("traced", False), base.pop("decode", False)
    return Case("axial", name, base, traced=traced, decode=decode)


def _qwen2vl_positions() -> np.ndarray:
    """Qwen2-VL's text + image position ids ``(3, 1, 10)``: two text tokens, an image of
    4 x 4 patches (merged 2 x 2: four tokens), four text tokens (the decoded ones)."""
    from posenc.core.packing import mrope_positions

    types = [[0, 0, 1, 1, 1, 1, 0, 0, 0, 0]]
    return mrope_positions(types, image_grids=[[1, 4, 4]])[0]


_GRID = [(y, x) for y in range(3) for x in range(4)]  # a 3 x 4 image, (row, column)
_PAST = [(0, 1), (2, 3), (4, 1), (1, 5)]  # rows 2 and 3 reach past a 4-row table

CASES += [
    _xpos("default"),
    _xpos("half-centred", layout="half", start=30, centre=40.0, gamma=0.5, scale_base=256.0),
    _xpos("real-shapes", head_dim=64, heads=8, seq=5, start=100),
    _xpos("far-centred", start=3000, centre=3002.0, table=64),  # scales near 1 there
    _xpos("past-table", seq=4, start=2, table=4),
    _xpos("past-table-traced", seq=4, start=2, table=4, traced=True),
    _xpos("decode", seq=7, start=0, table=4, prompt=2, decode=True),
    _axial("grid-2d", _GRID),
    _axial("grid-2d-interleaved", _GRID, layout="interleaved", base=100.0),
    _axial("mrope-qwen2vl", _qwen2vl_positions(), head_dim=64, heads=8, n_axes=3,
           sections=[8, 12, 12], mode="mrope", base=1e6),
    _axial("mrope-interleaved", _qwen2vl_positions(), head_dim=32, n_axes=3,
           sections=[6, 5, 5], mode="mrope-interleaved", base=5e5),
    _axial("past-table", _PAST, table=4),
    _axial("past-table-traced", _PAST, table=4, traced=True),
    _axial("decode-mrope", _qwen2vl_positions(), head_dim=32, n_axes=3, sections=[4, 6, 6],
           mode="mrope", base=1e6, prompt=6, decode=True),
]  # fmt: skip


def axial_coords(case: Case) -> np.ndarray:
    """The case's coordinates ``(seq, n_axes)``, int64."""
    return np.asarray(case.params["coords"], dtype=np.int64)


def axial_spec(case: Case) -> Any:
    from posenc.specs import AxialRopeSpec

    p = case.params
    sections = p.get("sections")
    return AxialRopeSpec(
        head_dim=p["head_dim"], n_axes=axial_coords(case).shape[-1], base=p["base"],
        sections=None if sections is None else tuple(sections), mode=p["mode"],
        layout=p["layout"],
    )  # fmt: skip


def xpos_options(case: Case) -> dict[str, Any]:
    """The xPos options of a case, as every front end spells them."""
    p = case.params
    return {
        "base": p.get("base", 10000.0),
        "gamma": p.get("gamma", 0.4),
        "scale_base": p.get("scale_base", 512.0),
        "centre": p.get("centre", 0.0),
        "layout": p["layout"],
    }


def rope_nd_reference(case: Case, x: np.ndarray) -> np.ndarray:
    """xPos: ``(b, s, 2h, d)``, the rotated queries then keys along the heads; axial:
    ``(b, s, h, d)``, the rotated queries. float64, rounded once to float32."""
    from posenc.core.rope import apply_rope
    from posenc.core.rope_nd import apply_xpos

    p = case.params
    xt = x.astype(np.float64).transpose(0, 2, 1, 3)  # (b, h, s, d)
    if case.scheme == "xpos":
        where, options = positions(case), xpos_options(case)
        q, k = apply_xpos(xt, xt, q_positions=where, k_positions=where, **options)
        out = np.concatenate([q, k], axis=1)  # (b, 2h, s, d)
    else:
        cos, sin = axial_spec(case).tables(axial_coords(case), fmt="float64")
        out = apply_rope(xt, cos, sin, layout=p["layout"])
    return out.transpose(0, 2, 1, 3).astype(np.float32)


def run_numpy_rope_nd(case: Case, x: np.ndarray) -> np.ndarray:
    """The public NumPy functions: ``posenc.apply_xpos``; ``posenc.axial_rope_tables`` and
    ``posenc.apply_rope`` in float32."""
    import posenc

    p = case.params
    if case.scheme == "xpos":

        def xpos(x: np.ndarray, first: int) -> np.ndarray:
            where = np.arange(first, first + x.shape[1])
            xt = x.transpose(0, 2, 1, 3)  # (b, h, s, d)
            q, k = posenc.apply_xpos(
                xt, xt, q_positions=where, k_positions=where, **xpos_options(case)
            )
            return np.concatenate([q, k], axis=1).transpose(0, 2, 1, 3)

        return decode(case, xpos, x) if case.decode else xpos(x, p["start"])
    coords = axial_coords(case)

    def axial(x: np.ndarray, first: int) -> np.ndarray:
        spec = axial_spec(case)
        cos, sin = posenc.axial_rope_tables(
            coords[first : first + x.shape[1]], spec.head_dim, spec.base,
            sections=spec.sections, mode=spec.mode, layout=spec.layout, dtype="float32",
        )  # fmt: skip
        out = posenc.apply_rope(x.transpose(0, 2, 1, 3), cos, sin, layout=spec.layout)
        return out.transpose(0, 2, 1, 3)

    return decode(case, axial, x) if case.decode else axial(x, 0)


def run_torch_rope_nd(case: Case, x: np.ndarray, call: Any, where: Any) -> np.ndarray:
    import torch

    import posenc.torch as pt

    p, xt = case.params, torch.from_numpy(x)
    if case.scheme == "xpos":
        module = pt.XPosRotaryEmbedding(
            p["head_dim"], max_length=case.table, qk_layout="bshd", **xpos_options(case)
        )

        def both(q: torch.Tensor, k: torch.Tensor) -> np.ndarray:
            return torch.cat([q, k], dim=2).numpy()

        if case.decode:
            return decode(case, lambda x, s: both(*module(x, x, offset=s)), xt)
        if case.traced:
            return both(*call(lambda x, pos: module(x, x, positions=pos), xt, where))
        return both(*module(xt, xt, offset=p["start"]))
    spec, coords = axial_spec(case), torch.from_numpy(axial_coords(case))
    module = pt.AxialRotaryEmbedding.from_spec(spec, qk_layout="bshd")
    if case.decode:
        return decode(
            case, lambda x, s: module(x, x, coords=coords[s : s + x.shape[1]])[0].numpy(), xt
        )
    if case.traced:  # compiled code takes the tables, made from the coordinates eagerly
        cos, sin = module.tables(coords)
        return call(lambda x, c, s: module(x, x, cos=c, sin=s)[0], xt, cos, sin).numpy()
    return module(xt, xt, coords=coords)[0].numpy()


def run_keras_rope_nd(case: Case, x: np.ndarray, call: Any, start: Any) -> np.ndarray:
    import keras

    import posenc.keras as pk

    p = case.params

    def out(tensors: Any) -> np.ndarray:
        return np.concatenate([keras.ops.convert_to_numpy(t) for t in tensors], axis=2)

    if case.scheme == "xpos":
        layer = pk.XPosRotaryEmbedding(p["head_dim"], max_length=case.table, **xpos_options(case))
        if case.decode:
            return decode(case, lambda x, s: out(layer(x, x, start_index=s)), x)
        return out(call(lambda x, s: layer(x, x, start_index=s), x, start("start")))
    spec, coords = axial_spec(case), axial_coords(case)
    layer = pk.AxialRotaryEmbedding(**spec.fields(), max_length=case.table)

    def first(tensors: Any) -> np.ndarray:
        return keras.ops.convert_to_numpy(tensors[0])

    if case.decode:
        return decode(case, lambda x, s: first(layer(x, x, coords=coords[s : s + x.shape[1]])), x)
    if case.traced:
        where = keras.ops.convert_to_tensor(coords.astype(np.int32))
        return first(call(lambda x, c: layer(x, x, coords=c), x, where))
    return first(layer(x, x, coords=coords))


def run_jax_rope_nd(case: Case, x: np.ndarray, *, jit: bool) -> np.ndarray:
    import jax
    import jax.numpy as jnp

    import posenc.jax as pj

    p = case.params
    if case.scheme == "xpos":
        # traced positions gather from a table of the case's rows, else of every position
        rows = case.table if case.traced else int(positions(case)[-1]) + 1

        def xpos(x: Any, pos: Any) -> Any:
            tables = pj.xpos_tables(
                pos, p["head_dim"], max_length=rows if jit else None, **xpos_options(case)
            )  # (seq, d) each
            q, k = pj.apply_xpos(x, x, *(t[:, None, :] for t in tables), layout=p["layout"])
            return jnp.concatenate([q, k], axis=2)

        step = jax.jit(xpos) if jit else xpos

        def at(x: Any, first: int) -> np.ndarray:
            where = np.arange(first, first + x.shape[1])
            return np.asarray(step(x, jnp.asarray(where) if jit else where))

        return decode(case, at, x) if case.decode else at(x, p["start"])
    spec, coords = axial_spec(case), axial_coords(case)
    rows = case.table if case.traced else int(coords.max()) + 1

    def axial(x: Any, c: Any) -> Any:
        cos, sin = pj.axial_rope_tables(
            c,
            spec.head_dim,
            base=spec.base,
            sections=spec.sections,
            mode=spec.mode,
            layout=spec.layout,
            max_length=rows if jit else None,
        )  # (seq, d) each
        return pj.apply_rope(x, cos[:, None, :], sin[:, None, :], layout=spec.layout)

    step = jax.jit(axial) if jit else axial

    def along(x: Any, first: int) -> np.ndarray:
        c = coords[first : first + x.shape[1]]
        return np.asarray(step(x, jnp.asarray(c, dtype=jnp.int32) if jit else c))

    return decode(case, along, x) if case.decode else along(x, 0)


def run_flax_rope_nd(case: Case, x: np.ndarray, call: Any, start: Any) -> np.ndarray:
    import jax.numpy as jnp

    from posenc.jax import linen

    p = case.params
    if case.scheme == "xpos":
        module = linen.XPosRotaryEmbedding(
            p["head_dim"], max_length=case.table, **xpos_options(case)
        )

        def both(tensors: Any) -> np.ndarray:
            return np.asarray(jnp.concatenate(tensors, axis=2))

        if case.decode:
            return decode(case, lambda x, s: both(module.apply({}, x, x, start_index=s)), x)
        return both(call(lambda x, s: module.apply({}, x, x, start_index=s), x, start("start")))
    spec, coords = axial_spec(case), axial_coords(case)
    module = linen.AxialRotaryEmbedding(**spec.fields(), max_length=case.table)
    if case.decode:
        return decode(
            case,
            lambda x, s: np.asarray(module.apply({}, x, x, coords=coords[s : s + x.shape[1]])[0]),
            x,
        )
    where = jnp.asarray(coords, dtype=jnp.int32) if case.traced else coords
    return np.asarray(call(lambda x, c: module.apply({}, x, x, coords=c)[0], x, where))


# --- KERPLE, FIRE and Sandwich (posenc.*.kernel_bias) ------------------------------------
# KERPLE's and FIRE's weights come from the case's rng (kernel_inputs); Sandwich's
# "table" is its distances (max_length), past which a traced entry is NaN.


def _kernel(scheme: str, name: str, fmt: str = "float32", **params: Any) -> Case:
    flags = {key: params.pop(key) for key in ("traced", "decode") if key in params}
    base = {
        "kerple": {"heads": 8, "kernel": "log"},
        "fire": {"heads": 8, "width": 32},
        "sandwich": {"heads": 8, "dim": 64},
    }[scheme]
    return Case(scheme, name, {**base, **params}, fmt, **flags)


KERNEL_CASES = [
    _kernel("kerple", "log-8", q=6, k=6),
    _kernel("kerple", "power-offset", kernel="power", heads=4, q=3, k=12, offset=9),
    _kernel("kerple", "default-q<k", heads=3, q=2, k=7),
    _kernel("fire", "8-heads", q=6, k=6),
    _kernel("fire", "offset-small-L", heads=3, width=4, init_L=4.0, q=3, k=12, offset=9),
    _kernel("fire", "default-q<k", heads=2, width=8, q=2, k=7),
    _kernel("sandwich", "8-heads-dim-64", q=6, k=6),
    _kernel("sandwich", "symmetric", heads=3, dim=8, base=100.0, mode="symmetric", q=4, k=9),
    _kernel("sandwich", "bf16-far", "bfloat16", heads=4, dim=16, q=2, k=3000, offset=2998),
    _kernel("sandwich", "default-q<k-f16", "float16", heads=5, dim=32, q=3, k=40),
    *[
        _kernel(
            scheme,
            f"past-table{'-traced' * traced}",
            traced=traced,
            heads=4,
            q=2,
            k=4,
            offset=3,
            table=4,
        )
        for scheme in KERNEL_SCHEMES
        for traced in (False, True)
    ],
    _kernel("kerple", "decode-offset", kernel="power", heads=8, q=5, k=9, offset=4, decode=True),
    _kernel("kerple", "decode-default", heads=3, q=5, k=8, prompt=2, decode=True),
    _kernel("fire", "decode-offset", heads=8, q=5, k=9, offset=4, init_L=4.0, decode=True),
    _kernel("fire", "decode-default", heads=2, width=8, q=5, k=8, prompt=2, decode=True),
    _kernel("sandwich", "decode-offset", q=5, k=9, offset=4, decode=True),
    _kernel(
        "sandwich",
        "decode-default-past-table",
        heads=3,
        dim=8,
        q=6,
        k=8,
        prompt=2,
        table=4,
        decode=True,
    ),
]
CASES += KERNEL_CASES


def _rope_learned(name: str, **params: Any) -> Case:
    """A learned RoPE case: queries and keys (grouped: fewer key heads) in ``qk_layout``."""
    options = {"traced": params.pop("traced", False), "decode": params.pop("decode", False)}
    base = {
        "head_dim": 16,
        "seq": 6,
        "heads": 2,
        "kv_heads": 1,
        "start": 0,
        "layout": "half",
        "base": 10000.0,
        "qk_layout": "bshd",
    }
    return Case("rope_learned", name, base | params, **options)


CASES += [
    _rope_learned("default"),
    _rope_learned("interleaved-bhsd-partial", layout="interleaved", qk_layout="bhsd",
                  rotary_dim=8, start=3),
    _rope_learned("llama3-8-heads-64", head_dim=64, heads=8, kv_heads=2, base=500000.0,
                  scaling="llama3", scaling_params={"factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, start=100),
    _rope_learned("yarn-traced", scaling="yarn", traced=True, start=40,
                  scaling_params={"factor": 4.0, "original_max_position_embeddings": 16}),
    # No table: positions far past any (2**24 + 3) are exact, known or traced.
    _rope_learned("past-table", seq=4, start=2**24 + 3, table=4),
    _rope_learned("past-table-traced", seq=4, start=2**24 + 3, table=4, traced=True),
    _rope_learned("decode", decode=True),
    _rope_learned("decode-prompt-far-bhsd", layout="interleaved", qk_layout="bhsd", start=100_000,
                  prompt=3, decode=True),
]  # fmt: skip


# --- inputs and the reference ----------------------------------------------------------


def inputs(case: Case) -> dict[str, np.ndarray]:
    """The case's input arrays, the same for every front end."""
    if case.scheme == "rope_learned":
        return rope_learned_inputs(case)
    p, rng = case.params, case.rng()
    if case.scheme in ("sinusoidal", "nope"):
        shape = (2, p["length"], p["d"])
        # Zeros in the low-precision formats, so that the output is the table itself.
        x = rng.standard_normal(shape) if case.fmt == "float32" else np.zeros(shape)
        return {"x": x.astype(np.float32)}
    if case.scheme == "learned":
        return {
            "x": rng.standard_normal((2, p["length"], p["d"])).astype(np.float32),
            "weight": rng.standard_normal((p["max_length"], p["d"])).astype(np.float32),
        }
    if case.scheme in ("rope", *ROPE_ND):
        x = rng.standard_normal((1, p["seq"], p["heads"], p["head_dim"]))  # (b, s, h, d)
        return {"x": x.astype(np.float32)}
    if case.scheme == "t5":
        return {"weight": rng.standard_normal((p["buckets"], p["heads"])).astype(np.float32)}
    if case.scheme == "cope":
        return cope_inputs(case, rng)
    if case.scheme in KERNEL_SCHEMES:
        return kernel_inputs(case)
    return {}


def index_dtype(case: Case, default: str = "int64") -> str:
    """The integer dtype of the case's traced positions or start (``default`` unless
    the case names one)."""
    return str(case.params.get("index_dtype", default))


def positions(case: Case) -> np.ndarray:
    p = case.params
    return np.arange(p.get("start", 0), p.get("start", 0) + p.get("length", p.get("seq", 0)))


def rope_frequencies(case: Case) -> tuple[np.ndarray, float]:
    """The case's inverse frequencies and attention factor, from the core."""
    from posenc.core.rope import rope_scaling

    p = case.params
    params = dict(p.get("scaling_params", {}))
    name = p.get("scaling") or "default"
    if name in ("dynamic_ntk", "longrope"):
        params["seq_len"] = int(positions(case)[-1]) + 1  # the call's length
    return rope_scaling(name, p["head_dim"], p["base"], rotary_dim=p.get("rotary_dim"), **params)


def reference(case: Case) -> np.ndarray:
    """The expected output, from the core's float64 internals, as float32 values."""
    import importlib

    from posenc.core.alibi import alibi_bias_values
    from posenc.core.nd import nd_values
    from posenc.core.rope import apply_rope, rope_tables
    from posenc.core.t5 import t5_bias

    table_values = importlib.import_module("posenc.core.sinusoidal").table_values
    if case.scheme == "cope":
        return cope_reference(case)
    if case.scheme == "rope_learned":
        return rope_learned_reference(case)
    p, data = case.params, inputs(case)
    if case.scheme in KERNEL_SCHEMES:
        return kernel_reference(case)
    if case.scheme == "sinusoidal":
        table = table_values(
            positions(case),
            p["d"],
            base=p.get("base", 10000.0),
            layout=p.get("layout", "interleaved"),
            formula=p.get("formula", "paper"),
            fmt=case.fmt,
        )
        return data["x"] + table  # float32 sum (the inputs are zeros in other formats)
    if case.scheme == "nd":
        return nd_values(
            tuple(p["shape"]),
            p["channels"],
            base=10000.0,
            layout=p.get("layout", "positional-encodings"),
            fmt=case.fmt,
        )
    if case.scheme == "learned":  # rows past the weight: NaN (only traced cases get there)
        rows = np.full((p["length"], p["d"]), np.nan, np.float32)
        kept = data["weight"][p["start"] : p["start"] + p["length"]]
        rows[: len(kept)] = kept
        return data["x"] + rows
    if case.scheme == "nope":
        return data["x"]
    if case.scheme == "rope":
        inv_freq, factor = rope_frequencies(case)
        layout = p["layout"]
        cos, sin = rope_tables(positions(case), inv_freq, dtype="float64", layout=layout)
        x = data["x"].astype(np.float64).transpose(0, 2, 1, 3)  # (b, h, s, d)
        out = apply_rope(x, factor * cos, factor * sin, layout=layout)
        return out.transpose(0, 2, 1, 3).astype(np.float32)  # one rounding, to float32
    if case.scheme == "alibi":
        return alibi_bias_values(
            p["q"],
            p["k"],
            num_heads=p["heads"],
            mode=p.get("mode", "causal"),
            offset=p.get("offset"),
            fmt=case.fmt,
        )
    if case.scheme in ROPE_ND:
        return rope_nd_reference(case, data["x"])
    if case.scheme == "t5":
        return t5_bias(
            data["weight"],
            p["q"],
            p["k"],
            bidirectional=p.get("bidirectional", True),
            max_distance=p["max_distance"],
            offset=p.get("offset"),
            compat=p.get("compat", "hf"),
        )
    raise AssertionError(case.scheme)


def row_positions(case: Case) -> np.ndarray:
    """The positions of the output's rows (axis 1): tokens, or the biases' queries."""
    if by_queries(case):
        from posenc.core.plan import align_queries

        p = case.params
        return align_queries(p["q"], p["k"], p.get("offset"))[2] + np.arange(p["q"])
    if case.scheme == "axial":  # a token's coordinate farthest from the table
        coords = axial_coords(case)
        return np.where(coords.min(-1) < 0, coords.min(-1), coords.max(-1))
    return positions(case)


def expected(frontend: str, case: Case) -> np.ndarray:
    """What ``frontend`` must give for ``case``: the reference, with NaN rows at the
    positions outside its table when the case is traced and the front end has one, and
    for a bias decoded step by step NaN at the keys after each step's (see :func:`decode`)."""
    values = reference(case).astype(np.float32)
    if case.traced and (frontend, case.scheme) not in TABLELESS:
        where = row_positions(case)
        outside = (where < 0) | (where >= case.table)
        values[:, outside] = np.nan
    if case.traced and (frontend, case.scheme) not in TABLELESS and case.scheme == "sandwich":
        values = sandwich_traced(case)  # a table by distance: NaN past its distances
    if case.decode and by_queries(case):
        seen = np.full_like(values, np.nan)
        for _, _, where in decode_views(case):
            seen[where] = values[where]
        values = seen
    return values


# --- decoding step by step ---------------------------------------------------------------


def decode_steps(case: Case) -> list[tuple[int, int]]:
    """``(first, count)`` of each call of a decode case, along the tokens (the biases'
    queries): the first ``prompt`` of them in one call (default 1), then one per call."""
    p = case.params
    total = p["q"] if by_queries(case) else len(positions(case))
    prompt = int(p.get("prompt", 1))
    return [(0, prompt), *((first, 1) for first in range(prompt, total))]


def decode_views(case: Case) -> list[tuple[int, int, tuple[slice, ...]]]:
    """``(first, count, index)`` of each step: where its output lies in the full call's.
    A bias step sees the keys up to its last query only: those of its rows' columns."""
    views = []
    for first, count in decode_steps(case):
        rows = slice(first, first + count)
        if by_queries(case):
            keys = row_positions(case)[first + count - 1] + 1  # up to the step's last query
            views.append((first, count, (..., rows, slice(0, int(keys)))))
        else:
            views.append((first, count, (slice(None), rows)))
    return views


def decode(case: Case, step: Any, x: Any = None) -> np.ndarray:
    """A decode case's output, from ``step`` called once per step on the one module (or
    function) a front end made for the case; each call gives that step's output as NumPy.

    * Encodings and RoPE: ``step(x[:, first : first + count], start + first)``, the
      step's tokens and the position of its first; the outputs are concatenated along the
      tokens, which gives the full call's output.
    * Biases: ``step(count, keys, offset)``, the step's queries against the keys up to
      its last query (``keys`` grows with every step), ``offset`` its first query's
      position, or ``None`` where the case gives none (the front end's default alignment
      must place the queries last). Each ``(heads, count, keys)`` bias goes to its rows
      and keys of a ``(heads, q, k)`` array of NaN, which :func:`expected` matches.
    """
    p = case.params
    if case.scheme in CONTEXTUAL:
        return decode_contextual(case, step)
    if case.scheme not in BIASES:
        start, outputs = p.get("start", 0), []
        for first, count in decode_steps(case):
            outputs.append(step(x[:, first : first + count], start + first))
            assert outputs[-1].shape[1] == count, (first, outputs[-1].shape)
        return np.concatenate(outputs, axis=1)
    where = row_positions(case)
    out = np.full((p["heads"], p["q"], p["k"]), np.nan, np.float32)
    for first, count, index in decode_views(case):
        keys = index[2].stop
        bias = step(count, keys, int(where[first]) if "offset" in p else None)
        assert bias.shape == (p["heads"], count, keys), (first, bias.shape)
        out[index] = bias
    return out


def tolerance(case: Case) -> float:
    """Absolute tolerance: 0 where only the core's values move, float32 rounding else."""
    if case.scheme in ("kerple", "fire"):
        return 1e-5  # float32 arithmetic of the weights (logs, an MLP), values below ~10
    if case.scheme in ("rope", "rope_learned", *ROPE_ND):
        # Two float32 products and a sum per entry, |x| <= ~5: a few float32 ulps of 4
        # (xPos: and one product by a scale, at most about 1.1 here).
        return 4e-6 if case.scheme == "xpos" else 2e-6
    if case.scheme == "cope":
        return 1e-5  # float32 gates, sums and products of head_dim terms, |bias| < ~5
    return 0.0


# --- the front ends ----------------------------------------------------------------------


def run_numpy(case: Case) -> np.ndarray:
    if case.scheme == "rope_learned":
        return rope_learned_numpy(case)
    import posenc

    if case.scheme == "cope":
        return cope_numpy(case)
    p, data = case.params, inputs(case)

    def at(first: int, x: np.ndarray) -> np.ndarray:
        """The positions of a step's tokens ``x`` (a decode case's), from ``first``."""
        return np.arange(first, first + x.shape[1])

    if case.scheme in KERNEL_SCHEMES:
        return numpy_kernel(case)
    if case.scheme == "sinusoidal":

        def sinusoidal(where: np.ndarray) -> np.ndarray:
            table = posenc.sinusoidal(
                where,
                p["d"],
                base=p.get("base", 10000.0),
                layout=p.get("layout", "interleaved"),
                formula=p.get("formula", "paper"),
                dtype=case.fmt,
            )
            return table.astype(np.float32)

        if case.decode:
            return decode(case, lambda x, s: x + sinusoidal(at(s, x)), data["x"])
        return data["x"] + sinusoidal(positions(case))
    if case.scheme == "nd":
        return posenc.sinusoidal_nd(
            p["shape"], p["channels"], layout=p.get("layout", "positional-encodings"),
            dtype=case.fmt,
        ).astype(np.float32)  # fmt: skip
    if case.scheme == "learned":
        if case.decode:
            return decode(case, lambda x, s: x + data["weight"][s : s + x.shape[1]], data["x"])
        return data["x"] + data["weight"][p["start"] : p["start"] + p["length"]]
    if case.scheme == "nope":
        if case.decode:
            return decode(case, lambda x, s: x + posenc.nope(at(s, x), p["d"]), data["x"])
        return data["x"] + posenc.nope(p["length"], p["d"])
    if case.scheme == "rope":
        inv_freq, factor = rope_frequencies(case)

        def rope(x: np.ndarray, where: np.ndarray) -> np.ndarray:
            cos, sin = posenc.rope_tables(
                where, inv_freq, dtype="float32", layout=p["layout"], scale=factor
            )
            x = x.transpose(0, 2, 1, 3)  # (b, h, s, d), float32 arithmetic
            out = posenc.apply_rope(x, cos, sin, layout=p["layout"])
            return out.transpose(0, 2, 1, 3)

        if case.decode:
            return decode(case, lambda x, s: rope(x, at(s, x)), data["x"])
        return rope(data["x"], positions(case))

    def alibi(q: int, k: int, offset: int | None) -> np.ndarray:
        bias = posenc.alibi_bias(
            q,
            k,
            num_heads=p["heads"],
            mode=p.get("mode", "causal"),
            offset=offset,
            dtype=case.fmt,
        )
        return bias.astype(np.float32)

    def t5(q: int, k: int, offset: int | None) -> np.ndarray:
        return posenc.t5_bias(
            data["weight"],
            q,
            k,
            bidirectional=p.get("bidirectional", True),
            max_distance=p["max_distance"],
            offset=offset,
            compat=p.get("compat", "hf"),
        )

    if case.scheme in ROPE_ND:
        return run_numpy_rope_nd(case, data["x"])
    if case.scheme in BIASES:
        bias = alibi if case.scheme == "alibi" else t5
        return decode(case, bias) if case.decode else bias(p["q"], p["k"], p.get("offset"))
    raise AssertionError(case.scheme)


def run_torch(case: Case) -> np.ndarray:
    if case.scheme == "rope_learned":
        return rope_learned_torch(case)
    import torch

    import posenc.torch as pt

    if case.scheme == "cope":
        return cope_torch(case)
    p, data = case.params, inputs(case)
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[
        case.fmt
    ]

    def out(tensor: torch.Tensor) -> np.ndarray:
        return tensor.detach().float().numpy()

    # Traced cases: the call compiled whole, its positions a tensor unknown while traced.
    where = torch.from_numpy(row_positions(case)).to(getattr(torch, index_dtype(case)))

    def call(function: Any, *args: Any) -> Any:
        if not case.traced:
            return function(*args)
        # A fresh start: past Dynamo's recompile limit a function would run eagerly.
        torch._dynamo.reset()
        try:
            return torch.compile(function, backend="eager", fullgraph=True)(*args)
        except torch._dynamo.exc.Unsupported as error:
            # fullgraph reports an exception raised while tracing as "Observed exception",
            # the original (ObservedValueErrorError for a ValueError) as its cause
            if "ValueError" in type(error.__cause__).__name__:
                raise ValueError(str(error.__cause__)) from error
            raise

    if case.scheme in KERNEL_SCHEMES:
        return torch_kernel(case, call, where)
    if case.scheme == "sinusoidal":
        module = pt.SinusoidalPositionalEncoding(
            p["d"],
            dropout=0.0,
            max_length=case.table,
            base=p.get("base", 10000.0),
            layout=p.get("layout", "interleaved"),
            formula=p.get("formula", "paper"),
        )
        x = torch.from_numpy(data["x"]).to(dtype)
        if case.decode:
            return decode(case, lambda x, s: out(module(x, offset=s)), x)
        if case.traced:
            return out(call(lambda x, pos: module(x, positions=pos), x, where))
        return out(module(x, offset=p.get("start", 0)))
    if case.scheme == "nd":
        module = pt.SinusoidalPositionalEncodingND(
            p["channels"], layout=p.get("layout", "positional-encodings")
        )
        return out(module.encoding(tuple(p["shape"]), dtype=dtype))
    if case.scheme == "learned":
        module = pt.LearnedPositionalEmbedding(p["max_length"], p["d"])
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(data["weight"]))
        x = torch.from_numpy(data["x"])
        if case.decode:
            return decode(case, lambda x, s: out(module(x, offset=s)), x)
        if case.traced:
            return out(call(lambda x, pos: module(x, positions=pos), x, where))
        return out(module(x, offset=p["start"]))
    if case.scheme == "nope":
        module = pt.NoPositionalEncoding(p["d"])
        x = torch.from_numpy(data["x"])
        if case.decode:
            return decode(case, lambda x, s: out(module(x, offset=s)), x)
        return out(call(lambda x, pos: module(x, positions=pos), x, where))
    if case.scheme == "rope":
        module = pt.RotaryEmbedding(
            p["head_dim"],
            base=p["base"],
            rotary_dim=p.get("rotary_dim"),
            layout=p["layout"],
            scaling=p.get("scaling"),
            scaling_params=p.get("scaling_params"),
            max_length=case.table,
            qk_layout="bshd",
        )
        x = torch.from_numpy(data["x"])
        if case.decode:

            def rope_step(x: torch.Tensor, start: int) -> np.ndarray:
                # keys -x: their rotation is exactly -q_rot (negation is exact), so a
                # step that mixed up queries and keys would show
                q_rot, k_rot = module(x, -x, offset=start)
                assert torch.equal(k_rot, -q_rot), f"the keys' rotation at {start}"
                return out(q_rot)

            return decode(case, rope_step, x)
        if case.traced:
            # a scaling whose frequencies change with every length: compiled code reads
            # them from those extend() keeps per length (no-op for the other scalings)
            module.extend(case.table)
            return out(call(lambda x, pos: module(x, x, positions=pos)[0], x, where))
        q_rot, _ = module(x, x, offset=p["start"])
        return out(q_rot)
    if case.scheme in ROPE_ND:
        return run_torch_rope_nd(case, data["x"], call, where)
    if case.scheme == "alibi":
        module = pt.ALiBiBias(p["heads"], mode=p.get("mode", "causal"))
        if case.decode:
            return decode(case, lambda q, k, o: out(module(q, k, offset=o, dtype=dtype)))
        if case.traced:
            return out(call(lambda pos: module(p["q"], p["k"], positions=pos, dtype=dtype), where))
        return out(module(p["q"], p["k"], offset=p.get("offset"), dtype=dtype))
    if case.scheme == "t5":
        module = pt.T5RelativeBias(
            p["heads"],
            bidirectional=p.get("bidirectional", True),
            num_buckets=p["buckets"],
            max_distance=p["max_distance"],
            compat=p.get("compat", "hf"),
        )
        with torch.no_grad():
            module.relative_attention_bias.weight.copy_(torch.from_numpy(data["weight"]))
        if case.decode:
            return decode(case, lambda q, k, o: out(module(q, k, offset=o)))
        if case.traced:
            return out(call(lambda pos: module(p["q"], p["k"], positions=pos), where))
        return out(module(p["q"], p["k"], offset=p.get("offset")))
    raise AssertionError(case.scheme)


def run_keras(case: Case) -> np.ndarray:
    """The case through the Keras layers, on whatever backend this process's Keras has."""
    if case.scheme == "rope_learned":
        return rope_learned_keras(case)
    import keras

    import posenc.keras as pk

    if case.scheme == "cope":
        return cope_keras(case)
    p, data = case.params, inputs(case)

    def out(tensor: Any) -> np.ndarray:
        return keras.ops.convert_to_numpy(keras.ops.cast(tensor, "float32"))

    def start(name: str) -> Any:
        """The case's first position: a Python int, or a tensor traced by ``call``."""
        value = p.get(name, 0 if name == "start" else None)
        if not case.traced:
            return value
        return keras.ops.convert_to_tensor(np.asarray(value, dtype=index_dtype(case, "int32")))

    def call(function: Any, *args: Any) -> Any:
        return keras_traced(function)(*args) if case.traced else function(*args)

    if case.scheme in KERNEL_SCHEMES:
        return keras_kernel(case, call, start)
    if case.scheme == "sinusoidal":
        layer = pk.SinusoidalPositionalEncoding(
            max_length=case.table if "table" in p else int(positions(case)[-1]) + 1,
            base=p.get("base", 10000.0),
            layout=p.get("layout", "interleaved"),
            formula=p.get("formula", "paper"),
            dtype=case.fmt,
        )
        x = keras.ops.cast(keras.ops.convert_to_tensor(data["x"]), case.fmt)
        layer.build(tuple(x.shape))
        if case.decode:
            return decode(case, lambda x, s: out(layer(x, start_index=s)), x)
        return out(call(lambda x, s: layer(x, start_index=s), x, start("start")))
    if case.scheme == "nd":
        layer = pk.SinusoidalPositionalEncodingND(layout=p.get("layout", "positional-encodings"))
        x = keras.ops.zeros((1, *p["shape"], p["channels"]), dtype=case.fmt)
        layer.build(tuple(x.shape))
        return out(layer.encoding(tuple(p["shape"]), dtype=case.fmt))
    if case.scheme == "learned":
        layer = pk.LearnedPositionalEmbedding(max_length=p["max_length"])
        layer.build(data["x"].shape)
        layer.set_weights([data["weight"]])
        x = keras.ops.convert_to_tensor(data["x"])
        if case.decode:
            return decode(case, lambda x, s: out(layer(x, start_index=s)), x)
        return out(call(lambda x, s: layer(x, start_index=s), x, start("start")))
    if case.scheme == "rope":
        layer = pk.RotaryEmbedding(
            base=p["base"],
            rotary_dim=p.get("rotary_dim"),
            layout=p["layout"],
            scaling=p.get("scaling"),
            scaling_params=p.get("scaling_params"),
            max_length=case.table,
        )
        x = keras.ops.convert_to_tensor(data["x"])
        layer.build(tuple(x.shape))
        if case.decode:
            return decode(case, lambda x, s: out(layer(x, start_index=s)), x)
        return out(call(lambda x, s: layer(x, start_index=s), x, start("start")))
    if case.scheme in ROPE_ND:
        return run_keras_rope_nd(case, data["x"], call, start)
    if case.scheme == "alibi":
        layer = pk.ALiBiBias(p["heads"], mode=p.get("mode", "causal"), max_length=case.table)

        def alibi(s: Any, q: int = p["q"], k: int = p["k"]) -> Any:
            return layer.compute_bias(q, k, start_index=s, dtype=case.fmt)

        if case.decode:
            return decode(case, lambda q, k, s: out(alibi(s, q, k)))
        return out(call(alibi, start("offset")))
    if case.scheme == "t5":
        layer = pk.T5RelativeBias(
            p["heads"],
            bidirectional=p.get("bidirectional", True),
            num_buckets=p["buckets"],
            max_distance=p["max_distance"],
            compat=p.get("compat", "hf"),
        )
        layer.build((1, p["heads"], p["q"], p["k"]))
        layer.set_weights([data["weight"]])
        if case.decode:
            return decode(case, lambda q, k, s: out(layer.compute_bias(q, k, start_index=s)))
        return out(call(lambda s: layer.compute_bias(p["q"], p["k"], start_index=s),
                        start("offset")))  # fmt: skip
    raise AssertionError(case.scheme)


def keras_traced(function: Any) -> Any:
    """``function`` traced by the Keras backend: ``tf.function`` on TensorFlow, ``jax.jit``
    on JAX; on torch it runs with ``torch.compiler.is_compiling()`` reporting True, which is
    how the layers learn that they are inside ``torch.compile`` (tensor values unknown)."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(function)
    if backend == "jax":
        import jax

        return jax.jit(function)
    from unittest import mock

    import torch

    def compiling(*args: Any) -> Any:
        with mock.patch.object(torch.compiler, "is_compiling", return_value=True):
            return function(*args)

    return compiling


def run_jax(case: Case, *, jit: bool = False) -> np.ndarray:
    """The case through ``posenc.jax``'s functions; with ``jit``, positions and offsets are
    traced values inside ``jax.jit`` (the decoding-loop path)."""
    with _jax_index_mode(case):
        return _run_jax(case, jit=jit)


def _jax_index_mode(case: Case) -> Any:
    """JAX's 64-bit mode for a case of 64-bit positions (JAX has them in that mode only)."""
    import contextlib

    import jax

    wide = index_dtype(case).endswith("64") and "index_dtype" in case.params
    return jax.enable_x64(True) if wide else contextlib.nullcontext()


def _run_jax(case: Case, *, jit: bool) -> np.ndarray:
    if case.scheme == "rope_learned":
        return rope_learned_jax(case, jit=jit)
    import jax
    import jax.numpy as jnp

    import posenc.jax as pj

    if case.scheme == "cope":
        return cope_jax(case, jit=jit)
    p, data = case.params, inputs(case)

    def out(array: Any) -> np.ndarray:
        return np.asarray(jnp.asarray(array, dtype=jnp.float32))

    def call(fn: Any, *traced: Any) -> Any:
        return jax.jit(fn)(*traced) if jit else fn(*traced)

    def at(first: int, x: Any) -> Any:
        """The positions of a step's tokens ``x`` (a decode case's): traced under jit."""
        where = np.arange(first, first + x.shape[1])
        return jnp.asarray(where) if jit else where

    if case.scheme in KERNEL_SCHEMES:
        return jax_kernel(case, jit)
    if case.scheme == "sinusoidal":

        def sinusoidal(pos: Any) -> Any:
            return pj.sinusoidal(
                pos,
                p["d"],
                base=p.get("base", 10000.0),
                layout=p.get("layout", "interleaved"),
                formula=p.get("formula", "paper"),
                dtype=case.fmt,
                max_length=(case.table if case.traced else 8192) if jit else None,
            )

        if case.decode:  # one function (jitted once), a call per step
            encode = jax.jit(sinusoidal) if jit else sinusoidal
            return decode(case, lambda x, s: x + out(encode(at(s, x))), data["x"])
        pos = jnp.asarray(positions(case).astype(index_dtype(case))) if jit else positions(case)
        return data["x"] + out(call(sinusoidal, pos))
    if case.scheme == "nd":
        return out(
            pj.sinusoidal_nd(
                p["shape"],
                p["channels"],
                layout=p.get("layout", "positional-encodings"),
                dtype=case.fmt,
            )
        )
    if case.scheme == "rope":
        inv_scaling = {
            "base": p["base"],
            "rotary_dim": p.get("rotary_dim"),
            "layout": p["layout"],
            "scaling": p.get("scaling"),
            "scaling_params": dict(p.get("scaling_params", {})),
        }  # a length-dependent scaling follows the call's length, in every front end

        def rotate(x: Any, pos: Any) -> Any:
            rows = case.table if case.traced else 200_000
            cos, sin = pj.rope_tables(
                pos, p["head_dim"], max_length=rows if jit else None, **inv_scaling
            )  # (seq, rotary_dim)
            return pj.apply_rope(x, cos[:, None, :], sin[:, None, :], layout=p["layout"])

        if case.decode:  # one function (jitted once), a call per step
            step = jax.jit(rotate) if jit else rotate
            return decode(case, lambda x, s: out(step(x, at(s, x))), data["x"])
        if jit and not case.traced and p.get("scaling") == "dynamic_ntk":
            # its frequencies need the call's length: positions known while tracing
            return out(call(lambda x: rotate(x, positions(case)), data["x"]))
        pos = jnp.asarray(positions(case)) if jit else positions(case)
        return out(call(rotate, data["x"], pos))
    if case.scheme in ROPE_ND:
        return run_jax_rope_nd(case, data["x"], jit=jit)
    if case.scheme == "alibi":

        def alibi(offset: Any, q: int = p["q"], k: int = p["k"]) -> Any:
            return pj.alibi_bias(
                q,
                k,
                num_heads=p["heads"],
                mode=p.get("mode", "causal"),
                offset=offset,
                dtype=case.fmt,
                max_length=(case.table if case.traced else 64) if jit else None,
            )

        def traced(offset: int | None) -> Any:
            return offset if offset is None or not jit else jnp.int32(offset)

        if case.decode:  # the lengths change every step: a trace per step under jit
            return decode(case, lambda q, k, o: out(call(lambda o: alibi(o, q, k), traced(o))))
        offset = p.get("offset")  # None: the queries are the last q of the k positions
        return out(call(alibi, traced(offset)))
    if case.scheme == "t5":

        def t5(weight: Any, offset: Any, q: int, k: int) -> Any:
            return pj.t5_bias(
                weight,
                q,
                k,
                bidirectional=p.get("bidirectional", True),
                max_distance=p["max_distance"],
                offset=offset,
                compat=p.get("compat", "hf"),
            )

        weight = jnp.asarray(data["weight"])

        def t5_step(q: int, k: int, offset: int | None) -> np.ndarray:
            traced = offset if offset is None or not jit else jnp.int32(offset)
            return out(call(lambda w, o: t5(w, o, q, k), weight, traced))

        return decode(case, t5_step) if case.decode else t5_step(p["q"], p["k"], p.get("offset"))
    raise AssertionError(case.scheme)


def run_flax(case: Case) -> np.ndarray:
    """The case through the Flax linen modules of ``posenc.jax.linen``."""
    with _jax_index_mode(case):
        return _run_flax(case)


def _run_flax(case: Case) -> np.ndarray:
    if case.scheme == "rope_learned":
        return rope_learned_flax(case)
    import jax
    import jax.numpy as jnp

    from posenc.jax import linen

    if case.scheme == "cope":
        return cope_flax(case)
    p, data = case.params, inputs(case)
    dtype = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}[case.fmt]

    def out(array: Any) -> np.ndarray:
        return np.asarray(jnp.asarray(array, dtype=jnp.float32))

    key = jax.random.PRNGKey(0)

    def start(name: str) -> Any:
        """The case's first position: an int, or a traced scalar under ``call``."""
        value = p.get(name, 0 if name == "start" else None)
        return jnp.asarray(value, dtype=index_dtype(case, "int32")) if case.traced else value

    def call(function: Any, *args: Any) -> Any:
        return jax.jit(function)(*args) if case.traced else function(*args)

    if case.scheme in KERNEL_SCHEMES:
        return flax_kernel(case)
    if case.scheme == "sinusoidal":
        module = linen.SinusoidalPositionalEncoding(
            max_length=case.table,
            base=p.get("base", 10000.0),
            layout=p.get("layout", "interleaved"),
            formula=p.get("formula", "paper"),
        )
        x = jnp.asarray(data["x"], dtype=dtype)
        variables = module.init(key, x)
        if case.decode:
            return decode(case, lambda x, s: out(module.apply(variables, x, start_index=s)), x)
        return out(call(lambda x, s: module.apply(variables, x, start_index=s), x, start("start")))
    if case.scheme == "learned":
        module = linen.LearnedPositionalEmbedding(max_length=p["max_length"])
        variables = {"params": {"embedding": jnp.asarray(data["weight"])}}
        x = jnp.asarray(data["x"])
        if case.decode:
            return decode(case, lambda x, s: out(module.apply(variables, x, start_index=s)), x)
        return out(call(lambda x, s: module.apply(variables, x, start_index=s), x, start("start")))
    if case.scheme == "rope":
        module = linen.RotaryEmbedding(
            base=p["base"],
            rotary_dim=p.get("rotary_dim"),
            layout=p["layout"],
            scaling=p.get("scaling"),
            scaling_params=p.get("scaling_params"),
            max_length=case.table,
        )
        x = jnp.asarray(data["x"])
        variables = module.init(key, x)
        if case.decode:
            return decode(case, lambda x, s: out(module.apply(variables, x, start_index=s)), x)
        return out(call(lambda x, s: module.apply(variables, x, start_index=s), x, start("start")))
    if case.scheme in ROPE_ND:
        return run_flax_rope_nd(case, data["x"], call, start)
    if case.scheme == "alibi":
        module = linen.ALiBiBias(
            p["heads"], mode=p.get("mode", "causal"), max_length=case.table, dtype=case.fmt
        )
        variables = module.init(key, p["q"], p["k"])
        if case.decode:
            return decode(case, lambda q, k, o: out(module.apply(variables, q, k, offset=o)))
        return out(
            call(lambda o: module.apply(variables, p["q"], p["k"], offset=o), start("offset"))
        )
    if case.scheme == "t5":
        module = linen.T5RelativeBias(
            p["heads"],
            bidirectional=p.get("bidirectional", True),
            num_buckets=p["buckets"],
            max_distance=p["max_distance"],
            compat=p.get("compat", "hf"),
        )
        variables = {"params": {"relative_attention_bias": jnp.asarray(data["weight"])}}
        if case.decode:
            return decode(case, lambda q, k, o: out(module.apply(variables, q, k, offset=o)))
        return out(call(lambda o: module.apply(variables, p["q"], p["k"], offset=o),
                        start("offset")))  # fmt: skip
    raise AssertionError(case.scheme)


# --- CoPE ------------------------------------------------------------------------------
#
# Each front end's CoPE is ``bias(first, count, keys)``: the queries of rows ``first ..
# first + count - 1`` against keys ``0 .. keys - 1``, ``(batch, heads, count, keys)`` as
# NumPy. The full call is ``bias(0, q, k)``; a decode case calls it once per step.


def cope_inputs(case: Case, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Queries, keys and the learned vectors (the weight ``pos_emb`` of every front end)."""
    p = case.params
    shapes = {
        "q": (p["batch"], p["heads"], p["q"], p["head_dim"]),
        "k": (p["batch"], p["heads"], p["k"], p["head_dim"]),
        "pos_emb": (1, p["head_dim"], p["max_positions"]),
    }
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def cope_allowed(case: Case, first: int, count: int, keys: int) -> np.ndarray | None:
    """The mask of a call's rows and keys: causal (the queries are the last of the keys),
    with ``"padded"`` batch row ``b`` also hiding its first ``2b`` keys (left padding,
    ``(batch, 1, count, keys)``); ``None`` for ``"none"``."""
    p = case.params
    if p["mask"] == "none":
        return None
    rows = row_positions(case)[first : first + count]
    allowed = np.arange(keys)[None, :] <= rows[:, None]  # (count, keys)
    if p["mask"] == "padded":
        shown = np.arange(keys)[None, :] >= 2 * np.arange(p["batch"])[:, None]  # (B, keys)
        allowed = allowed & shown[:, None, None, :]  # (B, 1, count, keys)
    return allowed


def cope_reference(case: Case) -> np.ndarray:
    from posenc.core.cope import cope_bias

    p, data = case.params, inputs(case)
    allowed = cope_allowed(case, 0, p["q"], p["k"])
    bias = cope_bias(data["q"], data["k"], data["pos_emb"], allowed=allowed, scale=p["scale"])
    return bias.astype(np.float32)  # float64, rounded once


def cope_run(case: Case, bias: Any) -> np.ndarray:
    """The case's output from a front end's ``bias(first, count, keys)``."""
    p = case.params
    return decode_contextual(case, bias) if case.decode else bias(0, p["q"], p["k"])


def decode_contextual(case: Case, step: Any) -> np.ndarray:
    """A CoPE decode: ``step(first, count, keys)`` per step, each into its rows and keys
    of a ``(batch, heads, q, k)`` array of NaN, which :func:`expected` matches."""
    p = case.params
    out = np.full((p["batch"], p["heads"], p["q"], p["k"]), np.nan, np.float32)
    for first, count, index in decode_views(case):
        keys = index[-1].stop
        bias = step(first, count, keys)
        assert bias.shape == (p["batch"], p["heads"], count, keys), (first, bias.shape)
        out[index] = bias
    return out


def cope_numpy(case: Case) -> np.ndarray:
    import posenc

    p, data = case.params, inputs(case)

    def bias(first: int, count: int, keys: int) -> np.ndarray:
        q, k = data["q"][:, :, first : first + count], data["k"][:, :, :keys]
        allowed = cope_allowed(case, first, count, keys)
        values = posenc.cope_bias(q, k, data["pos_emb"], allowed=allowed, scale=p["scale"])
        return values.astype(np.float32)

    return cope_run(case, bias)


def cope_torch(case: Case) -> np.ndarray:
    import torch

    import posenc.torch as pt

    p, data = case.params, inputs(case)
    module = pt.ContextualPositionEncoding(p["head_dim"], max_positions=p["max_positions"])
    module.load_state_dict({"pos_emb": torch.from_numpy(data["pos_emb"])})  # by name
    call = module
    if case.traced:
        torch._dynamo.reset()
        call = torch.compile(module, backend="eager", fullgraph=True)

    def bias(first: int, count: int, keys: int) -> np.ndarray:
        q = torch.from_numpy(data["q"][:, :, first : first + count])
        k = torch.from_numpy(data["k"][:, :, :keys])
        allowed = cope_allowed(case, first, count, keys)
        mask = None if allowed is None else torch.from_numpy(allowed)
        return call(q, k, allowed=mask, scale=p["scale"]).detach().numpy()

    return cope_run(case, bias)


def cope_keras(case: Case) -> np.ndarray:
    import keras

    import posenc.keras as pk

    p, data = case.params, inputs(case)
    layer = pk.ContextualPositionEncoding(p["head_dim"], max_positions=p["max_positions"])
    layer.build()
    layer.pos_emb.assign(data["pos_emb"])

    def bias(first: int, count: int, keys: int) -> np.ndarray:
        allowed = cope_allowed(case, first, count, keys)

        def call(q: Any, k: Any) -> Any:
            return layer(q, k, allowed=allowed, scale=p["scale"])

        q = keras.ops.convert_to_tensor(data["q"][:, :, first : first + count])
        k = keras.ops.convert_to_tensor(data["k"][:, :, :keys])
        values = (keras_traced(call) if case.traced else call)(q, k)
        return keras.ops.convert_to_numpy(values)

    return cope_run(case, bias)


def cope_jax(case: Case, *, jit: bool) -> np.ndarray:
    import jax

    import posenc.jax as pj

    p, data = case.params, inputs(case)

    def bias(first: int, count: int, keys: int) -> np.ndarray:
        allowed = cope_allowed(case, first, count, keys)

        def call(q: Any, k: Any, pos_emb: Any) -> Any:
            return pj.cope_bias(q, k, pos_emb, allowed=allowed, scale=p["scale"])

        q, k = data["q"][:, :, first : first + count], data["k"][:, :, :keys]
        return np.asarray((jax.jit(call) if jit else call)(q, k, data["pos_emb"]))

    return cope_run(case, bias)


def cope_flax(case: Case) -> np.ndarray:
    import jax

    from posenc.jax import linen

    p, data = case.params, inputs(case)
    module = linen.ContextualPositionEncoding(p["head_dim"], max_positions=p["max_positions"])
    variables = {"params": {"pos_emb": data["pos_emb"]}}  # the PyTorch module's name

    def bias(first: int, count: int, keys: int) -> np.ndarray:
        allowed = cope_allowed(case, first, count, keys)

        def call(q: Any, k: Any) -> Any:
            return module.apply(variables, q, k, allowed=allowed, scale=p["scale"])

        q, k = data["q"][:, :, first : first + count], data["k"][:, :, :keys]
        return np.asarray((jax.jit(call) if case.traced else call)(q, k))

    return cope_run(case, bias)


# --- KERPLE, FIRE and Sandwich: inputs, reference and each front end ----------------------


def kernel_inputs(case: Case) -> dict[str, np.ndarray]:
    """KERPLE's ``bias_p``, ``bias_a`` (one of each out of range: the projection) and
    FIRE's weights by PyTorch's names, float32; Sandwich has none."""
    p, rng = case.params, case.rng()
    heads = p["heads"]
    if case.scheme == "kerple":
        bias_p = rng.uniform(0.2, 2.0, (heads, 1, 1))
        bias_a = rng.uniform(0.05, 1.0, (heads, 1, 1))
        bias_p[0], bias_a[-1] = (2.5 if p["kernel"] == "power" else -0.3), 0.0
        return {"bias_p": bias_p.astype(np.float32), "bias_a": bias_a.astype(np.float32)}
    if case.scheme == "fire":
        from posenc.core.kernel_bias import FIRE_WEIGHTS

        sizes = {"W": p["width"], "H": heads, "1": 1}
        weights = {
            name: rng.uniform(-1.0, 1.0, tuple(sizes[a] for a in axes)).astype(np.float32)
            for name, axes in FIRE_WEIGHTS.items()
        }
        weights["c"] = np.float32(rng.uniform(0.05, 0.5))
        weights["L_multiplier"] = np.float32(rng.uniform(0.5, 1.5))
        return weights
    return {}


def _kernel_options(case: Case) -> dict[str, Any]:
    """The case's options by the names every front end gives them."""
    p = case.params
    if case.scheme == "kerple":
        return {"kernel": p["kernel"]}
    if case.scheme == "fire":
        return {"init_L": p.get("init_L", 512.0)}
    return {"num_heads": p["heads"], "dim": p["dim"], "base": p.get("base", 10000.0),
            "mode": p.get("mode", "causal")}  # fmt: skip


def kernel_reference(case: Case) -> np.ndarray:
    """The core's float64 values (KERPLE, FIRE) or correctly rounded ones (Sandwich)."""
    from posenc.core.kernel_bias import fire_bias, kerple_bias
    from posenc.core.sandwich import sandwich_bias

    p, data, options = case.params, inputs(case), _kernel_options(case)
    q, k, offset = p["q"], p["k"], p.get("offset")
    if case.scheme == "kerple":
        return kerple_bias(data["bias_p"], data["bias_a"], q, k, offset=offset, **options)
    if case.scheme == "fire":
        return fire_bias(data, q, k, offset=offset, **options)
    return sandwich_bias(q, k, offset=offset, fmt=case.fmt, **options)


def sandwich_traced(case: Case) -> np.ndarray:
    """A traced Sandwich case's expected values: NaN where the distance passes the table."""
    from posenc.core.plan import align_queries

    p = case.params
    values = kernel_reference(case).astype(np.float32)
    _, _, offset = align_queries(p["q"], p["k"], p.get("offset"))
    ahead = (offset + np.arange(p["q"]))[:, None] - np.arange(p["k"])[None, :]
    distance = np.maximum(ahead, 0) if p.get("mode", "causal") == "causal" else np.abs(ahead)
    values[:, distance >= case.table] = np.nan
    return values


def _kernel_run(case: Case, step: Any) -> np.ndarray:
    """``step(q, k, offset)`` for the full call, or once per decode step."""
    p = case.params
    return decode(case, step) if case.decode else step(p["q"], p["k"], p.get("offset"))


def numpy_kernel(case: Case) -> np.ndarray:
    import posenc

    data, options = inputs(case), _kernel_options(case)
    if case.scheme == "kerple":

        def bias(q: int, k: int, o: int | None) -> np.ndarray:
            return posenc.kerple_bias(data["bias_p"], data["bias_a"], q, k, offset=o, **options)
    elif case.scheme == "fire":

        def bias(q: int, k: int, o: int | None) -> np.ndarray:
            return posenc.fire_bias(data, q, k, offset=o, **options)
    else:

        def bias(q: int, k: int, o: int | None) -> np.ndarray:
            return posenc.sandwich_bias(q, k, offset=o, fmt=case.fmt, **options)

    return _kernel_run(case, lambda q, k, o: bias(q, k, o).astype(np.float32))


def torch_kernel(case: Case, call: Any, where: Any) -> np.ndarray:
    import torch

    import posenc.torch as pt

    p, data = case.params, inputs(case)
    dtype = getattr(torch, case.fmt)
    if case.scheme == "kerple":
        module: Any = pt.KERPLEBias(p["heads"], kernel=p["kernel"])
    elif case.scheme == "fire":
        module = pt.FIREBias(p["heads"], mlp_width=p["width"], init_L=p.get("init_L", 512.0))
    else:
        options = _kernel_options(case)
        module = pt.SandwichBias(options.pop("num_heads"), max_length=case.table, **options)
    state = {name: torch.from_numpy(np.asarray(v)) for name, v in data.items()}
    module.load_state_dict(state, strict=False)

    def bias(q: int, k: int, o: int | None = None, pos: Any = None) -> Any:
        with torch.no_grad():
            return module(q, k, offset=o, positions=pos, dtype=dtype).float().numpy()

    if case.traced:
        return call(lambda pos: torch.from_numpy(bias(p["q"], p["k"], pos=pos)), where).numpy()
    return _kernel_run(case, bias)


def keras_kernel(case: Case, call: Any, start: Any) -> np.ndarray:
    import keras

    import posenc.keras as pk
    from posenc.core.kernel_bias import FIRE_WEIGHTS

    p, data = case.params, inputs(case)
    if case.scheme == "kerple":
        layer: Any = pk.KERPLEBias(p["heads"], kernel=p["kernel"])
        weights = [data["bias_p"], data["bias_a"]]
    elif case.scheme == "fire":
        layer = pk.FIREBias(p["heads"], mlp_width=p["width"], init_L=p.get("init_L", 512.0))
        weights = [data[name] for name in FIRE_WEIGHTS]
    else:
        options = _kernel_options(case)
        layer = pk.SandwichBias(options.pop("num_heads"), max_length=case.table, **options)
        weights = []
    layer.build()
    layer.set_weights(weights)

    def bias(q: int, k: int, s: Any) -> Any:
        return keras.ops.cast(layer.compute_bias(q, k, start_index=s, dtype=case.fmt), "float32")

    if case.traced:
        return keras.ops.convert_to_numpy(call(lambda s: bias(p["q"], p["k"], s), start("offset")))
    return _kernel_run(case, lambda q, k, s: keras.ops.convert_to_numpy(bias(q, k, s)))


def jax_kernel(case: Case, jit: bool) -> np.ndarray:
    import jax
    import jax.numpy as jnp

    import posenc.jax as pj

    p, data, options = case.params, inputs(case), _kernel_options(case)
    # traced: the case's table; else one covering every distance of the case
    table = case.table if case.traced else p.get("offset", p["k"]) + p["q"] + p["k"]

    def bias(q: int, k: int, o: Any) -> Any:
        if case.scheme == "kerple":
            return pj.kerple_bias(data["bias_p"], data["bias_a"], q, k, offset=o, **options)
        if case.scheme == "fire":
            return pj.fire_bias(data, q, k, offset=o, **options)
        return pj.sandwich_bias(q, k, offset=o, dtype=case.fmt, max_length=table, **options)

    def step(q: int, k: int, o: int | None) -> np.ndarray:
        if jit and o is not None:  # the offset traced; lengths static (a trace per step)
            out = jax.jit(lambda o: bias(q, k, o))(jnp.int32(o))
        else:
            out = bias(q, k, o)
        return np.asarray(jnp.asarray(out, jnp.float32))

    return _kernel_run(case, step)


def flax_kernel(case: Case) -> np.ndarray:
    import jax
    import jax.numpy as jnp

    from posenc.jax import linen

    p, data, options = case.params, inputs(case), _kernel_options(case)
    if case.scheme == "kerple":
        module: Any = linen.KERPLEBias(p["heads"], **options)
    elif case.scheme == "fire":
        module = linen.FIREBias(p["heads"], mlp_width=p["width"], **options)
    else:
        module = linen.SandwichBias(max_length=case.table, dtype=case.fmt, **options)
    variables = {"params": {name: jnp.asarray(v) for name, v in data.items()}} if data else {}

    def step(q: int, k: int, o: int | None) -> np.ndarray:
        if case.traced and o is not None:
            out = jax.jit(lambda o: module.apply(variables, q, k, offset=o))(jnp.int32(o))
        else:
            out = module.apply(variables, q, k, offset=o)
        return np.asarray(jnp.asarray(out, jnp.float32))

    return _kernel_run(case, step)


# --- learned RoPE (rope_learned) -----------------------------------------------------------
# Queries (``heads``) and keys (``kv_heads``) of shape (1, seq, heads, head_dim); each front
# end's module takes them in the case's ``qk_layout`` and its output is given back as
# (1, seq, heads + kv_heads, head_dim): the rotated queries, then the rotated keys. The
# trained frequencies are the core's starting ones, perturbed by the case's rng, and go
# into each front end's parameter by its name, ``inv_freq``.


def rope_learned_options(case: Case) -> dict[str, Any]:
    """The module options of a learned RoPE case (every front end takes the same)."""
    p = case.params
    keys = ("base", "rotary_dim", "layout", "scaling", "scaling_params", "qk_layout")
    return {key: p[key] for key in keys if key in p}


def rope_learned_inputs(case: Case) -> dict[str, np.ndarray]:
    from posenc.core.rope import learned_rope_frequencies, rope_options

    p, rng = case.params, case.rng()
    q = rng.standard_normal((1, p["seq"], p["heads"], p["head_dim"]))
    k = rng.standard_normal((1, p["seq"], p["kv_heads"], p["head_dim"]))
    scaling, base, _ = rope_options(p.get("scaling"), p.get("scaling_params"), p["base"])
    initial, factor = learned_rope_frequencies(
        scaling, p.get("rotary_dim", p["head_dim"]), base, owner="case"
    )
    trained = initial * (1 + 0.2 * rng.standard_normal(initial.shape))  # as after training
    return {
        "x": np.concatenate([q, k], axis=2).astype(np.float32),  # (1, seq, heads + kv, d)
        "inv_freq": trained.astype(np.float32),
        "factor": np.float64(factor),
    }


def rope_learned_reference(case: Case) -> np.ndarray:
    """The rotation by the trained frequencies in float64 (the core's exact tables and
    rotation), rounded once."""
    from posenc.core.rope import apply_rope, rope_tables

    p, data = case.params, inputs(case)
    cos, sin = rope_tables(
        positions(case), data["inv_freq"], dtype="float64", layout=p["layout"],
        scale=float(data["factor"]),
    )  # fmt: skip
    x = data["x"].astype(np.float64).transpose(0, 2, 1, 3)  # (b, h, s, d)
    out = apply_rope(x, cos, sin, layout=p["layout"])
    return out.transpose(0, 2, 1, 3).astype(np.float32)


def _qk(case: Case, x: Any) -> tuple[Any, Any]:
    """``(q, k)`` of a step's ``(1, seq, heads + kv, d)`` inputs, in the case's layout."""
    q, k = x[:, :, : case.params["heads"]], x[:, :, case.params["heads"] :]
    if case.params["qk_layout"] == "bhsd":
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)  # (b, h, s, d)
    return q, k


def _output(case: Case, q: Any, k: Any) -> np.ndarray:
    """Rotated ``q`` and ``k`` (NumPy, in the case's layout) as ``(1, seq, heads + kv, d)``."""
    q, k = (np.asarray(a, dtype=np.float32) for a in (q, k))
    if case.params["qk_layout"] == "bhsd":
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)  # (b, s, h, d)
    return np.concatenate([q, k], axis=2)


def _rope_learned_steps(case: Case, rotate: Any) -> np.ndarray:
    """The case's output from ``rotate(x, start) -> (q_rot, k_rot)``: once, or a call per
    step of a decode case."""
    data = inputs(case)
    if case.decode:
        return decode(case, lambda x, s: _output(case, *rotate(x, s)), data["x"])
    return _output(case, *rotate(data["x"], case.params["start"]))


def rope_learned_numpy(case: Case) -> np.ndarray:
    """The core's public functions: ``rope_tables`` of the trained frequencies, rounded to
    float32, and ``apply_rope`` in float32."""
    import posenc

    p, data = case.params, inputs(case)

    def rotate(x: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        where = np.arange(start, start + x.shape[1])
        cos, sin = posenc.rope_tables(
            where, data["inv_freq"], layout=p["layout"], scale=float(data["factor"])
        )
        q, k = (a.transpose(0, 2, 1, 3) for a in (x[:, :, : p["heads"]], x[:, :, p["heads"] :]))
        q, k = (posenc.apply_rope(a, cos, sin, layout=p["layout"]) for a in (q, k))
        if p["qk_layout"] == "bshd":
            q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
        return q, k

    return _rope_learned_steps(case, rotate)


def rope_learned_torch(case: Case) -> np.ndarray:
    import torch

    import posenc.torch as pt

    p, data = case.params, inputs(case)
    module = pt.LearnedRotaryEmbedding(p["head_dim"], **rope_learned_options(case))
    module.load_state_dict({"inv_freq": torch.from_numpy(data["inv_freq"])})  # by name

    def rotate(x: np.ndarray, start: int) -> tuple[Any, Any]:
        q, k = (torch.from_numpy(np.ascontiguousarray(a)) for a in _qk(case, x))
        if not case.traced:
            q_rot, k_rot = module(q, k, offset=start)
        else:  # compiled whole, the positions a tensor unknown while traced
            torch._dynamo.reset()
            where = torch.arange(start, start + x.shape[1])
            compiled = torch.compile(module, backend="eager", fullgraph=True)
            q_rot, k_rot = compiled(q, k, positions=where)
        return q_rot.detach().numpy(), k_rot.detach().numpy()

    return _rope_learned_steps(case, rotate)


def rope_learned_keras(case: Case) -> np.ndarray:
    import keras

    import posenc.keras as pk

    p, data = case.params, inputs(case)
    layer = pk.LearnedRotaryEmbedding(p["head_dim"], **rope_learned_options(case))
    layer.build()
    {weight.name: weight for weight in layer.weights}["inv_freq"].assign(data["inv_freq"])

    def rotate(x: np.ndarray, start: int) -> tuple[Any, Any]:
        q, k = _qk(case, x)
        if not case.traced:
            q_rot, k_rot = layer(q, k, start_index=start)
        else:  # the start a tensor, unknown while traced
            start_index = keras.ops.convert_to_tensor(np.int32(start))
            q_rot, k_rot = keras_traced(lambda q, k, s: layer(q, k, start_index=s))(
                keras.ops.convert_to_tensor(q), keras.ops.convert_to_tensor(k), start_index
            )
        return keras.ops.convert_to_numpy(q_rot), keras.ops.convert_to_numpy(k_rot)

    return _rope_learned_steps(case, rotate)


def rope_learned_jax(case: Case, *, jit: bool) -> np.ndarray:
    """``posenc.jax.learned_rope_tables`` and ``apply_rope``; with ``jit``, the positions
    are traced."""
    import jax
    import jax.numpy as jnp

    import posenc.jax as pj

    p, data = case.params, inputs(case)
    axis = 1 if p["qk_layout"] == "bshd" else 0  # where the tables take a heads axis

    def rope(q: Any, k: Any, where: Any) -> tuple[Any, Any]:
        cos, sin = pj.learned_rope_tables(
            where, data["inv_freq"], layout=p["layout"], attention_factor=float(data["factor"])
        )  # (seq, rotary_dim)
        cos, sin = jnp.expand_dims(cos, axis), jnp.expand_dims(sin, axis)
        return (
            pj.apply_rope(q, cos, sin, layout=p["layout"]),
            pj.apply_rope(k, cos, sin, layout=p["layout"]),
        )

    step = jax.jit(rope) if jit else rope  # one function (jitted once), a call per step

    def rotate(x: np.ndarray, start: int) -> tuple[Any, Any]:
        where = np.arange(start, start + x.shape[1])
        return step(*_qk(case, x), jnp.asarray(where) if jit else where)

    return _rope_learned_steps(case, rotate)


def rope_learned_flax(case: Case) -> np.ndarray:
    import jax
    import jax.numpy as jnp

    from posenc.jax import linen

    p, data = case.params, inputs(case)
    module = linen.LearnedRotaryEmbedding(p["head_dim"], **rope_learned_options(case))
    variables = {"params": {"inv_freq": jnp.asarray(data["inv_freq"])}}  # by name

    def apply(q: Any, k: Any, start: Any) -> Any:
        return module.apply(variables, q, k, start_index=start)

    def rotate(x: np.ndarray, start: int) -> tuple[Any, Any]:
        q, k = _qk(case, x)
        if case.traced:
            return jax.jit(apply)(q, k, jnp.asarray(start, dtype=jnp.int32))
        return apply(q, k, start)

    return _rope_learned_steps(case, rotate)


def run(frontend: str, case: Case) -> np.ndarray:
    """``case``'s output from ``frontend`` (Keras: on this process's backend)."""
    if frontend == "numpy":
        return run_numpy(case)
    if frontend == "torch":
        return run_torch(case)
    if frontend.startswith("keras-"):
        return run_keras(case)
    if frontend == "jax":
        return run_jax(case)
    if frontend == "jax-jit":
        return run_jax(case, jit=True)
    if frontend == "flax":
        return run_flax(case)
    raise ValueError(f"unknown front end {frontend!r}")


def cases_for(frontend: str) -> list[Case]:
    schemes = FRONTENDS[frontend][1]
    return [
        case
        for case in CASES
        if case.scheme in schemes
        and (not case.traced or frontend in TRACING)
        and (frontend, case.params.get("index_dtype")) not in NO_INDEX_DTYPE
    ]


def keras_worker(path: str) -> None:
    """Compute every Keras case on this process's backend and save them to ``path``."""
    import keras

    backend = keras.backend.backend()
    values: dict[str, np.ndarray] = {}
    errors: dict[str, str] = {}
    for case in cases_for(f"keras-{backend}"):
        try:
            values[case.id] = run_keras(case)
        except Exception as error:  # reported per case by the test, not here
            errors[case.id] = f"{type(error).__name__}: {error}"
    np.savez(path, **values, __errors__=np.array(json.dumps(errors)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keras", required=True, metavar="OUT.npz")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(keras_worker(args.keras))
