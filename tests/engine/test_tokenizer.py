"""Tokenizer from tokenizer.json and from GGUF tokenizer.ggml.*: ids identical to `tokenizers`; streaming decode."""

from __future__ import annotations

import random

import pytest
from gguf_factory import tiny_config, tokenizer_metadata, write_gguf
from tokenizers import Tokenizer as HFTokenizer

from tessera.engine.errors import ModelFormatError
from tessera.engine.tokenizer import Tokenizer
from tessera.engine.tokenizer_build import BUILTIN_CORPUS, build_tokenizer

TEXTS = [
    "Hello, world! It's a test; we'll see what they've done.",
    "今天天气很好。我们一起去公园散步吧。日本語のテキスト、한국어 문장도.",
    "Emoji: 🙂🚀👍🏽❤️🎉 family: 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\n\tif x:\n\t\tpass\n",
    "spaces:     runs    of   them   \n\n   \r\n\r\n trailing   ",
    "numbers 1234567890 3.14159 -42 1e-6 0x1F",
    "<|im_start|>user\nHi <think>hmm</think><|im_end|>\n<|endoftext|>",
    "decomposed e\u0301 and composed é, Å vs A\u030a",
    "",
    " ",
    "\u200b zero width, \u00a0nbsp, \ufeff bom, ﬁ ligature, ＡＢＣ fullwidth",
]


@pytest.fixture(scope="module")
def tok_folder(tmp_path_factory):
    """A Qwen-style tokenizer with a real number of merges, trained on varied text (formats' build_tokenizer)."""
    corpus = list(BUILTIN_CORPUS) * 3 + TEXTS
    folder = tmp_path_factory.mktemp("tok")
    build_tokenizer(corpus, 900, folder)
    return folder


@pytest.fixture(scope="module")
def tok_gguf(tok_folder, tmp_path_factory):
    ref = HFTokenizer.from_file(str(tok_folder / "tokenizer.json"))
    vocab = ref.get_vocab_size(with_added_tokens=True) + 7  # padded like a real embedding table
    md = tokenizer_metadata(tok_folder, vocab)
    cfg = tiny_config(vocab_size=vocab, eos_token_id=md["tokenizer.ggml.eos_token_id"])
    return write_gguf(tmp_path_factory.mktemp("g") / "tok.gguf", cfg, metadata=md)


@pytest.mark.parametrize("kind", ["hf", "gguf"])
def test_ids_identical_to_tokenizers(tok_folder, tok_gguf, kind):
    ref = HFTokenizer.from_file(str(tok_folder / "tokenizer.json"))
    tok = Tokenizer.from_path(tok_folder if kind == "hf" else tok_gguf)
    rng = random.Random(0)
    pool = "".join(TEXTS)
    texts = TEXTS + ["".join(rng.choice(pool) for _ in range(rng.randint(1, 80))) for _ in range(200)]
    for t in texts:
        assert tok.encode(t) == ref.encode(t).ids, repr(t)
        assert tok.decode(tok.encode(t)) == ref.decode(ref.encode(t).ids, skip_special_tokens=False)
    for i in range(ref.get_vocab_size(with_added_tokens=True)):
        assert (tok.decode([i]) == ref.decode([i], skip_special_tokens=False)
                and tok.token_of(i) == ref.id_to_token(i)), i


@pytest.mark.parametrize("kind", ["hf", "gguf"])
def test_special_tokens(tok_folder, tok_gguf, kind):
    tok = Tokenizer.from_path(tok_folder if kind == "hf" else tok_gguf)
    im_end, eot = tok.id_of("<|im_end|>"), tok.id_of("<|endoftext|>")
    assert im_end is not None and eot is not None
    assert tok.eos_token_ids[0] == im_end and set(tok.eos_token_ids) == {im_end, eot}
    assert tok.encode("<|im_start|>") == [tok.id_of("<|im_start|>")]
    assert tok.encode("hi")[0] != tok.id_of("<|endoftext|>")  # no BOS
    assert tok.chat_template and "enable_thinking" in tok.chat_template
    assert tok.id_of("no such token") is None


def test_make_model_fixtures(tiny_hf_model, tiny_gguf_model):
    """make-model's HF folder and GGUF give the same tokenizer; ids match tokenizers on tokenizer.json."""
    ref = HFTokenizer.from_file(str(tiny_hf_model / "tokenizer.json"))
    a, b = Tokenizer.from_path(tiny_hf_model), Tokenizer.from_path(tiny_gguf_model)
    for t in TEXTS:
        assert a.encode(t) == b.encode(t) == ref.encode(t).ids
    assert a.eos_token_ids == b.eos_token_ids and a.chat_template == b.chat_template


def test_stream_decoder_never_splits_characters(tok_folder):
    tok = Tokenizer.from_path(tok_folder)
    for t in TEXTS:
        ids = tok.encode(t)
        d = tok.stream_decoder()
        pieces = [d.add(i) for i in ids] + [d.flush()]
        assert "".join(pieces) == tok.decode(ids)
        assert not any("\ufffd" in p for p in pieces), pieces
    # An emoji split over several byte tokens comes out only once it is whole.
    ids = tok.encode("🦜")
    assert len(ids) > 1
    d = tok.stream_decoder()
    assert [d.add(i) for i in ids] == [""] * (len(ids) - 1) + ["🦜"]


def test_stream_decoder_random_ids(tok_folder):
    tok = Tokenizer.from_path(tok_folder)
    rng = random.Random(1)
    for _ in range(50):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 30))]
        d = tok.stream_decoder()
        assert "".join([d.add(i) for i in ids] + [d.flush()]) == tok.decode(ids)


def test_gguf_tokenizer_errors(tok_folder, tmp_path):
    md = tokenizer_metadata(tok_folder)

    def err(match, **changes):
        m = dict(md)
        for k, v in changes.items():
            if v is None:
                m.pop(k)
            else:
                m[k] = v
        with pytest.raises(ModelFormatError, match=match):
            Tokenizer.from_gguf_metadata(m, "t.gguf")

    err("key tokenizer.ggml.tokens is missing", **{"tokenizer.ggml.tokens": None})
    err("key tokenizer.ggml.model: 'llama' is not supported", **{"tokenizer.ggml.model": "llama"})
    err("key tokenizer.ggml.pre: 'gpt-4o' is not supported", **{"tokenizer.ggml.pre": "gpt-4o"})
    err("key tokenizer.ggml.merges: merge 0", **{"tokenizer.ggml.merges": ["nonsense"]})
    err("key tokenizer.ggml.token_type: 3 types", **{"tokenizer.ggml.token_type": [1, 1, 1]})
    err("key tokenizer.ggml.eos_token_id: 99999 is not a token id", **{"tokenizer.ggml.eos_token_id": 99999})


def test_hf_folder_errors(tmp_path):
    with pytest.raises(ModelFormatError, match="tokenizer.json: is missing"):
        Tokenizer.from_path(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelFormatError, match="cannot be read"):
        Tokenizer.from_path(tmp_path)
