"""The planner: one decision per call, the same for every front end (posenc.core.plan)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc.core.plan import (
    INDEX_RANGES,
    CallPlan,
    RowsPlan,
    ScalingPlan,
    align_queries,
    plan_call,
    plan_index,
    plan_rows,
    plan_scaling,
    table_format,
)
from posenc.core.positions import grown_length

# --- queries and keys --------------------------------------------------------------------


def test_without_an_offset_the_queries_are_the_last_of_the_keys():
    assert align_queries(2, 5) == (2, 5, 3)  # a KV cache of 3, 2 new tokens
    assert align_queries(4) == (4, 4, 0)
    assert align_queries(4, 4) == (4, 4, 0)
    assert align_queries(3, 0) == (3, 0, 0)  # no keys: nothing to place
    assert align_queries(2, 5, 0) == (2, 5, 0)  # an explicit offset is kept
    assert align_queries(1, None, 7) == (1, 8, 7)
    with pytest.raises(ValueError, match=r"query_length=5 > key_length=2 with no offset"):
        align_queries(5, 2)
    with pytest.raises(ValueError, match=r"start_index must be an int >= 0, got -1"):
        align_queries(1, 2, -1, offset_name="start_index")
    # keys 0 .. 2**53: the last one is at the boundary, which is valid; one more is not
    assert align_queries(1, 2**53 + 1) == (1, 2**53 + 1, 2**53)
    with pytest.raises(
        ValueError, match=r"positions must lie within ±2\*\*53 .* got 9007199254740993"
    ):
        align_queries(1, 2**53 + 2)
    with pytest.raises(
        ValueError,
        match=r"positions must lie within ±2\*\*53 .* offset=2\*\*53|got 9007199254740993",
    ):
        align_queries(2, None, 2**53)


def test_a_bias_without_an_offset_is_the_last_rows_of_the_square_one():
    # Closed form: the rows of queries K-Q .. K-1 of the (K, K) bias, for every scheme of
    # the NumPy core that takes query and key lengths.
    weights = np.random.default_rng(0).standard_normal((16, 2))
    for q, k in ((1, 6), (2, 5), (5, 5)):
        full, part = posenc.alibi_bias(k, num_heads=3), posenc.alibi_bias(q, k, num_heads=3)
        np.testing.assert_array_equal(part, full[:, k - q :])
        full, part = (
            posenc.t5_bias(weights, k, max_distance=20),
            posenc.t5_bias(weights, q, k, max_distance=20),
        )
        np.testing.assert_array_equal(part, full[:, k - q :])
        full = posenc.sandwich_bias(k, num_heads=2, dim=4)
        np.testing.assert_array_equal(
            posenc.sandwich_bias(q, k, num_heads=2, dim=4), full[:, k - q :]
        )
        np.testing.assert_array_equal(
            posenc.relative_positions(q, k), posenc.relative_positions(k)[k - q :]
        )


# --- length-dependent scalings -----------------------------------------------------------

DYNAMIC = posenc.DynamicNTKScaling(factor=2.0, original_max_position_embeddings=8)
LONGROPE = posenc.LongRopeScaling(
    short_factor=[1.0, 2.0], long_factor=[4.0, 8.0], original_max_position_embeddings=8, factor=4.0
)


def test_a_scaling_sees_the_calls_own_length():
    assert plan_scaling(posenc.LinearScaling(factor=2.0), 100) == ScalingPlan()
    assert plan_scaling(posenc.LinearScaling(factor=2.0), None) == ScalingPlan()
    assert [plan_scaling(DYNAMIC, n).seq_len for n in (1, 8, 9, 20, 12)] == [None, None, 9, 20, 12]
    assert [plan_scaling(LONGROPE, n).seq_len for n in (1, 8, 9, 20)] == [None, None, 9, 9]


def test_a_traced_length_selects_between_two_sets_or_refuses():
    assert plan_scaling(LONGROPE, None) == ScalingPlan(switch=8)
    with pytest.raises(ValueError, match=r"'dynamic_ntk'.*known only inside a trace.*'ntk'"):
        plan_scaling(DYNAMIC, None, name="X: ")


def test_table_formats():
    for fmt in ("float16", "bfloat16", "float32", "float64"):
        assert table_format(fmt, "input") == fmt
        assert table_format(fmt, "rotation") == ("float64" if fmt == "float64" else "float32")


# --- rows of a known call ----------------------------------------------------------------


def test_rows_of_a_known_call_follow_the_out_of_range_policy():
    assert plan_rows(8, start=2, count=4) == RowsPlan("slice", 2, 6)
    assert plan_rows(8, start=6, count=4) == RowsPlan("grow", 6, 10)
    assert plan_rows(8, start=16, count=1) == RowsPlan("grow", 16, 17)  # within twice
    assert plan_rows(8, start=17, count=1) == RowsPlan("direct", 17, 18)  # farther
    assert plan_rows(8, start=6, count=4, past="compute") == RowsPlan("direct", 6, 10)
    assert plan_rows(8, start=6, count=4, past="refuse") == RowsPlan("refuse", 6, 10)
    assert plan_rows(8, low=0, high=7, count=8) == RowsPlan("gather", 0, 8)
    assert plan_rows(8, low=3, high=9, count=2) == RowsPlan("grow", 3, 10)
    assert plan_rows(8, low=30, high=31, count=2) == RowsPlan("direct", 30, 32)
    # two far-apart positions read two rows: no growth to the farther one
    assert plan_rows(256, low=0, high=3_000_000, count=2) == RowsPlan("direct", 0, 3_000_001)
    assert plan_rows(8, low=0, high=20, count=5) == RowsPlan("grow", 0, 21)  # 21 - 5 <= 16
    assert plan_rows(8, low=0, high=21, count=5) == RowsPlan("direct", 0, 22)  # 22 - 5 > 16
    assert plan_rows(8, low=-1, high=3, count=5) == RowsPlan("direct", -1, 4)  # NumPy/JAX
    with pytest.raises(TypeError, match="a call with positions gives count"):
        plan_rows(8, low=0, high=3)
    assert plan_rows(8, start=5, count=0) == RowsPlan("slice", 5, 5)
    assert plan_rows(8).action == "gather"  # no positions


@given(
    rows=st.integers(1, 4096),
    positions=st.lists(st.integers(0, 100_000), min_size=1, max_size=64),
)
def test_growth_is_bounded_by_the_table_and_the_calls_length(rows, positions):
    # Any set of positions (repeats, gaps, far ones): a table grows to at most twice itself
    # plus the call's length (posenc.core.positions.grown_length of the planned end), and a
    # call that reads every row it would add (a run from inside the table) always grows.
    plan = plan_rows(rows, low=min(positions), high=max(positions), count=len(positions))
    if plan.action == "grow":
        assert grown_length(plan.end, rows) <= 2 * rows + len(positions)
    else:
        assert plan.action in ("gather", "direct")
        assert plan.action == "gather" or max(positions) + 1 - len(positions) > 2 * rows
    run = list(range(min(positions), max(positions) + 1))
    if run[0] <= rows < run[-1] + 1:  # a run past the table from inside it
        planned = plan_rows(rows, low=run[0], high=run[-1], count=len(run))
        assert planned.action == "grow"


# --- one call: every decision together ---------------------------------------------------

FIXED = ScalingPlan()


def test_a_call_with_a_fixed_scaling_reads_the_rows_the_policy_says():
    linear = posenc.LinearScaling(factor=2.0)
    # a prompt inside the table; a decoding step; past it (grow); far past it (direct)
    assert plan_call(8, start=0, count=5, scaling=linear) == CallPlan(
        "float32", 5, FIXED, "tables", RowsPlan("slice", 0, 5)
    )
    assert plan_call(8, start=7, count=1) == CallPlan(
        "float32", 8, FIXED, "tables", RowsPlan("slice", 7, 8)
    )
    assert plan_call(8, start=6, count=4).rows == RowsPlan("grow", 6, 10)
    assert plan_call(8, start=17, count=1).rows == RowsPlan("direct", 17, 18)
    assert plan_call(8, start=6, count=4, past="compute").rows == RowsPlan("direct", 6, 10)
    assert plan_call(8, start=6, count=4, past="refuse").rows == RowsPlan("refuse", 6, 10)
    # gathered positions: their largest + 1 is the call's length; none: length 0
    assert plan_call(8, low=3, high=6, count=2) == CallPlan(
        "float32", 7, FIXED, "tables", RowsPlan("gather", 3, 7)
    )
    assert plan_call(8, low=0, high=-1, count=0) == CallPlan(
        "float32", 0, FIXED, "tables", RowsPlan("gather", 0, 0)
    )
    assert plan_call(8, count=0).rows == RowsPlan("gather", 0, 0)
    # traced positions: no rows to plan (gathered with NaN outside), no length
    assert plan_call(8, traced=True) == CallPlan("float32", None, FIXED, "tables", None)
    with pytest.raises(TypeError, match="a call with positions gives count"):
        plan_call(8, start=0)


def test_a_call_reads_its_rows_in_the_tables_format():
    for fmt in ("float16", "bfloat16", "float32", "float64"):
        rotation = plan_call(8, start=0, count=1, fmt=fmt).fmt
        assert rotation == ("float64" if fmt == "float64" else "float32")
        assert plan_call(8, start=0, count=1, fmt=fmt, kind="input").fmt == fmt


def test_a_given_length_is_what_a_scaling_sees_and_must_count_the_calls_own():
    # a KV cache's length: the largest position of every key attended + 1
    assert plan_call(64, start=2, count=1, length=32, scaling=DYNAMIC) == CallPlan(
        "float32", 32, ScalingPlan(seq_len=32), "core", None
    )
    assert plan_call(64, start=2, count=1, length=32).length == 32  # fixed: checked only
    with pytest.raises(ValueError, match=r"X: length=3 is shorter .* \(5: its largest"):
        plan_call(64, start=2, count=3, length=3, name="X: ")
    with pytest.raises(ValueError, match=r"length=9 is for calls whose positions are known"):
        plan_call(64, traced=True, length=9)


def test_a_length_dependent_scaling_with_a_known_length():
    # dynamic NTK: the construction frequencies up to its original length (8), else the
    # call's own rows from the core at L, never a table of L's frequencies
    assert plan_call(64, start=0, count=8, scaling=DYNAMIC) == CallPlan(
        "float32", 8, FIXED, "tables", RowsPlan("slice", 0, 8)
    )
    assert plan_call(64, low=0, high=19, count=3, scaling=DYNAMIC) == CallPlan(
        "float32", 20, ScalingPlan(seq_len=20), "core", None
    )
    # LongRoPE: past its switch, the table of the second set (seq_len = switch + 1)
    assert plan_call(64, start=5, count=10, scaling=LONGROPE) == CallPlan(
        "float32", 15, ScalingPlan(seq_len=9), "tables", RowsPlan("slice", 5, 15)
    )
    assert plan_call(64, start=0, count=8, scaling=LONGROPE).scaling == FIXED
    # code that cannot run the core (compiled PyTorch): L's frequencies from those kept
    # per length where the front end keeps them, else an error naming the scaling
    assert plan_call(64, start=0, count=20, scaling=DYNAMIC, past="refuse", by_length=True) == (
        CallPlan("float32", 20, ScalingPlan(seq_len=20), "by_length", None)
    )
    with pytest.raises(ValueError, match=r"'dynamic_ntk' needs the frequencies of length 20"):
        plan_call(64, start=0, count=20, scaling=DYNAMIC, past="refuse")


def test_a_traced_length_is_selected_in_the_graph_or_refused_by_the_front_ends_choice():
    # by_length: the one difference between the front ends' plans (PyTorch keeps the
    # frequencies of every length; Keras and JAX refuse dynamic NTK for a traced length)
    assert plan_call(64, traced=True, scaling=DYNAMIC, by_length=True) == CallPlan(
        "float32", None, ScalingPlan(by_length=True), "by_length", None
    )
    with pytest.raises(ValueError, match=r"'dynamic_ntk'.*known only inside a trace.*'ntk'"):
        plan_call(64, traced=True, scaling=DYNAMIC)
    for by_length in (False, True):  # two sets: both tables, selected in the graph
        assert plan_call(64, traced=True, scaling=LONGROPE, by_length=by_length) == CallPlan(
            "float32", None, ScalingPlan(switch=8), "tables", None
        )


def test_only_a_plain_read_of_the_first_table_is_in_table():
    assert plan_call(8, start=7, count=1).in_table
    assert plan_call(8, low=0, high=7, count=3, scaling=LONGROPE).in_table  # short set
    assert not plan_call(8, start=7, count=2).in_table  # grow
    assert not plan_call(8, traced=True).in_table
    assert not plan_call(64, start=0, count=9, scaling=LONGROPE).in_table  # the long table
    assert not plan_call(64, start=0, count=9, scaling=DYNAMIC).in_table  # the core's rows


@given(
    rows=st.integers(1, 64),
    start=st.integers(0, 200),
    count=st.integers(0, 40),
    length=st.one_of(st.none(), st.integers(240, 300)),
    past=st.sampled_from(["grow", "compute", "refuse"]),
    scaling=st.sampled_from([None, DYNAMIC, LONGROPE]),
)
def test_a_call_plan_is_its_building_blocks_answers(rows, start, count, length, past, scaling):
    # Property: plan_call decides nothing of its own beyond choosing among the building
    # blocks' answers (check_scaling_length, plan_scaling, plan_rows, table_format).
    # (A given length is drawn at least the call's own: 240 >= 200 + 40.)
    plan = plan_call(
        rows, start=start, count=count, length=length, scaling=scaling, past=past, by_length=True
    )
    seen = start + count if length is None else length
    assert plan.length == seen
    assert plan.scaling == (FIXED if scaling is None else plan_scaling(scaling, seen))
    if plan.source == "tables":
        assert plan.rows == plan_rows(rows, start=start, count=count, past=past)
    else:
        assert scaling is DYNAMIC
        assert seen > 8
        assert plan.rows is None
        assert plan.source == ("by_length" if past == "refuse" else "core")


# --- traced indices ----------------------------------------------------------------------


def _planned(values: np.ndarray, dtype: str, rows: int, wide: str) -> np.ndarray:
    """Which values the plan's conversion and bounds call valid, carried out in NumPy."""
    plan = plan_index(dtype, rows, wide=wide)
    index = values.astype(dtype)
    if plan.clip is not None:
        low, high = plan.clip
        index = np.clip(index, np.array(low, dtype), np.array(high, dtype))
    index = index.astype(plan.dtype)
    return (index >= 0) & (index < plan.rows)


