"""torch.export and ONNX export of the PyTorch modules, checked by running the results."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from posenc.torch import (  # noqa: E402
    ALiBiBias,
    AxialRotaryEmbedding,
    ContextualPositionEncoding,
    FIREBias,
    InputEmbedding,
    KERPLEBias,
    LearnedPositionalEmbedding,
    LearnedRotaryEmbedding,
    MultiHeadAttention,
    NoPositionalEncoding,
    RotaryEmbedding,
    SandwichBias,
    SinusoidalPositionalEncoding,
    SinusoidalPositionalEncodingND,
    T5RelativeBias,
    XPosRotaryEmbedding,
)


def _modules():
    torch.manual_seed(0)
    return {
        "sinusoidal": (SinusoidalPositionalEncoding(16, 0.0, 64).eval(), torch.randn(2, 10, 16)),
        "learned": (LearnedPositionalEmbedding(64, 16).eval(), torch.randn(2, 10, 16)),
        "input": (InputEmbedding(30, 16, dropout=0.0, max_length=64).eval(),
                  torch.randint(0, 30, (2, 10))),
        "nope": (NoPositionalEncoding(16).eval(), torch.randn(2, 10, 16)),
        "attention-rope": (MultiHeadAttention(16, 2, position=RotaryEmbedding(8, max_length=64)).eval(),
                           torch.randn(2, 10, 16)),
        "attention-alibi": (MultiHeadAttention(16, 2, position=ALiBiBias(2)).eval(),
                            torch.randn(2, 10, 16)),
        "attention-t5": (MultiHeadAttention(16, 2, position=T5RelativeBias(2, bidirectional=False)).eval(),
                         torch.randn(2, 10, 16)),
        **{
            f"attention-{name}": (MultiHeadAttention(16, 2, position=position).eval(),
                                  torch.randn(2, 10, 16))
            for name, position in (
                ("kerple", KERPLEBias(2)),
                ("fire", FIREBias(2)),
                ("sandwich", SandwichBias(2, dim=16)),
                ("cope", ContextualPositionEncoding(8, max_positions=65)),
                ("rope_learned", LearnedRotaryEmbedding(8)),
            )
        },
    }  # fmt: skip


NAMES = ["sinusoidal", "learned", "input", "nope", "attention-rope", "attention-alibi",
         "attention-t5", "attention-kerple", "attention-fire", "attention-sandwich",
         "attention-cope", "attention-rope_learned"]  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_torch_export_with_a_dynamic_sequence_length(name):
    module, example = _modules()[name]
    seq = torch.export.Dim("seq", max=64)
    program = torch.export.export(module, (example,), dynamic_shapes=({1: seq},))
    longer = torch.randint(0, 30, (2, 37)) if name == "input" else torch.randn(2, 37, 16)
    assert torch.equal(program.module()(longer), module(longer))


# CoPE exports with torch.export (above), but PyTorch 2.13's ONNX decomposition of
# scaled_dot_product_attention with a mask computed from q and k gives its output
# strides that the following reshape cannot view: docs/getting-started/torch.md lists the exception.
@pytest.mark.parametrize("name", [name for name in NAMES if name != "attention-cope"])
def test_onnx_export_runs_in_onnxruntime(name, tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    module, example = _modules()[name]
    seq = torch.export.Dim("seq", max=64)
    program = torch.onnx.export(
        module, (example,), dynamo=True, dynamic_shapes=({1: seq},), verbose=False
    )
    path = tmp_path / f"{name}.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    longer = torch.randint(0, 30, (2, 25)) if name == "input" else torch.randn(2, 25, 16)
    (out,) = session.run(None, {session.get_inputs()[0].name: longer.numpy()})
    np.testing.assert_allclose(out, module(longer).detach().numpy(), rtol=0, atol=1e-6)


class _AxialWithTables(torch.nn.Module):
    """Axial RoPE as exported code uses it: tables computed ahead, passed in."""

    def __init__(self) -> None:
        super().__init__()
        self.rope = AxialRotaryEmbedding(8)

    def forward(self, q, k, cos, sin):
        return self.rope(q, k, cos=cos, sin=sin)


def test_nd_and_axial_modules_export_and_run_in_onnxruntime(tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    from posenc.core.rope_nd import grid_coordinates

    nd = SinusoidalPositionalEncodingND(16).eval()
    image = torch.randn(2, 4, 5, 16)
    nd(image)  # builds (and caches) the table for this grid
    assert torch.equal(torch.export.export(nd, (image,)).module()(image), nd(image))

    axial = _AxialWithTables().eval()
    coords = torch.from_numpy(grid_coordinates((4, 5)).reshape(20, 2))
    cos, sin = axial.rope.tables(coords)
    args = (torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8), cos, sin)
    exported = torch.export.export(axial, args).module()(*args)
    for got, want in zip(exported, axial(*args), strict=True):
        assert torch.equal(got, want)

    for name, module, inputs in (("nd", nd, (image,)), ("axial", axial, args)):
        path = tmp_path / f"{name}.onnx"
        torch.onnx.export(module, inputs, dynamo=True, verbose=False).save(str(path))
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)}
        outputs = session.run(None, feeds)
        expected = module(*inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for got, want in zip(outputs, expected, strict=True):
            np.testing.assert_allclose(got, want.detach().numpy(), rtol=0, atol=1e-6)


# -- length-dependent scalings: one graph for every length, on both sides of the switch ------

SCALED = {
    "dynamic_ntk": {"factor": 4.0, "original_max_position_embeddings": 16},
    "longrope": {
        "short_factor": [1.0, 1.5, 2.0, 2.5],
        "long_factor": [1.0, 4.0, 16.0, 64.0],
        "original_max_position_embeddings": 16,
        "short_mscale": 1.0,
        "long_mscale": 1.2,
    },
}
LENGTHS = (9, 16, 17, 40)  # below, at and past the original length 16


def _scaled(name):
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, scaling=name, scaling_params=SCALED[name], max_length=64)
    rope.extend(64)  # dynamic NTK: the frequencies of every length compiled code may see
    return MultiHeadAttention(16, 2, position=rope).eval()


@pytest.mark.parametrize("name", SCALED)
def test_length_dependent_scalings_compile_with_fullgraph(name):
    torch._dynamo.reset()  # each module and call recompiles forward: keep under the limit
    module = _scaled(name)
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    for length in LENGTHS:
        x = torch.randn(2, length, 16)
        with torch.no_grad():
            assert torch.equal(compiled(x), module(x))
    rope = module.position
    positions = torch.compile(lambda q, k, p: rope(q, k, positions=p), fullgraph=True)
    q, k = torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8)
    for end in (12, 17, 40):  # the length of a call with positions: the largest + 1
        at = torch.arange(end - 12, end)
        got, want = (
            positions(q[:, :, :12], k[:, :, :12], at),
            rope(q[:, :, :12], k[:, :, :12], positions=at),
        )
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("name", SCALED)
def test_length_dependent_scalings_export_with_a_dynamic_length(name):
    module = _scaled(name)
    seq = torch.export.Dim("seq", max=64)
    program = torch.export.export(module, (torch.randn(2, 10, 16),), dynamic_shapes=({1: seq},))
    for length in LENGTHS:
        x = torch.randn(2, length, 16)
        with torch.no_grad():
            assert torch.equal(program.module()(x), module(x))


@pytest.mark.slow
@pytest.mark.parametrize("name", SCALED)
def test_length_dependent_scalings_run_in_onnxruntime(name, tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    module = _scaled(name)
    seq = torch.export.Dim("seq", max=64)
    program = torch.onnx.export(
        module, (torch.randn(2, 10, 16),), dynamo=True, dynamic_shapes=({1: seq},), verbose=False
    )
    path = tmp_path / f"{name}.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for length in LENGTHS:
        x = torch.randn(2, length, 16)
        (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        with torch.no_grad():
            np.testing.assert_allclose(out, module(x).numpy(), rtol=0, atol=1e-6)


def test_the_frequencies_per_length_are_built_by_extend_once_per_spec():
    params = {"factor": 2.0, "original_max_position_embeddings": 8}
    make = lambda: RotaryEmbedding(8, base=77.0, scaling="dynamic_ntk",  # noqa: E731
                                   scaling_params=params, max_length=16)  # fmt: skip
    a, b = make(), make()
    q = torch.randn(1, 2, 40, 8)
    a(q, q)  # an eager call past the tables grows them, and builds no frequencies
    assert a._lengths is None
    a.extend(32)
    b.extend(32)
    assert a._lengths is b._lengths  # once per spec
    assert a._lengths.rows == 32
    a.extend(64)  # growth for one: the other's frequencies stay, and grow with it
    assert b._lengths.rows == 64
    example = torch.randn(1, 2, 10, 8)
    seq = torch.export.Dim("s", max=64)
    program = torch.export.export(b, (example, example), dynamic_shapes=({2: seq}, {2: seq}))
    for length in (9, 40, 64):
        x = torch.randn(1, 2, length, 8)
        assert torch.equal(program.module()(x, x)[0], b(x, x)[0])
    twin = copy.deepcopy(b)
    assert twin._lengths is None  # derived: not copied, found again by extend()


# -- one program for every length up to the table, at the shapes of real models --------------

LLAMA3 = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 512,
}
# (head_dim, query heads, key heads, max_length, scaling, qk_layout): Llama 3 8B's attention
# (128, 32 heads, 8 key heads), a llama3-scaled one in Meta's layout, a small one.
REAL_ROPES = {
    "llama3-8b": (128, 32, 8, 8192, None, "bhsd"),
    "llama3-scaled-bshd": (64, 8, 2, 4096, "llama3", "bshd"),
    "small": (16, 2, 2, 4096, None, "bhsd"),
}
# decoding steps and prefills: 1 and 2 tokens, odd lengths, either side of 512 (where
# q's elements pass the eager decoding path's bound at head_dim 16), the whole table
EXPORT_LENGTHS = (1, 2, 7, 33, 512, 513)


def _qk(head_dim, heads, kv_heads, length, qk_layout, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shape = (1, heads, length, head_dim) if qk_layout == "bhsd" else (1, length, heads, head_dim)
    q = torch.randn(shape, generator=generator)
    k_shape = list(shape)
    k_shape[1 if qk_layout == "bhsd" else 2] = kv_heads
    return q, torch.randn(k_shape, generator=generator)


@pytest.mark.parametrize("name", REAL_ROPES)
def test_one_exported_rope_serves_every_length_up_to_its_table(name):
    head_dim, heads, kv_heads, max_length, scaling, qk_layout = REAL_ROPES[name]
    params = LLAMA3 if scaling else None
    rope = RotaryEmbedding(
        head_dim, max_length=max_length, scaling=scaling, scaling_params=params,
        qk_layout=qk_layout,
    )  # fmt: skip
    if name == "small":  # grown before exporting, as the docs say to
        rope = RotaryEmbedding(head_dim, max_length=256, qk_layout=qk_layout)
        rope.extend(max_length)
    axis = 2 if qk_layout == "bhsd" else 1
    seq = torch.export.Dim("seq", max=max_length)
    q, k = _qk(head_dim, heads, kv_heads, 64, qk_layout)
    program = torch.export.export(rope, (q, k), dynamic_shapes=({axis: seq}, {axis: seq}))
    positions = torch.export.export(
        rope,
        (q, k),
        {"positions": torch.arange(64)},
        dynamic_shapes={"q": {axis: seq}, "k": {axis: seq}, "positions": {0: seq}},
    )
    for length in (*EXPORT_LENGTHS, max_length):
        q, k = _qk(head_dim, heads, kv_heads, length, qk_layout, seed=length)
        for got, want in zip(program.module()(q, k), rope(q, k), strict=True):
            assert torch.equal(got, want), length
        at = torch.arange(max_length - length, max_length)  # the last rows: a decode step
        for got, want in zip(
            positions.module()(q, k, positions=at), rope(q, k, positions=at), strict=True
        ):
            assert torch.equal(got, want), length


def test_one_compiled_rope_serves_every_length_up_to_its_table():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    head_dim, heads, kv_heads, max_length, _, qk_layout = REAL_ROPES["llama3-8b"]
    rope = RotaryEmbedding(head_dim, max_length=max_length, qk_layout=qk_layout)
    compiled = torch.compile(rope, dynamic=True)
    for length in (3, *EXPORT_LENGTHS, max_length):
        q, k = _qk(head_dim, heads, kv_heads, length, qk_layout, seed=length)
        for got, want in zip(compiled(q, k), rope(q, k), strict=True):
            assert torch.equal(got, want), length
    # one program for lengths 2 .. max_length, and PyTorch's own for length 1 (torch.compile
    # specialises sizes 0 and 1; an exported program serves 1 too, above)
    assert counters["stats"]["unique_graphs"] == 2


@pytest.mark.parametrize("position", ["rope", "xpos"])
def test_an_exported_attention_with_rotations_serves_every_length(position):
    torch.manual_seed(0)
    make = RotaryEmbedding if position == "rope" else XPosRotaryEmbedding
    module = MultiHeadAttention(512, 8, position=make(64, max_length=1024)).eval()
    seq = torch.export.Dim("seq", max=1024)
    program = torch.export.export(module, (torch.randn(1, 64, 512),), dynamic_shapes=({1: seq},))
    for length in (*EXPORT_LENGTHS, 1024):
        x = torch.randn(1, length, 512)
        with torch.no_grad():
            assert torch.equal(program.module()(x), module(x)), length
