"""Validation of user input, shared by every front end.

Each check raises ``TypeError`` for a value of the wrong kind and ``ValueError`` for a
value of the right kind outside what is valid, and the message names both the value
and what would be valid.
"""

from __future__ import annotations

import decimal
import math
import numbers
from collections.abc import Sequence
from typing import Any, Literal, TypeVar, cast

import numpy as np

Layout = Literal["interleaved", "split"]
Formula = Literal["paper", "tensor2tensor"]
LAYOUTS: tuple[Layout, ...] = ("interleaved", "split")
FORMULAS: tuple[Formula, ...] = ("paper", "tensor2tensor")

# One of a fixed set of strings: ``check_choice`` returns the type of its choices, so a
# value checked against a tuple of ``Literal`` strings carries that ``Literal`` type.
Choice = TypeVar("Choice", bound=str)

# Refuse to build a table whose estimated peak memory exceeds this many bytes unless
# the caller raises the limit (``max_bytes=None`` removes it).
DEFAULT_MAX_BYTES = 4 * 2**30


def describe(value: Any) -> str:
    """``repr`` of ``value`` with its type, kept short (arrays by shape and dtype)."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None and not np.isscalar(value):
        return f"a {type(value).__name__} of shape {tuple(shape)} and dtype {dtype}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def show_number(value: Any) -> str:
    """A number as a message shows it: an int exactly up to 20 digits, a larger one to 6
    significant digits (however large: ``float`` and ``str`` refuse the largest ints),
    anything else by ``repr``.

    Example:
        >>> show_number(2**53 + 1), show_number(10**400), show_number(0.5)
        ('9007199254740993', '1.00000e+400', '0.5')
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        number = int(value)
        return str(number) if abs(number) < 10**20 else format(decimal.Decimal(number), ".6g")
    return repr(value)


def as_float(value: Any) -> float:
    """``float(value)`` for a real number, ``±inf`` where it is too large for a float64
    (a huge Python int or ``Fraction``), so that the caller's finiteness check refuses it."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def check_int(value: Any, name: str, *, minimum: int, maximum: int | None = None) -> int:
    """An integer (not bool, not float) in ``[minimum, maximum]``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {minimum}, got {describe(value)}")
    number = int(value)
    if number < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {show_number(number)}")
    if maximum is not None and number > maximum:
        bound = f"2**{maximum.bit_length() - 1} = " if maximum & (maximum - 1) == 0 else ""
        raise ValueError(f"{name} must be at most {bound}{maximum}, got {show_number(number)}")
    return number


def check_length(value: Any, name: str = "length") -> int:
    return check_int(value, name, minimum=0)


MAX_POSITION = 1 << 53
"""The largest position magnitude: every integer in ``±2**53`` is an exact float64, and
the angle reduction of :mod:`posenc.core.precision` is exact up to it. Positions
``-2**53 .. 2**53`` are valid, both ends included."""

MAX_POSITIONS = MAX_POSITION
"""The most positions a table may hold: ``2**53`` rows, positions ``0 .. 2**53 - 1``."""


def position_error(name: str, value: Any, detail: str = "") -> ValueError:
    """The one refusal of a position past ``±2**53``, for ``name`` that holds ``value``.

    Example:
        >>> print(position_error("positions", 2**53 + 1))
        positions must lie within ±2**53 = ±9007199254740992 (where every integer is an \
exact float64), got 9007199254740993
    """
    return ValueError(
        f"{name} must lie within ±2**53 = ±{MAX_POSITION} (where every integer is an exact "
        f"float64), got {show_number(value)}{detail}"
    )


def check_span(first: int, last: int, name: str = "positions", detail: str = "") -> None:
    """Refuse a run of positions ``first .. last`` (ints) reaching past ``±2**53``."""
    for end in (first, last):
        if abs(end) > MAX_POSITION:
            raise position_error(name, end, detail)


