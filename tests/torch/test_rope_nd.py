"""PyTorch xPos and axial RoPE: equal to the NumPy core, relative, decodable, exportable."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from posenc.core.rope import apply_rope  # noqa: E402
from posenc.core.rope_nd import (  # noqa: E402
    apply_xpos,
    axial_rope_tables,
    grid_coordinates,
    xpos_scales,
)
from posenc.torch.rope import RotaryEmbedding  # noqa: E402
from posenc.torch.rope_nd import AxialRotaryEmbedding, XPosRotaryEmbedding  # noqa: E402


def _randn(*shape, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


def _scores(q, k):
    return q @ k.transpose(-1, -2)


# ---------------------------------------------------------------------------------------
# xPos


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("centre", [0.0, 37.5])
def test_xpos_equals_the_core_apply_xpos(layout, centre):
    module = XPosRotaryEmbedding(16, centre=centre, layout=layout, max_length=64).double()
    q, k = _randn(2, 3, 20, 16, dtype=torch.float64, seed=1), _randn(2, 3, 20, 16, seed=2)
    k = k.double()
    qx, kx = module(q, k, offset=5)
    positions = np.arange(5, 25)
    eq, ek = apply_xpos(
        q.numpy(), k.numpy(), q_positions=positions, k_positions=positions, centre=centre,
        layout=layout,
    )  # fmt: skip
    np.testing.assert_allclose(qx.numpy(), eq, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kx.numpy(), ek, rtol=1e-12, atol=1e-12)


def test_xpos_float32_tables_are_the_core_tables():
    module = XPosRotaryEmbedding(8, centre=10.0, max_length=32)
    expected = xpos_scales(32, 8, centre=10.0, role="key", dtype="float32")
    assert module.k_scale.dtype == torch.float32
    assert np.array_equal(module.k_scale.numpy(), expected)
    assert np.array_equal(module.q_scale.numpy(), xpos_scales(32, 8, centre=10.0))


@pytest.mark.parametrize("qk_layout", ["bhsd", "bshd"])
def test_xpos_decoding_one_token_at_a_time_equals_the_full_call(qk_layout):
    module = XPosRotaryEmbedding(16, centre=8.0, max_length=8, qk_layout=qk_layout)
    shape = (2, 3, 12, 16) if qk_layout == "bhsd" else (2, 12, 3, 16)
    q, k = _randn(*shape, seed=1), _randn(*shape, seed=2)
    qx, kx = module(q, k)  # grows the tables past max_length
    axis = 2 if qk_layout == "bhsd" else 1
    for t in range(12):
        qt, kt = module(q.narrow(axis, t, 1), k.narrow(axis, t, 1), offset=t)
        assert torch.equal(qt, qx.narrow(axis, t, 1))
        assert torch.equal(kt, kx.narrow(axis, t, 1))
    # cached decoding: the last query against all cached keys gives the full call's row
    if qk_layout == "bshd":
        qt, qx, kx = qt.transpose(1, 2), qx.transpose(1, 2), kx.transpose(1, 2)
    torch.testing.assert_close(_scores(qt, kx), _scores(qx, kx)[:, :, 11:], rtol=1e-6, atol=1e-6)


def test_xpos_scores_depend_only_on_the_offset_and_decay():
    module = XPosRotaryEmbedding(8, centre=3.0, max_length=64).double()
    q = _randn(1, 1, 1, 8, dtype=torch.float64, seed=1).expand(1, 1, 40, 8)
    k = _randn(1, 1, 1, 8, dtype=torch.float64, seed=2).expand(1, 1, 40, 8)
    s = _scores(*module(q, k))[0, 0]  # s[n, m]: query n, key m
    for delta in range(-39, 40):
        diagonal = torch.diagonal(s, offset=-delta)  # n - m = delta
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=1e-12, atol=0)
    # the scale part of query n times key m is ζ_i^((n-m)/B), a decay for n > m
    module = XPosRotaryEmbedding(8, centre=20.0, max_length=40).double()
    zeta = (2 * np.arange(4) / 8 + 0.4) / 1.4
    n = np.arange(40)
    decay = zeta ** ((n[:, None, None] - n[None, :, None]) / 512)  # (n, m, pair)
    product = (module.q_scale[:, None, ::2] * module.k_scale[None, :, ::2]).numpy()
    np.testing.assert_allclose(product, decay, rtol=1e-14)
    assert np.all(decay[n[:, None] > n[None, :]] < 1)


def test_xpos_packed_positions_and_compile_fullgraph():
    module = XPosRotaryEmbedding(16, centre=16.0, max_length=64)
    q, k = _randn(2, 4, 16, 16, seed=1), _randn(2, 2, 16, 16, seed=2)
    positions = torch.tensor([[0, 1, 2, 3] * 4, list(range(16))])
    full = module(q, k)
    packed = module(q, k, positions=positions)
    assert torch.equal(packed[0][1], full[0][1])
    alone = module(q[:, :, 4:8], k[:, :, 4:8])  # positions 0 .. 3
    assert torch.equal(packed[1][0, :, 4:8], alone[1][0])
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    for kwargs in ({}, {"offset": 7}, {"positions": positions}):
        for mine, theirs in zip(compiled(q, k, **kwargs), module(q, k, **kwargs), strict=True):
            assert torch.equal(mine, theirs)
    low = compiled(q.half(), k.half())
    assert low[0].dtype == torch.float16
    assert torch.equal(low[0], module(q.half(), k.half())[0])
    with pytest.raises(Exception, match=r"call \.extend\(80\) before compiling"):
        compiled(q, k, offset=64)


def test_xpos_half_and_bfloat16_keep_float32_tables_and_compute_in_float32():
    module = XPosRotaryEmbedding(8, max_length=16)
    reference = XPosRotaryEmbedding(8, max_length=16)
    module.bfloat16()
    assert module.q_scale.dtype == torch.float32
    assert torch.equal(module.q_scale, reference.q_scale)
    q, k = _randn(1, 1, 16, 8, seed=1), _randn(1, 1, 16, 8, seed=2)
    qb, kb = module(q.bfloat16(), k.bfloat16())
    expected = reference(q.bfloat16().float(), k.bfloat16().float())
    assert torch.equal(qb, expected[0].bfloat16())
    assert torch.equal(kb, expected[1].bfloat16())


def test_xpos_torch_export_with_a_dynamic_sequence_length():
    module = XPosRotaryEmbedding(16, centre=32.0, max_length=64).eval()
    q, k = _randn(2, 4, 10, 16, seed=1), _randn(2, 2, 10, 16, seed=2)
    seq = torch.export.Dim("seq", max=64)
    program = torch.export.export(module, (q, k), dynamic_shapes=({2: seq}, {2: seq}))
    q2, k2 = _randn(2, 4, 37, 16, seed=3), _randn(2, 2, 37, 16, seed=4)
    for mine, theirs in zip(program.module()(q2, k2), module(q2, k2), strict=True):
        assert torch.equal(mine, theirs)


@pytest.mark.filterwarnings("ignore:# The axis name.*shares the same shape constraints")
def test_xpos_onnx_export_runs_in_onnxruntime(tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    module = XPosRotaryEmbedding(16, centre=32.0, max_length=64).eval()
    q, k = _randn(2, 4, 10, 16, seed=1), _randn(2, 2, 10, 16, seed=2)
    seq = torch.export.Dim("seq", max=64)
    program = torch.onnx.export(
        module, (q, k), dynamo=True, dynamic_shapes=({2: seq}, {2: seq}), verbose=False
    )
    path = tmp_path / "xpos.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    q2, k2 = _randn(2, 4, 25, 16, seed=3), _randn(2, 2, 25, 16, seed=4)
    names = [i.name for i in session.get_inputs()]
    outputs = session.run(None, dict(zip(names, (q2.numpy(), k2.numpy()), strict=True)))
    for mine, theirs in zip(outputs, module(q2, k2), strict=True):
        np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-6, atol=1e-6)


def test_xpos_state_dict_is_empty_and_torchscale_keys_load():
    module = XPosRotaryEmbedding(8, max_length=8)
    assert module.state_dict() == {}
    with pytest.warns(UserWarning, match="the module keeps its own"):
        module.load_state_dict({"scale": torch.ones(4), "inv_freq": torch.ones(4)}, strict=True)


# ---------------------------------------------------------------------------------------
# Axial / M-RoPE


def _core_axial(x, coords, module):
    spec = module.spec
    cos, sin = axial_rope_tables(
        coords,
        spec.head_dim,
        spec.base,
        sections=spec.sections,
        mode=spec.mode,
        layout=spec.layout,
        dtype="float64",
    )
    if cos.ndim == 3:
        cos, sin = cos[:, None], sin[:, None]
    return apply_rope(x.numpy(), cos, sin, layout=spec.layout)


@pytest.mark.parametrize(
    ("mode", "layout", "n_axes", "sections"),
    [
        ("axial", "half", 2, None),
        ("axial", "interleaved", 2, [3, 5]),
        ("mrope", "half", 3, [2, 3, 3]),
        ("mrope", "interleaved", 2, None),
    ],
)
def test_axial_equals_the_core(mode, layout, n_axes, sections):
    module = AxialRotaryEmbedding(
        16, n_axes=n_axes, sections=sections, mode=mode, layout=layout, base=100.0
    )
    rng = np.random.default_rng(0)
    coords = rng.integers(-50, 1000, size=(2, 12, n_axes))
    q = _randn(2, 4, 12, 16, dtype=torch.float64, seed=1)
    k = _randn(2, 2, 12, 16, dtype=torch.float64, seed=2)
    qr, kr = module(q, k, coords=torch.from_numpy(coords))  # float64 in: float64 tables
    np.testing.assert_allclose(qr.numpy(), _core_axial(q, coords, module), rtol=0, atol=1e-12)
    np.testing.assert_allclose(kr.numpy(), _core_axial(k, coords, module), rtol=0, atol=1e-12)
    cos, sin = module.tables(torch.from_numpy(coords[0]))  # float32: the core's rounding
    expected = axial_rope_tables(coords[0], 16, 100.0, sections=sections, mode=mode, layout=layout)
    assert np.array_equal(cos.numpy(), expected[0])
    assert np.array_equal(sin.numpy(), expected[1])


def test_axial_scores_are_invariant_under_2d_translation():
    module = AxialRotaryEmbedding(32, n_axes=2, base=100.0)
    coords = torch.from_numpy(grid_coordinates((4, 5)).reshape(-1, 2))
    q = _randn(1, 2, 20, 32, dtype=torch.float64, seed=1)
    k = _randn(1, 2, 20, 32, dtype=torch.float64, seed=2)
    scores = _scores(*module(q, k, coords=coords))
    for shift in ([3, 0], [0, 7], [-11, 250]):
        moved = _scores(*module(q, k, coords=coords + torch.tensor(shift)))
        torch.testing.assert_close(moved, scores, rtol=0, atol=1e-11)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_one_axis_is_plain_rotary_embedding(layout):
    axial = AxialRotaryEmbedding(16, n_axes=1, layout=layout, qk_layout="bshd")
    plain = RotaryEmbedding(16, layout=layout, qk_layout="bshd", max_length=64)
    q, k = _randn(2, 30, 4, 16, seed=1), _randn(2, 30, 2, 16, seed=2)
    positions = torch.arange(30)
    for mine, theirs in zip(
        axial(q, k, coords=positions[:, None]), plain(q, k, positions=positions), strict=True
    ):
        assert torch.equal(mine, theirs)


def test_axial_compile_fullgraph_with_precomputed_tables_and_graph_break_with_coords():
    module = AxialRotaryEmbedding(16, n_axes=2, qk_layout="bshd")
    coords = torch.from_numpy(grid_coordinates((3, 4)).reshape(1, 12, 2))
    q, k = _randn(2, 12, 4, 16, seed=1), _randn(2, 12, 2, 16, seed=2)
    expected = module(q, k, coords=coords)
    cos, sin = module.tables(coords)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    for mine, theirs in zip(compiled(q, k, cos=cos, sin=sin), expected, strict=True):
        assert torch.equal(mine, theirs)
    low = compiled(q.half(), k.half(), cos=cos, sin=sin)
    assert low[0].dtype == torch.float16
    assert torch.equal(low[0], module(q.half(), k.half(), coords=coords)[0])
    broken = torch.compile(module, backend="eager")  # coords: a graph break, still right
    for mine, theirs in zip(broken(q, k, coords=coords), expected, strict=True):
        assert torch.equal(mine, theirs)


# ---------------------------------------------------------------------------------------
# Bad input


_Q = torch.zeros(1, 2, 6, 8)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: XPosRotaryEmbedding(7), ValueError, "head_dim must be even"),
        (lambda: XPosRotaryEmbedding(8, centre="torchscale"), TypeError, "fixed number"),
        (lambda: XPosRotaryEmbedding(8, gamma=0.0), ValueError, "gamma"),
        (lambda: XPosRotaryEmbedding(8, qk_layout="bsd"), ValueError, "qk_layout"),
        (lambda: XPosRotaryEmbedding(8)(_Q, _Q[..., :4]), ValueError, "head_dim=8"),
        (lambda: XPosRotaryEmbedding(8)(_Q, _Q, offset=-1), ValueError, "offset"),
        (lambda: XPosRotaryEmbedding(8)(_Q.long(), _Q), TypeError, "floating-point"),
        (
            lambda: XPosRotaryEmbedding(8)(_Q, _Q, positions=torch.arange(5)),
            ValueError,
            "seq=6",
        ),
        (
            lambda: XPosRotaryEmbedding(8)(_Q, _Q, positions=torch.arange(6.0)),
            TypeError,
            "integer tensor",
        ),
        (lambda: AxialRotaryEmbedding(12, n_axes=4), ValueError, "equally over n_axes=4 axes"),
        (lambda: AxialRotaryEmbedding(8, sections=[1, 2]), ValueError, "add up"),
        (lambda: AxialRotaryEmbedding(8, mode="rope"), ValueError, "mode"),
        (lambda: AxialRotaryEmbedding(8)(_Q, _Q), TypeError, "pass coords="),
        (
            lambda: AxialRotaryEmbedding(8)(_Q, _Q, coords=torch.zeros(6, 2)),
            TypeError,
            "integer tensor",
        ),
        (
            lambda: AxialRotaryEmbedding(8)(_Q, _Q, coords=torch.zeros(6, 3, dtype=torch.long)),
            ValueError,
            "n_axes=2",
        ),
        (
            lambda: AxialRotaryEmbedding(8)(_Q, _Q, coords=torch.zeros(6, dtype=torch.long)),
            ValueError,
            r"\(seq, n_axes\)",
        ),
        (
            lambda: AxialRotaryEmbedding(8)(_Q, _Q, coords=torch.zeros(5, 2, dtype=torch.long)),
            ValueError,
            "seq=6",
        ),
        (
            lambda: AxialRotaryEmbedding(8)(_Q, _Q, cos=torch.zeros(6, 8)),
            TypeError,
            "both cos= and",
        ),
        (
            lambda: AxialRotaryEmbedding(8)(_Q, _Q, cos=torch.zeros(6, 4), sin=torch.zeros(6, 4)),
            ValueError,
            "head_dim=8",
        ),
        (
            lambda: AxialRotaryEmbedding(8)(
                _Q, _Q, coords=torch.zeros(6, 2, dtype=torch.long), cos=torch.zeros(6, 8)
            ),
            TypeError,
            "not both",
        ),
        (
            lambda: AxialRotaryEmbedding(8).tables(
                torch.zeros(6, 2, dtype=torch.long), dtype=torch.float16
            ),
            TypeError,
            "float32 or torch.float64",
        ),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_axial_sections_are_validated_by_the_core():
    with pytest.raises(TypeError, match="section must be an int >= 1, got True"):
        AxialRotaryEmbedding(32, sections=[True, 7])
