"""The implementations posenc is timed against.

The seed texts' code is not copied here: it is imported from ``tests/seed_oracles.py``,
where it is transcribed as written (the tests use it as oracles). Sources, in
``shared/seeds/``:

* 000 — ``getPositionEncoding``: a Python double loop over NumPy scalars, float64.
* 001 — ``generate_positional_encoding``: vectorised NumPy with float64 angles, then
  ``tf.cast(..., tf.float32)`` (here ``.astype(np.float32)``, no TensorFlow needed).
* 003 — the ``PositionalEncoding`` module: ``torch.zeros``, ``div_term = exp(arange *
  -ln(10000)/d)``, then ``sin`` / ``cos`` of float32 angles ``k * div_term``.

and Hugging Face's ``Speech2TextSinusoidalPositionalEmbedding.get_embedding``
(tensor2tensor frequencies, split layout ``[sin..., cos...]``, float32 angles).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

_TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from seed_oracles import (  # noqa: E402
    gen_pe_torch,
    generate_positional_encoding_numpy,
    getPositionEncoding,
    seed_positional_encoding_class,
)

__all__ = [
    "hf_get_embedding",
    "seed000_loop",
    "seed001_numpy",
    "seed003_module_class",
    "seed003_table",
]


def seed000_loop(length: int, d_model: int) -> np.ndarray:
    """Seed 000's double loop (float64), cast to float32."""
    return getPositionEncoding(length, d_model).astype(np.float32)


def seed001_numpy(length: int, d_model: int) -> np.ndarray:
    """Seed 001's vectorised NumPy, with its float32 cast; shape (1, L, d)."""
    return generate_positional_encoding_numpy(length, d_model)


def seed003_table(length: int, d_model: int):
    """The table the seed 003 module builds in ``__init__`` (float32 angles); (1, L, d).

    Only the table: ``torch.zeros``, ``div_term``, ``sin``/``cos`` and ``unsqueeze``, not
    ``nn.Module.__init__``, ``nn.Dropout`` or ``register_buffer``.
    """
    return gen_pe_torch(length, d_model, 10000.0)


def hf_get_embedding():
    """Hugging Face Speech2Text's ``get_embedding(num_embeddings, embedding_dim)``.

    Returned as the function itself, so that the timed call does not include an import.
    tensor2tensor frequencies, split layout, float32 angles.
    """
    from transformers.models.speech_to_text.modeling_speech_to_text import (
        Speech2TextSinusoidalPositionalEmbedding,
    )

    return Speech2TextSinusoidalPositionalEmbedding.get_embedding


def seed003_module_class():
    """Seed 003's ``PositionalEncoding`` ``nn.Module`` class (needs torch)."""
    return seed_positional_encoding_class()
