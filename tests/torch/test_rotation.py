"""The rotation's own backward (the inverse rotation from the tables) and in-place mode:
gradcheck in float64, gradients equal to autograd through Hugging Face's formula, nothing
of q or k saved for the backward, and in place equal to out of place."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from posenc.torch import RotaryEmbedding  # noqa: E402

CASES = [  # (layout, head_dim, rotary_dim)
    ("half", 16, 16),
    ("interleaved", 16, 16),
    ("half", 16, 8),
    ("interleaved", 12, 6),
]


def _randn(*shape, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


def formula(x, cos, sin, layout, rotary_dim):
    """Hugging Face's ``q * cos + rotate_half(q) * sin`` (or the pairwise turn), written
    out with plain tensor operations for autograd to differentiate."""
    xr, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if layout == "half":
        x1, x2 = xr.chunk(2, dim=-1)
        turned = torch.cat((-x2, x1), dim=-1)
    else:
        turned = torch.stack((-xr[..., 1::2], xr[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat((xr * cos + turned * sin, rest), dim=-1)


@pytest.mark.parametrize(("layout", "head_dim", "rotary_dim"), CASES)
def test_gradcheck_in_float64(layout, head_dim, rotary_dim):
    rope = RotaryEmbedding(head_dim, rotary_dim=rotary_dim, layout=layout, max_length=32).double()
    q = _randn(2, 3, 5, head_dim, dtype=torch.float64).requires_grad_()
    k = _randn(2, 1, 5, head_dim, dtype=torch.float64, seed=1).requires_grad_()
    positions = torch.tensor([[0, 7, 3, 30, 1], [2, 2, 9, 4, 0]])
    assert torch.autograd.gradcheck(lambda a, b: rope(a, b, positions=positions), (q, k))
    assert torch.autograd.gradgradcheck(lambda a, b: rope(a, b, offset=3), (q, k))


@pytest.mark.parametrize(("layout", "head_dim", "rotary_dim"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_equal_autograd_through_the_formula(layout, head_dim, rotary_dim, dtype):
    """Same forward and same gradients, bit for bit, as autograd through the formula with
    the module's own tables (bfloat16: rotated in float32, as the module does)."""
    rope = RotaryEmbedding(head_dim, rotary_dim=rotary_dim, layout=layout, max_length=64)
    q = _randn(2, 4, 9, head_dim, dtype=dtype).requires_grad_()
    k = _randn(2, 2, 9, head_dim, dtype=dtype, seed=1).requires_grad_()
    gq, gk = (
        _randn(2, 4, 9, head_dim, dtype=dtype, seed=2),
        _randn(2, 2, 9, head_dim, dtype=dtype, seed=3),
    )
    out_q, out_k = rope(q, k, offset=50)
    grads = torch.autograd.grad((out_q, out_k), (q, k), (gq, gk))
    cos, sin = rope.cos[50:59], rope.sin[50:59]
    plain = [formula(x.float(), cos, sin, layout, rotary_dim).to(dtype) for x in (q, k)]
    expected = torch.autograd.grad(plain, (q, k), (gq, gk))
    for mine, theirs in zip((out_q, out_k, *grads), (*plain, *expected), strict=True):
        assert mine.dtype == dtype
        assert torch.equal(mine, theirs)


def test_the_backward_keeps_the_tables_not_q_or_k():
    """Everything autograd saves for the backward of the rotation is a table row slice
    (rotary_dim wide, no heads axis), none of it q or k."""
    rope = RotaryEmbedding(32, max_length=128)
    q = _randn(2, 4, 100, 32).requires_grad_()
    k = _randn(2, 2, 100, 32, seed=1).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out_q, out_k = rope(q, k)
    assert saved
    assert all(t.shape == (100, 32) for t in saved), [tuple(t.shape) for t in saved]
    (out_q.sum() + out_k.sum()).backward()
    assert q.grad is not None
    assert k.grad is not None


