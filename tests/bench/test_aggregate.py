"""Intervals over seeds and resolved differences, against scipy's t distribution and
paired t-test."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.bench.aggregate import aggregate, resolved, t_quantile

stats = pytest.importorskip("scipy.stats")


def rows(a, b, metric="exact_match"):
    seeds = list(range(len(a)))
    return ({"seeds": seeds, metric: {"values": list(a)}},
            {"seeds": seeds, metric: {"values": list(b)}})  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=2, max_size=8).filter(
        lambda pairs: np.std([x - y for x, y in pairs]) > 1e-6
    )
)
def test_resolved_is_the_paired_t_test_at_5_percent(pairs):
    a, b = zip(*pairs, strict=True)
    p = stats.ttest_rel(a, b).pvalue
    if abs(p - 0.05) < 1e-9:  # on the boundary either answer is right
        return
    assert resolved(*rows(a, b), "exact_match") == (p < 0.05)


def test_resolved_needs_two_paired_seeds():
    a = {"seeds": [0, 1], "loss": {"values": [1.0, None]}}
    b = {"seeds": [0, 1], "loss": {"values": [2.0, 3.0]}}
    assert resolved(a, b, "loss") is None
    c = {"seeds": [1, 2], "loss": {"values": [2.0, 3.0]}}
    assert resolved(b, c, "loss") is None  # one seed in common


def test_t_quantiles_are_scipys():
    for df in (1, 2, 4, 9, 30, 1000):
        assert t_quantile(df) == stats.t.ppf(0.975, df)
    assert round(t_quantile(1), 3) == 12.706


def test_intervals_in_the_aggregate_contain_the_mean_at_the_t_width():
    values = [0.2, 0.5, 0.9, 0.4, 0.6]
    spec = {"task": "copy", "scheme": "rope", "train_lengths": [4, 16]}
    records = [{"key": str(s), "spec": {**spec, "seed": s},
                "results": [{"variant": "rope", "length": 8, "exact_match": v}]}
               for s, v in enumerate(values)]  # fmt: skip
    [row] = aggregate(records)
    low, high = stats.t.interval(0.95, 4, loc=np.mean(values), scale=stats.sem(values))
    assert row["exact_match"]["ci"] == pytest.approx([low, high], rel=1e-12)
    assert row["exact_match"]["values"] == values


def test_markdown_bolds_the_best_and_the_variants_the_seeds_cannot_tell_from_it():
    from posenc.bench.report import markdown

    spec = {"task": "copy", "train_lengths": [4, 16]}
    scores = {"rope": [0.9, 0.8, 0.85], "alibi": [0.5, 0.45, 0.55], "t5": [0.95, 0.2, 0.5]}
    records = [{"key": f"{scheme}{s}", "spec": {**spec, "scheme": scheme, "seed": s},
                "results": [{"variant": scheme, "length": 8, "exact_match": v}]}
               for scheme, values in scores.items() for s, v in enumerate(values)]  # fmt: skip
    lines = {line.split(" |")[0][2:]: line for line in markdown(records).splitlines()
             if line.startswith("| ") and "variant" not in line}  # fmt: skip
    assert "**0.850" in lines["rope"]  # the best
    assert "**" not in lines["alibi"]  # resolved below it: paired differences 0.4, 0.35, 0.3
    assert "**0.550" in lines["t5"]  # differences -0.05, 0.6, 0.35: not resolved
