"""Train a small Qwen2-style byte-level BPE tokenizer and write it as a Hugging Face tokenizer folder.

The result has the same structure as the tokenizer.json published with Qwen3 checkpoints: NFC normalizer, the Qwen2
pre-tokenizer (a Split on Qwen2's regex followed by ByteLevel without its own regex), a BPE model with no unk token, the
ByteLevel decoder, and Qwen's 26 added tokens in Qwen3's order after the trained vocabulary. `tokenizer_config.json`
carries Qwen3's chat template, eos `<|im_end|>`, pad `<|endoftext|>` and `added_tokens_decoder`, so that transformers'
AutoTokenizer loads the folder. Used by make-model and by the demo model (with its own corpus).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tessera.engine.errors import TesseraError

# Qwen2/Qwen3 pre-tokenizer regex, as in their tokenizer.json (and llama.cpp's "qwen2" pre-tokenizer).
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's added tokens, in vocabulary order (ids 151643.. in the real vocabulary), with their `special` flag as
# published.
QWEN_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

CHAT_TEMPLATE_PATH = Path(__file__).resolve().parent / "data" / "qwen3_chat_template.jinja"

# A small built-in corpus for make-model: English prose, chat phrasing, code, numbers, CJK, accents, emoji, whitespace.
BUILTIN_CORPUS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog. A mixture of experts routes every token to a few small networks.",
    "Hello! How can I help you today? I would like to know how the model decides which experts to use.",
    "Each layer has a router that scores all experts; the top eight are kept and their weights renormalised.",
    "Memory bandwidth, not compute, limits decoding speed on a CPU: every token reads the active expert weights once.",
    "def forward(self, x):\n    h = self.norm(x)\n    return x + self.attn(h)\n",
    "for (int i = 0; i < n; ++i) {\n\tout[i] = a[i] * b[i] + c;\n}\n",
    "import numpy as np\nimport torch\n\nx = torch.randn(4, 8)\nprint(x.shape)  # torch.Size([4, 8])\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2048 151936 3.14159 -7 1e-6",
    "Der schnelle braune Fuchs springt über den faulen Hund. Ça coûte très cher, señor. Smörgåsbord, naïve café.",
    "今天天气很好。我们一起去公园散步吧。专家混合模型把每个词元分配给少数几个专家。",
    "日本語のテキストも少し入れておきます。こんにちは、世界！",
    "한국어 문장도 있습니다. 안녕하세요.",
    "Emoji test: 🙂 🚀 👍🏽 ❤️ 🎉 — and some symbols: ©®™ ±×÷ ≤≥ ∑∫ π.",
    "Whitespace runs:    four spaces,\t\ttabs,\n\n\nnewlines, and trailing spaces   \n",
    "user: What is the capital of France?\nassistant: The capital of France is Paris.",
    "<think>\nLet me think step by step about the question.\n</think>\n\nThe answer is 42.",
    'JSON: {"name": "tessera", "experts": 128, "active": 8, "ok": true, "list": [1, 2, 3]}',
    "It's, they're, we've, I'm, you'll, he'd — contractions everywhere. DON'T SHOUT, it's FINE.",
    "Paragraphs of ordinary English text help the merges learn common words such as the, and, of, to, in, is, that.",
    "Once upon a time there was a small model that lived on a desktop computer and answered questions quickly.",
)


@dataclass(frozen=True)
class BuiltTokenizer:
    """What build_tokenizer wrote: the vocabulary sizes and the ids of the special tokens a config needs."""

    out_dir: Path
    bpe_size: int  # tokens from training (bytes + merges)
    total_size: int  # bpe_size + added tokens
    bos_token_id: int  # <|endoftext|> (Qwen3 configs name it bos although add_bos_token is false)
    eos_token_id: int  # <|im_end|>
    pad_token_id: int  # <|endoftext|>


def chat_template() -> str:
    """Qwen3's chat template as published in tokenizer_config.json (the file's trailing newline removed)."""
    text = CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")
    return text.removesuffix("\n")


def _make_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


def build_tokenizer(corpus: Iterable[str] | None, vocab_size: int, out_dir: str | Path) -> BuiltTokenizer:
    """Train a byte-level BPE of `vocab_size` tokens (256 bytes + merges; fewer if the corpus runs out of pairs) on
    `corpus` (None: the built-in corpus), add Qwen's special tokens after it, and write tokenizer.json,
    tokenizer_config.json, vocab.json and merges.txt into `out_dir` (created if needed)."""
    from tokenizers import AddedToken, pre_tokenizers, trainers

    if vocab_size < 256:
        raise TesseraError("vocab_size", f"{vocab_size} is smaller than the 256 byte tokens a byte-level BPE needs")
    texts = list(BUILTIN_CORPUS if corpus is None else corpus)
    if not texts:
        raise TesseraError("corpus", "is empty; a tokenizer needs some text to learn merges from")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = _make_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer)
    for content, special in QWEN_ADDED_TOKENS:
        added = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        if special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
    return save_tokenizer(tok, out)


def save_tokenizer(tok, out_dir: str | Path) -> BuiltTokenizer:
    """Write `tok` (a `tokenizers.Tokenizer`: a byte-level BPE followed by Qwen's added tokens, as `build_tokenizer`
    makes or a GGUF's metadata gives) as tokenizer.json, tokenizer_config.json, vocab.json and merges.txt."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bpe_size = tok.get_vocab_size(with_added_tokens=False)
    for i, (content, _special) in enumerate(QWEN_ADDED_TOKENS):
        if tok.token_to_id(content) != bpe_size + i:
            raise TesseraError("tokenizer", f"added token {content!r} is not at id {bpe_size + i} after the BPE")
    tok.save(str(out / "tokenizer.json"))
    _write_vocab_and_merges(out)

    ids = {content: bpe_size + i for i, (content, _) in enumerate(QWEN_ADDED_TOKENS)}
    _write_tokenizer_config(out, ids)
    return BuiltTokenizer(
        out_dir=out,
        bpe_size=bpe_size,
        total_size=bpe_size + len(QWEN_ADDED_TOKENS),
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )


def _write_vocab_and_merges(out: Path) -> None:
    """vocab.json + merges.txt, the slow-tokenizer files Qwen checkpoints also ship, taken from tokenizer.json."""
    data = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    model = data["model"]
    (out / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")


def _write_tokenizer_config(out: Path, ids: dict[str, int]) -> None:
    decoder = {
        str(ids[content]): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for content, special in QWEN_ADDED_TOKENS
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [c for c, s in QWEN_ADDED_TOKENS[1:14]],
        "bos_token": None,
        "chat_template": chat_template(),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
