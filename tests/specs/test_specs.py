"""The specs, the registries and the out-of-range policy of the core.

Expected values come from the core's public functions (the specs only gather options and
call them), from Hugging Face ``transformers`` run in the test (a scaling spec's dict is
a ``rope_parameters`` that Hugging Face computes the same frequencies from), and from the
policy's definition.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import posenc
from posenc.core.positions import MemoryLimitError, grow, grown_length
from posenc.schemes import SCHEMES, bench_family, bench_schemes, scheme_names
from posenc.specs import (
    AlibiSpec,
    AxialRopeSpec,
    LearnedSpec,
    NopeSpec,
    RopeSpec,
    SchemeSpec,
    SinusoidalNDSpec,
    SinusoidalSpec,
    T5Spec,
    XPosSpec,
)

SPECS = [
    SinusoidalSpec(d_model=10, base=100.0, layout="split", formula="tensor2tensor"),
    SinusoidalNDSpec(channels=8, layout="mae", ndim=2),
    LearnedSpec(max_length=16, d_model=8, init_std=0.5),
    NopeSpec(d_model=4),
    RopeSpec(head_dim=16, base=500000.0, rotary_dim=8, layout="interleaved"),
    RopeSpec(
        head_dim=16,
        scaling=posenc.LongRopeScaling(
            short_factor=[1.0, 1.5, 2.0, 4.0] * 2,
            long_factor=[2.0, 3.0, 4.0, 8.0] * 2,
            original_max_position_embeddings=32,
            max_position_embeddings=128,
        ),
    ),
    XPosSpec(head_dim=8, gamma=0.5, centre=12.0),
    AxialRopeSpec(head_dim=32, n_axes=3, sections=(4, 6, 6), mode="mrope"),
    AlibiSpec(num_heads=6, mode="symmetric"),
    T5Spec(num_heads=3, bidirectional=False, num_buckets=16, max_distance=40, compat="exact"),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: type(s).__name__)
def test_every_spec_round_trips_through_json(spec):
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["scheme"] == spec.scheme
    assert SchemeSpec.from_dict(data) == spec
    assert type(spec).from_dict(data) == spec
    assert hash(spec) == hash(SchemeSpec.from_dict(data))  # frozen: usable as a cache key


def test_spec_dicts_are_checked():
    with pytest.raises(ValueError, match="unknown scheme 'rotary'"):
        SchemeSpec.from_dict({"scheme": "rotary", "head_dim": 8})
    with pytest.raises(TypeError, match=r"scheme 'alibi': unknown \['heads'\]"):
        SchemeSpec.from_dict({"scheme": "alibi", "heads": 8})
    with pytest.raises(ValueError, match="AlibiSpec.from_dict got a spec of scheme 't5'"):
        AlibiSpec.from_dict({"scheme": "t5", "num_heads": 8})


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: SinusoidalSpec(d_model=0), ValueError, "d_model must be an int >= 1, got 0"),
        (lambda: SinusoidalSpec(d_model=8, base=1), ValueError, "base must not be 1"),
        (lambda: SinusoidalSpec(d_model=8, layout="halves"), ValueError, "layout must be one of"),
        (lambda: SinusoidalNDSpec(channels=6, layout="mae", ndim=2), ValueError, "divisible by 4"),
        (lambda: RopeSpec(head_dim=7), ValueError, "even int >= 2: head_dim"),
        (lambda: RopeSpec(head_dim=8, rotary_dim=10), ValueError, "at most head_dim=8"),
        (lambda: RopeSpec(head_dim=8, scaling="yarn"), TypeError, r"missing \['factor', 'orig"),
        (lambda: RopeSpec(head_dim=2, scaling=posenc.NTKScaling(factor=2.0)), ValueError, "d > 2"),
        (lambda: XPosSpec(head_dim=8, centre="torchscale"), TypeError, "fixed number"),
        (lambda: AxialRopeSpec(head_dim=16, n_axes=3), ValueError, "equally over n_axes=3 axes"),
        (lambda: AlibiSpec(num_heads=0), ValueError, "num_heads must be an int >= 1, got 0"),
        (lambda: T5Spec(num_heads=2, num_buckets=3), ValueError, "num_buckets must be >= 4"),
        (lambda: LearnedSpec(max_length=4, d_model=2, init_std=0), ValueError, "init_std"),
    ],
)  # fmt: skip
def test_specs_validate_with_the_cores_messages(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_specs_compute_the_cores_numbers():
    positions = np.array([0, 3, 1000, 7])
    sinusoidal = SinusoidalSpec(d_model=10, base=100.0, layout="split")
    np.testing.assert_array_equal(
        sinusoidal.table(positions, fmt="float32"),
        posenc.sinusoidal(positions, 10, base=100.0, layout="split"),
    )
    np.testing.assert_array_equal(
        sinusoidal.table(4, fmt="float64", start=1000),
        posenc.sinusoidal(np.arange(1000, 1004), 10, base=100.0, layout="split", dtype="float64"),
    )
    yarn = posenc.YarnScaling(factor=4.0, original_max_position_embeddings=64)
    rope = RopeSpec(head_dim=16, base=500000.0, scaling=yarn)
    inv_freq, attention = posenc.rope_scaling(
        "yarn", 16, 500000.0, factor=4.0, original_max_position_embeddings=64
    )
    for got, expected in zip(
        rope.tables(positions, fmt="float32"),
        posenc.rope_tables(positions, inv_freq, scale=attention),
        strict=True,
    ):
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(
        AlibiSpec(num_heads=6).bias(3, 5, offset=2, fmt="float64"),
        posenc.alibi_bias(3, 5, num_heads=6, offset=2, dtype="float64"),
    )
    t5 = T5Spec(num_heads=3, num_buckets=16, max_distance=40)
    relative = np.arange(-60, 61)
    np.testing.assert_array_equal(
        t5.buckets(relative),
        posenc.relative_position_bucket(relative, num_buckets=16, max_distance=40),
    )
    np.testing.assert_array_equal(t5.bucket_table(), t5.buckets(np.arange(-40, 41)))


# --- RoPE scaling specs ---------------------------------------------------------------

HF_DICTS = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024,
     "beta_fast": 16.0, "mscale": 1.0, "mscale_all_dim": 0.5},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 1024},
    {"rope_type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0],
     "long_factor": [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0],
     "original_max_position_embeddings": 512, "factor": 8.0},
]  # fmt: skip


@pytest.mark.parametrize("data", HF_DICTS, ids=[d["rope_type"] for d in HF_DICTS])
def test_a_hugging_face_rope_dict_gives_hugging_faces_frequencies(data):
    """The dict form of a scaling is a Hugging Face ``rope_parameters``: the spec read
    from it computes what ``transformers`` computes from the same dict."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    head_dim, base, max_positions = 16, 10000.0, 4096
    # Hugging Face's "dynamic" reads L0 from max_position_embeddings; posenc's spec names it.
    extra = (
        {"original_max_position_embeddings": max_positions}
        if data["rope_type"] == "dynamic"
        else {}
    )
    spec, _ = posenc.core.rope.as_rope_scaling({**data, **extra})
    config = transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rope_parameters={**data, "rope_theta": base},
    )
    expected, attention = ROPE_INIT_FUNCTIONS[data["rope_type"]](config, torch.device("cpu"))
    ours, our_attention = spec.frequencies(head_dim, base)
    # Hugging Face computes in float32: agreement to float32 rounding.
    np.testing.assert_allclose(ours, expected.double().numpy(), rtol=2e-7, atol=0)
    assert our_attention == pytest.approx(attention, rel=1e-7)
    assert spec.to_dict()["rope_type"] == (
        "dynamic_ntk" if data["rope_type"] == "dynamic" else data["rope_type"]
    )


