"""Every rotary module the installed ``transformers`` has, patched right or refused by name.

``patch`` takes any module whose class name ends in ``RotaryEmbedding`` (a vision
encoder's aside). Here every such class of the installed ``transformers`` is built from
its config class's defaults, and ``ExactRotaryEmbedding`` of it either refuses with a
``ValueError`` naming the class, or returns what the module returns, in its own form
(halves, interleaved, one column per pair, complex), shape and dtype, equal element by
element at positions 0..15 within float32's rounding of Hugging Face's formula (the
bound below: not ``torch.equal``, since Hugging Face rounds its inverse frequencies and
angles to float32 and posenc rounds the exact value once; the largest difference seen
is 9.5e-7, below 2**-20). Then a tiny causal model of each family whose rotary module
differs from Llama's (``hf_models.FAMILIES``) runs patched: the same logits as unpatched
at positions 0..15 and the same greedy tokens.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from hf_models import FAMILIES, SMALL, TINY

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from posenc import rope_frequencies  # noqa: E402
from posenc.integrations.transformers import (  # noqa: E402
    ExactRotaryEmbedding,
    patch,
    rotary_modules,
    unpatch,
)

POSITIONS = 16  # 0..15
LOGITS_TOLERANCE = 1e-5  # patched against unpatched logits at positions 0..15


def rotary_classes() -> dict[str, str]:
    """Every rotary module class of the installed transformers (a vision encoder's
    aside, as ``rotary_modules`` leaves them): class name -> its modeling module."""
    root = Path(transformers.__file__).parent / "models"
    found = {}
    for path in sorted(root.glob("*/modeling_*.py")):
        for name in re.findall(r"^class (\w+RotaryEmbedding)\(", path.read_text(), re.M):
            if "Vision" not in name:
                found[name] = f"transformers.models.{path.parent.name}.{path.stem}"
    return found


ROTARY_CLASSES = rotary_classes()
# Defaults that do not build the module: the arguments that do.
CONFIG_ARGUMENTS = {
    "CohereCompassRotaryEmbedding": {
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}
    },
}
# What patch must not refuse (the families of FAMILIES and of test_transformers.py).
PATCHED = {
    "LlamaRotaryEmbedding", "MistralRotaryEmbedding", "Qwen2RotaryEmbedding",
    "Qwen3RotaryEmbedding", "Phi3RotaryEmbedding", "GPTNeoXRotaryEmbedding",
    "Gemma3RotaryEmbedding", "Gemma4TextRotaryEmbedding", "Llama4TextRotaryEmbedding",
    "DeepseekV2RotaryEmbedding", "DeepseekV3RotaryEmbedding", "DeepseekV4RotaryEmbedding",
    "CohereRotaryEmbedding", "Cohere2RotaryEmbedding", "Cohere2MoeRotaryEmbedding",
    "GptOssRotaryEmbedding", "JetMoeRotaryEmbedding", "Lfm3RotaryEmbedding",
    "MoshiRotaryEmbedding", "Ministral3RotaryEmbedding", "BeamRotaryEmbedding",
    "Zamba2RotaryEmbedding", "Qwen2VLRotaryEmbedding", "Qwen3VLTextRotaryEmbedding",
}  # fmt: skip
FORMS = {  # the forms of the families that are not Llama's
    "CohereRotaryEmbedding": "interleaved", "Cohere2RotaryEmbedding": "interleaved",
    "Cohere2MoeRotaryEmbedding": "interleaved", "GptOssRotaryEmbedding": "pairs",
    "DeepseekV4RotaryEmbedding": "pairs", "Llama4TextRotaryEmbedding": "complex",
    "DeepseekV2RotaryEmbedding": "complex", "LlamaRotaryEmbedding": "half",
}  # fmt: skip


def build(name: str) -> torch.nn.Module:
    """The rotary module ``name`` built from its config class's defaults (or the first
    of its sub-configs that builds it)."""
    module = importlib.import_module(ROTARY_CLASSES[name])
    cls = getattr(module, name)
    parameter = list(inspect.signature(cls.__init__).parameters.values())[1]
    config_class = parameter.annotation
    if isinstance(config_class, str):
        config_class = eval(config_class, vars(module))  # the module's own annotation
    config = config_class(**CONFIG_ARGUMENTS.get(name, {}))
    candidates = [config, config.get_text_config()]
    candidates += [getattr(config, key) for key in getattr(config, "sub_configs", {})]
    errors = []
    for candidate in candidates:
        try:
            return cls(candidate)
        except Exception as exc:  # another sub-config may be the one
            errors.append(f"{type(candidate).__name__}: {exc!r}")
    raise AssertionError(f"{name} builds from none of its configs: {errors}")


def float32_bound(angles: np.ndarray, attention: float, values: np.ndarray) -> np.ndarray:
    """How far Hugging Face's float32 (cos, sin) may be from the exact one, per element:
    its inverse frequency (to 4 half-ulps: a power and a division) and the product by
    the position (half an ulp) move the angle by up to ``2**-21 · angle``, and cos or
    sin, the attention factor's product and posenc's rounding add 3 ulp."""
    ulp = np.spacing(np.abs(values).astype(np.float32)).astype(np.float64)
    return attention * angles * 2.0**-21 + 3 * ulp


def angles_of(exact: ExactRotaryEmbedding, layer_type: str | None, positions: torch.Tensor):
    """The exact angles ``(1, seq, columns)`` of each column in the module's form, and
    the attention factor; M-RoPE: at the largest of a token's positions (a bound)."""
    if exact.mrope is not None:
        inv_freq, attention = rope_frequencies(exact.mrope.head_dim, exact.mrope.base), 1.0
    else:
        spec = exact.ropes["all" if layer_type is None else layer_type].spec
        inv_freq, attention = spec.frequencies()
    pairs = len(inv_freq)
    pair = {
        "half": np.arange(2 * pairs) % pairs,
        "interleaved": np.arange(2 * pairs) // 2,
    }.get(exact.form, np.arange(pairs))
    position = positions.reshape(-1, positions.shape[-1]).max(0).values.double().numpy()
    return (position[:, None] * inv_freq[pair])[None], attention


