"""Mask descriptions and the tiles they leave: posenc.core.masks against the dense masks
written out element by element."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.core.masks import (
    EMPTY,
    FULL,
    PARTIAL,
    AllKeys,
    Causal,
    Documents,
    Window,
    block_classes,
    check_call,
    segments_from_cu_seqlens,
    segments_from_document_ids,
)
from posenc.core.packing import positions_from_document_ids


def dense(mask, queries, keys):
    """The mask written out: True where query q (index keys - queries + q) sees key j."""
    i = (keys - queries + np.arange(queries))[:, None]
    j = np.arange(keys)[None, :]
    if isinstance(mask, AllKeys):
        return np.ones((1, queries, keys), dtype=bool)
    if isinstance(mask, Causal):
        return (j <= i)[None]
    if isinstance(mask, Window):
        return ((np.abs(i - j) < mask.window) | (j < mask.sinks))[None]
    if isinstance(mask, Documents):
        seg = mask.segments
        return seg[:, i[:, 0]][:, :, None] == seg[:, None, :]
    parts = [dense(part, queries, keys) for part in mask.parts]
    combine = np.logical_and if type(mask).__name__ == "AllOf" else np.logical_or
    result = parts[0]
    for part in parts[1:]:
        result = combine(result, part)
    return result


def tiles_of(allowed, qb, kb):
    """The exact class of every tile of a dense mask (tiles past the end never full)."""
    batch, queries, keys = allowed.shape
    nq, nk = -(-queries // qb), -(-keys // kb)
    padded = np.zeros((batch, nq * qb, nk * kb), dtype=bool)
    padded[:, :queries, :keys] = allowed
    blocks = padded.reshape(batch, nq, qb, nk, kb)
    count = blocks.sum(axis=(2, 4))
    return np.where(count == qb * kb, FULL, np.where(count == 0, EMPTY, PARTIAL))


def documents_from(lengths):
    return Documents(segments_from_document_ids(np.repeat(np.arange(len(lengths)), lengths)))


def test_segments_number_runs_of_ids_and_sequences():
    ids = np.array([[3, 3, 5, 5, 5, 3], [1, 1, 1, 1, 2, 2]])
    assert segments_from_document_ids(ids).tolist() == [[0, 0, 1, 1, 1, 2], [0, 0, 0, 0, 1, 1]]
    # a new number where positions restart: the packing helpers' reading of the ids
    restarts = positions_from_document_ids(ids) == 0
    assert np.array_equal(segments_from_document_ids(ids), np.cumsum(restarts, axis=1) - 1)
    assert segments_from_cu_seqlens([0, 3, 3, 4, 6]).tolist() == [0, 0, 0, 1, 2, 2]


@pytest.mark.parametrize(("queries", "keys"), [(1, 1), (5, 5), (1, 9), (4, 11), (16, 16), (7, 30)])
@pytest.mark.parametrize("blocks", [(1, 1), (2, 3), (4, 4), (8, 2)])
def test_single_masks_classify_every_tile_exactly(queries, keys, blocks):
    for mask in (AllKeys(), Causal(), Window(3), documents_from([2, 9, 1, 4, 14])):
        if isinstance(mask, Documents):
            mask = Documents(mask.segments[:, :keys])
        got = block_classes(mask, queries, keys, query_block=blocks[0], key_block=blocks[1])
        want = tiles_of(dense(mask, queries, keys), *blocks)
        assert np.array_equal(got, want), mask


@settings(max_examples=150, deadline=None)
@given(
    queries=st.integers(1, 24),
    extra=st.integers(0, 20),
    qb=st.integers(1, 6),
    kb=st.integers(1, 6),
    window=st.integers(1, 12),
    sinks=st.integers(0, 4),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    how=st.sampled_from(["and", "or"]),
)
def test_combined_masks_never_call_a_tile_full_or_empty_wrongly(
    queries, extra, qb, kb, window, sinks, lengths, how
):
    keys = queries + extra
    lengths = [*lengths, keys]  # documents covering every key
    docs = Documents(documents_from(lengths).segments[:, :keys])
    mask = Causal() & Window(window, sinks) & docs
    if how == "or":
        mask = (Causal() & Window(window)) | docs
    got = block_classes(mask, queries, keys, query_block=qb, key_block=kb)
    exact = tiles_of(dense(mask, queries, keys), qb, kb)
    assert np.all((got == exact) | (got == PARTIAL)), "a tile called full or empty is not"


def test_documents_with_a_batch_classify_each_row():
    segments = np.stack([np.repeat([0, 1], [4, 4]), np.repeat([0, 1, 2], [2, 2, 4])])
    mask = Documents(segments)
    got = block_classes(mask, 8, 8, query_block=2, key_block=2)
    assert got.shape == (2, 4, 4)
    assert np.array_equal(got, tiles_of(dense(mask, 8, 8), 2, 2))


def test_bad_masks_are_refused_by_name():
    with pytest.raises(ValueError, match="window must be an int >= 1, got 0"):
        Window(0)
    with pytest.raises(ValueError, match="sinks must be an int >= 0"):
        Window(4, -1)
    with pytest.raises(ValueError, match="non-decreasing"):
        Documents(np.array([0, 1, 0]))
    with pytest.raises(TypeError, match="combines with & only with another mask"):
        Causal() & np.ones(3)
    with pytest.raises(ValueError, match="the documents cover 3 keys, the attention has 5"):
        block_classes(Documents(np.array([0, 0, 1])), 5, 5)
    with pytest.raises(ValueError, match="keys must be at least queries .* 3 keys for 4 queries"):
        block_classes(Causal(), 4, 3)


@pytest.mark.parametrize(
    ("mask", "keys", "covered"),
    [
        (Documents(np.array([0, 0, 1])), 5, 3),  # keys past the last document
        (Documents(np.array([0, 0, 1, 1, 2, 2])), 3, 6),  # ids for keys that are not there
        (Documents(segments_from_cu_seqlens([0, 2, 3])), 6, 3),
        (Causal() & Documents(np.array([0, 0, 1])), 5, 3),  # inside a combination
        (Window(2) | (Causal() & Documents(np.array([[0, 1], [0, 0]]))), 3, 2),
    ],
)
def test_documents_must_cover_every_key_on_every_path(mask, keys, covered):
    """One check (check_call), which block_classes and the front ends' dense masks and
    mask functions pass: documents of other keys than the attention's are refused."""
    message = f"the documents cover {covered} keys, the attention has {keys}"
    with pytest.raises(ValueError, match=message):
        check_call(mask, 1, keys)
    with pytest.raises(ValueError, match=message):
        block_classes(mask, 1, keys)


