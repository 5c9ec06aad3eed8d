"""The explorer's numbers: every panel's values on its grid of settings, from the core.

The page draws, it never computes: each setting a control can take was computed here,
when the page was written, by the same functions as the rest of posenc
(:func:`posenc.sinusoidal`, :func:`posenc.offset_similarity`, :func:`posenc.rope_scaling`,
:func:`posenc.alibi_bias`, :func:`posenc.relative_position_bucket`). Arrays travel as
little-endian bytes in base64 (a float32 value arrives as the same bits); identical
arrays are stored once (ALiBi's 32 head counts share 32 slopes, the unscaled RoPE
spectrum is the same for every factor).
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from ..analysis import offset_similarity
from ..core.alibi import MODES, alibi_bias, alibi_slopes
from ..core.rope import ROPE_SCALING_SPECS, rope_scaling
from ..core.sinusoidal import sinusoidal
from ..core.t5 import relative_position_bucket, relative_positions
from ..plot.rope import offset_scores, scaling_examples

__all__ = ["GRID", "Store", "explorer_data"]

GRID: dict[str, dict[str, Any]] = {
    "sinusoidal": {
        "d_model": (4, 8, 16, 32, 64, 128, 256, 512),
        "base": (100, 1000, 10000),
        "positions": 100,  # the heat map shows the first 1 .. 100 rows
    },
    "rope": {
        "head_dim": 128,
        "base": (10000, 500000),
        "factor": (2, 4, 8, 16, 32),
        "original_max_position_embeddings": (2048, 4096, 8192),
        "max_distance": 1 << 20,  # the score at 0 .. 64 and ~300 distances up to 2**20
        "score_points": 300,
        # drawn when the page opens (as in the rope-spectrum picture); every registered
        # method can be ticked
        "shown": ("default", "linear", "ntk", "yarn", "llama3", "longrope"),
    },
    "alibi": {"num_heads": tuple(range(1, 33)), "positions": 32, "mode": MODES},
    "t5": {
        "num_buckets": (8, 16, 32, 64, 128),
        "max_distance": (16, 32, 64, 128, 256),
        "bidirectional": (True, False),
        "positions": 64,
    },
}
"""The settings each control of the page offers; the page holds every combination."""


class Store:
    """Arrays as base64 blobs, each distinct array once; a blob is named by its index.

    Example:
        >>> store = Store()
        >>> store.add(np.float32([1, 2])), store.add(np.float32([1, 2])), store.add(np.uint8([7]))
        (0, 0, 1)
        >>> store.blobs[1]
        {'dtype': 'uint8', 'shape': [1], 'data': 'Bw=='}
    """

    _KINDS = ("float32", "float64", "uint8")

    def __init__(self) -> None:
        self.blobs: list[dict[str, Any]] = []
        self._index: dict[tuple[str, tuple[int, ...], bytes], int] = {}

    def add(self, array: np.ndarray) -> int:
        """Store ``array`` (float32, float64 or uint8) unless it is there; its index."""
        kind = array.dtype.name
        if kind not in self._KINDS:
            raise TypeError(f"the page holds {', '.join(self._KINDS)} arrays, got {kind}")
        raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        key = (kind, array.shape, raw)
        if key not in self._index:
            self._index[key] = len(self.blobs)
            data = base64.b64encode(raw).decode("ascii")
            self.blobs.append({"dtype": kind, "shape": list(array.shape), "data": data})
        return self._index[key]


def _sinusoidal(store: Store) -> dict[str, Any]:
    """Each ``(d_model, n)``: the float32 table of the first positions, and the dot
    product ``PE(p) · PE(p + k)`` (float64) for every offset the table spans."""
    grid = GRID["sinusoidal"]
    length = grid["positions"]
    offsets = np.arange(-(length - 1), length)
    tables, dots = {}, {}
    for d_model in grid["d_model"]:
        for base in grid["base"]:
            key = f"{d_model}/{base}"
            tables[key] = store.add(sinusoidal(length, d_model, base=base))
            dots[key] = store.add(offset_similarity(offsets, d_model, base))
    return {**grid, "offsets": store.add(offsets.astype(np.float64)), "table": tables,
            "dot": dots}  # fmt: skip


def _rope_distances(grid: dict[str, Any]) -> np.ndarray:
    """Every distance 0 .. 64, then about ``score_points`` geometric up to the maximum."""
    geometric = np.rint(np.geomspace(1, grid["max_distance"], grid["score_points"]))
    return np.unique(np.concatenate([np.arange(65), geometric])).astype(np.int64)


def _drawable(grid: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The registered methods with parameters for a context extension (their spec's
    ``example``), and why each other one cannot be drawn (a method of a user's own that
    needs parameters besides ``factor`` and ``L₀``)."""
    drawn, left_out = [], {}
    first = (grid["head_dim"], grid["base"][0], grid["factor"][0],
             grid["original_max_position_embeddings"][0])  # fmt: skip
    for name in ROPE_SCALING_SPECS:
        try:
            scaling_examples(*first, methods=[name])
        except TypeError as error:
            left_out[name] = str(error)
        else:
            drawn.append(name)
    return drawn, left_out