def test_scaling_dicts_keep_only_what_differs_from_the_defaults():
    yarn = posenc.YarnScaling(factor=4, original_max_position_embeddings=2048, beta_fast=32)
    assert yarn.to_dict() == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 2048,
    }
    assert posenc.core.rope.as_rope_scaling(yarn.to_dict())[0] == yarn
    assert posenc.core.rope.as_rope_scaling({"type": "linear", "factor": 2})[0] == (
        posenc.LinearScaling(factor=2.0)
    )
    with pytest.raises(ValueError, match="rope_type='linear' and type='yarn'; give one"):
        posenc.core.rope.as_rope_scaling({"rope_type": "linear", "type": "yarn", "factor": 2})
    with pytest.raises(ValueError, match="needs 'rope_type'"):
        posenc.core.rope.as_rope_scaling({"factor": 2.0})
    with pytest.raises(
        ValueError,
        match=r"mscale must be a finite real number > -10 at factor=2\.71828 .* got -11\.0",
    ):
        posenc.YarnScaling(factor=np.e, original_max_position_embeddings=64, mscale=-11.0, mscale_all_dim=1.0)  # fmt: skip


def test_length_dependent_specs_use_each_calls_own_length():
    # Hugging Face's rule L = max(position) + 1, with no state between calls: the length
    # past the original, else the original (dynamic NTK); LongRoPE's one long length.
    dynamic = posenc.DynamicNTKScaling(factor=2.0, original_max_position_embeddings=64)
    assert dynamic.length_dependent
    assert dynamic.switch_length is None
    lengths = [10, 80, 70, 200, 30, 64, 65]
    assert [dynamic.scaled_length(n) for n in lengths] == [64, 80, 70, 200, 64, 64, 65]
    longrope = SPECS[5].scaling
    assert [longrope.scaled_length(n) for n in (10, 32, 33, 500)] == [32, 32, 33, 33]
    assert longrope.switch_length == 32
    linear = posenc.LinearScaling(factor=2.0)
    assert not linear.length_dependent
    assert linear.switch_length is None
    assert linear.scaled_length(500) == 0
    with pytest.raises(TypeError, match="does not depend on the sequence length"):
        posenc.LinearScaling(factor=2.0).frequencies(8, seq_len=100)


