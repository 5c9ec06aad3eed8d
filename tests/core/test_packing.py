"""Position ids of packed and padded batches, against transformers' own code."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.core.packing import (
    positions_from_attention_mask,
    positions_from_cu_seqlens,
    positions_from_document_ids,
)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=6))
def test_packed_positions_equal_the_flattening_collator(lengths):
    """transformers' DataCollatorWithFlattening packs sequences into one row and returns
    its position_ids, cu_seq_lens and seq_idx: posenc gives the same positions from each."""
    collator = transformers.DataCollatorWithFlattening(
        return_flash_attn_kwargs=True, return_seq_idx=True, return_tensors="np"
    )
    features = [{"input_ids": list(range(2, 2 + n))} for n in lengths]
    batch = collator(features)
    expected = np.asarray(batch["position_ids"]).reshape(-1)
    np.testing.assert_array_equal(positions_from_cu_seqlens(batch["cu_seq_lens_q"]), expected)
    np.testing.assert_array_equal(
        positions_from_document_ids(np.asarray(batch["seq_idx"]).reshape(1, -1))[0], expected
    )


@settings(max_examples=60, deadline=None)
@given(
    pads=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    length=st.integers(1, 8),
)
def test_padded_positions_equal_generation(pads, length):
    """Left padding: transformers' generation computes ``cumsum(mask) - 1`` with padding
    set to 0; the same here for ints and bools."""
    seq = max(pads) + length
    mask = torch.tensor([[0] * p + [1] * (seq - p) for p in pads])
    expected = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    np.testing.assert_array_equal(positions_from_attention_mask(mask.numpy()), expected.numpy())
    np.testing.assert_array_equal(
        positions_from_attention_mask(mask.numpy().astype(bool)), expected.numpy()
    )


def test_document_ids_restart_at_every_change_in_each_row():
    ids = np.array([[4, 4, 1, 1, 1, 4], [0, 0, 0, 0, 0, 0]])
    assert positions_from_document_ids(ids).tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]
    assert positions_from_document_ids(np.array([3], np.uint8)).tolist() == [0]
    assert positions_from_cu_seqlens([0, 0, 2, 2]).tolist() == [0, 1]  # empty documents


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: positions_from_cu_seqlens([1, 3]), ValueError, "must start at 0"),
        (lambda: positions_from_cu_seqlens([0, 4, 2]), ValueError, "non-decreasing, got 4 then 2"),
        (lambda: positions_from_cu_seqlens([[0, 1]]), ValueError, "shape \\(n,\\)"),
        (lambda: positions_from_cu_seqlens([0.0, 1.5]), TypeError, "must hold integers"),
        (lambda: positions_from_document_ids(np.zeros((1, 2, 3), int)), ValueError, "shape"),
        (lambda: positions_from_document_ids("abc"), TypeError, "document_ids must hold integers"),
        (lambda: positions_from_attention_mask([[0, 2]]), ValueError, "0 and 1 only, got 2"),
        (lambda: positions_from_attention_mask([1, 1]), ValueError, "\\(batch, seq\\)"),
        (lambda: positions_from_attention_mask([[1, [2]]]), TypeError, "attention_mask must be"),
    ],
)  # fmt: skip
def test_bad_input_is_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_the_torch_and_jax_front_ends_give_the_cores_positions():
    from posenc.torch import positions_from_cu_seqlens as torch_cu
    from posenc.torch import positions_from_document_ids as torch_ids

    cu = torch.tensor([0, 3, 4], dtype=torch.int32)
    out = torch_cu(cu)
    assert out.dtype == torch.int64
    assert out.device == cu.device
    assert out.tolist() == positions_from_cu_seqlens([0, 3, 4]).tolist()
    assert torch_ids(torch.tensor([[2, 2, 9]])).tolist() == [[0, 1, 0]]
    with pytest.raises(TypeError, match="cu_seqlens must be a torch.Tensor"):
        torch_cu([0, 1])
    jax = pytest.importorskip("jax")
    from posenc.jax import positions_from_attention_mask as jax_mask

    mask = jax.numpy.array([[0, 1, 1], [1, 1, 1]])
    assert jax_mask(mask).tolist() == [[0, 0, 1], [0, 1, 2]]
    with pytest.raises(TypeError, match="attention_mask is traced"):
        jax.jit(jax_mask)(mask)


def test_the_keras_front_end_gives_the_cores_positions():
    keras = pytest.importorskip("keras")
    from posenc.keras import positions_from_cu_seqlens as keras_cu
    from posenc.keras import positions_from_document_ids as keras_ids

    out = keras_cu(keras.ops.convert_to_tensor(np.array([0, 3, 4])))
    assert keras.backend.standardize_dtype(out.dtype) == "int32"
    assert keras.ops.convert_to_numpy(out).tolist() == [0, 1, 2, 0]
    assert keras.ops.convert_to_numpy(keras_ids([[2, 2, 9]])).tolist() == [[0, 1, 0]]
    with pytest.raises(TypeError, match="cu_seqlens must be a tensor whose values are known"):
        keras_cu(keras.KerasTensor((3,), dtype="int32"))


def reference_rope_index(types, image_grids, video_grids, mask, merge):
    """transformers' Qwen2VLModel.get_rope_index, run on a stand-in for the model (it reads
    only the vision config's spatial_merge_size and its own get_vision_position_ids)."""
    import types as pytypes

    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    fake = pytypes.SimpleNamespace(
        config=pytypes.SimpleNamespace(
            vision_config=pytypes.SimpleNamespace(spatial_merge_size=merge)
        )
    )
    fake.get_vision_position_ids = pytypes.MethodType(Qwen2VLModel.get_vision_position_ids, fake)
    as_tensor = lambda a: None if a is None else torch.tensor(a)  # noqa: E731
    positions, deltas = Qwen2VLModel.get_rope_index(
        fake, torch.zeros_like(torch.tensor(types)), torch.tensor(types),
        image_grid_thw=as_tensor(image_grids), video_grid_thw=as_tensor(video_grids),
        attention_mask=as_tensor(mask),
    )  # fmt: skip
    return positions.numpy(), deltas.numpy()


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_mrope_positions_equal_qwen2_vl_get_rope_index(data):
    from posenc.core.packing import mrope_positions

    merge = data.draw(st.sampled_from([1, 2]), label="merge")
    rows, images, videos = [], [], []
    for _ in range(data.draw(st.integers(1, 3), label="batch")):
        row = []
        for _ in range(data.draw(st.integers(1, 4), label="runs")):
            kind = data.draw(st.sampled_from([0, 1, 2]), label="kind")
            if kind == 0 or (row and row[-1] == kind):
                row += [0] * data.draw(st.integers(1, 3), label="text")
                continue
            grid = [data.draw(st.integers(1, 3)), merge * data.draw(st.integers(1, 3)),
                    merge * data.draw(st.integers(1, 3))]  # fmt: skip
            (images if kind == 1 else videos).append(grid)
            row += [kind] * (grid[0] * grid[1] * grid[2] // merge**2)
        rows.append(row)
    seq = max(len(r) for r in rows)
    pad = [seq - len(r) for r in rows]
    types = [[0] * p + r for p, r in zip(pad, rows, strict=True)]  # left padding
    mask = [[0] * p + [1] * len(r) for p, r in zip(pad, rows, strict=True)]
    expected = reference_rope_index(types, images or None, videos or None, mask, merge)
    mine = mrope_positions(types, image_grids=images or None, video_grids=videos or None,
                           spatial_merge_size=merge, attention_mask=mask)  # fmt: skip
    np.testing.assert_array_equal(mine[0], expected[0])
    np.testing.assert_array_equal(mine[1], expected[1])


def test_mrope_positions_name_what_does_not_fit():
    from posenc.core.packing import mrope_positions

    with pytest.raises(ValueError, match="run of 3 image tokens does not match its grid"):
        mrope_positions([[0, 1, 1, 1]], image_grids=[[1, 4, 4]])
    with pytest.raises(ValueError, match="0 x 0 x 0 tokens with spatial_merge_size=2"):
        mrope_positions([[1, 1]])
    with pytest.raises(ValueError, match="multiples of spatial_merge_size=2"):
        mrope_positions([[1]], image_grids=[[1, 1, 1]])
    with pytest.raises(ValueError, match="0 \\(text\\), 1 \\(image\\) and 2 \\(video\\)"):
        mrope_positions([[3]])
