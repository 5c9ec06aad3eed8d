"""The model of an evaluation: found, converted once from GGUF, loaded once per process,
and run with a RoPE scaling through posenc's exact tables.

* :func:`resolve` gives the ``transformers`` folder of a model: the folder itself, or for
  a GGUF file the folder it was converted into once (``transformers`` de-quantizes it to
  float32, which takes a minute for a small model; the folder is kept in a cache, written
  whole or not at all, and later runs load it in a second).
* :func:`fingerprint` is the model's identity in the probes' keys.
* :func:`loaded` keeps the last model loaded in this process (a Ray worker keeps its own).
* :func:`use_scaling` gives the model's rotary modules the RoPE of a scaling: each is
  rebuilt by its own class from a copy of the config with that scaling's
  ``rope_parameters``, then :func:`posenc.integrations.transformers.patch` replaces it
  with posenc's exact tables. The model's own config is left as it is.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .._checks import describe
from .._extras import require
from .._files import cache_root

__all__ = [
    "cache_folder",
    "context_length",
    "fingerprint",
    "loaded",
    "own_scaling",
    "resolve",
    "use_scaling",
]

_WEIGHTS = (".safetensors", ".bin", ".pt", ".gguf")
# the files a tokenizer is read from (tokenizer.json, tokenizer_config.json,
# tokenizer.model, special_tokens_map.json, vocab.json, merges.txt, ...)
_TOKENIZER = ("tokenizer", "special_tokens", "vocab", "merges", "added_tokens")


def cache_folder() -> Path:
    """Where converted models are kept: the ``models`` folder of posenc's cache
    (``$POSENC_CACHE``, else ``$XDG_CACHE_HOME/posenc``, else ``~/.cache/posenc``)."""
    return cache_root() / "models"


def resolve(model: str | os.PathLike[str], gguf: str | None = None, *,
            cache: str | os.PathLike[str] | None = None) -> Path:  # fmt: skip
    """The ``transformers`` folder of a model.

    Args:
        model: A folder with ``config.json`` (and weights, tokenizer), or a ``.gguf``
            file, or a folder holding the ``gguf`` file.
        gguf: The GGUF file's name in ``model`` (or its path).
        cache: Where converted folders are kept (default :func:`cache_folder`).

    Raises:
        FileNotFoundError: No such folder or file, or a folder without ``config.json``
            and no GGUF file named.
    """
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a folder or a .gguf file, got {describe(model)}")
    path = Path(model).expanduser()
    if gguf is None and path.suffix == ".gguf":
        path, gguf = path.parent, path.name
    if not path.exists():
        raise FileNotFoundError(f"model {str(path)!r} does not exist")
    if gguf is None:
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model {str(path)!r} has no config.json: give a transformers folder, or a "
                "GGUF file (--gguf NAME)"
            )
        return path
    file = path / gguf
    if not file.is_file():
        raise FileNotFoundError(f"GGUF file {str(file)!r} does not exist")
    return _converted(file, Path(cache) if cache is not None else cache_folder())


def _converted(file: Path, cache: Path) -> Path:
    """The folder that ``file`` (GGUF) was converted into, converting it first if needed."""
    stat = file.stat()
    folder = cache / f"{file.stem}-{_file_digest(file)}"
    if (folder / "config.json").is_file():
        return folder
    transformers = require("transformers", "posenc extend", extra="posenc[extend]")
    require("gguf", "reading a GGUF model", extra="posenc[extend]")
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=cache))
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            file.parent, gguf_file=file.name, dtype="float32"
        )
        # de-quantized to float32: a plain model, saved as one
        with contextlib.suppress(AttributeError):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        (work / "posenc-source.json").write_text(
            json.dumps({"gguf": str(file), "size": stat.st_size}) + "\n"
        )
        try:
            os.replace(work, folder)  # whole or not at all
        except OSError:  # another process converted it meanwhile
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def _file_digest(file: Path) -> str:
    """SHA-256 (16 hex digits) of a file's bytes, kept per path, size and modification
    time (a 500 MB model takes about a second to read)."""
    stat = file.stat()
    return _digest_of(str(file.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _digest_of(path: str, size: int, mtime: int) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            hasher.update(block)
    return hasher.hexdigest()[:16]


def fingerprint(folder: str | os.PathLike[str]) -> str:
    """A model folder's identity: SHA-256 (16 hex digits) of its ``config.json`` and of
    the name and bytes of each weights and tokenizer file.

    Two folders with the same model have the same fingerprint wherever they are; other
    weights (a model fine-tuned further), another tokenizer or config give another.
    """
    path = Path(folder)
    hasher = hashlib.sha256((path / "config.json").read_bytes())
    for file in sorted(path.iterdir()):
        if file.is_file() and (file.suffix in _WEIGHTS or file.name.startswith(_TOKENIZER)):
            hasher.update(f"{file.name}:{_file_digest(file)}".encode())
    return hasher.hexdigest()[:16]


def _rope_config(config: Any) -> dict[str, Any]:
    """The RoPE fields posenc reads from a model config (``RopeSpec`` fields)."""
    from ..specs.hf import rope_spec_from_hf_config

    return rope_spec_from_hf_config(config)


def own_scaling(config: Any) -> dict[str, Any]:
    """The model's own RoPE scaling, as posenc's dict (``{"rope_type": "default"}`` for none)."""
    from .probes import _plain

    return _plain(_rope_config(config)["scaling"])


def context_length(config: Any) -> int:
    """The context a model was trained to: its RoPE's ``original_max_position_embeddings``
    where it has one (a model already extended: YaRN, Llama 3, LongRoPE), else its
    config's ``original_max_position_embeddings`` or ``max_position_embeddings``.

    Raises:
        ValueError: The config gives none.
    """
    from ..specs.hf import config_dict

    scaling = own_scaling(config)
    data = config_dict(config)
    for value in (
        scaling.get("original_max_position_embeddings"),
        data.get("original_max_position_embeddings"),
        data.get("max_position_embeddings"),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise ValueError(
        "the model's config gives no context length (max_position_embeddings); posenc "
        "extend needs it to place the lengths and the scalings"
    )


_LOADED: dict[tuple[str, str, str, str], tuple[Any, Any]] = {}


def loaded(folder: str, dtype: str, device: str, identity: str = "") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a folder, loaded once per process (the last one only: a
    new folder, dtype, device or ``identity``, the model's fingerprint, which changes when
    the folder is saved again, frees the model before)."""
    key = (str(folder), dtype, device, identity)
    if key not in _LOADED:
        _LOADED.clear()
        transformers = require("transformers", "posenc extend", extra="posenc[extend]")
        torch = require("torch", "posenc extend", extra="posenc[extend]")
        logging = transformers.utils.logging
        shown = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()  # a bar per weight file, per worker: not the probes'
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, dtype=getattr(torch, dtype), device_map=None
            )
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        finally:
            if shown:
                logging.enable_progress_bar()
        model.to(device).eval()
        _LOADED[key] = (model, tokenizer)
    return _LOADED[key]


