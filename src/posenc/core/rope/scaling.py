"""The interface of a RoPE scaling method: a frozen, validated dataclass, :class:`RopeScaling`.

A scaling spec holds a method's parameters, checks them when it is made (without knowing
the rotary width), and computes the scaled inverse frequencies and the attention factor
for a width and base: :meth:`RopeScaling.frequencies`. It converts to and from a plain
dict whose keys are the ones Hugging Face configs use::

    >>> from posenc.core.rope import YarnScaling
    >>> YarnScaling(factor=4.0, original_max_position_embeddings=2048).to_dict()
    {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 2048}

so it round-trips through JSON, a Keras ``get_config`` and a model config. The built-in
methods are in :mod:`.methods`; every method is registered by name in :mod:`.registry`,
which every front end, the command line and the plots read.

The width-dependent checks (the NTK exponent needs ``d > 2``; LongRoPE needs one divisor
per frequency pair) run in :meth:`RopeScaling.frequencies`, when the width is known.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..._checks import check_base, check_int
from .frequencies import check_rotary_dim

__all__ = ["RopeScaling"]


def _plain(value: Any) -> Any:
    """A field value as JSON: tuples as lists, NumPy scalars as Python numbers."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """Base of the RoPE scaling specs: parameters in, ``(inv_freq, attention_factor)`` out.

    A subclass is a frozen dataclass whose fields are the method's parameters, named as
    in Hugging Face configs. It sets :attr:`name` (its registry name), validates its
    fields in ``__post_init__`` (raising ``TypeError``/``ValueError`` that name the value
    and what is valid), and implements :meth:`_inv_freq`. Register it with
    :func:`posenc.register_rope_scaling` and it works by name in every front end.

    Attributes:
        name: The registry name, written as ``"rope_type"`` by :meth:`to_dict`.
        length_dependent: Whether the frequencies depend on the current sequence length
            (then :meth:`frequencies` takes ``seq_len`` and :attr:`original_length` is
            where the scaling starts).
        needs_base_above_one: Whether the method's rule assumes frequencies
            ``base^(-2i/d)`` that fall with the pair index ``i`` (a ramp over the index, a
            scaled base), which takes ``base > 1``; :meth:`frequencies` refuses a smaller
            base for such a method. Rules that treat each frequency alone (linear,
            llama3, longrope) take any base RoPE takes.

    Example:
        >>> import dataclasses
        >>> @dataclasses.dataclass(frozen=True, kw_only=True)
        ... class Stretch(RopeScaling):  # every frequency divided by `factor`
        ...     factor: float = 2.0
        ...     def _inv_freq(self, rotary_dim, base, seq_len):
        ...         return base ** (-np.arange(0, rotary_dim, 2) / rotary_dim) / self.factor, 1.0
        >>> Stretch(factor=4.0).frequencies(4, 100.0)[0].tolist()
        [0.25, 0.025]
    """

    name: ClassVar[str] = ""
    length_dependent: ClassVar[bool] = False
    needs_base_above_one: ClassVar[bool] = False

    # -- what a subclass provides ----------------------------------------------------------

    def _inv_freq(self, rotary_dim: int, base: float, seq_len: int | None) -> tuple[Any, float]:
        """``(inv_freq, attention_factor)`` for a validated width, base and length."""
        raise NotImplementedError

    # -- the shared interface --------------------------------------------------------------

    def frequencies(
        self, rotary_dim: int, base: float = 10000.0, *, seq_len: int | None = None
    ) -> tuple[np.ndarray, float]:
        """The scaled inverse frequencies and the attention factor.

        Args:
            rotary_dim: The rotary width ``d``, an even int >= 2.
            base: The RoPE base (``rope_theta``); finite, > 0 and not 1, and > 1 for a
                method that :attr:`needs_base_above_one`.
            seq_len: The current sequence length, for a length-dependent method
                (``None``: :attr:`original_length`, the frequencies at construction).

        Returns:
            ``(inv_freq, attention_factor)``: float64 ``(d // 2,)`` and a float, the
            factor Hugging Face multiplies the cos/sin tables by (1.0 where a method has
            none).

        Example:
            >>> from posenc.core.rope import LinearScaling
            >>> inv_freq, attention = LinearScaling(factor=2.0).frequencies(4, 100.0)
            >>> inv_freq.tolist(), attention
            ([0.5, 0.05], 1.0)
        """
        d = check_rotary_dim(check_int(rotary_dim, "rotary_dim", minimum=2), rotary_dim)
        return self._checked_frequencies(d, check_base(base), seq_len)

    def _checked_frequencies(
        self, d: int, base: float, seq_len: int | None = None
    ) -> tuple[np.ndarray, float]:
        """:meth:`frequencies` of a rotary width ``d`` and ``base`` already validated (by
        :func:`~posenc.core.rope.check_rotary_dim` and ``check_base``, as a
        :class:`~posenc.RopeSpec` does once, when it is made): the method's own checks
        (a base > 1, ``seq_len``) and its results' are made here."""
        if self.needs_base_above_one and base < 1:
            raise ValueError(
                f"base must be a finite real number > 1 with RoPE scaling {self.name!r}, whose "
                "rule assumes frequencies base^(-2i/d) that fall with the pair index i (with "
                f"base < 1 they rise and the rule turns around), got {base!r}"
            )
        if seq_len is not None:
            if not self.length_dependent:
                raise TypeError(
                    f"RoPE scaling {self.name!r} does not depend on the sequence length; "
                    "seq_len applies only to methods that do (dynamic_ntk, longrope, ...)"
                )
            seq_len = check_int(seq_len, "seq_len", minimum=1)
        where = f"RoPE scaling {self!r} at rotary_dim={d}, base={base!r}, seq_len={seq_len}"
        try:
            # (underflow too: a frequency divided down to a subnormal or to 0 is lost)
            with np.errstate(over="raise", divide="raise", invalid="raise", under="raise"):
                inv_freq, attention = self._inv_freq(d, base, seq_len)
                frequencies = np.asarray(inv_freq, dtype=np.float64)
                attention = float(attention)
        except (ArithmeticError, FloatingPointError, ValueError) as exc:
            # a parameter far outside its useful range: overflow, a log of a negative, ...
            raise ValueError(f"{where} cannot be computed ({exc}); check its parameters") from None
        if frequencies.shape != (d // 2,) or not np.all(np.isfinite(frequencies)):
            raise ValueError(
                f"{where} gives inverse frequencies that are not {d // 2} finite numbers"
            )
        if not (math.isfinite(attention) and attention > 0):
            raise ValueError(
                f"{where} gives the attention factor {attention!r}; it must be finite and > 0 "
                "(the cos/sin tables are multiplied by it)"
            )
        return frequencies, attention

    @property
    def original_length(self) -> int | None:
        """``original_max_position_embeddings`` where the method has one, else ``None``."""
        value = getattr(self, "original_max_position_embeddings", None)
        return None if value is None else int(value)

    @property
    def switch_length(self) -> int | None:
        """For a method with two sets of frequencies, the length past which the second
        applies (LongRoPE: ``original_max_position_embeddings``); ``None`` for a method
        whose frequencies change with every length (dynamic NTK) or that has one set.

        A call whose length is known only inside a trace can select between two sets
        in the graph (:func:`posenc.core.plan.plan_scaling`); not between infinitely many.
        """
        return None

    def scaled_length(self, length: int) -> int:
        """The length whose frequencies a call of ``length`` positions uses.

        The call's own length past the original length, else the original length (the
        construction frequencies): dynamic NTK and the default for registered methods.
        LongRoPE uses one length, ``original + 1``, past the original. No state is kept
        between calls (:func:`posenc.core.plan.plan_scaling`). Methods that do not depend
        on the length use the original length (``0`` when they have none).
        """
        original = self.original_length or 0
        if not self.length_dependent:
            return original
        return max(length, original)

    def params(self) -> dict[str, Any]:
        """The parameters that differ from their defaults, as plain JSON values."""
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.default is not dataclasses.MISSING and value == field.default:
                continue
            out[field.name] = _plain(value)
        return out

    def to_dict(self) -> dict[str, Any]:
        """``{"rope_type": name, **params}``, the form of a Hugging Face ``rope_scaling``.

        Example:
            >>> from posenc.core.rope import Llama3Scaling
            >>> Llama3Scaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            ...               original_max_position_embeddings=8192).to_dict()["rope_type"]
            'llama3'
        """
        return {"rope_type": self.name, **self.params()}

    @classmethod
    def parameters(cls) -> dict[str, bool]:
        """The method's parameter names, each with whether it is required."""
        return {
            f.name: f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            for f in dataclasses.fields(cls)
        }

    @classmethod
    def example(
        cls, *, factor: float, original_max_position_embeddings: int, rotary_dim: int
    ) -> RopeScaling:
        """An instance for a context extension by ``factor`` from ``L₀``, for pictures.

        The default fills the fields ``factor`` and ``original_max_position_embeddings``
        where the method has them and leaves the rest at their defaults; a method with
        other required parameters overrides this (or has no example: ``TypeError``).
        """
        given = {
            "factor": float(factor),
            "original_max_position_embeddings": int(original_max_position_embeddings),
        }
        fields = cls.parameters()
        missing = [name for name, required in fields.items() if required and name not in given]
        if missing:
            raise TypeError(
                f"RoPE scaling {cls.name!r} needs {missing} besides factor and "
                "original_max_position_embeddings; it has no example to draw"
            )
        return cls(**{name: value for name, value in given.items() if name in fields})

    def _set(self, name: str, value: Any) -> None:
        """Store a validated, normalised value on the frozen instance."""
        object.__setattr__(self, name, value)
