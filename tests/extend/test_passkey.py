"""posenc.extend.passkey: prompts of exactly the length asked, the key where it is asked."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.extend import passkey

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return transformers.AutoTokenizer.from_pretrained(tiny_model)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(110, 3000), depth=st.floats(0, 1), trial=st.integers(0, 5))
def test_a_prompt_has_the_length_asked_and_the_key_at_its_depth(tokenizer, length, depth, trial):
    key = passkey.passkey(trial, length, depth)
    prompt = passkey.prompt(tokenizer, length, depth, key)
    assert len(prompt.ids) == length
    needle = tokenizer.encode(passkey.NEEDLE.format(key=key), add_special_tokens=False)
    assert prompt.ids[prompt.needle_at : prompt.needle_at + len(needle)] == needle
    text = tokenizer.decode(prompt.ids)
    assert text.count(key) == 2
    assert text.endswith(passkey.QUESTION)
    # the key's sentence starts a whole paragraph into the filler, at most one short of depth
    head = len(tokenizer.encode(passkey.INSTRUCTION))
    paragraph = len(tokenizer.encode(passkey.FILLER, add_special_tokens=False))
    room = (
        length
        - head
        - len(needle)
        - len(tokenizer.encode(passkey.QUESTION, add_special_tokens=False))
    )
    before = prompt.needle_at - head
    assert before % paragraph == 0
    assert depth * room - paragraph < before <= depth * room


def test_deeper_keys_sit_later(tokenizer):
    places = [
        passkey.prompt(tokenizer, 2000, d, "12345").needle_at for d in (0, 0.25, 0.5, 0.75, 1)
    ]
    assert places == sorted(places)
    assert len(set(places)) == 5


def test_every_scaling_is_asked_the_same_key():
    keys = {passkey.passkey(t, 4096, 0.5) for t in range(50)}
    assert passkey.passkey(3, 4096, 0.5) == passkey.passkey(3, 4096, 0.5)
    assert len(keys) > 45
    assert all(len(k) == 5 and k[0] != "0" for k in keys)


def test_a_prompt_too_short_for_its_parts_is_refused_with_the_least_length(tokenizer):
    with pytest.raises(
        ValueError, match=r"leaves no room for filler: it needs at least (\d+) tokens"
    ) as info:
        passkey.prompt(tokenizer, 60, 0.5, "12345")
    least = int(re.search(r"at least (\d+)", str(info.value))[1])
    assert len(passkey.prompt(tokenizer, least, 0.5, "12345").ids) == least


@pytest.mark.parametrize(
    ("continuation", "right"),
    [
        (" 52719. Remember it", True),
        ("52719", True),
        (" is 52719", True),
        (" 5271", False),
        (" 527190", False),
        (" 12345 and 52719", False),
        (" of the we are the is back", False),
        ("", False),
    ],
)
def test_the_answer_is_the_first_number_written(continuation, right):
    assert passkey.is_right(continuation, "52719") is right
