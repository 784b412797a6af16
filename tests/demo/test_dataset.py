"""Training sequences: rendered by Qwen3's template, loss only on assistant replies, and the prompt the engine builds at
evaluation time (thinking off or on) is exactly the start of a training sequence, token for token."""

from __future__ import annotations

import random

import pytest

from tessera.engine.demo.dataset import (
    CONTEXT_TOKENS,
    IGNORE,
    assistant_spans,
    conversation,
    encode_conversations,
    fit_context,
    make_renderer,
)
from tessera.engine.demo.evaluate import earlier_turns
from tessera.engine.demo.split import eval_problems
from tessera.engine.tokenizer_build import build_tokenizer, chat_template


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


def test_chats_run_to_ten_turns_and_more_and_fill_the_context(demo_tokenizer):
    from tokenizers import Tokenizer

    folder, render = demo_tokenizer
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rng = random.Random(9)
    convs = [conversation(rng) for _ in range(300)]
    turns = [sum(m["role"] == "user" for m in c) for c in convs]
    assert sum(t == 1 for t in turns) > 60 and sum(t >= 10 for t in turns) > 60
    encoded = encode_conversations(tok, render, convs, max_tokens=CONTEXT_TOKENS)
    lengths = [len(ids) for ids, _ in encoded]
    assert max(lengths) <= CONTEXT_TOKENS and sum(n > 0.9 * CONTEXT_TOKENS for n in lengths) > 20
    for ids, labels in encoded:  # a trimmed chat still ends on a whole, supervised reply (then the template's "\n")
        last = max(i for i, label in enumerate(labels) if label != IGNORE)
        assert ids[last] == tok.token_to_id("<|im_end|>") and last == len(ids) - 2


def test_fit_context_drops_whole_exchanges_from_the_end(demo_tokenizer):
    from tokenizers import Tokenizer

    folder, render = demo_tokenizer
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rng = random.Random(3)
    conv = [m for _ in range(20) for m in conversation(rng, max_turns=1) if m["role"] != "system"]  # 20 exchanges
    full = len(tok.encode(render(conv)).ids)
    kept, text, enc = fit_context(tok, render, conv, full // 2)
    assert kept == conv[: len(kept)] and kept[-1]["role"] == "assistant" and len(kept) < len(conv)
    assert len(enc.ids) <= full // 2 < len(tok.encode(render(conv[: len(kept) + 2])).ids)
    assert text == render(kept)
    one, _, _ = fit_context(tok, render, conv, 1)  # never less than one exchange
    assert one == conv[:2]


def test_assistant_spans_need_an_end():
    with pytest.raises(ValueError):
        assistant_spans("<|im_start|>assistant\nno end")


@pytest.mark.parametrize("thinking", [False, True])
def test_engine_prompt_is_a_token_prefix_of_training_sequences(demo_tokenizer, thinking):
    from tessera.engine.chat_template import ChatTemplate
    from tessera.engine.tokenizer import Tokenizer

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


@pytest.mark.parametrize("thinking", [False, True])
def test_engine_prompt_after_nine_turns_is_a_token_prefix_of_training_sequences(demo_tokenizer, thinking):
    """What the app sends on turn 10 of a chat (nine earlier exchanges, their replies without think blocks) is how
    training renders the same chat up to the last reply."""
    from tessera.engine.chat_template import ChatTemplate
    from tessera.engine.tokenizer import Tokenizer

    folder, render = demo_tokenizer
    tok = Tokenizer.from_path(folder)
    template = ChatTemplate.of(tok)
    for skill in ("addition", "sort_list", "tessera"):
        for i, p in enumerate(eval_problems(skill, 3)):
            chat = [*earlier_turns(skill, i, 9), {"role": "user", "content": p.prompt}]
            prompt = template.render(chat, add_generation_prompt=True, enable_thinking=thinking)
            full = render(chat + [{"role": "assistant", "content": p.answer}])
            assert full.startswith(prompt)
            assert "<think>" not in prompt[: prompt.rindex("<|im_start|>assistant")]  # earlier replies are plain
            assert tok.encode(full)[: len(tok.encode(prompt))] == tok.encode(prompt)
