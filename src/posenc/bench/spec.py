"""The description of one bench run: task, positional scheme, model size, training and evaluation.

A :class:`RunSpec` is a frozen, validated, JSON-ready value. Its :meth:`RunSpec.key` is a
stable identifier (the SHA-1 of the canonical JSON of every field except ``device``), so a
run can be cached and recognised whichever machine repeats it. This module does not import
PyTorch, so building and checking specs stays cheap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from posenc._checks import check_choice, check_int, check_positive, describe
from posenc.core.rope import ROPE_SCALING_SPECS, RopeScaling
from posenc.schemes import bench_schemes

from .plugins import BUILTIN_TASKS, scheme_names, task_names

#: The built-in schemes and tasks (registered ones: :func:`scheme_names`, :func:`task_names`).
SCHEMES = bench_schemes()
TASKS = BUILTIN_TASKS
#: The bench schemes that rotate pairs of features (their heads must have an even width).
ROPE_SCHEMES = ("rope", "p_rope", "rope_learned")
ROPE_EVAL_SCALINGS = ("linear", "ntk", "yarn", "dynamic_ntk")  # applied at evaluation only

# The bench chooses an evaluation scaling's parameters from two numbers: the context
# extension (positions needed / positions trained) and the positions trained on.
_EVAL_PARAMETERS = ("factor", "original_max_position_embeddings")

_DEVICE = re.compile(r"(cpu|cuda|cuda:\d+|mps|auto)")


def rope_eval_choices() -> tuple[str, ...]:
    """The RoPE scalings a rope run can also be evaluated with, read from the registry.

    :data:`ROPE_EVAL_SCALINGS`, then every other registered method that extends the
    context (``factor`` is among its required parameters) and whose required parameters
    are at most ``factor`` and ``original_max_position_embeddings``: the bench derives
    those from the evaluation length and the training lengths. A method that needs more
    (``llama3``'s frequency bands, ``longrope``'s searched divisors) would need values the
    bench cannot choose.

    Example:
        >>> rope_eval_choices()
        ('linear', 'ntk', 'yarn', 'dynamic_ntk')
    """
    others = tuple(
        name
        for name, cls in ROPE_SCALING_SPECS.items()
        if name not in ROPE_EVAL_SCALINGS
        and cls.parameters().get("factor")  # a required factor: a context extension
        and not _other_parameters(cls)
    )
    return (*ROPE_EVAL_SCALINGS, *others)


def _other_parameters(cls: type[RopeScaling]) -> list[str]:
    """The required parameters of a scaling that the bench cannot choose."""
    return [
        name
        for name, required in cls.parameters().items()
        if required and name not in _EVAL_PARAMETERS
    ]


def check_rope_eval_scaling(name: Any, label: str) -> str:
    """``name`` if it is one of :func:`rope_eval_choices`, else an error naming the valid ones.

    Example:
        >>> check_rope_eval_scaling("yarn", "scaling")
        'yarn'
        >>> check_rope_eval_scaling("llama3", "scaling")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: scaling must be one of [...], got 'llama3' (it needs ['low_freq_factor', ...
    """
    valid = rope_eval_choices()
    if isinstance(name, str) and name != "default" and name in ROPE_SCALING_SPECS:
        other = _other_parameters(ROPE_SCALING_SPECS[name])
        if other:
            raise ValueError(
                f"{label} must be one of {list(valid)}, got {name!r} (it needs {other} besides "
                "factor and original_max_position_embeddings, which the bench cannot choose)"
            )
    return check_choice(name, label, valid)


def _int_tuple(value: Any, name: str, *, minimum: int) -> tuple[int, ...]:
    """A list or tuple of ints >= ``minimum`` (not a string, not a bare int), as a tuple."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of ints >= {minimum}, got {describe(value)}")
    return tuple(check_int(v, f"{name}[{i}]", minimum=minimum) for i, v in enumerate(value))


@dataclass(frozen=True)
class RunSpec:
    """One bench run: train a tiny decoder on ``task`` with positional ``scheme``, evaluate.

    Every field is validated when the spec is built; lists are accepted wherever a tuple is
    expected (JSON has no tuples) and stored as tuples, so a spec survives
    ``RunSpec.from_dict(spec.to_dict())`` unchanged.

    Args:
        task: One of :data:`TASKS`: ``"copy"``, ``"reverse"``, ``"sort"``, ``"add"``
            (least-significant digit first) or ``"lm"`` (character-level language model),
            or a task registered with :func:`posenc.bench.register_task`.
        scheme: One of :data:`SCHEMES` (``"nope"``, ``"learned"``, ``"sinusoidal"``,
            ``"rope"``, ``"p_rope"``, ``"rope_learned"``, ``"alibi"``, ``"t5"``,
            ``"kerple"``, ``"kerple_power"``, ``"fire"``, ``"sandwich"``, ``"cope"``;
            :mod:`posenc.bench.model` says where each acts), or a scheme registered with
            :func:`posenc.bench.register_scheme`.
        seed: Seed of the model initialisation and of the training and evaluation data.
        steps: Optimizer steps (>= 1). The defaults (600 steps at lr 5e-3) learn copy within
            the training lengths (exact match > 0.9) with every scheme that has position
            information, in about 10 s on one CPU core.
        batch_size: Sequences per training batch (>= 1).
        lr: Peak learning rate of AdamW (a finite float > 0).
        d_model: Model width; a multiple of ``n_heads`` (and of ``2 * n_heads`` for the
            RoPE schemes, whose head width must be even).
        n_layers: Transformer blocks (>= 1).
        n_heads: Attention heads (>= 1).
        train_lengths: Inclusive range ``(lo, hi)`` of problem lengths drawn uniformly in
            training, ``1 <= lo <= hi``. The problem length is the number of input symbols
            (digits per operand for ``"add"``, characters of context for ``"lm"``).
        eval_lengths: Distinct problem lengths (>= 1) to evaluate at, in and beyond
            ``train_lengths``.
        eval_samples: Sequences (lm: windows) per evaluation length (>= 1).
        rope_eval_scalings: Names from :func:`rope_eval_choices` (:data:`ROPE_EVAL_SCALINGS`
            and any other registered RoPE scaling whose parameters the bench can choose),
            distinct; only with ``scheme="rope"``. Each adds an evaluation of the same
            trained model with that RoPE scaling.
        text: ``"lm"`` only: path of a UTF-8 text file; ``None`` uses a synthetic text
            from a small probabilistic grammar.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:<n>"``, ``"mps"`` or ``"auto"`` (the first
            available of cuda, mps, cpu). Not part of :meth:`key`.
        lm_eval: ``"lm"`` only: how perplexity is measured at each length, on the same
            held-out text: ``"tiled"`` (the default for lm: non-overlapping windows of
            exactly that length, Press et al.) or ``"sliding"`` (windows every
            ``S = ⌈L/4⌉`` characters, each character scored once with at least ``L - S``
            before it). ``eval_samples`` does not apply to lm then. ``None`` for
            the other tasks, and then not part of :meth:`key`.
        extension: The context-extension stage (``scheme="rope"`` only; ``None``: none).
            The model trained as the other fields say (the *base*, trained once and kept:
            :mod:`posenc.bench.train`) is fine-tuned for ``extension_steps`` steps at the
            problem lengths ``extension_lengths`` with this RoPE scaling, ``"none"`` (a
            plain fine-tune) or a name of :func:`rope_eval_choices`, whose factor is the
            positions of the longest extension length over those of the longest
            training length; then evaluated at ``eval_lengths``, with and without the
            fine-tune. Not part of :meth:`key` when ``None``.
        extension_lengths: With ``extension``: the inclusive range ``(lo, hi)`` of the
            fine-tune's problem lengths, ``hi`` past the training lengths.
        extension_steps: With ``extension``: the fine-tune's optimizer steps (>= 1).

    Raises:
        TypeError: A field of the wrong type.
        ValueError: A field of the right type with an invalid value; the message names
            the field, the value and what is valid.

    Example:
        >>> spec = RunSpec("copy", "rope", steps=10, rope_eval_scalings=["ntk"])
        >>> spec.rope_eval_scalings
        ('ntk',)
        >>> RunSpec.from_dict(spec.to_dict()) == spec
        True
        >>> spec.key() == RunSpec("copy", "rope", steps=10, rope_eval_scalings=("ntk",),
        ...                       device="cuda").key()
        True
        >>> len(spec.key())
        40
    """

    task: str
    scheme: str
    seed: int = 0
    steps: int = 600
    batch_size: int = 32
    lr: float = 5e-3
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    train_lengths: tuple[int, int] = (4, 16)
    eval_lengths: tuple[int, ...] = (8, 16, 24, 32, 48, 64)
    eval_samples: int = 200
    rope_eval_scalings: tuple[str, ...] = ()
    text: str | None = None
    device: str = "cpu"
    lm_eval: str | None = None
    extension: str | None = None
    extension_lengths: tuple[int, int] | None = None
    extension_steps: int | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        check_choice(self.task, "task", task_names())
        check_choice(self.scheme, "scheme", scheme_names())
        put("seed", check_int(self.seed, "seed", minimum=0))
        put("steps", check_int(self.steps, "steps", minimum=1))
        put("batch_size", check_int(self.batch_size, "batch_size", minimum=1))
        put("lr", check_positive(self.lr, "lr"))
        put("d_model", check_int(self.d_model, "d_model", minimum=1))
        put("n_layers", check_int(self.n_layers, "n_layers", minimum=1))
        put("n_heads", check_int(self.n_heads, "n_heads", minimum=1))
        _check_head_split(self.scheme, self.d_model, self.n_heads)
        train = _check_train_lengths(self.train_lengths)
        put("train_lengths", train)
        put("eval_lengths", _check_eval_lengths(self.eval_lengths))
        put("eval_samples", check_int(self.eval_samples, "eval_samples", minimum=1))
        scalings = _check_rope_eval_scalings(self.rope_eval_scalings, self.scheme)
        _check_head_width(scalings, self.d_model, self.n_heads, train[1])
        put("rope_eval_scalings", scalings)
        put("text", _check_text(self.text, self.task))
        _check_device(self.device)
        put("lm_eval", _check_lm_eval(self.lm_eval, self.task))
        if (self.extension, self.extension_lengths, self.extension_steps) != (None,) * 3:
            lengths, steps = _check_extension(self)
            put("extension_lengths", lengths)
            put("extension_steps", steps)

    def base(self) -> RunSpec:
        """The spec without its extension stage: the run whose trained model it extends.

        Example:
            >>> spec = RunSpec("passkey", "rope", extension="yarn", extension_lengths=(17, 32),
            ...                extension_steps=50)
            >>> spec.base() == RunSpec("passkey", "rope")
            True
        """
        return dataclasses.replace(
            self, extension=None, extension_lengths=None, extension_steps=None
        )

    def training_key(self) -> str:
        """SHA-1 (hex) of the fields that decide the trained base model: the task and its
        text, the scheme, the seed, and the model and training settings (not the
        evaluation, the device or the extension stage). Runs that share it share one
        trained base.

        Example:
            >>> a = RunSpec("passkey", "rope", eval_lengths=(8,), extension="ntk",
            ...             extension_lengths=(17, 32), extension_steps=50)
            >>> a.training_key() == RunSpec("passkey", "rope").training_key()
            True
        """
        fields = {name: value for name, value in self.to_dict().items() if name in _TRAINING}
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha1(canonical.encode("utf-8")).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, JSON-ready (tuples as lists).

        Returns:
            A new dict; ``RunSpec.from_dict`` turns it back into an equal spec.

        Example:
            >>> RunSpec("add", "t5", train_lengths=(2, 5)).to_dict()["train_lengths"]
            [2, 5]
        """
        return {
            f.name: list(value) if isinstance(value, tuple) else value
            for f in dataclasses.fields(self)
            for value in (getattr(self, f.name),)
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSpec:
        """The spec whose fields are the entries of ``d`` (missing ones take the defaults).

        Args:
            d: A mapping of field names to values, e.g. from :meth:`to_dict` or JSON.

        Returns:
            The validated :class:`RunSpec`.

        Raises:
            TypeError: ``d`` is not a dict.
            ValueError: ``d`` has an unknown key or lacks ``task`` or ``scheme``, or a value
                is invalid.

        Example:
            >>> RunSpec.from_dict({"task": "sort", "scheme": "alibi", "eval_lengths": [8]})
            ... # doctest: +ELLIPSIS
            RunSpec(task='sort', scheme='alibi', ..., eval_lengths=(8,), ...)
        """
        if not isinstance(d, dict):
            raise TypeError(f"RunSpec.from_dict needs a dict, got {describe(d)}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(names), key=str)
        if unknown:
            raise ValueError(f"unknown RunSpec fields {unknown}; valid fields are {names}")
        missing = [n for n in ("task", "scheme") if n not in d]
        if missing:
            raise ValueError(f"RunSpec.from_dict needs the fields {missing}, got {sorted(d)}")
        return cls(**d)

    #: The title of the progress bar over bench runs, and the command that runs them.
    title: ClassVar[str] = "bench"

    def label(self) -> str:
        """The run in a few words, for progress bars and messages.

        Example:
            >>> RunSpec("copy", "rope", seed=2).label()
            'copy/rope seed 2'
        """
        return f"{self.task}/{self.scheme} seed {self.seed}"

    def key(self) -> str:
        """Stable identifier: SHA-1 (hex) of the canonical JSON of every field but ``device``.

        Two specs with the same fields have the same key in every process and on every
        machine; ``device`` is left out, so the same run on another device shares it.

        Returns:
            40 hexadecimal characters.

        Example:
            >>> RunSpec("copy", "nope").key() == RunSpec("copy", "nope", seed=1).key()
            False
        """
        fields = self.to_dict()
        del fields["device"]
        for name in ("lm_eval", *_EXTENSION):  # fields added later: older keys stay valid
            if fields[name] is None:
                del fields[name]
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha1(canonical.encode("utf-8")).hexdigest()


# The fields that decide a trained model (RunSpec.training_key), and the extension stage's.
_TRAINING = ("task", "scheme", "seed", "steps", "batch_size", "lr", "d_model", "n_layers",
             "n_heads", "train_lengths", "text")  # fmt: skip
_EXTENSION = ("extension", "extension_lengths", "extension_steps")


def extension_choices() -> tuple[str, ...]:
    """The extension stage's scalings: ``"none"`` (a plain fine-tune at the longer
    lengths) and every scaling a rope run can be evaluated with.

    Example:
        >>> extension_choices()
        ('none', 'linear', 'ntk', 'yarn', 'dynamic_ntk')
    """
    return ("none", *rope_eval_choices())


def _check_extension(spec: RunSpec) -> tuple[tuple[int, int], int]:
    """The three extension fields given together, for a rope run without evaluation-only
    scalings; the fine-tune longer than the training."""
    missing = [name for name in _EXTENSION if getattr(spec, name) is None]
    if missing:
        raise ValueError(
            f"the extension stage needs {list(_EXTENSION)} together; {missing} missing"
        )
    check_choice(spec.extension, "extension", extension_choices())
    if spec.scheme != "rope":
        raise ValueError(f"extension applies to scheme 'rope' only, got scheme {spec.scheme!r}")
    if spec.rope_eval_scalings:
        raise ValueError(
            "extension and rope_eval_scalings do not go together: an extension run "
            "evaluates its own scaling with and without the fine-tune"
        )
    lengths = _int_tuple(spec.extension_lengths, "extension_lengths", minimum=1)
    if len(lengths) != 2 or lengths[0] > lengths[1] or lengths[1] <= spec.train_lengths[1]:
        raise ValueError(
            "extension_lengths must be an inclusive range (lo, hi), lo <= hi, with hi past "
            f"the training lengths {spec.train_lengths}, got {spec.extension_lengths!r}"
        )
    if spec.extension != "none":
        _check_head_width((str(spec.extension),), spec.d_model, spec.n_heads, spec.train_lengths[1])
    steps = check_int(spec.extension_steps, "extension_steps", minimum=1)
    return (lengths[0], lengths[1]), steps


def _check_head_split(scheme: str, d_model: int, n_heads: int) -> None:
    """The heads split ``d_model`` evenly, and a RoPE head holds pairs of features."""
    if d_model % n_heads:
        raise ValueError(
            f"d_model must be a multiple of n_heads, got d_model={d_model} and n_heads={n_heads}"
        )
    if scheme in ROPE_SCHEMES and (d_model // n_heads) % 2:
        raise ValueError(
            f"scheme {scheme!r} rotates pairs of features, so the head width d_model / n_heads "
            f"must be even, got d_model={d_model}, n_heads={n_heads} (head "
            f"width {d_model // n_heads})"
        )


def _check_train_lengths(value: Any) -> tuple[int, ...]:
    """An inclusive range ``(lo, hi)`` of lengths, ``1 <= lo <= hi``."""
    train = _int_tuple(value, "train_lengths", minimum=1)
    if len(train) != 2 or train[0] > train[1]:
        raise ValueError(
            f"train_lengths must be an inclusive range (lo, hi) with 1 <= lo <= hi, got {value!r}"
        )
    return train


def _check_eval_lengths(value: Any) -> tuple[int, ...]:
    """At least one length, each >= 1, no two the same."""
    lengths = _int_tuple(value, "eval_lengths", minimum=1)
    if not lengths:
        raise ValueError("eval_lengths must name at least one length, got ()")
    if len(set(lengths)) != len(lengths):
        raise ValueError(f"eval_lengths must be distinct, got {value!r}")
    return lengths


def _check_rope_eval_scalings(value: Any, scheme: str) -> tuple[str, ...]:
    """Distinct names of :func:`rope_eval_choices`, for the scheme ``"rope"`` only."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise TypeError(
            f"rope_eval_scalings must be a tuple of names from {list(rope_eval_choices())}, "
            f"got {describe(value)}"
        )
    scalings = tuple(
        check_rope_eval_scaling(s, f"rope_eval_scalings[{i}]") for i, s in enumerate(value)
    )
    if len(set(scalings)) != len(scalings):
        raise ValueError(f"rope_eval_scalings must be distinct, got {scalings!r}")
    if scalings and scheme != "rope":
        raise ValueError(
            f"rope_eval_scalings={scalings!r} applies to scheme 'rope' only, got scheme {scheme!r}"
        )
    return scalings


