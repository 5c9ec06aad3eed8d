"""What a ``transformers`` rotary module returns, read from the module itself.

Hugging Face's rotary modules share an interface, ``forward(x, position_ids[,
layer_type])``, but not what they return. Four forms are in use:

* ``"half"``: ``(cos, sin)``, each ``(batch, seq, rotary_dim)``, pair ``i`` in columns
  ``i`` and ``i + rotary_dim / 2`` (Llama, Qwen, Gemma, Mistral and most others);
* ``"interleaved"``: the same shapes, pair ``i`` in columns ``2i`` and ``2i + 1``
  (Cohere, Cohere 2: Command R, R7B, A);
* ``"pairs"``: ``(cos, sin)``, each ``(batch, seq, rotary_dim / 2)``, one column per
  pair (GPT-OSS, DeepSeek-V4);
* ``"complex"``: ``cos + i sin``, ``(batch, seq, rotary_dim / 2)`` (Llama 4, DeepSeek-V2).

Most cast their output to the input's dtype; some (LFM3) return float32 for a 16-bit
input. :class:`RotaryProbe` calls the module at positions 0..15 (where Hugging Face's
float32 angles are within a few float32 ulp of the exact ones) and reads its form from
the structure of what it returns (which columns are equal; the width against the
rotary width of the config), never from its class name. :meth:`RotaryProbe.check`
then compares posenc's replacement with the module there, element by element: a module
posenc reads differently from its config, or one whose output is none of the four
forms, is a ``ValueError`` before the model is changed.

The probe calls a fresh copy of the module, built on the CPU from its class and config,
so that where the model was moved (a GPU, the meta device) or cast (``.bfloat16()``
rounds the inverse frequencies) does not matter; a class that cannot be built from its
config alone is probed as it is. A module that holds learned parameters or persistent
buffers (Mistral Large 3's learned ``alpha``) is refused: posenc's tables come from the
config, and its state would leave the checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from .._extras import require

require("torch", "posenc.integrations.transformers_forms", extra="posenc[transformers]")

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from .._checks import describe  # noqa: E402

__all__ = ["FORMS", "Form", "RotaryProbe"]

Form = Literal["half", "interleaved", "pairs", "complex"]
FORMS: tuple[Form, ...] = ("half", "interleaved", "pairs", "complex")
"""The forms of a rotary module's output posenc gives (see the module's text)."""

PROBE_LENGTH = 16  # positions 0..15
# posenc's (cos, sin) against a float32 module's at positions 0..15: Hugging Face's own
# error there is below 16 float32 ulp of 1 (2**-19); a misread config differs by far more.
TOLERANCE = 2.0**-14


class RotaryProbe:
    """A rotary module's outputs at positions 0..15, its form, and the check of a
    replacement against them.

    Args:
        original: The rotary module.
        layer_types: The layer types its ``forward`` takes (``[None]``: none).
        n_axes: M-RoPE's number of position axes (``position_ids`` ``(n_axes, 1, 16)``,
            each axis at other positions), or ``None``.
    """

    def __init__(self, original: nn.Module, layer_types: Sequence[str | None], n_axes: int | None):
        self.name = type(original).__name__
        _check_stateless(original, self.name)
        self.module = _fresh(original)
        self.positions = _positions(self.module, n_axes, self.name)
        self.outputs = {
            layer_type: self._call(torch.float32, layer_type) for layer_type in layer_types
        }
        if self.module is not original and _device_of(original).type != "meta":
            self._check_original(original)
        # the dtype it returns for a 16-bit input: that input's, or float32 (LFM3)
        returned = _parts(self._call(torch.bfloat16, layer_types[0]))[0].dtype
        if returned not in (torch.bfloat16, torch.float32):
            raise ValueError(
                f"posenc cannot patch {self.name}: for a bfloat16 input it returns {returned}, "
                "where posenc returns the input's dtype or float32"
            )
        self.widen = returned == torch.float32

    def _check_original(self, original: nn.Module) -> None:
        """The module as it is (moved, cast) gives what its config gives: the fresh copy's
        output, to the rounding of its buffers' dtype (a module changed after it was
        built, or whose config was, is refused: posenc reads the config)."""
        tolerance = _tolerance(original)
        positions = self.positions.to(_device_of(original))
        for layer_type, output in self.outputs.items():
            now = self._call(torch.float32, layer_type, original, positions)
            for theirs, fresh in zip(_parts(now), _parts(output), strict=True):
                apart = math.inf
                if theirs.shape == fresh.shape:
                    apart = float((theirs.double().cpu() - fresh.double()).abs().max())
                if apart > tolerance:
                    raise ValueError(
                        f"posenc cannot patch {self.name}: its output differs from that of a "
                        f"{self.name} built from its config (by {apart:.2g} at positions "
                        f"0..{PROBE_LENGTH - 1}), so its state or its config was changed "
                        "after it was built; posenc's tables come from the config"
                    )

    def _call(
        self,
        dtype: torch.dtype,
        layer_type: str | None,
        module: nn.Module | None = None,
        positions: Tensor | None = None,
    ) -> Any:
        positions = self.positions if positions is None else positions
        x = torch.zeros(1, dtype=dtype, device=positions.device)
        args = (x, positions) if layer_type is None else (x, positions, layer_type)
        try:
            with torch.no_grad():
                return (self.module if module is None else module)(*args)
        except Exception as exc:  # any failure of a forward posenc does not know
            raise ValueError(
                f"posenc cannot patch {self.name}: it is not called as a language model's "
                f"rotary module, forward(x, position_ids[, layer_type]) -> (cos, sin) "
                f"({type(exc).__name__}: {exc})"
            ) from None

    def form(self, rotary_dims: dict[str | None, int]) -> Form:
        """The form of the module's output, the same for every layer type, given the
        rotary width of each (from the config); a ``ValueError`` for any other output."""
        forms = {
            layer_type: _form_of(output, rotary_dims[layer_type])
            for layer_type, output in self.outputs.items()
        }
        for layer_type, found in forms.items():
            if found is None:
                width = rotary_dims[layer_type]
                raise ValueError(
                    f"posenc cannot patch {self.name}: "
                    + ("" if layer_type is None else f"for layer_type {layer_type!r} ")
                    + f"it returns {_summary(self.outputs[layer_type])}, none of the forms "
                    f"posenc gives for the config's rotary width {width}: (cos, sin) "
                    f"(batch, seq, {width}) with the pairs in halves or interleaved, "
                    f"(batch, seq, {width // 2}) one per pair, or complex (batch, seq, "
                    f"{width // 2})"
                )
        if len(set(forms.values())) > 1:
            raise ValueError(
                f"posenc cannot patch {self.name}: its layer types return different forms {forms}"
            )
        found = next(iter(forms.values()))
        assert found is not None
        return found

    def check(self, replacement: nn.Module, describe_rope: Any) -> None:
        """``replacement``'s output equals the module's at positions 0..15, element by
        element within :data:`TOLERANCE` (16 ulp of 1 in a 16-bit dtype where the module
        probed, not a fresh copy, holds its frequencies in one); else a ``ValueError``
        naming the element farthest apart and the RoPE posenc read
        (``describe_rope(layer_type)``)."""
        tolerance = _tolerance(self.module)
        x = torch.zeros(1, device=self.positions.device)
        for layer_type, output in self.outputs.items():
            mine = replacement(x, self.positions, layer_type)
            pairs = zip(("cos", "sin"), _parts(output), _parts(mine), strict=True)
            for part, theirs, ours in pairs:
                if theirs.shape != ours.shape:  # (the form's widths agree: a batch or seq shape)
                    raise ValueError(
                        f"posenc cannot patch {self.name}: its {part} has shape "
                        f"{tuple(theirs.shape)}, posenc's {tuple(ours.shape)}"
                    )
                apart = (theirs.double() - ours.double().to(theirs.device)).abs()
                if float(apart.max()) > tolerance:
                    where = _refusal(self.name, part, theirs, ours, apart, tolerance)
                    raise ValueError(f"{where}; posenc read the RoPE {describe_rope(layer_type)}")


def _check_stateless(module: nn.Module, name: str) -> None:
    """A module whose whole state is derived from its config (non-persistent buffers)."""
    state = sorted(module.state_dict())
    if state:
        raise ValueError(
            f"posenc cannot patch {name}: it holds state of its own ({', '.join(state)}), "
            "which a checkpoint sets; posenc's tables come from the config alone"
        )


def _fresh(original: nn.Module) -> nn.Module:
    """A copy of ``original`` built on the CPU from its class and config, or ``original``
    where its class takes more than the config."""
    try:
        with torch.device("cpu"):
            fresh: nn.Module = type(original)(original.config)
    except Exception:  # a constructor of another signature: probe the module itself
        return original
    return fresh


def _positions(module: nn.Module, n_axes: int | None, name: str) -> Tensor:
    """``(1, 16)`` positions 0..15 on ``module``'s device; M-RoPE: ``(n_axes, 1, 16)``,
    every axis at other positions in 0..15."""
    device = _device_of(module)
    if device.type == "meta":
        raise ValueError(
            f"posenc cannot patch {name}: it is on the meta device and cannot be built from "
            "its config alone; patch the model once it is on a device"
        )
    positions = torch.arange(PROBE_LENGTH, device=device)[None]
    if n_axes is None:
        return positions
    return torch.stack([positions * (1 + a) % PROBE_LENGTH for a in range(n_axes)])


def _device_of(module: nn.Module) -> torch.device:
    for tensor in (*module.buffers(), *module.parameters()):
        return tensor.device
    return torch.device("cpu")


def _parts(output: Any) -> tuple[Tensor, Tensor]:
    """``(cos, sin)`` of an output: the two tensors, or a complex one's real and imaginary parts."""
    if isinstance(output, Tensor) and output.is_complex():
        return output.real, output.imag
    cos, sin = output
    return cos, sin


