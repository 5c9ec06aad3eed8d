"""What the tests of Hugging Face configs and models share: the sizes of a tiny model.

Two layers and hidden size 256 (4 heads of 64) keep every model built from a config fast
on a CPU; token ids 0 and 1 are padding and start/end, as the configs' defaults would put
them outside the 128-token vocabulary.
"""

SMALL = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "vocab_size": 128,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 1,
}
