"""The bench's context-extension stage: one trained base per seed, shared by every
extension, fine-tuned at longer lengths under each RoPE scaling, evaluated with and
without the fine-tune."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from posenc.bench import expand, train  # noqa: E402
from posenc.bench.aggregate import aggregate  # noqa: E402
from posenc.bench.spec import RunSpec, extension_choices  # noqa: E402
from posenc.bench.tasks import max_positions  # noqa: E402

SETTINGS = {"d_model": 16, "n_layers": 1, "n_heads": 2, "batch_size": 4, "steps": 12,
            "train_lengths": (4, 8), "eval_lengths": (8, 16, 24), "eval_samples": 16}  # fmt: skip
STAGE = {"extension_lengths": (9, 16), "extension_steps": 6}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def spec(extension, task="passkey", **fields):
    return RunSpec(task, "rope", **{**SETTINGS, **STAGE, **fields}, extension=extension)


def scores(record, variant):
    return [(r["length"], r["exact_match"], r["loss"]) for r in record["results"]
            if r["variant"] == variant]  # fmt: skip


def test_every_extension_starts_from_the_one_base_a_plain_run_trains(monkeypatch):
    trainings = []
    original = train._train

    def counted(model, task, spec, device, progress, *, extension=False):
        trainings.append(extension)
        return original(model, task, spec, device, progress, extension=extension)

    monkeypatch.setattr(train, "_train", counted)
    plain = train.run(spec("none").base())
    first, second = train.run(spec("none")), train.run(spec("yarn"))
    assert trainings == [False, False, True, True]  # the plain run, the base once, two fine-tunes
    assert first["base"] == {"training_key": spec("none").training_key(), "from_cache": False}
    assert second["base"]["from_cache"] is True
    # the base's scores are the plain run's, bit for bit
    assert scores(first, "rope") == scores(plain, "rope")
    assert train.base_path(spec("yarn")).is_file()


def test_a_fine_tune_changes_the_model_and_repeats_exactly():
    first = train.run(spec("ntk"))
    again = train.run(spec("ntk"))
    assert first["results"] == again["results"]
    assert scores(first, "rope+ntk") != scores(first, "rope+ntk+ft")
    variants = [r["variant"] for r in first["results"]]
    assert variants == ["rope+ntk"] * 3 + ["rope+ntk+ft"] * 3


def test_the_scaling_factor_is_the_fine_tune_positions_over_the_training_ones():
    record = train.run(spec("linear"))
    trained, extended = max_positions("passkey", 8), max_positions("passkey", 16)
    assert record["extension"] == {"scaling": "linear", "factor": extended / trained,
                                   "original": trained, "lengths": [9, 16], "steps": 6,
                                   "lr": SETTINGS.get("lr", 5e-3) * train.EXTENSION_LR}  # fmt: skip
    # position interpolation by that factor, without fine-tuning, is the base model with
    # every position divided by it
    model = train.build_model(spec("linear"), train.get_task("passkey"))
    model.load_state_dict(torch.load(train.base_path(spec("linear")), weights_only=True))
    with model.rope_scaling("linear", factor=extended / trained, original=trained):
        direct = train.evaluate(model, train.get_task("passkey"), 24, 16, 0, torch.device("cpu"))
    assert scores(record, "rope+linear")[-1] == (24, direct["exact_match"], direct["loss"])


def test_extension_keys_leave_the_older_keys_alone():
    plain = RunSpec("passkey", "rope", **SETTINGS)
    assert spec("none").base() == plain
    assert "extension" not in plain.to_dict() or plain.to_dict()["extension"] is None
    fields = {
        k: v
        for k, v in plain.to_dict().items()
        if k not in ("device", "lm_eval", "extension", "extension_lengths", "extension_steps")
    }
    import hashlib
    import json

    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert plain.key() == hashlib.sha1(canonical.encode()).hexdigest()
    assert len({spec(name).key() for name in extension_choices()}) == len(extension_choices())


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (
            {"extension": "yarn", "extension_steps": None},
            r"together; \['extension_steps'\] missing",
        ),
        ({"extension": "warp"}, "extension must be one of"),
        ({"extension": "none", "scheme": "alibi"}, "scheme 'rope' only"),
        ({"extension": "none", "rope_eval_scalings": ("ntk",)}, "do not go together"),
        ({"extension": "none", "extension_lengths": (4, 8)}, "hi past the training lengths"),
        ({"extension": "none", "extension_lengths": (12, 10)}, r"\(lo, hi\), lo <= hi"),
        ({"extension": "none", "extension_steps": 0}, "extension_steps must be an int >= 1"),
    ],
)
def test_a_bad_extension_is_refused_by_name(fields, match):
    settings = {**SETTINGS, **STAGE, "scheme": "rope", **fields}
    with pytest.raises(ValueError, match=match):
        RunSpec("passkey", **settings)


def test_expand_makes_one_run_per_seed_and_extension_and_one_table_of_them():
    config = {"tasks": ["passkey"], "schemes": ["rope"], "seeds": 2,
              "extensions": ["none", "yarn"], **SETTINGS, **STAGE}  # fmt: skip
    specs = expand(config)
    assert [(s.seed, s.extension) for s in specs] == [(0, "none"), (0, "yarn"), (1, "none"),
                                                       (1, "yarn")]  # fmt: skip
    with pytest.raises(ValueError, match="scheme 'rope' alone"):
        expand({**config, "schemes": ["rope", "nope"]})
    records = [train.run(s) for s in specs]
    rows = aggregate(records)
    assert len({str(row["settings"]) for row in rows}) == 1
    assert [row["variant"] for row in rows if row["length"] == 24] == [
        "rope", "rope+ft", "rope+yarn", "rope+yarn+ft"]  # fmt: skip
    assert all(row["n"] == 2 for row in rows)