def test_a_call_is_checked_in_the_callers_names():
    assert check_call(Causal() & Documents(np.array([0, 1, 1])), 2, 3) == (2, 3)
    assert check_call(Causal(), np.int8(2), np.uint64(3)) == (2, 3)
    names = ("query_length", "key_length")
    with pytest.raises(ValueError, match="key_length must be at least query_length"):
        check_call(Causal(), 5, 3, names=names)
    with pytest.raises(ValueError, match="query_length must be an int >= 1, got 0"):
        check_call(Causal(), 0, 3, names=names)
    with pytest.raises(TypeError, match=r"mask must be a posenc mask \(causal\(\)"):
        check_call(np.ones((3, 3), dtype=bool), 3, 3)


def test_empty_documents_and_windows_past_int64_are_refused():
    for segments in (segments_from_document_ids([]), segments_from_cu_seqlens([0]),
                     np.zeros((0, 4), dtype=np.int64)):  # fmt: skip
        with pytest.raises(ValueError, match="documents need at least one key"):
            Documents(segments)
    widest = 2**63 - 1  # int64's largest: every key of any attention
    for mask in (Window(widest), Window(1, widest)):
        got = block_classes(mask, 3, 3, query_block=1, key_block=1)
        assert np.array_equal(got, np.full((1, 3, 3), FULL))
    with pytest.raises(ValueError, match="window must be at most 9223372036854775807, got 9"):
        Window(2**63)
    with pytest.raises(ValueError, match="sinks must be at most 9223372036854775807"):
        Window(1, 10**400)
