"""PyTorch's CPU FlexAttention swept against SDPA: where its kernel is wrong, and
``posenc.torch.flex_attention``, which routes around it, right everywhere swept.

PyTorch 2.13's CPU kernel computes ``q·kᵀ`` wrong for head dims 8 and 16 at some key
lengths (:func:`wrong_in_2_13` says where, and why). posenc pads a head dim under
``SAFE_HEAD_DIM`` with zeros; the sweep checks both that posenc's answers equal SDPA's
and that PyTorch's raw answers are wrong exactly where expected, so that a PyTorch
release that moves the fault (fixes it, or widens it) fails here, saying what to update.

A compiled program serves every length of one head dim and scale (a float scale is
a constant of the program) up to one 128-key tile, another every longer length, and a
query count of 1 another: the sweep costs six compiles and about 800 calls.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
flex_module = pytest.importorskip("torch.nn.attention.flex_attention")

from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402

from posenc.torch import flex as posenc_flex  # noqa: E402
from posenc.torch.masks import all_keys, block_mask  # noqa: E402

#: Floats per vector in the C++ that inductor writes for this CPU (8 for AVX2, 16 for
#: AVX-512): the kernel's fault depends on it.
VECTOR = torch._inductor.cpu_vec_isa.pick_vec_isa().nelements()

#: What the float32 comparisons allow: the kernel's softmax takes exp with up to 20 ulp
#: of error (``Vectorized::exp_u20``, 1.2e-6 relative) and sums in another order than
#: SDPA; its outputs are averages of values |v| < 5, so right answers are within
#: 6e-6 (measured: at most 6.3e-7 over the sweep), and the fault's, off by 2.6e-3 to 3
#: or NaN, are far outside.
TOLERANCE = 1e-5

#: Key lengths swept: every length up to past one 128-key tile, and some longer; the
#: longest first, so that the first call of a program has more keys than queries (a
#: first call with as many would compile a program for equal lengths, then another).
KEYS = (264, 256, 255, 200, *range(135, 0, -1))


def wrong_in_2_13(head_dim: int, keys: int, block: int) -> bool:
    """Whether PyTorch 2.13's CPU FlexAttention gets a call of fewer than eight queries
    wrong (float32, bfloat16 and float16 alike, whatever the batch, heads, grouped keys,
    mask or score_mod; more queries: see the end).

    ``block`` is the block mask's key tile: 128 for posenc's masks, every key (one tile)
    for PyTorch's default mask. The fault, read from PyTorch's source
    (``torch/_inductor/codegen/cpp_micro_gemm.py``, ``CppMicroGemmFP32Vec``, the kernel
    ``q·kᵀ`` uses): for a head dim under 24 that is a multiple of the vector width, a
    tail of ``n`` keys, ``n % 16`` a multiple of the vector width, takes a path that
    loads and stores whole 16-key tiles, so ``16 - n % 16`` scores are written past the
    block's. When the block is the whole score buffer (``keys <= block``) they land on
    the kernel's running maximum and sum: wrong outputs, or NaN. With 8 floats a vector
    (AVX2): head dims 8 and 16, key lengths 8, 24, 40, .., 120 (and any ``keys % 16 ==
    8`` under PyTorch's default mask); with 16 (AVX-512) none. (With eight queries or
    more in a tile the stray scores overwrite the maximum alone, and the answer is wrong
    only when one is far above the row's: the sweep takes two queries, where a running
    sum is overwritten too.)
    """
    tail = keys % 16
    small = head_dim < 24 and head_dim % VECTOR == 0
    return small and keys <= block and tail != 0 and tail % VECTOR == 0


@pytest.fixture(scope="module")
def raw():
    """PyTorch's own compiled FlexAttention, no posenc in between."""
    limit = max(torch._dynamo.config.recompile_limit, 64)
    with torch._dynamo.config.patch(recompile_limit=limit):
        yield torch.compile(flex_module.flex_attention, dynamic=True)


