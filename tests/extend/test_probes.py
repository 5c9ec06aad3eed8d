"""posenc.extend.probes: scalings and lengths as users name them, and the probes' keys."""

from __future__ import annotations

import dataclasses

import pytest

from posenc.core.rope import ROPE_SCALING_SPECS, as_rope_scaling
from posenc.extend.probes import Probe, parse_length, parse_scaling

OWN = {"rope_type": "default"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("linear", ("linear", {"factor": 4.0})),
        ("ntk", ("ntk", {"factor": 4.0})),
        ("dynamic", ("dynamic_ntk", {"factor": 4.0, "original_max_position_embeddings": 8192})),
        ("dynamic_ntk", ("dynamic_ntk", {"factor": 4.0, "original_max_position_embeddings": 8192})),
        ("yarn", ("yarn", {"factor": 4.0, "original_max_position_embeddings": 8192})),
        (
            "yarn:factor=8,beta_fast=16",
            ("yarn", {"factor": 8, "beta_fast": 16, "original_max_position_embeddings": 8192}),
        ),
        (
            "llama3",
            (
                "llama3",
                {
                    "factor": 4.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
            ),
        ),
        (
            "llama3:low_freq_factor=2",
            (
                "llama3",
                {
                    "factor": 4.0,
                    "low_freq_factor": 2,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
            ),
        ),
    ],
)
def test_a_named_scaling_is_the_registry_method_with_the_factor_and_context(text, expected):
    name, rope = parse_scaling(text, context=8192, factor=4.0, own=OWN)
    method, params = expected
    reference, _ = as_rope_scaling(method, params)
    assert name.partition(":")[0] == method
    assert as_rope_scaling(rope)[0] == reference


def test_none_and_model_are_the_unscaled_rope_and_the_config_own():
    own = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    assert parse_scaling("none", context=4096, factor=2.0, own=own) == (
        "none",
        {"rope_type": "default"},
    )
    assert parse_scaling("model", context=4096, factor=2.0, own=own) == ("model", own)


def test_longrope_takes_the_model_factors():
    own = {
        "rope_type": "longrope",
        "short_factor": [1.0] * 4,
        "long_factor": [2.0] * 4,
        "original_max_position_embeddings": 4096,
        "max_position_embeddings": 16384,
    }
    _, rope = parse_scaling("longrope", context=4096, factor=4.0, own=own)
    assert rope["long_factor"] == [2.0] * 4
    assert rope["rope_type"] == "longrope"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("warp", "scaling must be one of .*'none', 'model'.*'yarn'"),
        ("yarn:factor", "parameters are key=value, got 'factor'"),
        ("yarn:factor=fast", "'fast' is not a number"),
        ("yarn:bogus=1", "yarn"),
        ("none:factor=2", "'none' takes no parameters"),
        ("longrope", "needs the short and long factors .* has none \\(default\\)"),
        ("linear:factor=0.5", "factor"),
    ],
)
def test_a_bad_scaling_is_refused_by_name(text, match):
    with pytest.raises(ValueError, match=match):
        parse_scaling(text, context=8192, factor=4.0, own=OWN)


def test_a_scaling_must_be_a_str():
    with pytest.raises(TypeError, match="a scaling must be a str"):
        parse_scaling(4, context=8192, factor=4.0, own=OWN)


def test_every_registered_method_that_needs_only_a_factor_is_offered():
    for method, cls in ROPE_SCALING_SPECS.items():
        needed = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        if needed <= {"factor", "original_max_position_embeddings"}:
            parse_scaling(method, context=1024, factor=2.0, own=OWN)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("1x", 8192), ("2X", 16384), ("4×", 32768), ("0.5x", 4096), (3000, 3000), ("3000", 3000)],
)
def test_lengths_are_tokens_or_multiples_of_the_context(text, tokens):
    assert parse_length(text, 8192) == tokens


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("two", ValueError),
        ("0x", ValueError),
        (0, ValueError),
        (2.5, TypeError),
        ("-1", ValueError),
    ],
)
def test_a_bad_length_is_refused(text, error):
    with pytest.raises(error, match="length"):
        parse_length(text, 8192)


def _probe(**fields):
    base = {
        "model": "/models/a",
        "fingerprint": "f" * 16,
        "scaling": "yarn",
        "rope": {"rope_type": "yarn", "factor": 4.0},
        "task": "passkey",
        "length": 512,
        "depth": 0.5,
    }
    return Probe(**{**base, **fields})


def test_the_key_holds_what_decides_the_result_and_not_where_it_runs():
    probe = _probe()
    assert _probe(model="/elsewhere/a", device="cuda").key() == probe.key()
    for change in (
        {"fingerprint": "e" * 16},
        {"length": 513},
        {"depth": 0.25},
        {"trial": 1},
        {"rope": {"rope_type": "yarn", "factor": 2.0}},
        {"dtype": "bfloat16"},
    ):
        assert _probe(**change).key() != probe.key(), change
    assert Probe.from_dict(probe.to_dict()) == probe


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"task": "rouge"}, ValueError, "task must be one of"),
        ({"depth": 1.5}, ValueError, "depth must be in \\[0, 1\\]"),
        ({"depth": None}, TypeError, "depth must be a number"),
        ({"task": "perplexity"}, ValueError, "depth applies to passkey probes only"),
        ({"length": 0}, ValueError, "length"),
        ({"dtype": "float64"}, ValueError, "dtype must be one of"),
        ({"rope": "yarn"}, TypeError, "rope must be a scaling's dict"),
    ],
)
def test_a_bad_probe_is_refused(fields, error, match):
    with pytest.raises(error, match=match):
        _probe(**fields)
