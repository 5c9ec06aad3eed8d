"""The experiment bench: what do positional encodings change in a small trained model?

The tutorials on positional encoding claim that a transformer needs order information,
that learned position embeddings do about as well as sinusoids on the lengths seen in
training, and that sinusoids "may" let a model extrapolate to longer sequences. The bench
checks such claims on a laptop in minutes: it trains tiny decoder-only transformers, one
per (task, scheme, seed), on synthetic tasks (copy, reverse, sort, add) and character-level language
modelling (lm), with each positional scheme (nope, learned, sinusoidal, rope, alibi, t5),
and reports exact match, token accuracy and perplexity by evaluation length, within and
beyond the training lengths, averaged over seeds.

* :class:`RunSpec` (with :data:`TASKS`, :data:`SCHEMES`, :data:`ROPE_EVAL_SCALINGS`)
  describes one run, and :func:`run` trains and evaluates it (PyTorch);
* :func:`register_task` and :func:`register_scheme` add tasks and schemes of your own
  (:mod:`~posenc.bench.plugins`; ``posenc bench --plugin FILE.py`` loads a file that
  registers them, :func:`load_plugin` in Python), and :func:`task_names` and
  :func:`scheme_names` list what the bench knows;
* :func:`expand` turns a configuration (tasks × schemes × seeds, shared settings; the
  presets :data:`QUICK` and :data:`FULL`) into specs, and :func:`execute` runs them,
  in parallel worker processes if asked, appending to ``results.jsonl`` and resuming
  where an interrupted bench stopped;
* :mod:`posenc.bench.report` aggregates the records over seeds into Markdown tables,
  ``summary.json`` and a plot.

``posenc bench`` is the command line of all this (:mod:`posenc.cli.bench`,
docs/bench.md); this package never imports the command. The other modules:
:mod:`~posenc.bench.records` (the results files), :mod:`~posenc.bench.workers` (the
worker pool and the progress bars),
:mod:`~posenc.bench.tasks` and :mod:`~posenc.bench.model`. The names above are
imported on first use: ``import posenc.bench`` imports neither PyTorch nor matplotlib.

Example:
    >>> from posenc.bench import QUICK, expand
    >>> [spec.scheme for spec in expand(QUICK)]  # doctest: +NORMALIZE_WHITESPACE
    ['nope', 'learned', 'sinusoidal', 'rope', 'p_rope', 'rope_learned', 'alibi', 't5',
     'kerple', 'kerple_power', 'fire', 'sandwich', 'cope']
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the submodule that defines it
_EXPORTS = {
    "RunSpec": "spec",
    "SCHEMES": "spec",
    "TASKS": "spec",
    "ROPE_EVAL_SCALINGS": "spec",
    "run": "train",
    "expand": "runner",
    "execute": "runner",
    "RunsFailedError": "runner",
    "QUICK": "runner",
    "FULL": "runner",
    "register_task": "plugins",
    "register_scheme": "plugins",
    "load_plugin": "plugins",
    "task_names": "plugins",
    "scheme_names": "plugins",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
