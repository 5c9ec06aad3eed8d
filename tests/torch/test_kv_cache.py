"""KV caches that stay exact: re-rotation when RoPE's frequencies change, and windows
with attention sinks whose kept keys move to their new positions."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.testing import assert_close  # noqa: E402

from posenc.torch import (  # noqa: E402
    ALiBiBias,
    KVCache,
    MultiHeadAttention,
    RotaryEmbedding,
    XPosRotaryEmbedding,
)
from posenc.torch.protocols import CachedKeyRotation  # noqa: E402

ORIGINAL = 8  # the original length of the scalings below: tiny, so decoding crosses it
SCALINGS = {
    "dynamic_ntk": {"factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "longrope": {
        "short_factor": [1.0, 1.25, 1.5, 2.0],
        "long_factor": [1.0, 3.0, 9.0, 27.0],
        "original_max_position_embeddings": ORIGINAL,
        "short_mscale": 1.0,
        "long_mscale": 1.3,
    },
}


def attention(scaling, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    rope = RotaryEmbedding(8, base=50.0, scaling=scaling, scaling_params=SCALINGS.get(scaling))
    return MultiHeadAttention(16, 2, position=rope).to(dtype).eval()


def decode(module, x, cache, prompt):
    """Outputs of a prompt of `prompt` tokens, then of each later token alone."""
    with torch.no_grad():
        outputs = [module(x[:, :prompt], cache=cache)]
        outputs += [module(x[:, t : t + 1], cache=cache) for t in range(prompt, x.shape[1])]
    return torch.cat(outputs, dim=1)


def last_rows(module, x):
    """Each position's output from a full-sequence call on the prefix that ends there."""
    with torch.no_grad():
        return torch.cat([module(x[:, : t + 1])[:, -1:] for t in range(x.shape[1])], dim=1)


@pytest.mark.parametrize("scaling", ["dynamic_ntk", "longrope"])
@pytest.mark.parametrize("mode", ["rerotate", "recompute"])
def test_decoding_across_a_frequency_change_equals_the_full_call(scaling, mode):
    module = attention(scaling)
    x = torch.randn(2, 24, 16)
    got = decode(module, x, KVCache(on_frequency_change=mode), prompt=5)
    want = last_rows(module, x)
    # float32 rounding: the float64 model's outputs are as far from both
    exact = last_rows(module.double(), x.double()).float()
    floor = (want - exact).abs().max().item()
    assert (got - exact).abs().max().item() <= 2 * floor + 1e-7
    assert_close(got, want, rtol=0, atol=2e-7)


# Positions that go back: the length a length-dependent scaling sees is the largest
# position of everything attended, cached keys included (posenc.core.plan.scaling_length).
BACK = [0, 1, 30, 31, 2, 3, 40, 4]


@pytest.mark.parametrize("scaling", ["dynamic_ntk", "longrope"])
@pytest.mark.parametrize("mode", ["rerotate", "recompute"])
@pytest.mark.parametrize("batch", [1, 2])
def test_decoding_at_positions_that_go_back_equals_the_full_call(scaling, mode, batch):
    # a real head: 8 heads of 64 features (d_model 512); one token a step
    torch.manual_seed(1)
    params = SCALINGS[scaling]
    if scaling == "longrope":  # its factors are per frequency pair: 32 of them
        factors = {"short_factor": [1 + i / 32 for i in range(32)], "long_factor": range(1, 33)}
        params = {**params, **factors}
    rope = RotaryEmbedding(64, scaling=scaling, scaling_params=params)
    module = MultiHeadAttention(512, 8, position=rope).eval()
    x = torch.randn(batch, len(BACK), 512)
    positions = torch.tensor(BACK)
    cache = KVCache(on_frequency_change=mode)
    with torch.no_grad():
        steps = [
            module(x[:, t : t + 1], positions=positions[t : t + 1], cache=cache)
            for t in range(len(BACK))
        ]
        full = [module(x[:, : t + 1], positions=positions[: t + 1])[:, -1:] for t in range(8)]
    for t, (step, whole) in enumerate(zip(steps, full, strict=True)):
        assert_close(step, whole, rtol=0, atol=2e-6, msg=f"step {t} at position {BACK[t]}")


