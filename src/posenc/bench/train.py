"""Train one bench model and evaluate it by length: :func:`run`.

Training: AdamW with a linear warmup over the first 10% of the steps and a cosine decay
to 10% of the peak learning rate, gradients clipped at norm 1, batches whose problem
lengths are drawn uniformly from ``spec.train_lengths``; the loss is the mean
cross-entropy over the scored tokens.

Evaluation, per variant and evaluation length ``L`` (model in eval mode, no gradients),
on ``spec.eval_samples`` sequences of problem length exactly ``L`` drawn from their own
generator (seeded with ``spec.seed`` and ``L``, so every scheme sees the same sequences):

* copy, reverse, sort, add: teacher forcing. ``token_accuracy`` is the share of scored
  tokens whose argmax is right, ``exact_match`` the share of sequences with every scored
  token right, ``loss`` the mean NLL per scored token.
* lm: windows of exactly ``L`` characters of the held-out text; ``loss`` is the mean NLL
  per character, ``perplexity`` its exponential, ``token_accuracy`` the argmax accuracy.

RoPE scalings (``spec.rope_eval_scalings``) are applied to the trained RoPE model at
evaluation only. With ``P = max_positions(task, max(train_lengths))`` positions seen in
training and ``N = max_positions(task, L)`` needed at ``L``, the scaling gets
``factor = max(1, N / P)`` and ``original_max_position_embeddings = P``. So within the
training lengths every scaled variant uses factor 1, which leaves RoPE unchanged (the
scalings only matter beyond the training length). ``dynamic_ntk`` also scales with the
sequence length itself: at length ``N > P`` its NTK extension is ``f·N/P - (f - 1)`` =
``f² - f + 1`` for ``f = N/P`` (Hugging Face's ``"dynamic"`` configured with the target
extension as its factor), more than the static ``ntk`` with factor ``f``.

The context-extension stage (``spec.extension``): the base, the model the spec's
training settings give (:meth:`RunSpec.training_key`), is trained once and kept in
posenc's cache (``bench-bases/<training key>.pt`` under :func:`posenc._files.cache_root`,
written whole, a second process waiting for the first), so every extension of a seed
starts from the same weights. It is then fine-tuned for ``spec.extension_steps`` steps
on problems of ``spec.extension_lengths`` (a data stream of its own), with the same
schedule at :data:`EXTENSION_LR` of the peak learning rate, its RoPE scaled by
``spec.extension`` with ``factor = P_ext / P`` (``P_ext``: the positions of the longest
extension length) and ``original_max_position_embeddings = P``; ``"none"`` fine-tunes
plain RoPE (the baseline of Chen et al.'s Position Interpolation). Evaluation then uses
that fixed factor at every length, for the base (variant ``"rope+<scaling>"``, or
``"rope"``) and for the fine-tuned model (``"rope+<scaling>+ft"``, or ``"rope+ft"``).
"""

from __future__ import annotations

import contextlib
import math
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

import posenc

from .._checks import describe
from .._files import atomic_write, cache_root
from .batches import make_batch
from .model import GPT, GPTConfig
from .spec import RunSpec
from .tasks import get_task, task_max_positions

EVAL_BATCH = 256  # sequences per forward pass in evaluation
EXTENSION_LR = 0.1  # the fine-tune's peak learning rate, as a share of the base's
WARMUP = 0.1  # share of the steps with a linear warmup
FINAL_LR = 0.1  # the cosine decays to this share of the peak learning rate


