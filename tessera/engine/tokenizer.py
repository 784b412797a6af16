"""The model's tokenizer, built on the `tokenizers` library, from GGUF `tokenizer.ggml.*` metadata or an HF folder.

GGUF (llama.cpp's "gpt2" model with the "qwen2" pre-tokenizer) is rebuilt into the same pipeline as Qwen's published
tokenizer.json: NFC normalizer, a Split on Qwen2's regex, ByteLevel without its own regex, a BPE model from the token
list and merges, the ByteLevel decoder; CONTROL/USER_DEFINED tokens become added tokens (special when CONTROL).
An HF folder gives tokenizer.json directly, plus tokenizer_config.json (chat template, eos) or chat_template.jinja.

Qwen adds no BOS: `encode` returns the text's ids only, unless a GGUF says `tokenizer.ggml.add_bos_token = true`.
`StreamDecoder` turns a stream of ids into text pieces and never emits half of a UTF-8 character.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tessera.engine.errors import ModelFormatError, TesseraError

if TYPE_CHECKING:
    from tessera.engine.weights import ModelFile

# Qwen2/Qwen3's pre-tokenizer regex (their tokenizer.json; llama.cpp's "qwen2" pre-tokenizer).
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
END_TOKENS = ("<|im_end|>", "<|endoftext|>")  # generation stops at either when the vocabulary has them
SUPPORTED_PRE = ("qwen2",)

# llama.cpp token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


class Tokenizer:
    """encode/decode, special ids, the chat template and a streaming decoder for one model."""

    def __init__(
        self,
        tk: Any,  # tokenizers.Tokenizer
        *,
        chat_template: str | None = None,
        eos_token_id: int | list[int] | None = None,
        bos_token_id: int | None = None,
        pad_token_id: int | None = None,
        add_bos: bool = False,
        source: str = "",
    ):
        self._tk = tk
        self._special_lock = threading.Lock()  # encode_special_tokens is a setting of the shared Rust tokenizer
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.pad_token_id = pad_token_id
        self.add_bos = add_bos and bos_token_id is not None
        self.source = source
        eos: list[int] = []
        for e in [eos_token_id] if isinstance(eos_token_id, int) or eos_token_id is None else list(eos_token_id):
            if e is not None and e not in eos:
                eos.append(int(e))
        for t in END_TOKENS:
            i = tk.token_to_id(t)
            if i is not None and i not in eos:
                eos.append(i)
        self.eos_token_ids: list[int] = eos

    # ---- construction ----------------------------------------------------------------------------------------------

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """From a .gguf file (reads only its metadata) or an HF model folder."""
        p = Path(path)
        if p.is_dir():
            return cls.from_hf_folder(p)
        if p.suffix.lower() == ".safetensors" or p.name == "config.json":
            return cls.from_hf_folder(p.parent)
        from tessera.engine.gguf_reader import open_gguf_model

        return cls.from_gguf_metadata(open_gguf_model(p).metadata, str(p))

    @classmethod
    def from_model(cls, model: ModelFile) -> Tokenizer:
        """From a model opened by engine.weights.open_model: its GGUF metadata (no second parse) or its HF folder."""
        if model.gguf is not None:
            return cls.from_gguf_metadata(model.gguf.metadata, str(model.path))
        return cls.from_hf_folder(model.path)

    @classmethod
    def from_gguf_metadata(cls, md: dict[str, Any], source: str = "model.gguf") -> Tokenizer:
        from tokenizers import AddedToken, models
        from tokenizers import Tokenizer as TK

        def need(key: str) -> Any:
            if md.get(key) is None:
                raise ModelFormatError(source, f"key {key} is missing (the file has no tokenizer)")
            return md[key]

        model = need("tokenizer.ggml.model")
        if model != "gpt2":
            raise ModelFormatError(source, f"key tokenizer.ggml.model: {model!r} is not supported (expected 'gpt2')")
        pre = md.get("tokenizer.ggml.pre", "qwen2")
        if pre not in SUPPORTED_PRE:
            raise ModelFormatError(source, f"key tokenizer.ggml.pre: {pre!r} is not supported (expected 'qwen2')")
        tokens = need("tokenizer.ggml.tokens")
        merges = need("tokenizer.ggml.merges")
        types = md.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ModelFormatError(source, "key tokenizer.ggml.tokens: expected a list of strings")
        if len(types) != len(tokens):
            raise ModelFormatError(
                source, f"key tokenizer.ggml.token_type: {len(types)} types for {len(tokens)} tokens"
            )
        vocab: dict[str, int] = {}
        added: list[tuple[int, str, bool]] = []
        for i, (tok, kind) in enumerate(zip(tokens, types)):
            if kind in (CONTROL, USER_DEFINED):
                added.append((i, tok, kind == CONTROL))
            elif kind == UNUSED:  # llama.cpp's [PAD{i}] filler up to the embedding size; not in tokenizer.json either
                continue
            elif tok in vocab:
                raise ModelFormatError(source, f"key tokenizer.ggml.tokens: token {tok!r} appears twice")
            else:
                vocab[tok] = i
        pairs = []
        for n, m in enumerate(merges):
            parts = m.split(" ") if isinstance(m, str) else []
            if len(parts) != 2 or parts[0] not in vocab or parts[1] not in vocab:
                raise ModelFormatError(source, f"key tokenizer.ggml.merges: merge {n} {m!r} is not two known tokens")
            pairs.append((parts[0], parts[1]))
        tk = TK(models.BPE(vocab=vocab, merges=pairs, unk_token=None, fuse_unk=False, byte_fallback=False))
        _qwen2_pipeline(tk)
        # Added tokens must keep their GGUF ids: tokenizers appends them after the model vocab, so add in id order
        # and check each landed where the file says.
        for i, content, special in sorted(added):
            tok = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
            tk.add_special_tokens([tok]) if special else tk.add_tokens([tok])
            if tk.token_to_id(content) != i:
                raise ModelFormatError(source, f"key tokenizer.ggml.tokens: added token {content!r} cannot keep id {i}")

        def opt_id(key: str) -> int | None:
            v = md.get(key)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < len(tokens):
                raise ModelFormatError(source, f"key {key}: {v!r} is not a token id")
            return v

        return cls(
            tk,
            chat_template=md.get("tokenizer.chat_template"),
            eos_token_id=opt_id("tokenizer.ggml.eos_token_id"),
            bos_token_id=opt_id("tokenizer.ggml.bos_token_id"),
            pad_token_id=opt_id("tokenizer.ggml.padding_token_id"),
            add_bos=bool(md.get("tokenizer.ggml.add_bos_token", False)),
            source=source,
        )

    @classmethod
    def from_hf_folder(cls, folder: str | os.PathLike[str]) -> Tokenizer:
        from tokenizers import Tokenizer as TK

        from tessera.engine.file_checks import MAX_JSON_BYTES, check_model_folder
        from tessera.engine.safetensors_reader import read_json

        folder = Path(folder)
        check_model_folder(folder)  # a FIFO among the files would block the load forever
        tj = folder / "tokenizer.json"
        if not tj.is_file():
            raise ModelFormatError(str(tj), "is missing (Tessera needs the fast-tokenizer file tokenizer.json)")
        if tj.stat().st_size > MAX_JSON_BYTES:
            raise ModelFormatError(str(tj), f"is over {MAX_JSON_BYTES} bytes; refusing to read it")
        try:
            tk = TK.from_file(str(tj))
        except Exception as e:  # tokenizers raises a bare Exception for malformed files
            raise ModelFormatError(str(tj), f"cannot be read: {e}") from None
        cfg_path = folder / "tokenizer_config.json"
        tcfg = read_json(cfg_path) if cfg_path.is_file() else {}
        if not isinstance(tcfg, dict):
            raise ModelFormatError(str(cfg_path), "is not a JSON object")
        template = _hf_chat_template(tcfg.get("chat_template"), str(cfg_path))
        jinja = folder / "chat_template.jinja"
        if template is None and jinja.is_file():
            try:
                template = jinja.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ModelFormatError(str(jinja), f"cannot be read as UTF-8 text: {e}") from None

        def token_id(key: str) -> int | None:
            v = tcfg.get(key)
            if isinstance(v, dict):
                v = v.get("content")
            if v is None:
                return None
            i = tk.token_to_id(v)
            if i is None:
                raise ModelFormatError(str(cfg_path), f"key {key}: {v!r} is not in tokenizer.json")
            return i

        eos = token_id("eos_token")
        model_cfg = folder / "config.json"
        if model_cfg.is_file():
            c = read_json(model_cfg)
            if isinstance(c, dict) and c.get("eos_token_id") is not None:
                e = c["eos_token_id"]
                eos = [eos, *(e if isinstance(e, list) else [e])] if eos is not None else e
        return cls(
            tk,
            chat_template=template,
            eos_token_id=eos,
            bos_token_id=token_id("bos_token"),
            pad_token_id=token_id("pad_token"),
            add_bos=bool(tcfg.get("add_bos_token", False)),
            source=str(folder),
        )

    # ---- use -------------------------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._tk.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, parse_special: bool = True, add_bos: bool = True) -> list[int]:
        """Token ids of `text`. parse_special=False reads special-token strings (`<|im_start|>`) as plain text, so text
        a user typed cannot forge a turn. Text that is not valid UTF-8 (lone surrogates) is a named error."""
        try:
            text.encode("utf-8")
        except (UnicodeEncodeError, AttributeError) as e:
            raise TesseraError("text", f"is not valid UTF-8 text ({e})") from None
        if parse_special:
            ids = self._tk.encode(text, add_special_tokens=False).ids
        else:
            with self._special_lock:
                self._tk.encode_special_tokens = True
                try:
                    ids = self._tk.encode(text, add_special_tokens=False).ids
                finally:
                    self._tk.encode_special_tokens = False
        return [self.bos_token_id, *ids] if self.add_bos and add_bos else ids

    def special_token_strings(self) -> list[str]:
        """The text of every special (control) token, e.g. `<|im_start|>`."""
        return [t.content for t in self._tk.get_added_tokens_decoder().values() if t.special]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_of(self, token: str) -> int | None:
        return self._tk.token_to_id(token)

    def token_of(self, token_id: int) -> str | None:
        return self._tk.id_to_token(token_id)

    @property
    def special_tokens(self) -> dict[str, str]:
        """bos_token/eos_token/pad_token strings, as transformers passes them to chat templates."""
        out = {}
        for name, i in (("bos_token", self.bos_token_id), ("pad_token", self.pad_token_id),
                        ("eos_token", self.eos_token_ids[0] if self.eos_token_ids else None)):  # fmt: skip
            if i is not None and self.token_of(i) is not None:
                out[name] = self.token_of(i)
        return out

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self)


class StreamDecoder:
    """Incremental detokenizer: `add(id)` returns the newly complete text (possibly ""), `flush()` whatever is left.

    Decodes a short window of recent ids and emits only when the window's text grew and does not end in U+FFFD (the
    mark of an unfinished UTF-8 sequence), so a multi-byte character split over several tokens comes out whole. The
    concatenation of all pieces equals `tokenizer.decode(all ids)`."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # ids before this have been emitted

    def add(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read])
        new_text = self._tok.decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            piece = new_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self._ids)
            return piece
        return ""

    def flush(self) -> str:
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read])
        new_text = self._tok.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]


def _qwen2_pipeline(tk: Any) -> None:
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers

    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])  # fmt: skip
    tk.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)


def _hf_chat_template(value: Any, source: str) -> str | None:
    """tokenizer_config.json's chat_template: a string, or a list of {name, template} (the "default" one is used)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if "default" in named:
            return named["default"]
    raise ModelFormatError(source, "key chat_template: expected a string or a list with a 'default' template")
