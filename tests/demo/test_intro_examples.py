"""The example prompts the app offers on the demo model (tessera/resources/demo/examples.json) are answered right by the
shipped model, through the whole chat pipeline with the app's default sampling and thinking on: a click must show a
right answer, not a wrong one. Retraining the demo model must keep these true (or change the examples)."""

from __future__ import annotations

import json

import pytest

from tessera.engine.demo import DEMO_GGUF

EXAMPLES = DEMO_GGUF.parent / "examples.json"
# the app's defaults (tessera/app/settings.py): temperature 0.6, top-k 20, top-p 0.95;
# two seeds as two clicks would give
APP_SAMPLING = {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "max_tokens": 160}


@pytest.fixture(scope="module")
def session():
    from tessera import engine

    s = engine.load(DEMO_GGUF, backend="Auto", threads=1)
    yield s
    s.close()


def test_the_intro_has_four_to_six_examples():
    intro = json.loads(EXAMPLES.read_text())
    assert "demo model" in intro["title"] and "nonsense" in intro["summary"]  # it says what it cannot do
    assert 4 <= len(intro["examples"]) <= 6
    assert all(e["prompt"].strip() and e["expect"].strip() for e in intro["examples"])


@pytest.mark.parametrize("example", json.loads(EXAMPLES.read_text())["examples"], ids=lambda e: e["prompt"])
def test_each_example_is_answered_right(session, example):
    from tessera.engine.events import DoneEvent
    from tessera.engine.sampling import SamplingParams

    for seed in (0, 1):
        text = ""
        for event in session.chat([{"role": "user", "content": example["prompt"]}],
                                  SamplingParams(seed=seed, **APP_SAMPLING), enable_thinking=True):
            if isinstance(event, DoneEvent):
                text = event.text
        assert example["expect"] in text, f"seed {seed}: {text!r}"