def parts(output):
    if isinstance(output, torch.Tensor):
        return output.real, output.imag
    return output


def patched_or_refused(original):
    """``(ExactRotaryEmbedding(original), "")``, or ``(None, its refusal)``."""
    try:
        return ExactRotaryEmbedding(original), ""
    except ValueError as exc:
        return None, str(exc)


@pytest.mark.parametrize("name", sorted(ROTARY_CLASSES))
def test_every_rotary_module_is_given_exactly_or_refused_by_name(name):
    original = build(name)
    exact, refusal = patched_or_refused(original)
    if exact is None:
        assert name not in PATCHED, refusal
        assert name in refusal
        return
    assert exact.form == FORMS.get(name, exact.form)
    kinds = original.rope_type if isinstance(getattr(original, "rope_type", None), dict) else {}
    positions = torch.arange(POSITIONS)[None]
    if exact.mrope is not None:  # (3, 1, 16): each axis at its own positions
        positions = torch.stack([positions * (1 + a) % POSITIONS for a in range(3)])
    for layer_type in list(kinds) or [None]:
        args = () if layer_type is None else (layer_type,)
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.zeros(1, dtype=dtype)
            with torch.no_grad():
                theirs, mine = original(x, positions, *args), exact(x, positions, *args)
            assert type(mine) is type(theirs) or isinstance(theirs, (tuple, list))
            for a, b in zip(parts(theirs), parts(mine), strict=True):
                assert (a.shape, a.dtype) == (b.shape, b.dtype), (name, layer_type, dtype)
        angles, attention = angles_of(exact, layer_type, positions)
        with torch.no_grad():
            theirs = original(torch.zeros(1), positions, *args)
            mine = exact(torch.zeros(1), positions, *args)
        for a, b in zip(parts(theirs), parts(mine), strict=True):
            a, b = a.double().numpy(), b.double().numpy()
            bound = float32_bound(angles, attention, a)
            assert np.all(np.abs(a - b) <= bound), (name, layer_type, float(np.abs(a - b).max()))


@pytest.fixture(
    scope="module", params=sorted(n for n in FAMILIES if hasattr(transformers, FAMILIES[n][0]))
)
def family(request):
    """(name, a tiny model of the family, seeded)."""
    model_class, config_class, arguments, _ = FAMILIES[request.param]
    config = getattr(transformers, config_class)(**{**TINY, **arguments})
    torch.manual_seed(0)
    return request.param, getattr(transformers, model_class)(config).eval()


def test_each_family_runs_patched_with_its_own_logits_and_tokens(family):
    """The whole model patched: its logits at positions 0..15 within 1e-5 of the
    unpatched model's (Cohere's were 2e-4 to 4e-4 apart with the half layout), and the
    same greedy tokens with the model's own cache (GPT-OSS, JetMoe, LFM3, Moshi,
    DeepSeek-V2 and -V4 failed there)."""
    name, model = family
    ids = torch.randint(2, 128, (2, POSITIONS), generator=torch.Generator().manual_seed(1))
    settings = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        logits = model(ids).logits
        tokens = model.generate(ids[:, :5], **settings)
        patch(model)
        try:
            assert all(isinstance(m, ExactRotaryEmbedding) for _, m in rotary_modules(model))
            patched = model(ids).logits
            patched_tokens = model.generate(ids[:, :5], **settings)
        finally:
            unpatch(model)
    error = float((patched - logits).abs().max())
    assert error < LOGITS_TOLERANCE, (name, error)
    assert torch.equal(patched_tokens, tokens), name


