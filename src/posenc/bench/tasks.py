"""Bench tasks: seeded, in-process generators of token sequences and of the tokens scored.

Five tasks, each with a problem length ``n``:

``"copy"``, ``"reverse"``, ``"sort"``
    ``[BOS] x_1 .. x_n [SEP] y_1 .. y_n [EOS]`` with ``x`` drawn uniformly from an
    alphabet (10 symbols for copy and reverse, 6 for sort, so that a sorted multiset has
    repeated symbols) and ``y`` the copy, the reversal or the sorted multiset of ``x``.
``"add"``
    ``[BOS] a_0 b_0 c_0 a_1 b_1 c_1 .. a_{n-1} b_{n-1} c_{n-1} [SEP] c_n [EOS]``: two
    ``n``-digit numbers (leading zeros allowed) added column by column, least-significant
    digit first: each column holds the two operand digits and the sum digit ``c_i``, and
    the final carry ``c_n`` follows ``[SEP]``. Each sum digit depends on its own column and
    on the carry out of the column before (itself a function of that column's three
    digits), at fixed distances: a rule that holds at every length, which a model can
    learn once and apply at any length only if its positional scheme lets it find "three
    tokens back" everywhere. (With the operands written one after the other and the sum
    after them, a two-layer model did not learn the task within a few thousand steps.)
``"passkey"``
    Passkey retrieval (Mohtashami & Jaggi, 2023), in the bench's tokens:
    ``[BOS] f_1 .. f_j <key> k_1 .. k_4 f_{j+1} .. f_n [SEP] k_1 .. k_4 [EOS]``: ``n``
    filler symbols (drawn from four) with a four-digit key after a ``<key>`` marker at a
    uniformly drawn place ``j`` in ``0 .. n``, and the key asked for after ``[SEP]``. A
    model answers right at any length only if it can find the marker wherever it is: the
    task of the long-context evaluations, at the bench's scale.
``"lm"``
    Character-level language modelling: ``[BOS] t_1 .. t_n``, a window of exactly ``n``
    characters of a text; every character is predicted. The text is a UTF-8 file or, by
    default, a synthetic text (:func:`synthetic_text`) drawn from a small probabilistic
    grammar with nested clauses, brackets and number agreement across them. Training
    windows come from the first 90% of the text and evaluation windows from the last
    10%; the vocabulary is the characters of the training part plus ``<unk>``.

For copy, reverse and sort the scored tokens (``target_mask``) are ``y`` and ``[EOS]``; for
add the sum digits ``c_0 .. c_n`` and ``[EOS]``; for passkey the key after ``[SEP]`` and
``[EOS]``; for lm, all ``n`` characters. Sequences
of different lengths in one batch are padded with ``<pad>`` (id 0) at the end, where the
target mask is False; a causal model never lets a pad token change the predictions
before it.
"""

from __future__ import annotations

import abc
import functools
import math
import os
from typing import Any

import numpy as np
from torch import Tensor

from .._checks import check_choice, check_int, describe
from .batches import _sample, make_batch
from .grammar import synthetic_text
from .plugins import registered_task, task_names
from .spec import TASKS

PAD, BOS = "<pad>", "<bos>"
SEP, EOS, UNK = "<sep>", "<eos>", "<unk>"
KEY = "<key>"
KEY_DIGITS = 4  # digits of a passkey
_FILLER = ("w", "x", "y", "z")  # the passkey task's filler symbols

_ALPHABETS = {"copy": 10, "reverse": 10, "sort": 6}


def max_positions(task: str | Task, length: int) -> int:
    """Number of positions of a sequence of problem length ``length`` (tokens per row).

    A batch of problem length ``length`` has exactly this many columns, and the model
    sees positions ``0 .. max_positions(task, length) - 1``.

    Args:
        task: A name from :data:`posenc.bench.spec.TASKS` or a :class:`Task`.
        length: The problem length: symbols of the input (copy, reverse, sort), digits
            per operand (add) or characters of the window (lm); an int >= 1.

    Returns:
        ``2n + 3`` for copy, reverse and sort, ``3n + 4`` for add, ``n + 12`` for passkey,
        ``n + 1`` for lm.

    Example:
        >>> max_positions("copy", 16), max_positions("add", 4), max_positions("lm", 64)
        (35, 16, 65)
        >>> max_positions("passkey", 100)
        112
    """
    name = task.name if isinstance(task, Task) else check_choice(task, "task", TASKS)
    n = check_int(length, "length", minimum=1)
    if name == "add":
        return 3 * n + 4  # BOS, n columns of 3 digits, SEP, final carry, EOS
    if name == "passkey":
        return n + 2 * KEY_DIGITS + 4  # BOS, n fillers, <key> and the key, SEP, key, EOS
    if name == "lm":
        return n + 1  # BOS and n characters
    return 2 * n + 3  # BOS, n symbols, SEP, n symbols, EOS


