"""A small decoder-only transformer (GPT) with a pluggable positional scheme.

One file, written to be read. The residual stream of width ``C = d_model`` goes through
``n_layers`` pre-LayerNorm blocks, ``x = x + attn(ln_1(x))`` and
``x = x + mlp(ln_2(x))``, then a final LayerNorm and a linear head to the vocabulary.
Attention is :class:`posenc.torch.MultiHeadAttention` (causal); the positional scheme is
injected where it acts:

================  =======================================================================
scheme            where
================  =======================================================================
``nope``          nowhere (:class:`posenc.torch.NoPositionalEncoding`): the causal mask is
                  the only source of order
``learned``       added to the token embeddings (:class:`LearnedPositionalEmbedding`)
``sinusoidal``    added to the token embeddings (:class:`SinusoidalPositionalEncoding`)
``rope``          rotates queries and keys in every layer (:class:`RotaryEmbedding`)
``alibi``         a fixed linear distance penalty on the scores (:class:`ALiBiBias`)
``t5``            a learned bias per distance bucket and head on the scores, one module
                  per layer (:class:`T5RelativeBias`, ``bidirectional=False``),
                  initialised as T5's: N(0, 1/d_model)
``p_rope``        RoPE on the highest three quarters of the frequencies, the rest left
                  unrotated (``scaling="proportional"``, p = 0.75; Barbero et al. 2024)
``rope_learned``  RoPE whose frequencies are trained, from RoPE's
                  (:class:`LearnedRotaryEmbedding`)
``kerple``        a learned ``-p·log(1 + a·distance)`` per head on the scores
                  (:class:`KERPLEBias`); ``kerple_power``: ``-a·distance^p``
``fire``          a learned MLP of the distance normalised by the query's position
                  (:class:`FIREBias`; ``L`` starts at 8, see :data:`FIRE_INIT_L`)
``sandwich``      the dot product of d_model-wide sinusoidal position vectors, a share
                  per head (:class:`SandwichBias`)
``cope``          positions counted by gates of the queries and keys, one set of position
                  vectors per layer (:class:`ContextualPositionEncoding`)
================  =======================================================================

Shapes in comments: ``B`` batch, ``T`` sequence, ``C`` d_model, ``V`` vocabulary.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from torch import Tensor, nn

from posenc.torch import (
    ALiBiBias,
    ContextualPositionEncoding,
    FIREBias,
    KERPLEBias,
    LearnedPositionalEmbedding,
    LearnedRotaryEmbedding,
    MultiHeadAttention,
    NoPositionalEncoding,
    RotaryEmbedding,
    SandwichBias,
    SinusoidalPositionalEncoding,
    T5RelativeBias,
    TokenEmbedding,
)
from posenc.torch.protocols import (
    ContextualScoreBias,
    InputEncoding,
    QueryKeyRotation,
    ScoreBias,
)

from .._checks import check_choice, check_int, describe
from ..core.rope import ROPE_SCALING_SPECS
from .plugins import registered_scheme, scheme_names
from .spec import ROPE_SCHEMES, check_rope_eval_scaling

#: What a scheme acting inside attention is: any of the attention protocol's roles there.
InAttention = QueryKeyRotation | ScoreBias | ContextualScoreBias


def _learned(config: GPTConfig) -> nn.Module:
    # N(0, 1/2): the sinusoids' root mean square, against tokens of RMS 1 (GPT-2's 0.02 is
    # relative to its 0.02 tokens; docs/bench.md shows why not 0.02 here)
    return LearnedPositionalEmbedding(
        config.max_positions, config.d_model, init_std=1.0 / math.sqrt(2.0)
    )


def _sinusoidal(config: GPTConfig) -> nn.Module:
    return SinusoidalPositionalEncoding(
        config.d_model, dropout=0.0, max_length=config.max_positions
    )


def _no_encoding(config: GPTConfig) -> nn.Module:
    return NoPositionalEncoding(config.d_model)


def _rope(config: GPTConfig, scaling: str | None = None, **params: Any) -> RotaryEmbedding:
    return RotaryEmbedding(
        config.head_dim,
        max_length=config.max_positions,
        scaling=scaling,
        scaling_params=params or None,
    )


def _alibi(config: GPTConfig) -> ALiBiBias:
    return ALiBiBias(config.n_heads)


def _t5(config: GPTConfig) -> T5RelativeBias:
    bias = T5RelativeBias(config.n_heads, bidirectional=False)
    # As T5 itself (Hugging Face's T5PreTrainedModel._init_weights, initializer_factor 1):
    # N(0, 1/d_model), not nn.Embedding's N(0, 1). A bucket that training never reaches
    # keeps its initial bias at evaluation; at N(0, 1) that is a random bias as large as
    # the scores themselves at every distance past the trained ones.
    nn.init.normal_(bias.relative_attention_bias.weight, std=config.d_model**-0.5)
    return bias


#: p-RoPE's proportion of rotated frequencies: one of the two the paper trains (0.25, 0.75).
P_ROPE_PROPORTION = 0.75

#: FIRE's initial threshold ``L``. The authors' 512 is a quarter of the 2,048 positions
#: they train on; the bench keeps that quarter of its longest training sequences (copy
#: at its default longest length, 16: 34 tokens).
FIRE_INIT_L = 8.0


def _p_rope(config: GPTConfig) -> RotaryEmbedding:
    return _rope(config, "proportional", partial_rotary_factor=P_ROPE_PROPORTION)


def _rope_learned(config: GPTConfig) -> LearnedRotaryEmbedding:
    return LearnedRotaryEmbedding(config.head_dim)


def _kerple(config: GPTConfig, kernel: str = "log") -> KERPLEBias:
    return KERPLEBias(config.n_heads, kernel=kernel)


def _kerple_power(config: GPTConfig) -> KERPLEBias:
    return _kerple(config, "power")


def _fire(config: GPTConfig) -> FIREBias:
    return FIREBias(config.n_heads, init_L=FIRE_INIT_L)


def _sandwich(config: GPTConfig) -> SandwichBias:
    return SandwichBias(config.n_heads, dim=config.d_model, max_length=config.max_positions)


def _cope(config: GPTConfig) -> ContextualPositionEncoding:
    # as the authors: a vector for every count a sequence can reach, 0 .. its length
    return ContextualPositionEncoding(config.head_dim, max_positions=config.max_positions + 1)


#: The bench's schemes by where they act, a builder each: on the input embeddings, or
#: in every attention layer (a fresh module per layer; their input is left as it is).
#: Every scheme the registry marks for the bench has a place here: GPTConfig refuses any
#: other.
_INPUT_ENCODINGS: dict[str, Callable[[GPTConfig], nn.Module]] = {
    "nope": _no_encoding,
    "learned": _learned,
    "sinusoidal": _sinusoidal,
}
_IN_ATTENTION: dict[str, Callable[[GPTConfig], InAttention]] = {
    "rope": _rope,
    "p_rope": _p_rope,
    "rope_learned": _rope_learned,
    "alibi": _alibi,
    "t5": _t5,
    "kerple": _kerple,
    "kerple_power": _kerple_power,
    "fire": _fire,
    "sandwich": _sandwich,
    "cope": _cope,
}
MODEL_SCHEMES = (*_INPUT_ENCODINGS, *_IN_ATTENTION)


def _registered_module(config: GPTConfig) -> nn.Module | None:
    """A fresh module of a scheme registered with :func:`posenc.bench.register_scheme`
    (None for a built-in scheme), checked to play one of the attention protocol's roles."""
    factory = registered_scheme(config.scheme)
    if factory is None:
        return None
    module = factory(
        d_model=config.d_model,
        n_heads=config.n_heads,
        head_dim=config.head_dim,
        max_positions=config.max_positions,
    )
    roles = (InputEncoding, QueryKeyRotation, ScoreBias, ContextualScoreBias)
    if not isinstance(module, nn.Module) or not isinstance(module, roles):
        raise TypeError(
            f"scheme {config.scheme!r}: its factory must return an nn.Module that is an "
            "InputEncoding, a QueryKeyRotation, a ScoreBias or a ContextualScoreBias "
            "(posenc.torch.protocols), "
            f"got {describe(module)}"
        )
    return module


