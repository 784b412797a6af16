"""The shipped demo model, scored through the whole chat pipeline on held-out prompts: a broken kernel, tokenizer,
template or sampler makes these fail. The prompts are fixed (tests/data/demo_eval_cases.json: held-out problems of the
generators that trained the shipped model, so retraining data does not move them) and decoding is greedy, so each
result is deterministic per backend; the floors sit below the accuracies recorded in
tessera/resources/demo/MODEL_CARD.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.engine.demo import DEMO_GGUF
from tessera.engine.demo.skills import Problem
from tessera.engine.demo.split import is_heldout

CASES = Path(__file__).resolve().parents[1] / "data" / "demo_eval_cases.json"

# Reduced CI eval: a few held-out prompts per skill (the full default run is `tessera-cli eval-demo`).
# The shipped model answers all 24 of exactly these prompts right on every backend (MODEL_CARD.md); the floors allow one
# wrong answer per skill and two in all, so a kernel that drifts a little (an int8 rounding change) still passes, while
# a broken kernel, tokenizer or template, which scores near 0, fails.
N_PER_SKILL = 4
FLOORS = {skill: 75.0 for skill in ("addition", "subtraction", "count_letters", "reverse_list", "sort_list", "tessera")}
FLOOR_OVERALL = 90.0
ONE_ANSWER = 100.0 / (6 * N_PER_SKILL)


def _available_backends() -> list[str]:
    from tessera.engine import backends

    return ["Torch", *(n for n in backends.available_names() if n != "Reference")]


@pytest.fixture(scope="module")
def demo_path():
    assert DEMO_GGUF.is_file(), f"{DEMO_GGUF} is missing: run `python scripts/train_demo.py` (see MODEL_CARD.md)"
    return DEMO_GGUF


def _cases() -> dict[str, list[Problem]]:
    doc = json.loads(CASES.read_text())["cases"]
    return {skill: [Problem(skill, "", c["prompt"], c["answer"]) for c in cases] for skill, cases in doc.items()}


def test_the_cases_are_held_out_problems_of_every_skill():
    from tessera.engine.demo.skills import SKILLS

    cases = _cases()
    assert list(cases) == list(SKILLS) and all(len(v) == N_PER_SKILL for v in cases.values())
    key_from_answer = {  # the key of an arithmetic case, rebuilt from its answer: none was ever a training problem
        "addition": lambda p: "add:" + p.answer.rsplit("So ", 1)[1].split(" =")[0].replace(" + ", "+"),
        "subtraction": lambda p: "sub:" + p.answer.rsplit("So ", 1)[1].split(" =")[0].replace(" - ", "-"),
    }
    for skill, key_of in key_from_answer.items():
        assert all(is_heldout(key_of(p)) for p in cases[skill]), skill


def _score(path, backend: str):
    from tessera import engine
    from tessera.engine.demo.evaluate import evaluate

    session = engine.load(path, backend=backend, threads=1)
    try:
        return evaluate(session, N_PER_SKILL, problems=_cases())
    finally:
        session.close()


def _check_floors(result):
    failures = {k: [(p.prompt, got) for p, got in v.failures] for k, v in result.skills.items() if v.failures}
    for skill, floor in FLOORS.items():
        assert result.skills[skill].accuracy >= floor, (result.backend, skill, failures)
    assert result.overall >= FLOOR_OVERALL, (result.backend, failures)


@pytest.fixture(scope="module")
def reference(demo_path):
    return _score(demo_path, "Reference")


def test_reference_backend_meets_the_floors(reference):
    assert reference.backend == "Reference"
    _check_floors(reference)


@pytest.mark.slow
@pytest.mark.parametrize("backend", _available_backends())
def test_every_backend_on_this_machine_matches_the_reference(demo_path, reference, backend):
    result = _score(demo_path, backend)
    _check_floors(result)
    assert abs(result.overall - reference.overall) <= ONE_ANSWER + 1e-9, (
        backend, result.as_json(), reference.as_json())


def test_cli_json_shape(demo_path):
    out = subprocess.run(
        [sys.executable, "-m", "tessera.engine", "eval-demo", "--n", "1", "--skill", "addition", "--backend", "Torch",
         "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=300, check=True)
    data = json.loads(out.stdout)
    assert set(data) == {"skills", "overall", "backend", "turns"} and data["turns"] == 1
    assert data["backend"] == "Torch"
    assert data["skills"] == {"addition": {"accuracy": data["overall"], "n": 1}}


def test_cli_rejects_bad_flags(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tessera.engine", "eval-demo", "--n", "0"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "--n" in out.stderr
    out = subprocess.run([sys.executable, "-m", "tessera.engine", "eval-demo", "--skill", "poetry"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "poetry" in out.stderr
    out = subprocess.run([sys.executable, "-m", "tessera.engine", "eval-demo", str(tmp_path / "nope.gguf"), "--n", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stderr.startswith("error: ")
