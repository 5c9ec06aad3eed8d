"""Which RoPE scaling for my model? Context extension measured on a Hugging Face causal LM.

posenc implements every RoPE scaling that shipping models use; this package measures
them on the user's own model, past the context it was trained to, with posenc's exact
tables patched in (:mod:`posenc.integrations.transformers`):

* passkey retrieval (Mohtashami & Jaggi, 2023) on a grid of length × depth
  (:mod:`~posenc.extend.passkey`), greedy decoding with the model's own cache;
* perplexity on long real text shipped with Python (:mod:`~posenc.extend.texts`), one
  window per length, with the loss of each block of positions;

for a list of scalings (none, linear/PI, NTK, dynamic NTK, YaRN, Llama 3, the model's
own, LongRoPE where the model has factors, any registered scaling) at lengths up to
several times the model's context.

* :func:`evaluate` runs an evaluation: records appended as they finish, resumable, on
  this machine or on Ray through the bench's executor (:mod:`posenc.bench.executors`);
  ``posenc extend`` is its command line;
* :func:`plan` makes its probes (:class:`~posenc.extend.probes.Probe`);
* :mod:`~posenc.extend.report` writes the tables and the pictures;
* :mod:`~posenc.extend.models` finds, converts (GGUF) and scales the model.

``import posenc.extend`` imports neither PyTorch nor ``transformers``; :func:`evaluate`
needs both (``pip install "posenc[extend]"``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Probe": "probes",
    "TASKS": "probes",
    "DEFAULT_SCALINGS": "probes",
    "DEPTHS": "runner",
    "LENGTHS": "runner",
    "evaluate": "runner",
    "plan": "runner",
    "write_reports": "report",
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
