"""The caches of a patched transformers model kept exact: re-rotation when dynamic NTK's or
LongRoPE's frequencies change, a window with attention sinks, and register()'s length rules.

One-layer models: there every cached key and value comes from the token embeddings, so
decoding can equal the full-sequence call exactly. In a deeper model the keys and values
of later layers depend on attention outputs computed when the frequencies were others; no
cache but a recomputed prefix makes those equal (checked below: the first layer's keys are).
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from hf_models import SMALL

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import DynamicCache  # noqa: E402

import posenc  # noqa: E402
from posenc.integrations.transformers import (  # noqa: E402
    SinkCache,
    patch,
    register,
    unpatch,
    unregister,
)

ORIGINAL = 16
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + i / 32 for i in range(32)],
    "long_factor": [1.0 + i / 2 for i in range(32)],
}


def dynamic_llama(layers=1):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **{**SMALL, "num_hidden_layers": layers},
        max_position_embeddings=ORIGINAL,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0},
    )
    return transformers.LlamaForCausalLM(config).eval()


def phi3(layers=1):
    torch.manual_seed(0)
    config = transformers.Phi3Config(
        **{**SMALL, "num_hidden_layers": layers},
        max_position_embeddings=4 * ORIGINAL,
        original_max_position_embeddings=ORIGINAL,
        rope_scaling=dict(LONGROPE),  # (transformers writes into the dict it is given)
    )
    return transformers.Phi3ForCausalLM(config).eval()


MODELS = {"dynamic-NTK llama": dynamic_llama, "phi-3 longrope": phi3}


def decoded_against_full(model, ids, prompt):
    """Max |logit difference| of each decoding step against the full call on its prefix."""
    cache = DynamicCache()
    errors = []
    with torch.no_grad():
        model(ids[:, :prompt], cache=cache, use_cache=True)
        for t in range(prompt, ids.shape[1]):
            step = model(ids[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1]
            full = model(ids[:, : t + 1]).logits[:, -1]
            errors.append((step - full).abs().max().item())
    return np.array(errors)


def decoded_and_full_caches(model):
    """The caches of a 4-token prompt then 20 tokens one at a time, and of the full call."""
    ids = torch.randint(2, 128, (1, 24), generator=torch.Generator().manual_seed(3))
    cache, full = DynamicCache(), DynamicCache()
    with torch.no_grad():
        model(ids[:, :4], cache=cache, use_cache=True)
        for t in range(4, 24):
            model(ids[:, t : t + 1], cache=cache, use_cache=True)
        model(ids, cache=full, use_cache=True)
    return cache, full


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_decoding_with_the_models_own_cache_equals_the_full_call(make):
    ids = torch.randint(2, 128, (2, 28), generator=torch.Generator().manual_seed(1))
    exact = decoded_against_full(patch(make()), ids, prompt=5)
    kept = decoded_against_full(patch(make(), on_frequency_change="keep"), ids, prompt=5)
    assert exact.max() < 2e-6  # float32 rounding, before and after the change
    assert kept[: ORIGINAL - 5].max() < 2e-6  # keep: equal up to the original length,
    assert kept[ORIGINAL - 4 :].min() > 1e-3  # then off at every step past it


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_decoding_at_positions_that_go_back_equals_the_full_call(make):
    # The length a length-dependent scaling sees is the largest position of every key
    # attended, cached keys included: the step at position 2 after 30 and 31 rotates with
    # the frequencies of length 32, as the full call does (posenc.core.plan.scaling_length).
    model = patch(make())
    back = torch.tensor([[0, 1, 30, 31, 2, 3, 40, 4]])
    ids = torch.randint(2, 128, (2, back.shape[1]), generator=torch.Generator().manual_seed(3))
    cache = DynamicCache()
    with torch.no_grad():
        for t in range(back.shape[1]):
            at = back[:, t : t + 1]
            step = model(ids[:, t : t + 1], position_ids=at, cache=cache, use_cache=True)
            full = model(ids[:, : t + 1], position_ids=back[:, : t + 1]).logits[:, -1]
            torch.testing.assert_close(step.logits[:, -1], full, rtol=0, atol=2e-6)
    assert model.model.rotary_emb.keeper.attended is None  # only while a call runs


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_generate_with_a_cache_equals_generate_without(make):
    model = patch(make())
    ids = torch.randint(2, 128, (2, 5), generator=torch.Generator().manual_seed(2))
    options = {"max_new_tokens": 20, "do_sample": False, "output_scores": True}
    with torch.no_grad():
        cached = model.generate(ids, return_dict_in_generate=True, **options)
        uncached = model.generate(ids, return_dict_in_generate=True, use_cache=False, **options)
    assert torch.equal(cached.sequences, uncached.sequences)
    for mine, theirs in zip(cached.scores, uncached.scores, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=2e-6)


def test_grouped_query_attention_and_partial_rotary_decode_exactly_too():
    torch.manual_seed(0)
    gqa = transformers.LlamaConfig(
        **{**SMALL, "num_hidden_layers": 1},
        num_key_value_heads=1,
        max_position_embeddings=ORIGINAL,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0},
    )
    partial = transformers.Phi3Config(
        **{**SMALL, "num_hidden_layers": 1},
        partial_rotary_factor=0.5,
        max_position_embeddings=4 * ORIGINAL,
        original_max_position_embeddings=ORIGINAL,
        rope_scaling={"rope_type": "longrope", "partial_rotary_factor": 0.5,
                      "short_factor": LONGROPE["short_factor"][:16],
                      "long_factor": LONGROPE["long_factor"][:16]},
    )  # fmt: skip
    ids = torch.randint(2, 128, (2, 26), generator=torch.Generator().manual_seed(7))
    for model_class, config in ((transformers.LlamaForCausalLM, gqa),
                                (transformers.Phi3ForCausalLM, partial)):  # fmt: skip
        model = patch(model_class(config).eval())
        assert decoded_against_full(model, ids, prompt=4).max() < 2e-6
    assert model.model.rotary_emb.ropes["all"].spec.rotary_dim == 32  # half of head_dim 64


def test_in_a_deeper_model_the_first_layers_keys_equal_the_full_pass():
    model = patch(dynamic_llama(layers=2))
    cache, full = decoded_and_full_caches(model)
    torch.testing.assert_close(cache.layers[0].keys, full.layers[0].keys, rtol=0, atol=2e-6)
    # the second layer's inputs for earlier tokens were computed with earlier frequencies
    assert (cache.layers[1].values - full.layers[1].values).abs().max() > 1e-4


def sink_reference(model, ids, mask, seen, window, sinks):
    """The last logits of a full call over the tokens a SinkCache holds after `seen`."""
    kept = list(range(seen))
    if seen > window + sinks:
        kept = list(range(sinks)) + list(range(seen - window, seen))
    part = mask[:, kept]
    positions = (part.long().cumsum(-1) - 1).masked_fill(part == 0, 0)
    with torch.no_grad():
        return model(ids[:, kept], attention_mask=part, position_ids=positions).logits[:, -1]


def test_a_sink_cache_equals_the_full_call_on_the_tokens_it_keeps():
    model = patch(phi3())  # LongRoPE too: positions in the cache stay short
    ids = torch.randint(2, 128, (2, 40), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    cache = SinkCache(window=6, sinks=2)
    with torch.no_grad():
        model(ids[:, :4], cache=cache, use_cache=True)
        for t in range(4, 40):
            step = model(ids[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1]
            want = sink_reference(model, ids, mask, t + 1, 6, 2)
            torch.testing.assert_close(step, want, rtol=0, atol=2e-6)
    assert (cache.get_seq_length(), cache.evicted) == (8, 40 - 8)


def test_generate_with_a_sink_cache_and_left_padding():
    model = patch(dynamic_llama())
    ids = torch.randint(2, 128, (2, 5), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # the first row is left-padded
    cache = SinkCache(window=5, sinks=3)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, cache=cache, max_new_tokens=16,
                             do_sample=False, output_scores=True, return_dict_in_generate=True)  # fmt: skip
    full_mask = torch.cat([mask, torch.ones(2, 16, dtype=mask.dtype)], dim=1)
    for step, score in enumerate(out.scores):
        want = sink_reference(model, out.sequences, full_mask, 5 + step, 5, 3)
        torch.testing.assert_close(score, want, rtol=0, atol=2e-6)
    assert cache.get_seq_length() == 8


def test_a_sink_cache_refuses_an_unpatched_model_and_a_short_mask():
    model = dynamic_llama()
    ids = torch.randint(2, 128, (1, 4))
    with pytest.raises(ValueError, match="not patched"):
        model(ids, cache=SinkCache(window=4), use_cache=True)
    patch(model)
    cache = SinkCache(window=4, sinks=1)
    model(ids, cache=cache, use_cache=True)
    with pytest.raises(ValueError, match="every token given"):
        model(ids[:, :1], attention_mask=torch.ones(1, 2), cache=cache, use_cache=True)
    with pytest.raises(ValueError, match="window"):
        SinkCache(window=0)
    with pytest.raises(ValueError, match="on_frequency_change"):
        patch(model, on_frequency_change="recompute")


def test_a_cache_refuses_another_batch_size_by_name():
    """A cache holding the keys of one batch serves that batch: a call with another is a
    ValueError naming both sizes (posenc's KVCache does the same), not a size error from
    inside transformers, for a SinkCache and the model's own cache alike."""
    model = patch(dynamic_llama())
    ids = torch.randint(2, 128, (2, 4), generator=torch.Generator().manual_seed(8))
    for cache in (SinkCache(window=4, sinks=1), DynamicCache()):
        with torch.no_grad():
            model(ids[:1], cache=cache, use_cache=True)
            with pytest.raises(ValueError, match="a batch of 1 sequences, and the call gives 2"):
                model(ids[:, :1], cache=cache, use_cache=True)
            model(ids[:1, :1], cache=cache, use_cache=True)  # the cache is as it was
        assert cache.get_seq_length() == 5


def test_generate_without_a_cache_logs_no_deprecation():
    """The hooks read the cache a model returns from its ``cache`` field: reading
    ``past_key_values`` there made transformers log that the name is deprecated."""
    import logging

    from transformers.utils import logging as hf_logging

    model = patch(dynamic_llama())
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = hf_logging.get_logger("transformers")
    logger.addHandler(handler)
    hf_logging.warning_once.cache_clear()  # (logged once per process)
    try:
        with torch.no_grad():
            model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False,
                           use_cache=False, pad_token_id=0)  # fmt: skip
            assert not [m for m in messages if "deprecated" in m]
            model(torch.tensor([[5, 6, 7]]), use_cache=False).past_key_values  # noqa: B018
    finally:
        logger.removeHandler(handler)
    assert messages == ["`past_key_values`/`cache_params` are deprecated. Use `cache` instead."]


