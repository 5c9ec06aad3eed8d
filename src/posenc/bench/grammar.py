"""The bench's default lm text: sentences of a small probabilistic grammar.

Nouns and verbs that agree in number, with relative clauses and bracketed sentences
between a subject and its verb, so that a character-level model has long-range structure
to learn. The text is generated with a fixed seed and is the same in every process.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["synthetic_text"]

_SYNTHETIC_SEED = 20240601  # the synthetic text is the same in every run
_SYNTHETIC_CHARS = 300_000

_NOUNS = (
    ("cat", "cats"),
    ("dog", "dogs"),
    ("bird", "birds"),
    ("child", "children"),
    ("teacher", "teachers"),
    ("farmer", "farmers"),
    ("mouse", "mice"),
)
_TRANSITIVE = (("sees", "see"), ("likes", "like"), ("chases", "chase"), ("helps", "help"))
_INTRANSITIVE = (("runs", "run"), ("sleeps", "sleep"), ("sings", "sing"), ("waits", "wait"))
_ADJECTIVES = ("old", "small", "red", "happy", "quiet")
_DETERMINERS = (("the", "a", "one"), ("the", "some", "two"))  # singular, plural
_MAX_DEPTH = 4


class _Grammar:
    """Sentences whose verbs agree in number with subjects that nested clauses separate.

    ``S → NP_x VP_x``; ``NP_x → Det_x [Adj] Noun_x [RC_x] [( S )]``;
    ``RC_x → that VP_x`` (subject relative: agrees with the head noun) or
    ``that NP_y TV_y`` (object relative: agrees with its own subject); ``VP_x → IV_x`` or
    ``TV_x NP_y``. The number ``x`` of a subject is drawn at random, and a relative clause
    or a bracketed sentence between a subject and its verb makes the agreement
    long-range; brackets nest. Each level of nesting halves the chance of another.
    """

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def pick(self, options: tuple[Any, ...]) -> Any:
        return options[int(self.rng.integers(len(options)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def sentence(self, depth: int) -> list[str]:
        number = int(self.rng.integers(2))  # 0 singular, 1 plural
        return self.noun_phrase(number, depth) + self.verb_phrase(number, depth)

    def noun_phrase(self, number: int, depth: int) -> list[str]:
        words = [self.pick(_DETERMINERS[number])]
        if self.chance(0.3):
            words.append(self.pick(_ADJECTIVES))
        words.append(self.pick(_NOUNS)[number])
        deeper = depth < _MAX_DEPTH
        if deeper and self.chance(0.4 * 0.5**depth):
            if self.chance(0.5):  # subject relative clause
                words += ["that", *self.verb_phrase(number, depth + 1)]
            else:  # object relative clause
                other = int(self.rng.integers(2))
                inner = self.noun_phrase(other, depth + 1)
                words += ["that", *inner, self.pick(_TRANSITIVE)[other]]
        if deeper and self.chance(0.2 * 0.5**depth):
            words += ["(", *self.sentence(depth + 1), ")"]
        return words

    def verb_phrase(self, number: int, depth: int) -> list[str]:
        if self.chance(0.5):
            return [self.pick(_INTRANSITIVE)[number]]
        other = int(self.rng.integers(2))
        return [self.pick(_TRANSITIVE)[number], *self.noun_phrase(other, depth + 1)]


@functools.lru_cache(maxsize=1)
def synthetic_text() -> str:
    """The default lm text: about 300 KB from a small grammar, the same in every process.

    Sentences of a toy English (nouns and verbs that agree in number, relative clauses,
    bracketed sentences nested inside noun phrases) end with ``" ."``, and a line break
    follows every sentence; the generator's seed is fixed, so the text never changes.

    Returns:
        A str of at least 300,000 characters: lowercase letters, spaces, ``( ) .`` and
        newlines.

    Example:
        >>> synthetic_text()[:60]
        'one bird ( one child likes two dogs ) sees two dogs that a h'
    """
    grammar = _Grammar(np.random.default_rng(_SYNTHETIC_SEED))
    lines, size = [], 0
    while size < _SYNTHETIC_CHARS:
        line = " ".join([*grammar.sentence(0), "."]) + "\n"
        lines.append(line)
        size += len(line)
    return "".join(lines)
