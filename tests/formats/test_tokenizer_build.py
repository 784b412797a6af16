"""The built tokenizer folder: same ids in transformers and tokenizers, Qwen's special tokens, Qwen3's chat template."""

from __future__ import annotations

import json
import unicodedata

import pytest

from tessera.engine.errors import TesseraError
from tessera.engine.tokenizer_build import QWEN_ADDED_TOKENS, build_tokenizer, chat_template

TEXTS = [
    "Hello, world! It's a test.",
    "今天天气很好。日本語のテキスト。한국어",
    "Emoji 🙂🚀👍🏽 and ❤️ plus combining é vs e\u0301",
    "def f(x):\n    return x  # comment\n\n\n\t\ttabs",
    "   leading and trailing whitespace runs      ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok<|endoftext|>",
    "numbers 1234567890 3.14 -1e-6",
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    built = build_tokenizer(None, 400, out)
    return out, built


def test_transformers_and_tokenizers_agree(tok_dir):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    out, built = tok_dir
    hf = AutoTokenizer.from_pretrained(str(out))
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in TEXTS:
        ids = raw.encode(text).ids
        assert hf(text)["input_ids"] == ids, text
        assert raw.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)
    assert hf.eos_token_id == built.eos_token_id
    assert hf.pad_token_id == built.pad_token_id
    assert len(hf) == built.total_size


def test_special_tokens_follow_the_bpe_vocabulary_in_qwen3_order(tok_dir):
    from tokenizers import Tokenizer

    out, built = tok_dir
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert 256 < built.bpe_size <= 400
    for i, (content, _special) in enumerate(QWEN_ADDED_TOKENS):
        assert raw.token_to_id(content) == built.bpe_size + i
    assert raw.encode("<|im_start|><think>").ids == [built.bpe_size + 1, built.bpe_size + 24]
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["added_tokens_decoder"][str(built.bpe_size + 24)] == {
        "content": "<think>",
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": False,
    }
    assert cfg["tokenizer_class"] == "Qwen2Tokenizer" and cfg["add_bos_token"] is False


def test_chat_template_is_qwen3s(tok_dir):
    from transformers import AutoTokenizer

    out, _ = tok_dir
    assert not chat_template().endswith("\n") and "enable_thinking" in chat_template()
    hf = AutoTokenizer.from_pretrained(str(out))
    text = hf.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    assert (
        text
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_corpus_drives_the_merges(tmp_path):
    a = build_tokenizer(["abab abab abab cdcd cdcd"] * 10, 300, tmp_path / "a")
    b = build_tokenizer(None, 300, tmp_path / "b")
    va = json.loads((tmp_path / "a" / "vocab.json").read_text())
    vb = json.loads((tmp_path / "b" / "vocab.json").read_text())
    assert "abab" in va and "abab" not in vb
    assert a.bpe_size < b.bpe_size == 300


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(TesseraError, match="vocab_size"):
        build_tokenizer(None, 100, tmp_path)
    with pytest.raises(TesseraError, match="corpus"):
        build_tokenizer([], 300, tmp_path)