def test_a_model_with_a_rotary_module_in_every_layer_keeps_one_cache_exact():
    """Moshi's rotary modules sit in each attention layer: one pair of hooks on the
    model that takes the cache re-rotates every layer's keys once (the first layer's keys
    equal the full pass's after a dynamic-NTK change of frequencies)."""
    torch.manual_seed(0)
    config = transformers.MoshiConfig(
        **{**SMALL, "num_hidden_layers": 2}, max_position_embeddings=ORIGINAL,
        sliding_window=64, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4,
                                            "factor": 4.0},
    )  # fmt: skip
    model = patch(transformers.MoshiForCausalLM(config).eval())
    hooked = [name for name, m in model.named_modules() if m._forward_pre_hooks]
    assert hooked == ["model"]
    cache, full = decoded_and_full_caches(model)
    torch.testing.assert_close(cache.layers[0].keys, full.layers[0].keys, rtol=0, atol=2e-6)


def test_unpatch_removes_the_hooks_and_a_patched_model_copies():
    model = patch(dynamic_llama())
    assert model.model._forward_pre_hooks
    twin = copy.deepcopy(model)
    ids = torch.randint(2, 128, (1, 20), generator=torch.Generator().manual_seed(6))
    assert decoded_against_full(twin, ids, 4).max() < 2e-6
    pickle.loads(pickle.dumps(model))
    unpatch(model)
    assert not model.model._forward_pre_hooks
    assert not model.model._forward_hooks