def test_attention_of_your_own_passes_the_caches_length_to_the_rotation():
    # KVCache.update with the rotation's length= from the cache: the same keys, and the
    # same scores, as one rotation of every token at once
    rope = RotaryEmbedding(64, scaling="dynamic_ntk", scaling_params=SCALINGS["dynamic_ntk"])
    q, k = torch.randn(1, 8, len(BACK), 64), torch.randn(1, 2, len(BACK), 64)
    positions = torch.tensor(BACK)
    cache = KVCache()
    for t in range(len(BACK)):
        at = positions[t : t + 1]
        length = cache.scaling_length(1, at)
        assert length == max(BACK[: t + 1]) + 1
        q_t, k_t = rope(q[:, :, t : t + 1], k[:, :, t : t + 1], positions=at, length=length)
        keys, _ = cache.update(k_t, k_t, positions=at, rotation=rope)
        q_all, k_all = rope(q[:, :, : t + 1], k[:, :, : t + 1], positions=positions[: t + 1])
        assert_close(q_t, q_all[:, :, -1:], rtol=0, atol=1e-6)
        assert_close(keys, k_all, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"length=3 is shorter than .* \(41: its largest"):
        rope(q[:, :, :1], k[:, :, :1], positions=torch.tensor([40]), length=3)
    with pytest.raises(ValueError, match=r"length=3 is shorter"):  # the decoding step too
        rope(q[:1, :1, :1], k[:1, :1, :1], offset=40, length=3)


def test_the_caches_length_for_a_batch_with_positions_per_row():
    # each row's positions: the largest of every row's keys, held and new
    cache = KVCache()
    held = torch.tensor([[0, 1, 30, 31], [0, 1, 2, 3]])
    cache.update(torch.zeros(2, 1, 4, 2), torch.zeros(2, 1, 4, 2), positions=held)
    assert cache.scaling_length(1, torch.tensor([[2], [4]])) == 32
    assert cache.scaling_length(1, torch.tensor([[2], [40]])) == 41
    assert cache.scaling_length(1) == 33  # after each row's last: 32 and 4
    with pytest.raises(ValueError, match="positions has batch size 3 but the cache has 2"):
        cache.scaling_length(1, torch.tensor([[2], [4], [5]]))


@pytest.mark.parametrize("scaling", ["dynamic_ntk", "longrope"])
def test_keep_is_what_other_caches_do_and_is_far_off_past_the_switch(scaling):
    module = attention(scaling)
    x = torch.randn(1, 20, 16)
    got = decode(module, x, KVCache(on_frequency_change="keep"), prompt=5)
    want = last_rows(module, x)
    assert_close(got[:, :ORIGINAL], want[:, :ORIGINAL], rtol=0, atol=2e-7)  # before: equal
    assert (got[:, ORIGINAL + 1 :] - want[:, ORIGINAL + 1 :]).abs().max() > 1e-3


def test_longrope_rerotates_once_in_bfloat16_within_its_rounding():
    """bfloat16: the keys cached before the switch are rounded once more when re-rotated.
    The bound measured here: the decoded outputs are as close to the float64 model's as
    the full bfloat16 call's are, within 2 bfloat16 units (2**-7) of the outputs' size."""
    module = attention("longrope", torch.bfloat16)
    x = torch.randn(1, 16, 16)
    got = decode(module, x.bfloat16(), KVCache(), prompt=4).float()
    full = last_rows(module, x.bfloat16()).float()
    exact = last_rows(module.double(), x.double()).float()
    size = exact.abs().max().item()
    assert (got - exact).abs().max().item() <= (full - exact).abs().max().item() + 2**-7 * size
    keep = decode(module.bfloat16(), x.bfloat16(), KVCache(on_frequency_change="keep"), 4)
    assert (keep.float() - exact).abs().max().item() > 4 * (got - exact).abs().max().item()


def test_recompute_keeps_the_keys_before_rotation_and_rerotate_does_not():
    module = attention("dynamic_ntk")
    x = torch.randn(1, 12, 16)
    caches = {mode: KVCache(on_frequency_change=mode) for mode in ("rerotate", "recompute")}
    for cache in caches.values():
        decode(module, x, cache, prompt=3)
    assert caches["rerotate"]._raw is None
    raw = caches["recompute"]._raw
    assert raw is not None
    assert raw.shape == caches["recompute"].keys.shape
    assert_close(caches["recompute"].keys, caches["rerotate"].keys, rtol=0, atol=1e-6)