@dataclass(frozen=True)
class GPTConfig:
    """Hyperparameters of :class:`GPT`.

    Args:
        vocab_size: Number of token ids.
        scheme: One of :data:`posenc.bench.spec.SCHEMES`, or a registered scheme
            (:func:`posenc.bench.register_scheme`).
        d_model: Width of the residual stream; a multiple of ``n_heads``.
        n_layers: Number of blocks.
        n_heads: Attention heads per block.
        max_positions: Longest sequence the model will see: the number of learned
            position vectors, and the initial size of the sinusoidal and RoPE tables
            (which grow if needed).
        mlp_ratio: Hidden width of the MLP in units of ``d_model``.
    """

    vocab_size: int
    scheme: str
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    max_positions: int = 256
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        check_int(self.vocab_size, "vocab_size", minimum=1)
        check_choice(self.scheme, "scheme", scheme_names())
        if self.scheme not in MODEL_SCHEMES and registered_scheme(self.scheme) is None:
            raise ValueError(
                f"scheme {self.scheme!r} has no place in the bench model yet; it builds "
                f"{', '.join(map(repr, MODEL_SCHEMES))}"
            )
        check_int(self.d_model, "d_model", minimum=1)
        check_int(self.n_layers, "n_layers", minimum=1)
        check_int(self.n_heads, "n_heads", minimum=1)
        check_int(self.max_positions, "max_positions", minimum=1)
        check_int(self.mlp_ratio, "mlp_ratio", minimum=1)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model must be a multiple of n_heads, got d_model={self.d_model}, "
                f"n_heads={self.n_heads}"
            )
        if self.scheme in ROPE_SCHEMES and self.head_dim % 2:
            raise ValueError(
                f"scheme {self.scheme!r} needs an even head width, got d_model / n_heads = "
                f"{self.head_dim}"
            )

    @property
    def head_dim(self) -> int:
        """Features per head, ``d_model // n_heads``."""
        return self.d_model // self.n_heads


