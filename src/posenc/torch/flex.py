"""FlexAttention, compiled once: attention whose bias and mask never form a ``T × S`` matrix.

:func:`flex_attention` runs :func:`torch.nn.attention.flex_attention.flex_attention`
through one ``torch.compile`` with dynamic shapes, so a new sequence length reuses the
compiled kernel: the first call compiles (10 to 20 s on this project's 2-core CPU),
later calls of any length do not. A new ``score_mod`` or ``mask_mod`` program (another
kind of bias, another mask) compiles once more, as does a one-query call (decoding),
which PyTorch specialises.

Four faults of PyTorch 2.13 on the CPU, said here so that no call meets them unawares:

* its kernel computes ``q·kᵀ`` wrong for head dims 8 and 16 at some key lengths
  (8, 24, 40, .., 120 under 128-key tiles; on an AVX2 CPU, for float32, bfloat16 and
  float16 alike, whatever the queries, mask or ``score_mod``): for a head dim under 24
  that is a multiple of the vector width, its micro-kernel stores whole 16-key tiles
  and writes scores past a short key block, onto its running maximum and sum (wrong
  outputs, or NaN). :func:`flex_attention` pads a head dim under
  :data:`SAFE_HEAD_DIM` with zeros, which leaves ``q·k`` as it is, keeps the head
  dim's own scale, and slices the output back; ``tests/torch/test_flex_cpu.py`` sweeps
  both the fault's domain and the routed answers against SDPA, so a PyTorch release
  that moves the fault fails there;
* the CPU kernel runs forward only: a call whose inputs need gradients raises a
  ``RuntimeError`` naming the ways out (``torch.no_grad()``, a GPU, or SDPA); and it
  takes float32, bfloat16 and float16 only (float64 fails inside its lowering): a
  ``TypeError`` says so;
* its code generator fails on a program that reads a tensor of symbolic length or an
  integer that became a symbol (the C++ it writes names an undeclared variable):
  posenc's programs read 0-d tensors and tensors padded to one of a few static lengths
  (:func:`posenc.torch._flex_inputs.static_length`); FIRE's MLP, which fails even so,
  and a dense mask read whole mark themselves ``static_shapes`` and compile once per
  shape on the CPU;
* with no block mask, PyTorch's default is one tile of every query and key, which the
  CPU kernel holds whole (``T × S`` scores per thread, by its source: the memory
  FlexAttention is used to save) and where the first fault strikes at every key length
  ``≡ 8 (mod 16)``: :func:`flex_attention` passes 128-key tiles, those of posenc's masks.

Example:
    >>> import torch
    >>> from posenc.torch import ALiBiBias
    >>> from posenc.torch.masks import block_mask, causal
    >>> q = k = v = torch.randn(1, 2, 16, 8)
    >>> with torch.no_grad():
    ...     out = flex_attention(q, k, v, score_mod=ALiBiBias(2).score_mod(16),
    ...                          block_mask=block_mask(causal(), 16))
    >>> out.shape
    torch.Size([1, 2, 16, 8])
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import Tensor, nn

from .._checks import describe
from .masks import all_keys
from .masks import block_mask as make_block_mask

__all__ = ["CPU_DTYPES", "SAFE_HEAD_DIM", "flex_attention", "needs_gradients"]

#: The dtypes PyTorch 2.13's CPU kernel takes (float64 fails inside its lowering).
CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: The least head dimension that PyTorch 2.13's CPU kernel computes ``q·kᵀ`` right for at
#: every key length; :func:`flex_attention` pads smaller ones to it (see the module's notes).
SAFE_HEAD_DIM = 24


def needs_gradients(*tensors: Any) -> bool:
    """Whether autograd would record a call on ``tensors`` (or on parameters they hold)."""
    return torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad for t in tensors
    )


#: Programs one compiled function may hold before dynamo stops compiling it (PyTorch's
#: default, 8, would be spent by a few schemes and masks; past it FlexAttention runs
#: unfused and forms the whole scores).
PROGRAMS = 64


def all_keys_mask(queries: int, keys: int, *, device: Any) -> Any:
    """The block mask of attention without a mask (see :func:`flex_attention`)."""
    return make_block_mask(all_keys(), queries, keys, device=device)


def _dynamic_shapes(*args: Any, **kwargs: Any) -> Tensor:
    """FlexAttention, compiled with symbolic lengths (its own code, its own programs)."""
    from torch.nn.attention.flex_attention import flex_attention as flex

    out: Tensor = flex(*args, **kwargs)
    return out


def _static_shapes(*args: Any, **kwargs: Any) -> Tensor:
    """FlexAttention, compiled for the shapes of each call."""
    from torch.nn.attention.flex_attention import flex_attention as flex

    out: Tensor = flex(*args, **kwargs)
    return out


def _padded(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``query``, ``key`` and ``value`` with zeros appended to a head dimension under
    :data:`SAFE_HEAD_DIM` (all three: one program serves every small head dimension)."""
    pad = [
        nn.functional.pad(t, (0, max(SAFE_HEAD_DIM - t.shape[-1], 0))) for t in (query, key, value)
    ]
    return pad[0], pad[1], pad[2]


