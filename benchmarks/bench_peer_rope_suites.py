"""Hugging Face's own RoPE tests, run unchanged, and again with posenc in place.

transformers tests its RoPE methods in ``tests/utils/test_modeling_rope_utils.py``. Its
wheel ships no tests and this repository keeps none of its code: take the file from a
transformers checkout at the tag of the installed version
(``git clone --depth 1 --branch v5.24.0 https://github.com/huggingface/transformers``)
and give its path. The file also needs ``pip install parameterized``.

The files run with pytest twice, each in a process of its own: (a) unchanged; (b) with
posenc in place: a pytest plugin, written to a temporary folder and loaded with ``-p``,
puts the function that ``posenc.integrations.transformers.register()`` installs (the
inverse frequencies exact in float64 and rounded once to float32, and the attention
factor) in every entry of ``ROPE_INIT_FUNCTIONS`` and in every rotary class's
``compute_default_rope_parameters``. The test files are not edited. Neither run loads
the checkout's ``conftest.py`` files or its pytest configuration (``--noconftest``, an
empty ini file): they set up transformers' CI and need its development extras.

Then the script says why each test that passes unchanged fails with posenc in place:
probes of what those tests ask (``seq_len=0``; the float32 bounds the llama3 test forms)
against the exact values, and, per rope type, the largest error of each side's float32
``inv_freq`` and of its attention factor against the exact value (mpmath, 50 digits), in
units in the last place.

Run: ``python benchmarks/bench_peer_rope_suites.py PATH/test_modeling_rope_utils.py
[--source TEXT] [--output DIR]`` (about 1 min).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import mpmath
import torch
import transformers
from transformers import LlamaConfig
from transformers import modeling_rope_utils as hf_rope
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import posenc
from _timing import machine_info, markdown_table
from posenc.integrations import transformers as posenc_hf

mpmath.mp.dps = 50

PLUGIN = '''"""posenc's RoPE in place of transformers' own, for an unchanged test run."""
import json
import pathlib
import sys

from transformers import modeling_rope_utils

from posenc.integrations import transformers as posenc_hf

_added = posenc_hf.register()
POSENC_INIT = modeling_rope_utils.ROPE_INIT_FUNCTIONS[_added[0]]
posenc_hf.unregister()  # the suite lists the rope types: leave it the same keys
for _kind in list(modeling_rope_utils.ROPE_INIT_FUNCTIONS):
    modeling_rope_utils.ROPE_INIT_FUNCTIONS[_kind] = POSENC_INIT


def _default_classes():
    """The loaded rotary classes with their own compute_default_rope_parameters."""
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("transformers.models."):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and "compute_default_rope_parameters" in vars(value):
                yield value


def _replace_default_methods():
    for cls in _default_classes():
        cls.compute_default_rope_parameters = staticmethod(POSENC_INIT)


def pytest_collection_finish(session):
    _replace_default_methods()


def pytest_runtest_setup(item):
    _replace_default_methods()  # classes a test imports late


def pytest_sessionfinish(session):
    """What was replaced, for the report: replaced.json beside this file."""
    functions = modeling_rope_utils.ROPE_INIT_FUNCTIONS
    replaced = {
        "rope_init_functions": sorted(k for k, f in functions.items() if f is POSENC_INIT),
        "default_methods": sorted(
            {c.__module__ + "." + c.__name__ for c in _default_classes()
             if c.compute_default_rope_parameters is POSENC_INIT}
        ),
    }
    pathlib.Path(__file__).with_name("replaced.json").write_text(json.dumps(replaced))
'''


# -- the two runs ---------------------------------------------------------------------


def run_suite(files: list[Path], posenc_in_place: bool, work: Path) -> dict[str, dict[str, str]]:
    """``{test id: {"outcome", "message"}}`` of one pytest run in a fresh process."""
    root = os.path.commonpath([str(f.parent) for f in files])
    report = work / ("posenc.xml" if posenc_in_place else "unchanged.xml")
    (work / "pytest.ini").write_text("[pytest]\n")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest"]
    command += ["-c", str(work / "pytest.ini"), "--rootdir", root, f"--junitxml={report}"]
    if posenc_in_place:
        (work / "posenc_in_place.py").write_text(PLUGIN)
        command += ["-p", "posenc_in_place"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(work), env.get("PYTHONPATH")]))
    subprocess.run([*command, *map(str, files)], cwd=work, env=env, capture_output=True)
    return _junit(report)


def replaced_by_plugin(work: Path) -> dict[str, list[str]]:
    """What the plugin put posenc in place of (written at the end of run (b))."""
    replaced: dict[str, list[str]] = json.loads((work / "replaced.json").read_text())
    return replaced


def _junit(report: Path) -> dict[str, dict[str, str]]:
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}".lstrip(".")
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "failed" if child.tag == "failure" else child.tag
                message = (child.get("message") or "").splitlines()[0][:200]
        results[test_id] = {"outcome": outcome, "message": message}
    return results


def counts(run: dict[str, dict[str, str]]) -> dict[str, int]:
    tally: dict[str, int] = {}
    for result in run.values():
        tally[result["outcome"]] = tally.get(result["outcome"], 0) + 1
    return tally


# -- the exact values -----------------------------------------------------------------


def exact_inv_freq(case: dict[str, Any]) -> list[Any]:
    """The exact inverse frequencies of a case, by transformers' definition of its type."""
    kind, rope, d = case["kind"], case["rope"], case["head_dim"]
    base = mpmath.mpf(rope["rope_theta"])
    if kind == "proportional":
        angles = int(rope.get("partial_rotary_factor", 1.0) * d // 2)
        factor = mpmath.mpf(rope.get("factor", 1.0))
        return [
            base ** (-mpmath.mpf(2 * i) / d) / factor if i < angles else 0 for i in range(d // 2)
        ]
    if kind == "dynamic":
        length = max(case.get("seq_len") or 0, case["max_position"])
        factor = mpmath.mpf(rope["factor"])
        base *= (factor * length / case["max_position"] - (factor - 1)) ** (mpmath.mpf(d) / (d - 2))
    theta = [base ** (-mpmath.mpf(2 * i) / d) for i in range(d // 2)]
    scale = _EXACT_SCALINGS.get(kind)
    return scale(theta, case) if scale else theta


def _linear(theta: list[Any], case: dict[str, Any]) -> list[Any]:
    return [t / mpmath.mpf(case["rope"]["factor"]) for t in theta]


def _longrope(theta: list[Any], case: dict[str, Any]) -> list[Any]:
    rope = case["rope"]
    long = (case.get("seq_len") or 0) > rope["original_max_position_embeddings"]
    factors = rope["long_factor"] if long else rope["short_factor"]
    return [t / mpmath.mpf(f) for t, f in zip(theta, factors, strict=True)]


def _llama3(theta: list[Any], case: dict[str, Any]) -> list[Any]:
    rope = case["rope"]
    factor, low, high = (
        mpmath.mpf(rope[k]) for k in ("factor", "low_freq_factor", "high_freq_factor")
    )
    original = mpmath.mpf(rope["original_max_position_embeddings"])
    out = []
    for t in theta:
        wavelength = 2 * mpmath.pi / t
        if wavelength < original / high:
            out.append(t)
        elif wavelength > original / low:
            out.append(t / factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            out.append((1 - smooth) * t / factor + smooth * t)
    return out


def _yarn(theta: list[Any], case: dict[str, Any]) -> list[Any]:
    rope, d = case["rope"], case["head_dim"]
    factor, base = mpmath.mpf(rope["factor"]), mpmath.mpf(rope["rope_theta"])
    original = rope.get("original_max_position_embeddings", case["max_position"])

    def dim_of(rotations: float) -> Any:
        return d * mpmath.log(original / (rotations * 2 * mpmath.pi)) / (2 * mpmath.log(base))

    low = max(int(mpmath.floor(dim_of(rope.get("beta_fast", 32)))), 0)
    high = min(int(mpmath.ceil(dim_of(rope.get("beta_slow", 1)))), d - 1)
    span = (high - low) or mpmath.mpf("0.001")
    ramps = [min(max((i - low) / mpmath.mpf(span), 0), 1) for i in range(d // 2)]
    return [t / factor * r + t * (1 - r) for t, r in zip(theta, ramps, strict=True)]


_EXACT_SCALINGS = {"linear": _linear, "longrope": _longrope, "llama3": _llama3, "yarn": _yarn}


def exact_attention(case: dict[str, Any]) -> Any:
    rope = case["rope"]
    if "attention_factor" in rope:
        return mpmath.mpf(rope["attention_factor"])
    if case["kind"] == "yarn":
        return mpmath.mpf("0.1") * mpmath.log(rope["factor"]) + 1
    if case["kind"] == "longrope" and rope.get("factor", 1.0) > 1:
        original = rope["original_max_position_embeddings"]
        return mpmath.sqrt(1 + mpmath.log(rope["factor"]) / mpmath.log(original))
    return mpmath.mpf(1)


def ulps(value: float, exact: Any, mantissa_bits: int) -> float:
    """``|value - exact|`` in units in the last place of ``exact`` (0 for an exact 0)."""
    if exact == 0:
        return 0.0 if value == 0 else float("inf")
    exponent = max(mpmath.frexp(exact)[1] - 1, -126 if mantissa_bits == 23 else -1022)
    return float(abs(mpmath.mpf(value) - exact) / mpmath.ldexp(1, exponent - mantissa_bits))


# -- the cases: each rope type as the suite configures it, and as released models do --


def _case(kind: str, rope: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "rope": {"rope_type": kind, **rope},
        "head_dim": 128,
        "max_position": 2048,
        **extra,
    }


def cases() -> list[dict[str, Any]]:
    short, long = [2.0] * 64, [float(i) for i in range(1, 65)]
    longrope = {"rope_theta": 1e4, "short_factor": short, "long_factor": long}
    llama3 = {"low_freq_factor": 1, "high_freq_factor": 4}
    return [
        _case("default", {"rope_theta": 1e4}),
        _case("default", {"rope_theta": 1e4}, head_dim=256),
        _case("default", {"rope_theta": 5e5}),
        _case("default", {"rope_theta": 1e6}),
        *(_case("linear", {"rope_theta": 1e4, "factor": f}) for f in (2.0, 10.0, 20.0)),
        _case("dynamic", {"rope_theta": 1e4, "factor": 10.0}, seq_len=16384),
        _case(
            "dynamic",
            {"rope_theta": 1e4, "factor": 10.0},
            seq_len=200000,
            head_dim=256,
            max_position=131072,
        ),
        _case("dynamic", {"rope_theta": 1e4, "factor": 2.0}, seq_len=4096),
        _case("yarn", {"rope_theta": 1e4, "factor": 10.0, "beta_fast": 32, "beta_slow": 1}),
        _case(
            "yarn",
            {"rope_theta": 1e4, "factor": 10.0, "beta_fast": 32, "beta_slow": 1},
            head_dim=256,
            max_position=131072,
        ),
        _case(
            "yarn",
            {"rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768},
            max_position=131072,
        ),
        _case("longrope", {**longrope, "factor": 1.0, "original_max_position_embeddings": 2048}),
        _case(
            "longrope",
            {**longrope, "factor": 20.0, "original_max_position_embeddings": 2048},
            seq_len=2049,
        ),
        _case(
            "llama3",
            {"rope_theta": 1e4, "factor": 10.0, "original_max_position_embeddings": 2048, **llama3},
        ),
        _case(
            "llama3",
            {"rope_theta": 1e4, "factor": 10.0, "original_max_position_embeddings": 2048, **llama3},
            head_dim=256,
            max_position=131072,
        ),
        _case(
            "llama3",
            {"rope_theta": 5e5, "factor": 8.0, "original_max_position_embeddings": 8192, **llama3},
            max_position=131072,
        ),
        *(
            _case("proportional", {"rope_theta": 1e4, "partial_rotary_factor": p})
            for p in (0.25, 0.5, 1.0)
        ),
        _case("proportional", {"rope_theta": 1e4, "partial_rotary_factor": 0.5, "factor": 2.0}),
        _case("proportional", {"rope_theta": 1e6, "partial_rotary_factor": 0.25}, head_dim=512),
    ]


def config_of(case: dict[str, Any]) -> LlamaConfig:
    d = case["head_dim"]
    return LlamaConfig(
        hidden_size=8 * d,
        num_attention_heads=8,
        head_dim=d,
        max_position_embeddings=case["max_position"],
        rope_parameters=dict(case["rope"]),
    )


def hf_function(kind: str) -> Any:
    if kind == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters
    return hf_rope.ROPE_INIT_FUNCTIONS[kind]


def posenc_function() -> Any:
    added = posenc_hf.register()
    function = hf_rope.ROPE_INIT_FUNCTIONS[added[0]]
    posenc_hf.unregister()
    return function


def measure_case(case: dict[str, Any], posenc_init: Any) -> dict[str, Any]:
    exact, attention = exact_inv_freq(case), exact_attention(case)
    row: dict[str, Any] = {k: case[k] for k in ("kind", "head_dim", "max_position")}
    row["rope"] = {k: v for k, v in case["rope"].items() if not isinstance(v, list)}
    row["seq_len"] = case.get("seq_len")
    row["entries"] = len(exact)
    for side, function in (("hf", hf_function(case["kind"])), ("posenc", posenc_init)):
        inv_freq, factor = function(config_of(case), seq_len=case.get("seq_len"))
        errors = [ulps(float(v), e, 23) for v, e in zip(inv_freq.tolist(), exact, strict=True)]
        row[f"{side}_max_ulps"] = max(errors)
        row[f"{side}_over_half_ulp"] = sum(e > 0.5 for e in errors)
        row[f"{side}_attention_ulps"] = ulps(float(factor), attention, 52)
    return row


# -- probes of what the failing tests ask ---------------------------------------------


def probe_seq_len_zero(posenc_init: Any) -> list[dict[str, str]]:
    """Each length-dependent type asked at ``seq_len=0``, as the longrope tests do."""
    rows = []
    for kind in ("dynamic", "longrope"):
        case = next(c for c in cases() if c["kind"] == kind)
        row = {"kind": kind}
        for side, function in (("hf", hf_function(kind)), ("posenc", posenc_init)):
            try:
                function(config_of(case), seq_len=0)
                row[side] = "accepted"
            except (TypeError, ValueError) as exc:
                row[side] = f"refused: {type(exc).__name__}: {exc}"
        rows.append(row)
    return rows


def probe_llama3_bounds(posenc_init: Any) -> list[dict[str, Any]]:
    """The llama3 tests' ``default / factor <= llama3 <= default``, formed in float32 as
    they form it, for each side; each violation with the exact values."""
    rows = []
    for case in (c for c in cases() if c["kind"] == "llama3"):
        theta = case["rope"]["rope_theta"]
        default_case = {
            **case,
            "kind": "default",
            "rope": {"rope_type": "default", "rope_theta": theta},
        }
        exact, factor = exact_inv_freq(case), case["rope"]["factor"]
        for side, default_fn, llama3_fn in (
            ("hf", hf_function("default"), hf_function("llama3")),
            ("posenc", posenc_init, posenc_init),
        ):
            default = default_fn(config_of(default_case))[0]
            values = llama3_fn(config_of(case))[0]
            lower = default / factor  # float32, as the test divides
            for i in range(len(values)):
                if lower[i] <= values[i] <= default[i]:
                    continue
                rows.append(
                    {
                        "side": side,
                        "theta": case["rope"]["rope_theta"],
                        "head_dim": case["head_dim"],
                        "index": i,
                        "default_float32": float(default[i]),
                        "bound_float32": float(lower[i]),
                        "value": float(values[i]),
                        "exact": float(exact[i]),
                        "value_ulps": ulps(float(values[i]), exact[i], 23),
                        "bound_ulps": ulps(float(lower[i]), exact[i], 23),
                    }
                )
    return rows


def classify(test_id: str, message: str, probes: dict[str, Any]) -> str:
    """Why a test that passes unchanged fails with posenc in place, from the probes."""
    refused = [p for p in probes["seq_len_zero"] if p["posenc"].startswith("refused")]
    if "seq_len" in message and "got 0" in message and refused:
        return (
            "a real difference in posenc: its ROPE_INIT_FUNCTIONS entry refuses seq_len=0 "
            "(ValueError), which transformers accepts (LongRoPE: the short factors; dynamic: "
            "the original length)"
        )
    bounds = [p for p in probes["llama3_bounds"] if p["side"] == "posenc"]
    if "llama3" in test_id and bounds and all(p["value_ulps"] <= 0.5 for p in bounds):
        return (
            "the test's bound records float32 error: it divides the float32 default "
            "frequencies by the factor in float32 (two roundings), and posenc's value, the "
            "exact one rounded once, lies 1 ulp below that bound (within half an ulp of exact)"
        )
    return "not explained by the probes"


# -- the report -----------------------------------------------------------------------


def per_type(rows: list[dict[str, Any]]) -> list[list[Any]]:
    table = []
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        cells: list[Any] = [kind, len(mine), sum(r["entries"] for r in mine)]
        for side in ("hf", "posenc"):
            cells.append(f"{max(r[f'{side}_max_ulps'] for r in mine):.3f}")
            cells.append(sum(r[f"{side}_over_half_ulp"] for r in mine))
            cells.append(f"{max(r[f'{side}_attention_ulps'] for r in mine):.3f}")
        table.append(cells)
    return table


def markdown(result: dict[str, Any]) -> str:
    a, b = result["runs"]["unchanged"], result["runs"]["posenc"]
    lines = ["# Hugging Face's RoPE tests with posenc in place", "", machine_info([1]), ""]
    for f in result["files"]:
        lines.append(f"- test file: `{f['path']}` (sha256 {f['sha256']}, {f['source']})")
    replaced = result["replaced"]
    lines.append(
        "- posenc put in place of: ROPE_INIT_FUNCTIONS "
        + ", ".join(replaced["rope_init_functions"])
        + "; compute_default_rope_parameters of "
        + ", ".join(replaced["default_methods"])
    )
    lines += ["", f"(a) unchanged: {counts(a)}; (b) posenc in place: {counts(b)}", ""]
    changed = [
        [t, a[t]["outcome"], b[t]["outcome"], b[t]["message"], result["why"].get(t, "")]
        for t in a
        if a[t]["outcome"] != b.get(t, {}).get("outcome")
    ]
    lines.append(markdown_table(["test", "(a)", "(b)", "message with posenc", "why"], changed))
    both = [[t, a[t]["message"]] for t in a if a[t]["outcome"] != "passed" == b[t]["outcome"]]
    both += [[t, a[t]["message"]] for t in a if a[t]["outcome"] == b[t]["outcome"] != "passed"]
    lines += [
        "",
        "Failing in both runs (not about posenc):",
        "",
        markdown_table(["test", "message"], both),
    ]
    lines += ["", "Probe: seq_len=0", "", _table(result["probes"]["seq_len_zero"])]
    lines += ["", "Probe: the llama3 tests' float32 bounds, violations", ""]
    lines.append(_table(result["probes"]["llama3_bounds"]))
    lines += ["", "Max error against exact (float32 inv_freq, float64 attention factor), ulps:", ""]
    headers = [
        "rope type",
        "cases",
        "entries",
        "HF inv_freq",
        "HF > ½",
        "HF attn",
        "posenc inv_freq",
        "posenc > ½",
        "posenc attn",
    ]
    lines.append(markdown_table(headers, per_type(result["cases"])))
    return "\n".join(lines) + "\n"


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)"
    cells = [[f"{v:.9g}" if isinstance(v, float) else v for v in row.values()] for row in rows]
    return markdown_table(list(rows[0]), cells)


def describe_file(path: Path, source: str) -> dict[str, str]:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"path": str(path), "sha256": digest, "source": source}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="transformers' RoPE test files")
    parser.add_argument("--source", default="source not given", help="where the files came from")
    parser.add_argument("--output", type=Path, help="write peer_rope_suites.{md,json} here")
    args = parser.parse_args()
    files = [f.resolve() for f in args.files]
    with tempfile.TemporaryDirectory() as work:
        runs = {
            name: run_suite(files, name == "posenc", Path(work)) for name in ("unchanged", "posenc")
        }
        replaced = replaced_by_plugin(Path(work))
    posenc_init = posenc_function()
    probes = {
        "seq_len_zero": probe_seq_len_zero(posenc_init),
        "llama3_bounds": probe_llama3_bounds(posenc_init),
    }
    a, b = runs["unchanged"], runs["posenc"]
    why = {
        t: classify(t, b[t]["message"], probes)
        for t in a
        if a[t]["outcome"] == "passed" and b.get(t, {}).get("outcome") != "passed"
    }
    result = {
        "versions": {
            "posenc": posenc.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
        },
        "files": [describe_file(f, args.source) for f in files],
        "replaced": replaced,
        "runs": runs,
        "why": why,
        "probes": probes,
        "cases": [measure_case(case, posenc_init) for case in cases()],
    }
    report = markdown(result)
    print(report)
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "peer_rope_suites.md").write_text(report)
        (args.output / "peer_rope_suites.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
