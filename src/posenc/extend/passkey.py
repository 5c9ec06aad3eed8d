"""Passkey retrieval: a five-digit key hidden at a depth of a long filler text, asked for
at the end (the task of Mohtashami & Jaggi, 2023, "Landmark Attention", §4.2, here in
posenc's own words).

The prompt is built in token ids, to exactly the length asked for: an instruction, then
filler (one short paragraph of plain sentences, repeated) with the key's sentence
inserted at ``depth`` (the fraction of the filler before it, rounded down to a whole
paragraph), then the question, ending where the key would be written:

    ``<instruction> <filler ... key sentence ... filler> <question, "... The pass key is">``

The model continues greedily; the answer is right when the first number in the
continuation is the key (:func:`is_right`). The key of a trial depends on the trial, the
length and the depth only, so every scaling is asked the same prompts.

Nothing here imports PyTorch: a tokenizer is anything with ``encode(text,
add_special_tokens=...)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FILLER", "INSTRUCTION", "QUESTION", "Prompt", "is_right", "passkey", "prompt"]

INSTRUCTION = (
    "A pass key is hidden in the long text below. Read the text, find the pass key and "
    "remember it: you will be asked for it at the end."
)
FILLER = (
    " The river runs down to the sea. The hills are green in the spring. The birds sing at"
    " dawn. We walk on, and then we come home again."
)
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " Now, what is the pass key? The pass key is"
_DIGITS = re.compile(r"\d+")


def passkey(trial: int, length: int, depth: float) -> str:
    """The five-digit key of a trial at a length and depth (10000..99999).

    Example:
        >>> passkey(0, 4096, 0.5) == passkey(0, 4096, 0.5), len(passkey(3, 100, 0.0))
        (True, 5)
    """
    rng = np.random.default_rng([int(trial), int(length), round(float(depth) * 1_000_000)])
    return str(int(rng.integers(10_000, 100_000)))


@dataclass(frozen=True)
class Prompt:
    """A passkey prompt: its token ids, the key, and where the key's sentence starts."""

    ids: list[int]
    key: str
    needle_at: int


def prompt(tokenizer: Any, length: int, depth: float, key: str) -> Prompt:
    """The passkey prompt of exactly ``length`` tokens with ``key`` at ``depth``.

    The instruction is encoded with the tokenizer's special tokens (a BOS where the
    tokenizer adds one), the rest without; the filler is whole paragraphs, the last one
    cut where the question must start.

    Raises:
        ValueError: ``length`` leaves no room for filler (the message says the least).
    """
    head = list(tokenizer.encode(INSTRUCTION, add_special_tokens=True))
    needle = list(tokenizer.encode(NEEDLE.format(key=key), add_special_tokens=False))
    question = list(tokenizer.encode(QUESTION, add_special_tokens=False))
    paragraph = list(tokenizer.encode(FILLER, add_special_tokens=False))
    room = length - len(head) - len(needle) - len(question)
    if room < len(paragraph):
        least = length - room + len(paragraph)
        raise ValueError(
            f"a passkey prompt of {length} tokens leaves no room for filler: it needs at "
            f"least {least} tokens with this tokenizer"
        )
    filler = (paragraph * (room // len(paragraph) + 1))[:room]
    cut = int(depth * room) // len(paragraph) * len(paragraph)
    ids = head + filler[:cut] + needle + filler[cut:] + question
    return Prompt(ids=ids, key=key, needle_at=len(head) + cut)


def is_right(continuation: str, key: str) -> bool:
    """Whether the first number in ``continuation`` is ``key``.

    Example:
        >>> is_right(" 52719. Remember", "52719"), is_right(" 5271", "52719")
        (True, False)
        >>> is_right(" of the we are", "52719")
        False
    """
    found = _DIGITS.search(continuation)
    return found is not None and found[0] == key
