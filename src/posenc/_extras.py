"""The optional dependencies: which ``pip install "posenc[...]"`` brings each framework.

``import posenc`` needs NumPy only. A front end or a command whose framework is missing
raises an ``ImportError`` that names the extra to install, instead of a bare
``ModuleNotFoundError`` from deep inside an import.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# module -> (what it is called, how to install it)
EXTRAS: dict[str, tuple[str, str]] = {
    "torch": ("PyTorch", "pip install 'posenc[torch]'"),
    "keras": (
        "Keras 3 with a backend",
        "pip install 'posenc[tf]' (TensorFlow) or 'posenc[jax]' (JAX)",
    ),
    "jax": ("JAX", "pip install 'posenc[jax]'"),
    "transformers": ("Hugging Face transformers", "pip install 'posenc[transformers]'"),
    "safetensors": ("safetensors", "pip install 'posenc[transformers]'"),
    "plotly.offline": ("Plotly", "pip install 'posenc[explore]'"),
    "gguf": ("gguf (to read a GGUF file)", "pip install 'posenc[extend]'"),
    "ray": ("Ray", "pip install 'posenc[ray]'"),
    "scipy.stats": ("SciPy", "pip install scipy"),
}
# (Flax, matplotlib and tqdm are imported where they are used, whose messages say more:
# posenc.jax.linen, posenc.plot._figure, posenc.bench.workers.load_tqdm.)


def missing(
    module: str, feature: str, cause: BaseException | None = None, *, extra: str | None = None
) -> ImportError:
    """The ``ImportError`` for ``feature`` when ``module`` cannot be imported.

    Example:
        >>> print(missing("torch", "posenc.torch"))
        posenc.torch needs PyTorch: pip install 'posenc[torch]'
    """
    name, install = EXTRAS.get(module, (module, f"pip install {module.partition('.')[0]}"))
    if extra is not None:
        install = f"pip install '{extra}'"
    # The cause is worth showing when it is not the module itself that is missing (Keras
    # without its backend, a broken install).
    shown = cause is not None and getattr(cause, "name", None) != module and str(cause)
    detail = f" ({cause})" if shown else ""
    return ImportError(f"{feature} needs {name}: {install}{detail}")


def require(module: str, feature: str, *, extra: str | None = None) -> ModuleType:
    """Import ``module`` for ``feature``, or raise :func:`missing`'s ``ImportError``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(module, feature, exc, extra=extra) from exc
