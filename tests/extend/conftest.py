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


def _permuted(weight: Any, heads: int) -> Any:
    """llama.cpp's order of a query or key projection's rows (pairs interleaved per
    head), which ``transformers`` undoes when it reads a GGUF file."""
    rows = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, rows, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


_GGUF_NAMES = (
    ("input_layernorm", "attn_norm"), ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
    ("post_attention_layernorm", "ffn_norm"), ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"),
)  # fmt: skip


def write_gguf(folder: Path, path: Path) -> Path:
    """The model in ``folder`` as a float32 GGUF file of llama.cpp's layout (the keys,
    tensor names and byte-level BPE tokenizer of SmolLM2's file), written with ``gguf``."""
    import json

    import gguf
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_vocab_size(config.vocab_size)
    bpe = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    tokens = sorted(bpe["vocab"], key=bpe["vocab"].get)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in ("<pad>", "<s>") else 1 for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(0)
    state = model.state_dict()
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}  # fmt: skip
    for layer in range(config.num_hidden_layers):
        for ours, theirs in _GGUF_NAMES:
            names[f"model.layers.{layer}.{ours}.weight"] = f"blk.{layer}.{theirs}.weight"
    for ours, theirs in names.items():
        tensor = state[ours].numpy().astype(np.float32)
        if theirs.endswith("attn_q.weight"):
            tensor = _permuted(tensor, config.num_attention_heads)
        elif theirs.endswith("attn_k.weight"):
            tensor = _permuted(tensor, config.num_key_value_heads)
        writer.add_tensor(theirs, np.ascontiguousarray(tensor))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