def inputs(heads, queries, keys, head_dim, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, queries, head_dim, generator=g)
    k, v = (torch.randn(1, heads, keys, head_dim, generator=g) for _ in range(2))
    return q, k, v


def error(out, q, k, v, scale=None):
    """Largest difference from SDPA on the same inputs, in float64."""
    want = sdpa(q.double(), k.double(), v.double(), scale=scale)
    return (out.double() - want).abs().max().item()  # NaN stays NaN: never < TOLERANCE


def sweep(attend, head_dims, queries, keys, scale=None):
    """``{(head_dim, keys)}`` of the calls ``attend`` gets wrong."""
    wrong = set()
    for head_dim in head_dims:
        for length in keys:
            if length < queries:
                continue
            q, k, v = inputs(2, queries, length, head_dim, seed=length)
            with torch.no_grad():
                out = attend(q, k, v, scale=scale)
            assert out.shape == q.shape
            assert out.is_contiguous()
            if not error(out, q, k, v, scale) < TOLERANCE:
                wrong.add((head_dim, length))
    return wrong


def changed(found, expected):
    return (
        f"PyTorch {torch.__version__}'s CPU FlexAttention is no longer wrong exactly where "
        f"2.13 is: wrong at {sorted(found - expected)} (head_dim, keys) beyond the "
        f"expected, right at {sorted(expected - found)}. posenc.torch.flex pads head dims "
        f"under SAFE_HEAD_DIM={posenc_flex.SAFE_HEAD_DIM} around 2.13's fault: map the new "
        "one (benchmarks/sweep_flex_cpu.py), then update SAFE_HEAD_DIM, wrong_in_2_13 and "
        "docs/reliability.md"
    )


@pytest.mark.slow
def test_pytorchs_cpu_kernel_is_wrong_exactly_where_expected(raw):
    """Head dims 8 and 16, two queries, posenc's block masks (128-key tiles): the raw
    kernel is wrong where :func:`wrong_in_2_13` says, and right elsewhere. (A PyTorch
    that widens the fault to the padded head dim, 24, or to the head dims posenc does not
    pad, 32 and 64 as swept, fails the next test.)"""

    def tiled(q, k, v, scale):
        mask = block_mask(all_keys(), q.shape[-2], k.shape[-2])
        return raw(q, k, v, block_mask=mask, scale=scale)

    found = sweep(tiled, (8, 16), 2, KEYS)
    expected = {(d, n) for d in (8, 16) for n in KEYS if n >= 2 and wrong_in_2_13(d, n, 128)}
    assert found == expected, changed(found, expected)


@pytest.mark.slow
@pytest.mark.parametrize("queries", [2, 1])
def test_posenc_flex_attention_is_right_everywhere_swept(queries):
    """Every key length at the fault's head dims, 8 and 16 (one query: up to one tile, a
    decoding step), and a few at the other head dims under 24, which run the same padded
    program: at a scale of 0.25 for all, so that they share it. With two queries, the
    fault's key lengths at head dims posenc passes as they are (24, the padded width; 32
    and 64, as models have them), so that a PyTorch that widens the fault is noticed."""
    lengths = KEYS if queries > 1 else KEYS[KEYS.index(128) :]
    assert not sweep(posenc_flex.flex_attention, (8, 16), queries, lengths, scale=0.25)
    few = (136, 120, 40, 24, 8)
    assert not sweep(posenc_flex.flex_attention, (4, 12, 20), queries, few, scale=0.25)
    if queries > 1:
        assert not sweep(posenc_flex.flex_attention, (24, 32, 64), queries, few, scale=0.25)


@pytest.mark.slow
def test_the_route_keeps_the_head_dims_own_scale():
    """Padded to 24 for the kernel, the default scale is still 1/sqrt(8), not 1/sqrt(24)."""
    assert not sweep(posenc_flex.flex_attention, (8,), 3, (120, 40, 24, 8, 3))


def test_float64_is_refused_by_name_on_the_cpu():
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match="takes float32, bfloat16 or float16.*got torch.float64"):
        posenc_flex.flex_attention(q, q, q)
