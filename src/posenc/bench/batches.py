"""Batches of any bench task: problems drawn through the task protocol, checked, padded.

The task protocol is described in :mod:`posenc.bench.plugins`; the built-in tasks
(:mod:`posenc.bench.tasks`) follow it too, and their ``batch`` method is
:func:`make_batch`.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._checks import check_choice, check_int, describe
from .plugins import accepts_split

__all__ = ["SPLITS", "make_batch"]

SPLITS = ("train", "eval")


def _check_lengths(length: Any) -> tuple[int, int]:
    """An int ``n`` (as ``(n, n)``) or an inclusive range ``(lo, hi)``, ``1 <= lo <= hi``."""
    if isinstance(length, numbers.Integral) and not isinstance(length, (bool, np.bool_)):
        n = check_int(length, "length", minimum=1)
        return n, n
    if isinstance(length, (tuple, list)) and len(length) == 2:
        lo = check_int(length[0], "length[0]", minimum=1)
        hi = check_int(length[1], "length[1]", minimum=1)
        if lo <= hi:
            return lo, hi
        raise ValueError(f"length range (lo, hi) needs lo <= hi, got {tuple(length)!r}")
    raise TypeError(
        f"length must be an int >= 1 or an inclusive range (lo, hi), got {describe(length)}"
    )


def _check_generator(generator: Any) -> np.random.Generator:
    if not isinstance(generator, np.random.Generator):
        raise TypeError(
            "generator must be a numpy.random.Generator (e.g. numpy.random.default_rng(0)), "
            f"got {describe(generator)}"
        )
    return generator


def make_batch(
    task: Any,
    n: int,
    length: int | tuple[int, int],
    generator: np.random.Generator,
    *,
    split: str = "train",
) -> tuple[Tensor, Tensor]:
    """``n`` problems of ``task`` padded into a batch: :meth:`Task.batch` for any task
    of the protocol (:mod:`posenc.bench.plugins`), built-in or registered.

    A registered task's problems are checked as they come: token ids within its
    vocabulary, a bool ``scored`` of the same length, the first token never scored and
    at least one scored.
    """
    n = check_int(n, "n", minimum=1)
    lo, hi = _check_lengths(length)
    generator = _check_generator(generator)
    check_choice(split, "split", SPLITS)
    lengths = np.full(n, lo) if lo == hi else generator.integers(lo, hi + 1, size=n)
    rows = _sample(task, lengths, generator, split)
    width = max(len(row) for row, _ in rows)
    tokens = torch.full((n, width), 0, dtype=torch.long)  # (n, T), padding id 0
    mask = torch.zeros((n, width), dtype=torch.bool)  # (n, T)
    for i, (row, scored) in enumerate(rows):
        tokens[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        mask[i, : len(row)] = torch.from_numpy(scored)
    return tokens, mask


def _sample(
    task: Any, lengths: np.ndarray, generator: np.random.Generator, split: str
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``task.sample`` (with ``split`` if it takes one), each problem checked."""
    if accepts_split(task):
        rows = task.sample(lengths, generator, split=split)
    else:
        rows = task.sample(lengths, generator)
    name = getattr(task, "name", "?")
    if not isinstance(rows, (list, tuple)) or len(rows) != len(lengths):
        raise ValueError(
            f"task {name!r}: sample(lengths, generator) must return one (tokens, scored) "
            f"per length ({len(lengths)}), got {describe(rows)}"
        )
    return [_checked_problem(name, len(task.vocab), row, i) for i, row in enumerate(rows)]


def _checked_problem(name: str, vocab: int, problem: Any, i: int) -> tuple[np.ndarray, np.ndarray]:
    """One ``(tokens, scored)`` of a task's sample, as int64 and bool arrays."""
    where = f"task {name!r}: problem {i} of sample()"
    if not isinstance(problem, (tuple, list)) or len(problem) != 2:
        raise ValueError(f"{where} must be a pair (tokens, scored), got {describe(problem)}")
    tokens, scored = np.asarray(problem[0]), np.asarray(problem[1])
    if tokens.ndim != 1 or tokens.size < 2 or tokens.dtype.kind not in "iu":
        raise ValueError(
            f"{where}: tokens must be a 1-D array of at least 2 integer ids, got "
            f"{describe(problem[0])}"
        )
    if tokens.min() < 0 or tokens.max() >= vocab:
        raise ValueError(
            f"{where}: token ids must lie in 0 .. {vocab - 1} (the vocabulary), got "
            f"{int(tokens.min())} .. {int(tokens.max())}"
        )
    if scored.shape != tokens.shape or scored.dtype != np.bool_:
        raise ValueError(
            f"{where}: scored must be a bool array of the tokens' length {tokens.size}, got "
            f"{describe(problem[1])}"
        )
    if scored[0] or not scored.any():
        raise ValueError(
            f"{where}: scored must mark at least one token, never the first (a model "
            "predicts each token from the ones before it)"
        )
    return tokens.astype(np.int64, copy=False), scored