def resolve_device(device: str) -> torch.device:
    """``"auto"`` → cuda if available, else mps if available, else cpu; others as given.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(device)


def learning_rate(step: int, steps: int, peak: float) -> float:
    """The learning rate of optimizer step ``step`` (0-based) out of ``steps``.

    Linear warmup over the first ``max(1, 10%)`` steps to ``peak``, then a cosine decay
    to ``0.1 · peak`` at the last step.

    Example:
        >>> [round(learning_rate(s, 20, 1.0), 3) for s in (0, 1, 2, 10, 19)]
        [0.5, 1.0, 1.0, 0.592, 0.1]
    """
    warmup = max(1, round(WARMUP * steps))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - 1 - warmup)  # 0 → 1
    return peak * (FINAL_LR + (1 - FINAL_LR) * 0.5 * (1 + math.cos(math.pi * progress)))


def masked_loss(logits: Tensor, tokens: Tensor, target_mask: Tensor) -> Tensor:
    """Mean cross-entropy of the scored tokens; logits at ``t`` predict the token at ``t+1``.

    Args:
        logits: ``(B, T, V)``.
        tokens: ``(B, T)`` token ids.
        target_mask: ``(B, T)`` bool, True at the tokens to score (never column 0).

    Returns:
        A scalar tensor.
    """
    predicted = logits[:, :-1]  # (B, T-1, V), the predictions of tokens 1 .. T-1
    targets = tokens[:, 1:]  # (B, T-1)
    scored = target_mask[:, 1:]  # (B, T-1)
    return nn.functional.cross_entropy(predicted[scored], targets[scored])  # ()


def evaluation_batches(
    task: Any,
    length: int,
    samples: int,
    seed: int,
    batch_size: int = EVAL_BATCH,
    lm_eval: str | None = None,
) -> Iterator[tuple[Tensor, Tensor]]:
    """The evaluation sequences of problem length exactly ``length``, in batches.

    They depend only on the task, ``length``, ``samples`` and ``seed`` (not on the model),
    so every scheme and variant is scored on the same sequences. With ``lm_eval`` (lm:
    ``"tiled"`` or ``"sliding"``) they are the held-out text's windows
    (:meth:`~posenc.bench.tasks.TextTask.eval_windows`), the same text at every length,
    and ``samples`` and ``seed`` play no part.

    Args:
        task: The task.
        length: The problem length of every sequence.
        samples: Number of sequences in all.
        seed: The run's seed.
        batch_size: Sequences per batch (the last batch may be smaller).
        lm_eval: lm only: the windows protocol, or None for drawn windows.

    Yields:
        ``(tokens, target_mask)`` as :meth:`Task.batch` returns them (split ``"eval"``).
    """
    if lm_eval is not None:
        windows = task.eval_windows(length, lm_eval)
        for start in range(0, len(windows), batch_size):
            part = windows[start : start + batch_size]
            yield (torch.from_numpy(np.stack([w for w, _ in part])),
                   torch.from_numpy(np.stack([m for _, m in part])))  # fmt: skip
        return
    generator = np.random.default_rng([seed, 1, length])  # 1: the evaluation stream
    for start in range(0, samples, batch_size):
        yield make_batch(task, min(batch_size, samples - start), length, generator, split="eval")


@torch.no_grad()
def evaluate(
    model: GPT,
    task: Any,
    length: int,
    samples: int,
    seed: int,
    device: torch.device,
    lm_eval: str | None = None,
) -> dict[str, Any]:
    """Scores of ``model`` at problem length ``length`` (see the module docstring), on the
    sequences of :func:`evaluation_batches` (``lm_eval``: the lm windows protocol).

    Returns:
        ``{"exact_match", "token_accuracy", "loss", "perplexity", "samples", "scored",
        "unknown"}``: ``exact_match`` is None for lm, ``perplexity`` None for the other
        tasks; ``scored`` counts the tokens scored and ``unknown`` those of them that are
        ``<unk>`` (lm: an evaluation character never seen in training, which the model
        was never trained to predict; 0 for the other tasks).
    """
    model.eval()
    nll, correct, scored, exact, unknown, count = 0.0, 0, 0, 0, 0, 0
    unk_id = getattr(task, "unk_id", None)
    batches = evaluation_batches(task, length, samples, seed, lm_eval=lm_eval)
    for tokens, target_mask in batches:
        _check_fits(tokens, model, task)
        count += tokens.shape[0]
        tokens, target_mask = tokens.to(device), target_mask.to(device)  # (B, T) each
        logits = model(tokens)[:, :-1].float()  # (B, T-1, V)
        targets, mask = tokens[:, 1:], target_mask[:, 1:]  # (B, T-1) each
        token_nll = nn.functional.cross_entropy(
            logits.transpose(1, 2), targets, reduction="none"
        )  # (B, T-1)
        right = (logits.argmax(dim=-1) == targets) & mask  # (B, T-1)
        nll += float(token_nll[mask].double().sum())
        correct += int(right.sum())
        scored += int(mask.sum())
        if unk_id is not None:
            unknown += int(((targets == unk_id) & mask).sum())
        # Exact match by teacher forcing equals greedy decoding's sequence accuracy: if
        # every scored argmax is right, greedy decoding reproduces the true prefix at each
        # step and so emits the whole target; if one is wrong, greedy decoding has the true
        # prefix up to the first wrong one (all earlier argmaxes were right) and emits that
        # same wrong token there. Either way both methods agree on the sequence.
        exact += int((right.sum(dim=1) == mask.sum(dim=1)).sum())
    loss = nll / scored
    is_lm = task.name == "lm"
    return {
        "exact_match": None if is_lm else exact / count,
        "token_accuracy": correct / scored,
        "loss": loss,
        "perplexity": (math.exp(loss) if loss < 700 else math.inf) if is_lm else None,
        "samples": count,
        "scored": scored,
        "unknown": unknown,
    }


def _check_fits(tokens: Tensor, model: GPT, task: Any) -> None:
    """A task without ``max_positions`` is measured from problems drawn once; a longer
    problem later is the task's to declare, not a failure deep in the model."""
    if tokens.shape[1] > model.config.max_positions:
        raise ValueError(
            f"task {task.name!r} drew a problem of {tokens.shape[1]} tokens, longer than the "
            f"{model.config.max_positions} its sample showed for these lengths: give the task "
            "a max_positions(length) method that bounds its problems"
        )


