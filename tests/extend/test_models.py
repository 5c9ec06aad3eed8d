"""posenc.extend.models: a GGUF model converted once, whole, into the cache; fingerprints."""

from __future__ import annotations

import os
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from posenc.extend.models import context_length, fingerprint, resolve  # noqa: E402

from .conftest import CONTEXT, make_model, write_gguf  # noqa: E402


@pytest.fixture(scope="module")
def gguf_file(tiny_model, tmp_path_factory):
    return write_gguf(tiny_model, tmp_path_factory.mktemp("gguf") / "tiny.F32.gguf")


def test_a_gguf_model_converts_to_the_same_model_and_tokenizer(tiny_model, gguf_file, tmp_path):
    folder = resolve(gguf_file.parent, gguf_file.name, cache=tmp_path)
    assert folder.parent == tmp_path
    assert folder.name.startswith("tiny.F32-")
    converted = transformers.AutoModelForCausalLM.from_pretrained(folder)
    source = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    text = "A pass key is hidden. The pass key is 52719."
    ids = transformers.AutoTokenizer.from_pretrained(tiny_model).encode(text)
    assert transformers.AutoTokenizer.from_pretrained(folder).encode(text) == ids
    with torch.no_grad():
        torch.testing.assert_close(converted(torch.tensor([ids])).logits,
                                   source(torch.tensor([ids])).logits, rtol=0, atol=0)  # fmt: skip
    assert context_length(converted.config) == CONTEXT
    assert "quantization_config" not in (folder / "config.json").read_text()


def test_a_converted_model_is_kept_and_a_file_path_finds_it(gguf_file, tmp_path, monkeypatch):
    folder = resolve(gguf_file.parent, gguf_file.name, cache=tmp_path)
    mtime = (folder / "config.json").stat().st_mtime_ns

    def refuse(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    assert resolve(gguf_file, cache=tmp_path) == folder
    assert (folder / "config.json").stat().st_mtime_ns == mtime
    assert sorted(os.listdir(tmp_path)) == [folder.name]


def test_a_failed_conversion_leaves_nothing_in_the_cache(gguf_file, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        resolve(gguf_file, cache=tmp_path)
    assert os.listdir(tmp_path) == []


def test_a_fingerprint_is_the_model_not_its_place(tiny_model, tmp_path):
    copy = shutil.copytree(tiny_model, tmp_path / "copy")
    assert fingerprint(copy) == fingerprint(tiny_model)
    other = make_model(tmp_path / "other", seed=1)  # the same config, other weights
    assert (other / "config.json").read_bytes() == (tiny_model / "config.json").read_bytes()
    assert fingerprint(other) != fingerprint(tiny_model)


@pytest.mark.parametrize(
    ("where", "gguf", "match"),
    [
        ("missing", None, "does not exist"),
        ("empty", None, "has no config.json: give a transformers folder, or a GGUF file"),
        ("empty", "no.gguf", "GGUF file .*no.gguf' does not exist"),
    ],
)
def test_a_model_that_is_not_there_is_refused_by_name(tmp_path, where, gguf, match):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=match):
        resolve(tmp_path / where, gguf, cache=tmp_path / "cache")


def test_a_fingerprint_sees_every_byte_of_the_weights_and_the_tokenizer(tiny_model, tmp_path):
    from safetensors.torch import load_file, save_file

    copy = shutil.copytree(tiny_model, tmp_path / "copy")
    weights = load_file(copy / "model.safetensors")
    name = sorted(weights)[len(weights) // 2]  # a tensor in the middle of the file
    weights[name] = weights[name] * 1.01
    save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
    assert fingerprint(copy) != fingerprint(tiny_model)
    retokenized = shutil.copytree(tiny_model, tmp_path / "retokenized")
    config = retokenized / "tokenizer_config.json"
    config.write_text(config.read_text().replace("<pad>", "<PAD>"))
    assert fingerprint(retokenized) != fingerprint(tiny_model)
