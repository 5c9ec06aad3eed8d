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


def reference_rope_index(model, types, images, videos, mask, merge, seconds=None, rate=None):
    """transformers' get_rope_index of Qwen2-VL, Qwen2.5-VL or Qwen3-VL, run on a stand-in
    for the model (it reads only the vision config and its own get_vision_position_ids)."""
    import types as pytypes

    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    cls = {"qwen2-vl": Qwen2VLModel, "qwen2.5-vl": Qwen2_5_VLModel, "qwen3-vl": Qwen3VLModel}
    cls = cls[model]
    vision = pytypes.SimpleNamespace(spatial_merge_size=merge, tokens_per_second=rate)
    fake = pytypes.SimpleNamespace(config=pytypes.SimpleNamespace(vision_config=vision))
    fake.get_vision_position_ids = pytypes.MethodType(cls.get_vision_position_ids, fake)
    as_tensor = lambda a: None if a is None else torch.tensor(a)  # noqa: E731
    extra = {} if model != "qwen2.5-vl" else {"second_per_grid_ts": seconds}
    positions, deltas = cls.get_rope_index(
        fake, torch.zeros_like(torch.tensor(types)), torch.tensor(types),
        image_grid_thw=as_tensor(images), video_grid_thw=as_tensor(videos),
        attention_mask=as_tensor(mask), **extra,
    )  # fmt: skip
    return positions.numpy(), deltas.numpy()