def check_position(value: Any, name: str) -> int:
    """One int position (a start, an offset) within ``±2**53``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int within ±2**53, got {describe(value)}")
    number = int(value)
    check_span(number, number, name)
    return number


def check_max_length(value: Any, name: str = "max_length") -> int:
    """A table length: an int in ``[1, 2**53]`` (positions ``0 .. 2**53 - 1``)."""
    return check_int(value, name, minimum=1, maximum=MAX_POSITIONS)


MAX_WIDTH = 1 << 24
"""The widest encoding accepted (``d_model``, ``head_dim``, ``channels``): 16,777,216,
far past any model, so that a mistyped width is an error at once, never minutes of
frequencies or an allocation that fails deep inside NumPy."""


def check_width(value: Any, name: str, *, minimum: int = 1) -> int:
    """An int width in ``[minimum, MAX_WIDTH]``."""
    number = check_int(value, name, minimum=minimum)
    if number > MAX_WIDTH:
        raise ValueError(f"{name} must be at most 2**24 = {MAX_WIDTH}, got {show_number(number)}")
    return number


MAX_WEIGHTS = 1 << 32
"""The most entries one trainable weight tensor may have (16 GiB in float32): several
times the largest embedding table of any released model, so that a mistyped size is
an error at once, never an allocation that fails inside a framework or fills memory."""


def check_weights(sizes: dict[str, int], what: str) -> None:
    """Refuse a weight tensor of ``sizes`` (argument name -> size) past :data:`MAX_WEIGHTS`.

    Example:
        >>> check_weights({"vocab_size": 10**9, "d_model": 4096}, "this token embedding")
        Traceback (most recent call last):
        ...
        ValueError: this token embedding of vocab_size=1000000000 x d_model=4096 would have \
4.1e+12 weights, more than 2**32; give smaller sizes
    """
    count = math.prod(sizes.values())
    if count > MAX_WEIGHTS:
        shape = " x ".join(f"{name}={show_number(size)}" for name, size in sizes.items())
        shown = f"{count:.2g}" if count < 10**300 else show_number(count)
        raise ValueError(
            f"{what} of {shape} would have {shown} weights, more than 2**32; give smaller sizes"
        )


def check_d_model(value: Any) -> int:
    return check_width(value, "d_model")


def check_positive(value: Any, name: str) -> float:
    """A finite real number > 0 (not a bool), as a float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a finite real number > 0, got {describe(value)}")
    number = as_float(value)
    if not math.isfinite(number) or not number > 0:
        raise ValueError(f"{name} must be a finite real number > 0, got {show_number(value)}")
    return number


def check_real(
    value: Any, name: str, *, minimum: float | None = None, strict: bool = False
) -> float:
    """A finite real number (not bool), ``> minimum`` if ``strict`` else ``>= minimum``."""
    bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a finite real number{bound}, got {describe(value)}")
    number = as_float(value)
    if not math.isfinite(number) or (
        minimum is not None and (number <= minimum if strict else number < minimum)
    ):
        raise ValueError(f"{name} must be a finite real number{bound}, got {show_number(value)}")
    return number


def check_bool(value: Any, name: str) -> bool:
    """A bool (Python or NumPy), as a Python bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {describe(value)}")
    return bool(value)


def check_base(value: Any) -> float:
    """The ``n`` of ``sin(k / n^(2i/d))``: a finite real number > 0 other than 1."""
    base = check_positive(value, "base")
    if base == 1:
        raise ValueError(
            "base must not be 1: with base=1 every frequency n^(-2i/d) equals 1, so every "
            "column pair repeats sin(k), cos(k) and positions 2π apart get the same vector; "
            "use base > 1 (10000 in the paper, 100 in the worked examples)"
        )
    return base


def check_choice(value: Any, name: str, choices: Sequence[Choice]) -> Choice:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {list(choices)}, got {describe(value)}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    # The membership test above is the proof that ``value`` is one of ``choices``.
    return cast(Choice, value)


def check_probability(value: Any, name: str = "dropout") -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float in [0, 1), got {describe(value)}")
    p = as_float(value)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {show_number(value)}")
    return p


def real_array(value: Any, name: str, *, what: str = "real numbers") -> np.ndarray:
    """``value`` as a NumPy array of integers or floats (not bools), its dtype kept."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged lists and the like
        raise TypeError(f"{name} must be an array of numbers, got {describe(value)}") from exc
    if array.dtype == np.bool_ or array.dtype.kind not in "iuf":
        raise TypeError(f"{name} must hold {what}, got an array of dtype {array.dtype}")
    return array