def build_model(spec: RunSpec, task: Any) -> GPT:
    """The untrained model of ``spec`` (on the CPU), sized to cover every evaluation length.

    Its ``max_positions`` is the most of ``task_max_positions(task, L)`` over the longest
    training length, every evaluation length and the extension's lengths, so learned
    position vectors exist for every position evaluated.
    """
    config = GPTConfig(
        vocab_size=len(task.vocab),
        scheme=spec.scheme,
        d_model=spec.d_model,
        n_layers=spec.n_layers,
        n_heads=spec.n_heads,
        max_positions=max(
            task_max_positions(task, n)
            for n in (spec.train_lengths[1], *spec.eval_lengths, *(spec.extension_lengths or ()))
        ),
    )
    return GPT(config)


def run(spec: RunSpec, *, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Train one model and evaluate it; deterministic on CPU for a given spec.

    Seeds the model initialisation (``torch.manual_seed(spec.seed)``, inside
    :func:`torch.random.fork_rng` so the caller's random state is left as it was) and the
    data generators (from ``spec.seed``), and on the CPU turns on PyTorch's deterministic
    algorithms for the duration of the run. The number of threads is the caller's choice.

    Args:
        spec: The run.
        progress: Called as ``progress(step, spec.steps)`` after each optimizer step
            (``step`` = 1 .. ``spec.steps``), or None.

    Returns:
        A JSON-ready record::

            {"key": spec.key(), "spec": spec.to_dict(),
             "results": [{"variant", "length", "exact_match", "token_accuracy", "loss",
                          "perplexity", "in_distribution", "samples", "scored_tokens",
                          "unknown_tokens"}, ...],
             "train_loss": float, "seconds": float, "device": str, "parameters": int,
             "versions": {"posenc", "torch", "python"}}

        with one result per variant and evaluation length: the variant is the scheme,
        plus ``"rope+<scaling>"`` for each of ``spec.rope_eval_scalings``.
        ``train_loss`` is the mean training loss of the last 10% of the steps.
        ``unknown_tokens`` of the ``scored_tokens`` are ``<unk>`` (lm only: evaluation
        characters not in the training text; each counts as a token predicted wrong).

    Example:
        >>> spec = RunSpec("copy", "alibi", steps=2, d_model=16, n_heads=2,
        ...                eval_lengths=(4,), eval_samples=4)
        >>> record = run(spec)
        >>> [(r["variant"], r["length"], r["samples"]) for r in record["results"]]
        [('alibi', 4, 4)]
    """
    if not isinstance(spec, RunSpec):
        raise TypeError(f"spec must be a RunSpec, got {describe(spec)}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None, got {describe(progress)}")
    started = time.perf_counter()
    device = resolve_device(spec.device)
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=[]):
        if device.type == "cpu":
            torch.use_deterministic_algorithms(True)
        try:
            torch.manual_seed(spec.seed)
            task = get_task(spec.task, text=spec.text)
            model = build_model(spec, task).to(device)
            if spec.extension is None:
                train_loss = _train(model, task, spec, device, progress)
                results = _evaluate_all(model, task, spec, device)
                stage: dict[str, Any] = {}
            else:
                train_loss, results, stage = _extend(model, task, spec, device, progress)
        finally:
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    return {
        "key": spec.key(),
        "spec": spec.to_dict(),
        "results": results,
        **stage,
        "train_loss": train_loss,
        "seconds": time.perf_counter() - started,
        "device": str(device),
        "parameters": model.num_parameters(),
        "versions": {
            "posenc": posenc.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }


def _train(
    model: GPT,
    task: Any,
    spec: RunSpec,
    device: torch.device,
    progress: Callable[[int, int], None] | None,
    *,
    extension: bool = False,
) -> float:
    """Optimise ``model`` for ``spec.steps`` steps on ``spec.train_lengths`` (or, with
    ``extension``, for the extension's steps on its lengths at :data:`EXTENSION_LR` of the
    learning rate, from a stream of its own); the mean loss of the last 10%."""
    model.train()
    steps, lengths, peak = spec.steps, spec.train_lengths, spec.lr
    if extension:
        assert spec.extension_steps is not None
        assert spec.extension_lengths is not None
        steps, lengths = spec.extension_steps, spec.extension_lengths
        peak = spec.lr * EXTENSION_LR
    # 0: the training stream, 2: the extension's
    generator = np.random.default_rng([spec.seed, 2 if extension else 0])
    # Weight decay on the weights of linear layers only, not on LayerNorms, biases,
    # embeddings or position parameters (GPT-2 practice).
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay = [p for p in model.parameters() if id(p) in linear]
    no_decay = [p for p in model.parameters() if id(p) not in linear]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.lr,
        betas=(0.9, 0.98),
    )
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, peak)
        tokens, target_mask = make_batch(task, spec.batch_size, lengths, generator)
        _check_fits(tokens, model, task)
        tokens, target_mask = tokens.to(device), target_mask.to(device)  # (B, T) each
        loss = masked_loss(model(tokens), tokens, target_mask)  # ()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step + 1, steps)
    tail = losses[-max(1, len(losses) // 10) :]
    return float(np.mean(tail))


def _evaluate_all(
    model: GPT, task: Any, spec: RunSpec, device: torch.device
) -> list[dict[str, Any]]:
    """One result per variant and evaluation length (see :func:`run`)."""
    lo, hi = spec.train_lengths
    trained = task_max_positions(task, hi)  # P: the most positions seen in training
    variants: list[str | None] = [None, *spec.rope_eval_scalings]
    sample = (spec.eval_samples, spec.seed)
    results = []
    for scaling in variants:
        for length in spec.eval_lengths:
            if scaling is None:
                scores = evaluate(model, task, length, *sample, device, spec.lm_eval)
            else:
                factor = max(1.0, task_max_positions(task, length) / trained)
                with model.rope_scaling(scaling, factor=factor, original=trained):
                    scores = evaluate(model, task, length, *sample, device, spec.lm_eval)
            variant = spec.scheme if scaling is None else f"{spec.scheme}+{scaling}"
            results.append(_result(variant, length, scores, lo <= length <= hi))
    return results


def _extend(
    model: GPT,
    task: Any,
    spec: RunSpec,
    device: torch.device,
    progress: Callable[[int, int], None] | None,
) -> tuple[float, list[dict[str, Any]], dict[str, Any]]:
    """The extension stage (module docstring): ``(fine-tune loss, results, what the
    record says of the base and the extension)``."""
    assert spec.extension is not None
    assert spec.extension_lengths is not None
    base, loaded = _base_weights(spec, task, device, progress)
    model.load_state_dict(base)
    trained = task_max_positions(task, spec.train_lengths[1])  # P
    factor = task_max_positions(task, spec.extension_lengths[1]) / trained
    scaling = None if spec.extension == "none" else spec.extension
    name = spec.scheme if scaling is None else f"{spec.scheme}+{scaling}"
    with model.rope_scaling(scaling, factor=factor, original=trained):
        results = _evaluate_lengths(model, task, spec, device, name)
        loss = _train(model, task, spec, device, progress, extension=True)
        results += _evaluate_lengths(model, task, spec, device, f"{name}+ft")
    stage = {
        "base": {"training_key": spec.training_key(), "from_cache": loaded},
        "extension": {"scaling": spec.extension, "factor": factor, "original": trained,
                      "lengths": list(spec.extension_lengths), "steps": spec.extension_steps,
                      "lr": spec.lr * EXTENSION_LR},
    }  # fmt: skip
    return loss, results, stage


def _evaluate_lengths(
    model: GPT, task: Any, spec: RunSpec, device: torch.device, variant: str
) -> list[dict[str, Any]]:
    """One result of ``variant`` per evaluation length, as :func:`_evaluate_all` writes them."""
    lo, hi = spec.train_lengths
    results = []
    for length in spec.eval_lengths:
        scores = evaluate(model, task, length, spec.eval_samples, spec.seed, device, spec.lm_eval)
        results.append(_result(variant, length, scores, lo <= length <= hi))
    return results


def _result(variant: str, length: int, scores: dict[str, Any], inside: bool) -> dict[str, Any]:
    return {
        "variant": variant,
        "length": length,
        "exact_match": scores["exact_match"],
        "token_accuracy": scores["token_accuracy"],
        "loss": scores["loss"],
        "perplexity": scores["perplexity"],
        "in_distribution": inside,
        "samples": scores["samples"],
        "scored_tokens": scores["scored"],
        "unknown_tokens": scores["unknown"],
    }


def base_path(spec: RunSpec) -> Path:
    """Where the trained base of ``spec`` is kept: ``bench-bases/<training key>.pt`` in
    posenc's cache."""
    return cache_root() / "bench-bases" / f"{spec.training_key()}.pt"


def _base_weights(
    spec: RunSpec, task: Any, device: torch.device, progress: Callable[[int, int], None] | None
) -> tuple[dict[str, Tensor], bool]:
    """The base model's weights (state dict) and whether they came from the cache: trained
    here (seeded as :func:`run` seeds a run) and written whole, unless a file is there;
    a process that finds another training the same base waits for its file."""
    path = base_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.with_suffix(".lock")):
        if path.is_file():
            return torch.load(path, map_location=device, weights_only=True), True
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            base = build_model(spec.base(), task).to(device)
        _train(base, task, spec, device, progress)
        state = {name: tensor.detach().cpu() for name, tensor in base.state_dict().items()}
        with atomic_write(path, "wb") as file:
            torch.save(state, file)
        return {name: tensor.to(device) for name, tensor in state.items()}, False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created) while inside; nothing where
    ``fcntl`` does not exist."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