def rope_scaling_params(
    name: str, factor: float, original: int, *, head_dim: int | None = None
) -> dict[str, Any]:
    """The ``scaling_params`` of :class:`RotaryEmbedding` for an evaluation-time scaling.

    The parameters of the scaling's spec class's ``example`` for this context extension
    (:meth:`posenc.RopeScaling.example`), those that differ from their defaults.

    Args:
        name: One of :func:`posenc.bench.spec.rope_eval_choices` (the
            :data:`~posenc.bench.spec.ROPE_EVAL_SCALINGS` and any registered scaling
            whose parameters the bench can choose).
        factor: The context extension (>= 1), e.g. positions needed / positions trained.
        original: The number of positions trained on (``original_max_position_embeddings``).
        head_dim: The rotary width, for a method whose example depends on it (``None``:
            the smallest, 2; none of the methods the bench evaluates by default uses it).

    Returns:
        ``{"factor": f}`` for ``"linear"`` and ``"ntk"``; ``{"factor": f,
        "original_max_position_embeddings": original}`` for ``"yarn"`` and
        ``"dynamic_ntk"``.

    Example:
        >>> rope_scaling_params("yarn", 2.0, 35)
        {'factor': 2.0, 'original_max_position_embeddings': 35}
    """
    check_rope_eval_scaling(name, "scaling")
    original = check_int(original, "original", minimum=1)
    rotary_dim = 2 if head_dim is None else check_int(head_dim, "head_dim", minimum=2)
    spec = ROPE_SCALING_SPECS[name].example(
        factor=factor, original_max_position_embeddings=original, rotary_dim=rotary_dim
    )
    return spec.params()


class MLP(nn.Module):
    """``Linear(C, r·C) → GELU → Linear(r·C, C)``."""

    def __init__(self, d_model: int, ratio: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, ratio * d_model)
        self.proj = nn.Linear(ratio * d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        h = nn.functional.gelu(self.fc(x))  # (B, T, r·C)
        out: Tensor = self.proj(h)  # (B, T, C)
        return out


class Block(nn.Module):
    """A pre-LayerNorm transformer block: causal self-attention, then an MLP."""

    def __init__(self, config: GPTConfig, position: InAttention | None) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        # "auto": SDPA in training and at the usual lengths; FlexAttention for long
        # evaluations (2**26 scores or more, no gradients), where a materialised bias
        # would need batch·heads·L² floats
        self.attn = MultiHeadAttention(
            config.d_model, config.n_heads, position=position, causal=True,
            attn_implementation="auto",
        )  # fmt: skip
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config.d_model, config.mlp_ratio)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        x = x + self.mlp(self.ln_2(x))  # (B, T, C)
        return x