def _rope(store: Store) -> dict[str, Any]:
    """Each ``(base, factor, L₀)`` and scaling method: the wavelength ``2π/θ_i`` of each
    pair (NaN for a pair left unrotated, θ = 0), the attention factor, and the score
    ``2 Σ_i cos(Δ θ_i)`` of all-ones query and key at each distance Δ."""
    grid = GRID["rope"]
    head_dim = grid["head_dim"]
    methods, left_out = _drawable(grid)
    distances = _rope_distances(grid)
    cases: dict[str, dict[str, Any]] = {}
    for base in grid["base"]:
        for factor in grid["factor"]:
            for original in grid["original_max_position_embeddings"]:
                examples = scaling_examples(head_dim, base, factor, original, methods)
                case = {}
                for name, params in examples.items():
                    inv_freq, attention = rope_scaling(name, head_dim, base, **params)
                    with np.errstate(divide="ignore"):
                        wavelength = np.where(inv_freq > 0, 2 * math.pi / inv_freq, np.nan)
                    case[name] = {
                        "wavelength": store.add(wavelength),
                        "score": store.add(offset_scores(distances, inv_freq)),
                        "attention": attention,
                    }
                cases[f"{base}/{factor}/{original}"] = case
    return {**grid, "methods": methods, "left_out": left_out,
            "distances": store.add(distances.astype(np.float64)), "case": cases}  # fmt: skip


def _alibi(store: Store) -> dict[str, Any]:
    """Each head count: the slopes (float64); each mode, head count and head: the float32
    bias of that head, the future keys of a causal bias NaN (masked, drawn blank)."""
    grid = GRID["alibi"]
    length = grid["positions"]
    future = np.triu(np.ones((length, length), dtype=bool), k=1)
    slopes, bias = {}, {}
    for heads in grid["num_heads"]:
        slopes[str(heads)] = store.add(alibi_slopes(heads))
        for mode in grid["mode"]:
            values = alibi_bias(length, num_heads=heads, mode=mode)
            if mode == "causal":
                values = np.where(future, np.float32(np.nan), values)
            bias[f"{mode}/{heads}"] = [store.add(head) for head in values]
    return {**grid, "slopes": slopes, "bias": bias}


def _t5(store: Store) -> dict[str, Any]:
    """Each ``(num_buckets, max_distance, bidirectional)``: the bucket matrix of the first
    positions and the bucket against ``key - query`` over ±1.5 max_distance, or the
    core's error for a combination it refuses."""
    grid = GRID["t5"]
    matrix = relative_positions(grid["positions"])
    cases: dict[str, dict[str, Any]] = {}
    for buckets in grid["num_buckets"]:
        for distance in grid["max_distance"]:
            for bidirectional in grid["bidirectional"]:
                key = f"{buckets}/{distance}/{str(bidirectional).lower()}"
                options = {"bidirectional": bidirectional, "num_buckets": buckets,
                           "max_distance": distance}  # fmt: skip
                reach = (3 * distance) // 2
                curve = np.arange(-reach, reach + 1)
                try:
                    cases[key] = {
                        "matrix": store.add(
                            relative_position_bucket(matrix, **options).astype(np.uint8)
                        ),
                        "distances": store.add(curve.astype(np.float64)),
                        "buckets": store.add(
                            relative_position_bucket(curve, **options).astype(np.uint8)
                        ),
                    }
                except ValueError as error:
                    cases[key] = {"error": str(error)}
    return {**grid, "case": cases}


def explorer_data() -> dict[str, Any]:
    """Every panel's numbers on :data:`GRID`, ready for ``json.dumps``.

    Returns:
        ``{"blobs": [...], "sinusoidal": ..., "rope": ..., "alibi": ..., "t5": ...}``:
        each panel's settings (those of :data:`GRID`) and, for every combination, the
        index of its arrays in ``blobs`` (``{"dtype", "shape", "data"}``, the data
        little-endian bytes in base64).

    Example:
        >>> data = explorer_data()
        >>> table = data["blobs"][data["sinusoidal"]["table"]["4/100"]]
        >>> table["dtype"], table["shape"]
        ('float32', [100, 4])
        >>> data["t5"]["case"]["128/16/true"]["error"][:37]  # refused by the core
        'max_distance must be > max_exact = 32'
    """
    store = Store()
    panels = {"sinusoidal": _sinusoidal(store), "rope": _rope(store), "alibi": _alibi(store),
              "t5": _t5(store)}  # fmt: skip
    return {"blobs": store.blobs, **panels}