def test_rerotated_keys_equal_keys_rotated_there_from_scratch():
    rope = RotaryEmbedding(8, base=50.0, scaling="longrope", scaling_params=SCALINGS["longrope"])
    k = torch.randn(2, 3, 10, 8, dtype=torch.float64)
    positions = torch.arange(10) * 1000 + 7
    short = rope.rotate_keys(k, positions=positions, frequencies=rope.frequency_state(5))
    long = rope.rotate_keys(k, positions=positions, frequencies=rope.frequency_state(9))
    moved = rope.rerotate_keys(short, positions=positions, frequencies=None, new_frequencies=9)
    assert_close(moved, long, rtol=0, atol=1e-14)
    assert isinstance(rope, CachedKeyRotation)
    assert (rope.frequency_state(8), rope.frequency_state(9), rope.frequency_state(10**6)) == (
        None,
        9,
        9,
    )


# -- windows with attention sinks --------------------------------------------------------


@pytest.mark.parametrize("position", ["rope", "alibi", "nope"])
@pytest.mark.parametrize("mode", ["rerotate", "recompute"])
def test_a_window_with_sinks_equals_the_full_call_on_the_tokens_it_keeps(position, mode):
    torch.manual_seed(0)
    scheme = {"rope": RotaryEmbedding(8), "alibi": ALiBiBias(2), "nope": None}[position]
    module = MultiHeadAttention(16, 2, position=scheme).eval()
    x = torch.randn(2, 40, 16)
    cache = KVCache(window=6, sinks=2, on_frequency_change=mode)
    with torch.no_grad():
        module(x[:, :3], cache=cache)
        for t in range(3, 40):
            y = module(x[:, t : t + 1], cache=cache)
            tokens = cache.tokens
            assert tokens.tolist() == [0, 1, *range(max(2, t - 5), t + 1)]
            assert_close(y, module(x[:, tokens])[:, -1:], rtol=0, atol=2e-7)
    assert cache.length == 8
    assert cache.evicted == 40 - 8


def test_a_call_longer_than_the_window_sees_everything_and_the_next_call_evicts():
    torch.manual_seed(0)
    module = MultiHeadAttention(16, 2, position=RotaryEmbedding(8)).eval()
    x = torch.randn(1, 14, 16)
    cache = KVCache(window=4, sinks=1)
    with torch.no_grad():
        first = module(x[:, :10], cache=cache)
        assert_close(first, module(x[:, :10]), rtol=0, atol=2e-7)
        assert cache.length == 10
        y = module(x[:, 10:12], cache=cache)  # keeps the sink and 2 tokens beside the 2 new
        assert cache.tokens.tolist() == [0, 8, 9, 10, 11]
        assert_close(y, module(x[:, [0, 8, 9, 10, 11]])[:, -2:], rtol=0, atol=2e-7)


def test_a_window_over_a_length_dependent_scaling_moves_positions_and_frequencies():
    module = attention("dynamic_ntk")
    x = torch.randn(1, 30, 16)
    cache = KVCache(window=9, sinks=3)
    with torch.no_grad():
        for t in range(30):
            y = module(x[:, t : t + 1], cache=cache)
            assert_close(y, module(x[:, cache.tokens])[:, -1:], rtol=0, atol=3e-7)


def test_exact_shifts_far_out_against_float32_tables():
    """Keys at positions ~500,000 moved back by one (a window evicting one token):
    posenc's re-rotation is within two roundings of the keys rotated there from scratch;
    combining the model's float32 tables at both positions, as transformers' former
    SinkCache did, is off by about position × 2**-24."""
    rope = RotaryEmbedding(64, max_length=16)
    k = torch.randn(1, 2, 4, 64)
    old = torch.arange(500_000, 500_004)
    new = old - 1
    exact = rope.double().rotate_keys(k.double(), positions=new)
    rope.float()
    cached = rope.rotate_keys(k, positions=old)
    ours = rope.rerotate_keys(cached, positions=old, new_positions=new)
    theta = torch.from_numpy(rope.inv_freq).float()
    tables = [(torch.cos(p[:, None].float() * theta), torch.sin(p[:, None].float() * theta))
              for p in (old, new)]  # fmt: skip
    (cos_old, sin_old), (cos_new, sin_new) = tables
    cos = (cos_new * cos_old + sin_new * sin_old).repeat(1, 2)
    sin = (sin_new * cos_old - cos_new * sin_old).repeat(1, 2)
    theirs = cached * cos + torch.cat([-cached[..., 32:], cached[..., :32]], dim=-1) * sin
    ulp = 2**-24 * exact.abs().max().item()
    assert (ours.double() - exact).abs().max().item() <= 4 * ulp
    assert (theirs.double() - exact).abs().max().item() > 1000 * ulp