def use_scaling(model: Any, rope: dict[str, Any]) -> None:
    """Run ``model`` with the RoPE scaling ``rope`` (posenc's dict), through posenc's
    exact tables; a no-op when it runs with it already.

    Raises:
        ValueError: The model has RoPE per layer type (Gemma 3), which one scaling does
            not say how to scale, or a rotary module that cannot be rebuilt from a config.
    """
    from ..core.rope import as_rope_scaling
    from ..integrations import transformers as integration
    from ..specs import RopeSpec
    from ..specs.hf import rope_spec_to_hf_dict

    wanted = json.dumps(rope, sort_keys=True)
    if getattr(model, "_posenc_extend_scaling", None) == wanted:
        return
    scaling, _ = as_rope_scaling(rope)
    model._posenc_extend_scaling = None  # until the new one is in place
    integration.unpatch(model)
    found = integration.rotary_modules(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no rotary embedding module to scale")
    for name, module in found:
        config = getattr(module, "config", None)
        if config is None or isinstance(getattr(module, "rope_type", None), dict):
            raise ValueError(
                f"posenc extend scales models with one RoPE; {type(module).__name__} "
                f"({name}) has {'no config' if config is None else 'one RoPE per layer type'}"
            )
        spec = RopeSpec.from_hf_config(config)
        keys = rope_spec_to_hf_dict(
            spec.head_dim, spec.base, spec.rotary_dim or spec.head_dim, spec.layout, scaling
        )
        if keys["rope_parameters"]["rope_type"].startswith("posenc_"):
            integration.register()  # a method transformers lacks (ntk, a registered one)
        new = copy.deepcopy(config)
        new.rope_parameters = keys["rope_parameters"]
        if "max_position_embeddings" in keys:
            new.max_position_embeddings = keys["max_position_embeddings"]
        device = next((t.device for t in module.buffers()), None)
        try:
            rebuilt = type(module)(config=new)
            if device is not None:
                rebuilt.to(device)
        except Exception as exc:
            raise ValueError(
                f"posenc extend cannot rebuild {type(module).__name__} from a config: {exc}"
            ) from None
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, rebuilt)
    integration.patch(model)
    model._posenc_extend_scaling = wanted
