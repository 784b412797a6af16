"""Training sequences: rendered by Qwen3's template, loss only on assistant replies, and the prompt the engine builds at
evaluation time (thinking off or on) is exactly the start of a training sequence, token for token."""

from __future__ import annotations

import random

import pytest

from engine.demo.dataset import IGNORE, assistant_spans, conversation, encode_conversations, make_renderer
from engine.demo.split import eval_problems
from engine.tokenizer_build import build_tokenizer, chat_template


@pytest.fixture(scope="module")
def demo_tokenizer(tmp_path_factory):
    render = make_renderer(chat_template())
    rng = random.Random(0)
    texts = [render(conversation(rng)) for _ in range(400)]
    out = tmp_path_factory.mktemp("demo-tok")
    build_tokenizer(texts, 600, out)
    return out, render


def test_loss_covers_exactly_the_assistant_replies(demo_tokenizer):
    from tokenizers import Tokenizer

    folder, render = demo_tokenizer
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rng = random.Random(5)
    convs = [conversation(rng) for _ in range(60)]
    assert any(len(c) > 3 for c in convs) and any(c[0]["role"] == "system" for c in convs)
    for conv, (ids, labels) in zip(convs, encode_conversations(tok, render, convs)):
        assert len(ids) == len(labels)
        trained = tok.decode([t for t in labels if t != IGNORE], skip_special_tokens=False)
        replies = [m["content"] for m in conv if m["role"] == "assistant"]
        # earlier replies plain, the last one after the empty think block Qwen3 renders for it
        want = "".join(r + "<|im_end|>" for r in replies[:-1]) + "<think>\n\n</think>\n\n" + replies[-1] + "<|im_end|>"
        assert trained == want
        assert all(lab in (IGNORE, tid) for lab, tid in zip(labels, ids))


def test_assistant_spans_need_an_end():
    with pytest.raises(ValueError):
        assistant_spans("<|im_start|>assistant\nno end")


@pytest.mark.parametrize("thinking", [False, True])
def test_engine_prompt_is_a_token_prefix_of_training_sequences(demo_tokenizer, thinking):
    from engine.chat_template import ChatTemplate
    from engine.tokenizer import Tokenizer

    folder, render = demo_tokenizer
    tok = Tokenizer.from_path(folder)
    template = ChatTemplate.of(tok)
    for skill in ("addition", "count_letters", "sort_list", "tessera"):
        for p in eval_problems(skill, 5):
            user = [{"role": "user", "content": p.prompt}]
            prompt = template.render(user, add_generation_prompt=True, enable_thinking=thinking)
            full = render(user + [{"role": "assistant", "content": p.answer}])
            assert full.startswith(prompt)
            assert tok.encode(full)[: len(tok.encode(prompt))] == tok.encode(prompt)
