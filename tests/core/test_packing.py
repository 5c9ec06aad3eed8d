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