class GPT(nn.Module):
    """Decoder-only transformer over token ids with the positional scheme of ``config``.

    Args:
        config: A :class:`GPTConfig`.

    Call arguments:
        tokens: int64 ``(batch, seq)`` token ids in ``0 .. vocab_size - 1``.

    Returns:
        Logits ``(batch, seq, vocab_size)``: row ``t`` scores the token at ``t + 1``.

    Example:
        >>> import torch
        >>> model = GPT(GPTConfig(vocab_size=12, scheme="rope", d_model=16, n_heads=2))
        >>> model(torch.randint(0, 12, (3, 7))).shape
        torch.Size([3, 7, 12])
        >>> with model.rope_scaling("ntk", factor=2.0, original=8):
        ...     model.blocks[0].attn.position.spec.scaling.name
        'ntk'
        >>> model.blocks[0].attn.position.spec.scaling.name  # restored on leaving the block
        'default'
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {describe(config)}")
        self.config = config
        C, scheme = config.d_model, config.scheme
        # Token vectors of RMS about 1 (N(0, 1/C), times √C), the size of the sinusoids.
        self.tokens = TokenEmbedding(config.vocab_size, C, scale=True)
        nn.init.normal_(self.tokens.embedding.weight, std=1.0 / math.sqrt(C))
        # Absolute schemes act on the embeddings; the others inside attention.
        first = _registered_module(config)  # a registered scheme's module, or None
        if isinstance(first, InputEncoding):
            self.positions: nn.Module = first
            in_attention: list[InAttention | None] = [None] * config.n_layers
        else:
            self.positions = _INPUT_ENCODINGS.get(scheme, _no_encoding)(config)
            in_attention = [
                cast("InAttention", first) if first is not None else self._attention_position()
            ]
            in_attention += [self._attention_position() for _ in range(config.n_layers - 1)]
        self.blocks = nn.ModuleList([Block(config, position) for position in in_attention])
        self.ln_f = nn.LayerNorm(C)
        # The linear layers keep PyTorch's default initialisation (uniform, standard
        # deviation 1/√(3·fan_in), about 0.07 here): in a model this small it learns the
        # copy task in about half the steps that GPT-2's N(0, 0.02) needs.
        self.head = nn.Linear(C, config.vocab_size, bias=False)

    def _attention_position(self) -> InAttention | None:
        """A fresh module for one attention layer (None for the input encodings)."""
        if registered_scheme(self.config.scheme) is not None:
            return cast("InAttention", _registered_module(self.config))
        build = _IN_ATTENTION.get(self.config.scheme)
        return None if build is None else build(self.config)

    def forward(self, tokens: Tensor) -> Tensor:
        if not isinstance(tokens, Tensor) or tokens.dim() != 2:
            shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else describe(tokens)
            raise ValueError(f"GPT expects tokens of shape (batch, seq), got {shape}")
        x = self.tokens(tokens)  # (B, T, C)
        x = cast(InputEncoding, self.positions).encode(x)  # (B, T, C), plus position vectors
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        x = self.ln_f(x)  # (B, T, C)
        logits: Tensor = self.head(x)  # (B, T, V)
        return logits

    def num_parameters(self) -> int:
        """Number of trained parameters (buffers such as sinusoid tables excluded)."""
        return sum(p.numel() for p in self.parameters())

    @contextlib.contextmanager
    def rope_scaling(
        self, scaling: str | None, *, factor: float = 1.0, original: int = 1
    ) -> Iterator[GPT]:
        """Within the block, every layer's RoPE uses ``scaling``; the original afterwards.

        RoPE has no weights, so a new :class:`RotaryEmbedding` per attention layer changes
        the frequencies without touching anything trained.

        Args:
            scaling: ``None`` (plain RoPE) or one of
                :func:`posenc.bench.spec.rope_eval_choices`.
            factor: The context extension (>= 1).
            original: The number of positions trained on (yarn, dynamic_ntk).

        Yields:
            The model.

        Raises:
            ValueError: The model's scheme is not ``"rope"``, or invalid parameters.
        """
        if self.config.scheme != "rope":
            raise ValueError(
                f"rope_scaling needs a model with scheme 'rope', this one has "
                f"{self.config.scheme!r}"
            )
        params = (
            {}
            if scaling is None
            else rope_scaling_params(scaling, factor, original, head_dim=self.config.head_dim)
        )
        device = self.head.weight.device
        blocks = cast("list[Block]", list(self.blocks))  # nn.ModuleList is not generic
        saved = [block.attn.position for block in blocks]
        try:
            for block in blocks:
                block.attn.position = _rope(self.config, scaling, **params).to(device)
            yield self
        finally:
            for block, position in zip(blocks, saved, strict=True):
                block.attn.position = position