def tiny_llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(**{**SMALL, "num_hidden_layers": 1})
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_what_a_module_holds_or_computes_otherwise_is_refused_before_anything_is_replaced():
    """The module compared with posenc's tables is the one in the model: its config
    changed after it was built (its own frequencies are the old ones), or a learned
    parameter (Mistral Large 3's ``alpha``, which the checkpoint sets and patching would
    drop), is refused naming it, and the model keeps every module."""
    model = tiny_llama()
    before = dict(rotary_modules(model))
    model.config.rope_parameters["rope_theta"] = 1e6  # the module was built with 1e4
    with pytest.raises(ValueError, match="LlamaRotaryEmbedding: its output differs from that of"):
        patch(model)
    assert dict(rotary_modules(model)) == before
    model = tiny_llama()
    model.model.rotary_emb.alpha = torch.nn.Parameter(torch.zeros(32))
    with pytest.raises(ValueError, match=r"holds state of its own \(alpha\)"):
        patch(model)
    assert not isinstance(model.model.rotary_emb, ExactRotaryEmbedding)


def test_a_module_of_other_angles_or_of_another_output_is_refused_naming_where():
    """Modules of a family posenc does not know: angles other than its config's (twice
    the positions) and an output of no form posenc gives (three columns of each pair)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    class TwiceRotaryEmbedding(LlamaRotaryEmbedding):
        def forward(self, x, position_ids):
            return super().forward(x, 2 * position_ids)

    class WideRotaryEmbedding(LlamaRotaryEmbedding):
        def forward(self, x, position_ids):
            cos, sin = super().forward(x, position_ids)
            return torch.cat([cos, cos[..., :32]], -1), torch.cat([sin, sin[..., :32]], -1)

    config = tiny_llama().config
    with pytest.raises(
        ValueError,
        match=r"cannot patch TwiceRotaryEmbedding: its cos at position \d+, column \d+ is "
        r".*float32's rounding allows 6.1e-05.*posenc read the RoPE head_dim=64, "
        r"rotary_dim=64, base=10000",
    ):
        ExactRotaryEmbedding(TwiceRotaryEmbedding(config))
    with pytest.raises(
        ValueError,
        match=r"cannot patch WideRotaryEmbedding: it returns 2 tensors \(\(1, 16, 96\) "
        r"torch.float32, .*none of the forms posenc gives for the config's rotary width 64",
    ):
        ExactRotaryEmbedding(WideRotaryEmbedding(config))


def test_a_model_cast_to_bfloat16_or_on_the_meta_device_is_patched():
    """``.bfloat16()`` rounds the module's inverse frequencies to bfloat16 (Hugging Face's
    angles then drift by up to 0.03 rad at position 15): the module is checked against a
    float32 copy built from its config, and to bfloat16's rounding as it is; patched, the
    model's cos/sin are posenc's, rounded once to bfloat16. A model built on the meta
    device is patched too and runs once materialized."""
    model = tiny_llama().bfloat16()
    assert model.model.rotary_emb.inv_freq.dtype == torch.bfloat16
    patch(model)
    rope = model.model.rotary_emb
    positions = torch.arange(POSITIONS)[None]
    cos, _ = rope(torch.zeros(1, dtype=torch.bfloat16), positions)
    expected, _ = rope.ropes["all"].cos_sin(positions, dtype=torch.bfloat16)
    assert cos.dtype == torch.bfloat16
    assert torch.equal(cos, expected)
    config = transformers.LlamaConfig(**{**SMALL, "num_hidden_layers": 1})
    with torch.device("meta"):
        meta = transformers.LlamaForCausalLM(config)
    patch(meta).to_empty(device="cpu")
    assert meta(torch.tensor([[2, 3, 4]])).logits.shape == (1, 3, 128)
    # materialized, its tables are the core's: the same as a model built on the CPU
    cos, sin = meta.model.rotary_emb(torch.zeros(1), positions)
    built = patch(transformers.LlamaForCausalLM(config)).model.rotary_emb
    want_cos, want_sin = built(torch.zeros(1), positions)
    assert torch.equal(cos, want_cos)
    assert torch.equal(sin, want_sin)


def test_the_original_modules_plain_attributes_read_through():
    """A model's code reads attributes of its rotary module (LFM3 its ``layer_types``):
    the replacement gives the original's plain values, never its tensors."""
    module = tiny_llama().model.rotary_emb
    module.layer_types = ["full_attention"]
    exact = ExactRotaryEmbedding(module)
    assert exact.layer_types == ["full_attention"]
    assert exact.original_max_seq_len == module.original_max_seq_len
    with pytest.raises(AttributeError):
        exact.inv_freq  # noqa: B018  (the original's buffer: not posenc's tables)
