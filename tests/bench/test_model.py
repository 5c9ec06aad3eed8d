"""The bench's spec, tasks, model and training loop (posenc.bench, engineer A's part)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from posenc.bench import train  # noqa: E402
from posenc.bench.model import GPT, GPTConfig  # noqa: E402
from posenc.bench.spec import ROPE_EVAL_SCALINGS, SCHEMES, TASKS, RunSpec  # noqa: E402
from posenc.bench.tasks import TextTask, make_task, max_positions, synthetic_text  # noqa: E402
from posenc.core.rope import rope_scaling  # noqa: E402

TINY = {"d_model": 16, "n_layers": 1, "n_heads": 2, "batch_size": 4}


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def parts(task, row, mask_row):
    """(input symbols, scored tokens) of one algorithmic row, as token strings."""
    words = task.decode(row)
    sep = words.index("<sep>")
    scored = [w for w, m in zip(words, mask_row.tolist(), strict=True) if m]
    return words[1:sep], scored


# ---------------------------------------------------------------------------------------
# RunSpec


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"task": "copyy"}, ValueError, "task must be one of"),
        ({"task": 3}, TypeError, "task must be one of"),
        ({"scheme": "xpos"}, ValueError, "'xpos'"),
        ({"steps": 0}, ValueError, "steps must be an int >= 1, got 0"),
        ({"steps": 2.0}, TypeError, "steps"),
        ({"seed": -1}, ValueError, "seed"),
        ({"lr": 0.0}, ValueError, "lr must be a finite real number > 0, got 0.0"),
        ({"lr": "fast"}, TypeError, "lr"),
        ({"d_model": 30, "n_heads": 4}, ValueError, "d_model=30 and n_heads=4"),
        ({"scheme": "rope", "d_model": 12, "n_heads": 4}, ValueError, "head width 3"),
        ({"train_lengths": (16, 4)}, ValueError, "(16, 4)"),
        ({"train_lengths": (0, 4)}, ValueError, "train_lengths[0]"),
        ({"train_lengths": (4, 8, 16)}, ValueError, "(lo, hi)"),
        ({"train_lengths": 8}, TypeError, "train_lengths"),
        ({"eval_lengths": ()}, ValueError, "at least one"),
        ({"eval_lengths": (8, 8)}, ValueError, "distinct"),
        ({"eval_lengths": (8, 0)}, ValueError, "eval_lengths[1]"),
        ({"eval_samples": 0}, ValueError, "eval_samples"),
        ({"rope_eval_scalings": ("ntk",)}, ValueError, "scheme 'rope' only"),
        ({"scheme": "rope", "rope_eval_scalings": ("llama3",)}, ValueError, "'llama3'"),
        ({"scheme": "rope", "rope_eval_scalings": "ntk"}, TypeError, "tuple of names"),
        ({"scheme": "rope", "rope_eval_scalings": ("ntk", "ntk")}, ValueError, "distinct"),
        (
            {"scheme": "rope", "d_model": 8, "n_heads": 4, "rope_eval_scalings": ("yarn", "ntk")},
            ValueError,
            "['ntk']",
        ),
        ({"text": "story.txt"}, ValueError, "task 'lm' only"),
        ({"task": "lm", "text": 5}, TypeError, "text"),
        ({"device": "gpu"}, ValueError, "'gpu'"),
        ({"device": None}, TypeError, "device"),
    ],
)
def test_runspec_rejects_bad_fields(changes, error, words):
    fields = {"task": "copy", "scheme": "alibi", **changes}
    with pytest.raises(error) as info:
        RunSpec(**fields)
    assert words in str(info.value)


def test_runspec_normalises_lists_and_round_trips():
    spec = RunSpec(
        "lm",
        "rope",
        train_lengths=[2, 6],
        eval_lengths=[4, 12],
        rope_eval_scalings=["yarn"],
        text="corpus.txt",
        device="cuda:1",
    )
    assert spec.train_lengths == (2, 6)
    assert spec.eval_lengths == (4, 12)
    assert spec.rope_eval_scalings == ("yarn",)
    d = spec.to_dict()
    assert d["train_lengths"] == [2, 6]
    assert d["eval_lengths"] == [4, 12]
    assert json.loads(json.dumps(d)) == d
    assert RunSpec.from_dict(json.loads(json.dumps(d))) == spec
    with pytest.raises(ValueError, match="unknown RunSpec fields"):
        RunSpec.from_dict({**d, "dropout": 0.1})
    with pytest.raises(ValueError, match="scheme"):
        RunSpec.from_dict({"task": "copy"})
    with pytest.raises(TypeError):
        RunSpec.from_dict([("task", "copy")])


def test_runspec_key_is_the_sha1_of_the_canonical_fields_without_device():
    spec = RunSpec("copy", "t5")
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    del fields["device"]
    for name in ("lm_eval", "extension", "extension_lengths", "extension_steps"):
        del fields[name]  # None: left out, so that keys made before the field stay valid
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert spec.key() == hashlib.sha1(canonical.encode()).hexdigest()
    lm = RunSpec("lm", "t5")
    assert lm.lm_eval == "tiled"
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in lm.to_dict().items()
              if not k.startswith("extension")}  # fmt: skip
    del fields["device"]
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert '"lm_eval":"tiled"' in canonical
    assert lm.key() == hashlib.sha1(canonical.encode()).hexdigest()


def test_runspec_key_is_stable_and_changes_with_every_field_but_device():
    base = RunSpec("lm", "rope")
    assert base.key() == RunSpec("lm", "rope").key()
    assert base.key() == RunSpec("lm", "rope", device="auto").key()
    assert base.key() == RunSpec("lm", "rope", eval_lengths=[8, 16, 24, 32, 48, 64]).key()
    other = {
        "task": "copy",
        "scheme": "alibi",
        "seed": 1,
        "steps": 7,
        "batch_size": 3,
        "lr": 1e-3,
        "d_model": 32,
        "n_layers": 3,
        "n_heads": 2,
        "train_lengths": (4, 15),
        "eval_lengths": (8, 16, 24, 32, 48, 65),
        "eval_samples": 9,
        "rope_eval_scalings": ("ntk",),
        "text": "corpus.txt",
        "lm_eval": "sliding",
        "extension": "yarn",
        "extension_lengths": (17, 32),
        "extension_steps": 5,
    }
    names = {f.name for f in dataclasses.fields(RunSpec)} - {"device"}
    assert set(other) == names
    stage = {"extension": "none", "extension_lengths": (17, 32), "extension_steps": 10}
    keys = {base.key()}
    for name, value in other.items():
        also = {"lm_eval": None} if name == "task" else {}  # lm's own field
        if name.startswith("extension"):  # the stage's fields go together
            also = {k: v for k, v in stage.items() if k != name}
        elif name == "rope_eval_scalings":
            also = {}
        keys.add(dataclasses.replace(base, **{name: value}, **also).key())
    assert len(keys) == len(other) + 1


# ---------------------------------------------------------------------------------------
# Tasks


@pytest.mark.parametrize("name", ["copy", "reverse", "sort"])
def test_sequence_tasks_targets(name):
    task = make_task(name)
    tokens, mask = task.batch(64, (1, 12), rng(1))
    lengths = task.problem_lengths(tokens)
    assert lengths.min() >= 1
    assert lengths.max() <= 12
    for row, mask_row, n in zip(tokens, mask, lengths.tolist(), strict=True):
        source, scored = parts(task, row, mask_row)
        assert len(source) == n
        assert scored[-1] == "<eos>"
        target = scored[:-1]
        if name == "copy":
            assert target == source
        elif name == "reverse":
            assert target[::-1] == source  # the reverse of the reverse is the input
        else:
            assert target == sorted(target)
            assert Counter(target) == Counter(source)
    if name == "sort":  # a small alphabet: sorted targets repeat symbols
        targets = [parts(task, r, m)[1][:-1] for r, m in zip(tokens, mask, strict=True)]
        assert any(len(set(t)) < len(t) for t in targets)


def test_add_columns_spell_the_integer_sum():
    task = make_task("add")
    tokens, mask = task.batch(100, (1, 9), rng(2))
    carries = 0
    for row, mask_row in zip(tokens, mask, strict=True):
        words = task.decode(row)
        sep, eos = words.index("<sep>"), words.index("<eos>")
        n = (sep - 1) // 3
        assert sep == 3 * n + 1  # BOS and n columns of three digits
        assert eos == sep + 2  # the final carry between them
        columns = words[1:sep]
        a = int("".join(columns[0::3])[::-1])  # least-significant digit first
        b = int("".join(columns[1::3])[::-1])
        total = int("".join([*columns[2::3], words[sep + 1]])[::-1])
        assert total == a + b
        assert task.read_numbers(row) == (a, b, a + b)
        # Each column's third digit is (a_i + b_i + carry in) mod 10.
        carry = 0
        for i in range(n):
            carry, digit = divmod(int(columns[3 * i]) + int(columns[3 * i + 1]) + carry, 10)
            assert int(columns[3 * i + 2]) == digit
        assert int(words[sep + 1]) == carry
        # Scored: every sum digit, the final carry and EOS; never an operand digit.
        scored = [1 + 3 * i + 2 for i in range(n)] + [sep + 1, eos]
        assert mask_row.nonzero().flatten().tolist() == scored
        carries += a + b >= 10**n
    assert carries > 10  # the final carry digit is exercised


def test_a_passkey_is_asked_for_after_the_filler_it_hides_in():
    task = make_task("passkey")
    tokens, mask = task.batch(200, (1, 30), rng(5))
    places = []
    for row, mask_row, n in zip(tokens, mask, task.problem_lengths(tokens).tolist(), strict=True):
        words = [w for w in task.decode(row) if w != "<pad>"]
        sep, key = words.index("<sep>"), words.index("<key>")
        hidden, asked = words[key + 1 : key + 5], words[sep + 1 : sep + 5]
        fillers = words[1:key] + words[key + 5 : sep]
        assert asked == hidden
        assert all(d in "0123456789" for d in hidden)
        assert len(fillers) == n
        assert set(fillers) <= {"w", "x", "y", "z"}
        assert words[0] == "<bos>"
        assert words[-1] == "<eos>"
        assert len(words) == sep + 6
        assert len(words) == task.max_positions(n)
        assert mask_row.nonzero().flatten().tolist() == list(range(sep + 1, sep + 6))
        places.append((key - 1) / n)
    assert min(places) == 0
    assert max(places) == 1
    assert 0.4 < sum(places) / len(places) < 0.6


def test_lm_windows_are_exact_substrings_of_their_split():
    task = make_task("lm")
    text = synthetic_text()
    assert len(text) >= 300_000
    cut = math.ceil(0.9 * len(text))
    train_text, eval_text = text[:cut], text[cut:]
    assert task.vocab == ("<pad>", "<bos>", "<unk>", *sorted(set(train_text)))
    for split, part in (("train", train_text), ("eval", eval_text)):
        tokens, mask = task.batch(20, 24, rng(3), split=split)
        assert tokens.shape == (20, max_positions("lm", 24))
        assert mask[:, 0].logical_not().all()
        assert mask[:, 1:].all()
        for row in tokens:
            window = "".join(task.decode(row[1:]))
            assert len(window) == 24
            assert window in part
    assert make_task("lm") is task  # the synthetic text is built once


def test_lm_text_file_vocabulary_unknown_and_errors(tmp_path):
    path = tmp_path / "corpus.txt"
    content = "αβγ abc " * 20 + "δ" * 17  # 177 characters; "δ" only in the held-out 10%
    path.write_text(content, encoding="utf-8")
    task = make_task("lm", text=path)
    assert task.vocab == ("<pad>", "<bos>", "<unk>", " ", "a", "b", "c", "α", "β", "γ")
    assert task.train_ids.size == 160
    assert task.eval_ids.size == 17
    tokens, _ = task.batch(3, 17, rng(0), split="eval")
    assert (tokens[:, 1:] == task.token_id("<unk>")).all()
    assert "".join(task.decode(task.batch(1, 160, rng(0))[0][0, 1:])) == content[:160]
    with pytest.raises(ValueError, match="does not fit in the eval part"):
        task.batch(1, 18, rng(0), split="eval")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        make_task("lm", text=tmp_path / "missing.txt")
    (tmp_path / "latin1.txt").write_bytes("café ".encode("latin-1") * 10)
    with pytest.raises(ValueError, match="not valid UTF-8"):
        make_task("lm", text=tmp_path / "latin1.txt")
    with pytest.raises(ValueError, match="at least 20 characters"):
        TextTask("short")
    with pytest.raises(ValueError, match="task 'lm' only"):
        make_task("copy", text=path)


def test_lm_counts_and_reports_the_unknown_characters_it_scores(tmp_path):
    """The held-out "abxabc" holds one "x", never seen in training: tiled into windows of
    4 ("abxa") and of 3 ("abx", "abc"), one of the scored characters is <unk>."""
    from posenc.bench import report

    path = tmp_path / "corpus.txt"
    path.write_text("abc" * 18 + "abxabc", encoding="utf-8")  # 54 to train, 6 to evaluate
    spec = RunSpec("lm", "nope", steps=1, train_lengths=(2, 4), eval_lengths=(3, 4),
                   text=str(path), **TINY)  # fmt: skip
    record = train.run(spec)
    got = [(r["length"], r["samples"], r["unknown_tokens"], r["scored_tokens"])
           for r in record["results"]]  # fmt: skip
    assert got == [(3, 2, 1, 6), (4, 1, 1, 4)]
    text = report.write_reports(tmp_path / "out", [record])["markdown"].read_text()
    assert f"| {path} | 4 | 1 | 4 (25.000%) |" in text
    assert f"| {path} | 3 | 1 | 6 (16.667%) |" in text
    copy = train.run(dataclasses.replace(spec, task="copy", text=None, eval_lengths=(3,),
                                         lm_eval=None))  # fmt: skip
    assert copy["results"][0]["unknown_tokens"] == 0
    assert "never seen in training" not in report.write_reports(tmp_path / "c", [copy])[
        "markdown"].read_text()  # fmt: skip


@pytest.mark.parametrize("name", TASKS)
def test_batches_pad_at_the_end_and_mask(name):
    task = make_task(name)
    assert task.vocab_size == len(task.vocab) == len(set(task.vocab))
    assert task.vocab[:2] == ("<pad>", "<bos>")
    assert task.pad_id == 0
    assert make_task(name).vocab == task.vocab
    tokens, mask = task.batch(40, (2, 7), rng(4))
    assert tokens.dtype == torch.long
    assert mask.dtype == torch.bool
    assert tokens.min() >= 0
    assert tokens.max() < task.vocab_size
    lengths = task.problem_lengths(tokens)
    assert set(lengths.tolist()) <= set(range(2, 8))
    assert len(set(lengths.tolist())) > 1
    assert tokens.shape[1] == max_positions(name, int(lengths.max()))
    for row, mask_row, n in zip(tokens, mask, lengths.tolist(), strict=True):
        used = max_positions(name, n)
        assert row[0] == task.token_id("<bos>")
        assert (row[:used] != task.pad_id).all()
        assert (row[used:] == task.pad_id).all()
        assert not mask_row[used:].any()
        assert not mask_row[0]
        scored = {"copy": n + 1, "reverse": n + 1, "sort": n + 1, "add": n + 2, "lm": n,
                  "passkey": 5}[name]  # fmt: skip
        assert int(mask_row.sum()) == scored
        assert mask_row[used - 1]  # the last token (EOS or last character) is scored
    # The same generator state gives the same batch.
    again = task.batch(40, (2, 7), rng(4))
    assert torch.equal(again[0], tokens)
    assert torch.equal(again[1], mask)


@pytest.mark.parametrize(
    ("length", "error"), [(0, ValueError), ((5, 3), ValueError), ("4", TypeError), (2.0, TypeError)]
)
def test_batch_rejects_bad_lengths(length, error):
    with pytest.raises(error, match="length"):
        make_task("copy").batch(2, length, rng())


def test_batch_rejects_bad_arguments():
    task = make_task("copy")
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        task.batch(2, 4, torch.Generator())
    with pytest.raises(ValueError, match="split"):
        task.batch(2, 4, rng(), split="test")
    with pytest.raises(ValueError, match="n must be"):
        task.batch(0, 4, rng())
    with pytest.raises(ValueError, match="task must be one of"):
        max_positions("copyy", 4)
    with pytest.raises(ValueError, match="length"):
        max_positions("copy", 0)


@pytest.mark.parametrize("name", TASKS)
def test_evaluation_batches_have_problem_length_exactly_l(name):
    task = make_task(name)
    for length in (3, 11):
        batches = list(train.evaluation_batches(task, length, samples=7, seed=5, batch_size=3))
        assert [b[0].shape[0] for b in batches] == [3, 3, 1]
        for tokens, _mask in batches:
            assert tokens.shape[1] == max_positions(name, length)
            assert task.problem_lengths(tokens).tolist() == [length] * tokens.shape[0]
            assert (tokens != task.pad_id).all()  # nothing to pad at one length
        again = list(train.evaluation_batches(task, length, samples=7, seed=5, batch_size=3))
        assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))


# ---------------------------------------------------------------------------------------
# Model


def test_learned_positions_cover_every_evaluated_length():
    spec = RunSpec("add", "learned", train_lengths=(2, 5), eval_lengths=(3, 9), **TINY)
    model = train.build_model(spec, make_task("add"))
    assert model.positions.spec.max_length == max_positions("add", 9) == 31
    tokens, _ = make_task("add").batch(2, 9, rng())
    assert model(tokens).shape == (2, 31, make_task("add").vocab_size)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_bench_scheme_acts_where_its_registered_role_says(scheme):
    from posenc.schemes import bench_family
    from posenc.torch.protocols import (
        ContextualScoreBias,
        InputEncoding,
        QueryKeyRotation,
        ScoreBias,
    )

    model = GPT(GPTConfig(vocab_size=11, scheme=scheme, d_model=16, n_heads=2))
    family = bench_family(scheme)
    in_attention = [block.attn.position for block in model.blocks]
    assert isinstance(model.positions, InputEncoding)
    assert type(model.positions).__name__ == (
        {"learned": "LearnedPositionalEmbedding", "sinusoidal": "SinusoidalPositionalEncoding"}
    ).get(scheme, "NoPositionalEncoding")
    if family.role == "input":
        assert in_attention == [None, None]
    else:
        protocol = {"qk": QueryKeyRotation, "scores": (ScoreBias, ContextualScoreBias)}
        assert all(isinstance(position, protocol[family.role]) for position in in_attention)
        assert in_attention[0] is not in_attention[1]  # a module per layer
        assert all(position.spec.scheme == family.name for position in in_attention)


def test_t5_bias_starts_as_t5_initialises_it():
    """N(0, 1/d_model): the draws Hugging Face's T5 initialisation makes from the same
    generator state (its T5Attention builds the same nn.Embedding first)."""
    transformers = pytest.importorskip("transformers")
    from transformers import initialization

    from posenc.bench.model import _IN_ATTENTION

    config = GPTConfig(vocab_size=11, scheme="t5", d_model=64, n_heads=4)
    factor = transformers.T5Config(d_model=64).initializer_factor
    torch.manual_seed(3)
    ours = _IN_ATTENTION["t5"](config).relative_attention_bias.weight  # what GPT builds
    torch.manual_seed(3)
    reference = torch.nn.Embedding(32, 4)  # T5Attention's relative_attention_bias
    initialization.normal_(reference.weight, mean=0.0, std=factor * (64**-0.5))
    torch.testing.assert_close(ours, reference.weight, rtol=0, atol=0)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_model_is_causal(scheme):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, scheme=scheme, d_model=16, n_heads=2, max_positions=12))
    tokens = torch.randint(0, 11, (2, 12))
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 11
    logits = model(tokens)
    assert logits.shape == (2, 12, 11)
    torch.testing.assert_close(model(changed)[:, :7], logits[:, :7], rtol=0, atol=0)
    assert not torch.allclose(model(changed)[:, 7:], logits[:, 7:])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_model_overfits_a_fixed_batch(scheme):
    torch.manual_seed(0)
    task = make_task("reverse")
    tokens, mask = task.batch(4, 4, rng(6))
    config = GPTConfig(task.vocab_size, scheme, d_model=32, n_layers=2, n_heads=4, max_positions=11)
    model = GPT(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    # The rate decays to 0: at a constant 5e-3 NoPE's loss swings between 0.001 and 0.3
    # on this batch, so whether it ends below 0.01 hung on the step count and on
    # PyTorch's thread count (which orders the sums).
    steps = 300
    decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    for _ in range(steps):
        loss = train.masked_loss(model(tokens), tokens, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        decay.step()
    assert float(loss.detach()) < 0.01
    predicted = model(tokens)[:, :-1].argmax(-1)  # (4, T-1)
    assert torch.equal(predicted[mask[:, 1:]], tokens[:, 1:][mask[:, 1:]])


def test_rope_scaling_swaps_and_restores_the_frequencies():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=9, scheme="rope", d_model=32, n_heads=4, max_positions=40))
    tokens = torch.randint(0, 9, (2, 40))
    plain = model(tokens)
    originals = [block.attn.position for block in model.blocks]
    for name in ROPE_EVAL_SCALINGS:
        with model.rope_scaling(name, factor=1.0, original=40):  # factor 1: unchanged
            torch.testing.assert_close(model(tokens), plain, rtol=1e-6, atol=1e-6)
        with model.rope_scaling(name, factor=2.5, original=16):
            rope = model.blocks[0].attn.position
            params = {"factor": 2.5}
            if name in ("yarn", "dynamic_ntk"):
                params["original_max_position_embeddings"] = 16
            expected = rope_scaling(name, 8, 10000.0, **params)[0]
            np.testing.assert_array_equal(rope.inv_freq, expected)  # at construction
            if name == "dynamic_ntk":  # its frequencies follow the length of each call
                at_40 = rope_scaling(name, 8, 10000.0, seq_len=40, **params)[0]
                np.testing.assert_array_equal(rope.spec.frequencies(40)[0], at_40)
            assert not torch.allclose(model(tokens), plain, atol=1e-4)
        assert [block.attn.position for block in model.blocks] == originals
    torch.testing.assert_close(model(tokens), plain, rtol=0, atol=0)
    learned = GPT(GPTConfig(vocab_size=9, scheme="learned", d_model=16, n_heads=2))
    with pytest.raises(ValueError, match="scheme 'rope'"), learned.rope_scaling("ntk", factor=2.0):
        pass


def test_gpt_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple of n_heads"):
        GPTConfig(vocab_size=5, scheme="nope", d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="scheme must be one of"):
        GPTConfig(vocab_size=5, scheme="xpos")
    model = GPT(GPTConfig(vocab_size=5, scheme="learned", d_model=8, n_heads=2, max_positions=6))
    with pytest.raises(ValueError, match=r"shape \(batch, seq\)"):
        model(torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.full((1, 3), 5))
    with pytest.raises(ValueError, match="max_length=6"):
        model(torch.zeros(1, 7, dtype=torch.long))


# ---------------------------------------------------------------------------------------
# Training and evaluation


def test_learning_rate_schedule():
    peak, steps = 2e-3, 50
    rates = [train.learning_rate(s, steps, peak) for s in range(steps)]
    np.testing.assert_allclose(rates[:5], [peak * (s + 1) / 5 for s in range(5)])
    for s in range(5, steps):
        progress = (s - 5) / (steps - 1 - 5)
        expected = peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        assert rates[s] == pytest.approx(expected, rel=1e-12)
    assert rates[-1] == pytest.approx(0.1 * peak)
    assert train.learning_rate(0, 1, peak) == peak


def check_record(record, spec):
    assert set(record) == {
        "key",
        "spec",
        "results",
        "train_loss",
        "seconds",
        "device",
        "parameters",
        "versions",
    }
    assert record["key"] == spec.key()
    assert record["spec"] == spec.to_dict()
    assert json.loads(json.dumps(record, allow_nan=False)) == record
    variants = [spec.scheme] + [f"rope+{s}" for s in spec.rope_eval_scalings]
    assert [(r["variant"], r["length"]) for r in record["results"]] == [
        (v, length) for v in variants for length in spec.eval_lengths
    ]
    lo, hi = spec.train_lengths
    for result in record["results"]:
        assert set(result) == {
            "variant",
            "length",
            "exact_match",
            "token_accuracy",
            "loss",
            "perplexity",
            "in_distribution",
            "samples",
            "scored_tokens",
            "unknown_tokens",
        }
        assert result["in_distribution"] == (lo <= result["length"] <= hi)
        assert result["scored_tokens"] >= result["samples"]  # each sequence scores some
        if spec.task != "lm":
            assert result["unknown_tokens"] == 0
        if spec.task == "lm":  # the held-out text in windows of the length
            windows = len(make_task("lm").eval_ids) // result["length"]
            assert (result["samples"], result["scored_tokens"]) == (
                windows,
                windows * result["length"],
            )
        else:
            assert result["samples"] == spec.eval_samples
        assert 0.0 <= result["token_accuracy"] <= 1.0
        assert math.isfinite(result["loss"])
        assert result["loss"] > 0
        if spec.task == "lm":
            assert result["exact_match"] is None
            assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
        else:
            # Every sequence of one length has the same number of scored tokens.
            assert 0.0 <= result["exact_match"] <= result["token_accuracy"]
            assert result["perplexity"] is None
    assert math.isfinite(record["train_loss"])
    assert record["train_loss"] > 0
    assert record["seconds"] > 0
    assert record["device"] == "cpu"
    assert record["parameters"] > 0
    assert set(record["versions"]) == {"posenc", "torch", "python"}


@pytest.mark.parametrize(
    ("task", "scheme", "scalings"),
    [
        *[("copy", scheme, ()) for scheme in SCHEMES],
        ("add", "rope", ROPE_EVAL_SCALINGS),
        ("passkey", "alibi", ()),
        ("lm", "rope", ("yarn", "dynamic_ntk")),
        ("sort", "t5", ()),
    ],
)
def test_one_step_run_returns_a_well_formed_record(task, scheme, scalings):
    spec = RunSpec(
        task,
        scheme,
        steps=1,
        train_lengths=(2, 4),
        eval_lengths=(4, 8),
        eval_samples=8,
        rope_eval_scalings=scalings,
        **TINY,
    )
    calls = []
    record = train.run(spec, progress=lambda step, total: calls.append((step, total)))
    assert calls == [(1, 1)]
    check_record(record, spec)
    if scheme == "rope" and scalings:  # factor 1 within the training lengths: same scores
        within = [r for r in record["results"] if r["length"] == 4]
        assert all(r["loss"] == within[0]["loss"] for r in within)


def test_evaluation_scores_the_sequences_of_exactly_each_length(monkeypatch):
    seen = []
    forward = GPT.forward

    def spy(self, tokens):
        if not self.training:
            seen.append(tokens.clone())
        return forward(self, tokens)

    monkeypatch.setattr(GPT, "forward", spy)
    spec = RunSpec("add", "alibi", steps=1, eval_lengths=(3, 6), eval_samples=5, **TINY)
    train.run(spec)
    task = make_task("add")
    assert [t.shape for t in seen] == [(5, max_positions("add", 3)), (5, max_positions("add", 6))]
    assert task.problem_lengths(seen[0]).tolist() == [3] * 5
    assert task.problem_lengths(seen[1]).tolist() == [6] * 5


def test_run_is_deterministic_and_leaves_global_state_alone():
    spec = RunSpec("reverse", "t5", steps=5, eval_lengths=(3, 6), eval_samples=6, **TINY)
    torch.manual_seed(123)
    first = train.run(spec)
    after_run = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), after_run)  # the caller's random stream is untouched
    assert not torch.are_deterministic_algorithms_enabled()
    second = train.run(spec)
    first.pop("seconds"), second.pop("seconds")
    assert first == second
    third = train.run(dataclasses.replace(spec, seed=1))
    assert third["train_loss"] != first["train_loss"]


def test_teacher_forced_exact_match_equals_greedy_decoding():
    torch.manual_seed(0)
    task = make_task("copy")
    model = GPT(GPTConfig(task.vocab_size, "rope", d_model=32, n_heads=4, max_positions=30))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = rng(7)
    for _ in range(120):  # partly trained: some sequences right, some wrong
        tokens, mask = task.batch(16, (2, 6), generator)
        loss = train.masked_loss(model(tokens), tokens, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    length, samples = 5, 40
    scores = train.evaluate(model, task, length, samples, seed=3, device=torch.device("cpu"))
    greedy_right = 0
    with torch.no_grad():
        for tokens, _ in train.evaluation_batches(task, length, samples, seed=3):
            start = length + 2  # BOS, the input and SEP are given
            decoded = tokens[:, :start]
            while decoded.shape[1] < tokens.shape[1]:
                next_token = model(decoded)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
                decoded = torch.cat([decoded, next_token], dim=1)
            greedy_right += int((decoded == tokens).all(dim=1).sum())
    assert 0 < greedy_right < samples
    assert scores["exact_match"] == greedy_right / samples


def test_a_bench_scheme_the_model_cannot_build_is_refused(monkeypatch):
    import posenc.bench.model as model

    monkeypatch.setattr(model, "scheme_names", lambda: (*SCHEMES, "xpos"))  # marked for it
    with pytest.raises(ValueError, match=r"scheme 'xpos' has no place in the bench model yet"):
        GPTConfig(vocab_size=11, scheme="xpos")


@pytest.mark.parametrize("length", [1, 4, 7, 16])
def test_lm_windows_score_the_same_held_out_text_once_at_every_length(length):
    """tiled: each character of the first ⌊N/L⌋·L once, with its window's context;
    sliding: each character from the first window's end on once, with at least L - S
    characters before it (S = ⌈L/4⌉), and the first window's characters once."""
    task = make_task("lm")
    ids, n = task.eval_ids, len(task.eval_ids)
    for protocol in ("tiled", "sliding"):
        stride = length if protocol == "tiled" else -(-length // 4)
        scored_at, context = [], []
        for k, (tokens, scored) in enumerate(task.eval_windows(length, protocol)):
            start = k * stride
            assert tokens[0] == task.bos_id
            assert (tokens[1:] == ids[start : start + length]).all()
            for i in np.flatnonzero(scored):
                scored_at.append(start + i - 1)
                context.append(i - 1)
        last = (n // length) * length if protocol == "tiled" else scored_at[-1] + 1
        assert scored_at == list(range(last))  # each once, in order, none left between
        assert n - last < stride  # the tail that no window reaches is shorter than a step
        if protocol == "sliding":
            assert min(context[length:], default=length) >= length - stride


def test_the_research_schemes_are_configured_as_docs_bench_says():
    config = {"vocab_size": 11, "d_model": 32, "n_heads": 4, "max_positions": 40}
    first = {
        scheme: GPT(GPTConfig(scheme=scheme, **config)).blocks[0].attn.position
        for scheme in ("p_rope", "rope_learned", "kerple", "kerple_power", "fire", "sandwich",
                       "cope")
    }  # fmt: skip
    assert first["p_rope"].spec.scaling.name == "proportional"
    assert first["p_rope"].spec.scaling.params() == {"partial_rotary_factor": 0.75}
    assert first["p_rope"].inv_freq[3:].tolist() == [0.0]  # 3 of 4 frequencies rotate
    assert type(first["rope_learned"]).__name__ == "LearnedRotaryEmbedding"
    assert (first["kerple"].spec.kernel, first["kerple_power"].spec.kernel) == ("log", "power")
    assert float(first["fire"].init_L) == 8.0
    assert (first["fire"].spec.mlp_width, first["fire"].spec.init_c) == (32, 0.1)
    assert (first["sandwich"].spec.dim, first["sandwich"].num_heads) == (32, 4)
    assert (first["cope"].head_dim, first["cope"].spec.max_positions) == (8, 41)
