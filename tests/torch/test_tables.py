"""The table lifecycle of the PyTorch modules (posenc/torch/_tables.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import posenc  # noqa: E402
from posenc.core.rope import rope_table_values  # noqa: E402
from posenc.torch import RotaryEmbedding, SinusoidalPositionalEncoding  # noqa: E402


@pytest.mark.parametrize("module", ["sinusoidal", "rope"])
def test_decoding_far_past_the_table_computes_only_the_rows_asked_for(module):
    if module == "sinusoidal":
        layer = SinusoidalPositionalEncoding(64, dropout=0.0, max_length=2048)
        out = layer(torch.zeros(1, 1, 64), offset=10**7)
        expected = torch.from_numpy(posenc.sinusoidal([10**7], 64))
    else:
        layer = RotaryEmbedding(64, max_length=2048)
        q = torch.ones(1, 1, 1, 64)
        out, _ = layer(q, q, offset=10**7)
        cos, sin = posenc.rope_tables([10**7], posenc.rope_frequencies(64), dtype="float64")
        x = np.ones(64)
        rotated = x * cos[0] + np.concatenate([-x[32:], x[:32]]) * sin[0]
        expected = torch.from_numpy(rotated.astype(np.float32)).view(1, 1, 1, 64)
    torch.testing.assert_close(out.view_as(expected), expected, rtol=0, atol=2e-6)
    assert layer.table_length == 2048  # not 10**7 rows built to answer one
    layer(
        torch.zeros(1, 1, 64) if module == "sinusoidal" else q,
        *([] if module == "sinusoidal" else [q]),
        offset=3000,
    )
    assert layer.table_length == 4096  # a call that starts within twice the table grows it


def every_module():
    from posenc.torch import (
        ALiBiBias,
        AxialRotaryEmbedding,
        InputEmbedding,
        LearnedPositionalEmbedding,
        MultiHeadAttention,
        NoPositionalEncoding,
        SinusoidalPositionalEncodingND,
        T5RelativeBias,
        TokenEmbedding,
        XPosRotaryEmbedding,
    )

    return {
        "sinusoidal": SinusoidalPositionalEncoding(16, dropout=0.0, max_length=8),
        "learned": LearnedPositionalEmbedding(8, 16, dropout=0.0),
        "nope": NoPositionalEncoding(16),
        "sinusoidal_nd": SinusoidalPositionalEncodingND(16),
        "rope": RotaryEmbedding(16, max_length=8, scaling="yarn",
                                scaling_params={"factor": 2.0, "original_max_position_embeddings": 8}),
        "xpos": XPosRotaryEmbedding(16, max_length=8),
        "axial": AxialRotaryEmbedding(16, n_axes=2),
        "alibi": ALiBiBias(4),
        "t5": T5RelativeBias(4),
        "tokens": TokenEmbedding(10, 16),
        "input": InputEmbedding(10, 16, dropout=0.0, max_length=8),
        "attention": MultiHeadAttention(16, 4, position=RotaryEmbedding(4)),
    }  # fmt: skip


@pytest.mark.parametrize("name", list(every_module()))
def test_every_module_saves_whole(name, tmp_path):
    import copy
    import pickle

    module = every_module()[name]
    module.half().float()  # a cast on the way: derived buffers rebuilt, not cast twice
    path = tmp_path / "module.pt"
    torch.save(module, path)
    copies = [
        torch.load(path, weights_only=False),
        pickle.loads(pickle.dumps(module)),
        copy.deepcopy(module),
    ]
    state = module.state_dict()
    for other in copies:
        assert type(other) is type(module)
        assert other.state_dict().keys() == state.keys()
        for key, value in state.items():
            assert torch.equal(other.state_dict()[key], value), key
        for key, value in module.named_buffers():
            assert torch.equal(dict(other.named_buffers())[key], value), key
    fresh = every_module()[name]
    fresh.load_state_dict(state)  # a state dict round trip, no warning
    for key, value in state.items():
        assert torch.equal(fresh.state_dict()[key], value)


def test_a_checkpoint_with_other_derived_values_warns_with_the_difference():
    module = RotaryEmbedding(64, base=10000.0)
    own = torch.from_numpy(module.inv_freq).float()
    module.load_state_dict({"inv_freq": own})  # HF's float32 inv_freq of the same options: silent
    other = torch.from_numpy(RotaryEmbedding(64, base=500000.0).inv_freq).float()
    with pytest.warns(UserWarning, match=r"RotaryEmbedding: the checkpoint's 'inv_freq' differs "
                      r"from this module's by up to 0\.129; the module keeps its own") as record:  # fmt: skip
        module.load_state_dict({"inv_freq": other})
    assert record[0].filename == __file__  # points to the load_state_dict call
    with pytest.warns(UserWarning, match=r"has shape \(16,\), this module's \(32,\)"):
        module.load_state_dict({"inv_freq": torch.zeros(16)})
    np.testing.assert_array_equal(
        module.inv_freq, own.double().numpy().astype(np.float64) * 0 + module.inv_freq
    )


def test_threads_growing_one_module_leave_the_longest_tables():
    """Two threads grow one module's tables at once, the shorter growth slower: the
    module ends with the longer tables (never shrinks), and both see right rows."""
    rope = RotaryEmbedding(8, base=10007.5, max_length=16)  # a spec of its own: growth builds
    derive, inside, go = rope._derive, threading.Event(), threading.Event()

    def slow_for_240(length, start, dtype, device):
        if length == 240:
            inside.set()
            go.wait(timeout=5)
        return derive(length, start, dtype, device)

    rope._derive = slow_for_240
    shorter = threading.Thread(target=rope.extend, args=(240,))
    shorter.start()
    assert inside.wait(timeout=5)
    longer = threading.Thread(target=rope.extend, args=(300,))
    longer.start()
    threading.Timer(0.2, go.set).start()  # the longer growth waits (or, unlocked, wins)
    shorter.join(timeout=10)
    longer.join(timeout=10)
    assert rope.table_length == 300
    inv_freq = posenc.rope_frequencies(8, base=10007.5)
    cos, sin = rope_table_values(300, inv_freq, fmt="float32", layout="half")
    np.testing.assert_array_equal(rope.cos.numpy(), cos)  # the core's exact rows
    np.testing.assert_array_equal(rope.sin.numpy(), sin)