@settings(max_examples=25, deadline=None)
@given(data=st.data(), model=st.sampled_from(["qwen2-vl", "qwen2.5-vl", "qwen3-vl"]))
def test_mrope_positions_equal_the_qwen_vl_get_rope_index(data, model):
    """Images, videos and text in left-padded rows; Qwen2.5-VL's video time steps from
    float32 or float64 seconds; Qwen3-VL's frames each a run, text between them."""
    from posenc.core.packing import mrope_positions

    merge = data.draw(st.sampled_from([1, 2]), label="merge")
    rows, images, videos = [], [], []
    for _ in range(data.draw(st.integers(1, 3), label="batch")):
        row = []
        for _ in range(data.draw(st.integers(1, 4), label="runs")):
            kind = data.draw(st.sampled_from([0, 1, 2]), label="kind")
            if kind == 0 or (row and row[-1] != 0):
                row += [0] * data.draw(st.integers(1, 3), label="text")
                continue
            grid = [data.draw(st.integers(1, 3)), merge * data.draw(st.integers(1, 3)),
                    merge * data.draw(st.integers(1, 3))]  # fmt: skip
            (images if kind == 1 else videos).append(grid)
            frame = [kind] * (grid[1] * grid[2] // merge**2)
            if kind == 2 and model == "qwen3-vl":  # a timestamp (text) before each frame
                for _ in range(grid[0]):
                    row += [0, *frame]
            else:
                row += frame * grid[0]
        rows.append(row)
    seq = max(len(r) for r in rows)
    pad = [seq - len(r) for r in rows]
    types = [[0] * p + r for p, r in zip(pad, rows, strict=True)]  # left padding
    mask = [[0] * p + [1] * len(r) for p, r in zip(pad, rows, strict=True)]
    options, seconds, rate = {}, None, None
    if model == "qwen2.5-vl":
        rate = data.draw(st.sampled_from([2, 4, 25]), label="tokens_per_second")
        wide = data.draw(st.booleans(), label="float64")
        seconds = np.array(
            data.draw(st.lists(st.floats(0, 3, width=64 if wide else 32),
                               min_size=len(videos), max_size=len(videos)), label="seconds"),
            dtype=np.float64 if wide else np.float32,
        )  # fmt: skip
        options = {"tokens_per_second": rate, "second_per_grid_ts": seconds}
    elif model == "qwen3-vl":
        options = {"split_video_frames": True}
    expected = reference_rope_index(
        model, types, images or None, videos or None, mask, merge,
        None if seconds is None else torch.from_numpy(seconds), rate,
    )  # fmt: skip
    mine = mrope_positions(types, image_grids=images or None, video_grids=videos or None,
                           spatial_merge_size=merge, attention_mask=mask, **options)  # fmt: skip
    np.testing.assert_array_equal(mine[0], expected[0])
    np.testing.assert_array_equal(mine[1], expected[1])


def test_qwen2_5_vl_time_steps_round_as_the_reference():
    """⌊t · 25 · s⌋ for s = 2/3 (a video at 3 frames per second, temporal patch 2): at
    t = 3 the float32 product rounds to 50, the float64 one to 49.99999999999999; and the
    default of 1 second."""
    from posenc.core.packing import mrope_positions

    types = [[2] * 4]
    for seconds, times in [
        (np.array([2 / 3], np.float32), [0, 16, 33, 50]),
        (np.array([2 / 3], np.float64), [0, 16, 33, 49]),
        ([2 / 3], [0, 16, 33, 50]),  # a list: float32, as torch.tensor makes it
        (None, [0, 25, 50, 75]),
    ]:
        mine, _ = mrope_positions(types, video_grids=[[4, 1, 1]], spatial_merge_size=1,
                                  tokens_per_second=25, second_per_grid_ts=seconds)  # fmt: skip
        reference = None if seconds is None else torch.tensor(seconds)
        theirs, _ = reference_rope_index("qwen2.5-vl", types, None, [[4, 1, 1]], None, 1,
                                         reference, 25)  # fmt: skip
        np.testing.assert_array_equal(mine, theirs)
        assert mine[0, 0].tolist() == times


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
    with pytest.raises(ValueError, match="second_per_grid_ts needs tokens_per_second"):
        mrope_positions([[2]], video_grids=[[1, 2, 2]], second_per_grid_ts=[1.0])
    with pytest.raises(ValueError, match="must have shape \\(1,\\), one per video"):
        mrope_positions([[2]], video_grids=[[1, 2, 2]], tokens_per_second=2,
                        second_per_grid_ts=[1.0, 2.0])  # fmt: skip
    with pytest.raises(ValueError, match="finite seconds >= 0"):
        mrope_positions([[2]], video_grids=[[1, 2, 2]], tokens_per_second=2,
                        second_per_grid_ts=[float("nan")])  # fmt: skip
    with pytest.raises(TypeError, match="tokens_per_second must be a finite real number > 0"):
        mrope_positions([[0]], tokens_per_second="25")
    with pytest.raises(TypeError, match="split_video_frames must be a bool"):
        mrope_positions([[0]], split_video_frames=1)
    with pytest.raises(ValueError, match="time positions reach 1e\\+300"):
        mrope_positions([[2, 2]], video_grids=[[2, 2, 2]], tokens_per_second=1e300,
                        second_per_grid_ts=np.array([1.0]))  # fmt: skip
    with pytest.raises(ValueError, match="run of 2 video tokens does not match its grid"):
        mrope_positions([[2, 2]], video_grids=[[2, 2, 2]], split_video_frames=True)


def test_the_front_ends_give_the_cores_mrope_positions():
    """torch (int64 on the input's device), JAX and Keras (int32) wrappers: the core's
    positions and deltas for Qwen2.5-VL's float64 seconds as tensors of each framework."""
    from posenc.core.packing import mrope_positions
    from posenc.torch import mrope_positions as torch_mrope

    types = [[0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 0], [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]]
    mask = [[1] * 11, [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]
    grids = {"video_grids": [[2, 4, 4]], "image_grids": [[1, 4, 4]]}
    seconds = np.array([2 / 3])
    core = mrope_positions(types, **grids, tokens_per_second=25, second_per_grid_ts=seconds,
                           attention_mask=mask)  # fmt: skip
    assert core[0][0, 0].tolist() == [0, 1, 2, 2, 2, 2, 18, 18, 18, 18, 4]

    out = torch_mrope(torch.tensor(types), attention_mask=torch.tensor(mask),
                      video_grids=torch.tensor(grids["video_grids"]),
                      image_grids=grids["image_grids"], tokens_per_second=25,
                      second_per_grid_ts=torch.from_numpy(seconds))  # fmt: skip
    for mine, theirs in zip(out, core, strict=True):
        assert mine.dtype == torch.int64
        assert mine.tolist() == theirs.tolist()
    with pytest.raises(TypeError, match="token_types must be a torch.Tensor"):
        torch_mrope(types)
    jax = pytest.importorskip("jax")
    from posenc.jax import mrope_positions as jax_mrope

    out = jax_mrope(jax.numpy.array(types), attention_mask=jax.numpy.array(mask), **grids,
                    tokens_per_second=25, second_per_grid_ts=seconds)  # fmt: skip
    assert [a.tolist() for a in out] == [a.tolist() for a in core]
    with pytest.raises(TypeError, match="video_grids is traced"):
        jax.jit(lambda g: jax_mrope(np.array(types), video_grids=g))(
            jax.numpy.array(grids["video_grids"])
        )
    keras = pytest.importorskip("keras")
    from posenc.keras import mrope_positions as keras_mrope

    out = keras_mrope(keras.ops.convert_to_tensor(np.array(types)), attention_mask=mask,
                      **grids, tokens_per_second=25, second_per_grid_ts=seconds)  # fmt: skip
    for mine, theirs in zip(out, core, strict=True):
        assert keras.backend.standardize_dtype(mine.dtype) == "int32"
        assert keras.ops.convert_to_numpy(mine).tolist() == theirs.tolist()