def check_positions(value: Any, name: str = "positions") -> np.ndarray:
    """An array of finite real positions (integer or fractional, any shape)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int length or an array of numbers, got a bool")
    array = real_array(value, name, what="integers or real numbers")
    if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
        bad = array[~np.isfinite(array)].ravel()[0]
        raise ValueError(f"{name} must be finite, got {float(bad)!r} among them")
    if array.size:
        low, high = array.min(), array.max()
        if array.dtype.kind in "iu":
            if max(-int(low), int(high)) > MAX_POSITION:
                raise position_error(name, int(high) if int(high) > MAX_POSITION else int(low))
        elif max(-float(low), float(high)) > MAX_POSITION:
            # beyond it the angle reduction is no longer exact (and at ~1e300 it overflows)
            raise position_error(name, float(high) if high > MAX_POSITION else float(low))
    return array


class MemoryLimitError(ValueError):
    """A table or bias refused because it would need more memory than the limit allows.

    A ``ValueError``, so code that catches those keeps working; the front ends catch this
    one alone when a table would outgrow the limit (:mod:`posenc.core.positions`).
    ``what``, ``nbytes`` and ``max_bytes`` say what was refused (``None`` where unknown).

    Example:
        >>> import posenc
        >>> try:
        ...     posenc.sinusoidal(10**9, 512)
        ... except posenc.MemoryLimitError as error:
        ...     print(str(error).split(",")[0])
        this positional-encoding table would need about 1.9 TiB
    """

    def __init__(
        self,
        message: str,
        *,
        what: str | None = None,
        nbytes: int | None = None,
        max_bytes: int | None = None,
    ) -> None:
        super().__init__(message)
        self.what, self.nbytes, self.max_bytes = what, nbytes, max_bytes

    def naming(self, given: str, fix: str) -> MemoryLimitError:
        """The same refusal said of the arguments ``given`` (``"max_length=..."``) of a
        caller that has no ``max_bytes`` to raise (a module), with ``fix`` as the remedy."""
        if self.what is None or self.nbytes is None or self.max_bytes is None:
            return MemoryLimitError(f"{given}: {self}")
        return MemoryLimitError(
            f"{given}: {self.what} would need about {format_bytes(self.nbytes)}, "
            f"more than the limit of {format_bytes(self.max_bytes)}; {fix}",
            what=self.what,
            nbytes=self.nbytes,
            max_bytes=self.max_bytes,
        )


def check_max_bytes(value: Any) -> int | None:
    """A memory limit: ``None`` (no limit) or an int >= 0, in bytes."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"max_bytes must be an int >= 0 or None, got {describe(value)}")
    if value < 0:
        raise ValueError(f"max_bytes must be an int >= 0 or None, got {show_number(value)}")
    return int(value)


def check_memory(nbytes: int, what: str, max_bytes: int | None, *, fix: str | None = None) -> None:
    """Refuse work whose estimated peak memory exceeds ``max_bytes``.

    ``fix`` says what to do instead where the caller has no ``max_bytes`` argument to
    raise (a module's fixed limit); by default the message points to ``max_bytes``.
    """
    max_bytes = check_max_bytes(max_bytes)
    if max_bytes is None or nbytes <= max_bytes:
        return
    if fix is not None:
        message = (
            f"{what} would need about {format_bytes(nbytes)}, more than the limit of "
            f"{format_bytes(max_bytes)}; {fix}"
        )
    else:
        message = (
            f"{what} would need about {format_bytes(nbytes)}, more than max_bytes="
            f"{format_bytes(max_bytes)}; pass a larger max_bytes (or max_bytes=None) if you "
            "really want it"
        )
    raise MemoryLimitError(message, what=what, nbytes=nbytes, max_bytes=max_bytes)


def format_bytes(nbytes: int | float) -> str:
    """``nbytes`` in B, KiB, ... TiB (``:.3g`` past 1000 TiB, for any int).

    Example:
        >>> format_bytes(512), format_bytes(3 * 2**30), format_bytes(2**80), format_bytes(2**1100)
        ('512 B', '3.0 GiB', '1.1e+12 TiB', '1.24e+319 TiB')
    """
    if isinstance(nbytes, int) and abs(nbytes) >= 2**1000:  # past a float: count in Decimal
        return f"{decimal.Decimal(nbytes) / 2**40:.3g} TiB"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{nbytes:.0f} {unit}"
            return f"{nbytes:.1f} {unit}" if abs(nbytes) < 1000 else f"{nbytes:.3g} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")