# --- the registries -------------------------------------------------------------------


def test_the_scheme_registry():
    assert list(SCHEMES) == [
        "nope", "learned", "sinusoidal", "sinusoidal_nd", "rope", "xpos", "axial_rope",
        "alibi", "t5", "kerple", "fire", "sandwich", "cope",
    ]  # fmt: skip
    for name, scheme in SCHEMES.items():
        assert scheme.name == name
        assert scheme.spec.scheme == name
    assert scheme_names(table=True) == ("nope", "sinusoidal", "rope", "alibi", "t5")
    assert scheme_names(bench=True) == (
        "nope", "learned", "sinusoidal", "rope", "alibi", "t5", "kerple", "fire", "sandwich",
        "cope",
    )  # fmt: skip
    assert bench_schemes() == (
        "nope", "learned", "sinusoidal", "rope", "p_rope", "rope_learned", "alibi", "t5",
        "kerple", "kerple_power", "fire", "sandwich", "cope",
    )  # fmt: skip
    assert [bench_family(name).name for name in ("p_rope", "kerple_power", "cope")] == [
        "rope", "kerple", "cope",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="scheme must be one of"):
        bench_family("xpos")  # registered, but not for the bench
    assert scheme_names(role="qk") == ("rope", "xpos", "axial_rope")
    with pytest.raises(ValueError, match="role must be one of"):
        scheme_names(role="bias")
    from posenc import plot

    offered = {name for scheme in SCHEMES.values() for name in scheme.plots}
    assert offered <= set(plot.PLOTS)


def test_a_spec_subclass_keeps_its_parents_scheme_and_a_name_has_one_spec():
    from dataclasses import dataclass

    @dataclass(frozen=True, kw_only=True)
    class TaggedAlibi(AlibiSpec):  # a user's subclass: same scheme, one more field
        tag: str = ""

    assert SchemeSpec.from_dict({"scheme": "alibi", "num_heads": 4}) == AlibiSpec(num_heads=4)
    tagged = TaggedAlibi.from_dict({"scheme": "alibi", "num_heads": 4, "tag": "x"})
    assert tagged == TaggedAlibi(num_heads=4, tag="x")
    with pytest.raises(ValueError, match="TaggedAlibi.from_dict got a spec of scheme 't5'"):
        TaggedAlibi.from_dict({"scheme": "t5", "num_heads": 4})

    @dataclass(frozen=True, kw_only=True)
    class RenamedAlibi(AlibiSpec):  # a subclass with a scheme of its own reads only that
        scheme = "renamed_alibi"

    try:
        with pytest.raises(ValueError, match="RenamedAlibi.from_dict got a spec of scheme"):
            RenamedAlibi.from_dict({"scheme": "alibi", "num_heads": 4})
        renamed = SchemeSpec.from_dict({"scheme": "renamed_alibi", "num_heads": 4})
        assert type(renamed) is RenamedAlibi
        assert renamed.to_dict()["scheme"] == "renamed_alibi"
    finally:
        from posenc.specs.base import _SPEC_CLASSES

        del _SPEC_CLASSES["renamed_alibi"]
    with pytest.raises(ValueError, match="scheme 'alibi' has a spec already: AlibiSpec"):

        class OtherAlibi(SchemeSpec):
            scheme = "alibi"


def test_the_scaling_registry_is_in_hugging_faces_order_of_ours():
    assert list(posenc.ROPE_SCALING_SPECS) == [
        "default", "linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope", "proportional",
    ]  # fmt: skip
    assert list(posenc.ROPE_SCALINGS) == list(posenc.ROPE_SCALING_SPECS)


# --- from_spec ------------------------------------------------------------------------