def _check_text(value: Any, task: str) -> str | None:
    """``None``, or the path of the text of the task ``"lm"`` as a non-empty string."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"text must be None or the path of a text file, got {describe(value)}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        raise ValueError(f"text must be a non-empty path string, got {value!r}")
    if task != "lm":
        raise ValueError(f"text={text!r} applies to task 'lm' only, got task {task!r}")
    return text


#: How an lm run measures perplexity at each length (:class:`RunSpec` ``lm_eval``).
LM_EVALS = ("tiled", "sliding")


def _check_lm_eval(value: Any, task: str) -> str | None:
    """lm: one of :data:`LM_EVALS` (``None``: ``"tiled"``); other tasks: ``None``."""
    if task != "lm":
        if value is not None:
            raise ValueError(f"lm_eval={value!r} applies to task 'lm' only, got task {task!r}")
        return None
    return "tiled" if value is None else check_choice(value, "lm_eval", LM_EVALS)


def _check_device(value: Any) -> None:
    """``"cpu"``, ``"cuda"``, ``"cuda:<n>"``, ``"mps"`` or ``"auto"``."""
    if not isinstance(value, str):
        raise TypeError(
            f"device must be 'cpu', 'cuda', 'cuda:<n>', 'mps' or 'auto', got {describe(value)}"
        )
    if not _DEVICE.fullmatch(value):
        raise ValueError(
            f"device must be 'cpu', 'cuda', 'cuda:<n>', 'mps' or 'auto', got {value!r}"
        )


def _check_head_width(scalings: tuple[str, ...], d_model: int, n_heads: int, original: int) -> None:
    """Each scaling works at the head width (NTK's base exponent d/(d-2) needs d > 2)."""
    head_dim = d_model // n_heads
    failing, reason = [], ""
    for name in scalings:
        try:
            spec = ROPE_SCALING_SPECS[name].example(
                factor=2.0, original_max_position_embeddings=original, rotary_dim=head_dim
            )
            spec.frequencies(head_dim)
        except (TypeError, ValueError) as exc:
            failing.append(name)
            reason = reason or str(exc)
    if failing:
        raise ValueError(
            f"rope_eval_scalings {failing} cannot scale a head width of {head_dim} "
            f"(d_model={d_model}, n_heads={n_heads}): {reason}"
        )
