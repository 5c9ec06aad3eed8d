"""N-D sinusoidal encodings: the positional_encodings package's and MAE's conventions.

References:
* ``positional_encodings`` (tatp22/multidim-positional-encoding, PyPI
  ``positional-encodings==6.0.3``), ``torch_encodings.PositionalEncoding1D/2D/3D``, run
  as published (float32) and with its frequencies recomputed in float64.
* MAE (facebookresearch/mae, ``util/pos_embed.py``): ``get_2d_sincos_pos_embed`` and
  ``get_1d_sincos_pos_embed_from_grid``, restated below from their published definition.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.core.nd import axis_channels, sinusoidal_nd
from posenc.core.sinusoidal import sinusoidal

# --------------------------------------------------------------------------------------
# MAE reference (facebookresearch/mae, util/pos_embed.py), restated in NumPy float64.
# MAE's own get_2d_sincos_pos_embed takes a square grid_size; the (H, W) form below is
# the same code with grid_h = arange(H), grid_w = arange(W) (the meshgrid then has shape
# (H, W)), as the non-square forks of it do.


def mae_1d(embed_dim, pos):
    """[sin(pos·ω) | cos(pos·ω)] with ω_i = 1 / 10000**(i / (embed_dim/2))."""
    assert embed_dim % 2 == 0
    omega = 1.0 / 10000 ** (np.arange(embed_dim // 2, dtype=np.float64) / (embed_dim / 2.0))
    angles = np.einsum("m,d->md", np.asarray(pos, np.float64).reshape(-1), omega)  # (M, D/2)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)  # (M, D)


def mae_2d(embed_dim, grid_size, cls_token=False):
    height, width = (grid_size, grid_size) if isinstance(grid_size, int) else grid_size
    grid_h = np.arange(height, dtype=np.float32)
    grid_w = np.arange(width, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0)  # w first: grid[0][i, j] = j
    assert embed_dim % 2 == 0
    emb_h = mae_1d(embed_dim // 2, grid[0])  # (H*W, D/2), MAE's name; encodes the column
    emb_w = mae_1d(embed_dim // 2, grid[1])  # (H*W, D/2), encodes the row
    pos_embed = np.concatenate([emb_h, emb_w], axis=1)  # (H*W, D)
    if cls_token:
        pos_embed = np.concatenate([np.zeros([1, embed_dim]), pos_embed], axis=0)
    return pos_embed


@pytest.mark.parametrize("embed_dim", [4, 8, 16, 64, 768])
@pytest.mark.parametrize("grid", [1, 2, 7, 14, (3, 5), (5, 3), (1, 9), (16, 4)])
@pytest.mark.parametrize("cls_token", [False, True])
def test_mae_2d_equals_reference(embed_dim, grid, cls_token):
    shape = (grid, grid) if isinstance(grid, int) else grid
    ours = sinusoidal_nd(
        shape, embed_dim, layout="mae", dtype="float64", flatten=True, cls_token=cls_token
    )
    ref = mae_2d(embed_dim, grid, cls_token=cls_token)
    assert ours.shape == ref.shape == (math.prod(shape) + cls_token, embed_dim)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)
    # Unflattened: the same rows in row-major order.
    grid_table = sinusoidal_nd(shape, embed_dim, layout="mae", dtype="float64")
    np.testing.assert_array_equal(grid_table.reshape(-1, embed_dim), ours[int(cls_token) :])


@pytest.mark.parametrize(("embed_dim", "length"), [(2, 5), (8, 50), (64, 197)])
def test_mae_1d_equals_reference(embed_dim, length):
    ours = sinusoidal_nd((length,), embed_dim, layout="mae", dtype="float64")
    np.testing.assert_allclose(ours, mae_1d(embed_dim, np.arange(length)), rtol=0, atol=1e-12)


def test_mae_worked_example():
    # 2x2 grid, 4 channels, ω = 1: token (row h, column w) -> [sin w, cos w, sin h, cos h].
    table = sinusoidal_nd((2, 2), 4, layout="mae", dtype="float64", flatten=True)
    s, c = math.sin(1), math.cos(1)
    expected = [[0, 1, 0, 1], [s, c, 0, 1], [0, 1, s, c], [s, c, s, c]]
    np.testing.assert_allclose(table, expected, rtol=0, atol=1e-16)


# --------------------------------------------------------------------------------------
# positional_encodings package.

CASES = [
    ((7,), 1), ((7,), 5), ((50,), 16), ((9,), 33),
    ((4, 5), 1), ((4, 5), 2), ((4, 5), 6), ((3, 8), 7), ((6, 6), 10), ((16, 9), 17),
    ((32, 20), 64), ((2, 40), 30),
    ((2, 3, 4), 1), ((2, 3, 4), 2), ((2, 3, 4), 5), ((3, 4, 5), 6), ((4, 5, 6), 11),
    ((5, 4, 3), 16), ((8, 6, 10), 48), ((3, 3, 3), 100),
]  # fmt: skip


def _package_module(n_axes, channels):
    enc = pytest.importorskip("positional_encodings.torch_encodings")
    cls = {
        1: enc.PositionalEncoding1D,
        2: enc.PositionalEncoding2D,
        3: enc.PositionalEncoding3D,
    }[n_axes]
    return cls(channels)


@pytest.mark.parametrize(("shape", "channels"), CASES)
def test_package_float32(shape, channels):
    torch = pytest.importorskip("torch")
    module = _package_module(len(shape), channels)
    ref = module(torch.zeros(2, *shape, channels))[0].numpy()  # (*shape, C), float32
    ours = sinusoidal_nd(shape, channels, dtype=np.float32)
    assert ours.shape == ref.shape == (*shape, channels)
    # The package forms the angle in float32: ω = 1/10000**(k/c) <= 1 (a pow and a
    # division, about an ulp) times the exact float32 position p, rounded (half an ulp),
    # so the angle is off by about p·ω·2·2**-24 <= p·2**-23; float32 sin/cos add up to an
    # ulp (2**-24 near 1) and our rounding half an ulp. Observed: at most ~0.3 of this.
    bound = (max(shape) - 1) * 2.0**-23 + 2.0**-23
    np.testing.assert_allclose(ours, ref, rtol=0, atol=bound)


@pytest.mark.parametrize(("shape", "channels"), CASES)
def test_package_maths_in_float64(shape, channels):
    torch = pytest.importorskip("torch")
    module = _package_module(len(shape), channels).double()
    # Their module follows the input's dtype once inv_freq is float64; recompute
    # inv_freq in float64 with their formula (it was rounded to float32 at __init__).
    width = module.channels
    module.inv_freq = 1.0 / (10000 ** (torch.arange(0, width, 2, dtype=torch.float64) / width))
    ref = module(torch.zeros(1, *shape, channels, dtype=torch.float64))[0].numpy()
    ours = sinusoidal_nd(shape, channels, dtype=np.float64)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)


def test_package_width_rule():
    # Per-axis width: the package's ceil(C/2)*2, ceil(C/4)*2, ceil(C/6)*2.
    for channels in range(1, 40):
        for n_axes in (1, 2, 3):
            blocks = axis_channels(channels, n_axes, "positional-encodings")
            module = _package_module(n_axes, channels)
            assert {width for _, _, width in blocks} == {module.channels}
            assert sum(kept for _, kept, _ in blocks) == channels


# --------------------------------------------------------------------------------------
# Property: each axis's block is a 1-D table.
#
# "positional-encodings", n axes, c = 2*ceil(C/2n): columns [a*c, min((a+1)*c, C)) of
# table[..., k_a, ...] equal sinusoidal(size_a, c, layout="interleaved")[k_a, :kept].
# "mae", 2-D (H, W), C: columns [0, C/2) equal sinusoidal(W, C/2, layout="split")[w],
# columns [C/2, C) equal sinusoidal(H, C/2, layout="split")[h].


def _check_axis_blocks(shape, channels, layout, dtype):
    table = sinusoidal_nd(shape, channels, layout=layout, dtype=dtype)
    block_layout = "split" if layout == "mae" else "interleaved"
    for axis, (first, kept, width) in enumerate(axis_channels(channels, len(shape), layout)):
        one_d = sinusoidal(shape[axis], width, layout=block_layout, dtype=dtype)[:, :kept]
        view = (1,) * axis + (shape[axis],) + (1,) * (len(shape) - 1 - axis) + (kept,)
        expected = np.broadcast_to(one_d.reshape(view), (*shape, kept))
        np.testing.assert_array_equal(table[..., first : first + kept], expected)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple),
    channels=st.integers(1, 40),
    dtype=st.sampled_from(["float64", "float32", "float16"]),
)
def test_axis_blocks_are_1d_tables(shape, channels, dtype):
    _check_axis_blocks(shape, channels, "positional-encodings", dtype)


@settings(max_examples=30, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 12), st.integers(1, 12)),
    quarter=st.integers(1, 20),
    dtype=st.sampled_from(["float64", "float32", "float16"]),
)
def test_mae_axis_blocks_are_1d_tables(shape, quarter, dtype):
    _check_axis_blocks(shape, 4 * quarter, "mae", dtype)
    if shape[0] == shape[1] == 1:
        return
    # Explicitly: the first half follows the column (last axis), the second the row.
    table = sinusoidal_nd(shape, 4 * quarter, layout="mae", dtype=dtype)
    half = 2 * quarter
    np.testing.assert_array_equal(
        table[0, :, :half], sinusoidal(shape[1], half, layout="split", dtype=dtype)
    )
    np.testing.assert_array_equal(
        table[:, 0, half:], sinusoidal(shape[0], half, layout="split", dtype=dtype)
    )


def test_bfloat16_is_the_correctly_rounded_table():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    table = sinusoidal_nd((5, 7), 12, dtype="bfloat16")
    assert table.dtype == np.dtype(ml_dtypes.bfloat16)
    _check_axis_blocks((5, 7), 12, "positional-encodings", "bfloat16")


# --------------------------------------------------------------------------------------
# Validation.


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"shape": 5}, TypeError, r"pass \(5,\)"),
        ({"shape": ()}, ValueError, "at least one axis"),
        ({"shape": (3, 0)}, ValueError, r"shape\[1\] must be an int >= 1, got 0"),
        ({"shape": (3, 2.0)}, TypeError, r"shape\[1\]"),
        ({"shape": "ab"}, TypeError, "tuple of positive ints"),
        ({"channels": 0}, ValueError, "channels must be an int >= 1"),
        ({"layout": "detr"}, ValueError, "layout must be one of"),
        ({"layout": "mae", "channels": 6}, ValueError, "divisible by 4.*channels=6.*4 and 8"),
        ({"layout": "mae", "shape": (2, 3, 4), "channels": 12}, ValueError, "1-D and 2-D"),
        ({"cls_token": True}, ValueError, "flatten=True"),
        ({"flatten": 1}, TypeError, "flatten must be a bool"),
        ({"dtype": np.int32}, TypeError, "dtype must be one of"),
        ({"base": 1.0}, ValueError, "base must not be 1"),
        ({"max_bytes": 100}, ValueError, "max_bytes"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    args = {"shape": (4, 4), "channels": 8} | kwargs
    with pytest.raises(error, match=match):
        sinusoidal_nd(args.pop("shape"), args.pop("channels"), **args)


# --------------------------------------------------------------------------------------
# Torch module.


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def _module(*args, **kwargs):
    from posenc.torch.nd import SinusoidalPositionalEncodingND

    return SinusoidalPositionalEncodingND(*args, **kwargs)


@pytest.mark.parametrize(
    ("shape", "channels", "layout"),
    [((4, 5), 6, "positional-encodings"), ((3, 4, 5), 11, "positional-encodings"),
     ((7,), 9, "positional-encodings"), ((4, 6), 16, "mae"), ((5,), 8, "mae")],
)  # fmt: skip
def test_torch_equals_core(torch, shape, channels, layout):
    pe = _module(channels, layout=layout)
    x = torch.randn(3, *shape, channels, dtype=torch.float64)
    table = torch.from_numpy(sinusoidal_nd(shape, channels, layout=layout, dtype="float64"))
    assert torch.equal(pe.encoding(shape, torch.float64), table)
    assert torch.equal(pe(x), x + table)
    x32 = x.float()
    table32 = torch.from_numpy(sinusoidal_nd(shape, channels, layout=layout))
    assert torch.equal(pe(x32), x32 + table32)


def test_torch_matches_package_summer(torch):
    enc = pytest.importorskip("positional_encodings.torch_encodings")
    x = torch.randn(2, 6, 7, 10)
    ref = enc.Summer(enc.PositionalEncoding2D(10))(x)
    torch.testing.assert_close(
        _module(10)(x), ref, rtol=0, atol=7 * 2.0**-23 + 2.0**-22
    )  # as above, plus x's ulp


@pytest.mark.parametrize(
    ("cast", "dtype", "fmt"), [("half", "float16", "float16"), ("bfloat16", "bfloat16", "bfloat16")]
)
def test_low_precision_tables_are_correctly_rounded(torch, cast, dtype, fmt):
    pytest.importorskip("ml_dtypes")
    pe = getattr(_module(12), cast)()
    torch_dtype = getattr(torch, dtype)
    x = torch.zeros(1, 9, 11, 12, dtype=torch_dtype)
    expected = sinusoidal_nd((9, 11), 12, dtype=fmt).astype(np.float32)  # exact widening
    assert torch.equal(pe(x)[0].float(), torch.from_numpy(expected))
    assert pe.encoding((9, 11), torch_dtype).dtype == torch_dtype


def test_cache_state_dict_and_casts(torch):
    pe = _module(8)
    first = pe.encoding((3, 4))
    assert pe.encoding((3, 4)) is first  # cached
    assert pe.state_dict() == {}  # nothing derived is saved
    # A state dict written by the package's module (its inv_freq buffer) still loads.
    enc = pytest.importorskip("positional_encodings.torch_encodings")
    pe.load_state_dict(enc.PositionalEncoding2D(8).state_dict())
    pe.double()
    assert pe._tables == {}  # a cast or move rebuilds exact tables on the next call


def test_dropout(torch):
    pe = _module(4, dropout=0.5)
    x = torch.zeros(2, 3, 3, 4)
    pe.eval()
    assert torch.equal(pe(x), x + pe.encoding((3, 3)))
    pe.train()
    torch.manual_seed(0)
    out = pe(x)
    kept = out != 0
    assert torch.allclose(out[kept], 2 * (x + pe.encoding((3, 3))).expand_as(out)[kept])


def test_torch_compile_fullgraph_after_warmup(torch):
    pe = _module(6)
    x = torch.randn(2, 4, 5, 6)
    expected = pe(x)  # warm-up: the table is cached
    compiled = torch.compile(pe, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), expected)
    # A grid never seen eagerly has no table; fullgraph cannot build one (NumPy).
    with pytest.raises(Exception, match="has no table for grid"):
        compiled(torch.randn(2, 9, 9, 6))


@pytest.mark.parametrize(
    ("kwargs", "x_shape", "x_dtype", "error", "match"),
    [
        ({}, (4, 6), "float32", ValueError, r"\(batch, \*spatial, channels\)"),
        ({"ndim": 2}, (1, 2, 3, 4, 6), "float32", ValueError, "rank 4"),
        ({}, (1, 4, 5, 7), "float32", ValueError, "channels=6.*last dimension 7"),
        ({}, (1, 4, 5, 6), "int64", TypeError, "floating-point"),
        ({"layout": "mae", "channels": 8}, (1, 2, 3, 4, 8), "float32", ValueError, "1-D and 2-D"),
    ],
)
def test_torch_bad_inputs(torch, kwargs, x_shape, x_dtype, error, match):
    pe = _module(**({"channels": 6} | kwargs))
    x = torch.zeros(x_shape, dtype=getattr(torch, x_dtype))
    with pytest.raises(error, match=match):
        pe(x)


def test_torch_bad_constructor(torch):
    with pytest.raises(ValueError, match="divisible by 4"):
        _module(6, layout="mae", ndim=2)
    with pytest.raises(ValueError, match="dropout"):
        _module(6, dropout=1.0)
    with pytest.raises(TypeError, match="torch.Tensor"):
        _module(6)(np.zeros((1, 2, 2, 6)))
