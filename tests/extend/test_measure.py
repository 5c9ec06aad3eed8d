"""posenc.extend.models and posenc.extend.measure on a tiny Llama: each scaling is the model
transformers builds from a config with that scaling, passkey answers are greedy decoding as
``generate`` does it, and perplexity is the model's own loss."""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from posenc.extend import measure, models  # noqa: E402
from posenc.extend.probes import Probe, parse_scaling  # noqa: E402
from posenc.extend.texts import load_text  # noqa: E402
from posenc.integrations.transformers import ExactRotaryEmbedding, patch, register  # noqa: E402

from .conftest import CONTEXT  # noqa: E402

SCALINGS = ("none", "linear", "ntk", "dynamic_ntk", "yarn", "llama3")


@pytest.fixture
def model(tiny_model):
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    return loaded.eval()


def _reference(tiny_model, rope):
    """transformers' own model from a config with that scaling, with posenc's patch."""
    from posenc.core.rope import as_rope_scaling
    from posenc.specs import RopeSpec
    from posenc.specs.hf import rope_spec_to_hf_dict

    config = transformers.AutoConfig.from_pretrained(tiny_model)
    spec = RopeSpec.from_hf_config(config)
    keys = rope_spec_to_hf_dict(
        spec.head_dim, spec.base, spec.rotary_dim, spec.layout, as_rope_scaling(rope)[0]
    )
    register()
    config.rope_parameters = keys["rope_parameters"]
    config.max_position_embeddings = keys.get("max_position_embeddings", CONTEXT)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, config=config)
    return patch(reference.eval())


@pytest.mark.parametrize("name", SCALINGS)
def test_a_scaling_gives_the_model_transformers_builds_with_it(tiny_model, model, name):
    _, rope = parse_scaling(name, context=CONTEXT, factor=4.0, own={"rope_type": "default"})
    before = copy.deepcopy(model.config.to_dict())
    models.use_scaling(model, rope)
    ids = torch.randint(2, 1000, (2, 4 * CONTEXT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids).logits, _reference(tiny_model, rope)(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert model.config.to_dict() == before  # the model's own config is left as it was
    assert isinstance(model.model.rotary_emb, ExactRotaryEmbedding)


def test_switching_scalings_back_gives_the_first_logits_again(model):
    ids = torch.randint(2, 1000, (1, 3 * CONTEXT), generator=torch.Generator().manual_seed(2))
    none = parse_scaling("none", context=CONTEXT, factor=3.0, own={})[1]
    yarn = parse_scaling("yarn", context=CONTEXT, factor=3.0, own={})[1]
    with torch.no_grad():
        models.use_scaling(model, none)
        first = model(ids).logits
        models.use_scaling(model, yarn)
        scaled = model(ids).logits
        models.use_scaling(model, none)
        again = model(ids).logits
    assert not torch.equal(first, scaled)
    torch.testing.assert_close(again, first, rtol=0, atol=0)


def test_a_model_with_rope_per_layer_type_is_refused_by_name():
    config = transformers.Gemma3TextConfig(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
    )  # fmt: skip
    gemma = transformers.Gemma3ForCausalLM(config)
    with pytest.raises(ValueError, match="scales models with one RoPE; Gemma3RotaryEmbedding"):
        models.use_scaling(gemma, {"rope_type": "linear", "factor": 2.0})


@pytest.mark.parametrize("chunk", [7, 2048])
def test_token_losses_are_the_model_own_cross_entropy(model, monkeypatch, chunk):
    monkeypatch.setattr(measure, "CHUNK", chunk)
    ids = torch.randint(2, 1000, (2, 200), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(ids).logits[:, :-1]
        expected = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), ids[:, 1:], reduction="none"
        )
        torch.testing.assert_close(measure.token_losses(model, ids), expected, rtol=1e-5, atol=1e-5)
        # and their mean is the loss transformers computes from labels
        loss = model(ids[:1], labels=ids[:1]).loss
        torch.testing.assert_close(measure.token_losses(model, ids[:1]).mean(), loss)


def test_a_model_whose_logits_are_more_than_its_head_is_scored_from_its_logits(model, monkeypatch):
    """Gemma 2's soft cap or Cohere's logit scale: the chunked head would differ."""
    ids = torch.randint(2, 1000, (1, 100), generator=torch.Generator().manual_seed(4))
    forward = model.forward

    def capped(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = 5.0 * torch.tanh(out.logits / 5.0)
        return out

    monkeypatch.setattr(model, "forward", capped)
    with torch.no_grad():
        logits = model(ids).logits[:, :-1]
        expected = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), ids[:, 1:], reduction="none"
        )
        torch.testing.assert_close(measure.token_losses(model, ids), expected)


