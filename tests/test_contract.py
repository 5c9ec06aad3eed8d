"""The contract, as a property: any input either gives the right answer or a
``ValueError``/``TypeError`` that names the argument, within seconds and bounded memory;
the CLI exits 0, or 2 with one line and no traceback.

Each example takes one public function with arguments that work, replaces one of them
by a hostile value (NumPy scalar types, 0-d and non-contiguous arrays, narrow and
unsigned integers, huge and tiny floats, NaN/inf, empty sequences, wrong types) and
calls it. A call that succeeds must give the same result as the call with the value
turned into the plain Python or NumPy value it stands for, or be refused; a call that
fails must raise ``ValueError`` or ``TypeError`` whose message names the argument.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import posenc
from contract import (
    LIMIT_SECONDS,
    Calls,
    arguments,
    check_contract,
    check_module_options,
    hostile_values,
    plain,
)
from posenc.cli import main

CALLS: Calls = {
    "sinusoidal": (posenc.sinusoidal, (6, 8), {"base": 100.0, "layout": "split", "dtype": "float32"}),
    "sinusoidal_nd": (posenc.sinusoidal_nd, ((3, 4), 8), {"base": 100.0}),
    "frequencies": (posenc.frequencies, (8,), {"base": 100.0}),
    "wavelengths": (posenc.wavelengths, (8,), {"base": 100.0}),
    "nope": (posenc.nope, (4, 8), {}),
    "rope_frequencies": (posenc.rope_frequencies, (8,), {"base": 100.0}),
    "rope_tables": (posenc.rope_tables, (5, np.array([1.0, 0.1])), {"scale": 1.5}),
    "rope_scaling": (posenc.rope_scaling, ("linear", 8), {"factor": 2.0}),
    "apply_rope": (
        posenc.apply_rope,
        (np.ones((3, 4)), *posenc.rope_tables(3, np.array([1.0, 0.1]), dtype="float64")),
        {"layout": "half"},
    ),
    "alibi_slopes": (posenc.alibi_slopes, (8,), {}),
    "alibi_bias": (posenc.alibi_bias, (4, 6), {"num_heads": 4, "offset": 2}),
    "relative_positions": (posenc.relative_positions, (3, 5), {"offset": 1}),
    "relative_position_bucket": (posenc.relative_position_bucket, (np.arange(-5, 5),), {"num_buckets": 8, "max_distance": 16}),
    "t5_bias": (posenc.t5_bias, (np.ones((8, 2)), 3, 4), {"max_distance": 16}),
    "layout_permutation": (posenc.layout_permutation, (6, "interleaved", "split"), {}),
    "rope_permutation": (posenc.rope_permutation, (8, "half", "interleaved"), {}),
    "xpos_scales": (posenc.xpos_scales, (4, 8), {}),
    "offset_similarity": (posenc.offset_similarity, (np.arange(4), 8), {}),
    "relative_map": (posenc.relative_map, (2, 8), {}),
    "attention_temperature": (posenc.attention_temperature, ([0, 9, 40],), {"floor_scale": 8.0, "attn_scale": 0.1}),
    "positions_from_cu_seqlens": (posenc.positions_from_cu_seqlens, (np.array([0, 2, 5]),), {}),
    "mrope_positions": (posenc.mrope_positions, ([[0, 1, 1, 1, 1]],), {"image_grids": [[1, 4, 4]], "spatial_merge_size": 2}),
    "mrope_positions (videos)": (posenc.mrope_positions, ([[2, 2, 0, 2, 2]],), {"video_grids": [[2, 2, 4]], "tokens_per_second": 25, "second_per_grid_ts": [0.5], "split_video_frames": True, "spatial_merge_size": 2}),
    "positions_from_document_ids": (posenc.positions_from_document_ids, ([[1, 1, 2]],), {}),
    "positions_from_attention_mask": (posenc.positions_from_attention_mask, ([[0, 1, 1]],), {}),
}  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_function_answers_right_or_refuses_clearly(data):
    name = data.draw(st.sampled_from(sorted(CALLS)), label="function")
    where = data.draw(st.sampled_from(arguments(CALLS, name)), label="argument")
    value = data.draw(hostile_values(), label="value")
    check_contract(CALLS, name, where, value, checked_elsewhere=("apply_rope", "rope_scaling"))


COMMANDS: dict[str, tuple[list[str], dict[str, str]]] = {
    "table sinusoidal": (
        ["table", "--scheme", "sinusoidal"],
        {"--length": "4", "--d-model": "4", "--base": "100", "--dtype": "float32",
         "--layout": "interleaved", "--format": "csv", "--precision": "4", "--start": "2",
         "--formula": "paper", "--output": "{out}/t.csv"},
    ),
    "table rope": (
        ["table", "--scheme", "rope"],
        {"--length": "4", "--head-dim": "8", "--rotary-dim": "4", "--rope-layout": "half",
         "--scaling": "yarn", "--factor": "2", "--original-max-position-embeddings": "4",
         "--scaling-param": "beta_fast=16", "--format": "json", "--dtype": "bfloat16"},
    ),
    "table alibi": (
        ["table", "--scheme", "alibi"],
        {"--length": "4", "--heads": "3", "--mode": "symmetric", "--format": "npy",
         "--output": "{out}/a.npy"},
    ),
    "table t5": (
        ["table", "--scheme", "t5"],
        {"--length": "5", "--num-buckets": "8", "--max-distance": "16", "--compat": "exact",
         "--format": "text"},
    ),
    "plot": (
        ["plot", "rope-score"],
        {"--output": "{out}/p.png", "--length": "16", "--head-dim": "8", "--base": "100",
         "--factor": "2", "--original-max-position-embeddings": "8", "--dpi": "20"},
    ),
    "plot t5": (
        ["plot", "t5"],
        {"--output": "{out}/t5.png", "--length": "8", "--num-buckets": "8",
         "--max-distance": "16", "--dpi": "20"},
    ),
    "plot alibi": (
        ["plot", "alibi"],
        {"--output": "{out}/alibi.png", "--length": "8", "--heads": "2", "--dpi": "20"},
    ),
    "embed": (["embed", "the cat"], {"--d-model": "4", "--base": "100", "--seed": "1",
                                     "--backend": "numpy"}),
    "demo": (["demo", "--no-plots"], {"--output": "{out}/demo"}),
    "convert-rope": (
        ["convert-rope", "{out}/in.safetensors", "{out}/out.safetensors"],
        {"--to": "interleaved", "--heads": "2", "--kv-heads": "1", "--head-dim": "4",
         "--rotary-dim": "4"},
    ),
    "bench": (
        ["bench", "--dry-run"],
        {"--tasks": "copy", "--schemes": "rope", "--seeds": "2", "--steps": "3",
         "--eval-lengths": "8", "--d-model": "16", "--layers": "1", "--heads": "2",
         "--batch-size": "4", "--lr": "0.001", "--eval-samples": "4", "--jobs": "1",
         "--out": "{out}/bench", "--device": "cpu"},
    ),
}  # fmt: skip
CLI_VALUES = [
    "nan", "inf", "-1", "0", "1e400", "", "abc", "99999999999999999999", "-0", "1.5", "--",
    "{out}", "{out}/missing/x", "1e-320", "-inf", "1,2", "\x00", "-", "/dev/null",
    "{out}/in.safetensors/x", "8GiB", "--d-modl",
]  # fmt: skip


@contextlib.contextmanager
def working_directory(path: str) -> Iterator[None]:
    """Run in ``path`` (so that outputs at relative paths land there), then return."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