# -- errors and atomicity -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"on_frequency_change": "again"}, ValueError, "on_frequency_change"),
        ({"window": 0}, ValueError, "window"),
        ({"sinks": 2}, ValueError, "needs a window"),
        ({"window": 4, "sinks": -1}, ValueError, "sinks"),
        ({"window": 2.5}, TypeError, "window"),
    ],
)
def test_bad_cache_options_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        KVCache(**kwargs)


def test_a_window_refuses_given_positions_and_schemes_that_cannot_move_keys():
    module = MultiHeadAttention(16, 2, position=RotaryEmbedding(8))
    cache = KVCache(window=2)
    with pytest.raises(ValueError, match="places every token itself"):
        module(torch.randn(1, 3, 16), positions=torch.arange(3), cache=cache)
    xpos = MultiHeadAttention(16, 2, position=XPosRotaryEmbedding(8, qk_layout="bhsd"))
    cache = KVCache(window=2)
    xpos(torch.randn(1, 2, 16), cache=cache)
    with pytest.raises(ValueError, match="XPosRotaryEmbedding cannot"):
        xpos(torch.randn(1, 1, 16), cache=cache)
    assert cache.length == 2  # unchanged
    with pytest.raises(ValueError, match="recompute"):
        KVCache(on_frequency_change="recompute").update(
            torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), rotation=RotaryEmbedding(8)
        )


def test_a_failed_call_leaves_the_cache_as_it_was():
    module = attention("longrope")
    cache = KVCache()
    x = torch.randn(1, 8, 16)
    with torch.no_grad():
        module(x, cache=cache)  # up to the switch
    keys, frequencies = cache.keys.clone(), cache._frequencies
    with pytest.raises(ValueError, match="attn_mask"):
        module(torch.randn(1, 1, 16), cache=cache, attn_mask=torch.ones(3, 3, dtype=torch.bool))
    assert torch.equal(cache.keys, keys)
    assert cache._frequencies == frequencies
    window = KVCache(window=3)
    module(x[:, :3], cache=window)
    held = window.keys.clone()
    with pytest.raises(ValueError, match="attn_mask"):
        module(x[:, 3:4], cache=window, attn_mask=torch.ones(3, 3, dtype=torch.bool))
    assert torch.equal(window.keys, held)
    assert window.evicted == 0


def test_update_moves_keys_it_is_told_about():
    rope = RotaryEmbedding(8)
    k = torch.randn(1, 2, 6, 8, dtype=torch.float64)
    rotated = rope.double().rotate_keys(k)
    cache = KVCache(window=3, sinks=1)
    cache.update(rotated[:, :, :4], rotated[:, :, :4], rotation=rope)
    keys, _ = cache.update(rotated[:, :, 4:5], rotated[:, :, 4:5], rotation=rope)
    assert cache.tokens.tolist() == [0, 2, 3, 4]
    want = rope.rotate_keys(k[:, :, [0, 2, 3]], positions=torch.arange(3))
    assert_close(keys[:, :, :3], want, rtol=0, atol=1e-15)
    assert np.array_equal(cache.tokens.numpy(), [0, 2, 3, 4])


def test_a_cache_serves_one_attention_and_names_what_it_cannot_move():
    first, second = attention("dynamic_ntk"), attention("longrope")
    x = torch.randn(1, 6, 16)
    cache = KVCache()
    with torch.no_grad():
        first(x, cache=cache)
        with pytest.raises(ValueError, match="serves one attention"):
            second(x[:, :1], cache=cache)
    assert cache.length == 6
    keys = torch.zeros(1, 2, 3, 8)
    bshd = RotaryEmbedding(8, qk_layout="bshd")
    with pytest.raises(ValueError, match="qk_layout='bshd'"):
        KVCache().update(keys, keys, rotation=bshd)
    blind = KVCache()
    blind.update(keys, keys)  # no rotation given: frequencies unknown
    dynamic = RotaryEmbedding(8, scaling="dynamic_ntk", scaling_params=SCALINGS["dynamic_ntk"])
    with pytest.raises(ValueError, match="without rotation="):
        blind.update(keys, keys, rotation=dynamic)
    blind.update(keys, keys, rotation=RotaryEmbedding(8))  # a fixed scaling: one set
    assert blind.length == 6


def test_keep_records_the_frequencies_of_the_keys_it_keeps():
    module = attention("longrope")
    cache = KVCache(on_frequency_change="keep")
    with torch.no_grad():
        module(torch.randn(1, 4, 16), cache=cache)
        for _ in range(8):  # past the switch at 8
            module(torch.randn(1, 1, 16), cache=cache)
    assert cache._frequencies is None  # the short factors the first keys hold