def test_torch_modules_are_made_from_their_specs():
    pt = pytest.importorskip("posenc.torch")
    rope = RopeSpec(
        head_dim=16, scaling=posenc.YarnScaling(factor=2.0, original_max_position_embeddings=32)
    )
    module = pt.RotaryEmbedding.from_spec(rope, max_length=64, qk_layout="bshd")
    assert module.spec == rope
    assert (module.max_length, module.qk_layout) == (64, "bshd")
    for spec, cls in [
        (SPECS[0], pt.SinusoidalPositionalEncoding),
        (SPECS[1], pt.SinusoidalPositionalEncodingND),
        (SPECS[2], pt.LearnedPositionalEmbedding),
        (SPECS[3], pt.NoPositionalEncoding),
        (SPECS[6], pt.XPosRotaryEmbedding),
        (SPECS[7], pt.AxialRotaryEmbedding),
        (SPECS[8], pt.ALiBiBias),
        (SPECS[9], pt.T5RelativeBias),
    ]:
        assert cls.from_spec(spec).spec == spec
    with pytest.raises(TypeError, match="takes a RopeSpec, got"):
        pt.RotaryEmbedding.from_spec(AlibiSpec(num_heads=2))
    with pytest.raises(TypeError, match=r"\['base'\] are given by the spec already"):
        pt.RotaryEmbedding.from_spec(rope, base=10.0)


def test_keras_layers_are_made_from_their_specs():
    pytest.importorskip("keras")
    pk = pytest.importorskip("posenc.keras")
    rope = RopeSpec(head_dim=16, rotary_dim=8, layout="interleaved", scaling="default")
    layer = pk.RotaryEmbedding.from_spec(rope, max_length=32)
    x = np.ones((1, 4, 2, 16), np.float32)
    assert layer(x).shape == (1, 4, 2, 16)
    assert layer.spec == rope
    sinusoidal = pk.SinusoidalPositionalEncoding.from_spec(SPECS[0], max_length=8)
    out = np.asarray(sinusoidal(np.zeros((1, 3, 10), np.float32)))
    np.testing.assert_array_equal(out[0], SPECS[0].table(3, fmt="float32"))
    assert pk.ALiBiBias.from_spec(SPECS[8]).spec == SPECS[8]
    assert pk.T5RelativeBias.from_spec(SPECS[9]).spec == SPECS[9]
    fresh = pk.SinusoidalPositionalEncoding.from_spec(SPECS[0])
    with pytest.raises(ValueError, match="made for d_model=10, but the input's last axis is 12"):
        fresh(np.zeros((1, 3, 12), np.float32))


# --- the out-of-range policy ----------------------------------------------------------


def test_tables_grow_doubling_and_fall_back_to_what_is_needed():
    assert [grown_length(end, 100) for end in (50, 100, 101, 150, 201, 10**6)] == [
        100, 100, 200, 200, 201, 10**6,
    ]  # fmt: skip
    built: list[int] = []

    def build(limit: int):
        def make(length: int) -> int:
            built.append(length)
            if length > limit:
                raise MemoryLimitError("over the memory limit")
            return length

        return make

    assert grow(build(10**9), 101, 100) == 200  # doubled
    assert grow(build(150), 120, 100) == 120  # doubling refused: what the call needs
    assert grow(build(110), 120, 100) is None  # both refused: the call's rows directly
    assert built == [200, 200, 120, 200, 120]

    def broken(length: int) -> int:  # any other error is not a refusal: it propagates
        raise ValueError("not a memory limit")

    with pytest.raises(ValueError, match="not a memory limit"):
        grow(broken, 120, 100)
    with pytest.raises(MemoryLimitError, match=r"table would need about 1\.9 TiB"):
        posenc.sinusoidal(10**9, 512)


def test_flax_bias_modules_are_made_from_their_specs():
    pytest.importorskip("flax")
    import jax

    from posenc.jax import linen

    alibi = linen.ALiBiBias.from_spec(SPECS[8], max_length=16)
    np.testing.assert_array_equal(
        np.asarray(alibi.apply({}, 3, 5, offset=2)), SPECS[8].bias(3, 5, offset=2)
    )
    t5 = linen.T5RelativeBias.from_spec(SPECS[9])
    variables = t5.init(jax.random.PRNGKey(0), 4)
    weights = np.asarray(variables["params"]["relative_attention_bias"])
    np.testing.assert_array_equal(
        np.asarray(t5.apply(variables, 4)),
        posenc.t5_bias(weights, 4, bidirectional=False, max_distance=40, compat="exact"),
    )
