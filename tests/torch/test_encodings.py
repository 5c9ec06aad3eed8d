"""PyTorch modules: the seed module's behaviour and values, without its traps."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from torch.testing import assert_close  # noqa: E402

import posenc  # noqa: E402
from posenc.core.positions import MemoryLimitError  # noqa: E402
from posenc.torch import (  # noqa: E402
    InputEmbedding,
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    exact_table,
)
from seed_oracles import gen_pe_torch, seed_positional_encoding_class  # noqa: E402

# Seed 003: the embedded batch (3, 6, 4), printed to 2 decimals, and the outputs of the
# positional encoding with n=100 (from-scratch section) and n=10000 (module section).
SEED_EMBEDDINGS = [
    [[-0.27, -0.82, 0.33, 1.39], [1.72, -0.63, -1.13, 0.10], [-0.23, -0.07, -0.28, 1.17],
     [0.61, 1.46, 1.21, 0.84], [-2.05, 1.77, 1.51, -0.21], [0.86, -1.81, 0.55, 0.98]],
    [[0.06, -0.34, 2.08, -1.24], [1.44, -0.64, 0.78, -1.10], [1.78, 1.22, 1.12, -2.35],
     [-0.48, -0.40, 1.73, 0.54], [1.28, -0.18, 0.52, 2.10], [0.34, 0.62, -0.45, -0.64]],
    [[-0.22, -0.66, -1.00, -0.04], [-0.23, -0.07, -0.28, 1.17], [1.44, -0.64, 0.78, -1.10],
     [1.78, 1.22, 1.12, -2.35], [-0.48, -0.40, 1.73, 0.54], [0.70, -1.35, 0.15, -1.44]],
]  # fmt: skip
SEED_SUM_N100 = [
    [[-0.27, 0.18, 0.33, 2.39], [2.57, -0.09, -1.03, 1.09], [0.68, -0.49, -0.08, 2.15],
     [0.75, 0.47, 1.50, 1.80], [-2.80, 1.12, 1.90, 0.71], [-0.10, -1.53, 1.03, 1.86]],
    [[0.06, 0.66, 2.08, -0.24], [2.28, -0.10, 0.88, -0.10], [2.69, 0.80, 1.32, -1.37],
     [-0.34, -1.39, 2.03, 1.50], [0.52, -0.83, 0.91, 3.02], [-0.62, 0.90, 0.03, 0.23]],
    [[-0.22, 0.34, -1.00, 0.96], [0.61, 0.47, -0.18, 2.16], [2.35, -1.06, 0.98, -0.12],
     [1.92, 0.23, 1.41, -1.40], [-1.24, -1.06, 2.12, 1.46], [-0.26, -1.06, 0.63, -0.56]],
]  # fmt: skip
SEED_SUM_N10000 = [
    [[-0.27, 0.18, 0.33, 2.39], [2.57, -0.09, -1.12, 1.10], [0.68, -0.49, -0.26, 2.17],
     [0.75, 0.47, 1.24, 1.84], [-2.80, 1.12, 1.55, 0.79], [-0.10, -1.53, 0.60, 1.98]],
    [[0.06, 0.66, 2.08, -0.24], [2.28, -0.10, 0.79, -0.10], [2.69, 0.80, 1.14, -1.35],
     [-0.34, -1.39, 1.76, 1.54], [0.52, -0.83, 0.56, 3.10], [-0.62, 0.90, -0.40, 0.35]],
    [[-0.22, 0.34, -1.00, 0.96], [0.61, 0.47, -0.27, 2.17], [2.35, -1.06, 0.80, -0.10],
     [1.92, 0.23, 1.15, -1.35], [-1.24, -1.06, 1.77, 1.54], [-0.26, -1.06, 0.20, -0.44]],
]  # fmt: skip


@pytest.mark.parametrize(("base", "expected"), [(100, SEED_SUM_N100), (10000, SEED_SUM_N10000)])
def test_seed_003_forward_pass(base, expected):
    embeddings = torch.tensor(SEED_EMBEDDINGS)
    pe = SinusoidalPositionalEncoding(4, dropout=0.0, max_length=10, base=base)
    out = pe(embeddings)
    assert out.shape == (3, 6, 4)
    # Inputs and outputs are printed to 2 decimals: each off by at most 0.005.
    assert_close(out, torch.tensor(expected), rtol=0, atol=0.01 + 1e-6)
    # Exactly embeddings + the correctly rounded float32 table.
    table = torch.from_numpy(posenc.sinusoidal(6, 4, base=base))
    assert torch.equal(out, embeddings + table)


def test_seed_003_module_and_vectorised_code_agree_to_float32_angle_error():
    seed = seed_positional_encoding_class()(512, 0.0, 200)
    ours = SinusoidalPositionalEncoding(512, 0.0, 200)
    x = torch.randn(2, 200, 512)
    # The seed forms float32 angles: error up to position × 2^-23.
    assert_close(ours(x), seed(x), rtol=0, atol=200 * 2**-23 + 1e-6)
    assert_close(gen_pe_torch(10, 4, 100)[0], exact_table(10, 4, base=100), rtol=0, atol=1e-6)


def test_nothing_derived_in_state_dict_and_seed_checkpoints_load():
    seed = seed_positional_encoding_class()(16, 0.1, 50)
    assert "pe" in seed.state_dict()  # the trap: the derived table is saved
    ours = SinusoidalPositionalEncoding(16, 0.1, 50)
    assert dict(ours.state_dict()) == {}
    ours.load_state_dict(seed.state_dict(), strict=True)
    # Nested, with a prefix, and the table is untouched by the loaded values.
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), SinusoidalPositionalEncoding(16, 0.0, 50))
    state = {
        "0.weight": torch.zeros(16, 16),
        "0.bias": torch.zeros(16),
        "1.pe": torch.ones(1, 50, 16),
    }
    with pytest.warns(
        UserWarning, match="the module keeps its own"
    ):  # the ones are not the table: named, then dropped
        model.load_state_dict(state, strict=True)
    assert torch.equal(model[1].pe, exact_table(50, 16))


def test_long_sequences_grow_the_table():
    pe = SinusoidalPositionalEncoding(8, dropout=0.0, max_length=10)
    out = pe(torch.zeros(1, 25, 8))
    assert torch.equal(out[0], exact_table(25, 8))
    assert pe.pe.shape[0] >= 25
    assert torch.equal(pe(torch.zeros(3, 8), offset=100), exact_table(3, 8, start=100))


@pytest.mark.parametrize("cls", ["sinusoidal", "learned"])
def test_decoding_one_token_at_a_time_equals_the_full_call(cls):
    torch.manual_seed(0)
    module = (
        SinusoidalPositionalEncoding(16, dropout=0.0, max_length=32)
        if cls == "sinusoidal"
        else LearnedPositionalEmbedding(32, 16)
    )
    x = torch.randn(2, 12, 16)
    full = module(x)
    steps = torch.cat([module(x[:, t : t + 1], offset=t) for t in range(12)], dim=1)
    assert torch.equal(full, steps)
    explicit = module(x, positions=torch.arange(12))
    assert torch.equal(full, explicit)


@pytest.mark.parametrize("cls", ["sinusoidal", "learned"])
def test_packed_sequences(cls):
    torch.manual_seed(0)
    module = (
        SinusoidalPositionalEncoding(8, dropout=0.0, max_length=16)
        if cls == "sinusoidal"
        else LearnedPositionalEmbedding(16, 8)
    )
    a, b = torch.randn(1, 3, 8), torch.randn(1, 5, 8)
    packed = module(torch.cat([a, b], dim=1), positions=torch.tensor([0, 1, 2, 0, 1, 2, 3, 4]))
    assert torch.equal(packed, torch.cat([module(a), module(b)], dim=1))
    batch = torch.randn(2, 4, 8)
    positions = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])
    out = module(batch, positions=positions)
    assert torch.equal(out[1], module(batch[1:], offset=5)[0])


@pytest.mark.parametrize(
    ("convert", "dtype", "fmt"),
    [
        (lambda m: m.half(), torch.float16, "float16"),
        (lambda m: m.bfloat16(), torch.bfloat16, "bfloat16"),
        (lambda m: m.double(), torch.float64, "float64"),
        (lambda m: m.to(torch.bfloat16), torch.bfloat16, "bfloat16"),
    ],
)
def test_module_casts_give_correctly_rounded_tables(convert, dtype, fmt):
    module = convert(SinusoidalPositionalEncoding(512, dropout=0.0, max_length=5000))
    assert module.pe.dtype == dtype
    exact = posenc.sinusoidal(5000, 512, dtype=fmt).astype(np.float64)
    assert np.array_equal(module.pe.double().numpy(), exact)
    out = module(torch.zeros(1, 5000, 512, dtype=dtype))
    assert out.dtype == dtype
    assert np.array_equal(out[0].double().numpy(), exact)


def test_casting_a_float32_table_rounds_twice():
    # The trap the rebuild avoids: float64 -> float32 -> bfloat16 is not the correct
    # rounding of the exact value for some entries of a 5000 x 512 table.
    naive = exact_table(5000, 512, dtype=torch.float32).bfloat16().double().numpy()
    exact = posenc.sinusoidal(5000, 512, dtype="bfloat16").astype(np.float64)
    assert (naive != exact).sum() > 0
    assert np.abs(naive - exact).max() <= 2.0**-8


def test_input_dtype_other_than_the_module_gets_its_own_exact_table():
    module = SinusoidalPositionalEncoding(64, dropout=0.0, max_length=300)
    x = torch.randn(2, 300, 64).bfloat16()
    out = module(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, x + exact_table(300, 64, dtype=torch.bfloat16))
    assert module.pe.dtype == torch.float32


def test_autocast_keeps_the_exact_table():
    module = InputEmbedding(50, 32, dropout=0.0, max_length=64)
    ids = torch.randint(0, 50, (2, 64))
    eager = module(ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(ids)
    assert out.dtype == torch.float32
    assert torch.equal(out, eager)


def test_meta_device_then_to_empty_rebuilds_the_table():
    with torch.device("meta"):
        module = SinusoidalPositionalEncoding(32, dropout=0.0, max_length=100)
    module = module.to_empty(device="cpu")
    assert torch.equal(module.pe, exact_table(100, 32))


def test_torch_compile_fullgraph():
    module = SinusoidalPositionalEncoding(32, dropout=0.0, max_length=64).eval()
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    x = torch.randn(2, 16, 32)
    assert torch.equal(compiled(x), module(x))
    assert torch.equal(compiled(x, offset=7), module(x, offset=7))
    positions = torch.tensor([[0, 1, 2, 3] * 4, list(range(16))])
    assert torch.equal(compiled(x, positions=positions), module(x, positions=positions))
    embed = InputEmbedding(40, 32, dropout=0.0, max_length=64).eval()
    ids = torch.randint(0, 40, (2, 16))
    assert torch.equal(torch.compile(embed, fullgraph=True, backend="eager")(ids), embed(ids))


def test_torch_compile_inductor():
    module = SinusoidalPositionalEncoding(32, dropout=0.0, max_length=64).eval()
    compiled = torch.compile(module, fullgraph=True)
    x = torch.randn(2, 16, 32)
    assert_close(compiled(x), module(x), rtol=0, atol=0)


def test_dropout_is_applied_after_the_addition():
    torch.manual_seed(0)
    module = SinusoidalPositionalEncoding(16, dropout=0.5, max_length=8)
    x = torch.randn(4, 8, 16)
    out = module(x)
    kept = out != 0
    assert 0.3 < kept.float().mean() < 0.7
    assert_close(out[kept], ((x + exact_table(8, 16)) * 2)[kept])
    module.eval()
    assert torch.equal(module(x), x + exact_table(8, 16))


def test_split_layout_and_tensor2tensor_formula_options():
    module = SinusoidalPositionalEncoding(
        10, dropout=0.0, max_length=20, layout="split", formula="tensor2tensor"
    )
    expected = posenc.sinusoidal(20, 10, layout="split", formula="tensor2tensor")
    assert np.array_equal(module(torch.zeros(20, 10)).numpy(), expected)
    assert "layout='split'" in repr(module)


def test_token_embedding_scales_by_sqrt_d():
    emb = TokenEmbedding(10, 16)
    ids = torch.tensor([[1, 2, 9]])
    assert_close(emb(ids), emb.embedding.weight[ids] * 4.0)
    plain = TokenEmbedding(10, 16, scale=False, padding_idx=0)
    assert torch.equal(plain(torch.tensor([0])), torch.zeros(1, 16))


def test_seed_walk_through_with_the_vocabulary():
    sequences = ["I wonder what will come next!", "This is a basic example paragraph.",
                 "Hello what is a basic split?"]  # fmt: skip
    vocab = posenc.Vocabulary.from_texts(sequences)
    ids = torch.from_numpy(vocab.encode_batch(sequences))
    assert ids.shape == (3, 6)
    torch.manual_seed(0)
    layer = InputEmbedding(len(vocab), 4, dropout=0.0, max_length=10, scale=False)
    out = layer(ids)
    lookup = layer.tokens.embedding.weight[ids]
    assert torch.equal(out, lookup + exact_table(6, 4))


def test_learned_embedding_beyond_max_length_is_an_error():
    emb = LearnedPositionalEmbedding(8, 4)
    with pytest.raises(ValueError, match="position 8 is beyond.*max_length=8"):
        emb(torch.zeros(1, 9, 4))
    with pytest.raises(ValueError, match="position 9 is beyond"):
        emb(torch.zeros(1, 2, 4), offset=8)
    with pytest.raises(ValueError, match="position 12 is beyond"):
        emb(torch.zeros(4, 4), positions=torch.tensor([0, 1, 2, 12]))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m: m(torch.zeros(8)), ValueError, r"shape \(8,\)"),
        (lambda m: m(torch.zeros(1, 1, 2, 8)), ValueError, r"shape \(1, 1, 2, 8\)"),
        (lambda m: m(torch.zeros(2, 3, 7)), ValueError, "d_model=8.*last dimension 7"),
        (lambda m: m(torch.zeros(2, 3, 8, dtype=torch.long)), TypeError, "floating-point.*int64"),
        (lambda m: m(np.zeros((2, 3, 8))), TypeError, "torch.Tensor.*ndarray"),
        (lambda m: m(torch.zeros(3, 8), offset=-1), ValueError, "offset must be an int >= 0, got -1"),
        (lambda m: m(torch.zeros(3, 8), offset=1.5), TypeError, "1.5 \\(float\\)"),
        (lambda m: m(torch.zeros(3, 8), positions=torch.tensor([0.0, 1, 2])), TypeError, "float32"),
        (lambda m: m(torch.zeros(3, 8), positions=torch.tensor([0, 1])), ValueError, r"seq=3.*\(2,\)"),
        (lambda m: m(torch.zeros(3, 8), positions=torch.tensor([0, -1, 2])), ValueError, "got -1"),
        (lambda m: m(torch.zeros(2, 3, 8), positions=torch.zeros(3, 3, dtype=torch.long)), ValueError, "batch size 3"),
        (lambda m: m(torch.zeros(3, 8), positions=[0, 1, 2]), TypeError, "list"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("cls", ["sinusoidal", "learned"])
def test_bad_input(call, error, match, cls):
    module = (
        SinusoidalPositionalEncoding(8, 0.0, 16)
        if cls == "sinusoidal"
        else LearnedPositionalEmbedding(16, 8)
    )
    with pytest.raises(error, match=match):
        call(module)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: SinusoidalPositionalEncoding(0), ValueError, "d_model must be an int >= 1, got 0"),
        (lambda: SinusoidalPositionalEncoding(8, dropout=1.0), ValueError, "dropout.*got 1.0"),
        (lambda: SinusoidalPositionalEncoding(8, max_length=0), ValueError, "max_length.*got 0"),
        (lambda: SinusoidalPositionalEncoding(8, base=1), ValueError, "base=1"),
        (lambda: SinusoidalPositionalEncoding(8, layout="half"), ValueError, "'half'"),
        (lambda: LearnedPositionalEmbedding(8.0, 4), TypeError, "max_length.*8.0"),
        (lambda: TokenEmbedding(10, 4, padding_idx=10), ValueError, "padding_idx must be in 0..9, got 10"),
        (lambda: InputEmbedding(10, 4, positional="rope"), ValueError, "'rope'"),
        (lambda: InputEmbedding(10, 4, positional=3), TypeError, "got 3"),
        (lambda: InputEmbedding(10, 4, positional=posenc.vocab.Vocabulary(["a"])), TypeError,
         "positional must be a name or an nn.Module"),
        (lambda: exact_table(4, 4, dtype=torch.int32), TypeError, "torch.int32"),
    ],
)  # fmt: skip
def test_bad_construction(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_token_ids_out_of_range_or_not_integers():
    emb = TokenEmbedding(10, 4)
    with pytest.raises(ValueError, match="token id 10 is outside the vocabulary 0..9"):
        emb(torch.tensor([1, 10]))
    with pytest.raises(ValueError, match="token id -1"):
        emb(torch.tensor([-1]))
    with pytest.raises(TypeError, match="float32"):
        emb(torch.tensor([1.0]))


def test_sqrt_scale_matches_paper():
    assert math.sqrt(512) == pytest.approx(22.627416997969522)


def test_review_regressions():
    module = SinusoidalPositionalEncoding(4, dropout=0.0, max_length=10)
    # A (seq, d) input takes (seq,) positions only: (batch, seq) would change its shape.
    with pytest.raises(ValueError, match=r"takes positions of shape \(seq,\)"):
        module(torch.zeros(3, 4), positions=torch.zeros(5, 3, dtype=torch.long))
    # NumPy integers are ints.
    assert torch.equal(module(torch.zeros(3, 4), offset=np.int64(2)), exact_table(3, 4, start=2))
    with pytest.raises(ValueError, match="init_std must be a finite real number > 0, got inf"):
        LearnedPositionalEmbedding(4, 4, init_std=float("inf"))
    with pytest.raises(TypeError, match="init_std.*True"):
        LearnedPositionalEmbedding(4, 4, init_std=True)


def test_input_embedding_takes_any_input_encoding_by_its_role():
    class Shifted(torch.nn.Module):  # the sinusoids of the positions one later
        def __init__(self):
            super().__init__()
            self.inner = SinusoidalPositionalEncoding(8, dropout=0.0)

        def encode(self, x, *, positions=None, offset=0):
            return self.inner(x, offset=offset + 1)

        def forward(self, x, *, positions=None, offset=0):
            raise AssertionError("an InputEncoding is used through its encode")

    torch.manual_seed(0)
    layer = InputEmbedding(20, 8, positional=Shifted(), dropout=0.0, scale=False)
    ids = torch.tensor([[3, 4, 5]])
    tokens = layer.tokens(ids)
    assert torch.equal(layer(ids, offset=2), tokens + exact_table(6, 8)[3:6])
    nope = InputEmbedding(20, 8, positional="nope", dropout=0.0)
    assert isinstance(nope.positional, NoPositionalEncoding)
    assert torch.equal(nope(ids), nope.tokens(ids))


def test_positions_past_the_memory_limit_get_the_cores_rows_and_leave_the_table():
    # A table to position 10**7 at width 512 would take 19 GiB: refused, so the call's
    # rows come from the core directly (posenc.core.positions) and the table stays.
    pe = SinusoidalPositionalEncoding(512, dropout=0.0, max_length=16)
    far = 10**7
    out = pe(torch.zeros(1, 3, 512), offset=far)
    assert torch.equal(out[0], exact_table(3, 512, start=far))
    positions = torch.tensor([[5, far + 9, 2]])
    out = pe(torch.zeros(1, 3, 512), positions=positions)
    expected = posenc.sinusoidal(np.array([5, far + 9, 2]), 512, dtype="float32")
    assert torch.equal(out[0], torch.from_numpy(expected))
    assert pe.table_length == 16


def test_a_refused_table_in_another_dtype_gives_the_calls_rows(monkeypatch):
    # The float32 buffers hold the positions, but the bfloat16 copy an input of that dtype
    # needs is refused (as the memory limit may refuse a wider copy): direct rows.
    pe = SinusoidalPositionalEncoding(8, dropout=0.0, max_length=64)
    derive = pe._derive

    def limited(positions, start, dtype, device):
        if dtype == torch.bfloat16 and isinstance(positions, int) and positions > 32:
            raise MemoryLimitError("this positional-encoding table would take too much memory")
        return derive(positions, start, dtype, device)

    monkeypatch.setattr(pe, "_derive", limited)
    out = pe(torch.zeros(1, 3, 8, dtype=torch.bfloat16), offset=40)
    assert torch.equal(out[0], exact_table(3, 8, start=40, dtype=torch.bfloat16))
    positions = torch.tensor([[1, 50]])
    out = pe(torch.zeros(1, 2, 8, dtype=torch.bfloat16), positions=positions)
    assert torch.equal(out[0], exact_table(64, 8, dtype=torch.bfloat16)[[1, 50]])
    assert pe.table_length == 64


# -- batch_first=False: the layout of PyTorch's nn.Transformer layers and tutorial ----------


SEQ_FIRST = {
    "sinusoidal": lambda first: SinusoidalPositionalEncoding(32, 0.0, 64, batch_first=first),
    "learned": lambda first: LearnedPositionalEmbedding(64, 32, batch_first=first),
    "nope": lambda first: NoPositionalEncoding(32, batch_first=first),
}


def test_a_seq_first_sinusoidal_encoding_adds_position_rows_along_the_first_axis():
    # (seq, batch, d): what nn.TransformerEncoderLayer takes by default. Each sequence
    # position gets its row of the core's table, the same for every batch member.
    x = torch.randn(10, 3, 32)
    out = SinusoidalPositionalEncoding(32, 0.0, batch_first=False)(x)
    table = torch.from_numpy(posenc.sinusoidal(10, 32, dtype="float32"))  # (seq, d)
    assert torch.equal(out, x + table[:, None, :])
    decoded = SinusoidalPositionalEncoding(32, 0.0, batch_first=False)(x[7:8], offset=7)
    assert torch.equal(decoded, out[7:8])
    layer = torch.nn.TransformerEncoderLayer(32, 4, dropout=0.0).eval()  # batch_first=False
    with torch.no_grad():
        assert layer(out).shape == (10, 3, 32)


@pytest.mark.parametrize("kind", SEQ_FIRST)
def test_batch_first_false_is_the_batch_first_call_on_the_transpose(kind):
    torch.manual_seed(0)
    seq_first, batch_first = SEQ_FIRST[kind](False), SEQ_FIRST[kind](True)
    if kind == "learned":
        batch_first.load_state_dict(seq_first.state_dict())
    x = torch.randn(9, 4, 32)  # (seq, batch, d)
    positions = torch.randint(0, 64, (9, 4))  # (seq, batch)
    for given, want in (
        ({}, {}),
        ({"offset": 5}, {"offset": 5}),
        ({"positions": positions}, {"positions": positions.T}),
        ({"positions": positions[:, :1]}, {"positions": positions[:, :1].T}),
        ({"positions": positions[:, 0]}, {"positions": positions[:, 0]}),
    ):
        got = seq_first(x, **given)
        assert torch.equal(got, batch_first(x.transpose(0, 1), **want).transpose(0, 1))
    unbatched = x[:, 0]  # (seq, d): the same either way
    assert torch.equal(seq_first(unbatched), batch_first(unbatched))
    with pytest.raises(ValueError, match=r"batch_first=False, x \(9, 4, 32\) is \(seq, batch, "
                       r"d_model\) and positions must have shape \(seq,\) or \(seq, batch\) = "
                       r"\(9,\) or \(9, 4\), got \(4, 9\)"):  # fmt: skip
        seq_first(x, positions=positions.T)
    with pytest.raises(ValueError, match=r"\(seq, batch, d_model\) or \(seq, d_model\)"):
        seq_first(x[None])
    assert "batch_first=False" in repr(seq_first)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "nope"])
def test_input_embedding_reads_token_ids_seq_first_too(positional):
    torch.manual_seed(0)
    seq_first = InputEmbedding(50, 32, positional=positional, dropout=0.0, batch_first=False)
    batch_first = InputEmbedding(50, 32, positional=positional, dropout=0.0)
    batch_first.load_state_dict(seq_first.state_dict())
    ids = torch.randint(0, 50, (7, 3))  # (seq, batch)
    assert torch.equal(seq_first(ids), batch_first(ids.T).transpose(0, 1))
    with pytest.raises(ValueError, match="batch_first=True.*batch_first=False"):
        InputEmbedding(50, 32, positional=SinusoidalPositionalEncoding(32, batch_first=False))