@functools.cache
def _compiled(static: bool) -> Any:
    return torch.compile(_static_shapes if static else _dynamic_shapes, dynamic=not static)


def flex_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    score_mod: Any = None,
    block_mask: Any = None,
    scale: float | None = None,
    static: bool = False,
    parameters: tuple[Tensor, ...] = (),
) -> Tensor:
    """FlexAttention, compiled once for every length (see the module's notes).

    Args:
        query, key, value: ``(batch, heads, T, head_dim)``, ``(batch, heads, S,
            head_dim)`` twice, one floating dtype and device.
        score_mod: ``(score, b, h, q, k) -> score``, e.g. a bias module's
            ``score_mod(...)``; None: the scores as they are.
        block_mask: A ``BlockMask`` (:func:`posenc.torch.masks.block_mask`); None: every
            key visible, in 128-key tiles (:func:`posenc.torch.masks.all_keys`; PyTorch's
            own default is one tile of every key, see the module's notes).
        scale: Of ``q·kᵀ`` (default ``1/sqrt(head_dim)``, of the head dim given, also
            when the CPU route pads it).
        static: Compile for these shapes (as for a ``score_mod`` with a true
            ``static_shapes`` attribute on the CPU).
        parameters: Tensors the ``score_mod`` reads that may need gradients (a learned
            bias's), for the CPU's forward-only check.

    Returns:
        ``(batch, heads, T, head_dim)``.

    Example:
        >>> q = k = v = torch.randn(1, 2, 5, 4)
        >>> with torch.no_grad():
        ...     out = flex_attention(q, k, v)
        >>> torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, k, v),
        ...                atol=1e-6)
        True
    """
    _check(query, key, value, parameters)
    cpu = query.device.type == "cpu"
    if block_mask is None:  # PyTorch's default: one tile of every key (the module's notes)
        block_mask = all_keys_mask(query.shape[-2], key.shape[-2], device=query.device)
    static = static or (cpu and getattr(score_mod, "static_shapes", False))
    width = value.shape[-1]
    if cpu and query.shape[-1] < SAFE_HEAD_DIM:  # PyTorch's CPU fault, routed around
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
        query, key, value = _padded(query, key, value)  # (B, nh, T or S, SAFE_HEAD_DIM)
    arguments = {"score_mod": score_mod, "block_mask": block_mask, "scale": scale}
    out: Tensor
    if torch.compiler.is_compiling():  # inside a compiled region: traced with it
        out = _dynamic_shapes(query, key, value, **arguments)
    else:
        limit = max(torch._dynamo.config.recompile_limit, PROGRAMS)
        with torch._dynamo.config.patch(recompile_limit=limit):
            out = _compiled(static)(query, key, value, **arguments)
    return out if out.shape[-1] == width else out[..., :width].contiguous()  # (B, nh, T, hs)


def _check(query: Any, key: Any, value: Any, parameters: tuple[Tensor, ...]) -> None:
    """Refuse by name what FlexAttention cannot run (rather than fail deep inside it)."""
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, Tensor) or tensor.dim() != 4:
            raise ValueError(
                f"flex_attention: {name} must be a (batch, heads, length, head_dim) tensor, "
                f"got {describe(tensor)}"
            )
    if query.device.type != "cpu":
        return
    if query.dtype not in CPU_DTYPES:
        raise TypeError(
            f"flex_attention: the CPU kernel of PyTorch 2.13 takes float32, bfloat16 or "
            f"float16, got {query.dtype}: cast the inputs, or use attn_implementation="
            "'sdpa' (or 'eager')"
        )
    if needs_gradients(query, key, value, *parameters):
        raise RuntimeError(
            "FlexAttention runs forward only on the CPU in PyTorch 2.13 (its backward "
            "raises NotImplementedError), and this call needs gradients: run it under "
            "torch.no_grad() (evaluation), on a GPU, or with attn_implementation='sdpa' "
            "(or 'eager') to train"
        )