_IMPORTED: set[str] = set()  # commands run once with their defaults, in this process


def run_command(command: str, option: str | None = None, value: str = "") -> tuple[Any, str, float]:
    """Run ``command`` of COMMANDS in a fresh directory, ``option`` set to ``value`` (the
    others at their defaults): its exit status, standard error and seconds."""
    import tempfile

    with tempfile.TemporaryDirectory() as out, working_directory(out):  # relative paths
        status, _, err, seconds = invoke(command_line(command, out, option, value), out)
        return status, err, seconds


def command_line(command: str, out: str, option: str | None = None, value: str = "") -> list[str]:
    """The words of ``command`` of COMMANDS with its outputs in ``out``, ``option`` set to
    ``value``; a tiny checkpoint for convert-rope (2 query heads, 1 key head of 4)."""
    prefix, options = COMMANDS[command]
    if command == "convert-rope" and not os.path.exists(f"{out}/in.safetensors"):
        import safetensors.numpy

        weights = {"l.q_proj.weight": np.ones((8, 3), np.float32),
                   "l.k_proj.weight": np.ones((4, 3), np.float32)}  # fmt: skip
        safetensors.numpy.save_file(weights, f"{out}/in.safetensors")
    argv = [word.replace("{out}", out) for word in prefix]
    for key, default in options.items():
        argv += [key, (value if key == option else default).replace("{out}", out)]
    return argv