# -- register(): each scaling keeps its own length rule ---------------------------------------


@pytest.fixture
def registered():
    added = register()
    yield added
    unregister()


def test_register_adds_longrope_with_its_own_switch(registered):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert "posenc_longrope" in registered
    params = {key: value for key, value in LONGROPE.items() if key != "rope_type"}
    params.update(rope_theta=1e4, original_max_position_embeddings=4096)

    def config(kind):  # Phi-3-mini-128k's lengths
        return transformers.LlamaConfig(
            **SMALL,
            max_position_embeddings=131072,
            rope_parameters={**params, "rope_type": kind},
        )

    ours, theirs = config("posenc_longrope"), config("longrope")
    for seq_len in (None, 0, 1, 4096, 4097, 131072):  # 0: no length, as for Hugging Face
        mine, factor = ROPE_INIT_FUNCTIONS["posenc_longrope"](ours, None, seq_len=seq_len)
        hf, hf_factor = ROPE_INIT_FUNCTIONS["longrope"](theirs, None, seq_len=seq_len)
        torch.testing.assert_close(mine, hf, rtol=1.2e-7, atol=0)
        assert factor == pytest.approx(hf_factor, rel=1e-15)


def test_register_keeps_dynamic_ntks_rule_and_a_users_scaling_its_own(registered):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from custom_scaling import STRETCH, StretchScaling

    def config(kind, **extra):
        return transformers.LlamaConfig(**SMALL, max_position_embeddings=1024,
                                        rope_parameters={"rope_type": kind, "rope_theta": 1e4,
                                                         **extra})  # fmt: skip

    for seq_len in (None, 0, 1, 1024, 3000):  # 0: no length, as for Hugging Face
        mine = ROPE_INIT_FUNCTIONS["posenc_dynamic"](config("posenc_dynamic", factor=2.0),
                                                     None, seq_len=seq_len)[0]  # fmt: skip
        hf = ROPE_INIT_FUNCTIONS["dynamic"](config("dynamic", factor=2.0), None, seq_len=seq_len)[0]
        torch.testing.assert_close(mine, hf, rtol=1.2e-7, atol=0)
    posenc.register_rope_scaling(STRETCH, StretchScaling)
    try:
        added = register()
        user = config("posenc_stretch", original_max_position_embeddings=8)
        for seq_len in (4, 16):  # its own rule, not raised to max_position_embeddings
            inv_freq, factor = ROPE_INIT_FUNCTIONS["posenc_stretch"](user, None, seq_len=seq_len)
            want = posenc.rope_frequencies(64, 1e4) / max(1.0, seq_len / 8)
            np.testing.assert_array_equal(inv_freq.numpy(), want.astype(np.float32))
            assert factor == 1.25
        assert "posenc_stretch" in added
    finally:
        posenc.unregister_rope_scaling(STRETCH)