@given(
    dtype=st.sampled_from(sorted(INDEX_RANGES)),
    wide=st.sampled_from(["int32", "int64"]),
    rows=st.integers(1, 2**31 - 1),
    data=st.data(),
)
def test_a_traced_position_of_any_dtype_is_valid_exactly_when_it_is_in_the_table(
    dtype, wide, rows, data
):
    low, high = INDEX_RANGES[dtype]
    values = data.draw(st.lists(st.integers(low, high), min_size=1, max_size=8))
    valid = _planned(np.array(values, dtype=object), dtype, rows, wide)
    np.testing.assert_array_equal(valid, [0 <= v < rows for v in values])


def test_index_plans_say_when_a_cast_needs_saturating():
    assert plan_index("int8", 300, wide="int32").clip is None
    assert plan_index("uint32", 10, wide="int32").clip == (0, 2**31 - 1)
    assert plan_index("int64", 10, wide="int32").clip == (-(2**31), 2**31 - 1)
    assert plan_index("uint64", 10, wide="int64").clip == (0, 2**63 - 1)
    with pytest.raises(TypeError, match="integer dtype.*float32"):
        plan_index("float32", 10, wide="int64")
    with pytest.raises(ValueError, match="cannot be indexed with int32"):
        plan_index("int8", 2**31, wide="int32")
