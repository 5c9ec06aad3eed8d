"""The contract of the integrations and the packing helpers: any input gives the right
answer or one ``ValueError``/``TypeError`` line naming the argument.

- ``RopeSpec.from_hf_config`` on config dicts with one key made hostile, and on configs
  Hugging Face accepts, against ``transformers``' own RoPE init functions;
- ``patch``/``unpatch`` and the patched module's call on a tiny Llama's rotary module;
- ``convert_rope_state_dict`` and ``convert_rope_checkpoint``;
- the packing helpers of the core, and the PyTorch, Keras and JAX front ends, which give
  the core's numbers or its errors.
"""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract import (
    HOSTILE_VALUES,
    LIMIT_SECONDS,
    Calls,
    arguments,
    check_contract,
    hostile_values,
    plain,
)
from hf_models import SMALL
from posenc import RopeSpec
from posenc.core import packing

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from posenc.integrations.checkpoints import (  # noqa: E402
    convert_rope_checkpoint,
    convert_rope_state_dict,
)
from posenc.integrations.transformers import ExactRotaryEmbedding, patch, unpatch  # noqa: E402


def attempt(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``function``'s result, or the ``ValueError``/``TypeError`` it raised."""
    try:
        return function(*args, **kwargs)
    except (ValueError, TypeError) as exc:
        return exc


# -- RopeSpec.from_hf_config ---------------------------------------------------------

CONFIGS: dict[str, dict[str, Any]] = {
    "yarn": {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 4096,
             "rope_theta": 1e4, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 1024}},
    "llama3": {"head_dim": 64, "max_position_embeddings": 8192,
               "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 2048}},
    "linear partial": {"head_dim": 32, "partial_rotary_factor": 0.5,
                       "rope_scaling": {"type": "linear", "factor": 2.0}},
    "dynamic": {"hidden_size": 128, "num_attention_heads": 2, "max_position_embeddings": 512,
                "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
}  # fmt: skip
# Where a config key is posenc's argument under another name, the message may name that.
ALIASES = {"rope_theta": ("base",), "hidden_size": ("head_dim", "rotary_dim"),
           "num_attention_heads": ("head_dim", "rotary_dim"), "rope_scaling": ("rope_parameters", "rope_type", "RoPE scaling"),
           "rope_parameters": ("rope_type", "RoPE scaling"), "partial_rotary_factor": ("rotary_dim",),
           "head_dim": ("rotary_dim",)}  # fmt: skip
# JSON's values and NumPy scalars (a config holds no arrays), huge ints included.
CONFIG_VALUES = [*(v for v in HOSTILE_VALUES if not isinstance(v, np.ndarray)), "10", "default", {"rope_type": "nope"}, {"factor": 2.0},
                 {"rope_type": "linear"}, {"rope_type": "linear", "type": "yarn", "factor": 2.0},
                 [1, 2], 1.5, 64, 128]  # fmt: skip


def config_places(name: str) -> list[tuple[str, ...]]:
    """Every key of a config, and every key of its RoPE parameters, plus new ones."""
    config = CONFIGS[name]
    places: list[tuple[str, ...]] = [(key,) for key in config]
    places += [("head_dim",), ("rope_interleave",), ("unknown_key",)]
    for outer in ("rope_scaling", "rope_parameters"):
        if outer in config:
            places += [(outer, key) for key in config[outer]]
            places += [(outer, "type"), (outer, "rope_type"), (outer, "beta_fast"),
                       (outer, "unknown")]  # fmt: skip
    return places


def with_value(config: dict[str, Any], place: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = dict(config)
    if len(place) == 1:
        out[place[0]] = value
    else:
        out[place[0]] = {**out[place[0]], place[1]: value}
    return out


def spec_or_error(config: dict[str, Any]) -> Any:
    try:
        spec = RopeSpec.from_hf_config(config)
        return spec, spec.frequencies()
    except (ValueError, TypeError) as exc:
        return exc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_from_hf_config_reads_right_or_refuses_clearly(data):
    name = data.draw(st.sampled_from(sorted(CONFIGS)), label="config")
    place = data.draw(st.sampled_from(config_places(name)), label="key")
    value = data.draw(st.sampled_from(CONFIG_VALUES), label="value")
    start = time.perf_counter()
    outcome = spec_or_error(with_value(CONFIGS[name], place, value))
    key = place[-1]
    if isinstance(outcome, Exception):
        message = str(outcome)
        assert "\n" not in message.strip(), message
        names = (
            key,
            *ALIASES.get(key, ()),
            *(ALIASES.get(place[0], ()) if key in ("type", "rope_type") else ()),
        )
        assert any(word in message for word in names) or "rope_type" in message, (
            f"{name} {place}={value!r}: {message}"
        )
    else:
        spec, (inv_freq, factor) = outcome
        assert np.all(np.isfinite(inv_freq)), (place, value)
        assert math.isfinite(factor), (place, value)
        reference = spec_or_error(with_value(CONFIGS[name], place, plain(value)))
        assert not isinstance(reference, Exception), (place, value, reference)
        assert reference[0] == spec, (place, value)
    assert time.perf_counter() - start < LIMIT_SECONDS


@pytest.mark.parametrize(
    ("place", "value", "words"),
    [
        (("rope_scaling", "factor"), "4", "factor"),
        (("rope_scaling", "factor"), math.nan, "factor"),
        (("rope_scaling", "type"), "linear", "rope_type"),  # both, and they differ
        (("rope_scaling", "rope_type"), "su", "rope_type"),
        (("rope_scaling", "unknown"), 1.0, "unknown"),
        (("partial_rotary_factor",), 1.5, "partial_rotary_factor"),
        (("partial_rotary_factor",), 0.0, "partial_rotary_factor"),
        (("head_dim",), -64, "head_dim"),
        (("head_dim",), True, "head_dim"),
        (("num_attention_heads",), 0, "num_attention_heads"),
        (("rope_theta",), -1.0, "base"),
        (("rope_scaling",), [1, 2], "rope_scaling must be a dict"),
    ],
)
def test_from_hf_config_refuses_a_bad_key_by_name(place, value, words):
    with pytest.raises((ValueError, TypeError), match=words):
        RopeSpec.from_hf_config(with_value(CONFIGS["yarn"], place, value))


def test_from_hf_config_refuses_a_huge_head_dim_by_name():
    with pytest.raises(ValueError, match="head_dim must be at most 2"):
        RopeSpec.from_hf_config({"head_dim": 10**400})
    with pytest.raises(ValueError, match="hidden_size // num_attention_heads must be at most"):
        RopeSpec.from_hf_config({"hidden_size": 2**1100, "num_attention_heads": 2})


def hf_reference(config: Any) -> tuple[np.ndarray, float]:
    """transformers' ``(inv_freq, attention_scaling)`` of a Llama config."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    kind = config.rope_parameters["rope_type"]
    if kind == "default":
        inv_freq, attention = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        inv_freq, attention = ROPE_INIT_FUNCTIONS[kind](config, None)
    return inv_freq.double().numpy(), float(attention)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["default", "linear", "dynamic", "yarn", "llama3"]),
    theta=st.sampled_from([100.0, 1e4, 5e5, 1e6]),
    heads=st.sampled_from([2, 4, 8]),
    factor=st.sampled_from([1.5, 2.0, 4.0, 8.0, 40.0]),
    original=st.sampled_from([256, 1024, 4096]),
)
def test_from_hf_config_gives_transformers_frequencies(kind, theta, heads, factor, original):
    """Configs transformers accepts: posenc's frequencies and attention factor are
    transformers' (its float32 formulas, to float32's rounding)."""
    parameters: dict[str, Any] = {"rope_type": kind, "rope_theta": theta}
    if kind != "default":
        parameters["factor"] = factor
    if kind in ("yarn", "llama3"):
        parameters["original_max_position_embeddings"] = original
    if kind == "llama3":
        parameters.update(low_freq_factor=1.0, high_freq_factor=4.0)
    config = transformers.LlamaConfig(
        **{**SMALL, "num_attention_heads": heads}, max_position_embeddings=4 * original,
        rope_parameters=parameters,
    )  # fmt: skip
    inv_freq, attention = RopeSpec.from_hf_config(config).frequencies()
    expected, expected_attention = hf_reference(config)
    # transformers' float32 chain (llama3's smoothing is five operations): ~16 float32 ulp
    np.testing.assert_allclose(inv_freq, expected, rtol=2e-6, atol=0)
    assert attention == pytest.approx(expected_attention, rel=1e-6)


# -- patch, unpatch and the patched module ---------------------------------------------


@pytest.fixture(scope="module")
def llama():
    config = transformers.LlamaConfig(**{**SMALL, "num_hidden_layers": 1},
                                      max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("function", [patch, unpatch])
@pytest.mark.parametrize("value", [*HOSTILE_VALUES[::3], torch.nn.Linear(2, 2)])
def test_patch_and_unpatch_refuse_what_is_not_a_model_by_name(function, value):
    error: Exception | None = None
    try:
        function(value)
    except (ValueError, TypeError) as exc:
        error = exc
    if error is not None:
        assert "model" in str(error) or "Linear" in str(error), str(error)
    else:  # only unpatch of a module without rotary modules does nothing
        assert function is unpatch
        assert isinstance(value, torch.nn.Module)


CALL_VALUES = [
    torch.tensor([[0, 1, 2]]), torch.tensor([0, 1, 2]), torch.tensor([[0, 1, 2]], dtype=torch.int8),
    torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([[True, False, True]]), torch.tensor([[-1, 0, 1]]),
    torch.tensor([[2**62, 0, 1]]), torch.zeros(1, 1, 3, dtype=torch.int64), torch.tensor(3),
    torch.ones(1, 3, 4, dtype=torch.int64), torch.ones(1, 3, 4, dtype=torch.complex64),
    *HOSTILE_VALUES[::4],
]  # fmt: skip


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argument=st.sampled_from(["x", "position_ids", "layer_type"]), data=st.data())
def test_the_patched_module_answers_right_or_refuses_clearly(llama, argument, data):
    module = ExactRotaryEmbedding(llama.model.rotary_emb)
    value = data.draw(st.sampled_from(CALL_VALUES), label="value")
    given = {"x": torch.ones(1, 3, 4), "position_ids": torch.tensor([[0, 1, 2]]),
             "layer_type": None, argument: value}  # fmt: skip
    result = attempt(module, **given)
    if isinstance(result, Exception):
        message = str(result)
        assert "\n" not in message.strip(), message
        assert argument in message or (argument == "position_ids" and "positions" in message), (
            f"{argument}={value!r}: {message}"
        )
        return
    cos, sin = result
    positions = given["position_ids"]
    positions = positions if positions.dim() == 2 else positions[None]
    expected = module.ropes["all"].cos_sin(positions.to(torch.int64), dtype=given["x"].dtype)
    assert torch.equal(cos, expected[0])
    assert torch.equal(sin, expected[1])


def test_patch_then_unpatch_gives_the_original_module_back(llama):
    original = llama.model.rotary_emb
    patch(llama)
    assert isinstance(llama.model.rotary_emb, ExactRotaryEmbedding)
    unpatch(llama)
    unpatch(llama)  # twice: nothing left to put back
    assert llama.model.rotary_emb is original


# -- checkpoints ---------------------------------------------------------------------

TENSORS = {"l.q_proj.weight": torch.arange(24.0).view(8, 3),
           "l.k_proj.weight": torch.arange(12.0).view(4, 3), "l.o.weight": torch.ones(2)}  # fmt: skip
CHECKPOINT_CALLS: Calls = {
    "convert_rope_state_dict": (
        convert_rope_state_dict, (TENSORS, {"format": "pt"}),
        {"to": "interleaved", "heads": 2, "kv_heads": 1, "head_dim": 4, "rotary_dim": 4},
    ),
}  # fmt: skip


def flat(result: Any) -> np.ndarray:
    """The converted tensors' values, one array (by sorted name) to compare whole."""
    tensors, _ = result
    return np.concatenate([tensors[key].numpy().ravel() for key in sorted(tensors)])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_convert_rope_state_dict_answers_right_or_refuses_clearly(data):
    name = "convert_rope_state_dict"
    where = data.draw(st.sampled_from(arguments(CHECKPOINT_CALLS, name)), label="argument")
    value = data.draw(hostile_values(), label="value")

    @functools.wraps(convert_rope_state_dict)  # its signature names the arguments
    def converted(*args: Any, **kwargs: Any) -> Any:
        return flat(convert_rope_state_dict(*args, **kwargs))

    calls: Calls = {name: (converted, *CHECKPOINT_CALLS[name][1:])}
    function, args, kwargs = CHECKPOINT_CALLS[name]
    try:
        check_contract(calls, name, where, value)
    except AssertionError:  # the message may name the CLI's flag (--kv-heads for kv_heads)
        argument = str(where[1]) if where[0] == "keyword" else ("tensors", "metadata")[where[1]]
        flag = "--" + argument.replace("_", "-")
        given = dict(kwargs, **({argument: value} if where[0] == "keyword" else {}))
        positional = list(args)
        if where[0] == "positional":
            positional[where[1]] = value
        error = attempt(function, *positional, **given)
        if not isinstance(error, Exception):
            raise
        message = str(error)
        assert argument in message or flag in message, message
        assert "\n" not in message.strip(), message


@pytest.mark.parametrize(
    ("tensors", "metadata", "error", "says"),
    [
        ([("l.q_proj.weight", torch.ones(8, 3))], None, TypeError, "tensors must be a dict"),
        ({1: torch.ones(2), "l.q_proj.weight": torch.ones(8, 3)}, None, TypeError, "str names"),
        ({"l.q_proj.weight": torch.tensor(1.0)}, None, TypeError, r"tensors\['l.q_proj.weight'\]"),
        ({"l.q_proj.weight": np.ones((8, 3))}, None, TypeError, r"must be a torch.Tensor"),
        ({"l.q_proj.weight": "x"}, None, TypeError, r"tensors\['l.q_proj.weight'\]"),
        ({"l.q_proj.weight": torch.ones(8, 3)}, 5, TypeError, "metadata must be None or a dict"),
        ({"l.q_proj.weight": torch.ones(8, 3)}, {"a": 1}, TypeError, "metadata must be"),
        ({"l.o.weight": torch.ones(8, 3)}, None, ValueError, "found no query/key projection"),
    ],
)
def test_convert_rope_state_dict_refuses_bad_tensors_and_metadata_by_name(
    tensors, metadata, error, says
):
    """Before: IndexError (a 0-d projection), AttributeError (a str), TypeError from
    ``dict()`` or ``sorted()``; now one line naming ``tensors`` or ``metadata``."""
    with pytest.raises(error, match=says):
        convert_rope_state_dict(tensors, metadata, to="interleaved", heads=2, kv_heads=1)


def test_convert_rope_checkpoint_refuses_bad_paths_and_flags_by_name(tmp_path):
    source = tmp_path / "in.safetensors"
    safetensors_torch.save_file(dict(TENSORS), str(source))
    options = {"to": "interleaved", "heads": 2, "kv_heads": 1}
    (tmp_path / "garbage.safetensors").write_bytes(b"not a safetensors file")
    (tmp_path / "folder").mkdir()
    cases = [
        ((None, tmp_path / "o"), {}, TypeError, "source must be a path"),
        ((source, 5), {}, TypeError, "target must be a path"),
        ((source, tmp_path / "o"), {"force": "yes"}, TypeError, "force must be a bool"),
        ((tmp_path / "missing", tmp_path / "o"), {}, ValueError, "no such file"),
        ((tmp_path / "folder", tmp_path / "o"), {}, ValueError, "no such file"),
        ((tmp_path / "garbage.safetensors", tmp_path / "o"), {}, ValueError,
         "not a readable safetensors file"),
        ((source, source), {"force": True}, ValueError, "is the input"),
        ((source, tmp_path / "." / "in.safetensors"), {"force": True}, ValueError, "is the input"),
    ]  # fmt: skip
    before = source.read_bytes()
    for paths, extra, error, says in cases:
        with pytest.raises(error, match=says):
            convert_rope_checkpoint(*paths, **{**options, **extra})
    assert source.read_bytes() == before
    assert not (tmp_path / "o").exists()
    out = convert_rope_checkpoint(os.fspath(source), tmp_path / "o", **options)
    converted = safetensors_torch.load_file(str(out))
    expected, _ = convert_rope_state_dict(dict(TENSORS), None, **options)
    assert set(converted) == set(expected)
    for key, tensor in expected.items():
        assert torch.equal(converted[key], tensor), key


# -- packing ---------------------------------------------------------------------------

PACKING_CALLS: Calls = {
    "positions_from_cu_seqlens": (packing.positions_from_cu_seqlens, (np.array([0, 2, 5]),), {}),
    "positions_from_document_ids": (packing.positions_from_document_ids, ([[1, 1, 2]],), {}),
    "positions_from_attention_mask": (packing.positions_from_attention_mask, ([[0, 1, 1]],), {}),
    "mrope_positions": (packing.mrope_positions, ([[0, 1, 1, 1, 1, 0]],),
                        {"image_grids": [[1, 4, 4]], "spatial_merge_size": 2,
                         "attention_mask": [[1, 1, 1, 1, 1, 1]]}),
    "mrope_positions (videos)": (
        packing.mrope_positions, ([[2, 2, 0, 2, 2]],),
        {"video_grids": [[2, 2, 4]], "tokens_per_second": 25, "second_per_grid_ts": [0.5],
         "split_video_frames": True, "spatial_merge_size": 2}),
}  # fmt: skip
PACKING_VALUES = [
    [0, 3, 2], [0, -1], [[0, 1], [0, 2]], np.zeros((2, 2, 2), np.int64), [0, 10**12], [0, 2**62],
    [True, False], [[True, False]], [[1, 2], [3]], np.array([0.0, 2.0]), [], [[]], [2**64],
    [[1, 4, 4], [1, 2, 2]], [[1, 2**40, 2**40]], [[0, 4, 4]], [[1, 3, 4]], [[2**62, 2, 2]],
    [[2, 2, 4], [2, 2, 4]], [[0, 1, 1, 1, 1]], [[0, 3]], [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]],
]  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_packing_helper_answers_right_or_refuses_clearly(data):
    name = data.draw(st.sampled_from(sorted(PACKING_CALLS)), label="function")
    where = data.draw(st.sampled_from(arguments(PACKING_CALLS, name)), label="argument")
    value = data.draw(st.sampled_from(HOSTILE_VALUES + PACKING_VALUES), label="value")
    check_contract(
        PACKING_CALLS, name, where, value, limit_words=("limit",),
        checked_elsewhere=("mrope_positions", "mrope_positions (videos)")
        if where == ("positional", 0) else (),
    )  # fmt: skip


def front_ends() -> dict[str, Any]:
    """Each front end's packing module, and what it makes of a NumPy argument."""
    import jax.numpy as jnp

    from posenc.jax import packing as jax_packing
    from posenc.keras import packing as keras_packing
    from posenc.torch import packing as torch_packing

    def to_torch(value: Any) -> Any:
        try:
            array = np.asarray(value)
        except ValueError:  # ragged
            return value  # what torch cannot hold: the front end's own type error
        if array.size == 0 and array.ndim:  # [] and [[]]: the core reads them as ints
            array = array.astype(np.int64)
        if array.dtype.kind in "iub" and array.dtype != np.uint64:
            return torch.from_numpy(np.ascontiguousarray(array))
        return value

    return {
        "torch": (torch_packing, to_torch),
        "jax": (jax_packing, lambda v: jnp.asarray(v) if _regular(v) else v),
        "keras": (keras_packing, lambda v: v),
    }


def _regular(value: Any) -> bool:
    """Whether ``value`` is an array of integers or bools within int32 (what every front
    end's own array type holds)."""
    try:
        array = np.asarray(value)
    except ValueError:
        return False
    if array.size == 0:
        return True
    if array.dtype.kind not in "iub" or array.dtype == np.uint64:
        return False
    return not array.size or int(np.abs(array.astype(np.int64)).max()) < 2**31


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_front_ends_give_the_cores_packing_answers_or_its_errors(data):
    """One formula: every front end gives the core's numbers (in its integer dtype) or
    refuses with the core's message."""
    ends = front_ends()
    end = data.draw(st.sampled_from(sorted(ends)), label="front end")
    name = data.draw(st.sampled_from(sorted(PACKING_CALLS)), label="function")
    module, convert = ends[end]
    function = getattr(module, name.split(" ")[0])
    _, args, kwargs = PACKING_CALLS[name]
    value = data.draw(st.sampled_from([*PACKING_VALUES, args[0]]), label="first argument")
    expected = attempt(PACKING_CALLS[name][0], value, **kwargs)
    result = attempt(function, convert(value), **kwargs)
    if isinstance(result, Exception):
        assert isinstance(expected, Exception), (end, name, value, result)
        assert "\n" not in str(result).strip(), str(result)
        return
    assert not isinstance(expected, Exception), (end, name, value, expected)
    for mine, theirs in zip(result if isinstance(result, tuple) else (result,),
                            expected if isinstance(expected, tuple) else (expected,),
                            strict=True):  # fmt: skip
        assert np.array_equal(np.asarray(mine), theirs), (end, name, value)


def test_cu_seqlens_past_the_memory_limit_is_refused_before_allocating():
    """Before: MemoryError from NumPy (7.3 TiB); now the limit, naming cu_seqlens."""
    with pytest.raises(ValueError, match="cu_seqlens ending at 1000000000000"):
        packing.positions_from_cu_seqlens([0, 10**12])


def test_grids_left_over_are_refused_not_ignored():
    """Before: a grid no run of tokens took was silently ignored."""
    with pytest.raises(ValueError, match="image_grids has more grids than token_types"):
        packing.mrope_positions([[0, 1, 1, 1, 1]], image_grids=[[1, 4, 4], [1, 2, 2]])
    with pytest.raises(ValueError, match="video_grids has more grids"):
        packing.mrope_positions([[2]], video_grids=[[2, 2, 2]], split_video_frames=True)


def test_a_video_of_many_frames_is_split_lazily():
    """Before: T = 2**62 frames became a list of 2**62 grids (the process killed)."""
    start = time.perf_counter()
    with pytest.raises(ValueError, match="video_grids has more grids"):
        packing.mrope_positions([[2]], video_grids=[[2**62, 2, 2]], split_video_frames=True)
    assert time.perf_counter() - start < 1


def test_a_boolean_mask_list_reads_as_ones_and_zeros():
    """Before: a NumPy bool array was taken and a list of bools refused."""
    expected = packing.positions_from_attention_mask([[0, 1, 1], [1, 1, 0]])
    got = packing.positions_from_attention_mask([[False, True, True], [True, True, False]])
    assert np.array_equal(got, expected)


def test_jax_positions_past_int32_are_refused_not_wrapped():
    """Before: JAX without x64 wrapped a time position of 3e9 to -1294967296."""
    import jax

    from posenc.jax import packing as jax_packing

    options = {"video_grids": [[4, 2, 2]], "spatial_merge_size": 2, "tokens_per_second": 1e9}
    expected, _ = packing.mrope_positions([[2, 2, 2, 2]], **options)
    if jax.dtypes.canonicalize_dtype(np.int64) == np.dtype(np.int64):  # x64 on
        got, _ = jax_packing.mrope_positions([[2, 2, 2, 2]], **options)
        assert np.array_equal(np.asarray(got), expected)
    else:
        with pytest.raises(ValueError, match="past int32"):
            jax_packing.mrope_positions([[2, 2, 2, 2]], **options)
    with pytest.raises(TypeError, match="token_types must be an array of integers"):
        jax_packing.mrope_positions([[0, 1], [0]])  # ragged: the core's message


def test_torch_packing_refuses_meta_and_reads_bfloat16_by_name():
    from posenc.torch import packing as torch_packing

    with pytest.raises(ValueError, match="cu_seqlens is on the meta device"):
        torch_packing.positions_from_cu_seqlens(torch.empty(3, dtype=torch.int64, device="meta"))
    with pytest.raises(TypeError, match="cu_seqlens must hold integers"):
        torch_packing.positions_from_cu_seqlens(torch.tensor([0.0, 2.0]).bfloat16())
