"""Every PyTorch module made from a spec keeps its options in ``spec`` only: no field is
copied onto the module, the attribute a role asks for (``num_heads``, ``head_dim``) is a
read-only property over the spec, and ``extra_repr`` still shows every option."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from posenc.torch import (  # noqa: E402
    ALiBiBias,
    AxialRotaryEmbedding,
    ContextualPositionEncoding,
    FIREBias,
    KERPLEBias,
    LearnedPositionalEmbedding,
    LearnedRotaryEmbedding,
    NoPositionalEncoding,
    RotaryEmbedding,
    SandwichBias,
    SinusoidalPositionalEncoding,
    SinusoidalPositionalEncodingND,
    T5RelativeBias,
    XPosRotaryEmbedding,
)
from posenc.torch.protocols import (  # noqa: E402
    ContextualScoreBias,
    InputEncoding,
    QueryKeyRotation,
    ScoreBias,
)

# (build with options off their defaults, the role's attribute, extra_repr as on main)
MODULES = {
    "alibi": (
        lambda: ALiBiBias(8, mode="symmetric"),
        "num_heads",
        "num_heads=8, mode='symmetric'",
    ),
    "t5": (
        lambda: T5RelativeBias(
            8, bidirectional=False, num_buckets=16, max_distance=64, compat="exact"
        ),
        "num_heads",
        "num_heads=8, bidirectional=False, num_buckets=16, max_distance=64",
    ),
    "kerple": (
        lambda: KERPLEBias(8, kernel="power", eps=0.02),
        "num_heads",
        "num_heads=8, kernel='power', eps=0.02",
    ),
    "fire": (
        lambda: FIREBias(8, mlp_width=16, init_c=0.2, init_L=64.0, eps=1e-5),
        "num_heads",
        "num_heads=8, mlp_width=16",
    ),
    "sandwich": (
        lambda: SandwichBias(8, dim=64, base=100.0, mode="symmetric", max_length=16),
        "num_heads",
        "num_heads=8, dim=64, mode='symmetric'",
    ),
    "cope": (
        lambda: ContextualPositionEncoding(64, max_positions=33),
        "head_dim",
        "head_dim=64, max_positions=33",
    ),
    "rope": (
        lambda: RotaryEmbedding(64, base=500.0, rotary_dim=32, max_length=16),
        "head_dim",
        "head_dim=64, rotary_dim=32, base=500, layout='half', qk_layout='bhsd', max_length=16",
    ),
    "xpos": (
        lambda: XPosRotaryEmbedding(
            64,
            base=100.0,
            gamma=0.5,
            scale_base=256,
            centre=8.0,
            layout="half",
            max_length=16,
            qk_layout="bshd",
        ),
        "head_dim",
        "head_dim=64, base=100, gamma=0.5, scale_base=256, centre=8, layout='half', "
        "qk_layout='bshd', max_length=16",
    ),
    "axial": (
        lambda: AxialRotaryEmbedding(
            64, n_axes=3, base=1e6, sections=[8, 12, 12], mode="mrope", qk_layout="bshd"
        ),
        "head_dim",
        "head_dim=64, n_axes=3, base=1e+06, sections=(8, 12, 12), mode='mrope', layout='half', "
        "qk_layout='bshd'",
    ),
    "rope_learned": (
        lambda: LearnedRotaryEmbedding(
            64,
            base=500.0,
            rotary_dim=32,
            layout="interleaved",
            scaling="linear",
            scaling_params={"factor": 2.0},
            qk_layout="bshd",
        ),
        "head_dim",
        "head_dim=64, rotary_dim=32, layout='interleaved', qk_layout='bshd', scaling='linear'",
    ),
    "sinusoidal": (
        lambda: SinusoidalPositionalEncoding(
            16, 0.0, 32, 100.0, layout="split", formula="tensor2tensor"
        ),
        None,
        "d_model=16, max_length=32, base=100, layout='split', formula='tensor2tensor'",
    ),
    "learned": (
        lambda: LearnedPositionalEmbedding(32, 16, init_std=0.5, batch_first=False),
        None,
        "max_length=32, d_model=16, batch_first=False",
    ),
    "nope": (lambda: NoPositionalEncoding(16), None, "d_model=16"),
    "nd": (
        lambda: SinusoidalPositionalEncodingND(8, layout="mae", base=100.0, ndim=2),
        None,
        "channels=8, layout='mae', base=100, ndim=2",
    ),
}

ROLES = {"num_heads": ScoreBias, "head_dim": (QueryKeyRotation, ContextualScoreBias)}


@pytest.mark.parametrize("kind", sorted(MODULES))
def test_the_module_reads_its_options_from_its_spec(kind):
    make, role, shown = MODULES[kind]
    module = make()
    fields = module.spec.fields()
    for name, value in fields.items():
        # the role's attribute, and the n_axes MultiHeadAttention reads: read only, the spec's
        if name == role or (kind, name) == ("axial", "n_axes"):
            assert getattr(module, name) == value
            with pytest.raises(AttributeError):
                setattr(module, name, value)
        elif name not in dict(module.named_buffers()):  # (FIRE's init_L: the paper's buffer)
            assert not hasattr(module, name), f"{kind}: {name} is copied from the spec"
    if role is not None:
        assert isinstance(module, ROLES[role])
    else:
        assert isinstance(module, InputEncoding) or kind == "nd"
    assert module.extra_repr() == shown
    assert type(module).from_spec(module.spec).spec == module.spec