def _probe(tiny_model, **fields):
    return Probe(
        **{
            "model": str(tiny_model),
            "fingerprint": models.fingerprint(tiny_model),
            "scaling": "none",
            "rope": {"rope_type": "default"},
            **fields,
        }
    )


@pytest.mark.parametrize(
    ("name", "length", "depth"), [("none", 128, 0.5), ("yarn", 512, 0.1), ("dynamic_ntk", 300, 0.9)]
)
def test_a_passkey_answer_is_greedy_decoding_as_generate_does_it(tiny_model, name, length, depth):
    _, rope = parse_scaling(name, context=CONTEXT, factor=4.0, own={})
    probe = _probe(tiny_model, scaling=name, rope=rope, task="passkey", length=length, depth=depth)
    layers = []
    record = measure.run_probe(probe, progress=lambda done, total: layers.append((done, total)))
    result = record["result"]
    model, tokenizer = models.loaded(str(tiny_model), "float32", "cpu")
    from posenc.extend import passkey

    prompt = passkey.prompt(tokenizer, length, depth, result["passkey"])
    budget = len(tokenizer.encode(" " + result["passkey"], add_special_tokens=False)) + 3
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt.ids]), max_new_tokens=budget, do_sample=False,
                             min_new_tokens=budget, pad_token_id=0)  # fmt: skip
    assert result["answer"] == tokenizer.decode(out[0, length:], skip_special_tokens=True)
    assert result["right"] is passkey.is_right(result["answer"], result["passkey"])
    assert result["tokens"] == length
    assert result["needle_at"] == prompt.needle_at
    assert layers[:2] == [(1, 2), (2, 2)]  # the prompt's pass, layer by layer
    assert record["key"] == probe.key()
    assert record["context"] == CONTEXT
    json.dumps(record, allow_nan=False)


def test_a_perplexity_record_is_the_window_mean_loss_and_its_blocks(tiny_model, monkeypatch):
    monkeypatch.setattr(measure, "BLOCK", 100)
    _, _, digest = load_text()
    probe = _probe(tiny_model, task="perplexity", length=256, trial=2, text_digest=digest)
    result = measure.run_probe(probe)["result"]
    model, tokenizer = models.loaded(str(tiny_model), "float32", "cpu")
    ids = tokenizer.encode(load_text()[0], add_special_tokens=False)[512:768]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].double()
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none")
    assert result["nll"] == pytest.approx(float(nll.mean()), rel=1e-5)
    assert result["nll_by_block"] == pytest.approx(
        [float(nll[:100].mean()), float(nll[100:200].mean()), float(nll[200:].mean())], rel=1e-5
    )
    assert result["perplexity"] == pytest.approx(float(nll.mean().exp()), rel=1e-5)


def test_a_window_past_the_text_and_a_changed_text_are_refused(tiny_model, tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("a few words of text " * 20)
    _, _, digest = load_text(str(text))
    past = _probe(
        tiny_model, task="perplexity", length=256, trial=3, text=str(text), text_digest=digest
    )
    with pytest.raises(
        ValueError, match=r"has \d+ tokens: window 3 of 256 tokens would end at 1024"
    ):
        measure.run_probe(past)
    changed = _probe(tiny_model, task="perplexity", length=16, text=str(text), text_digest="0" * 16)
    with pytest.raises(ValueError, match="is not the one this probe was made for"):
        measure.run_probe(changed)
