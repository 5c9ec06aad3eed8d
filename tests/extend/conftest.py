"""What the tests of posenc.extend share: a tiny Llama model folder with a real tokenizer.

The model has a context of 128 positions (``max_position_embeddings``), so that 2x and
4x are 256 and 512 tokens, and a real model's attention shape: heads of 64 with grouped keys
(8 query heads, 2 key/value heads). Its tokenizer is a byte-level BPE trained here on the
passkey prompt's sentences and on the default text, so that prompts and windows are made
of real merges, and digits are single tokens as in SmolLM2's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

CONTEXT = 128


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from posenc.extend import passkey
    from posenc.extend.texts import load_text

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    prompt = [passkey.INSTRUCTION, passkey.FILLER, passkey.QUESTION, passkey.NEEDLE]
    corpus = [*(line * 50 for line in prompt), load_text()[0][:20_000]]
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<pad>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="<s>",
                                   pad_token="<pad>")  # fmt: skip


def make_model(folder: Path, *, seed: int = 0, **config: Any) -> Path:
    """A tiny Llama causal LM with the tokenizer, saved in ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tokenizer()
    torch.manual_seed(seed)
    settings = {
        "vocab_size": len(tokenizer),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": CONTEXT,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 1,
        **config,
    }
    model = LlamaForCausalLM(LlamaConfig(**settings)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the tiny model (built once per session)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return make_model(tmp_path_factory.mktemp("tiny-llama"))
