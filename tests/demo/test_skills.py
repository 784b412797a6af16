"""The procedural problems: every canonical answer is right, the wording never changes a problem's key, and generation
is deterministic for a seed."""

from __future__ import annotations

import random
import re

import pytest

from tessera.engine.demo.facts import FACTS
from tessera.engine.demo.skills import (
    ADDITION_PROMPTS,
    REVERSE_PROMPTS,
    SKILLS,
    SORT_PROMPTS,
    SUBTRACTION_PROMPTS,
    addition_answer,
    count_answer,
    subtraction_answer,
)


def _column_digits(answer: str) -> list[int]:
    """The result digit of each column step (the last digit of each `= N` before the final sentence)."""
    steps = answer.split(" So ")[0]
    return [int(v) % 10 for v in re.findall(r"= (\d+)", steps)]


@pytest.mark.parametrize("a,b", [(10, 10), (99, 1 + 98), (999, 999), (347, 58), (58, 347), (500, 500), (123, 877),
                                 (5, 7), (0, 0), (1000, 2000), (9999, 9999), (7, 9993), (4321, 5)])
def test_addition_steps_add_up(a, b):
    ans = addition_answer(a, b)
    assert ans.endswith(f"So {a} + {b} = {a + b}.")
    digits = _column_digits(ans)
    carry = (a + b) // 10 ** len(digits)
    assert int(str(carry) * (carry > 0) + "".join(map(str, reversed(digits)))) == a + b


def test_addition_example_reads_as_documented():
    assert addition_answer(347, 589) == (
        "ones: 7 + 9 = 16, carry 1. tens: 4 + 8 + 1 = 13, carry 1. hundreds: 3 + 5 + 1 = 9. So 347 + 589 = 936.")


def test_one_and_four_digit_sums_read_column_by_column():
    assert addition_answer(5, 7) == "ones: 5 + 7 = 12, carry 1. So 5 + 7 = 12."
    assert addition_answer(1000, 2000) == (
        "ones: 0 + 0 = 0. tens: 0 + 0 = 0. hundreds: 0 + 0 = 0. thousands: 1 + 2 = 3. So 1000 + 2000 = 3000.")
    assert subtraction_answer(1000, 1) == (
        "ones: 10 - 1 = 9, borrow 1. tens: 10 - 1 - 0 = 9, borrow 1. hundreds: 10 - 1 - 0 = 9, borrow 1. "
        "thousands: 1 - 1 - 0 = 0. So 1000 - 1 = 999.")


def test_subtraction_steps_and_result_for_many_pairs():
    rng = random.Random(0)
    for _ in range(2000):
        a, b = sorted((rng.randint(0, 9999), rng.randint(0, 9999)), reverse=True)
        ans = subtraction_answer(a, b)
        assert ans.endswith(f"So {a} - {b} = {a - b}.")
        assert int("".join(map(str, reversed(_column_digits(ans))))) == a - b
        for top, rest, result in re.findall(r": (\d+)((?: - \d+)+) = (\d+)", ans):
            assert int(top) - sum(int(x) for x in re.findall(r"\d+", rest)) == int(result) >= 0


def test_subtraction_example_reads_as_documented():
    assert subtraction_answer(734, 289) == (
        "ones: 14 - 9 = 5, borrow 1. tens: 13 - 1 - 8 = 4, borrow 1. hundreds: 7 - 1 - 2 = 4. So 734 - 289 = 445.")


@pytest.mark.parametrize("word,letter,n",
                         [("strawberry", "r", 3), ("banana", "a", 3), ("kiwi", "z", 0), ("cat", "t", 1)])
def test_count_answer(word, letter, n):
    ans = count_answer(word, letter)
    assert ans.startswith(f"Counting the letter {letter}. Spelling it out: ")  # the letter named before the spelling
    assert ans.endswith(f"The letter {letter} appears {n} {'time' if n == 1 else 'times'}.")
    spelled = ans.split("out: ", 1)[1].split(". The letter")[0]
    assert "".join(part[0] for part in spelled.split(", ")) == word
    assert [int(x) for x in re.findall(r"\((\d+)\)", ans)] == list(range(1, n + 1))


@pytest.mark.parametrize("skill", list(SKILLS))
def test_answers_are_right_and_keys_ignore_wording(skill):
    rng = random.Random(skill)
    answers_by_key: dict[str, str] = {}
    for _ in range(500):
        p = SKILLS[skill](rng)
        assert p.skill == skill and p.prompt and p.answer
        assert answers_by_key.setdefault(p.key, p.answer) == p.answer  # same problem, same answer, any wording
        if skill in ("reverse_list", "sort_list"):
            xs = [int(x) for x in p.key.split(":")[1].split(",")]
            assert str(xs) in p.prompt or str(xs)[1:-1] in p.prompt  # bracketed or bare, as people write lists
            want = xs[::-1] if skill == "reverse_list" else sorted(xs)
            assert p.answer == str(want)
        elif skill == "count_letters":
            _, letter, word = p.key.split(":")
            assert word in p.prompt and p.answer.endswith(f"appears {word.count(letter)} "
                                                          f"{'time' if word.count(letter) == 1 else 'times'}.")
        elif skill == "tessera":
            assert p.answer in {f.answer for f in FACTS}


def test_generation_is_deterministic_for_a_seed():
    for make in SKILLS.values():
        a = [make(random.Random(7)) for _ in range(3)]
        b = [make(random.Random(7)) for _ in range(3)]
        assert a == b


@pytest.mark.parametrize("skill,sep", [("addition", "+"), ("subtraction", "-")])
def test_operands_cover_one_to_four_digits(skill, sep):
    rng = random.Random(1)
    lengths = []
    for _ in range(400):
        lengths += [len(x) for x in SKILLS[skill](rng).key.split(":")[1].split(sep)]
    assert set(lengths) == {1, 2, 3, 4}
    assert min(lengths.count(n) for n in (1, 2, 3, 4)) > 150  # about equally likely


def test_lists_cover_single_digits_mixed_numbers_and_repeats():
    rng = random.Random(2)
    lists = [[int(x) for x in SKILLS["sort_list"](rng).key.split(":")[1].split(",")] for _ in range(400)]
    assert sum(max(xs) < 10 for xs in lists) > 150
    assert sum(min(xs) < 10 <= max(xs) for xs in lists) > 50
    assert any(len(set(xs)) < len(xs) for xs in lists)
    assert {len(xs) for xs in lists} == {3, 4, 5, 6}


@pytest.mark.parametrize("prompt,templates,values", [
    ("What is 5 + 7?", ADDITION_PROMPTS, {"a": 5, "b": 7}),
    ("1000 + 2000", ADDITION_PROMPTS, {"a": 1000, "b": 2000}),
    ("What is 9 - 4?", SUBTRACTION_PROMPTS, {"a": 9, "b": 4}),
    ("Sort 5, 2, 9, 1", SORT_PROMPTS, {"xs": "5, 2, 9, 1"}),
    ("Reverse 3, 1, 2", REVERSE_PROMPTS, {"xs": "3, 1, 2"}),
])
def test_the_issue_s_natural_prompts_are_trained_wordings(prompt, templates, values):
    assert prompt in {t.format(**values) for t in templates}
