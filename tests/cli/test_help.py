"""``posenc COMMAND --help``: a description for each command, and a help text for every
option that says its default.

The expected texts are the commands' own words; the defaults are those the commands use
(``posenc.demo.embed_sentence``'s and ``DEMO_FOLDER``), checked against the parsers'.
"""

from __future__ import annotations

import argparse

import pytest

from posenc.cli import _parser, main


def help_text(capsys, monkeypatch, *argv: str) -> str:
    """The help of ``posenc ARGV --help``, its whitespace made single spaces."""
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps at the terminal's width
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def options(command: str) -> dict[str, argparse.Action]:
    """The options of ``posenc COMMAND`` by their long name (``-h`` left out)."""
    actions = _parser()[1][command]._actions
    return {a.option_strings[0]: a for a in actions if a.option_strings and a.dest != "help"}


def test_demo_help_describes_the_command_and_every_option(capsys, monkeypatch):
    text = help_text(capsys, monkeypatch, "demo")
    assert (
        "The tutorials' walk-through, reproduced and checked: print their worked tables, the "
        "pipeline on 'I am a robot' and a few numbers of the relative schemes (ALiBi, T5, "
        "RoPE); write every picture of posenc plot (PNG), two tables (CSV) and report.json "
        "into the output folder; end with a report of the properties the paper and the "
        "tutorials claim (unique vectors, bounds, relative positions, precision), each "
        "measured." in text
    )
    assert (
        "--output FOLDER, -o FOLDER the folder to write into, created if missing (its parent "
        "must exist); default ./posenc-demo" in text
    )
    assert (
        "--no-plots write no pictures, so matplotlib is not needed (default: draw them all)" in text
    )
    demo = options("demo")
    assert sorted(demo) == ["--no-plots", "--output"]
    assert (str(demo["--output"].default), demo["--no-plots"].default) == ("posenc-demo", False)


def test_embed_help_describes_the_command_and_every_option(capsys, monkeypatch):
    text = help_text(capsys, monkeypatch, "embed")
    assert (
        "Run the tutorials' pipeline on one sentence and print each step: the tokens "
        "(lower-cased words), their vocabulary ids, the embedding lookup (weights drawn from "
        "N(0, 1)), the sinusoidal positional encoding and their sum, the input of a "
        "transformer's first layer." in text
    )
    assert 'text the sentence, e.g. "I am a robot"' in text
    expected = {
        "--d-model": (4, "width of the embedding and of the encoding (default 4, the tutorial's)"),
        "--base": (
            100.0,
            "the n of k / n^(2i/d) (default 100, the tutorial's; the paper's is 10000)",
        ),
        "--seed": (0, "seed of the embedding weights (default 0)"),
        "--scale": (
            False,
            "multiply the embedding by sqrt(d_model) before adding the encoding, as the "
            "Transformer paper does (default: not scaled, as in the tutorials)",
        ),
        "--backend": (
            "numpy",
            "numpy (default) or torch: posenc.torch.InputEmbedding (needs posenc[torch])",
        ),
    }
    embed = options("embed")
    assert sorted(embed) == sorted(expected)
    for name, (default, words) in expected.items():
        assert (embed[name].default, embed[name].help) == (default, words)
        assert words in text


def test_embed_defaults_are_those_of_the_function_it_runs():
    import inspect

    from posenc.demo import DEMO_FOLDER, embed_sentence, run_demo

    signature = inspect.signature(embed_sentence).parameters
    embed = options("embed")
    for name in ("d_model", "base", "seed", "scale", "backend"):
        flag = "--" + name.replace("_", "-")
        assert embed[flag].default == signature[name].default, flag
    assert inspect.signature(run_demo).parameters["output"].default == DEMO_FOLDER
