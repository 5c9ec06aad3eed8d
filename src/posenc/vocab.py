"""A small word vocabulary, enough to run the "I am a robot" walk-through as written.

tokens → vocabulary ids → embedding lookup → + positional encoding → dropout. Any
integer ids work with the embedding modules; this class only makes the first step
reproducible.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

from ._checks import describe

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")


def tokenize(text: str) -> list[str]:
    """Lower-cased words, punctuation dropped: ``"I am a robot."`` → ``['i', 'am', 'a', 'robot']``.

    Example:
        >>> tokenize("Birds fly above the clouds!")
        ['birds', 'fly', 'above', 'the', 'clouds']
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {describe(text)}")
    return _WORD.findall(text.lower())


class Vocabulary:
    """Maps tokens to integer ids and back (``stoi`` / ``itos``).

    Ids ``0`` and ``1`` are the padding and unknown tokens; the words follow in sorted
    order, so the same texts always give the same ids.

    Args:
        tokens: The words of the vocabulary (duplicates are ignored).
        pad: The padding token (id 0).
        unk: The token that stands for every word not in the vocabulary (id 1).

    Example:
        >>> vocab = Vocabulary.from_texts(["I am a robot", "a robot am I"])
        >>> vocab.itos
        ['<pad>', '<unk>', 'a', 'am', 'i', 'robot']
        >>> vocab.encode("I am a robot"), vocab.encode("I am a cat")
        ([4, 3, 2, 5], [4, 3, 2, 1])
    """

    def __init__(self, tokens: Iterable[str], *, pad: str = "<pad>", unk: str = "<unk>") -> None:
        words = sorted(set(tokens) - {pad, unk})
        for word in words:
            if not isinstance(word, str):
                raise TypeError(f"tokens must be str, got {describe(word)}")
        self.pad, self.unk = pad, unk
        self.itos: list[str] = [pad, unk, *words]
        self.stoi: dict[str, int] = {token: i for i, token in enumerate(self.itos)}

    @classmethod
    def from_texts(cls, texts: Iterable[str], **kwargs: str) -> Vocabulary:
        """Build the vocabulary from the :func:`tokenize` words of ``texts``."""
        if isinstance(texts, str):
            raise TypeError("texts must be an iterable of strings, not one string")
        return cls((token for text in texts for token in tokenize(text)), **kwargs)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def unk_id(self) -> int:
        return 1

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} tokens)"

    def encode(self, text: str | Sequence[str]) -> list[int]:
        """Ids of a text (tokenized with :func:`tokenize`) or of a list of tokens."""
        tokens = tokenize(text) if isinstance(text, str) else list(text)
        return [self.stoi.get(token, self.unk_id) for token in tokens]

    def encode_batch(self, texts: Sequence[str], *, length: int | None = None) -> np.ndarray:
        """int64 array ``(len(texts), length)``, right-padded with :attr:`pad_id`.

        ``length`` defaults to the longest text; a text longer than ``length`` is an error.
        """
        rows = [self.encode(text) for text in texts]
        longest = max((len(row) for row in rows), default=0)
        if length is None:
            length = longest
        elif longest > length:
            raise ValueError(f"a text has {longest} tokens, more than length={length}")
        batch = np.full((len(rows), length), self.pad_id, dtype=np.int64)
        for i, row in enumerate(rows):
            batch[i, : len(row)] = row
        return batch

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids``; an id outside the vocabulary is an error."""
        out = []
        for i in ids:
            index = int(i)
            if not 0 <= index < len(self.itos):
                raise ValueError(f"id {index} is outside the vocabulary (0..{len(self.itos) - 1})")
            out.append(self.itos[index])
        return out