def invoke(argv: list[str], out: str) -> tuple[Any, bytes, str, float]:
    """Run ``posenc argv`` in the folder ``out``: its exit status, standard output (as
    bytes: npy goes to the binary buffer), standard error and seconds."""
    stdout, stderr = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.StringIO()
    start = time.perf_counter()
    with (
        working_directory(out),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's own errors
            status = exc.code
    seconds = time.perf_counter() - start
    stdout.flush()
    return status, stdout.buffer.getvalue(), stderr.getvalue(), seconds  # type: ignore[attr-defined]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_command_exits_0_or_2_with_one_line(data):
    command = data.draw(st.sampled_from(sorted(COMMANDS)), label="command")
    option = data.draw(st.sampled_from(sorted(COMMANDS[command][1])), label="option")
    value = data.draw(st.sampled_from(CLI_VALUES), label="value")
    if command not in _IMPORTED:  # once, untimed: what the command imports lazily
        assert run_command(command)[0] == 0, command
        _IMPORTED.add(command)
    status, err, seconds = run_command(command, option, value)
    where = (command, option, value)
    assert status in (0, 2), (where, status, err)
    assert "Traceback" not in err, (where, err)
    if status == 2:
        lines = err.strip().splitlines()
        assert len([line for line in lines if line.startswith(("error", "posenc"))]) == 1, (
            where,
            lines,
        )
    assert seconds < 2 * LIMIT_SECONDS, where


# The commands that write one file at --output (demo's --output is a folder); one plot
# stands for all, which write through the same posenc.plot.save.
OUTPUT_COMMANDS = sorted(
    command
    for command, (_, options) in COMMANDS.items()
    if os.path.splitext(options.get("--output", ""))[1] and command not in ("plot t5", "plot alibi")
)
OUTPUTS = ["file", "relative link", "link chain", "dangling link", "/dev/null", "/dev/full",
           "fifo", "-", "full disk"]  # fmt: skip


def make_output(kind: str, out: str, name: str) -> tuple[str, str | None]:
    """The ``--output`` of ``kind`` in ``out`` and the file where its bytes land (None:
    nowhere to read them back)."""
    real = f"{out}/data/{name}"
    os.mkdir(f"{out}/data")
    if kind in ("relative link", "dangling link"):
        os.symlink(f"data/{name}", f"{out}/link-{name}")
        if kind == "relative link":
            Path(real).write_bytes(b"old")
        return f"{out}/link-{name}", real
    if kind == "link chain":  # absolute link -> relative link (in data/) -> the file
        os.symlink(name, f"{out}/data/hop-{name}")
        os.symlink(f"{out}/data/hop-{name}", f"{out}/link-{name}")
        Path(real).write_bytes(b"old")
        return f"{out}/link-{name}", real
    if kind == "fifo":
        os.mkfifo(real)
    if kind in ("file", "full disk", "fifo"):
        return real, real
    return kind, None  # /dev/null, /dev/full, -


def read_fifo(path: str, into: list[bytes]) -> Callable[[], None]:
    """Read the named pipe ``path`` into ``into`` in a thread; returns what ends it."""

    def read() -> None:
        with open(path, "rb") as pipe:
            into.append(pipe.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def end() -> None:
        with contextlib.suppress(OSError):  # a command that refused: let the reader end
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)

    return end


def is_char_device(path: str) -> bool:
    import stat

    return os.path.exists(path) and stat.S_ISCHR(os.stat(path).st_mode)


def refused(command: str, kind: str) -> bool:
    """Whether ``command`` must refuse the output ``kind`` (plot picks its format from the
    file's extension, which a device and ``-`` have not)."""
    no_extension = kind in ("-", "/dev/null", "/dev/full")
    return kind in ("/dev/full", "full disk") or (no_extension and command.startswith("plot"))


_REFERENCES: dict[str, bytes] = {}


def reference_bytes(command: str) -> bytes:
    """The bytes ``command`` writes to a plain file (once per command)."""
    import tempfile

    if command not in _REFERENCES:
        with tempfile.TemporaryDirectory() as out:
            assert invoke(command_line(command, out), out)[0] == 0
            name = os.path.basename(COMMANDS[command][1]["--output"])
            _REFERENCES[command] = Path(out, name).read_bytes()
    return _REFERENCES[command]


def check_refusal(command: str, kind: str, err: str, stdout: bytes, where: str | None) -> None:
    """A refused output: one line of the command's, no "wrote", the old file kept."""
    assert err.splitlines() == [err.strip()], err
    assert err.startswith(f"posenc {COMMANDS[command][0][0]}: error: "), err
    assert b"wrote" not in stdout
    if kind == "full disk" or (kind == "/dev/full" and command.startswith("table")):
        assert "No space left on device" in err, err
    assert where is None or not os.path.exists(where) or Path(where).read_bytes() == b"old"


@pytest.mark.parametrize("kind", OUTPUTS)
@pytest.mark.parametrize("command", OUTPUT_COMMANDS)
def test_every_output_gets_the_bytes_or_one_line(command, kind, monkeypatch, tmp_path):
    """``--output`` a symbolic link, a device, a named pipe, ``-`` or a full disk: status 0
    with the bytes of a plain file at the target (a link stays a link, a device a device),
    or status 2 with one line and never "wrote"."""
    if kind == "/dev/full" and not is_char_device(kind):
        pytest.skip("no /dev/full character device here")
    name = os.path.basename(COMMANDS[command][1]["--output"])
    expected = reference_bytes(command)
    (tmp_path / "run").mkdir()
    out = str(tmp_path / "run")
    output, where = make_output(kind, out, name)
    received: list[bytes] = []
    end_reader = read_fifo(output, received) if kind == "fifo" else None
    if kind == "full disk":

        def full(descriptor: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "fsync", full)
    status, stdout, err, _ = invoke(command_line(command, out, "--output", output), out)
    if end_reader is not None:
        end_reader()
    assert (status, "Traceback" in err) == (2 if refused(command, kind) else 0, False), err
    for device in ("/dev/null", "/dev/full"):
        assert kind != device or is_char_device(device)
    if status == 2:
        check_refusal(command, kind, err, stdout, where)
    else:
        got = {"-": stdout, "fifo": b"".join(received)}.get(kind)
        if got is None and where is not None:
            got = Path(where).read_bytes()
            assert os.path.islink(output) == ("link" in kind)
        assert got in (None, expected)  # None: /dev/null
    if where is not None:  # no temporary file left beside the output
        assert [f for f in os.listdir(os.path.dirname(where)) if f.endswith(".tmp")] == []


def torch_calls() -> dict[str, Callable[..., Any]]:
    """Each PyTorch module's call, taking ``offset`` and ``positions`` as given."""
    import torch

    from posenc.torch import (
        ALiBiBias,
        LearnedPositionalEmbedding,
        RotaryEmbedding,
        SinusoidalPositionalEncoding,
        T5RelativeBias,
    )

    x, q = torch.ones(1, 4, 8), torch.ones(1, 2, 4, 8)
    sinusoidal = SinusoidalPositionalEncoding(8, dropout=0.0, max_length=16)
    learned = LearnedPositionalEmbedding(16, 8, dropout=0.0)
    rope = RotaryEmbedding(8, max_length=16)
    alibi, t5 = ALiBiBias(2), T5RelativeBias(2)
    return {
        "sinusoidal": lambda **kw: sinusoidal(x, **kw),
        "learned": lambda **kw: learned(x, **kw),
        "rope": lambda **kw: rope(q, q, **kw),
        "alibi": lambda **kw: alibi(4, 6, **kw),
        "t5": lambda **kw: t5(4, 6, **kw),
    }


def hostile_tensors() -> st.SearchStrategy[Any]:
    import torch

    return st.sampled_from([
        torch.tensor([0, 1, 2, 3], dtype=torch.int8), torch.tensor([0, 1, 2, 3], dtype=torch.uint8),
        torch.tensor([-1, 0, 1, 2]), torch.tensor([0.0, 1.0, 2.0, 3.0]), torch.tensor([True] * 4),
        torch.tensor(3), torch.tensor([], dtype=torch.int64), torch.arange(8)[::2],
        torch.tensor([2**40, 1, 2, 3]), torch.tensor([[0, 1, 2, 3]] * 2), torch.arange(4).view(1, 4),
        torch.tensor([0, 1, 2, 3], dtype=torch.int16), [0, 1, 2, 3], np.arange(4), None,
    ])  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_torch_module_answers_right_or_refuses_clearly(data):
    import torch

    calls = torch_calls()
    name = data.draw(st.sampled_from(sorted(calls)), label="module")
    argument = data.draw(st.sampled_from(["offset", "positions"]), label="argument")
    value = data.draw(
        hostile_values() if argument == "offset" else hostile_tensors(), label="value"
    )
    start = time.perf_counter()
    error: Exception | None = None
    try:
        result = calls[name](**{argument: value})
    except (ValueError, TypeError) as exc:
        error = exc
    if error is not None:
        assert argument in str(error), f"{name}({argument}={value!r}): {error}"
    else:
        if argument == "offset":
            reference = calls[name](offset=plain(value))
        elif value is None:
            reference = calls[name]()
        else:
            reference = calls[name](positions=value.to(torch.int64).contiguous())
        for mine, theirs in zip(result if isinstance(result, tuple) else (result,),
                                reference if isinstance(reference, tuple) else (reference,),
                                strict=True):  # fmt: skip
            assert torch.equal(mine, theirs), f"{name}({argument}={value!r})"
            assert torch.isfinite(mine).all(), f"{name}({argument}={value!r})"
    assert time.perf_counter() - start < LIMIT_SECONDS


def jax_calls() -> Calls:
    import posenc.jax as pj

    return {
        "sinusoidal": (pj.sinusoidal, (6, 8), {"base": 100.0, "layout": "split"}),
        "sinusoidal_nd": (pj.sinusoidal_nd, ((3, 4), 8), {"base": 100.0}),
        "rope_tables": (pj.rope_tables, (5, 8), {"base": 100.0}),
        "alibi_slopes": (pj.alibi_slopes, (8,), {}),
        "alibi_bias": (pj.alibi_bias, (4, 6), {"num_heads": 4, "offset": 2}),
        "t5_bias": (pj.t5_bias, (np.ones((8, 2)), 3, 4), {"max_distance": 16}),
    }


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_jax_function_answers_right_or_refuses_clearly(data):
    calls = jax_calls()
    name = data.draw(st.sampled_from(sorted(calls)), label="function")
    where = data.draw(st.sampled_from(arguments(calls, name)), label="argument")
    value = data.draw(hostile_values(), label="value")
    check_contract(calls, name, where, value, limit_words=("max_bytes", "limit"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_keras_layer_takes_its_options_right_or_refuses_clearly(data):
    import inspect

    from posenc.keras import (
        ALiBiBias,
        LearnedPositionalEmbedding,
        RotaryEmbedding,
        SinusoidalPositionalEncoding,
        T5RelativeBias,
    )

    layers = {
        "SinusoidalPositionalEncoding": (SinusoidalPositionalEncoding, {"max_length": 16}),
        "RotaryEmbedding": (RotaryEmbedding, {"max_length": 16}),
        "ALiBiBias": (ALiBiBias, {"num_heads": 2}),
        "T5RelativeBias": (T5RelativeBias, {"num_heads": 2}),
        "LearnedPositionalEmbedding": (LearnedPositionalEmbedding, {"max_length": 16}),
    }
    name = data.draw(st.sampled_from(sorted(layers)), label="layer")
    cls, options = layers[name]
    parameters = [p for p in inspect.signature(cls).parameters if p != "kwargs"]
    argument = data.draw(st.sampled_from(parameters), label="argument")
    value = data.draw(hostile_values(), label="value")
    error: Exception | None = None
    try:
        layer = cls(**{**options, argument: value})
    except (ValueError, TypeError) as exc:
        error = exc
    if error is not None:
        assert argument in str(error) or argument.rstrip("s") in str(error), (
            f"{name}({argument}={value!r}): {error}"
        )
    else:
        reference = cls(**{**options, argument: plain(value)})
        mine, theirs = layer.get_config(), reference.get_config()
        mine.pop("name", None)
        theirs.pop("name", None)
        assert mine == theirs, f"{name}({argument}={value!r})"


def torch_constructors() -> dict[str, tuple[type, dict[str, Any], Callable[[Any], Any]]]:
    """Each PyTorch module: its class, valid options, and a call of a built module."""
    import torch

    from posenc import torch as pt

    x, q, tokens = torch.ones(1, 4, 8), torch.ones(1, 2, 4, 8), torch.tensor([[1, 2, 3]])
    grid = torch.ones(1, 2, 3, 8)
    return {
        "ALiBiBias": (pt.ALiBiBias, {"num_heads": 2, "mode": "causal"}, lambda m: m(4, 6)),
        "AxialRotaryEmbedding": (
            pt.AxialRotaryEmbedding,
            {"head_dim": 8, "n_axes": 2, "base": 100.0, "sections": None, "mode": "axial",
             "layout": "half", "qk_layout": "bhsd"},
            lambda m: m(q, q, coords=torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]])),
        ),
        "InputEmbedding": (
            pt.InputEmbedding,
            {"vocab_size": 5, "d_model": 8, "positional": "sinusoidal", "dropout": 0.0,
             "max_length": 16, "base": 100.0, "scale": True, "padding_idx": 0},
            lambda m: m(tokens),
        ),
        "LearnedPositionalEmbedding": (
            pt.LearnedPositionalEmbedding, {"max_length": 16, "d_model": 8, "dropout": 0.0,
                                            "init_std": 0.02}, lambda m: m(x),
        ),
        "MultiHeadAttention": (
            pt.MultiHeadAttention, {"d_model": 8, "num_heads": 2, "position": None,
                                    "causal": True, "dropout": 0.0, "bias": False},
            lambda m: m(x),
        ),
        "NoPositionalEncoding": (
            pt.NoPositionalEncoding, {"d_model": 8, "dropout": 0.0}, lambda m: m(x)
        ),
        "RotaryEmbedding": (
            pt.RotaryEmbedding,
            {"head_dim": 8, "base": 100.0, "rotary_dim": 4, "layout": "half",
             "scaling": "yarn", "scaling_params": {"factor": 2.0,
                                                   "original_max_position_embeddings": 4},
             "max_length": 16, "qk_layout": "bhsd"},
            lambda m: m(q, q, offset=2),
        ),
        "SinusoidalPositionalEncoding": (
            pt.SinusoidalPositionalEncoding,
            {"d_model": 8, "dropout": 0.0, "max_length": 16, "base": 100.0,
             "layout": "interleaved", "formula": "paper"},
            lambda m: m(x),
        ),
        "SinusoidalPositionalEncodingND": (
            pt.SinusoidalPositionalEncodingND,
            {"channels": 8, "layout": "positional-encodings", "base": 100.0, "dropout": 0.0,
             "ndim": 2},
            lambda m: m(grid),
        ),
        "T5RelativeBias": (
            pt.T5RelativeBias, {"num_heads": 2, "bidirectional": True, "num_buckets": 8,
                                "max_distance": 16, "compat": "hf"}, lambda m: m(4, 6),
        ),
        "TokenEmbedding": (
            pt.TokenEmbedding, {"vocab_size": 5, "d_model": 8, "scale": True,
                                "padding_idx": 0}, lambda m: m(tokens),
        ),
        "XPosRotaryEmbedding": (
            pt.XPosRotaryEmbedding,
            {"head_dim": 8, "base": 100.0, "gamma": 0.4, "scale_base": 512, "centre": 0.0,
             "layout": "interleaved", "max_length": 16, "qk_layout": "bhsd"},
            lambda m: m(q, q),
        ),
    }  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_torch_module_takes_its_options_right_or_refuses_clearly(data):
    modules = torch_constructors()
    name = data.draw(st.sampled_from(sorted(modules)), label="module")
    cls, options, use = modules[name]
    argument = data.draw(st.sampled_from(sorted(options)), label="argument")
    value = data.draw(hostile_values(), label="value")
    check_module_options(name, cls, options, use, argument, value)


