"""What one probe measures, on the model loaded in this process.

:func:`run_probe` is the executors' run function for probes (a module-level function,
so that Ray and worker processes can call it): it loads the model (once per process),
gives it the probe's RoPE scaling through posenc's exact tables, and measures

* passkey: greedy decoding after the prompt (:mod:`posenc.extend.passkey`) until the key
  could have been written, with the model's own KV cache; the record says whether the
  first number written is the key, and what was written;
* perplexity: every token of a window of the text scored in one forward pass, with its
  own context in the window only; the record has the mean negative log-likelihood, the
  perplexity, and the mean NLL of each block of :data:`BLOCK` positions (so a picture
  shows where in the window a scaling starts to fail).

The logits of a long window are never held whole (at 32,768 positions and a 49,152-token
vocabulary they would take 6 GiB): the model's body runs once and its output head is
applied to :data:`CHUNK` positions at a time, after a check on the window's first
positions that this gives the model's own logits.
"""

from __future__ import annotations

import inspect
import math
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .._extras import require

torch = require("torch", "posenc extend", extra="posenc[extend]")

from . import models, passkey, texts  # noqa: E402
from .probes import Probe  # noqa: E402

__all__ = ["BLOCK", "CHUNK", "run_probe", "token_losses"]

BLOCK = 256  # positions per entry of a perplexity record's nll_by_block
CHUNK = 2048  # positions whose logits are formed at once
_CHECK = 64  # positions on which the chunked head is compared with the model's logits
_ANSWER_SLACK = 3  # tokens decoded past the key's own


def run_probe(
    probe: Probe, *, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Measure one probe; returns its record (``"key"``, ``"probe"``, ``"result"``, ...).

    ``progress(layer, layers)`` is called as each decoder layer of the model finishes
    the probe's long forward pass.
    """
    model, tokenizer = models.loaded(probe.model, probe.dtype, probe.device, probe.fingerprint)
    started = time.perf_counter()
    models.use_scaling(model, probe.rope)
    with torch.inference_mode(), _layer_progress(model, progress):
        if probe.task == "passkey":
            result = _passkey(model, tokenizer, probe)
        else:
            result = _perplexity(model, tokenizer, probe)
    return {
        "key": probe.key(),
        "probe": probe.to_dict(),
        "result": result,
        "context": models.context_length(model.config),
        "seconds": round(time.perf_counter() - started, 3),
        "threads": torch.get_num_threads(),
        "versions": _versions(),
    }


def _passkey(model: Any, tokenizer: Any, probe: Probe) -> dict[str, Any]:
    assert probe.depth is not None
    key = passkey.passkey(probe.trial, probe.length, probe.depth)
    asked = passkey.prompt(tokenizer, probe.length, probe.depth, key)
    budget = len(tokenizer.encode(" " + key, add_special_tokens=False)) + _ANSWER_SLACK
    device = torch.device(probe.device)
    ids = torch.tensor([asked.ids], device=device)
    written: list[int] = []
    cache: dict[str, Any] = {}  # the model's own KV cache, under the name its forward takes
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    for _ in range(budget):
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache)
        cache = {name: getattr(out, "cache", None) or out.past_key_values}
        token = int(out.logits[0, -1].argmax())
        written.append(token)
        ids = torch.tensor([[token]], device=device)
    answer = tokenizer.decode(written, skip_special_tokens=True)
    return {
        "passkey": key,
        "answer": answer,
        "right": passkey.is_right(answer, key),
        "needle_at": asked.needle_at,
        "tokens": len(asked.ids),
    }


def _perplexity(model: Any, tokenizer: Any, probe: Probe) -> dict[str, Any]:
    text, source, digest = texts.load_text(probe.text)
    if digest != probe.text_digest:
        raise ValueError(
            f"the text {source!r} is not the one this probe was made for (digest {digest}, "
            f"the probe's {probe.text_digest}): it changed since"
        )
    ids = _token_ids(tokenizer, text, (probe.fingerprint, digest))
    start, stop = probe.trial * probe.length, (probe.trial + 1) * probe.length
    if stop > len(ids):
        raise ValueError(
            f"the text ({source}) has {len(ids)} tokens: window {probe.trial} of "
            f"{probe.length} tokens would end at {stop}"
        )
    window = torch.tensor([ids[start:stop]], device=torch.device(probe.device))
    nll = token_losses(model, window)[0].double()  # (length - 1,)
    blocks = [float(part.mean()) for part in nll.split(BLOCK)]
    mean = float(nll.mean())
    return {
        "nll": mean,
        "perplexity": math.exp(mean) if mean < 700 else math.inf,  # inf: written as null
        "block": BLOCK,
        "nll_by_block": blocks,
        "text": source,
        "tokens": probe.length,
    }


_IDS: dict[tuple[str, str], list[int]] = {}


def _token_ids(tokenizer: Any, text: str, key: tuple[str, str]) -> list[int]:
    """The text's token ids, kept per model fingerprint and text digest (``key``):
    encoding the whole text takes seconds."""
    if key not in _IDS:
        _IDS.clear()
        _IDS[key] = list(tokenizer.encode(text, add_special_tokens=False))
    return _IDS[key]


def token_losses(model: Any, ids: Any) -> Any:
    """The negative log-likelihood of each next token, ``(batch, length - 1)`` float32.

    The body runs once; the output head is applied :data:`CHUNK` positions at a time.
    A model whose logits are more than its head of the body's output (a soft cap, a
    scale) is found by comparing both on the first :data:`_CHECK` positions, and is then
    scored from its own full logits.
    """
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    head = model.get_output_embeddings()
    targets = ids[:, 1:]
    check = ids[:, :_CHECK]
    same = head is not None and torch.allclose(
        model(input_ids=check, use_cache=False).logits.float(),
        head(body(input_ids=check, use_cache=False).last_hidden_state).float(),
        rtol=1e-4,
        atol=1e-4,
    )
    if not same:
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    hidden = body(input_ids=ids, use_cache=False).last_hidden_state[:, :-1]
    parts = []
    for first in range(0, hidden.shape[1], CHUNK):
        logits = head(hidden[:, first : first + CHUNK]).float()
        parts.append(
            torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), targets[:, first : first + CHUNK], reduction="none"
            )
        )
    return torch.cat(parts, dim=1)


@contextmanager
def _layer_progress(model: Any, progress: Callable[[int, int], None] | None) -> Iterator[None]:
    """Call ``progress(done, layers)`` as each decoder layer finishes a long pass."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    layers = getattr(body, "layers", None)
    if progress is None or not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        yield
        return
    count = len(layers)

    def hook(index: int) -> Callable[..., None]:
        def done(module: Any, args: Any, output: Any) -> None:
            hidden = args[0] if args else None
            if hidden is None or getattr(hidden, "shape", (0, 0))[1] > 1:  # not a decoding step
                progress(index + 1, count)

        return done

    handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _versions() -> dict[str, str]:
    import transformers

    from .. import __version__

    return {
        "posenc": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