@pytest.mark.parametrize(("layout", "head_dim", "rotary_dim"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_in_place_equals_out_of_place(layout, head_dim, rotary_dim, dtype):
    rope = RotaryEmbedding(head_dim, rotary_dim=rotary_dim, layout=layout, max_length=64)
    q, k = _randn(2, 4, 9, head_dim, dtype=dtype), _randn(2, 2, 9, head_dim, dtype=dtype, seed=1)
    expected = rope(q, k, offset=5)
    q2, k2 = q.clone(), k.clone()
    out = rope(q2, k2, offset=5, inplace=True)
    assert out[0] is q2
    assert out[1] is k2
    for mine, theirs in zip(out, expected, strict=True):
        assert torch.equal(mine, theirs)


def test_in_place_under_autograd_gives_the_same_gradients():
    rope = RotaryEmbedding(16, max_length=32)
    w = _randn(16, 16).requires_grad_()
    x = _randn(2, 3, 7, 16)
    grads = []
    for inplace in (False, True):
        q, k = x @ w, (x @ w)[:, :1]  # non-leaf tensors: in place is allowed on them
        out_q, out_k = rope(q, k, inplace=inplace)
        grads.append(torch.autograd.grad(out_q.square().sum() + out_k.sum(), w)[0])
    assert torch.equal(grads[0], grads[1])
    with pytest.raises(TypeError, match="inplace must be a bool"):
        rope(x, x, inplace=1)


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "head_dim", "rotary_dim"), CASES)
def test_the_fused_kernel_gives_the_eager_bits(layout, head_dim, rotary_dim):
    """fused=True (torch.compile's kernel of the formula): the eager rotation's outputs
    and gradients bit for bit, in float32 and bfloat16, out of place and in place."""
    kwargs = {"rotary_dim": rotary_dim, "layout": layout, "max_length": 64}
    eager, fused = (
        RotaryEmbedding(head_dim, **kwargs),
        RotaryEmbedding(head_dim, fused=True, **kwargs),
    )
    assert "fused=True" in repr(fused)
    for dtype in (torch.float32, torch.bfloat16):
        q = _randn(2, 4, 9, head_dim, dtype=dtype).requires_grad_()
        k = _randn(2, 2, 9, head_dim, dtype=dtype, seed=1).requires_grad_()
        gq, gk = _randn(*q.shape, dtype=dtype, seed=2), _randn(*k.shape, dtype=dtype, seed=3)
        results = []
        for module in (eager, fused):
            out = module(q, k, offset=40)
            results.append((*out, *torch.autograd.grad(out, (q, k), (gq, gk))))
        for mine, theirs in zip(results[1], results[0], strict=True):
            assert torch.equal(mine, theirs)
        with torch.no_grad():
            q2, k2 = q.detach().clone(), k.detach().clone()
            out = fused(q2, k2, offset=40, inplace=True)
        assert out[0] is q2
        assert torch.equal(q2, results[0][0])
        assert torch.equal(k2, results[0][1])


@pytest.mark.parametrize(("layout", "head_dim", "rotary_dim"), CASES)
@pytest.mark.parametrize("qk_layout", ["bhsd", "bshd"])
def test_decoding_steps_give_the_formulas_bits(layout, head_dim, rotary_dim, qk_layout):
    """One batch row, one or a few positions (q and k rotated together, the signed sin
    table cached): the formula's bits, contiguous outputs, also past the tables' rows
    and after .double()."""
    rope = RotaryEmbedding(head_dim, rotary_dim=rotary_dim, layout=layout, max_length=16,
                           qk_layout=qk_layout)  # fmt: skip
    for dtype in (torch.float32, torch.float64):
        if dtype == torch.float64:
            rope.double()
        for offset, seq in ((3, 1), (12, 4), (40, 1), (41, 2)):  # 40: past the 16 rows
            shape_q = (1, 5, seq, head_dim) if qk_layout == "bhsd" else (1, seq, 5, head_dim)
            shape_k = (1, 2, seq, head_dim) if qk_layout == "bhsd" else (1, seq, 2, head_dim)
            q, k = _randn(*shape_q, dtype=dtype), _randn(*shape_k, dtype=dtype, seed=1)
            positions = torch.arange(offset, offset + seq)
            cos, sin = rope.cos_sin(positions)
            if qk_layout == "bshd":
                cos, sin = cos[:, None], sin[:, None]
            for call in ({"offset": offset}, {"positions": positions},
                         {"positions": positions[None].int()}):  # fmt: skip
                out_q, out_k = rope(q, k, **call)
                for mine, x in ((out_q, q), (out_k, k)):
                    assert mine.dtype == dtype
                    assert mine.is_contiguous()
                    assert torch.equal(mine, formula(x, cos, sin, layout, rotary_dim))
    seq_axis = 2 if qk_layout == "bhsd" else 1
    with pytest.raises(ValueError, match="positions must be >= 0, got -1"):
        rope(q, k, positions=torch.tensor([-1] * q.shape[seq_axis]))
    with pytest.raises(ValueError, match="positions must be >= 0, got -1"):  # one position
        rope(q.narrow(seq_axis, 0, 1), k.narrow(seq_axis, 0, 1), positions=torch.tensor([[-1]]))


def test_the_signed_table_is_kept_once_for_the_spec_and_never_pickled():
    import pickle

    rope = RotaryEmbedding(16, base=321.5, max_length=32)
    q, k = _randn(1, 4, 1, 16), _randn(1, 2, 1, 16, seed=1)
    before = rope(q, k, offset=7)
    fmt = (torch.float32, torch.device("cpu"))
    signed = rope._holder.entry.extras["sin", fmt][1]  # made by the step, with the shared tables
    other = RotaryEmbedding(16, base=321.5, max_length=32)
    other(q, k, offset=3)
    assert other._holder.entry.extras["sin", fmt][1] is signed  # one for both modules
    data = pickle.dumps(rope)
    assert len(data) < 10_000  # neither the tables nor the signed one
    copy = pickle.loads(data)
    for mine, theirs in zip(copy(q, k, offset=7), before, strict=True):
        assert torch.equal(mine, theirs)