def keras_message(error: Exception) -> str:
    """The message posenc raised inside a Keras layer's ``call``, without the call
    context Keras adds around it (its traceback filtering, on by default)."""
    message = str(error)
    if message.startswith("Exception encountered when calling"):
        message = message.split("\n\n")[1].replace("\x1b[1m", "").replace("\x1b[0m", "")
    return message


def keras_calls() -> dict[str, tuple[Any, Any, tuple[str, ...]]]:
    """Each Keras layer, an input, and the call arguments it takes besides the input."""
    from posenc import keras as pk

    x, q = np.ones((1, 4, 8), np.float32), np.ones((1, 4, 2, 8), np.float32)
    scores = np.zeros((1, 2, 4, 6), np.float32)
    return {
        "SinusoidalPositionalEncoding": (
            pk.SinusoidalPositionalEncoding(max_length=16),
            x,
            ("start_index",),
        ),
        "LearnedPositionalEmbedding": (
            pk.LearnedPositionalEmbedding(max_length=16),
            x,
            ("start_index",),
        ),
        "RotaryEmbedding": (pk.RotaryEmbedding(max_length=16), q, ("start_index", "positions")),
        "ALiBiBias": (pk.ALiBiBias(num_heads=2), scores, ("start_index",)),
        "T5RelativeBias": (pk.T5RelativeBias(num_heads=2), scores, ("start_index",)),
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_keras_layer_call_answers_right_or_refuses_clearly(data):
    calls = keras_calls()
    name = data.draw(st.sampled_from(sorted(calls)), label="layer")
    layer, inputs, taken = calls[name]
    argument = data.draw(st.sampled_from(taken), label="argument")
    value = data.draw(hostile_values(), label="value")
    start = time.perf_counter()
    error: Exception | None = None
    try:
        result = layer(inputs, **{argument: value})
    except (ValueError, TypeError) as exc:
        error = exc
    if error is not None:
        message = keras_message(error)
        assert "\n" not in message.strip(), message
        assert argument in message or argument.rstrip("s") in message, (
            f"{name}({argument}={value!r}): {message}"
        )
    else:
        plain_value = plain(value)
        reference = (
            layer(inputs) if plain_value is None else layer(inputs, **{argument: plain_value})
        )
        mine, theirs = np.asarray(result), np.asarray(reference)
        assert np.array_equal(mine, theirs), f"{name}({argument}={value!r})"
        assert np.all(np.isfinite(mine)), f"{name}({argument}={value!r})"
    assert time.perf_counter() - start < LIMIT_SECONDS, f"{name}({argument}={value!r}) was slow"


def flax_modules() -> dict[str, tuple[type, dict[str, Any], tuple[Any, ...], dict[str, Any]]]:
    """Each Flax module: its class, valid options, and valid call arguments."""
    from posenc.jax import linen as pl

    x, grid = np.ones((1, 4, 8), np.float32), np.ones((1, 2, 3, 8), np.float32)
    q = np.ones((1, 4, 2, 8), np.float32)
    return {
        "ALiBiBias": (
            pl.ALiBiBias, {"num_heads": 2, "mode": "causal", "max_length": 16, "dtype": "float32"},
            (4,), {"key_length": 6, "offset": 2},
        ),
        "T5RelativeBias": (
            pl.T5RelativeBias,
            {"num_heads": 2, "bidirectional": True, "num_buckets": 8, "max_distance": 16,
             "compat": "hf"},
            (4,), {"key_length": 6, "offset": 2},
        ),
        "LearnedPositionalEmbedding": (
            pl.LearnedPositionalEmbedding, {"max_length": 16, "init_std": 0.02, "dropout_rate": 0.0},
            (x,), {"start_index": 2},
        ),
        "RotaryEmbedding": (
            pl.RotaryEmbedding,
            {"base": 100.0, "rotary_dim": 4, "layout": "half", "scaling": "linear",
             "scaling_params": {"factor": 2.0}, "max_length": 16},
            (q,), {"start_index": 2},
        ),
        "RotaryEmbedding positions": (
            pl.RotaryEmbedding, {"max_length": 16}, (q,), {"positions": np.array([3, 1, 2, 0])},
        ),
        "SinusoidalPositionalEncoding": (
            pl.SinusoidalPositionalEncoding,
            {"max_length": 16, "base": 100.0, "layout": "split", "formula": "paper",
             "dropout_rate": 0.0},
            (x,), {"start_index": 2},
        ),
        "SinusoidalPositionalEncodingND": (
            pl.SinusoidalPositionalEncodingND,
            {"layout": "positional-encodings", "base": 100.0, "dropout_rate": 0.0}, (grid,), {},
        ),
    }  # fmt: skip


def flax_outcome(
    cls: type, options: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The module's output (init and apply with one key), or the error it raised."""
    import jax

    try:
        module = cls(**options)
        variables = module.init(jax.random.PRNGKey(0), *args, **kwargs)
        return np.asarray(module.apply(variables, *args, **kwargs))
    except (ValueError, TypeError) as exc:
        return exc


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_flax_module_answers_right_or_refuses_clearly(data):
    modules = flax_modules()
    name = data.draw(st.sampled_from(sorted(modules)), label="module")
    cls, options, args, kwargs = modules[name]
    where = data.draw(
        st.sampled_from(
            [("option", key) for key in options]
            + [("call", i) for i in range(len(args))]
            + [("call", key) for key in kwargs]
        ),
        label="argument",
    )
    value = data.draw(hostile_values(), label="value")
    start = time.perf_counter()

    def outcome(value: Any) -> Any:
        opts, call_args, call_kwargs = dict(options), list(args), dict(kwargs)
        if where[0] == "option":
            opts[str(where[1])] = value
        elif isinstance(where[1], int):
            call_args[where[1]] = value
        else:
            call_kwargs[where[1]] = value
        return flax_outcome(cls, opts, tuple(call_args), call_kwargs)

    result = outcome(value)
    if isinstance(where[1], int):
        argument = "x" if "Bias" not in name else "query_length"
    else:
        argument = str(where[1])
    if isinstance(result, Exception):
        message = str(result)
        assert "\n" not in message.strip(), message
        assert (
            argument in message
            or argument.rstrip("s") in message
            or (argument.startswith("scaling") and message.startswith("RoPE scaling"))
            or (argument == "x" and "input" in message)
        ), f"{name}({argument}={value!r}): {message}"
    else:
        reference = outcome(plain(value))
        assert not isinstance(reference, Exception), (name, argument, value, reference)
        assert np.array_equal(result, reference), f"{name}({argument}={value!r})"
        assert np.all(np.isfinite(result)), f"{name}({argument}={value!r})"
    assert time.perf_counter() - start < LIMIT_SECONDS, f"{name}({argument}={value!r}) was slow"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    function=st.sampled_from(["sinusoidal", "rope_tables"]),
    dtype=st.sampled_from(["int8", "uint8", "int16", "uint16", "int32", "uint32"]),
    values=st.lists(st.integers(-(2**31), 2**32 - 1), min_size=1, max_size=6),
)
def test_traced_positions_give_the_rows_or_nan(function, dtype, values):
    """Positions known only inside ``jax.jit``, in any integer dtype: the core's row where
    the position lies in the table, NaN rows elsewhere (never a wrapped index)."""
    import jax

    import posenc.jax as pj

    info = np.iinfo(dtype)
    positions = np.array([v for v in values if info.min <= v <= info.max] or [0], dtype=dtype)
    make = getattr(pj, function)
    traced = jax.jit(lambda p: make(p, 8, max_length=8))(positions)
    for table, part in zip(
        traced if isinstance(traced, tuple) else (traced,),
        make(8, 8) if function == "rope_tables" else (make(8, 8),),
        strict=True,
    ):
        got, rows = np.asarray(table), np.asarray(part)
        for i, p in enumerate(positions.tolist()):
            if 0 <= p < 8:
                assert np.array_equal(got[i], rows[p]), (dtype, p)
            else:
                assert np.all(np.isnan(got[i])), (dtype, p)
