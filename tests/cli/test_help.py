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
    # the help of each option as written (how argparse lays out "--output, -o FOLDER"
    # changed in Python 3.13)
    assert options("demo")["--output"].help == (
        "the folder to write into, created if missing (its parent must exist); default "
        "./posenc-demo"
    )
    assert "the folder to write into, created if missing (its parent" in text
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


PLOT_KINDS_HELP = """\
kinds (what each draws, and the options it takes with their defaults):
  heatmap          the sinusoidal table, positions × dimensions, as a heat map in [-1, 1]
                   options: --length 100, --d-model 512, --base 10000
  sinusoids        sin(k / n^(2i/d)) against the pair index i, one panel per position k
                   options: --d-model 512, --base 10000
  dimensions       columns 0, 1, 2, 4, 6, 8 against position for d_model 20, 50 and 128
                   options: --base 10000
  first-positions  the first positions of the table as an image, one row each
                   options: --length 20, --d-model 50, --base 10000
  long-range       many positions binned per pixel row: each bin's mean and range
                   options: --length 50000, --d-model 50, --base 10000
  wavelengths      the wavelengths 2π·n^(2i/d), 2π towards 2πn, on a log axis
                   options: --d-model 512, --base 10000
  similarity       PE·PEᵀ of the positions, and the dot product against the offset
                   options: --length 100, --d-model 512, --base 10000
  grid             the first tokens' encodings, one square cell per value
                   options: --length 16, --d-model 64, --base 10000
  rope-spectrum    RoPE's wavelength per frequency pair for each scaling method, against L0
                   options: --base 500000, --head-dim 128, --factor 8,
                            --original-max-position-embeddings 8192
  rope-score       RoPE's score q_rot(m)·k_rot(n) against m − n: the long-term decay
                   options: --length 65536, --base 500000, --head-dim 128, --factor 8,
                            --original-max-position-embeddings 8192
  alibi            ALiBi's bias −m·(i − j) of up to four heads, with their slopes
                   options: --length 32, --heads 8
  t5               T5's bucket matrix, and the bucket against key − query
                   options: --length 64, --num-buckets 32, --max-distance 128
  sandwich         Sandwich's bias: one head's matrix, every head's against the distance
                   options: --length 64, --d-model 128, --heads 8
  xpos             xPos's decay ζ_i^(Δ/B) of a few frequency pairs' scores
                   options: --length 4096, --head-dim 64
every kind also takes --output (default KIND.png) and --dpi (default 100)
"""


def test_plot_help_lists_each_kind_with_what_it_draws_and_its_options(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    out = capsys.readouterr().out
    assert out.endswith("\n\n" + PLOT_KINDS_HELP)  # the epilog, as written
    text = " ".join(out.split())
    assert options("plot")["--output"].help == (
        "the file; its extension picks the format (.png, .svg, .pdf, ...); default KIND.png "
        "in the current folder"
    )
    assert "default KIND.png in the current folder" in text
    assert "--dpi DPI dots per inch, every kind (default 100)" in text


def _listed_options() -> dict[str, dict[str, str]]:
    """``{kind: {option: default}}`` as ``posenc plot --help`` lists them."""
    from posenc.cli.plot import kinds_help

    listed: dict[str, dict[str, str]] = {}
    kind = ""
    for line in kinds_help().splitlines()[1:-1]:
        if not line.startswith(" " * 19):
            kind = line.split()[0]
            listed[kind] = {}
            continue
        words = line.strip().removeprefix("options: ").rstrip(",").split(", ")
        listed[kind].update(word.split(" ", 1) for word in words if word != "none")
    return listed


def test_the_options_plot_help_lists_are_those_each_kind_takes(capsys):
    """An option listed under a kind is a parameter of its function with that default;
    every other one is refused (before anything is drawn)."""
    import inspect

    from posenc.cli.plot import _PLOT_OPTIONS
    from posenc.plot import PLOTS

    listed = _listed_options()
    assert list(listed) == list(PLOTS)
    for kind, taken in listed.items():
        parameters = inspect.signature(PLOTS[kind]).parameters
        for option, parameter in _PLOT_OPTIONS.items():
            flag = "--" + option.replace("_", "-")
            if flag in taken:
                assert float(taken[flag]) == parameters[parameter].default, (kind, flag)
                continue
            assert main(["plot", kind, flag, "1", "-o", "never.png"]) == 2
            assert capsys.readouterr().err == (
                f"posenc plot {kind}: error: {flag} does not apply to this picture\n"
            )


def test_plot_writes_kind_png_in_the_current_folder_by_default(capsys, monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "alibi", "-L", "4", "--heads", "2", "--dpi", "20"]) == 0
    assert capsys.readouterr().out == "wrote alibi.png\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alibi.png"]  # no temporary left
    assert (tmp_path / "alibi.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