class Task(abc.ABC):
    """A bench task: its vocabulary and a seeded generator of batches.

    Build one with :func:`make_task`. Subclasses define how one problem is drawn.

    Attributes:
        name: The task's name (one of :data:`posenc.bench.spec.TASKS`).
        vocab: The token strings; token id ``i`` is ``vocab[i]``; ``vocab[0]`` is
            ``"<pad>"`` and ``vocab[1]`` ``"<bos>"``.
        vocab_size: ``len(vocab)``.
        pad_id: 0.
    """

    name: str
    vocab: tuple[str, ...]
    pad_id = 0

    @property
    def vocab_size(self) -> int:
        """Number of token ids (``len(vocab)``)."""
        return len(self.vocab)

    def token_id(self, token: str) -> int:
        """The id of the token string ``token`` (ValueError if it is not in the vocabulary)."""
        try:
            return self.vocab.index(token)
        except ValueError:
            raise ValueError(f"{token!r} is not in the {self.name} vocabulary") from None

    def max_positions(self, length: int) -> int:
        """``max_positions(self, length)``: the sequence length of problem length ``length``."""
        return max_positions(self, length)

    def decode(self, ids: Any) -> list[str]:
        """The token strings of a 1-D sequence of ids (pads included)."""
        return [self.vocab[int(i)] for i in ids]

    def batch(
        self,
        n: int,
        length: int | tuple[int, int],
        generator: np.random.Generator,
        *,
        split: str = "train",
    ) -> tuple[Tensor, Tensor]:
        """``n`` sequences of problem length ``length`` (or each drawn from a range).

        Args:
            n: Number of sequences (>= 1).
            length: A problem length (every sequence has it) or an inclusive range
                ``(lo, hi)`` from which each sequence's length is drawn uniformly.
            generator: The ``numpy.random.Generator`` every random choice comes from: the
                same generator state gives the same batch.
            split: ``"train"`` or ``"eval"``; only lm draws its windows from different
                parts of the text (first 90% / last 10%).

        Returns:
            ``(tokens, target_mask)``: ``tokens`` an int64 tensor ``(n, T)`` with
            ``T = max_positions(task, longest length drawn)``, shorter rows padded with
            id 0 at the end; ``target_mask`` a bool tensor ``(n, T)``, True at the tokens
            to predict (a model scores ``tokens[:, t]`` with its output at ``t - 1``).

        Example:
            >>> task = make_task("reverse")
            >>> tokens, mask = task.batch(1, 3, np.random.default_rng(0))
            >>> task.decode(tokens[0])
            ['<bos>', 'i', 'g', 'f', '<sep>', 'f', 'g', 'i', '<eos>']
            >>> mask[0].tolist()
            [False, False, False, False, False, True, True, True, True]
        """
        return make_batch(self, n, length, generator, split=split)

    def sample(
        self, lengths: Any, generator: np.random.Generator, split: str = "train"
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """One problem per length of ``lengths``, as the bench's task protocol has it
        (:mod:`posenc.bench.plugins`): ``(token ids, scored)`` with ``scored`` a bool
        array of the same length, True at the tokens to predict.

        Example:
            >>> tokens, scored = make_task("copy").sample([2], np.random.default_rng(0))[0]
            >>> tokens.tolist(), scored.tolist()
            ([1, 12, 10, 2, 12, 10, 3], [False, False, False, False, True, True, True])
        """
        rows = self._rows(np.asarray(lengths, dtype=np.int64), generator, split)
        out = []
        for row, scored in rows:
            if not isinstance(scored, np.ndarray):  # the scored tokens are the last ones
                first, scored = scored, np.zeros(len(row), dtype=bool)
                scored[first:] = True
            out.append((row, scored))
        return out

    @abc.abstractmethod
    def problem_lengths(self, tokens: Tensor) -> Tensor:
        """The problem length of each row of a batch made by :meth:`batch`.

        Args:
            tokens: ``(batch, T)`` token ids.

        Returns:
            An int64 tensor ``(batch,)``.
        """

    @abc.abstractmethod
    def _rows(
        self, lengths: np.ndarray, generator: np.random.Generator, split: str
    ) -> list[tuple[np.ndarray, int | np.ndarray]]:
        """One ``(token ids, scored)`` per problem length: ``scored`` is the index of the
        first scored token (all later ones are scored too) or a bool mask of the row."""


class AlgorithmicTask(Task):
    """copy, reverse, sort: ``[BOS] input [SEP] target [EOS]``; add: columns (module docstring).

    Args:
        name: ``"copy"``, ``"reverse"``, ``"sort"`` or ``"add"``.

    Example:
        >>> task = make_task("add")
        >>> tokens, _ = task.batch(1, 2, np.random.default_rng(3))
        >>> " ".join(task.decode(tokens[0]))  # 08 + 21 = 029: columns 8+1=9, 0+2=2, carry 0
        '<bos> 8 1 9 0 2 2 <sep> 0 <eos>'
        >>> task.read_numbers(tokens[0])
        (8, 21, 29)
    """

    def __init__(self, name: str) -> None:
        self.name = check_choice(name, "name", ("copy", "reverse", "sort", "add"))
        if name == "add":
            symbols = tuple("0123456789")
            self.vocab = (PAD, BOS, SEP, EOS, *symbols)
        else:
            symbols = tuple("abcdefghijklmnopqrstuvwxyz"[: _ALPHABETS[name]])
            self.vocab = (PAD, BOS, SEP, EOS, *symbols)
        self.symbols = symbols
        self.first_symbol = len(self.vocab) - len(symbols)  # id of symbols[0]
        self.bos_id, self.sep_id, self.eos_id = 1, 2, 3

    def _rows(
        self, lengths: np.ndarray, generator: np.random.Generator, split: str
    ) -> list[tuple[np.ndarray, int | np.ndarray]]:
        k, first = len(self.symbols), self.first_symbol
        operands = 2 if self.name == "add" else 1
        # One draw for the whole batch: (batch, operands, longest) symbol indices.
        draws = generator.integers(0, k, size=(len(lengths), operands, int(lengths.max())))
        rows: list[tuple[np.ndarray, int | np.ndarray]] = []
        for n, draw in zip(lengths.tolist(), draws, strict=True):
            x = draw[0, :n]  # (n,) symbol indices
            if self.name == "copy":
                source, target = x, x
            elif self.name == "reverse":
                source, target = x, x[::-1]
            elif self.name == "sort":
                source, target = x, np.sort(x)
            else:  # add: columns (a_i, b_i, sum digit), least-significant first
                rows.append(self._add_row(x, draw[1, :n]))
                continue
            prefix = np.concatenate([[self.bos_id], source + first, [self.sep_id]])
            row = np.concatenate([prefix, target + first, [self.eos_id]]).astype(np.int64)
            rows.append((row, len(prefix)))
        return rows

    def _add_row(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One add sequence and its scored tokens (the sum digits, the carry and EOS)."""
        first, carry, columns = self.first_symbol, 0, []
        for da, db in zip(a.tolist(), b.tolist(), strict=True):
            carry, digit = divmod(da + db + carry, 10)
            columns += [da, db, digit]
        body = np.asarray(columns, dtype=np.int64) + first  # (3n,)
        row = np.concatenate([[self.bos_id], body, [self.sep_id, carry + first, self.eos_id]])
        scored = np.zeros(len(row), dtype=bool)
        scored[3 : 3 * len(a) + 1 : 3] = True  # c_0 .. c_{n-1}: the third of each column
        scored[-2:] = True  # the final carry and EOS
        return row.astype(np.int64), scored

    def problem_lengths(self, tokens: Tensor) -> Tensor:
        sep = (tokens == self.sep_id).long().argmax(dim=1)  # (B,) index of [SEP]
        if self.name == "add":
            return (sep - 1) // 3  # BOS, n columns of three digits
        return sep - 1  # BOS, n symbols

    def read_numbers(self, row: Tensor) -> tuple[int, int, int]:
        """add only: ``(a, b, sum)`` as written in one sequence (digits least-significant first).

        Args:
            row: A 1-D tensor of token ids of one ``"add"`` sequence (padding allowed).

        Returns:
            The two operands and the sum that the tokens spell.
        """
        if self.name != "add":
            raise ValueError(f"read_numbers is for the add task, not {self.name!r}")
        ids = [int(i) for i in row]
        sep = ids.index(self.sep_id)
        columns = ids[1:sep]  # a_0 b_0 c_0 a_1 b_1 c_1 ...

        def number(part: list[int]) -> int:  # least-significant digit first
            return sum((i - self.first_symbol) * 10**rank for rank, i in enumerate(part))

        total = [*columns[2::3], ids[sep + 1]]  # the sum digits, then the final carry
        return number(columns[0::3]), number(columns[1::3]), number(total)


class PasskeyTask(Task):
    """passkey: a four-digit key after a ``<key>`` marker somewhere in ``n`` filler symbols,
    asked for after ``[SEP]`` (module docstring).

    Example:
        >>> task = make_task("passkey")
        >>> tokens, mask = task.batch(1, 6, np.random.default_rng(1))
        >>> " ".join(task.decode(tokens[0]))
        '<bos> x y z z w w <key> 8 9 2 3 <sep> 8 9 2 3 <eos>'
        >>> task.decode(tokens[0][mask[0]])
        ['8', '9', '2', '3', '<eos>']
        >>> task.problem_lengths(tokens).tolist()
        [6]
    """

    name = "passkey"

    def __init__(self) -> None:
        self.vocab = (PAD, BOS, SEP, EOS, KEY, *"0123456789", *_FILLER)
        self.bos_id, self.sep_id, self.eos_id, self.key_id = 1, 2, 3, 4
        self.first_digit, self.first_filler = 5, 15

    def _rows(
        self, lengths: np.ndarray, generator: np.random.Generator, split: str
    ) -> list[tuple[np.ndarray, int | np.ndarray]]:
        longest = int(lengths.max())
        fillers = generator.integers(0, len(_FILLER), size=(len(lengths), longest))
        keys = generator.integers(0, 10, size=(len(lengths), KEY_DIGITS)) + self.first_digit
        places = generator.integers(0, lengths + 1)  # (batch,): fillers before the key
        rows: list[tuple[np.ndarray, int | np.ndarray]] = []
        for n, filler, key, place in zip(lengths.tolist(), fillers, keys, places, strict=True):
            body = filler[:n] + self.first_filler
            parts = [[self.bos_id], body[:place], [self.key_id], key, body[place:],
                     [self.sep_id]]  # fmt: skip
            prefix = np.concatenate(parts)
            rows.append(
                (np.concatenate([prefix, key, [self.eos_id]]).astype(np.int64), len(prefix))
            )
        return rows

    def problem_lengths(self, tokens: Tensor) -> Tensor:
        sep = (tokens == self.sep_id).long().argmax(dim=1)  # (B,) index of [SEP]
        return sep - 2 - KEY_DIGITS  # BOS, <key> and the key


class TextTask(Task):
    """lm: windows of exactly ``n`` characters of a text, after ``[BOS]``; all scored.

    Args:
        text: The text (a str of at least 20 characters); the first 90% is for
            training, the rest for evaluation.
        source: What the text is (shown in error messages), e.g. its path.

    Attributes:
        train_ids, eval_ids: The two parts of the text as int64 arrays of token ids.

    Example:
        >>> task = TextTask("abc" * 18 + "abxabc")  # 54 characters to train, 6 to evaluate
        >>> task.vocab
        ('<pad>', '<bos>', '<unk>', 'a', 'b', 'c')
        >>> tokens, mask = task.batch(1, 4, np.random.default_rng(0), split="eval")
        >>> task.decode(tokens[0]), mask[0].tolist()  # "x" is not in the training part
        (['<bos>', '<unk>', 'a', 'b', 'c'], [False, True, True, True, True])
    """

    def __init__(self, text: str, *, source: str = "text") -> None:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {describe(text)}")
        if len(text) < 20:
            raise ValueError(
                f"the lm text ({source}) must have at least 20 characters to split 90/10 into "
                f"training and evaluation parts, got {len(text)}"
            )
        self.name = "lm"
        self.source = source
        cut = math.ceil(0.9 * len(text))
        train, held_out = text[:cut], text[cut:]
        self.vocab = (PAD, BOS, UNK, *sorted(set(train)))
        self.bos_id, self.unk_id = 1, 2
        index = {c: i for i, c in enumerate(self.vocab) if i > 2}
        self.train_ids = np.fromiter((index[c] for c in train), np.int64, len(train))
        self.eval_ids = np.fromiter(
            (index.get(c, self.unk_id) for c in held_out), np.int64, len(held_out)
        )

    def _rows(
        self, lengths: np.ndarray, generator: np.random.Generator, split: str
    ) -> list[tuple[np.ndarray, int | np.ndarray]]:
        ids = self.train_ids if split == "train" else self.eval_ids
        longest = int(lengths.max())
        if longest > len(ids):
            raise ValueError(
                f"an lm window of {longest} characters does not fit in the {split} part of "
                f"the text ({self.source}: {len(ids)} characters)"
            )
        starts = generator.integers(0, len(ids) - lengths + 1)  # (batch,)
        return [
            (np.concatenate([[self.bos_id], ids[s : s + n]]), 1)
            for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)
        ]

    def problem_lengths(self, tokens: Tensor) -> Tensor:
        return (tokens != self.pad_id).long().sum(dim=1) - 1  # (B,) characters after BOS

    def eval_windows(self, length: int, protocol: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """The held-out text as windows of ``length`` characters, each after ``[BOS]``.

        ``"tiled"``: non-overlapping windows over the first ``⌊N/length⌋·length``
        characters, every character scored once with the context of its own window
        (Press et al.'s protocol). ``"sliding"``: windows every ``S = ⌈length/4⌉``
        characters; the first scores all of its characters, each later one only its last
        ``S``, so each character is scored once with at least ``length - S`` before it.

        Example:
            >>> task = TextTask("abc" * 18 + "abcabc")  # 6 held-out characters
            >>> [(w.tolist(), int(s.sum())) for w, s in task.eval_windows(3, "tiled")]
            [([1, 3, 4, 5], 3), ([1, 3, 4, 5], 3)]
            >>> [int(s.sum()) for _, s in task.eval_windows(4, "sliding")]
            [4, 1, 1]
        """
        ids, n = self.eval_ids, len(self.eval_ids)
        if length > n:
            raise ValueError(
                f"an lm window of {length} characters does not fit in the eval part of the "
                f"text ({self.source}: {n} characters)"
            )
        stride = length if protocol == "tiled" else -(-length // 4)
        windows = []
        for start in range(0, n - length + 1, stride):
            tokens = np.concatenate([[self.bos_id], ids[start : start + length]])
            scored = np.zeros(length + 1, dtype=bool)
            scored[1 if start == 0 else length + 1 - stride :] = True
            windows.append((tokens.astype(np.int64), scored))
        return windows


def get_task(name: str, *, text: str | os.PathLike[str] | None = None) -> Any:
    """The task called ``name``: a built-in (:func:`make_task`) or a registered one
    (:func:`posenc.bench.plugins.register_task`).

    Example:
        >>> get_task("sort").name
        'sort'
    """
    check_choice(name, "task", task_names())
    found = registered_task(name)
    if found is None:
        return make_task(name, text=text)
    if text is not None:
        raise ValueError(f"text={text!r} applies to task 'lm' only, got task {name!r}")
    return found


# Problems drawn to measure a task without max_positions: per length, with this seed.
_PROBE, _PROBE_SEED = 64, 0


def task_max_positions(task: Any, length: int) -> int:
    """Positions of the longest problem of length ``length``: the task's
    ``max_positions(length)`` if it has one, else the longest of 64 problems drawn
    (with a fixed seed) at that length.

    Example:
        >>> task_max_positions(make_task("copy"), 16)
        35
    """
    n = check_int(length, "length", minimum=1)
    if isinstance(task, Task):
        return max_positions(task, n)
    method = getattr(task, "max_positions", None)
    if method is None:
        rows = _sample(task, np.full(_PROBE, n), np.random.default_rng(_PROBE_SEED), "eval")
        return max(len(tokens) for tokens, _ in rows)
    value = method(n)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
        raise ValueError(
            f"task {task.name!r}: max_positions({n}) must be an int >= 2, got {value!r}"
        )
    return int(value)


def make_task(name: str, *, text: str | os.PathLike[str] | None = None) -> Task:
    """The task called ``name``; for ``"lm"``, on the text file ``text`` or the synthetic text.

    Args:
        name: One of :data:`posenc.bench.spec.TASKS`.
        text: lm only: path of a UTF-8 text file; ``None`` uses :func:`synthetic_text`.

    Returns:
        A :class:`Task`.

    Raises:
        ValueError: An unknown name, ``text`` with a task other than lm, a file that is
            not UTF-8 or too short.
        FileNotFoundError: No file at ``text``.

    Example:
        >>> make_task("copy").vocab_size
        14
    """
    check_choice(name, "task", TASKS)
    if name != "lm":
        if text is not None:
            raise ValueError(f"text={text!r} applies to task 'lm' only, got task {name!r}")
        return PasskeyTask() if name == "passkey" else AlgorithmicTask(name)
    if text is None:
        return _synthetic_task()
    path = os.fspath(text)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"lm text file {path!r} does not exist (or is not a file)")
    try:
        with open(path, encoding="utf-8") as handle:
            content = handle.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"lm text file {path!r} is not valid UTF-8: {exc}") from None
    return TextTask(content, source=path)


@functools.lru_cache(maxsize=1)
def _synthetic_task() -> TextTask:
    return TextTask(synthetic_text(), source="synthetic grammar")
