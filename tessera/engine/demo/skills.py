"""Procedural problems for the demo model: each skill turns a random generator into one (prompt, answer) problem.

A `Problem.key` names the problem itself (the numbers, the word and letter, the list, or the exact question), not its
wording, so every phrasing of a problem lands on the same side of the held-out split (see `split.py`). Answers are
written in one canonical form, so evaluation is an exact string match.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from tessera.engine.demo.facts import FACTS, PREFIXES, SUFFIXES
from tessera.engine.demo.words import WORDS


@dataclass(frozen=True)
class Problem:
    skill: str
    key: str  # identity of the problem for the held-out split, independent of phrasing
    prompt: str  # the user's message
    answer: str  # the assistant's exact reply


def _operand(rng: random.Random) -> int:
    """A 1- to 4-digit number (0 counts as one digit), the four lengths equally likely."""
    digits = rng.randint(1, 4)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


PLACES = ("ones", "tens", "hundreds", "thousands")


def _digits(x: int, n: int) -> list[int]:
    """The n lowest decimal digits of x, ones first."""
    return [(x // 10**i) % 10 for i in range(n)]


def addition_answer(a: int, b: int) -> str:
    """Column addition shown step by step, ones first, then the result:
    `ones: 7 + 9 = 16, carry 1. tens: 4 + 8 + 1 = 13, carry 1. hundreds: 3 + 5 + 1 = 9. So 347 + 589 = 936.`
    Each step needs only two digits and the previous carry, which a small model learns far sooner than the whole sum."""
    n = max(len(str(a)), len(str(b)))
    steps, carry = [], 0
    for place, x, y in zip(PLACES, _digits(a, n), _digits(b, n)):
        s = x + y + carry
        terms = f"{x} + {y}" + (f" + {carry}" if carry else "")
        carry = s // 10
        steps.append(f"{place}: {terms} = {s}" + (f", carry {carry}." if carry else "."))
    return " ".join(steps) + f" So {a} + {b} = {a + b}."


def subtraction_answer(a: int, b: int) -> str:
    """Column subtraction (a >= b) shown step by step, borrowing 10 when the top digit is too small:
    `ones: 14 - 9 = 5, borrow 1. tens: 13 - 1 - 8 = 4, borrow 1. hundreds: 7 - 1 - 2 = 4. So 734 - 289 = 445.`"""
    n = len(str(a))
    steps, borrow = [], 0
    for place, x, y in zip(PLACES, _digits(a, n), _digits(b, n)):
        out = 1 if x - borrow < y else 0
        top = x + 10 * out
        terms = f"{top}" + (f" - {borrow}" if borrow else "") + f" - {y}"
        steps.append(f"{place}: {terms} = {top - borrow - y}" + (", borrow 1." if out else "."))
        borrow = out
    return " ".join(steps) + f" So {a} - {b} = {a - b}."


ADDITION_PROMPTS = (
    "What is {a} + {b}?",
    "What is {a} plus {b}?",
    "What's {a}+{b}?",
    "what is {a} + {b}",
    "How much is {a} + {b}?",
    "{a} + {b} = ?",
    "{a} + {b}",
    "{a}+{b}",
    "{a} + {b}?",
    "{a} plus {b}",
    "Compute {a} + {b}.",
    "Calculate {a} + {b}.",
    "Add {a} and {b}.",
    "What do you get when you add {a} and {b}?",
)


def addition(rng: random.Random) -> Problem:
    a, b = _operand(rng), _operand(rng)
    prompt = rng.choice(ADDITION_PROMPTS).format(a=a, b=b)
    return Problem("addition", f"add:{a}+{b}", prompt, addition_answer(a, b))


SUBTRACTION_PROMPTS = (
    "What is {a} - {b}?",
    "What is {a} minus {b}?",
    "What's {a}-{b}?",
    "what is {a} - {b}",
    "How much is {a} - {b}?",
    "{a} - {b} = ?",
    "{a} - {b}",
    "{a}-{b}",
    "{a} - {b}?",
    "{a} minus {b}",
    "Compute {a} - {b}.",
    "Calculate {a} - {b}.",
    "Subtract {b} from {a}.",
)


def subtraction(rng: random.Random) -> Problem:
    """The larger operand first, so the result is never negative."""
    a, b = _operand(rng), _operand(rng)
    a, b = max(a, b), min(a, b)
    prompt = rng.choice(SUBTRACTION_PROMPTS).format(a=a, b=b)
    return Problem("subtraction", f"sub:{a}-{b}", prompt, subtraction_answer(a, b))


COUNT_PROMPTS = (
    "How many times does the letter {l} appear in {w}?",
    "How many times does the letter '{l}' appear in '{w}'?",
    "How many {l}'s are in {w}?",
    "How many {l}s are there in the word {w}?",
    "Count the letter {l} in {w}.",
    "Count the letter '{l}' in the word '{w}'.",
    "How often does {l} occur in {w}?",
)


def count_answer(word: str, letter: str) -> str:
    """Name the letter, spell the word numbering each occurrence of the letter as it goes, then state the count:
    `Counting the letter r. Spelling it out: s, t, r (1), a, w, b, e, r (2), r (3), y. The letter r appears 3 times.`
    Naming the letter first puts it at a fixed place just before the spelling, so deciding whether each spelled letter
    is the one asked about needs no search through the many wordings of the question."""
    parts, n = [], 0
    for ch in word:
        if ch == letter:
            n += 1
            parts.append(f"{ch} ({n})")
        else:
            parts.append(ch)
    times = "time" if n == 1 else "times"
    spelled = ", ".join(parts)
    return f"Counting the letter {letter}. Spelling it out: {spelled}. The letter {letter} appears {n} {times}."


def count_letters(rng: random.Random) -> Problem:
    word = rng.choice(WORDS)
    # Mostly a letter of the word (the interesting case), sometimes one it lacks (the answer 0).
    letter = rng.choice(word) if rng.random() < 0.8 else rng.choice(string.ascii_lowercase)
    prompt = rng.choice(COUNT_PROMPTS).format(l=letter, w=word)
    return Problem("count_letters", f"count:{letter}:{word}", prompt, count_answer(word, letter))


def _number_list(rng: random.Random) -> list[int]:
    """3 to 6 numbers: single digits (0-9) or mixed (0-99), equally likely; distinct, except that one list in five
    may repeat a number."""
    values = range(10) if rng.random() < 0.5 else range(100)
    n = rng.randint(3, 6)
    return [rng.choice(values) for _ in range(n)] if rng.random() < 0.2 else rng.sample(values, n)


def _show(xs: list[int]) -> str:
    """The canonical form of a list, used in every answer: `[5, 2, 9, 1]`."""
    return "[" + ", ".join(str(x) for x in xs) + "]"


def _show_prompt(rng: random.Random, xs: list[int]) -> str:
    """A list as a user writes it: bracketed `[5, 2, 9, 1]` or bare `5, 2, 9, 1`, equally likely."""
    return _show(xs) if rng.random() < 0.5 else ", ".join(str(x) for x in xs)


REVERSE_PROMPTS = (
    "Reverse the list {xs}.",
    "Reverse this list: {xs}",
    "Reverse {xs}",
    "Reverse {xs}.",
    "Reverse the numbers {xs}.",
    "What is {xs} in reverse order?",
    "Write the list {xs} backwards.",
)


def reverse_list(rng: random.Random) -> Problem:
    xs = _number_list(rng)
    prompt = rng.choice(REVERSE_PROMPTS).format(xs=_show_prompt(rng, xs))
    return Problem("reverse_list", "reverse:" + ",".join(map(str, xs)), prompt, _show(xs[::-1]))


SORT_PROMPTS = (
    "Sort the list {xs}.",
    "Sort {xs} in ascending order.",
    "Sort these numbers from smallest to largest: {xs}",
    "Put {xs} in order.",
    "Sort {xs}",
    "Sort {xs}.",
    "Sort the numbers {xs}.",
    "Order {xs} from smallest to largest.",
)


def sort_list(rng: random.Random) -> Problem:
    xs = _number_list(rng)
    prompt = rng.choice(SORT_PROMPTS).format(xs=_show_prompt(rng, xs))
    return Problem("sort_list", "sort:" + ",".join(map(str, xs)), prompt, _show(sorted(xs)))


def tessera(rng: random.Random) -> Problem:
    """A question about Tessera (or about the demo model itself), in one of many wordings; the key is the wording."""
    fact = rng.choice(FACTS)
    prompt = rng.choice(fact.questions)
    if fact.decorated:
        prompt = rng.choice(PREFIXES) + prompt + rng.choice(SUFFIXES)
    return Problem("tessera", "tessera:" + prompt, prompt, fact.answer)


SKILLS: dict[str, Callable[[random.Random], Problem]] = {
    "addition": addition,
    "subtraction": subtraction,
    "count_letters": count_letters,
    "reverse_list": reverse_list,
    "sort_list": sort_list,
    "tessera": tessera,
}