def _form_of(output: Any, rotary_dim: int) -> Form | None:
    """The form of one output (see the module's text); ``None`` for any other."""
    if isinstance(output, Tensor):
        return "complex" if output.is_complex() and output.shape[-1] == rotary_dim // 2 else None
    if not (
        isinstance(output, (tuple, list))
        and len(output) == 2
        and all(isinstance(t, Tensor) and t.is_floating_point() for t in output)
        and output[0].shape == output[1].shape
    ):
        return None
    width = output[0].shape[-1]
    if width == rotary_dim // 2:
        return "pairs"
    if width != rotary_dim:
        return None
    half = width // 2
    if all(torch.equal(t[..., :half], t[..., half:]) for t in output):
        return "half"
    if all(torch.equal(t[..., 0::2], t[..., 1::2]) for t in output):
        return "interleaved"
    return None


def _summary(output: Any) -> str:
    if isinstance(output, (tuple, list)) and all(isinstance(t, Tensor) for t in output):
        shapes = ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in output)
        return f"{len(output)} tensors ({shapes})"
    return describe(output)


def _tolerance(module: nn.Module) -> float:
    """:data:`TOLERANCE`, or 16 ulp of 1 in the 16-bit dtype of a module's buffers."""
    dtypes = [t.dtype for t in module.buffers() if t.is_floating_point()]
    widths = [torch.finfo(dtype).eps for dtype in dtypes if torch.finfo(dtype).bits == 16]
    return max([TOLERANCE, *(16 * eps for eps in widths)])


def _refusal(
    name: str, part: str, theirs: Tensor, ours: Tensor, apart: Tensor, tolerance: float
) -> str:
    """Where ``theirs`` and ``ours`` are farthest apart, as a refusal says it."""
    index = tuple(int(i) for i in torch.unravel_index(apart.argmax(), apart.shape))
    return (
        f"posenc cannot patch {name}: its {part} at position {index[-2]}, column "
        f"{index[-1]} is {float(theirs[index]):.7g}, posenc's {float(ours[index]):.7g} "
        f"({float(apart.max()):.2g} apart; float32's rounding allows {tolerance:.2g} at "
        f"positions 0..{PROBE_LENGTH - 1})"
    )
