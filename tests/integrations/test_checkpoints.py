"""posenc convert-rope: a whole safetensors checkpoint between RoPE layouts."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

import posenc  # noqa: E402
from posenc.cli import main  # noqa: E402
from posenc.integrations.checkpoints import LAYOUT_KEY, convert_rope_state_dict  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64


@pytest.fixture(scope="module")
def state():
    """A tiny Llama's state dict (grouped-query attention: 4 query, 2 key/value heads)."""
    config = transformers.LlamaConfig(
        hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        num_hidden_layers=2, intermediate_size=64, vocab_size=32, attention_bias=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    state = {key: value.detach().clone().contiguous() for key, value in model.state_dict().items()}
    for key, value in state.items():
        if key.endswith("bias"):  # zeros at initialisation: make a permutation visible
            value.normal_(generator=torch.Generator().manual_seed(len(key)))
    return state


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def test_a_round_trip_is_bit_exact_and_only_projections_change(state, tmp_path):
    source = tmp_path / "model.safetensors"
    safetensors_torch.save_file(state, str(source), metadata={"format": "pt"})
    sizes = ["--heads", str(HEADS), "--kv-heads", str(KV_HEADS)]
    status, out, _ = run("convert-rope", str(source), str(tmp_path / "meta.safetensors"),
                         "--to", "interleaved", *sizes)  # fmt: skip
    assert status == 0, out
    status, _, _ = run("convert-rope", str(tmp_path / "meta.safetensors"),
                       str(tmp_path / "back.safetensors"), "--to", "half", *sizes)  # fmt: skip
    assert status == 0
    meta = safetensors_torch.load_file(str(tmp_path / "meta.safetensors"))
    back = safetensors_torch.load_file(str(tmp_path / "back.safetensors"))
    assert set(back) == set(state)
    for key, tensor in state.items():
        assert torch.equal(back[key], tensor), key
        changed = not torch.equal(meta[key], tensor)
        assert changed == (("q_proj" in key or "k_proj" in key) and "layers" in key), key
    with safetensors_torch.safe_open(str(tmp_path / "meta.safetensors"), "pt") as handle:
        assert handle.metadata() == {"format": "pt", LAYOUT_KEY: "interleaved"}


def test_attention_scores_are_unchanged_by_a_conversion(state):
    """RoPE in the half layout on the original projections and RoPE in the interleaved
    layout on the converted ones give the same scores, head by head (GQA included)."""
    converted, _ = convert_rope_state_dict(
        state, None, to="interleaved", heads=HEADS, kv_heads=KV_HEADS
    )
    x = torch.randn(7, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(2)).double()
    positions = np.arange(1000, 1007)
    inv_freq = posenc.rope_frequencies(HEAD_DIM, 500000.0)

    def scores(weights, layout):
        cos, sin = posenc.rope_tables(positions, inv_freq, layout=layout, dtype="float64")
        prefix = "model.layers.0.self_attn."
        q = x @ weights[prefix + "q_proj.weight"].double().T + weights[prefix + "q_proj.bias"]
        k = x @ weights[prefix + "k_proj.weight"].double().T + weights[prefix + "k_proj.bias"]
        q = posenc.apply_rope(q.numpy().reshape(7, HEADS, HEAD_DIM).swapaxes(0, 1), cos, sin,
                              layout=layout)  # fmt: skip
        k = posenc.apply_rope(k.numpy().reshape(7, KV_HEADS, HEAD_DIM).swapaxes(0, 1), cos, sin,
                              layout=layout)  # fmt: skip
        return np.einsum("hqd,hkd->hqk", q, np.repeat(k, HEADS // KV_HEADS, axis=0))

    np.testing.assert_allclose(scores(converted, "interleaved"), scores(state, "half"),
                               rtol=1e-12, atol=1e-12)  # fmt: skip


def test_partial_rotary_keeps_the_features_past_rotary_dim():
    q = torch.arange(2 * 8 * 3, dtype=torch.float32).reshape(16, 3)  # 2 heads of 8
    tensors = {"layers.0.attention.wq.weight": q, "layers.0.attention.wk.weight": q.clone()}
    out, meta = convert_rope_state_dict(tensors, {}, to="half", heads=2, kv_heads=2,
                                        rotary_dim=4)  # fmt: skip
    assert meta == {LAYOUT_KEY: "half"}
    rows = out["layers.0.attention.wq.weight"][:, 0].div(3).long().tolist()
    assert rows == [0, 2, 1, 3, 4, 5, 6, 7, 8, 10, 9, 11, 12, 13, 14, 15]


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        ("hf", ["--to", "half", "--heads", "4", "--kv-heads", "2"],
         "in the half layout already \\(its keys are Hugging Face"),
        ("hf", ["--to", "interleaved", "--heads", "4", "--kv-heads", "4"],
         "has 128 rows, not --kv-heads 4 x --head-dim 64"),
        ("hf", ["--to", "interleaved", "--heads", "3"], "cannot derive --head-dim"),
        ("none", ["--to", "half", "--heads", "4"], "found no query/key projection"),
        ("same", ["--to", "interleaved", "--heads", "4", "--kv-heads", "2"],
         "is the input: posenc never overwrites its input"),
        ("exists", ["--to", "interleaved", "--heads", "4", "--kv-heads", "2"],
         "exists: choose another output or pass --force"),
        ("garbage", ["--to", "half", "--heads", "4"], "is not a readable safetensors file"),
    ],
)  # fmt: skip
def test_refusals_exit_2_with_one_line_and_touch_nothing(state, tmp_path, setup, args, message):
    source, target = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    if setup == "garbage":
        source.write_bytes(b"not a checkpoint")
    else:
        tensors = {"norm.weight": torch.ones(3)} if setup == "none" else state
        safetensors_torch.save_file(tensors, str(source))
    if setup == "same":
        target = source
    if setup == "exists":
        target.write_bytes(b"keep me")
    before = source.read_bytes()
    status, _, err = run("convert-rope", str(source), str(target), *args)
    assert status == 2
    assert len(err.strip().splitlines()) == 1, err
    assert __import__("re").search(message, err), err
    assert source.read_bytes() == before
    if setup == "exists":
        assert target.read_bytes() == b"keep me"
    elif setup != "same":
        assert not target.exists()
