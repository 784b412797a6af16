"""Chat prompts rendered by engine.chat_template equal transformers' apply_chat_template on the same tokenizer files."""

from __future__ import annotations

import pytest

from tessera.engine.chat_template import ChatTemplate, render
from tessera.engine.errors import TesseraError
from tessera.engine.tokenizer import Tokenizer
from tessera.engine.tokenizer_build import build_tokenizer

CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
    "multi_turn": [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nThe user greets.\n</think>\n\nHello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about 日本 🙂"},
        {"role": "assistant", "content": "Why did the expert route itself? To stay on top."},
        {"role": "user", "content": "Another, with  spaces\nand lines"},
    ],
    "assistant_last": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nplan\n</think>\n\nHello"},
    ],
    "reasoning_field": [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A", "reasoning_content": "because"},
        {"role": "user", "content": "Q2"},
    ],
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    f = tmp_path_factory.mktemp("tok")
    build_tokenizer(None, 400, f)
    return f


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_equals_transformers(folder, name, thinking, gen):
    transformers = pytest.importorskip("transformers")
    ref_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    msgs = CONVERSATIONS[name]
    want = ref_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, enable_thinking=thinking)
    tok = Tokenizer.from_path(folder)
    got = render(tok.chat_template, msgs, add_generation_prompt=gen, enable_thinking=thinking)
    assert got == want
    assert ChatTemplate.of(tok).render(msgs, gen, thinking) == want
    # and the token ids of the prompt agree too
    assert tok.encode(got) == ref_tok(want, add_special_tokens=False)["input_ids"]


def test_thinking_switch(folder):
    tok = Tokenizer.from_path(folder)
    on = render(tok.chat_template, CONVERSATIONS["user_only"], enable_thinking=True)
    off = render(tok.chat_template, CONVERSATIONS["user_only"], enable_thinking=False)
    assert on == "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"


def test_reference_template_file():
    """The Qwen3 template shipped with the published checkpoints (tests/data copy) renders, and is the one the engine
    ships for models without a template."""
    from pathlib import Path

    from tessera.engine.tokenizer_build import CHAT_TEMPLATE_PATH

    published = (Path(__file__).resolve().parents[1] / "data" / "qwen3-chat-template.jinja").read_text()
    assert CHAT_TEMPLATE_PATH.read_text() == published
    out = render(published[:-1], CONVERSATIONS["system"], enable_thinking=False)
    assert out.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n") and out.endswith("</think>\n\n")


def test_sandbox_and_errors():
    with pytest.raises(TesseraError, match="sandbox"):
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}", [{"role": "user", "content": "x"}])
    with pytest.raises(TesseraError, match="sandbox"):
        render("{% set ns = namespace(_x=1) %}", [{"role": "user", "content": "x"}])
    with pytest.raises(TesseraError, match="only user roles"):
        render("{{ raise_exception('only user roles') }}", [{"role": "user", "content": "x"}])
    with pytest.raises(TesseraError, match="syntax error"):
        render("{% if %}", [])
    with pytest.raises(TesseraError, match="no chat template"):
        render(None, [])
    assert (render("{{ messages[0] | tojson }}", [{"role": "user", "content": "<é>"}])
            == '{"role": "user", "content": "<é>"}')
